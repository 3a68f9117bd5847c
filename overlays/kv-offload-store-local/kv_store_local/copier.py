# SPDX-License-Identifier: Apache-2.0
"""The serving-path copy: staging rows -> capture pool."""

import ctypes
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from .capture_pool import CapturePool


def _is_torch_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _buffer_address(obj: Any) -> int:
    if _is_torch_tensor(obj):
        return obj.data_ptr()
    return ctypes.addressof(ctypes.c_char.from_buffer(obj))


class Copier:
    """Copies coalesced (source, src_off, dst_off, size) runs into the pool.

    ``engine="torch"`` uses ``copy_`` between torch views (torch's own
    threads); ``"memmove"`` uses ctypes.memmove, which releases the GIL, split
    across ``threads`` helper threads for large captures.
    """

    _SPLIT_BYTES = 4 << 20

    def __init__(self, pool: CapturePool, engine: str = "memmove", threads: int = 1):
        if engine not in ("torch", "memmove"):
            raise ValueError(f"unknown copy engine {engine!r}")
        self.pool = pool
        self.engine = engine
        self.threads = max(1, threads)
        self._addresses: dict[int, int] = {}
        self._workers: list[threading.Thread] = []
        self._tasks: deque = deque()
        self._cv = threading.Condition()
        self._pending = 0
        self._closed = False

    def copy(self, runs: Sequence[tuple[Any, int, int, int]]) -> None:
        if self.engine == "torch":
            dst = self.pool.torch_view()
            for source, src_off, dst_off, size in runs:
                dst[dst_off : dst_off + size].copy_(source[src_off : src_off + size])
            return
        moves = []
        for source, src_off, dst_off, size in runs:
            key = id(source)
            base = self._addresses.get(key)
            if base is None:
                base = self._addresses[key] = _buffer_address(source)
            src = base + src_off
            dst = self.pool.address + dst_off
            while size > 0:
                step = min(size, self._SPLIT_BYTES)
                moves.append((dst, src, step))
                dst += step
                src += step
                size -= step
        total = sum(m[2] for m in moves)
        if self.threads == 1 or total < 2 * self._SPLIT_BYTES:
            for dst, src, n in moves:
                ctypes.memmove(dst, src, n)
            return
        self._run_parallel(moves)

    def _run_parallel(self, moves: list[tuple[int, int, int]]) -> None:
        if not self._workers:
            for i in range(self.threads - 1):
                t = threading.Thread(
                    target=self._worker, name=f"kv-store-copy-{i}", daemon=True
                )
                t.start()
                self._workers.append(t)
        with self._cv:
            self._tasks.extend(moves)
            self._pending += len(moves)
            self._cv.notify_all()
        self._drain()
        with self._cv:
            while self._pending:
                self._cv.wait()

    def _drain(self) -> None:
        while True:
            with self._cv:
                if not self._tasks:
                    return
                dst, src, n = self._tasks.popleft()
            ctypes.memmove(dst, src, n)
            with self._cv:
                self._pending -= 1
                if not self._pending:
                    self._cv.notify_all()

    def _worker(self) -> None:
        while True:
            with self._cv:
                while not self._tasks and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
            self._drain()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def coalesce(
    runs: Iterable[tuple[Any, int, int, int]],
) -> list[tuple[Any, int, int, int]]:
    """Merge runs that continue each other on both sides."""
    out: list[list[Any]] = []
    for source, src, dst, size in runs:
        if out:
            last = out[-1]
            if (
                last[0] is source
                and last[1] + last[3] == src
                and last[2] + last[3] == dst
            ):
                last[3] += size
                continue
        out.append([source, src, dst, size])
    return [tuple(run) for run in out]  # type: ignore[misc]
