"""The harness itself: resolution, isolation between trees, and that the real
pinned code runs (a full build_offloading_config example for overlay authors)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS

import harness
import pytest
from harness import release
from harness.imports import Import, runtime_imports

CONFIG = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.config"
MATH = "vllm.utils.math_utils"


def test_real_code_runs_with_real_specs(pristine):
    """KV-cache specs from the pinned kv_cache_interface compute real sizes."""
    kci = pristine.load("vllm.v1.kv_cache_interface")
    torch = pristine.load("torch")
    spec = kci.FullAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16
    )
    # 16 tokens x 8 heads x (128 K + 128 V) x 2 bytes
    assert spec.page_size_bytes == 16 * 8 * 256 * 2
    assert pristine.origin("vllm.v1.kv_cache_interface") == "tree"
    assert pristine.origin("torch") == "stub"


def _vllm_config(pristine, torch, extra=None):
    vc = pristine.load("vllm.config")
    return vc.VllmConfig(
        kv_transfer_config=NS(kv_connector_extra_config=extra or {}, engine_id="e0"),
        parallel_config=NS(
            decode_context_parallel_size=1, prefill_context_parallel_size=1,
            tensor_parallel_size=1, pipeline_parallel_size=1, world_size=1,
            distributed_executor_backend="mp", nnodes_within_dp=1, rank=0,
            data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=0,
        ),
        cache_config=NS(
            block_size=16, prefix_match_unit=None, enable_prefix_caching=True,
            cache_dtype="auto", kv_cache_layout=None, mamba_cache_mode="align",
        ),
        model_config=NS(
            use_mla=False, dtype=torch.bfloat16, model="m", max_model_len=1024,
            get_total_num_kv_heads=lambda: 8,
        ),
        kv_events_config=None,
        # 0.33.0 only (a property there; 0.34.0 has no such member).
        **({"use_v2_model_runner": False} if "use_v2_model_runner" in (
            release.members(pristine.tree, "vllm.config.vllm", "VllmConfig") or ()
        ) else {}),
    )  # fmt: skip


def test_build_offloading_config_on_a_hybrid_model(pristine):
    """The pinned config.py translates a two-group (attention + Mamba) config."""
    kci = pristine.load("vllm.v1.kv_cache_interface")
    torch = pristine.load("torch")
    cfg = pristine.load(CONFIG)
    attn = kci.FullAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16
    )
    mamba = kci.MambaSpec(block_size=16, shapes=((4, 4),), dtypes=(torch.float32,))
    kv_cache_config = kci.KVCacheConfig(
        num_blocks=100,
        kv_cache_tensors=[],
        kv_cache_groups=[
            kci.KVCacheGroupSpec(layer_names=["a0", "a1"], kv_cache_spec=attn),
            kci.KVCacheGroupSpec(layer_names=["m0"], kv_cache_spec=mamba),
        ],
    )
    out = cfg.build_offloading_config(_vllm_config(pristine, torch), kv_cache_config)
    assert [g.group_id for g in out.groups] == [0, 1]
    assert [g.layer_names for g in out.groups] == [("a0", "a1"), ("m0",)]
    # Mamba keeps one state: its sliding window is a single chunk (0.33.0 on;
    # 0.32.0's group config carries no window).
    if hasattr(out.groups[0], "sliding_window_size_in_chunks"):
        assert [g.sliding_window_size_in_chunks for g in out.groups] == [None, 1]
    # two attention layers of 65536 B plus one 4x4 float32 Mamba state
    assert out.worker_kv_bytes_per_block == 2 * 65536 + 4 * 4 * 4
    assert out.model.dtype == "bfloat16"
    assert out.cache.tokens_per_hash == 16


def test_build_offloading_config_rejects_bad_chunk_size(pristine):
    kci = pristine.load("vllm.v1.kv_cache_interface")
    torch = pristine.load("torch")
    cfg = pristine.load(CONFIG)
    attn = kci.FullAttentionSpec(
        block_size=16, num_kv_heads=8, head_size=128, dtype=torch.bfloat16
    )
    kv_cache_config = kci.KVCacheConfig(
        num_blocks=10,
        kv_cache_tensors=[],
        kv_cache_groups=[kci.KVCacheGroupSpec(layer_names=["a0"], kv_cache_spec=attn)],
    )
    with pytest.raises(ValueError, match="must be a multiple"):
        cfg.build_offloading_config(
            _vllm_config(pristine, torch, {"block_size": 24}), kv_cache_config
        )


def test_pristine_and_patched_trees_stay_apart(engine_tree, tree_copy):
    """Each engine has its own module objects; entering one hides the other."""
    math_file = tree_copy / "vllm/utils/math_utils.py"
    math_file.write_text(math_file.read_text() + "\nHARNESS_PROBE = 'patched'\n")
    pristine = harness.engine(engine_tree)
    patched = harness.engine(tree_copy)
    with pristine:
        first = pristine.load(MATH)
        assert not hasattr(first, "HARNESS_PROBE")
    with patched:
        assert patched.load(MATH).HARNESS_PROBE == "patched"
    with pristine:  # re-entering brings back the very same modules
        assert pristine.load(MATH) is first
        assert sys.modules[MATH] is first


def test_engines_nest(engine_tree, tree_copy):
    """Entering an engine inside another hides the outer one until it exits."""
    math_file = tree_copy / "vllm/utils/math_utils.py"
    math_file.write_text(math_file.read_text() + "\nHARNESS_PROBE = 'inner'\n")
    with harness.engine(engine_tree) as outer:
        outer_math = outer.load(MATH)
        with harness.engine(tree_copy) as inner:
            assert inner.load(MATH).HARNESS_PROBE == "inner"
        assert outer.load(MATH) is outer_math
        assert not hasattr(outer_math, "HARNESS_PROBE")


def test_sys_modules_restored(engine_tree):
    """Whatever held a managed name before (here a fake `vllm`) comes back."""
    fake = types.ModuleType("vllm")
    sys.modules["vllm"] = fake
    try:
        with harness.engine(engine_tree) as ns:
            ns.load(CONFIG)
            assert sys.modules["vllm"] is not fake
        assert sys.modules["vllm"] is fake
        assert CONFIG not in sys.modules
        leftover = getattr(sys.modules.get("torch"), "__file__", None) or ""
        assert not leftover.startswith(str(harness.STUBS_DIR)), "torch stub leaked"
    finally:
        del sys.modules["vllm"]


def test_new_module_in_a_tree_loads(tree_copy):
    """A module an overlay adds is a file of the tree like any other."""
    probe = (
        tree_copy / "vllm/distributed/kv_transfer/kv_connector/v1/offloading/probe.py"
    )
    probe.write_text(
        "from vllm.utils.math_utils import cdiv\n\n\ndef chunks(n: int) -> int:\n"
        "    return cdiv(n, 16)\n"
    )
    with harness.engine(tree_copy) as ns:
        mod = ns.load("vllm.distributed.kv_transfer.kv_connector.v1.offloading.probe")
        assert mod.chunks(33) == 3


def test_nothing_written_into_the_tree(tree_copy):
    before = sorted(p.relative_to(tree_copy) for p in tree_copy.rglob("*"))
    with harness.engine(tree_copy) as ns:
        ns.load(CONFIG)
    assert sorted(p.relative_to(tree_copy) for p in tree_copy.rglob("*")) == before


def test_missing_module_names_both_places(engine_tree):
    with harness.engine(engine_tree) as ns:
        with pytest.raises(ModuleNotFoundError) as err:
            ns.load("vllm.no_such_module")
    assert str(engine_tree) in str(err.value)
    assert str(harness.STUBS_DIR) in str(err.value)


def test_managed_names_never_come_from_sys_path(engine_tree, tmp_path, monkeypatch):
    """An installed vllm on sys.path must not leak into the engine namespace."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm/leak.py").write_text("LEAKED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with harness.engine(engine_tree) as ns:
        with pytest.raises(ModuleNotFoundError):
            ns.load("vllm.leak")


def test_real_filter_limits_tree_files(engine_tree):
    """On a full install, `real=` decides which tree files run for real."""
    with harness.engine(engine_tree, real={"vllm/utils/math_utils.py"}) as ns:
        assert ns.origin(MATH) == "tree"
        assert ns.origin("vllm.v1.kv_cache_interface") is None  # neither real nor stub


def test_engine_must_be_active_to_load(engine_tree):
    ns = harness.engine(engine_tree)
    with pytest.raises(RuntimeError, match="active"):
        ns.load(CONFIG)


def test_tree_without_package_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no vllm/"):
        harness.engine(tmp_path)


def test_stubs_refuse_device_work(pristine):
    """Stubs raise instead of pretending: GPU paths cannot pass on fake data."""
    torch = pristine.load("torch")
    with pytest.raises(NotImplementedError):
        torch.empty(4)
    platforms = pristine.load("vllm.platforms")
    assert not platforms.current_platform.is_cuda_alike()
    with pytest.raises(AttributeError):
        platforms.current_platform.Stream()
    hashing = pristine.load("vllm.utils.hashing")
    with pytest.raises(NotImplementedError):
        hashing.xxhash(b"x")


def test_runtime_imports_resolve_and_skip_what_never_runs():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "from ..up import name\n"
        "if TYPE_CHECKING:\n"
        "    import never_at_runtime\n"
        "try:\n"
        "    import fast\n"
        "except ImportError:\n"
        "    import fallback\n"
        "def f():\n"
        "    import lazy.mod\n"
    )
    got = runtime_imports(source, "pkg.sub.mod", is_package=False)
    assert got == [
        Import("typing", "TYPE_CHECKING", 1),
        Import("pkg.sub", "sibling", 2),
        Import("pkg.up", "name", 3),
        Import("fast", None, 7),
        Import("lazy.mod", None, 11),
    ]


def test_top_package_reports_the_trees_version(pristine, engine_version):
    """vllm.__version__ comes from the pinned vllm/version.py, and matches the
    version the pin set is named for."""
    assert pristine.load("vllm").__version__ == engine_version
    assert pristine.origin("vllm.version") == "tree"
