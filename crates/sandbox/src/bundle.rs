//! The OCI bundle of a pooled container: a private root skeleton and the
//! config.json runc reads. No image: the root is an empty read-only
//! directory holding mountpoints and the merged-/usr symlinks, and the
//! host's /usr (language runtimes, shared libraries) is bound read-only.

use crate::{Limits, Network, Settings};
use serde_json::{json, Value};
use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

/// Host files a function may need to read (user names, DNS, time zone,
/// TLS roots, the dynamic linker's cache).
const ETC_FILES: [&str; 7] = [
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/resolv.conf",
    "/etc/ld.so.cache",
    "/etc/ssl",
];

/// Where things appear inside every container.
pub const SLOT: &str = "/slot";
pub const INIT: &str = "/staccato/init";
pub const LOG: &str = "/staccato/log";

/// Lays out `rootfs`: mountpoints only, owned by root, nothing writable
/// except the tmpfs later mounted on the settings' tmp_dir.
pub fn make_rootfs(rootfs: &Path, settings: &Settings) -> io::Result<()> {
    for d in ["usr", "proc", "dev", "etc", "tmp", "code", "ipc", "deps", "slot", "staccato"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    let tmp = rootfs.join(settings.tmp_dir.strip_prefix("/").unwrap_or(&settings.tmp_dir));
    fs::create_dir_all(&tmp)?;
    // runc gives a tmpfs the mode of the directory it covers (not mode=).
    fs::set_permissions(tmp, fs::Permissions::from_mode(0o1777))?;
    for (link, target) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/sbin")] {
        if Path::new("/").join(target).exists() {
            symlink(target, rootfs.join(link))?;
        }
    }
    fs::write(rootfs.join("staccato/init"), b"")?;
    fs::write(rootfs.join("staccato/log"), b"")?;
    for (_, inside) in &settings.binds {
        fs::create_dir_all(rootfs.join(inside.strip_prefix("/").unwrap_or(inside)))?;
    }
    Ok(())
}

fn bind(src: &Path, dst: &str, rw: bool) -> Value {
    let mode = if rw { "rw" } else { "ro" };
    json!({ "destination": dst, "type": "bind", "source": src, "options": ["rbind", mode, "nosuid", "nodev"] })
}

/// config.json for container `id`.
pub fn config(settings: &Settings, id: &str, dir: &Path, uid: u32, netns: Option<&Path>, limits: &Limits) -> Value {
    let mut mounts = vec![
        json!({ "destination": "/proc", "type": "proc", "source": "proc" }),
        json!({ "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] }),
        json!({ "destination": "/dev/pts", "type": "devpts", "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] }),
        json!({ "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] }),
        json!({ "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
                "options": ["nosuid", "noexec", "nodev"] }),
        bind(Path::new("/usr"), "/usr", false),
        json!({ "destination": settings.tmp_dir, "type": "tmpfs", "source": "tmpfs",
                "options": ["nosuid", "nodev", format!("size={}", settings.tmp_bytes)] }),
        bind(&dir.join("slot"), SLOT, false),
        bind(&settings.init, INIT, false),
    ];
    for f in ETC_FILES {
        if Path::new(f).exists() {
            mounts.push(bind(Path::new(f), f, false));
        }
    }
    for (host, inside) in &settings.binds {
        mounts.push(bind(host, &inside.to_string_lossy(), false));
    }
    let mut namespaces =
        vec![json!({"type": "pid"}), json!({"type": "ipc"}), json!({"type": "uts"}), json!({"type": "mount"})];
    match (settings.network, netns) {
        (Network::Isolated, Some(p)) => namespaces.push(json!({"type": "network", "path": p})),
        (Network::Isolated, None) => namespaces.push(json!({"type": "network"})),
        (Network::Host, _) => {}
    }
    let no_caps: Vec<String> = Vec::new();
    json!({
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": false,
            "user": { "uid": uid, "gid": uid },
            "args": [INIT],
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"],
            "cwd": "/",
            "capabilities": { "bounding": no_caps, "effective": no_caps, "permitted": no_caps,
                              "ambient": no_caps, "inheritable": no_caps },
            "rlimits": [{ "type": "RLIMIT_NOFILE", "hard": 4096, "soft": 4096 }],
            "noNewPrivileges": true
        },
        "root": { "path": dir.join("rootfs"), "readonly": true },
        "hostname": id,
        "mounts": mounts,
        "linux": {
            "resources": {
                "devices": [{ "allow": false, "access": "rwm" }],
                "memory": { "limit": limits.memory_bytes, "swap": limits.memory_bytes },
                "cpu": { "shares": limits.cpu_shares.unwrap_or(1024) },
                "pids": { "limit": limits.pids }
            },
            "cgroupsPath": format!("/staccato/{id}"),
            "namespaces": namespaces,
            "maskedPaths": ["/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                            "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware",
                            "/proc/scsi", "/proc/kmsg", "/proc/sys/kernel/core_pattern"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
            "seccomp": seccomp()
        }
    })
}

/// The seccomp profile: an allow list (Docker's default profile is the
/// reference), so a system call it does not name fails with EPERM, and one
/// newer than every name on it with ENOSYS (runc's stub), which libcs take
/// as "fall back". Left out: kernel modules, kexec, mounts and the mount
/// API, namespaces (`setns`, `unshare`, and `clone` with a namespace flag),
/// tracing and reading other processes, keyrings, BPF, perf, io_uring,
/// userfaultfd, setting clocks, swap, reboot, quotas, NUMA policy, chroot,
/// host and domain names, handle-based opens, and calls no kernel
/// implements any more. `clone3` gets ENOSYS so libc falls back to `clone`,
/// whose flags can be checked; `personality` only with the values Docker
/// allows. Only the x86-64 ABI: 32-bit and x32 entry points are refused
/// whole.
pub fn seccomp() -> Value {
    const ALLOW: &str = "read write open close stat fstat lstat poll lseek mmap mprotect munmap brk rt_sigaction \
        rt_sigprocmask rt_sigreturn ioctl pread64 pwrite64 readv writev access pipe select sched_yield \
        mremap msync mincore madvise shmget shmat shmctl dup dup2 pause nanosleep getitimer alarm setitimer \
        getpid sendfile socket connect accept sendto recvfrom sendmsg recvmsg shutdown bind listen \
        getsockname getpeername socketpair setsockopt getsockopt fork vfork execve exit wait4 kill uname \
        semget semop semctl shmdt msgget msgsnd msgrcv msgctl fcntl flock fsync fdatasync truncate ftruncate \
        getdents getcwd chdir fchdir rename mkdir rmdir creat link unlink symlink readlink chmod fchmod \
        chown fchown lchown umask gettimeofday getrlimit getrusage sysinfo times getuid getgid setuid setgid \
        geteuid getegid setpgid getppid getpgrp setsid setreuid setregid getgroups setgroups setresuid \
        getresuid setresgid getresgid getpgid setfsuid setfsgid getsid capget capset rt_sigpending \
        rt_sigtimedwait rt_sigqueueinfo rt_sigsuspend sigaltstack utime mknod statfs fstatfs getpriority \
        setpriority sched_setparam sched_getparam sched_setscheduler sched_getscheduler \
        sched_get_priority_max sched_get_priority_min sched_rr_get_interval mlock munlock mlockall \
        munlockall modify_ldt prctl arch_prctl adjtimex setrlimit sync gettid readahead setxattr lsetxattr fsetxattr \
        getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr removexattr lremovexattr fremovexattr \
        tkill time futex sched_setaffinity sched_getaffinity set_thread_area io_setup io_destroy \
        io_getevents io_submit io_cancel get_thread_area epoll_create remap_file_pages getdents64 \
        set_tid_address restart_syscall semtimedop fadvise64 timer_create timer_settime timer_gettime \
        timer_getoverrun timer_delete clock_gettime clock_getres clock_nanosleep exit_group epoll_wait \
        epoll_ctl tgkill utimes mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify mq_getsetattr \
        waitid ioprio_set ioprio_get inotify_init inotify_add_watch inotify_rm_watch openat mkdirat mknodat \
        fchownat futimesat newfstatat unlinkat renameat linkat symlinkat readlinkat fchmodat faccessat \
        pselect6 ppoll set_robust_list get_robust_list splice tee sync_file_range vmsplice utimensat \
        epoll_pwait signalfd timerfd_create eventfd fallocate timerfd_settime timerfd_gettime accept4 \
        signalfd4 eventfd2 epoll_create1 dup3 pipe2 inotify_init1 preadv pwritev rt_tgsigqueueinfo recvmmsg \
        prlimit64 syncfs sendmmsg getcpu sched_setattr sched_getattr renameat2 seccomp getrandom \
        memfd_create execveat membarrier mlock2 copy_file_range preadv2 pwritev2 pkey_mprotect pkey_alloc \
        pkey_free statx io_pgetevents rseq pidfd_send_signal pidfd_open close_range openat2 faccessat2 \
        epoll_pwait2 landlock_create_ruleset landlock_add_rule landlock_restrict_self futex_waitv";
    // CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET.
    const CLONE_NAMESPACES: u64 = 0x7e02_0000;
    let mut rules = vec![
        json!({ "names": ALLOW.split_whitespace().collect::<Vec<_>>(), "action": "SCMP_ACT_ALLOW" }),
        json!({ "names": ["clone"], "action": "SCMP_ACT_ALLOW",
            "args": [{ "index": 0, "value": CLONE_NAMESPACES, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ" }] }),
        json!({ "names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38 }),
    ];
    // PER_LINUX, UNAME26, PER_LINUX32, their combination, and the query.
    for persona in [0x0u64, 0x8, 0x20000, 0x20008, 0xffff_ffff] {
        rules.push(json!({ "names": ["personality"], "action": "SCMP_ACT_ALLOW",
            "args": [{ "index": 0, "value": persona, "op": "SCMP_CMP_EQ" }] }));
    }
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 1,
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": rules
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seccomp_profile_allows_by_name_and_nothing_dangerous() {
        let profile = seccomp();
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        let rules = profile["syscalls"].as_array().unwrap();
        let allowed: Vec<&str> = rules
            .iter()
            .filter(|r| r["action"] == "SCMP_ACT_ALLOW" && r.get("args").is_none())
            .flat_map(|r| r["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()))
            .collect();
        for never in [
            "mount",
            "umount2",
            "unshare",
            "setns",
            "ptrace",
            "bpf",
            "init_module",
            "kexec_load",
            "open_tree",
            "move_mount",
            "fsopen",
            "io_uring_setup",
            "userfaultfd",
            "keyctl",
            "perf_event_open",
            "clone",
            "clone3",
            "personality",
            "process_vm_readv",
            "chroot",
            "reboot",
        ] {
            assert!(!allowed.contains(&never), "{never} must not be allowed unconditionally");
        }
        for needed in ["read", "write", "openat", "mmap", "futex", "epoll_pwait", "execve", "rseq", "getrandom"] {
            assert!(allowed.contains(&needed), "{needed}");
        }
        let mut sorted = allowed.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), allowed.len(), "a name listed twice");
    }
}
