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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Move = tuple[int, int, int]  # (source address, destination address, bytes)


@dataclass(frozen=True)
class BlockTensor:
    """One KV tensor as vLLM's store copy reads it: block ``b``'s page starts
    at ``address + b * block_stride`` (the DMA's source pointer)."""

    address: int
    block_stride: int
    num_blocks: int


class Fence(Protocol):
    def done(self) -> bool:
        """A cheap query: every move of the job has landed."""
        ...

    def wait(self) -> None: ...


class CaptureDevice(Protocol):
    def queue(self, job_id: int, moves: Sequence[Move]) -> Fence:
        """Queue a submitted store job's moves, ordered after its store copy."""
        ...

    def close(self) -> None: ...


class DoneFence:
    def done(self) -> bool:
        return True

    def wait(self) -> None:
        return


class ThreadFence:
    def __init__(self) -> None:
        self._event = threading.Event()

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self) -> None:
        self._event.wait()


class HostCopy:
    """The CPU device: host "KV blocks" -> capture pool with ctypes.memmove
    (which releases the GIL). ``threaded``: on a copy thread of its own, as
    a GPU's copy engine would, so the queueing thread only queues; else
    right away, on the queueing thread."""

    def __init__(self, threaded: bool = False):
        self.threaded = threaded
        self._jobs: list[tuple[list[Move], ThreadFence]] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def queue(self, job_id: int, moves: Sequence[Move]) -> Fence:
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
            self._jobs.append((list(moves), fence))
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
            fence._event.set()

    def close(self) -> None:
        """Finish what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join()


def copy_moves(moves: Sequence[Move]) -> None:
    for src, dst, size in moves:
        ctypes.memmove(dst, src, size)


def coalesce_moves(moves: Sequence[Move]) -> list[Move]:
    """Merge moves that continue each other on both sides."""
    out: list[list[int]] = []
    for src, dst, size in moves:
        if out:
            last = out[-1]
            if last[0] + last[2] == src and last[1] + last[2] == dst:
                last[2] += size
                continue
        out.append([src, dst, size])
    return [(a, b, c) for a, b, c in out]


def host_address(buffer: Any) -> int:
    """Address of a writable host buffer (bytearray, ctypes array)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
