# SPDX-License-Identifier: Apache-2.0
"""Where a first capture's copy runs: KV blocks -> capture pool.

The capture side plans the same (source address, pool address, bytes)
moves on every machine; a device only says how they are copied and when
they are done. On CUDA (``vllm_worker.StoreStreamDevice``) the moves are
queued behind vLLM's own store copy on its transfer stream, so the engine
thread only queues work; here, on a machine without a GPU (tests, CI, the
benchmark), ``HostCopy`` copies host memory with memmove.
"""

import ctypes
import threading
from array import array
from dataclasses import dataclass
from typing import Any, Protocol


class Moves:
    """(source address, destination address, bytes) runs, in three int64
    arrays (what a batched copy takes as it is); a run continuing the last
    on both sides is merged into it."""

    def __init__(self) -> None:
        self.src = array("q")
        self.dst = array("q")
        self.size = array("q")
        self._src_end = -1
        self._dst_end = -1

    def add(self, src: int, dst: int, size: int) -> None:
        if src == self._src_end and dst == self._dst_end:
            self.size[-1] += size
        else:
            self.src.append(src)
            self.dst.append(dst)
            self.size.append(size)
        self._src_end = src + size
        self._dst_end = dst + size

    def extend(self, src: list[int], dst: list[int], size: array) -> None:
        """Runs as they are, not merged (one a layer of a key: a batched
        copy takes them at the same speed)."""
        self.src.extend(src)
        self.dst.extend(dst)
        self.size.extend(size)
        self._src_end = self._dst_end = -1

    def extend_int64(self, src: Any, dst: Any, size: Any) -> None:
        """Runs as they are, from int64 numpy arrays of one shape (C order)."""
        self.src.frombytes(src.astype("<i8", copy=False).tobytes())
        self.dst.frombytes(dst.astype("<i8", copy=False).tobytes())
        self.size.frombytes(size.astype("<i8", copy=False).tobytes())
        self._src_end = self._dst_end = -1

    def __len__(self) -> int:
        return len(self.size)

    def __iter__(self):
        return zip(self.src, self.dst, self.size, strict=True)


@dataclass(frozen=True)
class BlockTensor:
    """One KV tensor as vLLM's store copy reads it: block ``b``'s page starts
    at ``address + b * block_stride`` (the DMA's source pointer)."""

    address: int
    block_stride: int
    num_blocks: int


class TransferFailed(RuntimeError):
    """vLLM's own copy of this job failed (vLLM 0.34.0 reports it and moves
    on): nothing is queued behind it; the job's failure report drops it."""


class Fence(Protocol):
    def done(self) -> bool:
        """A cheap query: every move of the job has landed."""
        ...

    def wait(self) -> None: ...


class CaptureDevice(Protocol):
    def queue(self, job_id: int, moves: Moves) -> Fence:
        """Queue a submitted store job's moves, ordered after its store copy."""
        ...

    def close(self) -> None: ...


class DoneFence:
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return


class ThreadFence:
    """Set once by the copy thread. A lock held until then, not an Event
    (whose Condition costs the queueing thread more than the queueing)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        self._lock.release()

    def done(self) -> bool:
        return not self._lock.locked()

    def wait(self) -> None:
        with self._lock:
            return


class HostCopy:
    """The CPU device: host "KV blocks" -> capture pool with ctypes.memmove
    (which releases the GIL). ``threaded``: on a copy thread of its own, as
    a GPU's copy engine would, so the queueing thread only queues; else
    right away, on the queueing thread."""

    def __init__(self, threaded: bool = False):
        self.threaded = threaded
        self._jobs: list[tuple[Moves, ThreadFence]] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def queue(self, job_id: int, moves: Moves) -> Fence:
        if not self.threaded:
            copy_moves(moves)
            return DoneFence()
        fence = ThreadFence()
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kv-store-capture", daemon=True
                )
                self._thread.start()
            self._jobs.append((moves, fence))
            self._cv.notify()
        return fence

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                moves, fence = self._jobs.pop(0)
            copy_moves(moves)
            fence.set()

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()


def copy_moves(moves: Moves) -> None:
    for src, dst, size in moves:
        ctypes.memmove(dst, src, size)


def host_address(buffer: Any) -> int:
    """Address of a writable host buffer (bytearray, ctypes array)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
