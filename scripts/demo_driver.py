"""What the demo drivers (demo_store.py, demo_restore.py) share: the store
knobs they set and their command line, TREE STORE_DIR in, one JSON line out."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path


def set_store_knobs(store: Path, **extra: str) -> None:
    """The knobs every demo driver runs the store with, plus its own."""
    os.environ.update(
        GLM53_KV_OFFLOAD="1",
        GLM53_KV_OFFLOAD_DIR=str(store),
        GLM53_KV_OFFLOAD_CPU_GB="1",
        GLM53_KV_OFFLOAD_BUILD_ID="demo",
        **extra,
    )


def run(script: str, drive: Callable[[Path, Path], dict]) -> None:
    if len(sys.argv) != 3:
        raise SystemExit(f"usage: {script} TREE STORE_DIR")
    print(json.dumps(drive(Path(sys.argv[1]), Path(sys.argv[2]).resolve())))
