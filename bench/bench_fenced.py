"""The fenced namespace fields the benchmarks write their stores under."""

from __future__ import annotations

from typing import Any

import kv_store_format as fmt


def bench_fenced(model: str, **overrides: Any) -> dict:
    """``make_fenced`` with a benchmark's defaults; ``overrides`` replace them."""
    fields: dict[str, Any] = {
        "model": model,
        "vllm_version": "bench",
        "build_id": "bench",
        "tp_size": 1,
        "kv_dtype": "auto",
        "hash_algorithm": "sha256_cbor",
        "num_speculative_tokens": 0,
        "page_sizes": {0: 4096},
        "state_abi": {},
    }
    fields.update(overrides)
    return fmt.make_fenced(**fields)
