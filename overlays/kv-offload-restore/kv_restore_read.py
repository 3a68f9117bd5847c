# SPDX-License-Identifier: Apache-2.0
"""Restore, worker side: one chunk file read into memory, verified.

The header is checked in docs/FORMAT.md's order and against the manifest
entry (``check_header``); the payload is read with preadv straight into the
memory runs it belongs to, and its CRC computed on the way (``read_into``).
"""

import ctypes
import os
from collections.abc import Sequence
from typing import Any

try:
    from . import kv_store_format as fmt
    from .kv_restore_inventory import Proof
except ImportError:  # loaded as a top-level module: tests, tools
    import kv_store_format as fmt  # type: ignore[no-redef]
    from kv_restore_inventory import Proof  # type: ignore[no-redef]

_IOV_MAX = 1024  # iovecs one preadv takes (Linux UIO_MAXIOV)


class PromotionFailed(Exception):
    def __init__(self, reason: str, message: str, key: bytes | None = None):
        super().__init__(message)
        self.reason = reason
        self.key = key


def buffer_address(buf: Any) -> int:
    if hasattr(buf, "data_ptr"):
        return buf.data_ptr()
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def check_header(
    head: bytes, proof: Proof, namespace: bytes, segments: Sequence[fmt.Segment]
) -> fmt.ChunkHeader:
    """The header checks of a promotion, in docs/FORMAT.md's order.

    First the codec's reading order (3.5 steps 1-13) on the file's first
    bytes, then what the manifest entry and this boot require: namespace,
    group, key, boundary index, payload length and checksum, segment table.
    """
    header = fmt.decode_header(head)
    if header.namespace_hash != namespace:
        raise PromotionFailed("foreign_namespace", "chunk of another namespace")
    if header.group != proof.group:
        raise PromotionFailed("wrong_group", f"group {header.group} != {proof.group}")
    if header.key_hash.hex() != proof.key_hex:
        raise PromotionFailed("wrong_key", "key hash differs from the manifest")
    if header.boundary != proof.boundary:
        raise PromotionFailed(
            "wrong_boundary", f"boundary {header.boundary} != {proof.boundary}"
        )
    if (
        header.payload_length != proof.length
        or header.payload_checksum != proof.checksum
    ):
        raise PromotionFailed(
            "manifest_mismatch", "payload length or checksum differs from the manifest"
        )
    if tuple(header.segments) != tuple(segments):
        raise PromotionFailed(
            "layout_mismatch", "segment table differs from this boot's layout"
        )
    return header


def coalesce_runs(runs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge (address, length) runs that follow each other in memory."""
    out: list[list[int]] = []
    for address, length in runs:
        if out and out[-1][0] + out[-1][1] == address:
            out[-1][1] += length
        else:
            out.append([address, length])
    return [(a, n) for a, n in out]


def read_into(fd: int, offset: int, runs: Sequence[tuple[int, int]]) -> int:
    """preadv the file from ``offset`` into the memory runs; the CRC of the bytes.

    Returns -1 when the file ends early (a truncated file: a miss).
    """
    views = [memoryview((ctypes.c_char * n).from_address(a)).cast("B") for a, n in runs]
    crc = 0
    index = 0
    done = 0  # bytes of views[index] already read
    while index < len(views):
        batch = [views[index][done:]] + views[index + 1 : index + _IOV_MAX]
        n = os.preadv(fd, batch, offset)
        if n == 0:
            return -1
        offset += n
        while n:
            take = min(n, len(views[index]) - done)
            n -= take
            done += take
            if done == len(views[index]):
                crc = fmt.crc32(views[index], crc)
                index += 1
                done = 0
    return crc
