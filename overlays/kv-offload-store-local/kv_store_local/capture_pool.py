# SPDX-License-Identifier: Apache-2.0
"""The private buffer captured bytes wait in until the writer has them."""

import ctypes
import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class CapturePool:
    """A fixed private buffer handed out as a FIFO ring of byte ranges.

    The writer frees ranges in the order they were captured, so a ring is
    enough; an out-of-order free is held until the ranges before it go.
    """

    def __init__(
        self,
        capacity: int,
        allocate: Callable[[int], tuple[int, Any]] | None = None,
    ):
        """allocate(capacity) -> (address, owner): memory of its own (pinned
        host memory a GPU can copy into); default a private bytearray."""
        if capacity <= 0:
            raise ValueError("capture budget must be positive")
        self.capacity = capacity
        self._owner: Any = None
        if allocate is None:
            self.buffer: Any = bytearray(capacity)
            self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))
        else:
            self.address, self._owner = allocate(capacity)
            self.buffer = (ctypes.c_char * capacity).from_address(self.address)
        # Fault every page in now, not on the serving path.
        ctypes.memset(self.address, 0, capacity)
        self._memory = memoryview(self.buffer).cast("B")
        self._live: deque[list[int]] = deque()  # [start, size, freed]
        # Bytes in live ranges (freed ones ahead of the oldest included):
        # asked per recapture on both threads, so kept, not summed.
        self._used = 0
        self._lock = threading.Lock()
        self._torch_view: Any = None

    @property
    def used(self) -> int:
        return self._used

    def alloc(self, size: int) -> int | None:
        with self._lock:
            if size <= 0 or size > self.capacity:
                return None
            if not self._live:
                start = 0
            else:
                oldest = self._live[0][0]
                newest_start, newest_size, _ = self._live[-1]
                head = newest_start + newest_size
                if newest_start >= oldest:  # live range does not wrap
                    if self.capacity - head >= size:
                        start = head
                    elif oldest >= size:
                        start = 0
                    else:
                        return None
                elif oldest - head >= size:
                    start = head
                else:
                    return None
            self._live.append([start, size, 0])
            self._used += size
            return start

    def free(self, start: int) -> None:
        with self._lock:
            for entry in self._live:
                if entry[0] == start and not entry[2]:
                    entry[2] = 1
                    break
            while self._live and self._live[0][2]:
                self._used -= self._live.popleft()[1]

    def view(self, start: int, size: int) -> memoryview:
        return self._memory[start : start + size]

    def torch_view(self) -> Any:
        if self._torch_view is None:
            import torch

            self._torch_view = torch.frombuffer(self.buffer, dtype=torch.uint8)
        return self._torch_view
