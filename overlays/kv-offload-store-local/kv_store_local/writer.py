# SPDX-License-Identifier: Apache-2.0
"""The writer thread: captured keys -> durable chunk files.

Per key: dedup only if the existing file's header verifies; else header +
payload into a temp file and start its writeback. A job's files are fsynced
and renamed on an I/O thread while the next job is staged; the manifests
they complete are published by the ManifestBook. ENOSPC pauses the writer.
"""

import errno
import fcntl
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from . import durable_io
from .capture_pool import CapturePool
from .captured import CapturedJob, CapturedKey
from .checksum import Checksummer, default_checksum_threads
from .deps import fmt, init_logger
from .durable_io import StagedFile
from .manifests import Ident, ManifestBook
from .pending import PendingFile
from .stats import StoreStats

logger = init_logger(__name__)


class StoreWriter:
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
        checksum_threads: int | None = None,
    ):
        self.layout = layout
        self.namespace = namespace
        self.rank = rank
        self.pool = pool
        self.stats = stats or StoreStats()
        self.pause_seconds = pause_seconds
        self.min_free_bytes = min_free_bytes
        self.resume_probe = resume_probe or self._enough_space
        self._dirty_dirs: set[str] = set()
        self.manifests = ManifestBook(
            layout,
            namespace,
            rank,
            keep_boundaries,
            self.stats,
            dirty_dirs=self._dirty_dirs,
            on_enospc=self._pause,
        )
        self._made_dirs: set[str] = set()
        self.paused_until: float | None = None
        self._queue: deque[CapturedJob] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._busy = False
        self._lock_fd: int | None = None
        self._locked = False
        # Files written but not yet synced, and the I/O thread syncing them.
        self._io: ThreadPoolExecutor | None = None
        self._io_batch: tuple[list[StagedFile], Future] | None = None
        self._staged: set[Ident] = set()
        self._checksums = Checksummer(
            checksum_threads
            if checksum_threads is not None
            else default_checksum_threads()
        )
        self._prepare()

    @property
    def failed(self) -> set[Ident]:
        """Keys whose write failed this boot: never written or manifested."""
        return self.manifests.failed

    def _prepare(self) -> None:
        os.makedirs(self.layout.manifest_dir, exist_ok=True)
        durable_io.fsync_dir(self.layout.base)
        durable_io.fsync_dir(self.layout.root)
        self._lock_fd = os.open(self.layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
        self._pending_file = PendingFile(self.layout)
        self.manifests.load_existing()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"kv-store-writer-r{self.rank}", daemon=True
        )
        self._thread.start()

    # -- serving-side API ----------------------------------------------------

    @property
    def accepting(self) -> bool:
        return self.paused_until is None and not self._stop

    def submit(self, job: CapturedJob) -> None:
        with self._cv:
            self._queue.append(job)
            self._cv.notify()
        if self._thread is None:
            self.drain()  # no thread (tests, bench): write right here

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until every submitted job has been processed."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the queued jobs, waiting at most ``timeout`` seconds."""
        with self._cv:
            self._stop = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            if self._io is not None:
                self._io.shutdown(wait=True)
            self._checksums.close()
            self._pending_file.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def drain(self) -> None:
        """Process every queued job on the calling thread (tests, bench)."""
        while True:
            with self._cv:
                if not self._queue:
                    break
                job = self._queue.popleft()
            self.process(job)
        self.flush()

    # -- writer thread -------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._cv.wait(timeout=self.pause_seconds)
                    if self.paused_until is not None:
                        break
                if self._stop and not self._queue:
                    return
                job = self._queue.popleft() if self._queue else None
                self._busy = job is not None
            if job is not None:
                try:
                    self.process(job)
                except Exception:
                    logger.exception("KV store: writer failed on job %d", job.job_id)
                    self._release(job)
                finally:
                    with self._cv:
                        idle = not self._queue
                    if idle:
                        self._flush_logged()
                    with self._cv:
                        self._busy = False
                        self._cv.notify_all()
            elif self.paused_until is not None:
                self.maybe_resume()

    def process(self, job: CapturedJob) -> None:
        """Stage this job's files, then commit the previous job's.

        Committing one job late lets the disk write back job N-1 while job
        N's checksums are computed and its bytes copied into the page cache;
        ``flush`` commits the rest once the queue is empty.
        """
        if self.paused_until is not None and not self.maybe_resume():
            self.stats.keys_dropped_paused += len(job.keys)
            self._release(job)
            return
        # Checksums of this job, and of the next one while this one is
        # written (the serving side only appends to the queue).
        self._start_checksums(job)
        with self._cv:
            following = self._queue[0] if self._queue else None
        if following is not None:
            self._start_checksums(following)
        self._lock_shared()
        ready: list[str] = []
        for candidate in job.candidates:
            ready += self.manifests.register(candidate)
        staged: list[StagedFile] = []
        for index, item in enumerate(job.keys):
            if self.paused_until is not None:
                rest = job.keys[index:]
                self.stats.keys_dropped_paused += len(rest)
                for left in rest:
                    self._free(left)
                break
            try:
                result = self._stage_key(item)
            finally:
                self._free(item)  # the page cache holds it now
            if isinstance(result, StagedFile):
                staged.append(result)
                self._staged.add(result.ident)
            elif result is not None:
                ready += self.manifests.mark_durable((item.hash, item.group), result)
        # The previous job's files are synced by now (or we wait for them);
        # this job's are synced on the I/O thread while the next one stages.
        ready += self._join_commit()
        self._start_commit(staged)
        self._publish_ready(ready)

    def flush(self) -> None:
        """Commit what is staged, publish what it completes, drop the lock."""
        try:
            ready = self._join_commit()
            self._sync_dirs()
            self._publish_ready(ready)
            if self._locked:
                self._pending_file.update(self.manifests.pending_chunks())
        finally:
            self._unlock()

    def _publish_ready(self, ready: list[str]) -> None:
        # Directories are synced in batches: the I/O thread syncs the
        # directories of each batch it renames; the rest (new parents, files
        # found on disk) here, once, before any manifest can name them.
        if ready or len(self._dirty_dirs) > 4096:
            self._sync_dirs()
        for name in dict.fromkeys(ready):
            self.manifests.publish(name)

    def _start_checksums(self, job: CapturedJob) -> None:
        for item in job.keys:
            if item.checksum is None:
                item.checksum = self._checksums.start(
                    self.pool.view(item.offset, item.size)
                )

    def _free(self, item: CapturedKey) -> None:
        if item.freed:
            return  # a failed job is released whole after some keys went
        item.freed = True
        if item.checksum is not None:
            item.checksum.settle()  # no checksum thread still reads the bytes
            item.checksum = None
        self.pool.free(item.offset)

    def _flush_logged(self) -> None:
        try:
            self.flush()
        except Exception:
            logger.exception("KV store: writer failed committing staged files")

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

    def _release(self, job: CapturedJob) -> None:
        for item in job.keys:
            self._free(item)

    # -- chunks --------------------------------------------------------------

    def _stage_key(self, item: CapturedKey) -> StagedFile | tuple[int, int] | None:
        """Dedup, or write the key's temp file and start its writeback.

        Returns the verified (length, checksum) of a file already there, a
        staged temp file to commit, or None when the key is not written.
        """
        ident = (item.hash, item.group)
        if ident in self.failed or ident in self._staged:
            return None  # failed this boot, or already on its way to disk
        path = self.layout.chunk(item.hash.hex(), item.group)
        header = self.manifests.header(ident)
        if header is not None:
            # Dedup only on a header that verifies; anything else is rewritten.
            self.stats.keys_deduplicated += 1
            self._dirty_dirs.add(os.path.dirname(path))
            return header.payload_length, header.payload_checksum
        start = time.perf_counter()
        try:
            self._make_dirs(os.path.dirname(path))
            payload = self.pool.view(item.offset, item.size)
            if item.checksum is None:
                item.checksum = self._checksums.start(payload)
            header = fmt.ChunkHeader(
                namespace_hash=self.namespace,
                group=item.group,
                key_hash=item.hash,
                boundary=item.boundary,
                segments=tuple(item.segments),
                payload_length=len(payload),
                payload_checksum=item.checksum.result(),
            )
            fd, tmp = durable_io.write_chunk_file(
                path, fmt.encode_header(header), payload
            )
        except OSError as e:
            self._failed_write(ident, path, e)
            return None
        self.stats.write_seconds += time.perf_counter() - start
        return StagedFile(ident, path, tmp, fd, header, item.size)

    def _start_commit(self, staged: list[StagedFile]) -> None:
        """fsync + rename on the I/O thread while this thread stages more."""
        assert self._io_batch is None
        if staged:
            if self._io is None:
                self._io = ThreadPoolExecutor(1, thread_name_prefix="kv-store-sync")
            self._io_batch = (
                staged,
                self._io.submit(durable_io.sync_and_rename, staged),
            )

    def _join_commit(self) -> list[str]:
        if self._io_batch is None:
            return []
        staged, future = self._io_batch
        self._io_batch = None
        future.result()
        ready: list[str] = []
        for f in staged:
            self._staged.discard(f.ident)
            if f.error is not None:
                self._failed_write(f.ident, f.path, f.error)
                continue
            self.stats.keys_written += 1
            self.stats.bytes_written += f.size
            entry = (f.header.payload_length, f.header.payload_checksum)
            ready += self.manifests.mark_durable(f.ident, entry)
        return ready

    def _failed_write(self, ident: Ident, path: str, e: OSError) -> None:
        self.failed.add(ident)
        self.stats.keys_failed += 1
        if e.errno == errno.ENOSPC:
            self._pause()
        logger.warning(
            "KV store: writing %s failed (%s); this key is not manifested again "
            "this boot",
            path,
            e,
        )

    def _make_dirs(self, directory: str) -> None:
        if directory in self._made_dirs:
            return
        missing = []
        d = directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                pass
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
