# SPDX-License-Identifier: Apache-2.0
"""The writer's queue and thread: jobs in, processed one at a time.

Subclasses say what a job is (``process``), what to do once the queue runs
empty (``flush``, ``_idle``) and on a quiet timeout (``_timed_out``).
"""

import threading
import time
from collections import deque
from typing import Any

from .deps import init_logger

logger = init_logger(__name__)


class JobQueue:
    def __init__(self, thread_name: str, wake_seconds: float):
        self.thread_name = thread_name
        self.pause_seconds = wake_seconds
        self._queue: deque[Any] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        # Without a thread, submit() processes at once unless this is False
        # (tests and the benchmark then call drain() themselves).
        self.autodrain = True
        self._busy = False

    # -- to override ---------------------------------------------------------

    def process(self, job: Any) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """The queue ran empty: finish what process() left in flight."""

    def _idle(self) -> None:
        """After a flush, on the thread that drained the queue."""

    def _timed_out(self) -> None:
        """The thread woke with nothing queued."""

    def _failed_job(self, job: Any) -> None:
        logger.exception("job failed")

    def _close_resources(self) -> None:
        """The thread is gone: release what it used."""

    # -- serving side --------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=self.thread_name, daemon=True
        )
        self._thread.start()

    def submit(self, job: Any) -> None:
        with self._cv:
            self._queue.append(job)
            self._cv.notify()
        if self._thread is None and self.autodrain:
            self.drain(idle=False)  # no thread (tests): process right here

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
            self._close_resources()

    @property
    def running(self) -> bool:
        """The thread is still alive (after close: it timed out)."""
        return self._thread is not None and self._thread.is_alive()

    def drain(self, idle: bool = True) -> None:
        """Process every queued job on the calling thread (tests, bench),
        then, with ``idle``, what the idle hook queues."""
        while True:
            while True:
                with self._cv:
                    if not self._queue:
                        break
                    job = self._queue.popleft()
                self.process(job)
            self.flush()
            if idle:
                self._idle()
            with self._cv:
                if not self._queue:
                    return

    # -- the thread ----------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._queue and not self._stop:
                    # Woken by a job, or after a while to retry what is due.
                    self._cv.wait(timeout=self.pause_seconds)
                if self._stop and not self._queue:
                    return
                job = self._queue.popleft() if self._queue else None
                self._busy = job is not None
            if job is None:
                self._timed_out()
                continue
            try:
                self.process(job)
            except Exception:
                self._failed_job(job)
            finally:
                with self._cv:
                    idle = not self._queue
                if idle:
                    try:
                        self.flush()
                    except Exception:
                        logger.exception("KV store: writer failed committing files")
                    self._idle()
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
