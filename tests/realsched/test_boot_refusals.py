"""Knob 1 means the tier is on or the boot fails (issue 43, goal 2), on the real vLLM
modules of the release under test: a writer or a restore that cannot bind to what it
needs refuses the boot with one line naming the missing piece, and nothing of ours warns
and serves on. And the seed's topology (goal 6): an engine whose workers span two nodes
boots with the local store tier, where vLLM 0.34.0 still refuses its own tiers.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import realsched


def worker_connector(booted):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )

    connector = OffloadingConnector(
        booted.vllm_config, KVConnectorRole.WORKER, booted.worker_kv_cache_config
    )
    return connector.connector_worker


def canonical_caches(worker):
    import torch
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    groups = worker.spec.config.groups
    names = sorted({n for g in groups for n in g.layer_names})
    page = next(
        iter(realsched.layer_specs(target="attention").values())
    ).page_size_bytes
    tensors = [
        CanonicalKVCacheTensor(torch.zeros((64, page), dtype=torch.int8), page)
        for _ in names
    ]
    refs = [
        [CanonicalKVCacheRef(names.index(n), page) for n in g.layer_names]
        for g in groups
    ]
    return CanonicalKVCaches(tensors, refs)


@pytest.mark.parametrize(
    "worker_object, words",
    [
        (SimpleNamespace(), "has no store handler"),
        (SimpleNamespace(_store_handler=SimpleNamespace()), "_store_handler"),
    ],
    ids=["no-handler", "handler-without-staging"],
)
def test_a_writer_that_cannot_bind_refuses_the_boot(
    knobs, tmp_path, worker_object, words
):
    """The CPU offloading worker vLLM hands the writer lacks what it reads:
    the worker's boot fails with one line, and no writer runs."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local.errors import (  # noqa: E501
        StoreRefused,
    )

    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    booted = realsched.boot(cpu_bytes=8 << 20, target="attention")
    worker = worker_connector(booted)
    worker.spec.get_worker = lambda kv_caches: worker_object
    with pytest.raises(StoreRefused) as refused:
        worker._init_worker(canonical_caches(worker))
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        "KV store: GLM53_KV_OFFLOAD=1 is refused"
    )
    assert words in line or "staging" in line, line
    assert worker._kv_store.writer is None or not worker._kv_store.writer.running


def test_a_restore_the_scheduler_cannot_serve_refuses_the_boot(
    knobs, tmp_path, monkeypatch
):
    """A scheduler without what the restore's lookup calls refuses restore at
    boot, naming the piece, instead of raising at every lookup."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import scheduler

    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1", "RESTORE": "1"})
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    realsched.use_local_store_tier(monkeypatch)
    monkeypatch.setattr(scheduler.OffloadingConnectorScheduler, "_lookup", None)
    with pytest.raises(
        Exception, match=r"is refused: vLLM's offloading scheduler has no _lookup\(\)"
    ):
        realsched.boot(cpu_bytes=8 << 20, target="attention")


def test_a_restore_that_cannot_read_its_store_refuses_the_boot(
    knobs, tmp_path, monkeypatch
):
    """Restore binds to the rank's store at the worker's boot: a rank whose
    store folder others may change refuses the boot (not serves with restore
    off and every lookup waiting for it)."""
    import os

    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_worker import (  # noqa: E501
        RestoreRefused,
    )

    knobs(**{"": "1", "DIR": str(tmp_path / "tier"), "CPU_GB": "1", "RESTORE": "1"})
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    realsched.use_local_store_tier(monkeypatch)
    booted = realsched.boot(cpu_bytes=8 << 20, target="attention")
    worker = worker_connector(booted)
    assert worker._kv_restore is not None
    caches = canonical_caches(worker)
    transfers = realsched.FakeTransfers(caches, rows=64)
    worker.spec.get_worker = lambda kv_caches: transfers
    real_attach = worker._kv_store.attach

    def attach_then_loosen(*args, **kwargs):
        real_attach(*args, **kwargs)
        os.chmod(worker._kv_store.writer.layout.manifest_dir, 0o777)

    worker._kv_store.attach = attach_then_loosen
    with pytest.raises(RestoreRefused, match="store folder not safe"):
        worker._init_worker(caches)


def _nodes_spec(booted, tiers):
    """The worker's TieringOffloadingSpec on a two-rank engine whose TP group
    spans two nodes, with these secondary tiers."""
    spec = worker_connector(booted).spec
    spec.secondary_tier_configs = tiers
    spec.config = dataclasses.replace(
        spec.config, parallel=dataclasses.replace(spec.config.parallel, world_size=2)
    )
    return spec


@pytest.fixture
def two_nodes(monkeypatch):
    """vLLM's process groups as a TP pair across two nodes (no torch.distributed)."""
    from vllm.distributed import parallel_state

    group = SimpleNamespace(world_size=2, cpu_group=None)
    alone = SimpleNamespace(world_size=1, cpu_group=None)
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: group)
    monkeypatch.setattr(parallel_state, "get_pp_group", lambda: alone)
    monkeypatch.setattr(parallel_state, "get_pcp_group", lambda: alone)
    monkeypatch.setattr(
        parallel_state,
        "in_the_same_node_as",
        lambda cpu_group, source_rank=0: [True, False],
    )


class Reached(Exception):
    """create_worker got past the node check."""


def test_two_nodes_boot_with_the_local_store_tier_and_not_with_vllms(
    knobs, tmp_path, monkeypatch, two_nodes
):
    from vllm.v1.kv_offload.tiering import spec as tiering

    if not hasattr(tiering, "_reject_workers_across_nodes"):
        pytest.skip("this release does not refuse workers across nodes")
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import kv_restore_nodes

    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    booted = realsched.boot(cpu_bytes=8 << 20, target="attention")

    def stop(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(tiering, "SharedOffloadRegion", stop)
    ours = [
        {
            "type": kv_restore_nodes.TIER_TYPE,
            "module_path": kv_restore_nodes.MODULE_PATH,
        }
    ]
    spec = _nodes_spec(booted, ours)
    with pytest.raises(Reached):  # past the check: its region would be made next
        spec.create_worker(canonical_caches(worker_connector(booted)))
    for stock in ([{"type": "example"}], [*ours, {"type": "example"}]):
        spec = _nodes_spec(booted, stock)
        with pytest.raises(NotImplementedError, match="span several nodes"):
            spec.create_worker(canonical_caches(worker_connector(booted)))


def engine_args(**kv: Any) -> Any:
    """The EngineArgs of realsched's engine, with the KV-transfer arguments given."""
    from vllm.engine.arg_utils import EngineArgs

    realsched.use_cpu_platform()
    return EngineArgs(
        model=str(realsched.MODELS / "nemotronh"),
        skip_tokenizer_init=True,
        load_format="dummy",
        enforce_eager=True,
        max_model_len=1024,
        enable_prefix_caching=True,
        block_size=realsched.BLOCK,
        **kv,
    )


@pytest.mark.parametrize(
    "kv, words",
    [
        ({}, "the engine has no --kv-transfer-config, so no OffloadingConnector"),
        (
            {
                "kv_transfer_config": {
                    "kv_connector": "ExampleConnector",
                    "kv_role": "kv_both",
                }
            },
            "the engine's KV connector is ExampleConnector, not OffloadingConnector",
        ),
        (
            {
                "kv_transfer_config": {
                    "kv_connector": "MultiConnector",
                    "kv_role": "kv_both",
                    "kv_connector_extra_config": {
                        "connectors": [realsched.connector_config(8 << 20)]
                    },
                }
            },
            "the engine's KV connector is MultiConnector, not OffloadingConnector",
        ),
    ],
    ids=["no-connector", "another-connector", "nested-connector"],
)
def test_knob_1_without_the_offloading_connector_refuses_the_config(
    knobs, tmp_path, kv, words
):
    """An engine started by hand with GLM53_KV_OFFLOAD=1 and no offloading connector
    would load none of our hooks and serve without the tier: the real VllmConfig
    refuses it with one line, before any model loads (issue 48, item 2)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local.errors import (  # noqa: E501
        StoreRefused,
    )

    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    with pytest.raises(StoreRefused) as refused:
        engine_args(**kv).create_engine_config()
    line = str(refused.value)
    assert "\n" not in line and line.startswith(
        "KV store: GLM53_KV_OFFLOAD=1 is refused"
    )
    assert words in line and "launch.sh plan" in line, line


def test_the_configs_that_load_the_tier_pass_and_knob_0_asks_nothing(knobs, tmp_path):
    """The launcher's connector JSON and vLLM's --kv-offloading-size shortcut both load
    the offloading connector, so knob 1 boots; knob 0 (or unset) refuses no config; a
    knob that is not 0/1 is refused by its rule even without a connector (a KnobError,
    which the pydantic config reports as a ValueError with the rule's words)."""
    knobs(**{"": "1", "DIR": str(tmp_path), "CPU_GB": "1"})
    config = engine_args(
        kv_transfer_config=realsched.connector_config(8 << 20)
    ).create_engine_config()
    assert config.kv_transfer_config.kv_connector == "OffloadingConnector"
    config = engine_args(
        kv_offloading_size=1, kv_offloading_backend="native"
    ).create_engine_config()
    assert config.kv_transfer_config.kv_connector == "OffloadingConnector"
    knobs(**{"": "0"})
    assert engine_args().create_engine_config().kv_transfer_config is None
    knobs()
    assert engine_args().create_engine_config().kv_transfer_config is None
    knobs(**{"": "yes"})
    with pytest.raises(ValueError, match="GLM53_KV_OFFLOAD=yes: must be 0 or 1"):
        engine_args().create_engine_config()
