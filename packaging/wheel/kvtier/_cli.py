"""The console scripts: each execs the native tool installed beside it.

`overlay` also hands the tool what only this interpreter knows, as JSON in
KVTIER_PIP_ENV: where the engine distribution is installed on its sys.path
(found.py) and which Python it is. The tool then acts on that tree when no
ROOT is given, and compiles injected sources with this Python
(patcher/found_root.cpp).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _engine(argv: list[str]) -> str:
    """--engine NAME or --engine=NAME (overlay's default: vllm)."""
    for i, arg in enumerate(argv):
        if arg == "--engine" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--engine="):
            return arg.split("=", 1)[1]
    return "vllm"


def _exec(tool: str, env: dict[str, str]) -> None:
    binary = HERE / "bin" / tool
    try:
        os.execve(binary, [str(binary), *sys.argv[1:]], env)
    except OSError as e:
        sys.stderr.write(f"{tool}: cannot run {binary}: {e.strerror}\n")
        sys.exit(6)  # the I/O error code of cli/exit_codes.h


def overlay() -> None:
    env = dict(os.environ)
    argv = sys.argv[1:]
    # An explicit --root needs no search (ROOT after the command is only seen
    # by the tool, which then ignores what is found here).
    if not any(a == "--root" or a.startswith("--root=") for a in argv):
        from kvtier import found

        engine = _engine(argv)
        env["KVTIER_PIP_ENV"] = json.dumps(
            {
                "python": sys.executable,
                "engine": engine,
                **found.search(engine, sys.path),
            }
        )
    else:
        env["KVTIER_PIP_ENV"] = json.dumps({"python": sys.executable})
    _exec("overlay", env)


def kvstore() -> None:
    _exec("kvstore", dict(os.environ))
