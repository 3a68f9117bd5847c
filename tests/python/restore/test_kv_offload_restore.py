"""kv-offload-restore on the real 0.33.0 scheduler, tiering manager and workers.

The three overlays are applied in ORDER to a copy of the pinned tree by the
real `overlay apply`; restore_rig.Rig (sim/) then runs the patched scheduler over
a real TieringOffloadingManager (real CPU primary tier, our LocalStoreTier
loaded through vLLM's SecondaryTierFactory by module_path) and one real
patched worker per TP rank, each with its own writer and store. Only the GPU
and the CPU region's allocation (a bytearray) are played by the rig.
"""

from __future__ import annotations

import fcntl
import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib

import harness
import pytest
import restore_rig as rs
from chunk_calls import ChunkCalls
from restore_rig import BLOCK, HASH, Rig, chain_hashes, env_on, pattern

OFFLOADING = rs.OFFLOADING
PER_CHUNK = BLOCK // HASH
PROMPT_BLOCKS = 8
RESTORED = 6 * BLOCK  # the deepest manifest boundary a lookup may use


@pytest.fixture(scope="module")
def restore_tree(overlay_bin, engine_tree, manifests_dir, order, tmp_path_factory):
    assert "kv-offload-restore" in order
    root = tmp_path_factory.mktemp("restore") / "site-packages"
    shutil.copytree(engine_tree, root, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [
            str(overlay_bin),
            "apply",
            "--check-injected",
            "--root",
            str(root),
            "--manifests",
            str(manifests_dir),
            "--overlays",
            ",".join(order),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root


@pytest.fixture
def ns(restore_tree, engine_name):
    with harness.engine(restore_tree, package=engine_name) as engine_ns:
        yield engine_ns


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("GLM53_KV_OFFLOAD"):
            monkeypatch.delenv(name)


@pytest.fixture
def store(monkeypatch, tmp_path):
    root = tmp_path / "store"
    env_on(monkeypatch, root)
    return root


def key_of(hashes, group: int, block: int) -> bytes:
    return hashes[(block + 1) * PER_CHUNK - 1] + group.to_bytes(4, "big")


def write_a(ns, store, tp=1) -> tuple[Rig, list[bytes]]:
    rig = Rig(ns, store, tp=tp)
    hashes = chain_hashes("a", PROMPT_BLOCKS)
    rig.store_request("a", hashes, PROMPT_BLOCKS, 0)
    return rig, hashes


def restore_b(rig: Rig, hashes, n: int = 9):
    request = rig.request(f"b{n}", hashes, PROMPT_BLOCKS * BLOCK)
    rig.scheduler.on_new_request(request)
    hits, is_async = rig.lookup(request)
    if hits:
        rig.load(request, hits, n)
    return hits, is_async


def assert_restored(rig: Rig, hashes, n: int = 9) -> None:
    """Every rank's GPU received exactly what that rank wrote for A."""
    for rank, worker in enumerate(rig.workers):
        ((_, chunks, dst),) = worker.gpu.loads
        # one block per full chunk below the boundary, one state block each
        # (vLLM 0.34.0 passes the blocks' addresses, 0.33.0 the spec)
        sizes = getattr(dst, "group_block_counts", None)
        assert list(dst.group_sizes if sizes is None else sizes) == [6, 1, 1, 1, 1]
        assert list(dst.block_indices) == [0, 5, 5, 5, 5]
        expected = {}
        for b in range(RESTORED // BLOCK):
            expected[90000 + 1000 * n + b + 1] = key_of(hashes, 0, b)
        for g in rs.STATE_GROUPS:
            expected[90000 + 1000 * n + 100 * g + 6] = key_of(hashes, g, 5)
        assert sorted(worker.gpu.blocks) == sorted(expected)
        for block, key in expected.items():
            size = rig.page_bytes(key)
            assert worker.gpu.blocks[block][:size] == pattern(rank, key, size), block


def base_dir(rig: Rig, rank: int = 0) -> str:
    return rig.workers[rank]._kv_store.writer.layout.base


class ReadsHeld:
    """The library's test hold: a queued read of ``rank``'s store waits,
    running, before it opens a file, until ``release`` (or the end)."""

    def __init__(self, rig: Rig, rank: int = 0):
        self.lib = rig.restorers[rank]._native
        self.lib.test_hold_reads(base_dir(rig, rank) + os.sep)

    def release(self) -> None:
        self.lib.test_hold_reads(None)

    @staticmethod
    def wait_running(restorer, timeout: float = 10.0) -> None:
        """Until one of ``restorer``'s reads left the queue for the library's
        thread (held there): a fence must wait for it, not cancel it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for job in list(restorer._running.values()):
                if job.queued is not None and not job.queued.poll():
                    if (
                        job.queued.state
                        == sys.modules[type(restorer).__module__].read_queue.RUNNING
                    ):
                        return
            time.sleep(0.001)
        raise AssertionError("no read started within the timeout")

    def __enter__(self) -> ReadsHeld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def chunk_path(rig: Rig, key: bytes, rank: int = 0) -> str:
    layout = rig.workers[rank]._kv_store.writer.layout
    return layout.chunk(key[:-4].hex(), int.from_bytes(key[-4:], "big"))


# --------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_after_a_restart(ns, store, tp):
    rig, hashes = write_a(ns, store, tp)
    rig.shutdown()
    restarted = Rig(ns, store, tp=tp)  # fresh scheduler, manager, workers, rows
    hits, is_async = restore_b(restarted, hashes)
    assert (hits, is_async) == (RESTORED, True)
    # b1536 is the manifest that proves it: the boundary is the manifest's
    names = os.listdir(os.path.join(base_dir(restarted), "manifests"))
    assert f"b{RESTORED}_{hashes[RESTORED // HASH - 1].hex()}.json" in names
    assert_restored(restarted, hashes)
    tier = restarted.tier.stats
    assert tier.promotions_ok >= 1 and tier.promotions_failed == 0
    for r in restarted.restorers:
        assert r.stats.jobs_failed == 0 and r.stats.bytes_restored > 0
        # Each measured job's read is kept: keys, bytes, seconds adding up.
        reads = r.stats.job_reads
        assert len(reads) == r.stats.jobs_ok
        assert sum(b for _, b, _ in reads) == r.stats.bytes_restored
        assert sum(k for k, _, _ in reads) == r.stats.keys_restored
        assert sum(s for *_, s in reads) == pytest.approx(
            r.stats.read_seconds, abs=1e-4
        )
    restarted.shutdown()


def test_round_trip_after_a_prefix_cache_reset(ns, store):
    rig, hashes = write_a(ns, store)
    rig.scheduler.reset_cache()
    rig.step()  # the flushed jobs reach the workers; the reset is flushed
    rig.region.data[:] = bytes(len(rig.region.data))  # only the disk has A now
    rs.rescan_now(rig)  # the manifests A's writer published (rescanned each second)
    rig.step()
    hits, _ = restore_b(rig, hashes)
    assert hits == RESTORED
    assert_restored(rig, hashes)
    rig.shutdown()


def test_lookup_retries_until_every_rank_reported(ns, store):
    rig, hashes = write_a(ns, store, tp=2)
    rig.shutdown()
    restarted = Rig(ns, store, tp=2)
    request = restarted.request("b", hashes, PROMPT_BLOCKS * BLOCK)
    restarted.scheduler.on_new_request(request)
    # No worker metadata has arrived yet: the tier says RETRY, the request waits.
    assert restarted.scheduler.get_num_new_matched_tokens(request, 0) == (None, False)
    assert restarted.tier.stats.lookups["retry"] > 0
    assert restarted.manager.has_pending_work()
    hits, _ = restarted.lookup(request)
    assert hits == RESTORED
    restarted.shutdown()


# --------------------------------------------------------------------------
# Fail closed: miss, recompute, nothing loaded, counted


def flip_payload_bit(rig, hashes):
    path = chunk_path(rig, key_of(hashes, 0, 2))
    data = bytearray(open(path, "rb").read())
    data[-100] ^= 0x10
    open(path, "wb").write(data)
    return "payload_checksum_mismatch"


def truncate(rig, hashes):
    path = chunk_path(rig, key_of(hashes, 3, 5))
    size = os.path.getsize(path)
    os.truncate(path, size - 7)
    return "truncated"


def foreign_namespace(rig, hashes):
    """A chunk whose header (with a valid header CRC) names another namespace."""
    path = chunk_path(rig, key_of(hashes, 0, 1))
    data = bytearray(open(path, "rb").read())
    fmt = ChunkCalls(sys.modules[f"{OFFLOADING}.kv_store_format"])
    header = fmt.decode_header(data)
    other = fmt.ChunkHeader(
        namespace_hash=bytes(32),
        group=header.group,
        key_hash=header.key_hash,
        boundary=header.boundary,
        segments=header.segments,
        payload_length=header.payload_length,
        payload_checksum=header.payload_checksum,
    )
    data[: header.header_length] = fmt.encode_header(other)
    open(path, "wb").write(data)
    return "foreign_namespace"


def missing_file(rig, hashes):
    os.unlink(chunk_path(rig, key_of(hashes, 0, 4)))
    return "missing_file"


def rank_one_missing(rig, hashes):
    os.unlink(chunk_path(rig, key_of(hashes, 2, 5), rank=1))
    return "missing_file"


def fifo_at_chunk(rig, hashes):
    """A FIFO where a chunk belongs: opening it to read would block the step."""
    path = chunk_path(rig, key_of(hashes, 0, 3))
    os.unlink(path)
    os.mkfifo(path)
    return "io_error"


def linked_chunk_folder(rig, hashes):
    """Issue 45, 2: a chunk folder replaced by a link to a copy of it
    elsewhere (every chunk genuine): the restore loaded through it."""
    leaf = os.path.dirname(chunk_path(rig, key_of(hashes, 0, 2)))
    elsewhere = os.path.join(os.path.dirname(base_dir(rig)), "elsewhere")
    shutil.copytree(leaf, elsewhere)
    shutil.rmtree(leaf)
    os.symlink(elsewhere, leaf)
    return "unsafe_folder"


def open_chunk_folder(rig, hashes):
    """Issue 45, 3: a chunk folder others may write (a plant could land in
    it): it passed because the check stopped at the store folder."""
    os.chmod(os.path.dirname(chunk_path(rig, key_of(hashes, 0, 2))), 0o777)
    return "unsafe_folder"


@pytest.fixture
def hang_guard():
    """Fails the test rather than hanging the run when an open blocks."""

    def timeout(signum, frame):
        raise TimeoutError("blocked for 60 s (an open of a FIFO?)")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "damage, tp",
    [
        (flip_payload_bit, 1),
        (truncate, 1),
        (foreign_namespace, 1),
        (missing_file, 1),
        (rank_one_missing, 2),
        (fifo_at_chunk, 1),
        (linked_chunk_folder, 1),
        (open_chunk_folder, 1),
    ],
)
def test_damage_is_a_miss_and_a_recompute(ns, store, damage, tp, hang_guard):
    rig, hashes = write_a(ns, store, tp)
    rig.shutdown()
    reason = damage(rig, hashes)
    restarted = Rig(ns, store, tp=tp)
    hits, _ = restore_b(restarted, hashes)
    assert hits == 0  # the request recomputes its whole prompt
    for worker in restarted.workers:
        assert worker.gpu.loads == []  # no CPU->GPU load on any rank
    tier = restarted.tier.stats
    assert tier.promotions_failed == 1 and tier.promotions_ok == 0
    failed = [r for r in restarted.restorers if r.stats.jobs_failed]
    assert [dict(r.stats.failures) for r in failed] == [{reason: 1}]
    assert failed[0].stats.manifests_marked_bad >= 1
    # the ranks that read fine still reported OK; the job failed for all
    assert sum(r.stats.jobs_ok for r in restarted.restorers) == tp - 1
    # the keys stay misses: a second request recomputes without a promotion
    again, _ = restore_b(restarted, hashes, n=10)
    assert again == 0 and restarted.tier.stats.promotions_failed == 1
    restarted.shutdown()


def assert_restored_after_the_hold(rig: Rig, hashes, n: int) -> None:
    """Past failed_hold_s (the tier's clock moved on), A restores in full."""
    later = time.monotonic() + rig.tier.failed_hold_s + 1
    rig.tier.clock = lambda: later
    hits, _ = restore_b(rig, hashes, n=n)
    assert hits == RESTORED
    assert_restored(rig, hashes, n=n)


def inodes(folder: str) -> dict[str, int]:
    return {n: os.stat(os.path.join(folder, n)).st_ino for n in os.listdir(folder)}


def test_a_passing_failure_holds_the_keys_for_a_while_not_for_ever(ns, store):
    """A gc sweep holding the lock fails a promotion without marking anything
    bad: the keys miss for failed_hold_s, then restore again."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    restarted = Rig(ns, store)
    lock = os.open(os.path.join(base_dir(restarted), ".lock"), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # a sweep at work
    hits, _ = restore_b(restarted, hashes)
    os.close(lock)
    assert hits == 0
    assert dict(restarted.restorers[0].stats.failures) == {"lock_busy": 1}
    assert restarted.restorers[0].stats.manifests_marked_bad == 0
    again, _ = restore_b(restarted, hashes, n=10)
    assert again == 0 and restarted.tier.stats.promotions_failed == 1  # held
    assert_restored_after_the_hold(restarted, hashes, n=11)
    restarted.shutdown()


def restart_refusing_a_flipped_chunk(ns, store):
    """Write A, flip a payload bit of one chunk, restart: the restore of A is
    refused (a miss) and the chunk's manifests are marked bad. Returns the
    restarted rig, A's hashes, the chunk's path and its good bytes."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    path = chunk_path(rig, key_of(hashes, 0, 2))
    good = open(path, "rb").read()
    flip_payload_bit(rig, hashes)
    restarted = Rig(ns, store)
    hits, _ = restore_b(restarted, hashes)
    assert hits == 0 and restarted.restorers[0].stats.manifests_marked_bad >= 1
    return restarted, hashes, path, good


def test_a_bad_manifest_published_again_is_read_again(ns, store):
    """The bad chunk is written anew and its boundary published again under
    the same name (a new file): the rank proves the keys again."""
    restarted, hashes, path, good = restart_refusing_a_flipped_chunk(ns, store)
    open(path, "wb").write(good)
    manifests = os.path.join(base_dir(restarted), "manifests")
    for name in os.listdir(manifests):  # the writer's temp + rename: new inodes
        m = os.path.join(manifests, name)
        shutil.copyfile(m, m + ".again")
        os.replace(m + ".again", m)
    rs.rescan_now(restarted)
    restarted.step()
    hits, _ = restore_b(restarted, hashes, n=10)
    assert hits == RESTORED
    assert_restored(restarted, hashes, n=10)
    restarted.shutdown()


def test_a_refused_chunk_is_written_anew_by_the_recompute(ns, store):
    """A payload that went bad under a header that still verifies: the writer
    deduplicated onto it for good and the keys never restored again. The
    refusal hands the file to the writer; the recompute's store writes it
    anew and publishes its boundaries again, so the prefix restores in this
    boot and after a restart."""
    restarted, hashes, path, good = restart_refusing_a_flipped_chunk(ns, store)
    manifests = os.path.join(base_dir(restarted), "manifests")
    before = inodes(manifests)
    # The request recomputes its prompt and vLLM stores it again.
    restarted.store_request("c", hashes, PROMPT_BLOCKS, 11)
    stats = restarted.workers[0]._kv_store.stats
    assert stats.keys_distrusted == 1
    assert open(path, "rb").read() == good
    after = inodes(manifests)
    assert after.keys() == before.keys()
    assert any(after[n] != before[n] for n in before)  # published again: new files
    # In this boot, from the disk alone (the keys the failed job held as
    # misses and no rank took down stay held for failed_hold_s).
    restarted.scheduler.reset_cache()
    restarted.step()
    restarted.region.data[:] = bytes(len(restarted.region.data))
    rs.rescan_now(restarted)
    restarted.step()
    assert_restored_after_the_hold(restarted, hashes, n=12)
    restarted.shutdown()
    again = Rig(ns, store)
    hits, _ = restore_b(again, hashes, n=13)
    assert hits == RESTORED
    assert_restored(again, hashes, n=13)
    again.shutdown()


def test_a_fifo_named_like_a_manifest_is_passed_over(ns, store, hang_guard):
    """Neither the writer's keep-K scan nor the restore inventory opens it."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    manifests = os.path.join(base_dir(rig), "manifests")
    os.mkfifo(os.path.join(manifests, f"b{BLOCK}_{'ab' * 32}.json"))
    restarted = Rig(ns, store)
    hits, _ = restore_b(restarted, hashes)
    assert hits == RESTORED
    assert_restored(restarted, hashes)
    assert restarted.restorers[0].stats.manifests_rejected >= 1
    restarted.shutdown()


def test_ranks_that_disagree_load_nothing(ns, store):
    """Rank 1's file verifies but holds other bytes than its manifest proves."""
    rig, hashes = write_a(ns, store, tp=2)
    rig.shutdown()
    path = chunk_path(rig, key_of(hashes, 0, 0), rank=1)
    data = bytearray(open(path, "rb").read())
    fmt = ChunkCalls(sys.modules[f"{OFFLOADING}.kv_store_format"])
    header = fmt.decode_header(data)
    payload = bytes(reversed(data[header.header_length :]))
    rewritten = fmt.ChunkHeader(
        namespace_hash=header.namespace_hash,
        group=header.group,
        key_hash=header.key_hash,
        boundary=header.boundary,
        segments=header.segments,
        payload_length=len(payload),
        payload_checksum=zlib.crc32(payload) & 0xFFFFFFFF,
    )
    open(path, "wb").write(fmt.encode_header(rewritten) + payload)
    restarted = Rig(ns, store, tp=2)
    hits, _ = restore_b(restarted, hashes)
    assert hits == 0
    assert [w.gpu.loads for w in restarted.workers] == [[], []]
    r0, r1 = restarted.restorers
    assert r0.stats.jobs_ok == 1 and r1.stats.failures == {"manifest_mismatch": 1}
    restarted.shutdown()


def test_one_rank_failing_steps_later_is_a_miss_on_all(ns, store):
    """Rank 0 reads its files at once and reports OK; rank 1's read is held for
    several steps, then refuses a flipped payload: the job waits for rank 1 (no
    load meanwhile), then fails on both ranks, and nothing is loaded."""
    rig, hashes = write_a(ns, store, tp=2)
    rig.shutdown()
    flip_payload_bit_on(rig, key_of(hashes, 0, 3), rank=1)
    restarted = Rig(ns, store, tp=2)
    restarted.wait_promotions = False
    held = ReadsHeld(restarted, rank=1)
    request = restarted.request("b", hashes, PROMPT_BLOCKS * BLOCK)
    restarted.scheduler.on_new_request(request)
    restarted.step()  # inventories
    assert restarted.scheduler.get_num_new_matched_tokens(request, 0) == (None, False)
    restarted.step()  # the promotion reaches both ranks
    assert restarted.restorers[0].wait_idle(30)  # rank 0 done, rank 1 held
    for _ in range(3):
        restarted.step()
        assert restarted.tier.stats.promotions_ok == 0
        assert restarted.tier.stats.promotions_failed == 0  # waits for rank 1
    held.release()
    assert restarted.restorers[1].wait_idle(30)
    restarted.step()
    assert restarted.tier.stats.promotions_failed == 1
    assert restarted.restorers[0].stats.jobs_ok == 1
    assert restarted.restorers[1].stats.failures == {"payload_checksum_mismatch": 1}
    hits, _ = restarted.lookup(request)
    assert hits == 0
    assert [w.gpu.loads for w in restarted.workers] == [[], []]
    restarted.shutdown()


# --------------------------------------------------------------------------
# Races


def test_gc_sweep_waits_for_a_promotion(ns, store, kvstore_bin):
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    restarted = Rig(ns, store)
    seen = {}

    def during_read(proofs):
        # The promotion holds the store lock shared; the sweep needs it
        # exclusive: it must not delete anything under the reader.
        before = sorted(os.listdir(os.path.join(base_dir(restarted), "manifests")))
        sweep = subprocess.run(
            # A short wait: the reader keeps the lock until this returns.
            [str(kvstore_bin), "gc", str(store), "--sweep", "--lock-timeout", "1"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        seen["rc"] = sweep.returncode
        seen["out"] = sweep.stdout + sweep.stderr
        after = sorted(os.listdir(os.path.join(base_dir(restarted), "manifests")))
        seen["unchanged"] = before == after and all(
            os.path.exists(chunk_path(restarted, offload_key(p))) for p in proofs
        )

    def offload_key(p):
        return bytes.fromhex(p.key_hex) + p.group.to_bytes(4, "big")

    restarted.restorers[0].before_read = during_read
    hits, _ = restore_b(restarted, hashes)
    assert seen["rc"] == 7, seen[
        "out"
    ]  # busy: the reader holds the store lock (README, Exit codes)
    assert seen["unchanged"]
    assert hits == RESTORED
    assert_restored(restarted, hashes)
    restarted.shutdown()


def test_keep_k_retiring_manifests_under_a_promotion_loads_the_verified_bytes(
    ns, store
):
    """Keep-K unlinks the manifests (first, FORMAT.md's order) while a
    promotion is under way: the chunk files it reads are still the verified
    ones, so the restore loads them."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    restarted = Rig(ns, store)

    def retire(proofs):
        manifests = os.path.join(base_dir(restarted), "manifests")
        for name in os.listdir(manifests):
            os.unlink(os.path.join(manifests, name))

    restarted.restorers[0].before_read = retire
    hits, _ = restore_b(restarted, hashes)
    assert hits == RESTORED
    assert_restored(restarted, hashes)
    restarted.shutdown()


def test_keep_k_retiring_a_payload_before_the_library_opens_it_is_a_miss(ns, store):
    """The library opens a job's files inside its one read call (an open per
    file in Python waited for the GIL behind the stepping engine thread: 2047
    files took seconds on the H200). A payload keep-K unlinks after the
    promotion located it and before that call is a miss; nothing is loaded."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    restarted = Rig(ns, store)

    def retire(proofs):
        for p in proofs:
            if p.kind == "state":
                key = bytes.fromhex(p.key_hex) + p.group.to_bytes(4, "big")
                os.unlink(chunk_path(restarted, key))

    restarted.restorers[0].before_read = retire
    hits, _ = restore_b(restarted, hashes)
    assert hits == 0
    assert restarted.restorers[0].stats.failures == {"missing_file": 1}
    assert restarted.workers[0].gpu.loads == []
    restarted.shutdown()


def test_keep_k_retiring_before_the_open_is_a_miss(ns, store):
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    restarted = Rig(ns, store)
    request = restarted.request("b", hashes, PROMPT_BLOCKS * BLOCK)
    restarted.scheduler.on_new_request(request)
    restarted.step()  # inventories arrive
    # retired after the index said "provable", before any promotion opened it
    key = key_of(hashes, 4, 5)
    os.unlink(chunk_path(restarted, key))
    hits, _ = restarted.lookup(request)
    assert hits == 0
    assert restarted.restorers[0].stats.failures == {"missing_file": 1}
    assert restarted.workers[0].gpu.loads == []
    restarted.shutdown()


def test_a_reset_fences_a_promotion_in_flight(ns, store):
    """The reset fails the promotion at once and vLLM frees its rows; the next
    step's metadata fences it, and the worker's step does not go on (no
    transfer of that step is submitted) until the read finished."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    restarted = Rig(ns, store)
    restarted.wait_promotions = False
    request = restarted.request("b", hashes, PROMPT_BLOCKS * BLOCK)
    restarted.scheduler.on_new_request(request)
    restarted.step()  # inventories
    held = ReadsHeld(restarted)
    restorer = restarted.restorers[0]
    assert restarted.scheduler.get_num_new_matched_tokens(request, 0) == (None, False)
    meta = restarted.step()  # the promotion starts on the worker and blocks
    assert meta.kv_restore and not getattr(meta, "kv_restore_fence", None)
    held.wait_running(restorer)
    restarted.scheduler.reset_cache()
    assert restarted.tier.stats.promotions_fenced == 1
    timer = threading.Timer(0.5, held.release)
    timer.start()
    start = time.monotonic()
    fenced = restarted.step()
    assert time.monotonic() - start >= 0.4  # the step waited for the read
    assert fenced.kv_restore_fence == [meta.kv_restore[0]["job"]]
    assert restorer.stats.jobs_fenced == 1 and restorer.stats.jobs_ok == 1
    restarted.step()  # the late report is ignored, nothing is marked loaded
    assert restarted.tier.stats.promotions_ok == 0
    assert restarted.workers[0].gpu.loads == []
    timer.join()
    restarted.shutdown()


def test_a_queued_promotion_a_reset_fences_is_cancelled(ns, store):
    """Two promotions sent; the first blocks on its read, the reset fences
    both: the second never starts, the worker waits for the first."""
    rig, hashes = write_a(ns, store)
    other = chain_hashes("d", PROMPT_BLOCKS)
    rig.store_request("d", other, PROMPT_BLOCKS, 1)
    rig.shutdown()
    restarted = Rig(ns, store)
    restarted.wait_promotions = False
    restarted.step()  # inventories
    held = ReadsHeld(restarted)
    restorer = restarted.restorers[0]
    jobs = []
    queue_read = restorer._queue_read
    restorer._queue_read = lambda job: (jobs.append(job), queue_read(job))
    for name, h in (("b", hashes), ("e", other)):
        request = restarted.request(name, h, PROMPT_BLOCKS * BLOCK)
        restarted.scheduler.on_new_request(request)
        restarted.scheduler.get_num_new_matched_tokens(request, 0)
    meta = restarted.step()
    assert len(meta.kv_restore) == 2
    held.wait_running(restorer)  # the first; the second stays queued behind it
    restarted.scheduler.reset_cache()
    timer = threading.Timer(0.3, held.release)
    timer.start()
    restarted.step()
    timer.join()
    assert restorer.stats.jobs_fenced == len(meta.kv_restore)
    # The first was read (held, then released); the queued one never started.
    assert [(j.queued.done, j.cancelled) for j in jobs] == [
        (True, False),
        (False, True),
    ]
    assert restarted.tier.stats.promotions_ok == 0
    restarted.shutdown()


# --------------------------------------------------------------------------
# Knobs, refusals, byte-for-byte store-only behaviour


def test_restore_needs_a_fixed_hash_seed(ns, store, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(ValueError, match="PYTHONHASHSEED"):
        Rig(ns, store, hash_algo="xxhash")  # seeded per process
    Rig(ns, store).shutdown()  # sha256 has a fixed default seed


@pytest.mark.parametrize("restore", [True, False], ids=["on", "off"])
def test_one_scheduler_line_about_restore_per_boot(ns, store, monkeypatch, restore):
    """A boot says once whether restore is on, and says it truly (the store-only
    line used to say "restore is off" on a restoring engine too)."""
    import logging

    env_on(monkeypatch, store, restore=restore)
    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append
    vllm_logger = logging.getLogger("vllm")
    vllm_logger.addHandler(handler)
    level = vllm_logger.level
    vllm_logger.setLevel(logging.INFO)
    try:
        Rig(ns, store, tier=restore).shutdown()
    finally:
        vllm_logger.removeHandler(handler)
        vllm_logger.setLevel(level)
    scheduler_side = ("vllm_scheduler", "kv_restore_tier", "kv_restore_scheduler")
    about = [
        r.getMessage()
        for r in seen
        if r.name.rsplit(".", 1)[-1] in scheduler_side and "restore" in r.getMessage()
    ]
    assert len(about) == 1, about
    if restore:
        assert about[0].startswith("KV restore: on")
    else:
        assert "restore is off" in about[0]


def test_restore_needs_the_store(ns, store, monkeypatch):
    monkeypatch.setenv("GLM53_KV_OFFLOAD", "0")
    with pytest.raises(ValueError):
        Rig(ns, store)


def test_a_store_others_can_change_fails_the_boot(ns, store):
    # docs/DEPLOY.md "Security": chunks are inputs, so such a store is never read.
    store.mkdir(parents=True)
    store.chmod(0o777)
    with pytest.raises(
        ValueError, match=rf"store folder not safe: {re.escape(str(store))} \(mode 0777"
    ):
        Rig(ns, store)


@pytest.mark.parametrize("folder", ["rank", "manifests"])
@pytest.mark.parametrize("how", ["link", "0777"])
def test_a_rank_folder_others_can_change_is_never_read(ns, store, folder, how):
    """Issue 45, 2 and 3: the rank folder or manifests/ made a link to a copy
    of it, or writable by others: the rank's boot is refused (one line naming
    the folder and the problem), so the rank neither writes nor restores."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    path = base_dir(rig)
    if folder == "manifests":
        path = os.path.join(path, "manifests")
    if how == "link":
        copy = os.path.join(str(store), "copy-of-" + os.path.basename(path))
        shutil.copytree(path, copy, symlinks=True)
        shutil.rmtree(path)
        os.symlink(copy, path)
        want = f"store folder not safe: {path} is a symlink"
    else:
        os.chmod(path, 0o777)
        want = f"store folder not safe: {path} (mode 0777, uid {os.geteuid()})"
    refused = sys.modules[f"{OFFLOADING}.kv_store_local.errors"].StoreRefused
    before = sorted(str(p) for p in store.rglob("*"))
    line = f"KV store: GLM53_KV_OFFLOAD=1 is refused on this rank: {want}"
    with pytest.raises(refused, match="^" + re.escape(line)):
        Rig(ns, store)
    assert sorted(str(p) for p in store.rglob("*")) == before  # nothing written


def _key_file(monkeypatch, tmp_path, name: str = "kvtier.key", mode: int = 0o600):
    key = tmp_path / name
    key.write_bytes(os.urandom(32))
    key.chmod(mode)
    monkeypatch.setenv("GLM53_KV_OFFLOAD_KEY_FILE", str(key))
    return key


def test_a_key_file_others_may_read_fails_the_boot(ns, store, monkeypatch, tmp_path):
    key = _key_file(monkeypatch, tmp_path, mode=0o644)
    with pytest.raises(
        ValueError, match=rf"key file {re.escape(str(key))} has mode 0644"
    ):
        Rig(ns, store)


# --------------------------------------------------------------------------
# Keyed stores (FORMAT.md 3.6, issue 38): sealed chunks and manifests


def test_keyed_round_trip_after_a_restart(ns, store, monkeypatch, tmp_path):
    key = _key_file(monkeypatch, tmp_path)
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    fmt = ChunkCalls(sys.modules[f"{OFFLOADING}.kv_store_format"])
    sealed = open(chunk_path(rig, key_of(hashes, 0, 2)), "rb").read()
    fmt.verify_sealed_chunk(key.read_bytes(), sealed, rank=0)  # the writer sealed it
    restarted = Rig(ns, store)
    hits, _ = restore_b(restarted, hashes)
    assert restarted.restorers[0]._key == key.read_bytes()  # read with the key
    assert hits == RESTORED
    assert_restored(restarted, hashes)
    assert restarted.restorers[0].stats.failures == {}
    restarted.shutdown()


def forge_same_crc(rig, hashes, keyed: bool) -> str:
    """What someone who can write the folder can do: the payload of one chunk
    replaced with bytes of its choosing whose CRC-32 is the one the header and
    the manifest carry (four bytes fix any CRC), header and MAC kept."""
    import crc_forge

    path = chunk_path(rig, key_of(hashes, 0, 2))
    data = open(path, "rb").read()
    (hlen,) = struct.unpack_from("<I", data, 12)
    if keyed:
        forged = crc_forge.forged_sealed_chunk(data, hlen)
    else:  # the same forgery of a plain chunk: no MAC to keep
        forged = crc_forge.forged_sealed_chunk(data + bytes(32), hlen)[:-32]
    assert zlib.crc32(
        forged[hlen : hlen + len(data) - hlen - 32 * keyed]
    ) == zlib.crc32(data[hlen : len(data) - 32 * keyed])
    open(path, "wb").write(forged)
    return path


def plant_plain_chunk(rig, hashes, key: bytes) -> str:
    """A plain chunk of this namespace (valid header CRC, payload CRC and
    namespace hash: nothing secret) where a sealed one lies."""
    fmt = ChunkCalls(sys.modules[f"{OFFLOADING}.kv_store_format"])
    path = chunk_path(rig, key_of(hashes, 3, 5))
    plain = fmt.open_chunk(key, open(path, "rb").read(), rank=0)
    fmt.verify_chunk(plain)
    open(path, "wb").write(bytes(plain))
    return path


@pytest.mark.parametrize("forgery", ["same_crc", "plain"])
def test_a_forged_chunk_is_refused_counted_and_recomputed_with_the_key(
    ns, store, monkeypatch, tmp_path, forgery
):
    key = _key_file(monkeypatch, tmp_path).read_bytes()
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    if forgery == "same_crc":
        forge_same_crc(rig, hashes, keyed=True)
        reason = "mac_mismatch"
    else:
        plant_plain_chunk(rig, hashes, key)
        reason = "mac_missing"
    restarted = Rig(ns, store)
    hits, _ = restore_b(restarted, hashes)
    assert hits == 0  # the request recomputes its whole prompt
    assert restarted.workers[0].gpu.loads == []  # not a byte of it reached the GPU
    restorer = restarted.restorers[0]
    assert dict(restorer.stats.failures) == {reason: 1}
    assert restorer.stats.manifests_marked_bad >= 1
    assert restarted.tier.stats.promotions_failed == 1
    # Handed to the writer like any refused file: the recompute writes it anew.
    restarted.store_request("c", hashes, PROMPT_BLOCKS, 11)
    assert restarted.workers[0]._kv_store.stats.keys_distrusted == 1
    restarted.shutdown()


def test_the_same_forgery_in_a_keyless_store_is_loaded(ns, store):
    """Why the key exists: without it the CRC-preserving forgery restores."""
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    forge_same_crc(rig, hashes, keyed=False)
    restarted = Rig(ns, store)
    hits, _ = restore_b(restarted, hashes)
    assert hits == RESTORED and restarted.restorers[0].stats.failures == {}
    restarted.shutdown()


def test_another_key_is_another_namespace_never_a_load(
    ns, store, monkeypatch, tmp_path
):
    _key_file(monkeypatch, tmp_path, "one.key")
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    _key_file(monkeypatch, tmp_path, "two.key")
    restarted = Rig(ns, store)
    hits, _ = restore_b(restarted, hashes)
    assert hits == 0
    restorer = restarted.restorers[0]
    # The first key's manifests are not this namespace's: none is even read.
    assert (
        restorer.stats.manifests_loaded == 0 and restorer.stats.manifests_rejected == 0
    )
    assert restarted.tier.stats.promotions_failed == 0 and restorer.stats.failures == {}
    assert base_dir(restarted) != base_dir(rig)
    restarted.shutdown()


@pytest.mark.parametrize("value", ["yes", "2", ""])
def test_a_bad_restore_value_fails_the_boot(ns, store, monkeypatch, value):
    monkeypatch.setenv("GLM53_KV_OFFLOAD_RESTORE", value)
    with pytest.raises(ValueError, match="GLM53_KV_OFFLOAD_RESTORE"):
        Rig(ns, store)


def test_a_store_without_a_fenced_key_scheme_is_never_read(ns, store):
    kw = sys.modules.get(f"{OFFLOADING}.kv_restore_worker") or ns.load(
        f"{OFFLOADING}.kv_restore_worker"
    )
    assert kw.key_scheme_refusal({}) is not None
    per_process = {"key_scheme": {"hash": "xxhash", "seed": "per-process"}}
    assert "per process" in kw.key_scheme_refusal(per_process)
    rig, hashes = write_a(ns, store)
    rig.shutdown()
    record = rig.workers[0]._kv_store.writer.layout.namespace_record
    fmt = sys.modules[f"{OFFLOADING}.kv_store_format"]
    parsed = fmt.decode_namespace_record(open(record, "rb").read())
    assert parsed.fenced["key_scheme"] == {"hash": "sha256", "seed": "PYTHONHASHSEED=0"}
    assert kw.key_scheme_refusal(parsed.fenced) is None
    # A record without it (a store written before the writer fenced it) is
    # refused by the same check: that rank restores nothing.
    fenced = {k: v for k, v in parsed.fenced.items() if k != "key_scheme"}
    assert "does not fence" in kw.key_scheme_refusal(fenced)


def store_only_run(ns, store) -> list[bytes]:
    """A store-and-lookup scenario; every pickled metadata it produced."""
    rig = Rig(ns, store, tier=False)  # the stage-1 deployment: no secondary tier
    out = []
    hashes = chain_hashes("a", PROMPT_BLOCKS)
    request = rig.request("a", hashes, PROMPT_BLOCKS * BLOCK)
    rig.scheduler.on_new_request(request)
    assert rig.scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    steps = [
        rs.scheduler_output(
            request, tuple([g * 100 + b + 1 for b in range(8)] for g in range(7))
        )
    ]
    steps += [None, None]
    for output in steps:
        meta = rig.step(output)
        out.append(pickle.dumps(meta))
        worker_meta = rig.workers[0]._connector_worker_meta
        out.append(pickle.dumps(worker_meta))
    rig.drain_writers()
    for root, _, files in sorted(os.walk(base_dir(rig))):
        for name in sorted(files):
            with open(os.path.join(root, name), "rb") as f:
                # a writer's per-process record is named by pid and thread id
                stable = re.sub(r"\d+\.\d+\.json$", "PID.TID.json", name)
                out.append(stable.encode() + f.read())
    rig.shutdown()
    return out


@pytest.fixture(scope="module")
def store_only_tree(overlay_bin, engine_tree, manifests_dir, order, tmp_path_factory):
    root = tmp_path_factory.mktemp("store-only") / "site-packages"
    shutil.copytree(engine_tree, root, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run(
        [
            str(overlay_bin),
            "apply",
            "--root",
            str(root),
            "--manifests",
            str(manifests_dir),
            "--overlays",
            ",".join(order[: order.index("kv-offload-restore")]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return root


def test_restore_off_behaves_byte_for_byte_like_store_only(
    restore_tree, store_only_tree, engine_name, monkeypatch, tmp_path
):
    env_on(monkeypatch, tmp_path / "s1", restore=False)
    with harness.engine(store_only_tree, package=engine_name) as ns:
        before = store_only_run(ns, tmp_path / "s1")
    env_on(monkeypatch, tmp_path / "s2", restore=False)
    # Only what this run imports counts: other test files import the
    # overlay's own modules (kv_restore_inventory, ...) from its folder.
    loaded = set(sys.modules)
    with harness.engine(restore_tree, package=engine_name) as ns:
        after = store_only_run(ns, tmp_path / "s2")
        # the restore modules were never imported
        assert not [n for n in sys.modules if "kv_restore" in n and n not in loaded]
    assert len(before) == len(after) and before == after


def test_reports_survive_aggregation_and_the_stock_job_loop(ns):
    reports = ns.load(f"{OFFLOADING}.kv_restore_reports")
    common = ns.load(f"{OFFLOADING}.common")
    a, b = common.OffloadingWorkerMetadata(), common.OffloadingWorkerMetadata()
    reports.add(a.completed_jobs, [(reports.READY, 0), (reports.KEY_UP, 5)])
    reports.add(b.completed_jobs, [(reports.READY, 0), (reports.PROMOTE_FAIL, 7)])
    a.mark_completed(3)
    total = a.aggregate(b)
    assert all(-(1 << 63) <= j < (1 << 63) for j in total.completed_jobs)
    taken = sorted(reports.take(total.completed_jobs))
    assert taken == [
        (reports.READY, 0, 2),
        (reports.KEY_UP, 5, 1),
        (reports.PROMOTE_FAIL, 7, 1),
    ]
    assert total.completed_jobs == {3: 1}
    assert struct.calcsize("q") == 8


# --------------------------------------------------------------------------
# Two processes, real torch.distributed (gloo)

REAL_PYTHON = os.environ.get(
    "KVTIER_REAL_PYTHON",
    os.path.expanduser("~/.cache/kvtier/venv-vllm-0.33.0/bin/python"),
)


@pytest.mark.skipif(
    not os.access(REAL_PYTHON, os.X_OK),
    reason="no real-vLLM venv (scripts/real-venv.sh) with torch for gloo",
)
@pytest.mark.parametrize("disagree", [False, True])
def test_two_ranks_over_gloo(ns, store, restore_tree, tmp_path, disagree):
    """Two processes, one rank each; with one rank's chunk flipped nobody loads."""
    rig, hashes = write_a(ns, store, tp=2)
    rig.shutdown()
    if disagree:
        flip_payload_bit_on(rig, key_of(hashes, 0, 3), rank=1)
    script = os.path.join(os.path.dirname(__file__), "restore_two_ranks.py")
    init = tmp_path / "gloo-init"
    procs = [
        subprocess.Popen(
            [
                REAL_PYTHON,
                script,
                str(restore_tree),
                str(store),
                str(r),
                str(init),
                str(tmp_path / f"rank{r}.json"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    if disagree:
        assert [r["hits"] for r in results] == [0, 0]
        assert [r["loads"] for r in results] == [0, 0]  # nobody loads
        assert results[0]["jobs_ok"] == 1  # rank 0 read fine, and still did not load
        assert results[1]["failures"] == {"payload_checksum_mismatch": 1}
    else:
        assert [r["hits"] for r in results] == [RESTORED, RESTORED]
        assert [r["loads"] for r in results] == [1, 1]
        assert all(all(r["bytes_equal"]) for r in results)


def flip_payload_bit_on(rig, key, rank):
    path = chunk_path(rig, key, rank=rank)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0x01
    open(path, "wb").write(data)


# --------------------------------------------------------------------------
# The knob contract: RESTORE=1 only where the restore overlay is baked

CONTRACT = rs.REPO / "overlays" / "kv-offload-scope" / "kv_offload_knobs.py"


def load_contract(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"knobs_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_restore_one_is_accepted_only_beside_the_restore_tier(tmp_path):
    alone = load_contract(CONTRACT)  # the repo's scope overlay folder: not baked
    with pytest.raises(alone.KnobError, match="RESTORE=1 is refused"):
        alone.read_knobs({"GLM53_KV_OFFLOAD_RESTORE": "1"})
    # Inside vLLM both are files of the offloading package.
    shutil.copy(CONTRACT, tmp_path / "kv_offload_knobs.py")
    (tmp_path / "kv_restore_tier.py").write_text("")
    baked = load_contract(tmp_path / "kv_offload_knobs.py")
    assert baked.validate({"GLM53_KV_OFFLOAD_RESTORE": "1"})
    with pytest.raises(baked.KnobError, match="must be 0 or 1"):
        baked.read_knobs({"GLM53_KV_OFFLOAD_RESTORE": "2"})
    # The launch gate declares a baked prefix on the command line.
    env = {"PATH": os.environ["PATH"], "GLM53_KV_OFFLOAD_RESTORE": "1"}
    refused = subprocess.run(
        [sys.executable, str(CONTRACT), "check"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "RESTORE=1 is refused" in refused.stderr
    accepted = subprocess.run(
        [sys.executable, str(CONTRACT), "check", "--restore-baked"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert (accepted.returncode, accepted.stdout) == (0, "0\n")


def test_the_header_read_gives_the_verdicts_of_a_full_length_read(ns, tmp_path):
    """The header reads read 64 KiB (and more only for a longer header) where
    the worker once read MAX_HEADER_LENGTH; every file must be judged the same:
    the oracle's read_header_bytes, and the shipped read_chunk_header (the C++
    read_head_fd) against the oracle's verdict on a full-length read."""
    import kv_store_format_oracle as oracle

    kr = sys.modules.get(f"{OFFLOADING}.kv_restore_read") or ns.load(
        f"{OFFLOADING}.kv_restore_read"
    )
    fmt = ChunkCalls(kr.fmt)

    def chunk(nsegs: int) -> bytes:
        specs = [
            (i, fmt.SegmentKind.KV, fmt.DType.UINT8, (4,), (1,)) for i in range(nsegs)
        ]
        payload = bytes(range(256)) * (nsegs * 4 // 256 + 1)
        payload = payload[: nsegs * 4]
        segs = fmt.make_segments(specs)
        header = fmt.make_header(bytes(32), 0, bytes(16), 16, segs, payload)
        return fmt.encode_chunk(header, payload)

    def lying(data: bytes, length: int) -> bytes:
        return data[:12] + length.to_bytes(4, "little") + data[16:]

    small, big = chunk(3), chunk(1100)  # big: a header over 64 KiB
    assert fmt.decode_header(big).header_length > 64 << 10
    files = {
        "small": small,
        "big": big,
        "big cut in its header": big[: (64 << 10) + 100],
        "small cut": small[:100],
        "tiny": small[:12],
        "length over the maximum": lying(big, fmt.MAX_HEADER_LENGTH + 64),
        "length past the end": lying(small, 600_000),
    }

    def verdict(head: bytes, size: int | None = None):
        try:
            header = oracle.decode_header(head)
            if size is not None:
                oracle.check_file_size(header, size)
            return "ok"
        except oracle.FormatError as e:
            return e.reason.value

    for name, data in files.items():
        path = tmp_path / name.replace(" ", "_")
        path.write_bytes(data)
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            head = oracle.read_header_bytes(fd, size)
            full = os.pread(fd, min(size, fmt.MAX_HEADER_LENGTH), 0)
        finally:
            os.close(fd)
        assert verdict(head) == verdict(full), name
        try:
            fmt.read_chunk_header(str(path))
            native = "ok"
        except fmt.FormatError as e:
            native = e.reason.value
        assert native == verdict(full, size), name
        if name == "small":
            assert len(head) == len(small)  # one read, the file is that short
        if name == "length over the maximum":
            assert len(head) == 64 << 10  # a length past the bound sizes no read
    fd = os.open(tmp_path / "big", os.O_RDONLY)
    try:
        head = oracle.read_header_bytes(fd, len(big))
    finally:
        os.close(fd)
    assert len(head) == fmt.decode_header(big).header_length


def test_the_cost_model_fits_the_prefill_rate_and_takes_the_slowest_rank(ns):
    """A prefill step's seconds c + a * tokens + b * tokens * context, fit from timed
    steps; the read estimate is the slowest rank's; nothing is weighed until both are
    measured."""
    cost = ns.load(f"{OFFLOADING}.kv_restore_cost")
    reports = ns.load(f"{OFFLOADING}.kv_restore_reports")
    prefill, rates = cost.PrefillRate(chunk=1024), cost.ReadRates()
    assert cost.weigh(rates, prefill, 2, 10, 0, 4096) is None
    a, b = 20e-6, 1e-9  # seconds a token, and per token of context
    clock = cost.StepClock(prefill)
    now = 0.0
    for start in range(0, 8192, 1024):  # one request's chunked prefill
        clock.on_step(now, [("r", 1024, start, 8192)])
        now += 1024 * (a + b * (start + 512))
    for _ in range(2):  # it decodes: the last chunks are timed too
        clock.on_step(now, [("r", 1, 8192, 8192)])
        now += 0.001
    assert prefill.steps == 8
    # A step is given the longer of the two periods after it: here mostly the
    # next chunk's, one chunk deeper, so the fit leans up a little, never down.
    fit_c, fit_a, fit_b = prefill.coefficients()
    assert fit_c < 0.01 * 1024 * a
    assert abs(fit_a - a) < 0.1 * a and abs(fit_b - b) < 0.1 * b
    true = a * 4096 + b * 4096**2 / 2
    assert true <= prefill.seconds(0, 4096) <= 1.1 * true
    # Async scheduling: the next step is scheduled at once, the one after it
    # once the prefill ran; the prefill step still gets its own time.
    lone = cost.PrefillRate(chunk=1024)
    clock = cost.StepClock(lone)
    for t, item in ((0.0, ("s", 1024, 0, 1024)), (0.0001, ("s", 1, 1024, 1024)),
                    (0.05, ("s", 1, 1025, 1024)), (0.06, ("s", 1, 1026, 1024))):  # fmt: skip
        clock.on_step(t, [item])
    assert lone.steps == 1 and abs(lone.seconds(0, 1024) - 0.05) < 1e-3
    # A step after which nothing scheduled came back is not timed (idle).
    steps = prefill.steps
    for t, req in ((now, "x"), (now + 100.0, "y"), (now + 100.1, "y")):
        clock = cost.StepClock(prefill) if req == "x" else clock
        clock.on_step(t, [(req, 512, 0, 512)])
    assert prefill.steps == steps
    # Two ranks: 2 GB/s and 0.5 GB/s, 1 MB a key; the slow one decides.
    for rank, rate in ((0, 2e9), (1, 0.5e9)):
        rates.on_report(reports.READ_RATE, reports.rank_value(rank, rate))
        rates.on_report(reports.KEY_BYTES, reports.rank_value(rank, 1e6))
    assert cost.weigh(rates, prefill, 3, 10, 0, 4096) is None  # rank 2 unmeasured
    estimate = cost.weigh(rates, prefill, 2, 100, 0, 4096)
    assert abs(estimate.read_s - 100 * 1e6 / 0.5e9) < 1e-9
    assert estimate.restore is (estimate.read_s <= estimate.recompute_s)
    assert not estimate.restore  # 0.2 s of reading against ~0.09 s of prefill
    # The estimate carries what it was fit from (the GPU suite keeps it).
    assert estimate.prefill_fit == prefill.coefficients()
    assert len(estimate.prefill_points) == prefill.steps == 8
    tokens, context, seconds = estimate.prefill_points[0]
    assert (tokens, context) == (1024, 512) and seconds >= 1024 * (a + b * 512)
    assert estimate.as_dict()["prefill_points"][0] == (1024, 512, seconds)
    assert cost.weigh(rates, prefill, 2, 10, 0, 4096).restore


def test_the_prefill_fit_drops_kernel_compiles_and_pauses(ns):
    """Run 15's 32k estimate (26,958 s against 5.1 s): a warm-up whose deeper
    chunk compiled a kernel read as a steep slope. Slow outliers are dropped,
    slowest first, and never more than half the steps."""
    cost = ns.load(f"{OFFLOADING}.kv_restore_cost")
    a, b = 30e-6, 2e-9
    true = a * 32768 + b * 32768**2 / 2

    def step(prefill, n, ctx, extra=0.0):
        prefill.observe(n, ctx, n * (a + b * ctx) + extra)

    # Two chunks of a warm-up prompt: the second (deeper, shorter) compiled
    # the attention kernel that reads a cached prefix.
    two = cost.PrefillRate(chunk=2048)
    step(two, 2048, 1024)
    step(two, 704, 2400, extra=20.0)
    assert two.seconds(0, 32768) < 2 * true
    assert two.trimmed == 1
    # The compile on the first step instead (shallow): the slope survives.
    first = cost.PrefillRate(chunk=2048)
    step(first, 2048, 1024, extra=15.0)
    for n, ctx in ((2048, 3072), (2048, 5120), (1024, 6656)):
        step(first, n, ctx)
    assert 0.9 * true <= first.seconds(0, 32768) <= 1.1 * true
    assert first.trimmed == 1
    # Among many sound steps, four 21x slower (pauses) change nothing.
    many = cost.PrefillRate(chunk=2048)
    for i in range(40):
        ctx = 512 + 1024 * (i % 16)
        step(many, 1024, ctx, extra=(1024 * (a + b * ctx) * 20) if i % 9 == 4 else 0)
    assert 0.95 * true <= many.seconds(0, 32768) <= 1.05 * true
    assert many.trimmed == 4
    # Clean steps keep every point.
    clean = cost.PrefillRate(chunk=1024)
    for i in range(8):
        step(clean, 1024, 512 + 1024 * i)
    assert clean.trimmed == 0
    assert abs(clean.seconds(0, 32768) - true) < 1e-6 * true


def test_the_prefill_fit_tells_a_steps_cost_from_a_tokens_and_does_not_reach_past_its_steps(
    ns,
):
    """Run 22 (H100, 32k tokens): the steps timed before the first restore were tails of
    48-144 tokens, about 33 ms each whatever they held; read per token they predicted a
    15.1 s recompute against 4.8 s cold. A step's fixed cost is its own term now, and a
    fit from steps under a quarter of a prefill step predicts nothing (the tier restores
    unweighed). With a warm-up's full chunks it lands within 1.5x at 32k and 127k."""
    cost = ns.load(f"{OFFLOADING}.kv_restore_cost")
    reports = ns.load(f"{OFFLOADING}.kv_restore_reports")
    run22 = cost.PrefillRate(chunk=16384)
    for n, ctx, s in ((48, 1176, 1.1288), (48, 1176, 0.0335), (96, 1176, 0.0329)):
        run22.observe(n, ctx, s)
    run22.coefficients()
    assert run22.trimmed == 1  # the first step's compiles
    assert run22.seconds(0, 32767) is None
    rates = cost.ReadRates()
    rates.on_report(reports.READ_RATE, reports.rank_value(0, int(1.4e9)))
    rates.on_report(reports.KEY_BYTES, reports.rank_value(0, 8 << 20))
    assert cost.weigh(rates, run22, 1, 584, 0, 32767) is None
    # A prefill no longer than the steps seen is predicted from them.
    assert 0.033 / 1.5 <= run22.seconds(0, 96) <= 0.033 * 1.5

    # An 8B-like engine: 20 ms a step, 120 us a token, 1.5 ns a token per token of
    # context; the warm-up compiles on its first step and on the cached-tail step.
    true_c, true_a, true_b = 0.02, 120e-6, 1.5e-9

    def step_s(n, ctx):
        return true_c + true_a * n + true_b * n * ctx

    warm = cost.PrefillRate(chunk=16384)
    warm.observe(4800, 600, step_s(4800, 600) + 40.0)  # the first step's compiles
    warm.observe(16384, 8192, step_s(16384, 8192))
    warm.observe(16384, 24576, step_s(16384, 24576))
    warm.observe(16, 32776, step_s(16, 32776) + 3.0)  # a cached-prefix kernel compiled
    for tokens in (32767, 126975):
        steps = -(-tokens // 16384)
        true = true_c * steps + true_a * tokens + true_b * tokens**2 / 2
        assert true / 1.5 <= warm.seconds(0, tokens) <= 1.5 * true, tokens
    assert warm.trimmed == 2
    estimate = cost.weigh(rates, warm, 1, 584, 0, 32767)
    assert (
        estimate.prefill_fit == warm.coefficients() and len(estimate.prefill_fit) == 3
    )
