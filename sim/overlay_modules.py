"""The overlays' own modules, loaded straight from overlays/, outside vLLM.

Inside vLLM they are files of the patched tree. The writer's logic, the
format codec and the knob contract need no vLLM, so the unit tests, the
benchmark and tools import them from here::

    from overlay_modules import fmt, ksl, kv_offload_knobs
    ksl.writer.StoreWriter(...)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERLAYS = REPO / "overlays"
for _folder in (OVERLAYS / "kv-offload-store-local", OVERLAYS / "kv-offload-scope"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import kv_offload_knobs  # noqa: E402
import kv_store_format as fmt  # noqa: E402
import kv_store_local as ksl  # noqa: E402
import kv_store_local.capture_pool  # noqa: E402,F401
import kv_store_local.captured  # noqa: E402,F401
import kv_store_local.checksum  # noqa: E402,F401
import kv_store_local.copier  # noqa: E402,F401
import kv_store_local.durable_io  # noqa: E402,F401
import kv_store_local.errors  # noqa: E402,F401
import kv_store_local.layout  # noqa: E402,F401
import kv_store_local.manifests  # noqa: E402,F401
import kv_store_local.namespace  # noqa: E402,F401
import kv_store_local.side_channel  # noqa: E402,F401
import kv_store_local.stats  # noqa: E402,F401
import kv_store_local.worker_store  # noqa: E402,F401
import kv_store_local.writer  # noqa: E402,F401

__all__ = ["fmt", "ksl", "kv_offload_knobs"]
