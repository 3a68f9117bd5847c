"""kv-offload-restore on the real vLLM 0.33.0 scheduler side.

The real Scheduler, HybridKVCacheCoordinator, OffloadingConnector (scheduler role) and the
TieringOffloadingSpec's managers, with our LocalStoreTier created by vLLM's own factory from
the connector config's ``secondary_tiers`` entry (``module_path``), exactly as a deployment
configures it. The workers are played (realsched.Engine acknowledges transfers); on top of
that, ``Workers`` plays what each rank's WorkerRestore reports through the worker metadata:
READY, the keys its manifests prove (taken from the boundary-manifest candidates the real
scheduler attached to A's store jobs), and its answer to each promotion the scheduler sent
in its real connector metadata. The worker side itself (files, checks, rows) is covered by
tests/python/restore/test_kv_offload_restore.py.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import realsched

OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
TIER = {"type": "LocalStoreTier", "module_path": f"{OFFLOADING}.kv_restore_tier"}
PROMPT = list(range(1, 99))  # 98 tokens: 6 full blocks of 16
MAX_TOKENS = 3  # decode steps schedule MAX_TOKENS - 1 more tokens


@pytest.fixture
def restore_on(knobs, monkeypatch, tmp_path):
    knobs(**{"": "1", "DIR": str(tmp_path / "store"), "CPU_GB": "1", "RESTORE": "1"})
    realsched.use_local_store_tier(monkeypatch)


class Workers:
    """What the ranks' WorkerRestore objects report, through the real worker metadata."""

    def __init__(self, engine, ranks: int, answer: str = "ok"):
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
            kv_restore_reports as reports,
        )

        self.r = reports
        self.ranks = ranks
        self.answer = answer
        self.queued: list[tuple[int, int]] = [(reports.READY, 0)]
        self.promotions: list[dict] = []
        self._this_step: list[dict] = []
        s = engine.s
        schedule, update = s.schedule, s.update_from_output

        def schedule_and_watch():
            out = schedule()
            sent = list(getattr(out.kv_connector_metadata, "kv_restore", None) or [])
            self.promotions += sent
            self._this_step = sent
            return out

        def update_with_reports(out, mro):
            completed = mro.kv_connector_output.kv_connector_worker_meta.completed_jobs
            items = list(self.queued)
            self.queued.clear()
            kind = reports.PROMOTE_OK if self.answer == "ok" else reports.PROMOTE_FAIL
            items += [(kind, p["job"]) for p in self._this_step]
            self._this_step = []
            for k, value in items:  # every rank reports it: vLLM sums the counts
                completed[reports.encode(k, value)] = self.ranks
            return update(out, mro)

        s.schedule = schedule_and_watch
        s.update_from_output = update_with_reports

    def prove(self, keys) -> None:
        self.queued += [(self.r.KEY_UP, self.r.key_digest(k)) for k in keys]


def proven_keys(engine) -> set[bytes]:
    """Every key a published boundary manifest of A's store jobs would prove."""
    keys = set()
    for step in engine.steps:
        for job in step.store_jobs.values():
            for c in (job.kv_store_meta or {}).get("candidates") or []:
                for chunk in c["chain"]:
                    keys |= {chunk + g.to_bytes(4, "big") for g in c["full"]}
                keys |= {c["chain"][-1] + g.to_bytes(4, "big") for g in c["state"]}
    return keys


def tier_of(booted):
    (tier,) = booted.offload.manager.secondary_tiers
    assert type(tier).__name__ == "LocalStoreTier"
    return tier


def write_then_restart(answer: str, drafter: str, eagle: bool):
    """A is served and stored; the engine restarts; B (A's prompt) arrives.

    After the restart neither the GPU prefix cache nor the CPU tier holds anything
    (a reset alone would leave A in the CPU tier), so only the store can serve B.
    """
    first = realsched.boot(drafter=drafter, eagle=eagle)
    engine = realsched.Engine(first)
    Workers(engine, first.vllm_config.parallel_config.world_size)
    engine.add("a", PROMPT, MAX_TOKENS)
    engine.run()
    keys = proven_keys(engine)
    assert keys, "A's store jobs named no boundary manifest"
    realsched.shut_down_booted()  # engine 1 exits before engine 2 boots

    booted = realsched.boot(drafter=drafter, eagle=eagle)
    engine = realsched.Engine(booted)
    workers = Workers(engine, booted.vllm_config.parallel_config.world_size, answer)
    workers.prove(keys)  # the boot scan of every rank: READY and its keys
    engine.add("b", PROMPT, MAX_TOKENS)
    engine.run()
    scheduled = sum(st.scheduled.get("b", 0) for st in engine.steps)
    return (
        booted,
        engine,
        workers,
        scheduled - (MAX_TOKENS - 1),
    )  # prompt tokens computed


def test_a_restart_restores_the_prefix_through_the_real_scheduler(restore_on):
    booted, engine, workers, computed = write_then_restart("ok", "same", eagle=False)
    tier = tier_of(booted)
    assert tier.num_workers == booted.vllm_config.parallel_config.world_size
    assert tier.stats.promotions_ok >= 1 and tier.stats.promotions_failed == 0
    assert workers.promotions and all(p["keys"] for p in workers.promotions)
    (load,) = [j for j in engine.load_jobs if j["req"] == "b"]
    promoted = {k.hex() for p in workers.promotions for k in p["keys"]}
    assert set(load["keys"]) <= promoted  # every loaded key came from the store
    restored = len(PROMPT) - computed
    assert restored > 0 and restored % realsched.BLOCK == 0
    assert "b" in engine.finished


def test_a_failed_promotion_recomputes_and_loads_nothing(restore_on):
    booted, engine, workers, computed = write_then_restart("fail", "same", eagle=False)
    tier = tier_of(booted)
    assert workers.promotions and tier.stats.promotions_failed >= 1
    assert tier.stats.promotions_ok == 0
    assert [j for j in engine.load_jobs if j["req"] == "b"] == []
    assert computed == len(PROMPT)  # every prompt token recomputed
    assert "b" in engine.finished


def test_a_drafter_left_out_of_offload_is_never_marked_loaded(restore_on):
    """EAGLE drafter in its own sliding-window group, not offloaded (DRAFTER=0): the
    restore loads the target groups only, and the connector says so, so vLLM zeroes the
    drafter's new blocks instead of keeping whatever they held (its default, every
    prefix-cacheable group, would mark them loaded)."""
    booted, engine, workers, computed = write_then_restart("ok", "swa", eagle=True)
    groups = booted.kv_cache_config.kv_cache_groups
    drafter = [i for i, g in enumerate(groups) if g.is_eagle_group]
    assert drafter and set(drafter) <= set(
        booted.kv_cache_config.prefix_cacheable_group_ids
    )
    offloaded = [g.group_idx for g in booted.offload.config.kv_group_configs]
    assert not set(drafter) & set(offloaded)
    request = engine.s.requests.get("b") or SimpleNamespace(request_id="b")
    loaded = booted.connector.get_loaded_kv_cache_group_ids(request)
    assert tuple(loaded) == tuple(offloaded)
    (load,) = [j for j in engine.load_jobs if j["req"] == "b"]
    assert computed < len(PROMPT) and "b" in engine.finished


def test_an_eagle_attention_group_restores_to_its_state_boundary(restore_on):
    """Drafter layers in the target's attention group (an EAGLE group). Without lookahead
    hashes (0.33.0) vLLM stores the state one chunk before the attention chunks' end and
    its lookup asks for the chunk after a hit before it drops it: A's jobs name a manifest
    of the full groups alone at that end (until it, no manifest proved that chunk: every
    restore was a miss), so B loads the prefix up to the state boundary, one chunk short
    of A's end. With them (0.34.0) each block's hash covers the drafter's next token, the
    state is stored at the end, and B loads every full block. B computes the rest."""
    booted, engine, workers, computed = write_then_restart("ok", "same", eagle=True)
    (load,) = [j for j in engine.load_jobs if j["req"] == "b"]
    blocks = (len(PROMPT) - 1) // realsched.BLOCK  # six full blocks
    if not booted.vllm_config.num_hash_lookahead_tokens:
        blocks -= 1  # the one the drafter drops
    groups = sorted(int(k[-8:], 16) for k in load["keys"])
    assert groups.count(1) == blocks and groups.count(0) == 1  # attention, state
    assert computed == len(PROMPT) - blocks * realsched.BLOCK
    assert "b" in engine.finished


def test_a_refused_restore_boot_leaves_no_cpu_region(knobs, tmp_path):
    # RESTORE=1 without the LocalStoreTier entry: refused after vLLM made the CPU tier's
    # region in /dev/shm; the refusal shuts the manager down, so the file goes too (the
    # autouse guard in conftest.py fails the test if it stays).
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_restore_worker import (  # noqa: E501
        RestoreRefused,
    )

    knobs(**{"": "1", "CPU_GB": "1", "RESTORE": "1", "DIR": str(tmp_path / "store")})
    before = realsched.offload_regions()
    with pytest.raises(RestoreRefused, match="LocalStoreTier"):
        realsched.boot()
    assert realsched.offload_regions() == before


# --------------------------------------------------------------------------
# Promotions across steps: the real WorkerRestore of every rank, its fence and
# its harvest, driven by the real connector metadata. Only the library's read
# call of one job and its read queue are played (WorkerRestore._prepare builds
# a PlayedRead in place of native.PreparedRead, a PlayedQueue stands in for
# read_queue.ReadQueue and runs it on a thread of its own; the real _queue_read,
# _harvest and _finish drive them): the read writes PROMOTED bytes into this
# rank's slot of the job's CPU rows through the real region, after waiting on
# an event when the test holds it. The played GPU writes STORED bytes into the
# rows of every store job when the worker step submits it.
# test_the_played_queue_is_the_library_s checks the stand-ins' calls against
# read_queue.ReadQueue's and QueuedRead's.

SAFETY_S = 5.0  # a reader the test forgot to release is released after this


def promoted(key: bytes, size: int) -> bytes:
    return (b"P" + bytes(key)[:15]) * (size // 16)


def stored(key: bytes, size: int) -> bytes:
    return (b"S" + bytes(key)[:15]) * (size // 16)


class StubInventory:
    """What the rank's manifests prove (the boot scan's result)."""

    def __init__(self, keys):
        self.proven = set(keys)
        self.manifests: dict = {}
        self.bad: dict = {}

    def keys(self):
        return set(self.proven)

    def scan(self):
        return 0, 0

    def mark_bad(self, key):
        self.proven.discard(key)
        return []


class PlayedTicket:
    """read_queue.QueuedRead's state, poll, wait and cancel over a Python thread."""

    def __init__(self, read, threads, flags, before):
        import threading

        self.state, self.failed, self.seconds = QUEUED, 0, 0.0
        self._lock = threading.Lock()
        self._ran = threading.Event()
        threading.Thread(
            target=self._run, args=(read, threads, flags, before), daemon=True
        ).start()

    def _run(self, read, threads, flags, before):
        if before is not None:  # the queue's order: one call after the other
            before._ran.wait()
        with self._lock:
            if self.state == CANCELLED:
                self._ran.set()
                return
            self.state = RUNNING
        start = time.monotonic()
        read.run(threads, **flags)
        self.seconds = time.monotonic() - start
        self.state = DONE
        self._ran.set()

    @property
    def ended(self) -> bool:
        return self.state in (DONE, CANCELLED)

    @property
    def done(self) -> bool:
        return self.state == DONE

    def poll(self) -> bool:
        return self.wait(0)

    def wait(self, timeout=None) -> bool:
        self._ran.wait(timeout)
        return self.ended

    def cancel(self) -> None:
        with self._lock:
            if self.state == QUEUED:
                self.state = CANCELLED
                self._ran.set()


class PlayedQueue:
    """read_queue.ReadQueue's submit and close: each call on a thread, in order."""

    def __init__(self):
        self._last: PlayedTicket | None = None

    def submit(
        self, read, threads, stop_on_failure=False, willneed=False, safe_folders=False
    ):
        flags = dict(
            stop_on_failure=stop_on_failure,
            willneed=willneed,
            safe_folders=safe_folders,
        )
        self._last = PlayedTicket(read, threads, flags, self._last)
        return self._last

    def close(self) -> None:
        if self._last is not None:
            self._last._ran.wait(SAFETY_S)


QUEUED, RUNNING, DONE, CANCELLED = 0, 1, 2, 3  # read_queue.QUEUED ... CANCELLED


def test_the_played_queue_is_the_library_s():
    """The stand-ins offer read_queue.ReadQueue's and QueuedRead's calls with
    their parameters, and the states are the library's."""
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_format import (
        read_queue,
    )

    assert (QUEUED, RUNNING, DONE, CANCELLED) == (
        read_queue.QUEUED,
        read_queue.RUNNING,
        read_queue.DONE,
        read_queue.CANCELLED,
    )
    for played, real in (
        (PlayedQueue, read_queue.ReadQueue),
        (PlayedTicket, read_queue.QueuedRead),
    ):
        calls = {n for n in vars(real) if not n.startswith("_")} - {"ticket"}
        assert calls <= set(vars(played)), (played, calls - set(vars(played)))
        for name in calls:
            attr = vars(real)[name]
            if callable(attr):
                want = list(inspect.signature(attr).parameters)
                assert list(inspect.signature(vars(played)[name]).parameters) == want


class Ranks:
    """Every rank's real WorkerRestore around the real Scheduler."""

    def __init__(self, engine, keys, read_delay_s: float = 0.0):
        import threading

        from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
            kv_restore_worker as krw,
        )

        self.engine = engine
        self.view = engine.b.offload.manager.primary_tier.get_kv_memoryview()
        self.row = self.view.strides[0]
        self.flat = self.view.cast("B")
        ranks = engine.b.vllm_config.parallel_config.world_size
        self.slot = self.row // ranks
        self.held = threading.Event()
        self.held.set()  # reads run at once unless a test holds them
        self.read_delay_s = read_delay_s
        self.promotions: list[dict] = []
        self.store_rows: dict[int, bytes] = {}  # CPU row -> key stored there
        self.restorers = []
        for rank in range(ranks):
            r = krw.WorkerRestore(rescan_seconds=1e9)
            r._bound = True
            r.inventory = StubInventory(keys)
            # The writer's side of a promotion: owed keys of the rows it takes
            # get their last chance first (nothing owed here).
            r._access = SimpleNamespace(rank=rank, rows_taken=lambda chunks: None)
            r._prepare = self._preparer(krw, rank)
            r._queue = PlayedQueue()
            self.restorers.append(r)
        s = engine.s
        schedule, update = s.schedule, s.update_from_output

        def schedule_and_run_workers():
            out = schedule()
            meta = out.kv_connector_metadata
            self.promotions += list(getattr(meta, "kv_restore", None) or [])
            for r in self.restorers:  # start_kv_transfers: the hook first
                r.promote(meta, None)
            for job in (getattr(meta, "store_jobs", {}) or {}).values():
                keys = job.kv_store_meta["keys"] if job.kv_store_meta else []
                for key, row in zip(keys, job.dst_spec.block_ids, strict=False):
                    self.write(int(row), stored(key, self.slot))
                    self.store_rows[int(row)] = bytes(key)
            return out

        def update_with_reports(out, mro):
            completed = mro.kv_connector_output.kv_connector_worker_meta.completed_jobs
            for r in self.restorers:  # every rank's report, summed as vLLM does
                mine: dict[int, int] = {}
                r.report(mine, None)
                for job_id, count in mine.items():
                    completed[job_id] = completed.get(job_id, 0) + count
            return update(out, mro)

        s.schedule = schedule_and_run_workers
        s.update_from_output = update_with_reports

    def _preparer(self, krw, rank: int):
        ranks = self

        class PlayedRead:
            """native.PreparedRead's run and results, played on the region."""

            def __init__(self, keys, chunks):
                self.keys, self.chunks = keys, chunks

            def run(
                self, threads, stop_on_failure=False, willneed=False, safe_folders=False
            ):
                if not ranks.held.wait(SAFETY_S):
                    ranks.held.set()
                time.sleep(ranks.read_delay_s)
                for key, chunk in zip(self.keys, self.chunks, strict=True):
                    start = int(chunk) * ranks.row + rank * ranks.slot
                    ranks.flat[start : start + ranks.slot] = promoted(key, ranks.slot)

            def results(self):
                ok = krw.native.Result(krw.native.OK, "", "", 0, ranks.slot)
                return [ok] * len(self.keys)

        def prepare(keys, chunks):
            keys = [bytes(k) for k in keys]
            return krw.Promotion(keys, read=PlayedRead(keys, list(chunks)))

        return prepare

    def write(self, row: int, data: bytes) -> None:
        self.flat[row * self.row : row * self.row + len(data)] = data

    def row_bytes(self, row: int) -> bytes:
        return bytes(self.flat[row * self.row : row * self.row + self.slot])

    def in_flight(self) -> bool:
        # (getattr: against a tree whose promotions run in the step, this says
        # False instead of failing on a missing attribute)
        return any(getattr(r, "_running", None) for r in self.restorers)

    def settle(self) -> None:
        self.held.set()
        for r in self.restorers:
            assert r.wait_idle(30)

    def shutdown(self) -> None:
        self.held.set()
        for r in self.restorers:
            r.shutdown()
        self.flat.release()  # the region unmaps at shutdown: no view may stay


def restart_with_ranks(read_delay_s: float = 0.0):
    """A is stored by engine 1; engine 2 boots with every rank's real restorer."""
    first = realsched.boot(drafter="same", eagle=False)
    engine = realsched.Engine(first)
    Workers(engine, first.vllm_config.parallel_config.world_size)
    engine.add("a", PROMPT, MAX_TOKENS)
    engine.run()
    keys = proven_keys(engine)
    realsched.shut_down_booted()
    booted = realsched.boot(drafter="same", eagle=False)
    engine = realsched.Engine(booted)
    return booted, engine, Ranks(engine, keys, read_delay_s)


def step_until(engine, ready, steps: int = 50) -> None:
    for _ in range(steps):
        if ready():
            return
        engine.step()
    raise AssertionError("not reached")


def test_a_promotion_runs_across_steps_while_others_decode(restore_on):
    """B's read is held for several steps: the decoder D is scheduled in each of
    them (the promotion does not hold the step), B waits, then B loads its
    promoted prefix and computes only its tail."""
    booted, engine, ranks = restart_with_ranks()
    engine.add("d", [900 + i for i in range(40)], 30)
    step_until(engine, lambda: "d" in engine.s.requests and engine.steps)
    ranks.held.clear()
    engine.add("b", PROMPT, MAX_TOKENS)
    step_until(engine, lambda: ranks.promotions)
    decoded_while_held = 0
    for _ in range(4):
        record = engine.step()
        assert ranks.in_flight() and not ranks.held.is_set()
        assert "b" not in record.scheduled  # B waits for its KV
        decoded_while_held += record.scheduled.get("d", 0) > 0
    assert decoded_while_held == 4
    ranks.settle()  # release the read and let it end
    engine.run()
    tier = tier_of(booted)
    assert tier.stats.promotions_ok == 1 and tier.stats.promotions_failed == 0
    (load,) = [j for j in engine.load_jobs if j["req"] == "b"]
    promoted_keys = {k.hex() for p in ranks.promotions for k in p["keys"]}
    assert set(load["keys"]) <= promoted_keys
    for row in load["src"]:  # the rows the promotion filled
        assert ranks.row_bytes(row)[:1] == b"P", row
    scheduled_b = sum(st.scheduled.get("b", 0) for st in engine.steps)
    assert scheduled_b < len(PROMPT)  # the prefix came from the store
    assert {"b", "d"} <= engine.finished
    ranks.shutdown()


def test_a_late_read_never_lands_in_a_row_a_reset_reused(restore_on):
    """B's read is held and B is aborted; the connector's cache is reset (vLLM
    frees every CPU row) and C's stores are given rows, B's among them. The
    step that carries the fence waits for B's read before any of its
    transfers, so C's rows keep C's bytes, and nothing of B's is loaded."""
    import threading

    from vllm.v1.request import RequestStatus

    booted, engine, ranks = restart_with_ranks()
    ranks.held.clear()
    engine.add("b", PROMPT, MAX_TOKENS)
    step_until(engine, lambda: ranks.promotions)
    (job,) = ranks.promotions
    engine.s.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    engine.step()
    assert ranks.in_flight() and not ranks.held.is_set()  # the read is held
    assert engine.s.reset_connector_cache()
    tier = tier_of(booted)
    assert tier.stats.promotions_fenced == 1
    release = threading.Timer(0.3, ranks.held.set)
    release.start()
    engine.add("c", [500 + i for i in range(len(PROMPT))], MAX_TOKENS)
    engine.run()
    release.join()
    ranks.settle()
    reused = set(job["chunks"]) & set(ranks.store_rows)
    assert reused, "no store was given a row of the fenced promotion"
    for row in reused:  # the late read did not overwrite C's bytes
        key = ranks.store_rows[row]
        assert ranks.row_bytes(row) == stored(key, ranks.slot), row
    assert sum(r.stats.jobs_fenced for r in ranks.restorers) == len(ranks.restorers)
    assert tier.stats.promotions_ok == 0
    loaded = {k for j in engine.load_jobs for k in j["keys"]}
    assert not loaded & {k.hex() for k in job["keys"]}
    ranks.shutdown()


def test_rows_of_a_promotion_in_flight_are_never_reused(restore_on):
    """B is aborted while its read is held, and C stores meanwhile: the manager
    keeps B's rows allocated until every rank reported, so C is never given
    one; after the read the promoted rows serve E (A's prompt again)."""
    from vllm.v1.request import RequestStatus

    booted, engine, ranks = restart_with_ranks()
    ranks.held.clear()
    engine.add("b", PROMPT, MAX_TOKENS)
    step_until(engine, lambda: ranks.promotions)
    (job,) = ranks.promotions
    engine.s.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    engine.add("c", [500 + i for i in range(len(PROMPT))], MAX_TOKENS)
    for _ in range(6):
        engine.step()
        assert ranks.in_flight()
    assert ranks.store_rows and not set(job["chunks"]) & set(ranks.store_rows)
    ranks.settle()  # release the read and let it end
    engine.run()
    ranks.settle()
    engine.step()
    tier = tier_of(booted)
    assert tier.stats.promotions_ok == 1
    engine.add("e", PROMPT, MAX_TOKENS)
    engine.run()
    (load,) = [j for j in engine.load_jobs if j["req"] == "e"]
    for row in load["src"]:
        assert ranks.row_bytes(row)[:1] == b"P", row
    ranks.shutdown()


@pytest.mark.parametrize("store", ["slow", "fast"])
def test_a_restore_that_reads_slower_than_recompute_is_a_miss(restore_on, store):
    """The engine measures both rates itself: W's prefill and B's promotion (read in 0.4 s from the slow
    store, at once from the fast one). After a reset only the store holds A's
    prefix: E (A's prompt) is weighed; from the slow store reading is predicted
    slower than recomputing, so the tier answers MISS, counts and logs it, and E
    recomputes; from the fast one E restores. The played model takes 50 us a
    token (5 ms for E's prompt: a read from the fast store is about 0.5 ms;
    as fast as Python, one step was as quick as the read, a coin toss)."""
    booted, engine, ranks = restart_with_ranks(0.4 if store == "slow" else 0.0)
    engine.token_seconds = 50e-6
    tier = tier_of(booted)
    engine.add("w", [700 + i for i in range(len(PROMPT))], MAX_TOKENS)
    engine.run()
    assert tier.prefill.steps >= 1  # W's prefill step was timed
    engine.add("b", PROMPT, MAX_TOKENS)
    step_until(engine, lambda: ranks.promotions)
    ranks.settle()  # the read ends (0.4 s on the slow store)
    engine.run()
    assert tier.stats.promotions_ok == 1  # no read rate yet: restored
    assert tier.stats.restores_unmeasured >= 1 and tier.stats.restores_weighed == 0
    assert all(r.stats.read_rate > 0 for r in ranks.restorers)
    assert engine.s.reset_prefix_cache(reset_connector=True)  # GPU and CPU
    engine.step()
    engine.add("e", PROMPT, MAX_TOKENS)
    engine.step()
    ranks.settle()
    engine.run()
    estimate = tier.stats.last_estimate
    assert tier.stats.restores_weighed == 1 and estimate is not None
    assert estimate["tokens"] > 0 and estimate["keys"] > 0
    computed = sum(st.scheduled.get("e", 0) for st in engine.steps)
    loads = [j for j in engine.load_jobs if j["req"] == "e"]
    if store == "slow":
        assert estimate["read_s"] > estimate["recompute_s"]
        assert not estimate["restore"] and tier.stats.restores_declined == 1
        assert tier.stats.promotions_ok == 1  # no promotion for E
        assert loads == [] and computed >= len(PROMPT)
    else:
        assert estimate["restore"] and tier.stats.restores_declined == 0
        assert tier.stats.promotions_ok == 2 and len(loads) == 1
    ranks.shutdown()
