# SPDX-License-Identifier: Apache-2.0
"""What this package takes from beside it, found the same way everywhere.

Inside vLLM the format codec and the knob contract are sibling modules of
this package (``offloading/kv_store_format/``, ``kv_offload_knobs.py``).
The tests, the benchmark and the main job load the package straight from
the overlay folders, where both are top-level modules.
"""

import logging

try:
    from .. import kv_offload_knobs as knobs
    from .. import kv_store_format as fmt
    from ..kv_store_format import native
except ImportError:  # loaded from the overlay folders
    import kv_offload_knobs as knobs  # type: ignore[no-redef]
    import kv_store_format as fmt  # type: ignore[no-redef]
    from kv_store_format import native  # type: ignore[no-redef]

__all__ = ["fmt", "init_logger", "knobs", "native"]


def init_logger(name: str) -> logging.Logger:
    """vLLM's logger inside vLLM; a plain one where vLLM is not installed."""
    try:
        from vllm.logger import init_logger as vllm_init_logger
    except ImportError:
        return logging.getLogger(name)
    return vllm_init_logger(name)
