"""Reports what this function can see and do from inside its container.

Input: JSON {"read": [paths], "list": [dirs], "connect": [[host, port]]}.
Output: JSON with the result of each attempt ("ok" or the errno name) and
facts about the process (user, capabilities, seccomp, namespaces)."""
import asyncio
import ctypes
import importlib.util
import errno
import json
import os
import socket
import sys


def attempt(fn):
    try:
        r = fn()
        return "ok" if r is None else r
    except TimeoutError:
        return "ETIMEDOUT"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def status_field(name):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    return None


def read(path):
    with open(path, "rb") as f:
        f.read(16)


def write(path):
    with open(path, "w") as f:
        f.write("x")


def connect(host, port):
    with socket.create_connection((host, port), timeout=2) as s:
        return "ok:" + s.recv(64).decode(errors="replace")


def libc_call(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), name)


def raw_syscall(number, *args):
    """A system call an unprivileged process may make unless seccomp
    refuses it; returns "ok" or the errno name."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args]) == -1:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    return "ok"


def handle(ctx, payload):
    req = json.loads(payload or b"{}")
    out = {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "cap_eff": status_field("CapEff"),
        "cap_bnd": status_field("CapBnd"),
        "no_new_privs": status_field("NoNewPrivs"),
        "seccomp": status_field("Seccomp"),
        "hostname": socket.gethostname(),
        "proc_pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
        "ipc": sorted(os.listdir(os.environ["STACCATO_IPC_DIR"])),
        "interfaces": [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]],
        "host_ip": os.environ.get("STACCATO_HOST_IP"),
        "write_root": attempt(lambda: write("/x")),
        "write_usr": attempt(lambda: write("/usr/x")),
        "write_code": attempt(lambda: write("/code/x")),
        "write_tmp": attempt(lambda: write("/tmp/probe")),
        # CLONE_NEWUSER, MS_BIND mount, ptrace(PTRACE_ATTACH, 1).
        "unshare": attempt(lambda: libc_call("unshare", 0x10000000)),
        "mount": attempt(lambda: libc_call("mount", b"/tmp", b"/code", None, 4096, None)),
        "setuid0": attempt(lambda: os.setuid(0)),
        # Allowed to any process, but not on the seccomp allow list:
        # personality(ADDR_NO_RANDOMIZE), move_pages(self, 0 pages), and
        # io_uring_setup(1, NULL) (EFAULT if it got past seccomp).
        "personality": raw_syscall(135, 0x0040000),
        "move_pages": raw_syscall(279, 0, 0, 0, 0, 0, 0),
        "io_uring": raw_syscall(425, 1, 0),
        "read": {p: attempt(lambda p=p: read(p)) for p in req.get("read", [])},
        "list": {p: attempt(lambda p=p: os.listdir(p)) for p in req.get("list", [])},
        "connect": {f"{h}:{p}": attempt(lambda h=h, p=p: connect(h, p)) for h, p in req.get("connect", [])},
        # The interpreter this runs on: its version, the libpython it
        # loaded, and the event loop the runtime chose.
        "python_version": sys.version.split()[0],
        "libpython": sorted({l.split()[-1] for l in open("/proc/self/maps") if "libpython" in l}),
        "event_loop": type(asyncio.get_event_loop()).__module__,
        # A package only the host's interpreter has (setup installs it there).
        "numpy": importlib.util.find_spec("numpy") is not None,
        "ld_library_path": os.environ.get("LD_LIBRARY_PATH"),
    }
    return json.dumps(out).encode()
