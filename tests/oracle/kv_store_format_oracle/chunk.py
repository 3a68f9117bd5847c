# SPDX-License-Identifier: Apache-2.0
"""A whole chunk file: header then payload, built in memory or verified."""

from __future__ import annotations

import os

from .checksum import crc32
from .constants import MAX_HEADER_LENGTH
from .format_error import FormatError, Reason
from .header import ChunkHeader, declared_header_length, decode_header, encode_header
from .mac import MAC_SIZE, open_chunk, plain_header_bytes
from .store_file import open_regular


def encode_chunk(header: ChunkHeader, payload: bytes | bytearray | memoryview) -> bytes:
    """Header + payload in one buffer (tests and small writers); ``header`` is
    make_header's for this payload."""
    return encode_header(header) + bytes(payload)


def check_file_size(header: ChunkHeader, file_size: int) -> None:
    expected = header.header_length + header.payload_length
    if file_size < expected:
        raise FormatError(
            Reason.TRUNCATED, f"{file_size} bytes, chunk needs {expected}"
        )
    if file_size > expected:
        raise FormatError(
            Reason.TRAILING_BYTES, f"{file_size} bytes, chunk is {expected}"
        )


def check_payload_checksum(header: ChunkHeader, computed: int) -> None:
    if computed != header.payload_checksum:
        raise FormatError(
            Reason.PAYLOAD_CHECKSUM_MISMATCH,
            f"payload checksum {header.payload_checksum:08x}, computed {computed:08x}",
        )


def verify_chunk(data: bytes | bytearray | memoryview) -> ChunkHeader:
    """Full check of a whole chunk file held in memory."""
    buf = memoryview(data).cast("B")
    header = decode_header(buf)
    check_file_size(header, len(buf))
    check_payload_checksum(header, crc32(buf[header.header_length :]))
    return header


# A first header read this long covers a header of up to about 1,000
# segments; only a longer one takes a second read.
_HEAD_READ = 64 << 10


def read_header_bytes(fd: int, size: int) -> bytes:
    """The first bytes of a chunk file of ``size`` bytes, enough for its header.

    One small pread, then a second only when the header_length field (bounded
    by MAX_HEADER_LENGTH before it sizes a read) says there is more;
    decode_header judges what comes back, so a short or lying file gets the
    verdict a read of MAX_HEADER_LENGTH bytes would give it.
    """
    head = os.pread(fd, min(size, _HEAD_READ), 0)
    length = declared_header_length(head)
    if length is not None and len(head) < length <= MAX_HEADER_LENGTH:
        head += os.pread(fd, min(size, length) - len(head), len(head))
    return head


def read_chunk_header(path: str, key: bytes | None = None) -> ChunkHeader:
    """Parse the header of a chunk file and check its size (not the payload).

    With a keyed store's ``key``: the file must carry the MAC flag and room
    for its MAC, and its header is parsed as the plain file it seals. The
    MAC itself is not checked (that needs the payload): a reader of the
    payload does that (``verify_sealed_chunk``, the restore's native read)."""
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = read_header_bytes(f.fileno(), size)
    if key is not None:
        head = plain_header_bytes(head, size)
        size -= MAC_SIZE
    header = decode_header(head)
    check_file_size(header, size)
    return header


def verify_sealed_chunk(
    key: bytes, data: bytes | bytearray | memoryview, *, rank: int
) -> ChunkHeader:
    """Full check of a keyed chunk file of rank ``rank``'s store held in
    memory: the MAC first, then every check of ``verify_chunk`` on the plain
    chunk it seals."""
    return verify_chunk(open_chunk(key, data, rank=rank))


def verify_chunk_file(
    path: str,
    block_size: int = 8 << 20,
    key: bytes | None = None,
    rank: int | None = None,
) -> ChunkHeader:
    """Header, size and payload checksum of a chunk file, read in blocks
    (a keyed one whole, its MAC checked first: ``rank`` is then the rank of
    the store it lies in, which the v3 seal binds)."""
    if key is not None:
        if rank is None:
            raise ValueError("a keyed chunk's MAC binds its rank: pass rank=")
        with os.fdopen(open_regular(path), "rb") as f:
            return verify_sealed_chunk(key, f.read(), rank=rank)
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(min(size, MAX_HEADER_LENGTH))
        header = decode_header(head)
        check_file_size(header, size)
        value = crc32(memoryview(head)[header.header_length :])
        while block := f.read(block_size):
            value = crc32(block, value)
    check_payload_checksum(header, value)
    return header
