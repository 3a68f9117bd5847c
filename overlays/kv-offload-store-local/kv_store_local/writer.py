# SPDX-License-Identifier: Apache-2.0
"""The writer thread: captured keys -> durable chunk files.

Per key: dedup only if the existing file's header verifies and no reader
refused the file this boot; every other key of a job goes into one call of
the native store library (header, CRC, temp, pwrite, fdatasync, rename,
folder fsync on its own threads, the GIL released). The manifests the
durable files complete are published by the ManifestBook. A full disk
pauses the writer.
"""

import errno
import fcntl
import os
import time
from collections.abc import Callable
from typing import Any

from . import durable_io, store_perms
from .budget import DiskBudget, make_room_for_job
from .capture_pool import CapturePool
from .captured import CapturedJob, CapturedKey
from .deps import fmt, init_logger, native
from .job_queue import JobQueue
from .manifests import Ident, ManifestBook
from .pending import PendingFile
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
        self._dirty_dirs: set[str] = set()
        self.manifests = ManifestBook(
            layout,
            namespace,
            rank,
            keep_boundaries,
            self.stats,
            dirty_dirs=self._dirty_dirs,
            on_enospc=self._pause,
            key=key,
        )
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
        self._prepare()
        self.manifests.budget = self.budget  # told of publishes and keep-K

    def distrust(self, ident: Ident) -> None:
        """A reader refused this key's file (bad payload CRC, truncated, ...).

        Its header may still verify, so the writer would keep deduplicating
        onto it: the next capture of the key writes it anew instead, and the
        manifests naming it are published again. Any thread; taken by the
        writer thread when it next processes a job.
        """
        with self._cv:
            self._distrusted.append(ident)

    @property
    def failed(self) -> set[Ident]:
        """Keys whose write failed, or whose file a reader refused, this boot:
        not taken from disk or manifested until written anew in full."""
        return self.manifests.failed

    def _prepare(self) -> None:
        # Every folder of the rank base as the store folder is checked at
        # boot (issue 45): no symlink, no other owner, not writable by others.
        store_perms.check_rank(self.layout)
        self.folders = store_perms.Folders(self.layout.base)
        self.manifests.folders = self.folders
        store_perms.make_dirs(self.layout.manifest_dir)
        durable_io.fsync_dir(self.layout.base)
        durable_io.fsync_dir(self.layout.root)
        self._lock_fd = store_perms.open_lock(self.layout.lock)
        self._pending_file = PendingFile(self.layout)
        # manifests.pending_version the pending record was last built at
        self._pending_version: tuple[int, int] | None = None
        # The budget's first scan reuses what this decodes.
        self.manifests.load_existing(
            None if self.budget is None else self.budget.parsed
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
            self.stats.keys_distrusted += 1
            self.manifests.distrust(ident)
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
        if self.budget is not None and not make_room_for_job(self, job):
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
            ready += self.manifests.register(candidate)
        return ready

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
            version = self.manifests.pending_version
            if self._locked and self._pending_version != version:
                self._pending_file.update(self.manifests.pending_chunks())
                if self.budget is not None and self._pending_file.path:
                    self.budget.landed(self._pending_file.path)
                self._pending_version = version
        finally:
            if self.budget is not None:
                self.budget.record_written()  # rewritten above, or unchanged
            self.manifests.listed = 0
            self._unlock()

    def _publish_ready(self, ready: list[str]) -> None:
        # The library syncs the folders of the files it renames; the rest
        # (new parents, files found on disk or deduplicated onto) here, in
        # one batch, before any manifest can name them.
        if ready or len(self._dirty_dirs) > 4096:
            self._sync_dirs()
        for name in dict.fromkeys(ready):
            self.manifests.publish(name)

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
            path = self.manifests.chunk_path(ident)
            # A key whose write failed, or whose file a reader refused, this
            # boot is never taken from disk: only a complete new write clears it.
            header = None if ident in self.failed else self.manifests.header(ident)
            if header is not None or ident in in_call:
                if header is not None:
                    self.stats.keys_deduplicated += 1
                    self._dirty_dirs.add(os.path.dirname(path))
                    if self.budget is not None:
                        self.budget.reused(path)
                    entry = (header.payload_length, header.payload_checksum)
                    ready += self.manifests.mark_durable(ident, entry)
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
            self.failed.discard(ident)  # written anew in full this boot
            if self.budget is not None:
                self.budget.landed(request.path)
            self.stats.keys_written += 1
            self.stats.bytes_written += item.size
            entry = (item.size, result.payload_checksum)
            ready += self.manifests.mark_durable(ident, entry)
        return ready

    def _failed_write(
        self, ident: Ident, path: str, e: OSError, origin: Any = None
    ) -> None:
        self.manifests.mark_failed(ident)
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
            # is written there (nor taken from there: ManifestBook.header).
            raise OSError(errno.EPERM, f"store folder not safe: {problem}")
        missing = []
        d = directory
        while not os.path.lexists(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            store_perms.make_dir(d)
            # The new entry must be durable before files in it are named.
            self._dirty_dirs.add(os.path.dirname(d))
        self._made_dirs.add(directory)

    def _sync_dirs(self) -> None:
        # Deepest first, so a parent's entry lands after its children's.
        for d in sorted(self._dirty_dirs, key=len, reverse=True):
            durable_io.fsync_dir(d)
        self._dirty_dirs.clear()

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
