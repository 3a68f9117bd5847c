"""The Python codec's read of one chunk file for a promotion: the test
oracle and benchmark baseline of the native read (libkvtier_store.so).

This is the restore's per-file read as it was before the native library
(kv_restore_read.check_header + read_into): the header checked in
docs/FORMAT.md's order with the pure-Python codec (the oracle,
tests/oracle/kv_store_format_oracle), the manifest entry and this
boot's layout, the file size, then preadv into the memory runs and
zlib's CRC. An independent second reader of FORMAT.md: tests compare its
verdicts with the library's, and bench/restore_read_bench.py its speed.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

_ORACLE = str(Path(__file__).resolve().parents[1] / "tests" / "oracle")
if _ORACLE not in sys.path:
    sys.path.insert(0, _ORACLE)

import kv_store_format_oracle as fmt  # noqa: E402

_IOV_MAX = 1024  # iovecs one preadv takes (Linux UIO_MAXIOV)


class Refused(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(f"{reason}: {message}")
        self.reason = reason


def check_header(
    head: bytes,
    namespace: bytes,
    group: int,
    key_hash: bytes,
    boundary: int,
    length: int,
    checksum: int,
    segments: Sequence[Any],
) -> fmt.ChunkHeader:
    header = fmt.decode_header(head)
    if header.namespace_hash != namespace:
        raise Refused("foreign_namespace", "chunk of another namespace")
    if header.group != group:
        raise Refused("wrong_group", f"group {header.group} != {group}")
    if header.key_hash != key_hash:
        raise Refused("wrong_key", "key hash differs from the manifest")
    if header.boundary != boundary:
        raise Refused("wrong_boundary", f"boundary {header.boundary} != {boundary}")
    if header.payload_length != length or header.payload_checksum != checksum:
        raise Refused(
            "manifest_mismatch", "payload length or checksum differs from the manifest"
        )
    # Field by field: the layout may come in the shipped package's types.
    if [_fields(s) for s in header.segments] != [_fields(s) for s in segments]:
        raise Refused(
            "layout_mismatch", "segment table differs from this boot's layout"
        )
    return header


def _fields(s: Any) -> tuple:
    shape, stride = tuple(s.shape), tuple(s.stride)
    return (
        s.layer,
        int(s.kind),
        int(s.dtype),
        s.offset,
        s.length,
        shape,
        stride,
        s.part,
    )


def read_into(fd: int, offset: int, runs: Sequence[tuple[int, int]]) -> int:
    """preadv from ``offset`` into the runs; the CRC, or -1 at an early end."""
    views = [memoryview((ctypes.c_char * n).from_address(a)).cast("B") for a, n in runs]
    crc = 0
    index = 0
    done = 0
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


def read_sealed(
    fd: int,
    key: bytes,
    expect: tuple,
    runs: Sequence[tuple[int, int]],
    rank: int = 0,
) -> None:
    """A keyed store's file (FORMAT.md 3.6), as the codec reads it: whole, its
    MAC first (``open_chunk``), then the plain checks on the chunk it seals,
    and only then the payload copied into the runs."""
    size = os.fstat(fd).st_size
    plain = fmt.open_chunk(key, os.pread(fd, size, 0), rank=rank)
    header = check_header(bytes(plain[: fmt.MAX_HEADER_LENGTH]), *expect)
    fmt.check_file_size(header, len(plain))
    payload = memoryview(plain)[header.header_length :]
    fmt.check_payload_checksum(header, fmt.crc32(payload))
    at = 0
    for address, n in runs:
        ctypes.memmove(address, bytes(payload[at : at + n]), n)
        at += n


def read_one(
    fd: int,
    namespace: bytes,
    group: int,
    key_hash: bytes,
    boundary: int,
    length: int,
    checksum: int,
    segments: Sequence[Any],
    runs: Sequence[tuple[int, int]],
    key: bytes | None = None,
    rank: int = 0,
) -> str:
    """The verdict on one open chunk file: "" (good) or the reason; with a
    keyed store's ``key`` its MAC (bound to ``rank``) is judged first."""
    if key is not None:
        expect = (namespace, group, key_hash, boundary, length, checksum, segments)
        try:
            read_sealed(fd, key, expect, runs, rank)
        except OSError:
            return "io_error"
        except fmt.FormatError as e:
            return e.reason.value
        except Refused as e:
            return e.reason
        return ""
    try:
        size = os.fstat(fd).st_size
        head = fmt.read_header_bytes(fd, size)
        header = check_header(
            head, namespace, group, key_hash, boundary, length, checksum, segments
        )
        fmt.check_file_size(header, size)
        crc = read_into(fd, header.header_length, runs)
        if crc < 0:
            raise fmt.FormatError(fmt.Reason.TRUNCATED, "file ended while reading")
        fmt.check_payload_checksum(header, crc)
    except OSError:
        return "io_error"
    except fmt.FormatError as e:
        return e.reason.value
    except Refused as e:
        return e.reason
    return ""
