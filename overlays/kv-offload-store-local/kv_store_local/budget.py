# SPDX-License-Identifier: Apache-2.0
"""The disk budget (``GLM53_KV_OFFLOAD_DISK_GB``): retire least recently used
chain trees so the rank's store stays under it (docs/FORMAT.md section 8.1).

A chain tree is every manifest whose chain starts with the same key (one
conversation and its forks, the unit keep-K already works in). Its recency
is the newest manifest mtime: publishing sets it, a restore sets it again
(``touch``), so it survives a restart. The writer keeps an index of the base
(store_index.py) current from its own writes; this module decides when to
evict and what, and when only a rescan will do; and it removes what writers
that exited left (temps, pending records: they count against the budget
too). Runs on the writer thread; ``hold`` and ``touch`` come from the
restore, on the engine's step thread.
"""

import errno
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from . import durable_io
from .deps import fmt, init_logger
from .store_index import Parsed, StoreIndex, Tree, scan

if TYPE_CHECKING:
    from .captured import CapturedJob

logger = init_logger(__name__)

# Tree and scan are the index's, named here too (the bench, the demo and the
# tests call budget.scan).
__all__ = [
    "DiskBudget",
    "Tree",
    "admit_job",
    "job_bytes",
    "low_water",
    "plan",
    "scan",
]


def plan(
    view: StoreIndex, limit: int, incoming: int, protected: set[str]
) -> tuple[list[Tree], int]:
    """The trees to retire, oldest first (ties by root), until ``used +
    incoming <= limit``; and the bytes that frees. Protected roots are skipped.
    """
    retired: list[Tree] = []
    freed = 0
    gone: set[str] = set()
    for tree in sorted(view.trees.values(), key=lambda t: (t.recency_ns, t.root)):
        if view.used - freed + incoming <= limit:
            break
        if tree.root in protected:
            continue
        gone.add(tree.root)
        retired.append(tree)
        freed += sum(tree.manifests.values())
        freed += sum(
            view.sizes.get(c, 0) for c in tree.chunks if view.named_by[c] <= gone
        )
    return retired, freed


# When a write would cross the budget the writer frees down to this fraction
# below it (its low-water mark), so it evicts once per 1/64 of the budget
# written, not once per job. `kvstore gc --max-bytes LOW` plans what the
# writer retires (LOW = budget - budget // 64).
LOW_WATER_DIVISOR = 64

# The index is rebuilt by a scan at least this often (seconds, checked only
# when the budget must evict): it catches what no generation reports (an
# operator's rm, a restore in another process touching manifests).
RESCAN_SECONDS = 600.0

# After a job refused because no eviction could make room, what exited
# writers left is looked for again at most this often (seconds): each look
# is a scan of the base under LOCK_EX.
STALE_SECONDS = 60.0


def low_water(limit: int) -> int:
    return limit - limit // LOW_WATER_DIVISOR


def _lock_generation(layout: fmt.StoreLayout) -> tuple[int, int] | None:
    """``kvstore gc --sweep`` moves .lock's mtime forward after deleting
    (FORMAT.md 8): (inode, mtime) changes when a sweep ran."""
    try:
        st = os.stat(layout.lock, follow_symlinks=False)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def _other_live_writer(layout: fmt.StoreLayout) -> bool:
    """Another process writes this base (its pending record is locked): its
    files are not in this index, so each eviction rescans."""
    try:
        names = os.listdir(layout.pending_dir)
    except OSError:
        return False
    for name in names:
        try:
            pid, _ = fmt.parse_pending_file_name(name)
        except fmt.FormatError:
            continue
        if pid == os.getpid():
            continue  # ours: flock would conflict with our own fd
        try:
            fd = os.open(
                os.path.join(layout.pending_dir, name),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            )
        except OSError:
            continue  # gone: that writer exited and a sweep took its record
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            continue
        finally:
            os.close(fd)  # releases the probe's lock too
    return False


class DiskBudget:
    def __init__(
        self,
        layout: fmt.StoreLayout,
        limit: int,
        stats,
        key: bytes | None = None,
        *,
        rescan_seconds: float = RESCAN_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.key = key  # a keyed store's: its manifests open with it
        self.layout = layout
        self.limit = limit
        self.low = low_water(limit)
        self.stats = stats
        self.rescan_seconds = rescan_seconds
        self._clock = clock
        self.index: StoreIndex | None = None  # seeded by the first job's scan
        self.scans = 0
        self.scan_seconds = 0.0  # spent in them (bench/budget_bench.py prints it)
        self._scanned_at = 0.0
        self._generation: tuple[int, int] | None = None
        # Set when the writer cannot say what a failure left on disk.
        self.stale = False
        # Manifests decoded, by name: the book's boot read fills it first.
        self.parsed: Parsed = {}
        # Job id -> its upper bound, while its files may be in flight.
        self._reserved: dict[int, int] = {}
        # The pending record's growth the admitted jobs may cause: counted
        # until the writer rewrites the record (at its next flush).
        self._record_reserved = 0
        # Look for what exited writers left (below) before the first job,
        # and again after a refusal no eviction could have avoided.
        self._stale_due = True
        self._stale_at: float | None = None
        self._held: dict[str, int] = {}  # chunk path -> promotions reading it
        # Manifest paths a restore touched since the last eviction (a set:
        # a budget far from full may not evict for hours), under self._lock.
        self._touched: set[str] = set()
        self._lock = threading.Lock()

    # -- the restore's (the step thread) ------------------------------------

    @contextmanager
    def hold(self, paths: Iterable[str]) -> Iterator[None]:
        """A promotion reads these files: no eviction deletes them meanwhile.
        A file gone before the hold is a miss, as for any vanished file."""
        paths = list(paths)
        with self._lock:
            for p in paths:
                self._held[p] = self._held.get(p, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                for p in paths:
                    if self._held[p] == 1:
                        del self._held[p]
                    else:
                        self._held[p] -= 1

    def touch(self, names: Iterable[str]) -> None:
        """A restore used these manifests: their mtime is their recency
        (FORMAT.md 8.1), so it outlives this process. A manifest gone
        meanwhile was retired: nothing to mark. The index learns the new
        mtimes on the writer thread, before its next eviction."""
        touched = set()
        for name in names:
            path = os.path.join(self.layout.manifest_dir, name)
            try:
                os.utime(path)
            except OSError:
                continue
            touched.add(path)
        with self._lock:
            self._touched |= touched

    # -- the writer's events (writer thread) ---------------------------------

    def landed(self, path: str) -> None:
        if self.index is not None:
            self.index.wrote(path)

    def reused(self, path: str) -> None:
        if self.index is not None:
            self.index.reused(path)

    def published(self, path: str, manifest: fmt.BoundaryManifest) -> None:
        if self.index is not None:
            self.index.published(path, manifest)

    def removed(self, path: str) -> None:
        if self.index is not None:
            self.index.gone(path)

    def reserve(self, job_id: int, nbytes: int) -> None:
        """A job admitted: its bound counts until ``settle`` (its files may
        be temps, or renamed but not yet told to the index)."""
        self._reserved[job_id] = self._reserved.get(job_id, 0) + nbytes

    def reserve_record(self, nbytes: int) -> None:
        """What the pending record may grow by until it is rewritten
        (``record_written``): the newest bound replaces the one before."""
        self._record_reserved = nbytes

    def record_written(self) -> None:
        """The writer rewrote its pending record (or had nothing to add): its
        size is the index's now."""
        self._record_reserved = 0

    def settle(self) -> None:
        """Every job's files are in the index (the library's call returned)."""
        self._reserved = {}

    @property
    def reserved(self) -> int:
        return sum(self._reserved.values()) + self._record_reserved

    @property
    def estimate(self) -> int | None:
        """An upper bound of the bytes under the base now (None: no scan yet)."""
        if self.index is None:
            return None
        return self.index.used + self.reserved

    # -- evicting ------------------------------------------------------------

    def rescan(self) -> StoreIndex:
        start = time.perf_counter()
        self._generation = _lock_generation(self.layout)  # before: a sweep
        # during the scan shows at the next check
        self.index = scan(self.layout, self.parsed, own_pid=os.getpid(), key=self.key)
        self.scans += 1
        self.scan_seconds += time.perf_counter() - start
        self._scanned_at = self._clock()
        self.stale = False
        return self.index

    def _must_rescan(self) -> bool:
        return (
            self.stale
            or self._clock() - self._scanned_at >= self.rescan_seconds
            or _lock_generation(self.layout) != self._generation
            or _other_live_writer(self.layout)
        )

    def make_room(
        self,
        incoming: int,
        pending: Iterable[tuple[int, str]] | Callable[[], Iterable[tuple[int, str]]],
        roots: Iterable[str] = (),
    ) -> tuple[bool, list[Tree]]:
        """When ``incoming`` more bytes would cross the budget, retire LRU
        trees until they fit under the low-water mark: (whether they fit
        under the budget, the trees retired). They may not fit when everything
        left is protected: trees naming a pending-record chunk (``pending``,
        or a callable giving them, asked only when evicting) or a held file
        are never retired."""
        index = self.index if self.index is not None else self.rescan()
        reserved = self.reserved
        if index.used + reserved + incoming <= self.limit:
            return True, []
        if self._must_rescan():
            index = self.rescan()
            if index.used + reserved + incoming <= self.limit:
                return True, []
        with self._lock:
            touched, self._touched = self._touched, set()
        for path in touched:
            index.touched(path)
        pinned = {
            self.layout.chunk(key, group)
            for group, key in (pending() if callable(pending) else pending)
        }
        with self._lock:
            pinned |= set(self._held)
            protected = set(roots)
            for chunk in pinned:
                protected |= index.named_by.get(chunk, set())
            # Retiring every tree it may retire: would that make room? If not,
            # nothing is retired (issue 45: orphans, temps and pending
            # records alone past the budget made it delete every chain and
            # refuse the write anyway).
            _, freeable = plan(index, -1, 0, protected)
            if index.used - freeable + reserved + incoming > self.limit:
                self._futile(index.used, freeable, reserved + incoming)
                return False, []
            retired, _ = plan(index, self.low, incoming + reserved, protected)
            self._retire(index, retired)
        return index.used + reserved + incoming <= self.limit, retired

    def _futile(self, used: int, freeable: int, wanted: int) -> None:
        self.stats.evictions_skipped += 1
        self._stale_due = True
        n = self.stats.evictions_skipped
        if n & (n - 1) == 0:  # the 1st, 2nd, 4th, ... time: loud but bounded
            logger.warning(
                "KV store: disk budget %d bytes under %s: %d held, of which the "
                "chain trees it may retire hold %d; %d more do not fit even "
                "with all of them gone, so nothing was evicted and the job was "
                "refused (%d times so far). The rest are files no chain tree "
                "names (orphans, temps, pending records: `kvstore gc --sweep` "
                "removes them) or chains in use",
                self.limit,
                self.layout.base,
                used,
                freeable,
                wanted,
                n,
            )

    def remove_stale(self, lock_fd: int, own_record: str | None) -> None:
        """Between jobs (no lock held, nothing in flight): when due, take
        LOCK_EX without waiting, scan the base, and remove every temp and
        every exited writer's pending record (below), as a sweep would.
        A busy lock: tried again at a later job."""
        now = self._clock()
        if not self._stale_due or (
            self._stale_at is not None and now - self._stale_at < STALE_SECONDS
        ):
            return
        self._stale_at = now
        index = self.rescan()  # the budget's scan: its first is at this job
        records = _dead_pending_records(self.layout, own_record)
        if not index.temps and not records:
            self._stale_due = False
            return
        # Unlinked under LOCK_EX only: then no writer has a temp in flight,
        # so every temp the scan saw (or a later one of the same name) is
        # stale (the sweep's rule, FORMAT.md 8 step 3).
        removed = _remove_under_exclusive_lock(lock_fd, index.temps, records)
        if removed is None:
            return  # a sweep, a restore or another writer: a later job
        self._stale_due = False
        freed = sum(index.sizes.get(p, 0) for p in removed)
        for path in removed:
            index.gone(path)
        self.stats.stale_files_removed += len(removed)
        if removed:
            logger.info(
                "KV store: removed %d files exited writers left under %s "
                "(temps, pending records; %d bytes)",
                len(removed),
                self.layout.base,
                freed,
            )

    def _retire(self, index: StoreIndex, retired: list[Tree]) -> None:
        """FORMAT.md 8: every manifest first, their folder synced, then the
        chunks only they named, each folder synced."""
        if not retired:
            return
        gone = {t.root for t in retired}
        doomed = {
            t.root: [c for c in sorted(t.chunks) if index.named_by[c] <= gone]
            for t in retired
        }
        self.stale = True  # until the index says what the unlinks left
        for tree in retired:
            for path in tree.manifests:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        durable_io.fsync_dir(self.layout.manifest_dir)
        dirs: set[str] = set()
        freed = sum(sum(t.manifests.values()) for t in retired)
        for tree in retired:
            for chunk in doomed[tree.root]:
                try:
                    os.unlink(chunk)
                except FileNotFoundError:
                    continue  # named by two retired trees: already gone
                freed += index.sizes.get(chunk, 0)
                dirs.add(os.path.dirname(chunk))
        for d in dirs:
            durable_io.fsync_dir(d)
        for tree in retired:
            index.drop_tree(tree.root, doomed[tree.root])
        self.stale = False
        self.stats.chain_trees_evicted += len(retired)
        self.stats.manifests_evicted += sum(len(t.manifests) for t in retired)
        self.stats.bytes_evicted += freed


# -- what writers that exited left (issue 45) ------------------------------
# Their temps and pending records count against the budget, and only
# `kvstore gc --sweep` removed them: a store whose dead files alone passed the
# budget refused every write. The writer removes them by the sweep's own rule
# (FORMAT.md 8, step 3): a temp only while LOCK_EX on .lock is held (every
# writer holds LOCK_SH while it has one in flight), a pending record only
# once nobody holds its flock. It takes LOCK_EX without waiting, between its
# jobs (no lock held, nothing in flight): if a sweep, a restore or another
# writer holds the lock, it tries again later.


def _exited(path: str) -> bool:
    """The writer of this pending record has exited: nobody holds its flock
    (a crash releases it). Anything that cannot be opened is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live writer holds it (or it cannot be locked)
    finally:
        os.close(fd)
    return True


def _dead_pending_records(layout: fmt.StoreLayout, own: str | None) -> list[str]:
    """Paths of the pending records whose writer exited (never ``own``)."""
    try:
        names = sorted(os.listdir(layout.pending_dir))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            fmt.parse_pending_file_name(name)
        except fmt.FormatError:
            continue  # a temp or a foreign file: not a record
        path = os.path.join(layout.pending_dir, name)
        if path != own and _exited(path):
            out.append(path)
    return out


def _remove_under_exclusive_lock(
    lock_fd: int, temps: list[str], records: list[str]
) -> list[str] | None:
    """Unlink ``temps`` (every temp under the base) and ``records`` (exited
    writers' pending records) while holding ``LOCK_EX`` on ``lock_fd``, taken
    without waiting; None when the lock is busy (nothing removed). Returns
    the paths removed; the folders they were in are synced."""
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    removed: list[str] = []
    try:
        for path in [*temps, *records]:
            if path in records and not _exited(path):
                continue  # a writer took its name again meanwhile
            try:
                os.unlink(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    logger.warning("KV store: cannot remove %s: %s", path, e)
                continue
            removed.append(path)
        for folder in sorted({os.path.dirname(p) for p in removed}):
            fd = fmt.open_nofollow(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
    return removed


# A manifest's canonical JSON: its fixed fields, then per chain key (64 hex
# and separators) and per entry (key, length, checksum): upper bounds.
_MANIFEST_BASE = 512
_MANIFEST_PER_KEY = 72
_MANIFEST_PER_ENTRY = 120


def job_bytes(job: "CapturedJob", keep: int, keyed: bool = False) -> int:
    """An upper bound of what a job adds: every key as a new chunk file (a
    deduplicated one adds nothing; a keyed store's carries its 32-byte MAC)
    and the manifests it may publish. With keep-K on, a tree holds at most
    K+1 new manifests at once (retain runs after each publish), so only the
    K+1 largest per tree count. The pending record's share is
    ``record_bytes``'s."""
    total = 0
    mac = fmt.MAC_SIZE if keyed else 0
    for item in job.keys:
        header = fmt.FIXED_HEADER_SIZE + fmt.HEADER_CHECKSUM_SIZE
        total += header + fmt.SEGMENT_ENTRY_SIZE * len(item.segments) + item.size
        total += mac
    per_tree: dict[bytes, list[int]] = {}
    for c in job.candidates:
        entries = len(c.chain) * len(c.full) + len(c.state)
        size = (
            _MANIFEST_BASE
            + _MANIFEST_PER_KEY * len(c.chain)
            + _MANIFEST_PER_ENTRY * entries
        )
        per_tree.setdefault(c.chain[0] if c.chain else b"", []).append(size)
    for sizes in per_tree.values():
        sizes.sort(reverse=True)
        total += sum(sizes if keep == 0 else sizes[: keep + 1])
    return total


# A pending record entry: ``[<group>,"<key hex>"],`` (FORMAT.md 9.1).
_RECORD_PER_ENTRY = 10


def record_bytes(job: "CapturedJob", listed: int) -> int:
    """What the writer's pending record may grow by before its next rewrite:
    an entry for each key of the job (written or reused, not yet named by a
    manifest) and for each one listed since the record was last written
    (``ChunkLedger.listed``: earlier jobs' keys, chunks a candidate found
    on disk)."""
    widths = [len(item.hash) for item in job.keys]
    widths += [len(c.chain[-1]) for c in job.candidates if c.chain]
    width = 2 * max(widths, default=32) + _RECORD_PER_ENTRY
    return (len(job.keys) + listed) * width


def admit_job(
    budget: DiskBudget,
    job: "CapturedJob",
    keep: int,
    keyed: bool,
    listed: int,
    pending: Callable[[], list[tuple[int, str]]],
) -> tuple[bool, list[Tree]]:
    """Room for the job under the budget (its bound reserved), or not; and
    the trees retired to make it, which the writer forgets. ``listed``:
    entries the pending record gained since its last rewrite (the ledger's);
    ``pending``: what the record lists now (never retired)."""
    record = record_bytes(job, listed)
    incoming = job_bytes(job, keep, keyed) + record
    roots = {c.chain[0].hex() for c in job.candidates if c.chain}
    ok, retired = budget.make_room(incoming, pending, roots)
    if ok:
        budget.reserve(job.job_id, incoming - record)
        budget.reserve_record(record)
    return ok, retired
