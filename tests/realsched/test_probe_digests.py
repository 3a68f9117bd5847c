"""The GPU suite's KV digests compare engines whose caches use different layouts."""

import dataclasses
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine"))
import probe  # noqa: E402
import stall  # noqa: E402


def layer_cache(values: torch.Tensor, physical: tuple[int, ...]) -> torch.Tensor:
    """A [B, H, N, C] view of `values` stored in the physical order `physical`."""
    stored = values.permute(*physical).contiguous()
    inverse = [physical.index(i) for i in range(4)]
    return stored.permute(*inverse)


def worker_with(cache: torch.Tensor, name: str = "layer.0") -> SimpleNamespace:
    ctx = {name: SimpleNamespace(kv_cache=cache)}
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


def test_a_cache_bound_in_kernel_blocks_digests_its_manager_blocks():
    """GLM-5.3's indexer keys at a 4,608-token block: vLLM binds them as 512-token kernel
    blocks with the other layers' pages between (the real AttentionGroup's mapping). The
    digest and the writer check read each manager block's own bytes, not a window over its
    neighbour (run 42); without the group's stride the view is refused, not hashed."""
    import pytest
    from vllm.v1.worker.utils import AttentionGroup

    # A block's row: 9 kernel pages of the keys (32 entries of 132 bytes), then others.
    blocks, rows, width, row_bytes = 4, 288, 132, 12 * 32 * 132
    spec = SimpleNamespace(
        block_size=4608,
        tokens_per_state=16,
        get_num_kernel_states=lambda tokens: tokens // 16,
    )
    storage = torch.randint(0, 256, (blocks * row_bytes,), dtype=torch.uint8)
    manager = storage.as_strided(
        (blocks, 1, rows, width), (row_bytes, rows * width, width, 1)
    )
    group = AttentionGroup(
        backend=None, layer_names=["k_cache"], kv_cache_spec=spec, kv_cache_group_id=3
    )
    group.kernel_block_size = 512
    kernel = group.map_kv_cache_to_kernel_blocks(manager)
    assert group.kernel_block_stride == 12 and kernel.shape[0] == 3 * 12 + 9
    worker = worker_with(kernel, name="k_cache")
    worker.model_runner.attn_groups = [[group]]
    raw, base, stride = probe._layer_page(worker, "k_cache", blocks)
    for block in range(blocks):
        own = manager[block].contiguous().numpy().tobytes()
        assert probe._logical_block(worker, "k_cache", spec, blocks, block) == own
        start = base + block * stride
        assert raw[start : start + rows * width].numpy().tobytes() == own
    worker.model_runner.attn_groups = []
    with pytest.raises(ValueError, match="not a multiple of 4 blocks"):
        probe._logical_block(worker, "k_cache", spec, blocks, 1)


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


def test_the_stall_trace_times_methods_the_real_engine_has():
    """engine/steptimer.py wraps methods by name and skips a name an object lacks, so
    a rename in a release would drop that line from the GPU trace without a word: each
    name must be on the real class (step_fn is EngineCore's bound pick of a step)."""
    import inspect

    import steptimer
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        kv_restore_worker,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (  # noqa: E501
        worker_store,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        OffloadingConnectorScheduler,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.executor.abstract import Executor

    assert steptimer.ENGINE_CORE == ("step_fn", "_wait_for_output")
    assert "self.step_fn = " in inspect.getsource(EngineCore.__init__)
    # The wait for the model's future: a method of its own on 0.34.0 (timed), inline
    # in the step on 0.33.0 (inside step_fn only).
    step = inspect.getsource(EngineCore.step)
    if callable(getattr(EngineCore, "_wait_for_output", None)):
        assert "self._wait_for_output(future)" in step
    else:
        assert "future.result()" in step
    for cls, names in [
        (Scheduler, steptimer.SCHEDULER),
        (Executor, steptimer.EXECUTOR),
        (OffloadingConnectorScheduler, steptimer.CONNECTOR_SCHEDULER),
        (OffloadingConnectorWorker, steptimer.CONNECTOR_WORKER),
        (kv_restore_worker.WorkerRestore, steptimer.RESTORE),
        (worker_store.WorkerStore, steptimer.STORE),
    ]:
        for name in names:
            assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name}"
    assert "self.connector_scheduler" in inspect.getsource(OffloadingConnector.__init__)
    # The stall check finds the long prompt's tail by what schedule() gives it.
    from vllm.v1.core.sched.output import SchedulerOutput

    fields = {f.name: f.type for f in dataclasses.fields(SchedulerOutput)}
    assert "num_scheduled_tokens" in fields
    assert "SchedulerOutput" in str(
        inspect.signature(Scheduler.schedule).return_annotation
    )
    # ... under the id the engine gives the request, which add_request returns: vLLM adds
    # eight characters to the caller's (engine/stall.py matched the caller's: run 57).
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.engine.llm_engine import LLMEngine

    request = SimpleNamespace(request_id=stall.LONG, external_req_id=None)
    InputProcessor.assign_request_id(request)
    assert request.external_req_id == stall.LONG
    assert request.request_id.startswith(stall.LONG + "-")
    assert len(request.request_id) == len(stall.LONG) + 9
    assert inspect.signature(LLMEngine.add_request).return_annotation in (str, "str")
    assert "return req_id" in inspect.getsource(LLMEngine.add_request)
    # The wrapper returns what the method returns and sums its time under one label.
    restore = kv_restore_worker.WorkerRestore()
    assert steptimer.wrap(restore, ("wait_idle",), "t") == ["t.wait_idle"]
    assert restore.wait_idle(0) is True and steptimer.TOTALS["t.wait_idle"] > 0
