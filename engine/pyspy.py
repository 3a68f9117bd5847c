"""Diagnosis (KVTIER_SUITE_PYSPY=1): py-spy samples a stage's own process from outside
while its timed rounds run, keeping only the samples of the thread that holds the GIL, with
native frames (`py-spy record --gil --threads --native --format raw`): which thread held the
GIL, and in what call. py-spy reads the stacks through ptrace, with no help from the GIL
(faulthandler's dumps of other threads crashed the engine, run 40).

py-spy comes with set W (engine/wheels.txt) and installs into /tmp/site/bin/py-spy on the
device; find_binary looks for bin/py-spy beside every PYTHONPATH / sys.path entry, then on
PATH (KVTIER_PYSPY_BIN names it outright). KVTIER_SUITE_PYSPY_ARGS replaces the sampling
flags (default DEFAULT_FLAGS). A diagnosis, never a verdict: when py-spy is missing or
cannot attach, the summary says why and the stage carries on.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

ENV = "KVTIER_SUITE_PYSPY"
DEFAULT_FLAGS = ["--gil", "--threads", "--native", "--rate", "200"]
# Yama's prctl: let any process ptrace this one (ptrace_scope=1 allows only ancestors).
PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
# Frames of a stack in the summary, its innermost (the whole file stays in the logs).
FRAMES_KEPT = 60


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def find_binary() -> str | None:
    """py-spy's executable: KVTIER_PYSPY_BIN, else bin/py-spy beside a site folder on
    PYTHONPATH or sys.path (pip --target puts scripts there), else PATH's."""
    named = os.environ.get("KVTIER_PYSPY_BIN")
    if named:
        return named if os.access(named, os.X_OK) else None
    folders = os.environ.get("PYTHONPATH", "").split(os.pathsep) + sys.path
    for folder in folders:
        if not folder:
            continue
        path = os.path.join(folder, "bin", "py-spy")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return shutil.which("py-spy")


def allow_ptrace() -> str:
    """PR_SET_PTRACER_ANY on this process, so its child py-spy may attach under Yama's
    ptrace_scope=1; 'ok' or why not (no Yama: EINVAL, harmless where scope is 0)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.prctl(
            ctypes.c_int(PR_SET_PTRACER),
            ctypes.c_ulong(PR_SET_PTRACER_ANY),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
            ctypes.c_ulong(0),
        )
    except (OSError, AttributeError) as e:
        return f"prctl unavailable: {e}"
    if rc != 0:
        return f"prctl(PR_SET_PTRACER) failed: {os.strerror(ctypes.get_errno())}"
    return "ok"


def ptrace_scope() -> str | None:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return f.read().strip()
    except OSError:
        return None


def start(out_path: str, pid: int | None = None, settle_s: float = 1.0) -> dict:
    """Start py-spy recording ``pid`` (this process by default) into ``out_path``, then
    give it ``settle_s`` to attach. A handle for stop(); its "error" says why nothing
    runs (missing binary, an early exit of py-spy)."""
    handle: dict[str, Any] = {"out": out_path, "proc": None}
    binary = find_binary()
    if binary is None:
        handle["error"] = (
            "py-spy not found (no bin/py-spy beside a PYTHONPATH entry, none on PATH)"
        )
        return handle
    flags = os.environ.get(f"{ENV}_ARGS", "").split() or DEFAULT_FLAGS
    target = os.getpid() if pid is None else pid
    argv = [binary, "record", "--pid", str(target), "--format", "raw"]
    argv += ["--output", out_path, *flags]
    handle.update(argv=argv, ptrace_scope=ptrace_scope())
    if target == os.getpid():
        handle["prctl"] = allow_ptrace()
    handle["stderr_path"] = out_path + ".stderr"
    try:
        err = open(handle["stderr_path"], "wb")
        handle["proc"] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a terminal's ^C stays the stage's own
        )
        err.close()
    except OSError as e:
        handle["error"] = f"py-spy did not start: {e}"
        return handle
    handle["started"] = time.time()
    deadline = time.time() + settle_s
    while time.time() < deadline and handle["proc"].poll() is None:
        time.sleep(0.05)
    if handle["proc"].poll() is not None:
        handle["error"] = f"py-spy exited at once (rc {handle['proc'].returncode})"
    return handle


def stop(handle: dict, timeout_s: float = 60.0, top: int = 30) -> dict:
    """SIGINT py-spy (it writes its file then), wait for it and summarize what it wrote:
    rc, its output's tail, the samples, the threads that held the GIL and the ``top``
    stacks by count. Never raises."""
    out: dict[str, Any] = {k: handle.get(k) for k in ("argv", "ptrace_scope", "prctl")}
    if handle.get("error"):
        out["error"] = handle["error"]
    proc = handle.get("proc")
    if proc is not None:
        if proc.poll() is None:
            out["seconds"] = round(time.time() - handle["started"], 3)
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            out["error"] = f"py-spy did not stop within {timeout_s} s of SIGINT: killed"
        out["rc"] = proc.returncode
        try:
            with open(handle["stderr_path"], "rb") as f:
                text = f.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        out["stderr_tail"] = text[-1500:]
        m = re.search(r"Samples: (\d+) Errors: (\d+)", text)
        if m:
            out["pyspy_samples"], out["pyspy_errors"] = int(m[1]), int(m[2])
    try:
        with open(handle["out"], encoding="utf-8", errors="replace") as f:
            out.update(summarize(f, top))
    except OSError as e:
        out.setdefault("error", f"no py-spy output: {e}")
        out["samples"] = 0
    out["file"] = os.path.basename(handle["out"])
    return out


def _trim(stack: str, keep: int = FRAMES_KEPT) -> str:
    """A collapsed stack with its innermost ``keep`` frames (the thread label kept)."""
    frames = stack.split(";")
    if len(frames) <= keep + 1:
        return stack
    return ";".join([frames[0], f"...{len(frames) - 1 - keep} frames", *frames[-keep:]])


def summarize(lines, top: int = 30) -> dict:
    """py-spy's raw (collapsed) lines, each `frame;frame;... count`, outermost first and
    with --threads a `thread (tid): name` label first: the samples, the distinct stacks,
    the samples of each thread, the ``top`` stacks and innermost frames by count."""
    stacks: collections.Counter[str] = collections.Counter()
    for line in lines:
        line = line.rstrip("\n")
        stack, sep, count = line.rpartition(" ")
        if not sep or not stack or not count.isdigit():
            continue
        stacks[stack] += int(count)
    threads: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for stack, n in stacks.items():
        frames = stack.split(";")
        if frames[0].startswith("thread ") or frames[0].startswith("process "):
            threads[frames[0]] += n
        leaves[frames[-1]] += n
    return {
        "samples": sum(stacks.values()),
        "distinct_stacks": len(stacks),
        "threads": dict(threads.most_common()),
        "top_leaves": [[f, n] for f, n in leaves.most_common(top)],
        "top": [[_trim(s), n] for s, n in stacks.most_common(top)],
    }
