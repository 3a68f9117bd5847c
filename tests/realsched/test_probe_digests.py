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
