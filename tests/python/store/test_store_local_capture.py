"""The first capture on a capture device, and the engine thread's recaptures.

The device path copies a store job's keys from the GPU KV blocks vLLM's store
copy reads (here host memory: ``store_local_support.KvBlocks``), queued when
vLLM submits the job; the staging rows are never read for it. Owed keys are
copied again out of staging by the writer thread, and on the engine thread
only as a row's last chance, bounded.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import store_local_support as sls
from overlay_modules import ksl


def disk_bytes(store, hash_: bytes, group: int) -> bytes:
    return Path(store.writer.layout.chunk(hash_.hex(), group)).read_bytes()


def device_store(tmp_path, **kw):
    kv = sls.KvBlocks()
    device = kw.pop("device", None) or ksl.capture_device.HostCopy()
    store, staging = sls.make_store(tmp_path, kv=kv, device=device, **kw)
    assert store.active, store.disabled_reason
    return store, staging, kv


def test_device_capture_reads_the_kv_blocks_and_survives_their_reuse(tmp_path):
    store, staging, kv = device_store(tmp_path)
    store.writer.submit = store.writer._queue.append  # capture now, write later
    maker = sls.JobMaker(staging, kv)
    job = maker.full_chunks(0, 2)
    jobs = [job] + [maker.state(1, g) for g in sls.STATE_GROUPS]
    for j in jobs:
        store.remember(j.job_id, j.entry())
    staging.zero()  # the capture never reads staging
    for j in jobs:
        store.submitted(j.job_id)  # vLLM queued the store copy
    for j in jobs:
        store.capture(j.job_id)  # the ack
    assert store.stats.jobs_queued_on_device == len(jobs)
    assert store.stats.jobs_captured == len(jobs)
    assert store.writer._queue and sls.chunk_files(tmp_path) == []
    # After the ack vLLM may reuse both: the GPU blocks for new KV, the rows
    # for a new store or a restore promotion.
    kv.zero()
    staging.zero()
    store.writer.drain()
    for j in jobs:
        for (hash_, group), real in j.expected.items():
            data = disk_bytes(store, hash_, group)
            assert data.endswith(real) and any(real)
    assert store.stats.keys_dropped_budget == 0
    assert sls.verify_store(tmp_path) == []


def test_without_a_device_the_capture_copies_staging_before_the_ack(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    job = maker.full_chunks(0, 1)
    store.remember(job.job_id, job.entry())
    store.submitted(job.job_id)  # no device: nothing queued
    assert store.stats.jobs_queued_on_device == 0
    store.capture(job.job_id)
    staging.zero()
    ((hash_, group), real), *_ = job.expected.items()
    assert disk_bytes(store, hash_, group).endswith(real)


class HeldDevice:
    """A device whose copy lands only when someone waits for it."""

    def __init__(self) -> None:
        self.waited = 0
        self.queued = []

    def queue(self, job_id, moves):
        device = self

        class Fence:
            copied = False

            def done(self):
                return self.copied

            def wait(self):
                device.waited += 1
                ksl.capture_device.copy_moves(moves)
                self.copied = True

        self.queued.append(job_id)
        return Fence()

    def close(self):
        return


def test_the_ack_never_runs_ahead_of_the_device_copy(tmp_path):
    device = HeldDevice()
    store, staging, kv = device_store(tmp_path, device=device)
    maker = sls.JobMaker(staging, kv)
    job = maker.full_chunks(0, 2)
    store.remember(job.job_id, job.entry())
    store.submitted(job.job_id)
    assert device.queued == [job.job_id]
    store.capture(job.job_id)  # not landed yet: waits for it, counted
    assert device.waited == 1 and store.stats.capture_fence_waits == 1
    kv.zero()
    for (hash_, group), real in job.expected.items():
        assert disk_bytes(store, hash_, group).endswith(real)


def test_a_threaded_host_device_lands_before_the_writer_sees_the_job(tmp_path):
    device = ksl.capture_device.HostCopy(threaded=True)
    store, staging, kv = device_store(tmp_path, device=device, background=True)
    maker = sls.JobMaker(staging, kv)
    jobs = [maker.full_chunks(i, 1) for i in range(8)]
    for j in jobs:
        sls.run_job(store, j)
    kv.zero()
    staging.zero()
    assert store.writer.wait_idle()
    for j in jobs:
        for (hash_, group), real in j.expected.items():
            assert disk_bytes(store, hash_, group).endswith(real)
    store.shutdown()


def test_last_chance_recaptures_are_bounded_and_counted(tmp_path):
    per_key = sls.FULL_REAL * sls.NUM_LAYERS
    store, staging, kv = device_store(tmp_path, budget=2 * per_key)
    store.writer.on_job_done = store.writer.on_idle = None  # no writer retries
    store.writer.submit = store.writer._queue.append  # the writer is behind
    maker = sls.JobMaker(staging, kv)
    job = maker.full_chunks(0, 4)
    sls.run_job(store, job)
    assert store.stats.keys_dropped_budget == 2 and len(store._owed) == 2
    store.writer.drain()  # room for both again
    # ...but the engine thread may copy one key only before a new store
    # overwrites their rows: the other is lost, counted.
    store.last_chance_bytes = per_key
    rows = [o.chunk_id for o in store._owed._owed.values()]
    reuse = sls.Job(99, rows, [len(rows), 0, 0, 0, 0], [0] * 5, {})
    store.remember(reuse.job_id, reuse.entry())
    assert store.stats.keys_recaptured_last_chance == 1
    assert store.stats.bytes_recaptured_last_chance == per_key
    assert store.stats.keys_lost_last_chance_bound == 1
    assert store.stats.drops()["last_chance_bound"] == 1
    assert store.stats.keys_recaptured_writer == 0
    assert len(store._owed) == 0
    for row in rows:
        staging.page(0, row)[:] = bytes(sls.PAGE)  # the new store's DMA
        staging.page(1, row)[:] = bytes(sls.PAGE)
    store.writer.drain()
    assert len(sls.chunk_files(tmp_path)) == 3  # 2 first captures, 1 last chance
    for (hash_, group), real in job.expected.items():
        path = Path(store.writer.layout.chunk(hash_.hex(), group))
        if path.exists():
            assert path.read_bytes().endswith(real)  # never the new bytes
    assert sls.verify_store(tmp_path) == []


def test_a_promotion_of_an_owed_keys_row_never_writes_the_promoted_bytes(tmp_path):
    per_key = sls.FULL_REAL * sls.NUM_LAYERS
    store, staging, kv = device_store(tmp_path, budget=per_key)
    store.writer.submit = store.writer._queue.append
    maker = sls.JobMaker(staging, kv)
    job = maker.full_chunks(0, 2)
    sls.run_job(store, job)
    (owed,) = store._owed._owed.values()
    # The pool is full: no last chance, so the key must go stale (lost).
    store.rows_taken([owed.chunk_id])  # restore promotes into its row
    staging.page(0, owed.chunk_id)[:] = b"\x77" * sls.PAGE
    staging.page(1, owed.chunk_id)[:] = b"\x77" * sls.PAGE
    del store.writer.submit
    store.writer.drain()
    assert store.stats.keys_lost == 1 and len(store._owed) == 0
    assert not Path(store.writer.layout.chunk(owed.hash.hex(), 0)).exists()
    for path in sls.chunk_files(tmp_path):
        assert b"\x77" * 16 not in path.read_bytes()


def test_the_capturing_thread_copies_no_owed_key(tmp_path):
    """Owed keys are copied again on the writer thread (after a job or when
    idle), not at the next capture on the engine thread."""
    per_key = sls.FULL_REAL * sls.NUM_LAYERS
    store, staging, kv = device_store(tmp_path, budget=per_key, background=True)
    hold = threading.Event()
    real_process = store.writer.process
    store.writer.process = lambda job: (hold.wait(), real_process(job))
    maker = sls.JobMaker(staging, kv)
    sls.run_job(store, maker.full_chunks(0, 3))  # one fits, two owed
    copied_on = []
    real_copy = store._copy

    def copy(entries, reason):
        copied_on.append(threading.current_thread().name)
        return real_copy(entries, reason)

    store._copy = copy
    sls.run_job(store, maker.full_chunks(3, 1))
    assert copied_on == []  # the engine thread only queued
    hold.set()
    assert store.writer.wait_idle()
    deadline = time.monotonic() + 10
    while len(sls.chunk_files(tmp_path)) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sls.chunk_files(tmp_path)) == 4
    assert copied_on and set(copied_on) == {store.writer.thread_name}
    assert store.stats.keys_recaptured_writer == 3
    store.shutdown()


def test_a_failing_device_falls_back_to_staging_before_the_ack(tmp_path, caplog):
    class Broken:
        def queue(self, job_id, moves):
            raise RuntimeError("no stream")

        def close(self):
            return

    store, staging, kv = device_store(tmp_path, device=Broken())
    maker = sls.JobMaker(staging, kv)
    job = maker.full_chunks(0, 2)
    sls.run_job(store, job)
    assert store._device is None and "the capture device failed" in caplog.text
    assert store.stats.jobs_queued_on_device == 0
    assert store.stats.keys_captured == 2 and store.writer.pool.used == 0
    staging.zero()
    kv.zero()
    for (hash_, group), real in job.expected.items():
        assert disk_bytes(store, hash_, group).endswith(real)


def test_device_capture_of_several_sub_blocks_takes_each_layers_blocks_in_order(
    tmp_path,
):
    """blocks_per_chunk 2: a chunk is per layer its two sub-blocks, read from
    the two GPU blocks the spec names for it (the skipped first one too)."""
    from overlay_modules import chunk_fmt

    groups = [
        ksl.layout.GroupLayout(
            0, 0, "full", (ksl.layout.LayerLayout(0, 32), ksl.layout.LayerLayout(1, 32))
        )
    ]
    settings = sls.settings(groups=groups, blocks_per_chunk=2, mamba_types={})
    kv = sls.KvBlocks()
    store, staging = sls.make_store(
        tmp_path, settings=settings, kv=kv, device=ksl.capture_device.HostCopy()
    )
    assert store.active, store.disabled_reason
    state = sls.FakeReqState(0, 2)
    keys = [sls.offload_key(sls.block_hash(i), 0) for i in range(2)]
    builder = ksl.side_channel.SchedulerStoreMeta(
        [ksl.side_channel.SchedulerGroup(0, 32, "full")], 16
    )
    for i, k in enumerate(keys):
        state.positions[k] = (i + 1) * 32
    state.req.block_hashes = [sls.block_hash(j // 2) for j in range(4)]
    meta = builder.build(set(keys), state)
    for layer in range(2):
        for block in (5, 9, 7):
            kv.page(layer, block)[:32] = bytes([16 * layer + block]) * 32
    # 3 GPU blocks from block index 1: chunk 0 half filled (GPU block 5),
    # chunk 1 full (GPU blocks 9, 7).
    job = sls.Job(1, [7, 8], [3], [1], meta, gpu_blocks=[5, 9, 7])
    sls.run_job(store, job)
    assert store.stats.jobs_queued_on_device == 1
    assert store.stats.keys_dropped_incomplete == 1
    kv.zero()
    (only,) = sls.chunk_files(tmp_path)
    header = chunk_fmt.verify_chunk_file(str(only))
    payload = only.read_bytes()[header.header_length :]
    assert payload == b"".join(bytes([16 * x + b]) * 32 for x in (0, 1) for b in (9, 7))


def test_a_job_the_writer_raises_on_is_counted_and_captured_again(tmp_path):
    """CI once saw the writer raise mid-job (a scan racing a rename): its
    keys were released and counted nowhere. They are lost for a named reason
    now, owed, and the writer's retry writes them while their rows hold."""
    store, staging, kv = device_store(tmp_path, background=True)
    real_process = store.writer.process
    raised = []

    def process(job):
        if not raised:
            raised.append(job.job_id)
            raise OSError("injected")
        real_process(job)

    store.writer.process = process
    maker = sls.JobMaker(staging, kv)
    job = maker.full_chunks(0, 3)
    sls.run_job(store, job)
    assert store.writer.wait_idle()
    deadline = time.monotonic() + 10
    while len(sls.chunk_files(tmp_path)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert raised == [job.job_id]
    assert store.stats.keys_lost_writer_error == 3
    assert store.stats.drops()["writer_error"] == 3
    assert store.stats.keys_recaptured_writer == 3
    for (hash_, group), real in job.expected.items():
        assert disk_bytes(store, hash_, group).endswith(real)
    store.shutdown()
