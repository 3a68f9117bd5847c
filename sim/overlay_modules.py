"""The overlays' own modules, loaded straight from overlays/, outside vLLM.

Inside vLLM they are files of the patched tree. The writer's logic, the
format codec's binding and the knob contract need no vLLM, so the unit tests, the
benchmark and tools import them from here::

    from overlay_modules import fmt, ksl, kv_offload_knobs
    ksl.writer.StoreWriter(...)

``chunk_fmt`` is ``fmt`` with the chunk calls only tests make (chunk_calls.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERLAYS = REPO / "overlays"
# The format codec and the data path are the native store library's: this
# checkout's build unless KVTIER_STORE_LIB names another.
os.environ.setdefault(
    "KVTIER_STORE_LIB", str(REPO / "build" / "storeio" / "libkvtier_store.so")
)
for _folder in (OVERLAYS / "kv-offload-store-local", OVERLAYS / "kv-offload-scope"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import kv_offload_knobs  # noqa: E402
import kv_store_format as fmt  # noqa: E402
import kv_store_format.native  # noqa: E402,F401
import kv_store_local as ksl  # noqa: E402
import kv_store_local.capture_device  # noqa: E402,F401
import kv_store_local.capture_pool  # noqa: E402,F401
import kv_store_local.captured  # noqa: E402,F401
import kv_store_local.chunk_lookup  # noqa: E402,F401
import kv_store_local.copier  # noqa: E402,F401
import kv_store_local.durable_io  # noqa: E402,F401
import kv_store_local.errors  # noqa: E402,F401
import kv_store_local.keep_k  # noqa: E402,F401
import kv_store_local.layout  # noqa: E402,F401
import kv_store_local.ledger  # noqa: E402,F401
import kv_store_local.manifests  # noqa: E402,F401
import kv_store_local.namespace  # noqa: E402,F401
import kv_store_local.published  # noqa: E402,F401
import kv_store_local.publisher  # noqa: E402,F401
import kv_store_local.side_channel  # noqa: E402,F401
import kv_store_local.stats  # noqa: E402,F401
import kv_store_local.worker_store  # noqa: E402,F401
import kv_store_local.writer  # noqa: E402,F401
from chunk_calls import ChunkCalls  # noqa: E402

__all__ = ["chunk_fmt", "fmt", "hybrid_groups", "ksl", "kv_offload_knobs"]

chunk_fmt = ChunkCalls(fmt)

STATE_GROUPS = (2, 3, 4, 5)


def hybrid_groups(
    full_layers: int,
    full_real: int,
    state_layers: int,
    conv: ksl.layout.StatePart,
    temporal: ksl.layout.StatePart,
) -> list[ksl.layout.GroupLayout]:
    """The writer's view of the 7-group hybrid: g0 full attention (slot 0)
    and the state groups g2-g5 (slots 1-4); layer i of every group aliases
    staging tensor i, as the hybrid models' groups share their tensors."""
    layout = ksl.layout
    groups = [
        layout.GroupLayout(
            0,
            0,
            "full",
            tuple(layout.LayerLayout(i, full_real) for i in range(full_layers)),
        )
    ]
    state_bytes = conv.nbytes + temporal.nbytes
    for slot, g in enumerate(STATE_GROUPS, start=1):
        layers = tuple(
            layout.LayerLayout(i, state_bytes, (conv, temporal))
            for i in range(state_layers)
        )
        groups.append(layout.GroupLayout(g, slot, "state", layers))
    return groups
