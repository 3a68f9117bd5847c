"""Stands for vllm.config: only the names the pinned files import.

VllmConfig is a plain attribute bag: tests pass the sub-configs the code under
test reads (cache_config, parallel_config, model_config, kv_transfer_config...),
e.g. ``VllmConfig(cache_config=SimpleNamespace(block_size=16), ...)``. It does not
validate or derive anything: a missing attribute raises AttributeError, so a
test must state every input the code reads.
"""

from types import SimpleNamespace


class VllmConfig(SimpleNamespace):
    pass


class KVTransferConfig(SimpleNamespace):
    pass


_current: VllmConfig | None = None


def get_current_vllm_config_or_none() -> VllmConfig | None:
    return _current
