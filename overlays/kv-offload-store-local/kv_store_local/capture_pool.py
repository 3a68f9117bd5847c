# SPDX-License-Identifier: Apache-2.0
"""The private buffer captured bytes wait in until the writer has them."""

import ctypes
import threading
from collections import deque
from typing import Any


class CapturePool:
    """A fixed private buffer handed out as a FIFO ring of byte ranges.

    The writer frees ranges in the order they were captured, so a ring is
    enough; an out-of-order free is held until the ranges before it go.
    """

    def __init__(self, capacity: int):
        if capacity <= 0:
            raise ValueError("capture budget must be positive")
        self.capacity = capacity
        self.buffer = bytearray(capacity)
        self.address = ctypes.addressof(ctypes.c_char.from_buffer(self.buffer))
        # Fault every page in now, not on the serving path.
        ctypes.memset(self.address, 0, capacity)
        self._live: deque[list[int]] = deque()  # [start, size, freed]
        self._lock = threading.Lock()
        self._torch_view: Any = None

    @property
    def used(self) -> int:
        with self._lock:
            return sum(size for _, size, _ in self._live)

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
            return start

    def free(self, start: int) -> None:
        with self._lock:
            for entry in self._live:
                if entry[0] == start and not entry[2]:
                    entry[2] = 1
                    break
            while self._live and self._live[0][2]:
                self._live.popleft()

    def view(self, start: int, size: int) -> memoryview:
        return memoryview(self.buffer)[start : start + size]

    def torch_view(self) -> Any:
        if self._torch_view is None:
            import torch

            self._torch_view = torch.frombuffer(self.buffer, dtype=torch.uint8)
        return self._torch_view
