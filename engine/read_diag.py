"""Diagnoses of a restoring engine's promotion reads, opt-in by environment and never a
verdict (engine/probe.py installs them in the worker): every thread's stack and kernel
state while a promotion runs (KVTIER_SUITE_SAMPLE_STACKS=1), the GIL's long holds, the
collections and each read's span (KVTIER_SUITE_GIL_WATCH=1), and the largest read run
again at the stage's end, one thing varied at a time (KVTIER_SUITE_READ_REPLAY=1).
Standard library only: it runs inside the engine's process.
"""

from __future__ import annotations

import collections
import ctypes
import os
import sys
import threading
import time
from typing import Any


def watch_gil(restore: Any, every_s: float = 0.001, gap_s: float = 0.03) -> dict:
    """Diagnosis (KVTIER_SUITE_GIL_WATCH=1): when this process's GIL was held
    for long, and by what. A thread that wakes every ``every_s`` records each
    wake-up later than ``gap_s`` (another thread held the GIL in a call that
    does not release it) with the main thread's innermost frames as it let go;
    a gc callback records each collection over 5 ms; each promotion as
    [queued at, queued to reported, the library's read seconds, keys].
    Times are seconds since the watch began."""
    import gc

    t0 = time.perf_counter()
    stop = threading.Event()
    out: dict[str, Any] = {"gaps": [], "gc": [], "reads": [], "stop": stop}
    main = threading.main_thread().ident
    started = [0.0]

    def collected(phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            started[0] = now
        elif now - started[0] > 0.005:
            out["gc"].append(
                [round(started[0] - t0, 4), round(now - started[0], 4),
                 info.get("generation"), info.get("collected")]
            )  # fmt: skip

    def run() -> None:
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(every_s)
            late = time.perf_counter() - t - every_s
            if late > gap_s:
                frame = sys._current_frames().get(main)
                where = []
                while frame is not None and len(where) < 4:
                    code = frame.f_code
                    where.append(
                        f"{os.path.basename(code.co_filename)}:{frame.f_lineno} {code.co_name}"
                    )
                    frame = frame.f_back
                out["gaps"].append([round(t - t0, 4), round(late, 4), where])

    queue_read, finish = restore._queue_read, restore._finish
    queued: dict[int, float] = {}

    def timed_queue(job: Any) -> None:
        queued[id(job)] = time.perf_counter()
        queue_read(job)

    def timed_finish(job: Any) -> bool:
        # Queued to reported on the step's thread, against the library's own
        # time for the call: the difference is the wait for a step to look.
        t = queued.pop(id(job), None)
        ok = finish(job)
        if t is not None:
            out["reads"].append(
                [round(t - t0, 4), round(time.perf_counter() - t, 4),
                 round(job.seconds, 4), len(job.keys)]
            )  # fmt: skip
        # Where the step's thread may run (the library's readers inherit the
        # read queue's thread, started from it): CPUs allowed, nice, policy.
        out["threads"] = {"main": _sched(threading.main_thread().native_id)}
        return ok

    restore._queue_read, restore._finish = timed_queue, timed_finish
    gc.callbacks.append(collected)
    out["collected"] = collected  # for stop_gil_watch
    threading.Thread(target=run, name="kvtier-gil-watch", daemon=True).start()
    return out


# The read call's flags as the restore passes them (kv_restore_read.queue_job).
ENGINE_FLAGS = {"stop_on_failure": True, "willneed": True, "safe_folders": True}


def _timed(read: Any, threads: int, flags: dict[str, bool]) -> dict[str, Any]:
    """One run of a prepared read call: wall time, rate, and the process's CPU."""
    t0, c0 = time.perf_counter(), os.times()
    read.run(threads, **flags)
    dt, c1 = time.perf_counter() - t0, os.times()
    results = read.results()
    nbytes = sum(r.bytes for r in results)
    return {
        "files": len(results),
        "failed": sum(not r.ok for r in results),
        "bytes": nbytes,
        "threads": threads,
        "flags": sorted(k for k, v in flags.items() if v),
        "seconds": round(dt, 4),
        "gb_per_s": round(nbytes / dt / 1e9, 3) if dt else None,
        "cpu_user_s": round(c1.user - c0.user, 3),
        "cpu_sys_s": round(c1.system - c0.system, 3),
    }


def _sub_read(read: Any, items: Any, count: int, keep: list) -> Any:
    """A prepared read of ``count`` items at ``items`` (a part of ``read``'s,
    or copies of them), keeping ``keep`` alive as long as it is."""
    sub = object.__new__(type(read))
    sub._lib, sub._count, sub._items, sub._runs = read._lib, count, items, keep
    return sub


def _private_copy(read: Any, count: int) -> tuple[Any, list]:
    """The first ``count`` items of a prepared read, each payload landing in one
    run of a new anonymous mapping instead of the CPU tier's rows."""
    import mmap
    from array import array

    module = sys.modules[type(read).__module__]
    items = (module.ReadItem * count)()
    ctypes.memmove(items, read._items, ctypes.sizeof(module.ReadItem) * count)
    total = sum(i.payload_length for i in items)
    buf = mmap.mmap(-1, total)
    buf.write(bytes(total))  # every page faulted in before the timing
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    keep: list = [buf, read]
    offset = 0
    for item in items:
        run = array("Q", [base + offset, item.payload_length])
        keep.append(run)
        item.runs = ctypes.cast(run.buffer_info()[0], ctypes.POINTER(module.Run))
        item.num_runs = 1
        offset += item.payload_length
    return _sub_read(read, items, count, keep), keep


def replay_reads(restore: Any) -> list[dict[str, Any]]:
    """Diagnosis (KVTIER_SUITE_READ_REPLAY=1), at the stage's end only: the largest
    promotion's read call run again, as the engine ran it and varied one thing at a
    time (threads, flags, calls of 32 files, the destination), so an in-engine read
    slower than the library's bench says which of these it is. It rewrites the same
    bytes into the CPU tier's rows the job filled; nothing reads them afterwards."""
    kept = getattr(restore, "_probe_replay", None)
    if kept is None:
        return []
    _, read = kept
    count = read._count
    first = min(64, count)
    head = _sub_read(read, read._items, first, [read])
    private, _ = _private_copy(read, first)
    variants = [
        ("as the engine", read, 16, ENGINE_FLAGS),
        ("again", read, 16, ENGINE_FLAGS),
        ("no willneed", read, 16, {**ENGINE_FLAGS, "willneed": False}),
        ("no safe_folders", read, 16, {**ENGINE_FLAGS, "safe_folders": False}),
        ("no flags", read, 16, dict.fromkeys(ENGINE_FLAGS, False)),
        ("32 threads", read, 32, ENGINE_FLAGS),
        ("4 threads", read, 4, ENGINE_FLAGS),
        (f"first {first}, 1 thread", head, 1, ENGINE_FLAGS),
        (f"first {first}, 16 threads", head, 16, ENGINE_FLAGS),
        (f"first {first} into private memory", private, 16, ENGINE_FLAGS),
    ]
    out = [{"variant": name, **_timed(r, t, f)} for name, r, t, f in variants]
    # The job as calls of 32 files, one after another.
    item = type(read._items[0])
    base = ctypes.addressof(read._items)
    t0, parts = time.perf_counter(), []
    for start in range(0, count, 32):
        items = ctypes.cast(base + start * ctypes.sizeof(item), ctypes.POINTER(item))
        part = _sub_read(read, items, min(32, count - start), [read])
        parts.append(_timed(part, 16, ENGINE_FLAGS))
    dt = time.perf_counter() - t0
    out.append(
        {
            "variant": "calls of 32 files",
            "calls": len(parts),
            "failed": sum(p["failed"] for p in parts),
            "seconds": round(dt, 4),
            "gb_per_s": round(sum(p["bytes"] for p in parts) / dt / 1e9, 3),
            "slowest_call_s": max(p["seconds"] for p in parts),
        }
    )
    return out


def sample_tasks(restore: Any, every_s: float = 0.002) -> collections.Counter:
    """What the kernel says each thread of this process is doing, every ``every_s``
    while a promotion runs (the native readers have no Python frame): counts of
    (state, wait channel) over the threads, and of how many were runnable at once.
    Tells a read that waits (a lock, the disk) from one that computes or queues for a
    core."""
    counts: collections.Counter = collections.Counter()

    def run() -> None:
        me = threading.get_native_id()
        while True:
            time.sleep(every_s)
            if not getattr(restore, "_running", None):
                continue
            runnable = 0
            for tid in os.listdir("/proc/self/task"):
                if int(tid) == me:
                    continue
                try:
                    with open(f"/proc/self/task/{tid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                    with open(f"/proc/self/task/{tid}/wchan") as f:
                        wchan = f.read().strip() or "-"
                except OSError:
                    continue  # the thread ended meanwhile
                runnable += state == "R"
                counts[f"{state} {wchan}"] += 1
            counts[f"runnable {runnable}"] += 1
            counts["samples"] += 1

    threading.Thread(target=run, name="kvtier-task-sampler", daemon=True).start()
    return counts


def sample_stacks(every_s: float = 0.005) -> collections.Counter:
    """Where each thread of this process is, every ``every_s`` (a diagnosis of
    where a promotion's time goes: a line of our code or vLLM's holding the GIL,
    or the native call). Counts (thread, innermost frame) and (thread, innermost
    frame of the overlays' code); a daemon thread, for the process's life."""
    counts: collections.Counter = collections.Counter()

    def run() -> None:
        me = threading.get_ident()
        while True:
            time.sleep(every_s)
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                name = names.get(ident, "?").split("_")[0]
                top = frame
                ours = None
                f: Any = frame
                while f is not None:
                    path = f.f_code.co_filename
                    if ours is None and ("kv_restore" in path or "kv_store" in path):
                        ours = f
                    f = f.f_back
                where = f"{os.path.basename(top.f_code.co_filename)}:{top.f_lineno} {top.f_code.co_name}"
                counts[(name, where)] += 1
                if ours is not None and ours is not top:
                    path = os.path.basename(ours.f_code.co_filename)
                    counts[
                        (name, f"ours {path}:{ours.f_lineno} {ours.f_code.co_name}")
                    ] += 1

    threading.Thread(target=run, name="kvtier-sampler", daemon=True).start()
    return counts


def _sched(tid: int | None) -> dict[str, Any]:
    """A thread's CPUs allowed, nice, scheduling policy and last CPU (/proc)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/self/task/{tid}/status") as f:
            allowed = next(
                line.split(":", 1)[1].strip()
                for line in f
                if line.startswith("Cpus_allowed_list")
            )
    except (OSError, StopIteration) as e:
        return {"error": str(e)}
    # stat's fields after the name: nice is the 17th, processor the 37th,
    # policy the 39th (proc(5), counting from state as the first).
    return {
        "cpus": allowed,
        "nice": int(fields[16]),
        "processor": int(fields[36]),
        "policy": int(fields[38]),
    }


def stop_gil_watch(watch: dict) -> None:
    """End a watch: its thread and its gc callback (tests)."""
    import gc

    watch["stop"].set()
    gc.callbacks.remove(watch["collected"])


def gil_report(watch: dict | None, top: int = 40) -> dict | None:
    """The watch's longest GIL gaps and collections, and every read, in time order."""
    if watch is None:
        return None
    longest = sorted(watch["gaps"], key=lambda g: -g[1])[:top]
    slowest = sorted(watch["gc"], key=lambda g: -g[1])[:top]
    return {
        "gaps": sorted(longest),
        "gaps_total": len(watch["gaps"]),
        "gc": sorted(slowest),
        "gc_total": len(watch["gc"]),
        "reads": list(watch["reads"]),
        "threads": watch.get("threads"),
    }
