"""Runs model_layout.py boots forked from one process that imported vLLM once.

    python tests/realsched/layout_server.py     (requests on stdin, one JSON line each)

A boot spent most of its time importing torch and vLLM, and test_model_layouts.py asks for
18 of them: forked from here they took the module 137 s instead of 209 on the 2-core VM (vLLM
0.33.0, 2026-12-08). This server imports those modules, prints "ready", then for each request {"args": [...], "env": {...}, "dir": PATH}
forks a waiter that forks the boot and records its end: PATH/stdout, PATH/stderr, the
boot's PATH/pid, then PATH/rc (its exit status; -N for signal N), renamed into place last.
The server reads the next request at once, so boots run side by side; it exits at the end
of its input, leaving running boots to finish.

The server imports none of our overlays' modules (checked before "ready"): they read the
GLM53_* knobs, which a request sets in its boot alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# What every boot imports before it reads a knob: the test's harness, vLLM's config, engine
# arguments, scheduler, model loader and the models' layers (torch and transformers with them).
PRELOAD = (
    "model_layout",
    "vllm.config",
    "vllm.engine.arg_utils",
    "vllm.v1.core.sched.scheduler",
    "vllm.model_executor.model_loader.utils",
    "vllm.model_executor.layers.attention_layer_base",
)
OVERLAYS = os.path.join(HERE, "..", "..", "overlays")


def _ours() -> set[str]:
    """The names of the modules our overlays add (and of their fragments): each boot must
    import them under its own knobs."""
    return {
        name.removesuffix(".py")
        for overlay in os.listdir(OVERLAYS)
        if overlay.startswith("kv-")
        for name in os.listdir(os.path.join(OVERLAYS, overlay))
    }


def _boot(request: dict) -> int:
    """In the forked boot: its knobs, argv and output files, then model_layout's main."""
    out = request["dir"]
    for fd, name in ((1, "stdout"), (2, "stderr")):
        f = os.open(
            os.path.join(out, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
        )
        os.dup2(f, fd)
        os.close(f)
    sys.stdin = open(os.devnull)
    os.environ.update(request["env"])
    sys.argv = [os.path.join(HERE, "model_layout.py"), *request["args"]]
    import model_layout

    try:
        return model_layout.main()
    except SystemExit as e:  # argparse
        return e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def _wait_for(request: dict) -> None:
    """In the waiter: fork the boot, wait for it, write its status."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # before the fork: waitpid needs it
    pid = os.fork()
    if pid == 0:
        os._exit(_boot(request))
    with open(os.path.join(request["dir"], "pid"), "w") as f:
        f.write(str(pid))
    _, status = os.waitpid(pid, 0)
    _write_rc(request["dir"], os.waitstatus_to_exitcode(status))


def _write_rc(out: str, rc: int) -> None:
    with open(os.path.join(out, "rc.part"), "w") as f:
        f.write(str(rc))
    os.replace(os.path.join(out, "rc.part"), os.path.join(out, "rc"))


def main() -> int:
    import importlib

    import realsched

    # Modules bind vLLM's platform when imported: it must be the boots' CPU platform first.
    realsched.use_cpu_platform()
    for name in PRELOAD:
        importlib.import_module(name)
    names = _ours()
    ours = sorted(n for n in sys.modules if names & set(n.split(".")))
    if ours:
        print(f"layout_server: preloaded modules of ours: {ours}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters reap themselves
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            try:
                _wait_for(request)
            except BaseException:
                traceback.print_exc()
                _write_rc(request["dir"], 1)
            finally:
                os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
