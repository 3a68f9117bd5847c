"""The host's memory counters around a timed phase.

A restore "from the page cache" is judged against a plain read of the same files. When it
runs several times slower, these say whether the files were still cached (refaults, major
faults, pages read in), whether the kernel was reclaiming to make room (direct reclaim,
allocation stalls), whether the destination memory was faulted in during the read (minor
faults), how busy the cores were, and how close the container's memory cgroup was to
its limit.
"""

from __future__ import annotations

import os

VMSTAT = (
    "pgfault",
    "pgmajfault",
    "pgpgin",
    "workingset_refault_file",
    "pgscan_direct",
    "pgsteal_direct",
    "pgscan_kswapd",
    "pgsteal_kswapd",
    "allocstall_normal",
    "allocstall_movable",
    "thp_fault_alloc",
)
MEMINFO = ("MemTotal", "MemFree", "MemAvailable", "Cached", "Shmem", "Dirty")
CGROUP_STAT = ("anon", "file", "shmem", "file_dirty", "workingset_refault_file")
CPU = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
_LOW_BIT = bytes(b & 1 for b in range(256))  # mincore: bit 0 of a page's byte


def _pairs(path: str) -> dict[str, int]:
    """``name value`` lines (vmstat, memory.stat); ``name: value kB`` (meminfo)."""
    out: dict[str, int] = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.replace(":", " ").split()
                if len(parts) >= 2 and parts[1].isdigit():
                    out[parts[0]] = int(parts[1])
    except OSError:
        pass
    return out


def _one(path: str) -> int | str | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else text


def _cpu() -> dict[str, int]:
    """The host's CPU time by kind, all cores summed (clock ticks; /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return {}
    return {k: int(v) for k, v in zip(CPU, fields)}


def snapshot(cgroup: str = "/sys/fs/cgroup") -> dict:
    """The counters now: vmstat (counts), the host's CPU time by kind (ticks), meminfo
    (kB), the cgroup's limit, use and memory.stat (bytes). Missing files leave their
    fields out."""
    vm = _pairs("/proc/vmstat")
    mi = _pairs("/proc/meminfo")
    cg = _pairs(f"{cgroup}/memory.stat")
    return {
        "vmstat": {k: vm[k] for k in VMSTAT if k in vm},
        "cpu": _cpu(),
        "meminfo_kb": {k: mi[k] for k in MEMINFO if k in mi},
        "cgroup": {
            "max": _one(f"{cgroup}/memory.max"),
            "current": _one(f"{cgroup}/memory.current"),
            **{k: cg[k] for k in CGROUP_STAT if k in cg},
        },
    }


def delta(before: dict, after: dict) -> dict[str, int]:
    """What the vmstat counters and the host's CPU time (``cpu_<kind>``, ticks: how
    busy all cores were, steal included) grew by between two snapshots."""
    out = {}
    for part, prefix in (("vmstat", ""), ("cpu", "cpu_")):
        a, b = before.get(part, {}), after.get(part, {})
        out.update({prefix + k: b[k] - a[k] for k in b if k in a})
    return out


def resident(root: str) -> dict:
    """How much of the regular files under root the page cache holds now (mincore on a
    private read mapping of each; nothing is read or faulted in)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    page = mmap.PAGESIZE
    files = size = cached = 0
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            length = os.path.getsize(path)
            files += 1
            size += length
            if not length:
                continue
            with open(path, "rb") as f:
                m = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_COPY)
            try:
                view = ctypes.c_char.from_buffer(m)
                vec = ctypes.create_string_buffer((length + page - 1) // page)
                rc = libc.mincore(ctypes.addressof(view), length, vec)
                del view
                if rc == 0:
                    cached += vec.raw.translate(_LOW_BIT).count(1) * page
            finally:
                m.close()
    return {"files": files, "bytes": size, "cached_bytes": min(cached, size)}
