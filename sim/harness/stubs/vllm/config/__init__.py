"""Stands for vllm.config: only the names the pinned files import.

VllmConfig is a plain attribute bag: tests pass the sub-configs the code under
test reads (cache_config, parallel_config, model_config, kv_transfer_config...),
e.g. ``VllmConfig(cache_config=SimpleNamespace(block_size=16), ...)``. It does not
validate or derive anything: a missing attribute raises AttributeError, so a
test must state every input the code reads. A field the release's own
VllmConfig (or KVTransferConfig) does not have is refused at construction,
checked against the tree's real file: a stub never answers a renamed field.
"""

from types import SimpleNamespace

from harness.release import check_fields


class _Checked(SimpleNamespace):
    _imitates = ""

    def __init__(self, **fields) -> None:
        tree = globals().get("__harness_tree__")
        if tree is not None:
            check_fields(tree, self._imitates, fields)
        super().__init__(**fields)


class VllmConfig(_Checked):
    _imitates = "vllm.config.vllm.VllmConfig"


class KVTransferConfig(_Checked):
    _imitates = "vllm.config.kv_transfer.KVTransferConfig"


_current: VllmConfig | None = None


def get_current_vllm_config_or_none() -> VllmConfig | None:
    return _current
