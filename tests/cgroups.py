"""Where a container's control group is, on whichever hierarchy the host
mounts (the engine's side is crates/sandbox/src/cgroup.rs): cgroup v1 has a
directory per controller, /sys/fs/cgroup/<controller>/staccato/<id>; v2 one,
/sys/fs/cgroup/staccato/<id>."""
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
V2 = (ROOT / "cgroup.controllers").is_file()


def usable():
    """Whether containers' cgroups can be made here: v1's controllers
    mounted, or v2 with memory, pids and cpu available."""
    if V2:
        have = (ROOT / "cgroup.controllers").read_text().split()
        return all(c in have for c in ("memory", "pids", "cpu"))
    return all((ROOT / c / "cgroup.procs").is_file() for c in ("memory", "cpu", "pids", "freezer"))


def group(cid, controller="pids"):
    return ROOT / "staccato" / cid if V2 else ROOT / controller / "staccato" / cid


def groups(prefix):
    """Every group of an engine's containers (prefix-<n>)."""
    if V2:
        return [str(p) for p in (ROOT / "staccato").glob(f"{prefix}-*")]
    return [str(p) for c in ("memory", "pids", "freezer", "cpu") for p in (ROOT / c / "staccato").glob(f"{prefix}-*")]


def procs(cid):
    try:
        return [int(x) for x in (group(cid) / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def freezer_state(cid):
    """FROZEN or THAWED (v2's cgroup.freeze 1 or 0, in v1's words)."""
    if V2:
        return "FROZEN" if (group(cid) / "cgroup.freeze").read_text().strip() == "1" else "THAWED"
    return (group(cid, "freezer") / "freezer.state").read_text().strip()


def freeze(cid):
    if V2:
        (group(cid) / "cgroup.freeze").write_text("1")
    else:
        (group(cid, "freezer") / "freezer.state").write_text("FROZEN")


def cpu_weight(cid):
    """The group's CPU weight as the file says it: cpu.shares on v1,
    cpu.weight on v2."""
    return int((group(cid, "cpu") / ("cpu.weight" if V2 else "cpu.shares")).read_text())
