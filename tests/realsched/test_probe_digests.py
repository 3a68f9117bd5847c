"""The GPU suite's KV digests compare engines whose caches use different layouts."""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
import probe  # noqa: E402


def layer_cache(values: torch.Tensor, physical: tuple[int, ...]) -> torch.Tensor:
    """A [B, H, N, C] view of `values` stored in the physical order `physical`."""
    stored = values.permute(*physical).contiguous()
    inverse = [physical.index(i) for i in range(4)]
    return stored.permute(*inverse)


def worker_with(cache: torch.Tensor) -> SimpleNamespace:
    ctx = {"layer.0": SimpleNamespace(kv_cache=cache)}
    runner = SimpleNamespace(
        compilation_config=SimpleNamespace(static_forward_context=ctx)
    )
    return SimpleNamespace(model_runner=runner)


def test_equal_kv_in_two_layouts_digests_equal_and_a_changed_byte_does_not():
    values = torch.randn(6, 2, 16, 8).to(torch.bfloat16)  # blocks, heads, tokens, dim
    hnd = worker_with(layer_cache(values, (0, 1, 2, 3)))
    nhd = worker_with(layer_cache(values, (0, 2, 1, 3)))
    # Raw pages differ between the layouts: the reason the digest reads the logical view.
    raw_hnd = probe._layer_page(hnd, "layer.0", 6)[0]
    raw_nhd = probe._layer_page(nhd, "layer.0", 6)[0]
    assert not torch.equal(raw_hnd, raw_nhd)
    for block in range(1, 6):
        a = probe._logical_block(hnd, "layer.0", None, 6, block)
        b = probe._logical_block(nhd, "layer.0", None, 6, block)
        assert a == b and len(a) == 2 * 16 * 8 * 2
    changed = values.clone()
    changed[3, 1, 5, 2] += 1
    other = worker_with(layer_cache(changed, (0, 2, 1, 3)))
    assert probe._logical_block(other, "layer.0", None, 6, 3) != probe._logical_block(
        hnd, "layer.0", None, 6, 3
    )
    assert probe._logical_block(other, "layer.0", None, 6, 2) == probe._logical_block(
        hnd, "layer.0", None, 6, 2
    )


def test_the_restore_recorder_wraps_what_the_real_restore_calls(monkeypatch):
    """The probe wraps WorkerRestore methods by name: on the real module a finished job
    and a failure each reach the recorder and then the restore's own code (a rename
    once failed every restore stage on the GPU, run 22)."""
    import vllm.distributed.kv_transfer as kv_transfer
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        kv_restore_read,
        kv_restore_worker,
    )

    for name in probe.RESTORE_WRAPPED:
        assert callable(getattr(kv_restore_worker.WorkerRestore, name, None)), name
    restore = kv_restore_worker.WorkerRestore()
    connector = SimpleNamespace(_kv_restore=restore, _kv_store=None)
    monkeypatch.setattr(kv_transfer, "has_kv_transfer_group", lambda: True)
    monkeypatch.setattr(
        kv_transfer,
        "get_kv_transfer_group",
        lambda: SimpleNamespace(connector_worker=connector),
    )
    assert probe.install_restore_recorder(None) == {"restore": True}
    failed = kv_restore_read.PromotionFailed("no_manifest", "none proves it")
    job = kv_restore_worker.Promotion([b"k" * 36], failure=failed)
    assert restore._finish(job) is False
    promotions, failures, _ = restore._probe
    assert promotions == [{"ok": False, "keys": [b"k" * 36]}]
    assert failures == [
        {"reason": "no_manifest", "key": None, "message": "none proves it"}
    ]
    assert restore.stats.failures["no_manifest"] == 1  # the restore's own code ran
