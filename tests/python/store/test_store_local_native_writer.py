"""The writer's chunk files through the native store library: one
``write_chunks`` call per job from the writer thread (header, CRC, pwrite,
fdatasync, rename, folder fsync in C++), a full disk mapped to the pause,
other failures to the failed-key ledger; there is no other writer, so the
tier refuses to boot without the library."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import store_local_support as sls
from kv_store_format import native
from overlay_modules import chunk_fmt


@pytest.fixture
def lib():
    library = sls.store_library()
    yield library
    library.test_fault(native.FAULT_NONE)


def write_boundary(store, maker, boundary_chunk: int):
    jobs = [maker.full_chunks(0, boundary_chunk + 1)]
    jobs += [maker.state(boundary_chunk, g) for g in sls.STATE_GROUPS]
    for job in jobs:
        sls.run_job(store, job)
    return jobs


def test_native_files_hold_the_real_bytes_and_publish_the_manifest(lib, tmp_path):
    store, staging = sls.make_store(tmp_path, store_lib=lib)
    writes = []
    real = lib.write_chunks
    lib_calls = store.writer.store_lib = type("Spy", (), {})()
    lib_calls.write_chunks = lambda requests, threads, **kw: (
        writes.append(len(requests)) or real(requests, threads, **kw)
    )
    maker = sls.JobMaker(staging)
    jobs = write_boundary(store, maker, 1)
    assert writes == [2, 1, 1, 1, 1]  # one call a job
    for job in jobs:
        for (hash_, group), payload in job.expected.items():
            path = store.writer.layout.chunk(hash_.hex(), group)
            header = chunk_fmt.verify_chunk_file(path)
            assert Path(path).read_bytes()[header.header_length :] == payload
    (base,) = sls.rank_bases(tmp_path)
    assert [m.boundary for m in sls.manifests(base).values()] == [32]
    assert store.stats.keys_written == 6 and sls.temp_files(tmp_path) == []
    # The same keys again: deduplicated from the verified headers.
    sls.run_job(store, maker.full_chunks(0, 2))
    assert store.stats.keys_deduplicated == 2 and len(writes) == 5  # no call
    assert sls.verify_store(tmp_path) == []


def test_native_enospc_pauses_and_the_keys_are_written_after(lib, tmp_path):
    store, staging = sls.make_store(tmp_path, store_lib=lib)
    store._owed.retry_failed_after = 0.0
    store.writer.pause_seconds = 0.0
    space = {"ok": False}
    store.writer.resume_probe = lambda: space["ok"]
    maker = sls.JobMaker(staging)
    lib.test_fault(native.FAULT_WRITE, errno.ENOSPC, 1, 1)  # the 2nd file
    job = maker.full_chunks(0, 3)
    sls.run_job(store, job)
    assert store.stats.enospc_pauses == 1 and not store.writer.accepting
    assert sls.temp_files(tmp_path) == []
    assert len(sls.chunk_files(tmp_path)) == 2  # the other two of the call
    assert store.stats.keys_failed == 1
    # While paused, stores are dropped (owed); space back: all written.
    sls.run_job(store, maker.full_chunks(3, 1))
    assert store.stats.keys_dropped_paused == 1
    space["ok"] = True
    assert store.writer.maybe_resume()
    sls.run_job(store, maker.full_chunks(4, 1))
    store.writer.drain()
    assert len(sls.chunk_files(tmp_path)) == 5
    for path in sls.chunk_files(tmp_path):
        chunk_fmt.verify_chunk_file(str(path))
    assert store.writer.pool.used == 0


def test_native_sync_failure_is_ledgered_until_written_in_full(lib, tmp_path):
    store, staging = sls.make_store(tmp_path, store_lib=lib)
    store._owed.retry_failed_after = 3600.0  # no retry in this test
    maker = sls.JobMaker(staging)
    lib.test_fault(native.FAULT_SYNC, errno.EIO, 0, 1)
    job = maker.full_chunks(0, 1)
    sls.run_job(store, job)
    ((ident, _),) = job.expected.items()
    assert store.writer.ledger.is_failed(ident) and store.stats.keys_failed == 1
    assert sls.chunk_files(tmp_path) == [] and sls.temp_files(tmp_path) == []
    assert store.stats.enospc_pauses == 0  # not a full disk


def test_the_worker_refuses_to_boot_without_the_library(tmp_path, monkeypatch):
    """The engine's adapter loads the library first: missing, it raises the
    binding's error naming the file (a boot error, no Python fallback)."""
    import kv_store_local.vllm_worker as vw

    missing = tmp_path / "libkvtier_store.so"
    monkeypatch.setenv(native.ENV_LIBRARY, str(missing))
    monkeypatch.setattr(vw.knobs, "read_knobs", lambda: sls.knobs(tmp_path))
    monkeypatch.setattr(vw, "settings_from_vllm", lambda *a: sls.settings())
    with pytest.raises(native.NativeLibraryError, match=str(missing)):
        vw.VllmWorkerStore.from_vllm(None, None, None)


@pytest.mark.parametrize("problem", ["missing", "not a library"])
def test_a_store_without_a_usable_library_refuses_the_boot(
    tmp_path, monkeypatch, problem
):
    """A WorkerStore given no library loads the one native.load() finds at
    start; missing or unusable, the tier the knob asked for is refused
    (fail closed), naming the file, before anything is created."""
    from kv_store_local.errors import StoreRefused

    bad = tmp_path / "libkvtier_store.so"
    if problem == "not a library":
        bad.write_bytes(b"not an ELF file")
    monkeypatch.setenv(native.ENV_LIBRARY, str(bad))
    root = tmp_path / "kv"
    store = sls.ksl.worker_store.WorkerStore(
        sls.knobs(root), sls.settings(), tp=lambda: (sls.RANK, sls.TP_SIZE)
    )
    groups = sorted(store.settings.groups, key=lambda g: g.slot)
    refs = [[(layer.tensor, layer.real_bytes) for layer in g.layers] for g in groups]
    with pytest.raises(StoreRefused, match=f"the store library cannot be used: {bad}"):
        store.attach(sls.Staging().tensors, refs, background=False)
    assert store.writer is None and not root.exists()


def test_a_spec_without_what_the_writer_reads_refuses_the_boot(tmp_path, monkeypatch):
    """Knob 1 with an offloading spec that lacks the chunking the writer reads
    (vLLM's own unit tests build the connector on a mocked OffloadingSpec):
    the boot fails naming the spec and the missing name, never a raw error."""
    import kv_store_local.vllm_worker as vw
    from kv_store_local.errors import StoreRefused

    class BareSpec:
        pass

    monkeypatch.setattr(vw.knobs, "read_knobs", lambda: sls.knobs(tmp_path))
    # settings_from_vllm's first read of the spec's chunking, without vLLM here
    monkeypatch.setattr(
        vw, "settings_from_vllm", lambda spec, *a: spec.blocks_per_chunk
    )
    with pytest.raises(StoreRefused, match=r"\(BareSpec\).*blocks_per_chunk"):
        vw.VllmWorkerStore.from_vllm(BareSpec(), None, None)
