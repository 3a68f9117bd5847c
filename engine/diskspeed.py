"""The disk's and the page cache's plain speeds, measured beside the stages that use them.

A restore or a writer is judged against what the same machine does without our code in
the same run: a parallel read of the store's own files (no checks) from the disk or from
the page cache, and a sequential write + fsync of a scratch file beside the store.
"""

from __future__ import annotations

import os
import threading
import time

READ_BLOCK = 8 << 20


def store_files(root: str) -> list[str]:
    """Every regular file under root (chunk files, manifests, records), largest first."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(path)
    return sorted(found, key=lambda p: -os.path.getsize(p))


def evict(files: list[str]) -> None:
    """Drop the files from the page cache (dirty pages are written out first)."""
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def parallel_read(files: list[str], threads: int) -> dict:
    """Read every file whole, ``threads`` at a time, into private buffers; GB/s."""
    todo = list(files)
    lock = threading.Lock()
    total = [0]

    def work() -> None:
        buf = bytearray(READ_BLOCK)
        view = memoryview(buf)
        while True:
            with lock:
                if not todo:
                    return
                path = todo.pop()
            fd = os.open(path, os.O_RDONLY)
            try:
                offset = 0
                while n := os.preadv(fd, [view], offset):
                    offset += n
            finally:
                os.close(fd)
            with lock:
                total[0] += offset

    t0 = time.perf_counter()
    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    seconds = time.perf_counter() - t0
    return {
        "threads": threads,
        "bytes": total[0],
        "seconds": round(seconds, 3),
        "gb_per_s": round(total[0] / seconds / 1e9, 3) if seconds else None,
    }


def read_speeds(root: str, from_disk: bool, threads: tuple[int, ...] = (4, 16)) -> dict:
    """Plain parallel reads of the store under root, from the disk (evicted before each
    pass and after the last) or from the page cache (read once first)."""
    files = store_files(root)
    out: dict = {"files": len(files), "source": "disk" if from_disk else "page cache"}
    if not files:
        return out | {"error": f"no files under {root}"}
    if not from_disk:
        parallel_read(files, 16)
    passes = []
    for n in threads:
        if from_disk:
            evict(files)
        passes.append(parallel_read(files, n))
    if from_disk:
        evict(files)
    out["passes"] = passes
    out["best_gb_per_s"] = max(p["gb_per_s"] or 0 for p in passes)
    return out


def write_speed(folder: str, size: int = 4 << 30, block: int = 32 << 20) -> dict:
    """Sequential write of ``size`` bytes in ``block`` writes, then fsync; GB/s."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f".disk-write-speed.{os.getpid()}")
    data = os.urandom(block)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t0 = time.perf_counter()
        written = 0
        while written < size:
            written += os.write(fd, data)
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return {
        "bytes": written,
        "seconds": round(seconds, 3),
        "gb_per_s": round(written / seconds / 1e9, 3),
    }
