# SPDX-License-Identifier: Apache-2.0
"""Payload CRC-32 on helper threads, in slices combined in GF(2).

zlib's CRC-32 (~1-4 GB/s on one core) would otherwise run on the writer
thread before the bytes reach the disk. It runs on helper threads instead
(``zlib.crc32`` releases the GIL on large buffers), split in fixed-size
slices whose CRCs are combined, and is started for the next jobs while the
writer writes the current one.
"""

import itertools
import os
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

from .deps import fmt

CHECKSUM_SLICE_BYTES = 4 << 20


def _gf2_times(matrix: Sequence[int], vector: int) -> int:
    out = 0
    i = 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _gf2_product(a: Sequence[int], b: Sequence[int]) -> list[int]:
    """The operator a after b."""
    return [_gf2_times(a, column) for column in b]


def crc32_shift(nbytes: int) -> list[int]:
    """The operator that appends nbytes zero bytes to a CRC-32 (zlib's).

    crc32(a + b) == _gf2_times(crc32_shift(len(b)), crc32(a)) ^ crc32(b).
    """
    result = [1 << n for n in range(32)]  # identity
    step = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):  # one zero byte
        step = _gf2_product(step, step)
    while nbytes:
        if nbytes & 1:
            result = _gf2_product(step, result)
        nbytes >>= 1
        if nbytes:
            step = _gf2_product(step, step)
    return result


class PendingChecksum:
    """The slices of one payload's CRC, on the checksum threads."""

    def __init__(self, futures: list[Future], shift: Sequence[int]):
        self._futures = futures
        self._shift = shift

    def result(self) -> int:
        value = self._futures[0].result()
        for f in self._futures[1:]:  # every slice after the first is full size
            value = _gf2_times(self._shift, value) ^ f.result()
        return value

    def settle(self) -> None:
        """Cancel or wait: the payload's memory may be reused afterwards."""
        for f in self._futures:
            f.cancel()
        wait(self._futures)


class Checksummer:
    def __init__(self, threads: int, slice_bytes: int | None = None):
        self.slice_bytes = slice_bytes or CHECKSUM_SLICE_BYTES
        self._shift = crc32_shift(self.slice_bytes)
        self._pool = ThreadPoolExecutor(
            max(1, threads), thread_name_prefix="kv-store-crc"
        )

    def start(self, payload: memoryview) -> PendingChecksum:
        # The short slice goes first so that every later one shifts by the
        # same (precomputed) length.
        n = len(payload)
        first = n % self.slice_bytes or min(n, self.slice_bytes)
        bounds = [0, *range(first, n + 1, self.slice_bytes)]
        if len(bounds) == 1:
            bounds.append(n)
        futures = [
            self._pool.submit(fmt.crc32, payload[a:b])
            for a, b in itertools.pairwise(bounds)
        ]
        return PendingChecksum(futures, self._shift)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def default_checksum_threads() -> int:
    return max(1, min(4, (os.cpu_count() or 2) // 2))
