"""The tail of the last request reaches the store (issue 29), on the real scheduler.

The real Scheduler and OffloadingConnector (scheduler role) build the store jobs; the real,
patched OffloadingConnectorWorker (worker role, with the store-local hooks) receives them
each step as vLLM's model runner hands them over: handle_preemptions, start_kv_transfers,
prepare_store_kv (which defers the step's store jobs to the next step), get_finished. Only
the DMA is played (realsched.FakeTransfers: the GPU->CPU copy happens at submit and is reported at
the next get_finished), on CPU tensors.

What vLLM 0.33.0 does with the last store jobs of a request: a step's store jobs are
submitted at the start of the *next* step and reported one step later, and a finished
request's last job is only built at the step after it finished. The engine core's busy
loop (`vllm serve`, the multiprocess engine) keeps stepping while the connector has jobs
(`has_requests()` includes `has_pending_push_work()`), so they all complete. The offline
`LLM` with the in-process engine steps only while a request is unfinished: its last
prefill step's job is left deferred in the worker, never submitted, until the next
generate() or the shutdown. The writer's shutdown hook submits, waits for and captures it.
"""

from __future__ import annotations

import pytest
import realsched

PROMPT = 700  # tokens: 43 full blocks of 16, prefilled in three 256-token steps


def boot_engine(tmp_path):
    """The real scheduler, and the real worker-role connector beside it."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )

    booted = realsched.boot(cpu_bytes=8 << 20, target="attention")
    connector = OffloadingConnector(
        booted.vllm_config, KVConnectorRole.WORKER, booted.worker_kv_cache_config
    )
    worker = connector.connector_worker
    assert worker._kv_store is not None, "GLM53_KV_OFFLOAD is not on"
    groups = worker.spec.config.groups
    names = sorted({n for g in groups for n in g.layer_names})
    page = next(iter(realsched.layer_specs(target="attention").values()))
    page = page.page_size_bytes
    num_blocks = booted.worker_kv_cache_config.num_blocks
    generator = torch.Generator().manual_seed(29)
    tensors = [
        CanonicalKVCacheTensor(
            torch.randint(
                -128, 127, (num_blocks, page), dtype=torch.int8, generator=generator
            ),
            page,
        )
        for _ in names
    ]
    canonical = CanonicalKVCaches(
        tensors,
        [
            [CanonicalKVCacheRef(names.index(n), page) for n in g.layer_names]
            for g in groups
        ],
    )
    transfers = realsched.FakeTransfers(canonical, rows=(8 << 20) // page)
    worker.spec.get_worker = lambda kv_caches: transfers
    worker._init_worker(canonical)  # the attach hook starts the writer
    assert worker._kv_store.active, worker._kv_store.disabled_reason
    return booted, worker, transfers


def stored_hashes(root) -> set[str]:
    return {p.stem for p in root.rglob("*.bin") if ".tmp." not in p.name}


def newest_manifest_boundary(root) -> int:
    import json

    return max(
        (
            json.loads(p.read_bytes())["boundary"]
            for p in root.glob("*/manifests/*.json")
        ),
        default=0,
    )


@pytest.mark.parametrize("loop", ["offline", "busy"])
def test_every_full_block_of_the_last_request_reaches_the_store(knobs, tmp_path, loop):
    """One request, then the engine stops stepping the way each engine loop does, then a
    clean shutdown: every full block of the request is a chunk on disk and the newest
    manifest ends at its last full block (a restore would not stop short)."""
    knobs(**{"": "1", "DIR": str(tmp_path / "tier"), "CPU_GB": "1"})
    booted, worker, transfers = boot_engine(tmp_path)
    engine = realsched.Engine(booted)  # its block hasher; it does not step here
    engine.add("r", [(i * 7) % 500 + 3 for i in range(PROMPT)], max_tokens=1)
    request = booted.scheduler.requests["r"]
    finished: set[str] = set()
    s = booted.scheduler
    for _ in range(50):
        # offline: LLM._run_engine steps while a request is unfinished;
        # busy: EngineCore.run_busy_loop steps while the scheduler has_requests().
        if ("r" in finished) if loop == "offline" else not s.has_requests():
            break
        realsched.step_worker(booted, worker, finished)
    else:
        raise AssertionError("the engine loop did not end")
    full_blocks = PROMPT // realsched.BLOCK
    expected = {bytes(h).hex() for h in request.block_hashes[:full_blocks]}
    deferred = [job_id for job_id, _, _ in worker._unsubmitted_store_jobs]
    if loop == "offline":
        # vLLM left the last prefill step's store job deferred to a next step.
        assert deferred, "expected vLLM to defer the last store job"
        assert not set(deferred) & set(transfers.submitted)
    else:
        assert deferred == []  # the busy loop stepped until every job was reported
    worker._kv_store.writer.wait_idle()
    # A clean shutdown: the connector's worker side, as EngineCore.shutdown reaches it.
    worker.shutdown()
    root = tmp_path / "tier"
    stats = worker._kv_store.stats
    assert expected - stored_hashes(root) == set(), (
        f"{len(expected - stored_hashes(root))} of {full_blocks} full blocks not "
        f"stored; {stats}"
    )
    assert newest_manifest_boundary(root) == full_blocks * realsched.BLOCK
    assert stats.jobs_drained == (len(deferred) if loop == "offline" else 0)
    assert stats.keys_dropped_budget == stats.keys_lost == 0
