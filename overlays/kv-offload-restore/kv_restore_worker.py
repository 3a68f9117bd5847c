# SPDX-License-Identifier: Apache-2.0
"""Restore, worker side: this rank's inventory and its promotions.

Every TP worker reads only its own store (the rank base the writer opened):

- **Inventory** (kv_restore_inventory): which key each good manifest proves,
  kept current by a rescan; changes go to the scheduler as KEY_UP / KEY_DOWN
  reports (kv_restore_reports), READY once the boot scan is complete.
- **Promotion.** The scheduler's tier sends (job, keys, CPU chunk ids). The
  worker takes the store lock shared (``kvstore gc --sweep`` needs it
  exclusive) and finds every file the job needs. One call of the native
  store library (libkvtier_store.so, no GIL, ``READERS`` threads) then
  opens and reads the job's files; per file: the header is checked in
  docs/FORMAT.md's order and against the manifest entry (namespace, group,
  key, boundary index, payload length and checksum, segment table equal to
  this boot's layout), then the file size;
  then the payload is read straight into this rank's own slots of the job's
  CPU row (rows the tiering manager allocated for this promotion, loadable
  only once every rank succeeded) and its CRC is checked. Any failure fails
  the job on this rank: the manifests naming the key are marked bad (their
  keys go down) and the scheduler turns the whole job, on every rank, into a
  miss; its rows are freed unread. A refused file is handed to this rank's
  writer (``distrust``): the recompute's store writes it anew and publishes
  the manifests naming it again, so the keys come back up.

Promotions run across steps, like vLLM's own loads: the step that carries
one takes the lock, finds the job's files and builds the library's items (no
I/O but the lock's), then queues the one read call on this rank's read queue
(the library's own thread, jobs in order) and steps on; the first step that
finds it finished checks the results and reports them. No Python thread
takes part in a read: one that needed the GIL to start or end it waited
behind the stepping engine thread, which keeps the GIL for as long as a
promotion runs (a 0.1 s read of the page cache took 1.0 s; docs/ENGINE-RUNS.md,
runs 37-38). The job's CPU
rows stay allocated to it in the tiering manager until every rank reported,
so no other transfer is given them while a read may still land. A cache
reset releases them at once (vLLM's reset frees every row), so the first
step after it carries the fenced job ids and this rank waits for those reads
(queued ones are cancelled) before it submits any transfer of that step.
Chunk files are immutable (temp + rename), so a file the library opened
before keep-K unlinks it still reads as the verified bytes; one unlinked
before that open is a miss.

The store is used only through its RestoreAccess
(kv_store_local/restore_access.py): layout, namespace, key, rank, groups,
staging rows, the writer's ``rows_taken``/``distrust``, the budget's hold.

Modules: kv_restore_inventory (the manifests and the keys they prove),
kv_restore_read (a job's chunk files checked and read into memory by the
native library), and this one
(the knob, the counters, the promotions and the hooks' entry points).
"""

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

try:
    from . import kv_restore_read as chunk_read
    from . import kv_restore_reports as reports
    from . import kv_store_format as fmt
    from .kv_restore_inventory import Inventory, Proof
    from .kv_restore_rows import RowPlans
    from .kv_store_format import native, read_queue
    from .kv_store_local import store_perms
    from .kv_store_local.restore_access import StoreNotOpen
except ImportError:  # loaded as a top-level module: tests, tools
    import kv_restore_read as chunk_read  # type: ignore[no-redef]
    import kv_restore_reports as reports  # type: ignore[no-redef]
    import kv_store_format as fmt  # type: ignore[no-redef]
    from kv_restore_inventory import Inventory, Proof  # type: ignore[no-redef]
    from kv_restore_rows import RowPlans  # type: ignore[no-redef]
    from kv_store_format import native, read_queue  # type: ignore[no-redef]
    from kv_store_local import store_perms  # type: ignore[no-redef]
    from kv_store_local.restore_access import (  # type: ignore[no-redef]
        StoreNotOpen,
    )

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        OffloadingConnectorMetadata,
    )

    from .kv_store_local.restore_access import RestoreAccess
    from .kv_store_local.worker_store import WorkerStore

logger = logging.getLogger(__name__)

ENV_RESTORE = "GLM53_KV_OFFLOAD_RESTORE"
RESCAN_SECONDS = 1.0
# Threads of the native read of one job: 16 read the page cache fastest in
# bench/restore_read_bench.py on the H100 host (31 GB/s against 27 at 8) and
# cost nothing on its NVMe (the plain read is disk-bound from 4 threads).
READERS = 16
JOB_READS_KEPT = 32
# fadvise(WILLNEED) each payload before its read: off until a disk run shows
# it pays (bench/restore_bench.py evicts the page cache; set it there).
READ_WILLNEED = False
# Failures that say nothing against the chunk file: no rewrite is asked for.
NOT_THE_FILE = frozenset({"no_manifest", "unknown_group"})
RATE_WEIGHT = 0.5  # weight of the newest job in the read-rate average


class RestoreRefused(ValueError):
    """GLM53_KV_OFFLOAD_RESTORE=1 cannot be honoured by this deployment."""


def load_native() -> "native.Library":
    """The store library the reads run on; RestoreRefused (a boot error
    naming the file) when it is missing or of another version: restore never
    falls back to a Python read."""
    try:
        return native.load()
    except native.NativeLibraryError as e:
        raise RestoreRefused(f"KV restore needs the store library: {e}") from e


def restore_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Read GLM53_KV_OFFLOAD_RESTORE strictly: unset/0 off, 1 on."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_RESTORE)
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise RestoreRefused(f"{ENV_RESTORE} must be unset, '0' or '1'; got {value!r}.")


def key_scheme_refusal(fenced: Mapping[str, Any]) -> str | None:
    """Why a store's keys may not mean the same thing after a restart, or None.

    The writer fences ``key_scheme`` = {"hash": algorithm, "seed": policy} in
    the namespace (kv_store_local.namespace.key_scheme): a store without it,
    or whose keys were seeded per process, is never read.
    """
    scheme = fenced.get("key_scheme")
    if (
        not isinstance(scheme, Mapping)
        or not isinstance(scheme.get("hash"), str)
        or not isinstance(scheme.get("seed"), str)
    ):
        return "the namespace does not fence the key scheme (written before it did)"
    if scheme["seed"] == "per-process":
        return (
            f"its keys were seeded per process ({scheme['hash']} without "
            "PYTHONHASHSEED): they never match after a restart"
        )
    return None


@dataclass
class RestoreStats:
    """This rank's restore counters; the GPU suite's probe records them by
    these names (docs/engine/run*-results.json), so they stay one flat record."""

    manifests_loaded: int = 0
    manifests_rejected: int = 0
    manifests_marked_bad: int = 0
    jobs_ok: int = 0
    jobs_failed: int = 0
    keys_restored: int = 0
    bytes_restored: int = 0
    read_seconds: float = 0.0
    failures: Counter = field(default_factory=Counter)  # per failure reason
    # Jobs a cache reset fenced: cancelled before they started, or waited for.
    jobs_fenced: int = 0
    # This rank's read rate (bytes/s, recent jobs weighted up) and bytes per
    # key: reported to the scheduler, which weighs a restore against recompute.
    read_rate: float = 0.0
    key_bytes: float = 0.0
    # The newest jobs' reads, (keys, bytes, seconds) each: a slow job among
    # fast ones shows here where the sums above hide it.
    job_reads: list = field(default_factory=list)


@dataclass
class Promotion:
    """One promotion job on this rank: what the step's thread prepared, its
    queued read call, and what it holds until the step that reports it lets
    go (the store lock, the disk budget's hold)."""

    keys: list[bytes]
    proofs: list[Proof] = field(default_factory=list)
    manifests: set[str] = field(default_factory=set)
    read: "native.PreparedRead | None" = None
    queued: "read_queue.QueuedRead | None" = None
    failure: "chunk_read.PromotionFailed | None" = None  # found while preparing
    bytes: int = 0
    seconds: float = 0.0
    hold: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def release(self) -> None:
        self.hold.close()

    @property
    def ended(self) -> bool:
        """Nothing of it runs any more (one refused while preparing never ran)."""
        return self.queued is None or self.queued.poll()

    @property
    def cancelled(self) -> bool:
        """Its read ended without running to the end (cancelled, or a queue
        closed under it): none of its rows may be used."""
        return self.queued is not None and self.queued.ended and not self.queued.done


class WorkerRestore:
    """The worker-side object the hooks call. Never raises into vLLM."""

    def __init__(self, rescan_seconds: float = RESCAN_SECONDS):
        self.rescan_seconds = rescan_seconds
        self.stats = RestoreStats()
        self.inventory: Inventory | None = None
        self.disabled_reason: str | None = None
        self._bound = False
        # This rank's store, as the store overlay lets restore use it.
        self._access: RestoreAccess | None = None
        self._reported: set[bytes] = set()
        self._pending: list[tuple[int, int]] = []
        self._ready_sent = False
        self._last_scan = 0.0
        self._lock_path = ""
        self._namespace = b""
        self._key: bytes | None = None
        self._rank = 0  # the rank whose store this reads: a v3 seal binds it
        self._native = load_native()
        self._rows: RowPlans | None = None  # where each file's payload lands
        # The library's thread runs the promotions' read calls in order
        # (opened at bind). Job id -> the job, oldest first.
        self._queue: read_queue.ReadQueue | None = None
        self._running: dict[int, Promotion] = {}
        # The inventory is read and changed on the step's thread only; the
        # lock keeps tools that scan from another thread safe.
        self._lock = threading.Lock()
        # Test seam: called on the step's thread with the job's proofs (its
        # files found, the store lock held) before its read is queued.
        self.before_read: Any = None

    @classmethod
    def from_env(cls) -> "WorkerRestore | None":
        return cls() if restore_requested() else None

    # -- binding to this rank's writer ---------------------------------------

    def bind(self, store: "WorkerStore | None") -> None:
        """Use the store the writer opened (same rank base, same namespace),
        through its RestoreAccess only. Runs at the worker's boot (the
        restore-bind hook): a rank that cannot read its store refuses the boot
        (RestoreRefused), never serves on with restore off."""
        if self._bound:
            return
        self._bound = True
        try:
            if store is None:
                raise StoreNotOpen("no active writer")
            access = store.restore_access()
        except StoreNotOpen as e:
            raise RestoreRefused(
                f"GLM53_KV_OFFLOAD_RESTORE=1 is refused on this rank: its store is "
                f"not open ({e.reason})"
            ) from None
        self._access = access
        layout = access.layout
        # Chunks are inputs: never read a store others can change (the store
        # folder and above, the rank base, manifests/, pending/; a chunk
        # file's two folders in the library's read call: READ_SAFE_FOLDERS).
        unsafe = store_perms.rank_problem(layout)
        if unsafe is not None:
            raise RestoreRefused(
                f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: store folder not safe: {unsafe}"
            )
        try:
            record = fmt.decode_namespace_record(
                fmt.read_regular(layout.namespace_record, fmt.MAX_RECORD_BYTES)
            )
        except (OSError, fmt.FormatError) as e:
            raise RestoreRefused(
                f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: namespace record unreadable: {e}"
            ) from None
        refusal = key_scheme_refusal(record.fenced)
        if refusal is not None:
            raise RestoreRefused(f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: {refusal}")
        if record.namespace_hash != access.namespace:
            raise RestoreRefused(
                "GLM53_KV_OFFLOAD_RESTORE=1 is refused: the namespace record differs "
                "from the writer's namespace"
            )
        self._namespace = access.namespace
        # A keyed store (FORMAT.md 3.6): every manifest and chunk is opened with
        # the writer's key, its MAC checked before a byte of it is used.
        self._key = access.key
        self._rank = access.rank
        self._lock_path = layout.lock
        self._rows = RowPlans(access)
        try:
            self._queue = read_queue.ReadQueue(self._native)
        except native.NativeLibraryError as e:
            raise RestoreRefused(
                f"GLM53_KV_OFFLOAD_RESTORE=1 is refused: {e}"
            ) from None
        self.inventory = Inventory(
            layout.manifest_dir, access.namespace, access.rank, self._key
        )
        self._scan()
        logger.info(
            "KV restore: rank %d serves %d manifests from %s",
            access.rank,
            len(self.inventory.manifests),
            layout.base,
        )

    def _disable(self, reason: str) -> None:
        self.disabled_reason = reason
        self.inventory = None
        logger.warning("KV restore: off on this rank (every lookup misses): %s", reason)

    @property
    def active(self) -> bool:
        return self.inventory is not None

    def _scan(self) -> None:
        assert self.inventory is not None
        with self._lock:
            loaded, rejected = self.inventory.scan()
        self.stats.manifests_loaded += loaded
        self.stats.manifests_rejected += rejected
        self._last_scan = time.monotonic()

    # -- hooks -----------------------------------------------------------------

    def report(
        self, completed: MutableMapping[int, int], store: "WorkerStore | None"
    ) -> None:
        """Add this rank's reports to the worker metadata of this step."""
        try:
            self.bind(store)
            if (
                self.inventory is not None
                and time.monotonic() - self._last_scan >= self.rescan_seconds
            ):
                self._scan()
            self._harvest()
            out = list(self._pending)
            self._pending.clear()
            if not self._ready_sent:
                out.append((reports.READY, 0))
                self._ready_sent = True
            with self._lock:
                current = self.inventory.keys() if self.inventory else set()
            out += [
                (reports.KEY_UP, reports.key_digest(k))
                for k in current - self._reported
            ]
            out += [
                (reports.KEY_DOWN, reports.key_digest(k))
                for k in self._reported - current
            ]
            self._reported = current
            reports.add(completed, out)
        except Exception:
            logger.exception("KV restore: report failed")

    def promote(
        self, metadata: "OffloadingConnectorMetadata", store: "WorkerStore | None"
    ) -> None:
        """Start the promotions the scheduler attached to this step's metadata.

        Runs before the step submits any transfer. A fenced job (its rows were
        freed by a cache reset) is cancelled if it has not started, else
        waited for, so no read of it lands after this point. Each new job is
        prepared here (``_prepare``) and its read call queued in the library;
        its result is reported by a later step.
        """
        fenced = getattr(metadata, "kv_restore_fence", None)
        if fenced:
            self._fence(fenced)
        requests = getattr(metadata, "kv_restore", None)
        if not requests:
            return
        self.bind(store)
        for request in requests:
            keys, chunks = list(request["keys"]), list(request["chunks"])
            # The promotion overwrites these rows: keys the writer still owes
            # from them (their earlier bytes) get their last chance first.
            if self._access is not None:
                self._access.rows_taken(chunks)
            job = self._prepare(keys, chunks)
            self._queue_read(job)
            self._running[request["job"]] = job

    def _measured(self, nbytes: int, seconds: float, keys: int) -> None:
        """A job read ``nbytes`` in ``seconds``: this rank's rates, reported."""
        w = RATE_WEIGHT if self.stats.read_rate else 1.0
        s = self.stats
        s.read_rate = (1 - w) * s.read_rate + w * nbytes / seconds
        s.key_bytes = (1 - w) * s.key_bytes + w * nbytes / max(keys, 1)
        s.job_reads = [*s.job_reads, (keys, nbytes, round(seconds, 6))][
            -JOB_READS_KEPT:
        ]
        rank = self._access.rank if self._access is not None else 0
        self._pending += [
            (reports.READ_RATE, reports.rank_value(rank, s.read_rate)),
            (reports.KEY_BYTES, reports.rank_value(rank, s.key_bytes)),
        ]

    def _fence(self, job_ids: Sequence[int]) -> None:
        jobs = [self._running[j] for j in job_ids if j in self._running]
        for job in jobs:
            if job.queued is not None:
                job.queued.cancel()  # only one that has not started
        for job in jobs:
            if job.queued is not None:
                job.queued.wait()
        self.stats.jobs_fenced += len(jobs)
        self._harvest()

    def _harvest(self) -> None:
        """Check and report every finished job (the step's thread)."""
        done = [j for j, job in self._running.items() if job.ended]
        for job_id in done:
            job = self._running.pop(job_id)
            ok = False if job.cancelled else self._finish(job)
            job.release()
            self.stats.jobs_ok += ok
            self.stats.jobs_failed += not ok
            if ok and job.bytes > 0 and job.seconds > 0:
                self._measured(job.bytes, job.seconds, len(job.keys))
            self._pending.append(
                (reports.PROMOTE_OK if ok else reports.PROMOTE_FAIL, job_id)
            )

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait for every started promotion and take its result (tools, tests,
        shutdown). False if some were still running after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in list(self._running.values()):
            if job.queued is not None:
                left = (
                    None if deadline is None else max(0.0, deadline - time.monotonic())
                )
                job.queued.wait(left)
        self._harvest()
        return not self._running

    def shutdown(self) -> None:
        """Cancel queued promotions and wait for the running one: no read may
        land in the CPU region after the worker lets go of it."""
        for job in self._running.values():
            if job.queued is not None:
                job.queued.cancel()
        self.wait_idle()
        if self._queue is not None:
            self._queue.close()

    # -- one promotion ---------------------------------------------------------

    def _prepare(self, keys: Sequence[bytes], chunks: Sequence[int]) -> "Promotion":
        """The step's thread: take the store lock shared, find every file the
        job needs and build the read call's items. Nothing here waits: a busy
        lock, a key no manifest proves, any other problem fails the job now
        (the step that finds it done reports it)."""
        job = Promotion([bytes(k) for k in keys])
        if self.inventory is None or len(keys) != len(chunks):
            job.failure = chunk_read.PromotionFailed("restore_off", "restore is off")
            return job
        try:
            lock_fd = store_perms.open_or_create(self._lock_path, os.O_RDWR)
            job.hold.callback(os.close, lock_fd)  # closing releases the lock
            try:
                # Never wait for a sweep on the serving path: a busy lock is a miss.
                fcntl.flock(lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                job.failure = chunk_read.PromotionFailed("lock_busy", "store lock busy")
                return job
            located = [(k, int(c), *self._locate(k)) for k, c in zip(job.keys, chunks)]
            assert self._access is not None
            # The disk budget never deletes a file read here.
            job.hold.enter_context(self._access.hold(path for *_, path in located))
            job.manifests = {p.manifest for _, _, p, _ in located}
            job.proofs = [p for _, _, p, _ in located]
            job.read = chunk_read.prepare_job(
                self._native, self._requests(located), self._key, rank=self._rank
            )
        except chunk_read.PromotionFailed as e:
            job.failure = e
        except Exception as e:  # never into vLLM's step
            logger.exception("KV restore: preparing a promotion failed")
            job.failure = chunk_read.PromotionFailed("internal_error", str(e))
        return job

    def _queue_read(self, job: "Promotion") -> None:
        """The step's thread: the job's one read call into the library's
        queue (a job refused while preparing has none)."""
        if job.read is None:
            return
        if self.before_read is not None:
            self.before_read(job.proofs)
        assert self._queue is not None
        try:
            job.queued = chunk_read.queue_job(
                self._queue, job.read, READERS, READ_WILLNEED
            )
        except ValueError as e:  # the library refused the call: a bug, not a file
            logger.error("KV restore: promotion failed: %s", e)
            job.failure = chunk_read.PromotionFailed("internal_error", str(e))

    def _finish(self, job: "Promotion") -> bool:
        """The step's thread: a finished job's verdict, counted and applied."""
        try:
            if job.failure is not None:
                raise job.failure
            assert job.read is not None and job.queued is not None
            job.seconds = job.queued.seconds
            job.bytes = chunk_read.job_bytes(job.keys, job.read.results())
        except chunk_read.PromotionFailed as e:
            self.stats.failures[e.reason] += 1
            self._apply_failure(e)
            return False
        if job.manifests:
            assert self._access is not None
            self._access.touch(job.manifests)
        self.stats.bytes_restored += job.bytes
        self.stats.read_seconds += job.seconds
        self.stats.keys_restored += len(job.keys)
        return True

    def _locate(self, key: bytes) -> tuple[Proof, str]:
        """The manifest entry proving the key and its chunk file's path. The
        library opens the file (no link followed, regular files only) and
        checks its folders inside the one read call."""
        assert self.inventory is not None
        with self._lock:
            proof = self.inventory.proof(key)
        if proof is None:
            raise chunk_read.PromotionFailed(
                "no_manifest", "no manifest of this rank proves it", key
            )
        assert self._access is not None and self._rows is not None
        if proof.group not in self._rows.groups:
            raise chunk_read.PromotionFailed(
                "unknown_group", f"group {proof.group}", key
            )
        return proof, self._access.layout.chunk(proof.key_hex, proof.group)

    def _requests(
        self, located: Sequence[tuple[bytes, int, Proof, str]]
    ) -> list["native.ReadRequest"]:
        """What each file must be and where its payload goes."""
        assert self._rows is not None
        return [
            self._rows.request(chunk, proof, path, self._namespace)
            for _, chunk, proof, path in located
        ]

    def _apply_failure(self, e: chunk_read.PromotionFailed) -> None:
        names: list[str] = []
        if e.key is not None and self.inventory is not None:
            with self._lock:
                names = self.inventory.mark_bad(e.key)
            self.stats.manifests_marked_bad += len(names)
        if e.key is not None and e.reason not in NOT_THE_FILE:
            assert self._access is not None
            # The header may still verify: without this the writer would keep
            # deduplicating onto the bad file and the keys would stay down.
            self._access.distrust((e.key[:-4], int.from_bytes(e.key[-4:], "big")))
        logger.warning(
            "KV restore: promotion failed (%s: %s); manifests marked bad: %s; "
            "the request recomputes",
            e.reason,
            e,
            names,
        )
