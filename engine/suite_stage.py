"""The Stage record: one engine run of the GPU suite as a stage table names it (engine/suite.py
runs it; its tables are there, in suite_realsize.py and in suite_models.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
# GLM53_KV_OFFLOAD_CPU_GB of every knob-1 stage: launch.sh sizes the CPU tier from it, so the
# stock-connector stages compared with them (the pressure pair) use the same size.
CPU_GB = 1


@dataclass
class Stage:
    name: str
    model: str
    tree: str  # "pristine" or "patched"
    knob: str | None  # GLM53_KV_OFFLOAD, None = unset
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    wave: int = 1
    gpus: int = 1
    timeout: int = 240
    store: str | None = None  # store folder name (default: the stage's name)
    verify: bool = True  # run `kvstore verify` on the store after a knob-1 stage
    corrupt: str | None = None  # before this stage: flip a payload byte of a chunk that
    # the named stage restored (restore stages)
    diagnosis: bool = False  # runs only when --only names it exactly
    before: str | None = None  # before this stage, on the store's files: "evict" (page
    # cache dropped, plain parallel read from disk timed) or "warm" (read into the page
    # cache, plain read from it timed); "disk-write" times a sequential write + fsync
    needs: str | None = (
        None  # the model's ops stage (engine/opsprobe.py): when it failed,
    )
    # this stage is not started and says which import stopped it
    models_site: bool = (
        False  # PYTHONPATH also gets --models-site (the newer transformers)
    )

    @property
    def probe(self) -> bool:
        return self.knob == "1" and self.verify
