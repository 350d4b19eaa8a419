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

/// The default seccomp profile: allow, except what a function has no
/// business doing (kernel modules, namespaces, mounts, tracing other
/// processes, keyrings, clocks, reboot, BPF, io_uring), following the
/// syscalls Docker's default profile leaves out. `clone3` gets ENOSYS so
/// libc falls back to `clone`, whose namespace flags can be filtered.
pub fn seccomp() -> Value {
    const DENY: &str = "acct add_key bpf clock_adjtime clock_settime create_module delete_module finit_module \
        get_kernel_syms get_mempolicy init_module ioperm iopl kcmp kexec_file_load kexec_load keyctl \
        lookup_dcookie mbind mount move_mount open_tree fsopen fsconfig fsmount fspick name_to_handle_at \
        open_by_handle_at nfsservctl perf_event_open pivot_root process_vm_readv process_vm_writev ptrace \
        query_module quotactl reboot request_key set_mempolicy setns settimeofday swapon swapoff sysfs \
        _sysctl syslog umount2 unshare uselib userfaultfd ustat vm86 vm86old io_uring_setup io_uring_enter \
        io_uring_register fanotify_init mount_setattr";
    let mut rules = vec![
        json!({ "names": DENY.split_whitespace().collect::<Vec<_>>(), "action": "SCMP_ACT_ERRNO", "errnoRet": 1 }),
        json!({ "names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38 }),
    ];
    // CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET: one
    // rule per flag, since a masked compare matches one bit pattern.
    for flag in [0x0002_0000u64, 0x0200_0000, 0x0400_0000, 0x0800_0000, 0x1000_0000, 0x2000_0000, 0x4000_0000] {
        rules.push(json!({ "names": ["clone"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
            "args": [{ "index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ" }] }));
    }
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": rules
    })
}
