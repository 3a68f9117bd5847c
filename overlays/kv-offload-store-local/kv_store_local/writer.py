# SPDX-License-Identifier: Apache-2.0
"""The writer thread: captured keys -> durable chunk files.

Per key: dedup only if the existing file's header verifies and no reader
refused the file this boot; every other key of a job goes into one call of
the native store library (header, CRC, temp, pwrite, fdatasync, rename,
folder fsync on its own threads, the GIL released). A full disk pauses the
writer.

Data flows one way: the writer hands each result to the ledger (a file
written, found, failed; folders synced), asks the book which manifests the
durable files complete, has the publisher write those, tells the published
names, the ledger and the disk budget what was published, and runs keep-K.
"""

import errno
import fcntl
import os
import time
from collections.abc import Callable
from typing import Any

from . import durable_io, store_perms
from .budget import DiskBudget, admit_job
from .capture_pool import CapturePool
from .captured import CapturedJob, CapturedKey
from .chunk_lookup import ChunkLookup
from .deps import fmt, init_logger, native
from .job_queue import JobQueue
from .keep_k import KeepK
from .ledger import ChunkLedger, Entry, Ident
from .manifests import ManifestBook
from .pending import PendingFile
from .published import PublishedIndex
from .publisher import Publisher
from .stats import StoreStats

logger = init_logger(__name__)


class StoreWriter(JobQueue):
    """Owns one rank's store directory and the thread that writes it.

    Every method but ``submit``/``accepting``/``close``/``wait_idle`` runs on
    the writer thread (or in tests, via ``process``/``drain``).
    """

    def __init__(
        self,
        layout: fmt.StoreLayout,
        namespace: bytes,
        rank: int,
        pool: CapturePool,
        keep_boundaries: int,
        *,
        stats: StoreStats | None = None,
        pause_seconds: float = 30.0,
        resume_probe: Callable[[], bool] | None = None,
        min_free_bytes: int = 1 << 30,
        on_lost: Callable[[Any, str], None] | None = None,
        on_idle: Callable[[], None] | None = None,
        on_job_done: Callable[[], None] | None = None,
        store_lib: "native.Library",
        write_threads: int = 4,
        disk_bytes: int | None = None,
        key: bytes | None = None,
    ):
        self.layout = layout
        # A keyed store's secret (FORMAT.md 3.6): every chunk and manifest is
        # sealed with it, every header taken from disk must carry its flag.
        self.key = key
        self.namespace = namespace
        self.rank = rank
        self.pool = pool
        self.stats = stats or StoreStats()
        self.pause_seconds = pause_seconds
        self.min_free_bytes = min_free_bytes
        self.resume_probe = resume_probe or self._enough_space
        # Told (origin, reason) of every captured key not written, so the
        # capture side can take it again while staging still holds it.
        self.on_lost = on_lost
        # Called on the writer thread whenever its queue runs empty, and
        # after each job it processed (its capture memory is free then).
        self.on_idle = on_idle
        self.on_job_done = on_job_done
        self._in_job_done = False
        # The native store library (kv_store_format.native.Library): the only
        # writer of chunk files (tests inject faults through its own seam,
        # Library.test_fault).
        self.store_lib = store_lib
        self.write_threads = write_threads
        self._made_dirs: set[str] = set()
        self.paused_until: float | None = None
        super().__init__(f"kv-store-writer-r{rank}", pause_seconds)
        self._lock_fd: int | None = None
        self._locked = False
        # Keys whose files a reader refused (``distrust``), under self._cv.
        self._distrusted: list[Ident] = []
        # GLM53_KV_OFFLOAD_DISK_GB: None leaves the store unbounded.
        self.budget = (
            None
            if disk_bytes is None
            else DiskBudget(layout, disk_bytes, self.stats, key)
        )
        self._prepare(keep_boundaries)

    def distrust(self, ident: Ident) -> None:
        """A reader refused this key's file (bad payload CRC, truncated, ...).

        Its header may still verify, so the writer would keep deduplicating
        onto it: the next capture of the key writes it anew instead, and the
        manifests naming it are published again. Any thread; taken by the
        writer thread when it next processes a job.
        """
        with self._cv:
            self._distrusted.append(ident)

    def _prepare(self, keep_boundaries: int) -> None:
        # Every folder of the rank base as the store folder is checked at
        # boot (issue 45): no symlink, no other owner, not writable by others.
        store_perms.check_rank(self.layout)
        self.folders = store_perms.Folders(self.layout.base)
        store_perms.make_dirs(self.layout.manifest_dir)
        durable_io.fsync_dir(self.layout.base)
        durable_io.fsync_dir(self.layout.root)
        self._lock_fd = store_perms.open_lock(self.layout.lock)
        self._pending_file = PendingFile(self.layout)
        # book.pending_version the pending record was last built at
        self._pending_version: tuple[int, int, int] | None = None
        layout, key = self.layout, self.key
        # What the writer knows of its files and manifests, one part each.
        self.lookup = ChunkLookup(layout, self.namespace, key, self.folders)
        self.ledger = ChunkLedger(self.stats)
        self.published = PublishedIndex()
        self.book = ManifestBook(self.ledger, self.lookup, self.published, self.stats)
        self.publisher = Publisher(
            layout, self.namespace, self.rank, key, self.lookup, self.ledger, self.stats
        )
        self.keep_k = KeepK(
            layout,
            key,
            keep_boundaries,
            self.published,
            self.ledger,
            self.stats,
            self.budget,
        )
        # The budget's first scan reuses what this decodes.
        self.published.load(
            layout, key, None if self.budget is None else self.budget.parsed
        )

    # -- JobQueue hooks ------------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self.paused_until is None and not self._stop

    def _close_resources(self) -> None:
        self._pending_file.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _timed_out(self) -> None:
        if self.paused_until is not None:
            self.maybe_resume()
        else:
            self._idle()  # retry what is due

    def _failed_job(self, job: CapturedJob) -> None:
        logger.exception("KV store: writer failed on job %d", job.job_id)
        if self.budget is not None:
            self.budget.stale = True  # what it left on disk: a rescan says
        for item in job.keys:
            if not item.freed:
                self.stats.keys_lost_writer_error += 1
                self._free(item)
                self._lost(item.origin, "writer_error")

    def _idle(self) -> None:
        if self.on_idle is not None:
            try:
                self.on_idle()
            except Exception:
                logger.exception("KV store: idle recapture failed")

    # -- writer thread -------------------------------------------------------

    def process(self, job: CapturedJob) -> None:
        """Write this job's chunks, then publish the manifests they complete."""
        try:
            self._process(job)
        finally:
            if self.budget is not None:
                self.budget.settle()  # the job's files are in its index now

    def _process(self, job: CapturedJob) -> None:
        if self.budget is not None and not self._locked:
            # Between bursts, nothing in flight: what exited writers left
            # (temps, pending records) goes, as a sweep would remove it.
            assert self._lock_fd is not None
            self.budget.remove_stale(self._lock_fd, self._pending_file.path)
        self._lock_shared()
        with self._cv:
            distrusted, self._distrusted = self._distrusted, []
        for ident in distrusted:
            # It counts as failed, and the manifests whose chain holds its key
            # are forgotten as published, so their candidates publish them
            # again under the same names (new files, which a reader that
            # marked the old ones bad reads again).
            self.stats.keys_distrusted += 1
            self.ledger.failed(ident)
            for name in self.published.naming(ident[0].hex()):
                self.published.forget(name)
        ready: list[str] = []
        # Without a disk budget, the job's candidates are registered after
        # its keys are written: they then find those in the book instead of
        # looking for each on disk (a job's candidate names its whole chain).
        # The budget weighs the pending candidates, so with it they come first.
        late = self.budget is None
        if not late:
            ready += self._register(job)
        if self.paused_until is not None and not self.maybe_resume():
            if late:
                ready += self._register(job)
            self._drop_paused(job.keys)
            self._publish_ready(ready)
            return
        if self.budget is not None and not self._make_room(job):
            self._publish_ready(ready)
            return
        ready += self._write(job)
        if late:
            ready += self._register(job)
        self._publish_ready(ready)
        self._job_done()

    def _register(self, job: CapturedJob) -> list[str]:
        # Candidates are tracked even while paused: the keys they wait for
        # may be captured again once space is back.
        ready: list[str] = []
        for candidate in job.candidates:
            ready += self.book.register(candidate)
        return ready

    def _make_room(self, job: CapturedJob) -> bool:
        """Room for the job under the disk budget, or its keys refused. The
        trees retired for it are forgotten here."""
        assert self.budget is not None
        ok, retired = admit_job(
            self.budget,
            job,
            self.keep_k.keep,
            self.key is not None,
            self.ledger.listed,
            self.book.pending_chunks,
        )
        for tree in retired:
            for path in tree.manifests:
                self.published.forget(os.path.basename(path))
        for tree in retired:
            for ident in tree.chunks.values():
                self.ledger.removed(ident)
        if not ok:
            self.stats.writes_refused_disk_budget += 1
            self.stats.keys_refused_disk_budget += len(job.keys)
            for item in job.keys:
                self._free(item)
                self._lost(item.origin, "disk_budget")
        return ok

    def _job_done(self) -> None:
        # Not from inside itself: without a thread (tests) the job it submits
        # is processed in place, within this call.
        if self.on_job_done is None or self._in_job_done:
            return
        self._in_job_done = True
        try:
            self.on_job_done()
        except Exception:
            logger.exception("KV store: recapture after a job failed")
        finally:
            self._in_job_done = False

    def flush(self) -> None:
        """The queue ran empty: sync what is left, rewrite the pending
        record, drop the lock."""
        try:
            self._sync_dirs()
            version = self.book.pending_version
            if self._locked and self._pending_version != version:
                self._pending_file.update(self.book.pending_chunks())
                if self.budget is not None and self._pending_file.path:
                    self.budget.landed(self._pending_file.path)
                self._pending_version = version
        finally:
            if self.budget is not None:
                self.budget.record_written()  # rewritten above, or unchanged
            self.ledger.record_written()
            self._unlock()

    def _publish_ready(self, ready: list[str]) -> None:
        # The library syncs the folders of the files it renames; the rest
        # (new parents, files found on disk or deduplicated onto) here, in
        # one batch, before any manifest can name them.
        if ready or self.ledger.dirty_count > 4096:
            self._sync_dirs()
        for name in dict.fromkeys(ready):
            self._publish(name)

    def _publish(self, name: str) -> None:
        candidate = self.book.take(name)
        if candidate is None:
            return
        try:
            done = self.publisher.publish(candidate)
        except (OSError, fmt.FormatError) as e:
            if self.budget is not None:
                self.budget.stale = True  # renamed before its sync failed?
            self.stats.manifests_dropped += 1
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                self._pause()
            logger.warning("KV store: publishing manifest %s failed: %s", name, e)
            return
        if done is None:
            return  # a named file missing or changed: counted, logged
        self.stats.manifests_published += 1
        if self.budget is not None:
            self.budget.published(done.path, done.manifest)
        self.published.add(name, done.manifest.chain)
        self.ledger.published(done.named)
        self.keep_k.retain(done.manifest)

    def _free(self, item: CapturedKey) -> None:
        if item.freed:
            return  # a failed job is released whole after some keys went
        item.freed = True
        self.pool.free(item.offset)

    def _lock_shared(self) -> None:
        # Shared lock from reusing/writing chunks until the manifests naming
        # them are published: kvstore gc --sweep takes it exclusively.
        if not self._locked:
            assert self._lock_fd is not None
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
            self._locked = True

    def _unlock(self) -> None:
        if self._locked:
            assert self._lock_fd is not None
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            self._locked = False

    def _drop_paused(self, keys: list[CapturedKey]) -> None:
        self.stats.keys_dropped_paused += len(keys)
        for item in keys:
            self._free(item)
            self._lost(item.origin, "paused")

    def _lost(self, origin: Any, reason: str) -> None:
        if self.on_lost is not None:
            self.on_lost(origin, reason)

    # -- chunks --------------------------------------------------------------

    def _write(self, job: CapturedJob) -> list[str]:
        """Dedup here, then every other key of the job in one library call;
        the manifests its durable files complete."""
        ready: list[str] = []
        requests: list[Any] = []
        writing: list[CapturedKey] = []
        # A key already in this call: a later duplicate in the job waits.
        in_call: set[Ident] = set()
        for item in job.keys:
            ident = (item.hash, item.group)
            path = self.lookup.path(ident)
            # A key whose write failed, or whose file a reader refused, this
            # boot is never taken from disk: only a complete new write clears it.
            failed = self.ledger.is_failed(ident)
            header = None if failed else self.lookup.header(ident)
            if header is not None or ident in in_call:
                if header is not None:
                    self.stats.keys_deduplicated += 1
                    if self.budget is not None:
                        self.budget.reused(path)
                    entry = (header.payload_length, header.payload_checksum)
                    # Its folder is synced before a manifest names it.
                    self.ledger.found(ident, entry, os.path.dirname(path))
                    ready += self.book.completed(ident)
                self._free(item)
                continue
            try:
                self._make_dirs(os.path.dirname(path))
            except OSError as e:
                self._free(item)
                self._failed_write(ident, path, e, item.origin)
                continue
            in_call.add(ident)
            requests.append(
                native.WriteRequest(
                    path=path,
                    group=item.group,
                    namespace_hash=self.namespace,
                    key_hash=item.hash,
                    boundary=item.boundary,
                    segments=item.segments,
                    runs=[(self.pool.address + item.offset, item.size)],
                )
            )
            writing.append(item)
        if not requests:
            return ready
        start = time.perf_counter()
        try:
            # The group knob's 0640 (store_perms), as for every other file:
            # the library's default is 0600.
            results = self.store_lib.write_chunks(
                requests,
                self.write_threads,
                group_read=store_perms.current().group_read,
                key=self.key,
                rank=self.rank,
            )
        finally:
            for item in writing:
                self._free(item)
        self.stats.write_seconds += time.perf_counter() - start
        for item, request, result in zip(writing, requests, results, strict=True):
            ident = (item.hash, item.group)
            if not result.ok:
                code = (
                    errno.ENOSPC
                    if result.status == native.E_NO_SPACE
                    else result.sys_errno or errno.EIO
                )
                self._failed_write(
                    ident, request.path, OSError(code, result.message), item.origin
                )
                continue
            if self.budget is not None:
                self.budget.landed(request.path)
            self.stats.keys_written += 1
            self.stats.bytes_written += item.size
            entry: Entry = (item.size, result.payload_checksum)
            self.ledger.written(ident, entry)  # in full: no longer failed
            ready += self.book.completed(ident)
        return ready

    def _failed_write(
        self, ident: Ident, path: str, e: OSError, origin: Any = None
    ) -> None:
        self.ledger.failed(ident)
        self.stats.keys_failed += 1
        if self.budget is not None:
            self.budget.stale = True  # a file the library could not remove?
        if e.errno == errno.ENOSPC:
            self._pause()
        logger.warning(
            "KV store: writing %s failed (%s); no manifest names this key until "
            "it is written again in full",
            path,
            e,
        )
        self._lost(origin, "write_failed")

    def _make_dirs(self, directory: str) -> None:
        if directory in self._made_dirs:
            return
        problem = self.folders.problem(directory)
        if problem is not None:
            # A chunk folder made a symlink, or changeable by others: nothing
            # is written there (nor taken from there: ChunkLookup.header).
            raise OSError(errno.EPERM, f"store folder not safe: {problem}")
        missing = []
        d = directory
        while not os.path.lexists(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            store_perms.make_dir(d)
            # The new entry must be durable before files in it are named.
            self.ledger.folder_made(os.path.dirname(d))
        self._made_dirs.add(directory)

    def _sync_dirs(self) -> None:
        folders = self.ledger.dirty_folders()  # deepest first
        for d in folders:
            durable_io.fsync_dir(d)
        self.ledger.synced(folders)

    # -- disk full -----------------------------------------------------------

    def _pause(self) -> None:
        self.paused_until = time.monotonic() + self.pause_seconds
        self.stats.enospc_pauses += 1
        logger.warning(
            "KV store: disk full under %s; writer paused, stores are dropped "
            "until space returns",
            self.layout.base,
        )

    def _enough_space(self) -> bool:
        st = os.statvfs(self.layout.base)
        return st.f_bavail * st.f_frsize >= self.min_free_bytes

    def maybe_resume(self) -> bool:
        if self.paused_until is None:
            return True
        if time.monotonic() < self.paused_until:
            return False
        if not self.resume_probe():
            self.paused_until = time.monotonic() + self.pause_seconds
            return False
        self.paused_until = None
        logger.info(
            "KV store: space is back under %s; writer resumed", self.layout.base
        )
        return True
