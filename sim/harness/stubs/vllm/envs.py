"""Stands for vllm.envs: environment knobs, read from os.environ like vLLM does.

Only the knobs the pinned files read are defined, with vLLM's defaults; an
unknown name raises AttributeError so a new use is noticed, not defaulted.
"""

import os


def _flag(name: str, default: str) -> bool:
    return os.environ.get(name, default).lower() in ("1", "true")


_KNOBS = {
    "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": lambda: _flag(
        "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1"
    ),
}


def __getattr__(name: str):
    if name in _KNOBS:
        return _KNOBS[name]()
    raise AttributeError(f"vllm.envs stub: {name} is not defined in the harness")
