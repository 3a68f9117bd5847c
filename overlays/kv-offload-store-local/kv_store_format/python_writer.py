# SPDX-License-Identifier: Apache-2.0
"""DELETE with the Python write path (issue 46): ``seal_header`` for
kv_store_local/writer.py's Python path, its only user; production seals in
kvtier_write_chunks. The seal is the native one (codec.seal_chunk), fed the
header alone for the sealed header and header + payload for the trailer.
"""

from __future__ import annotations

import os

from .codec import seal_chunk
from .constants import MAC_SIZE, SALT_SIZE


class RunningSeal:
    """The v3 seal of one file: ``update`` with the payload, ``digest`` the
    32-byte trailer (salt || tag)."""

    def __init__(self, key: bytes, header: bytes, rank: int) -> None:
        self.salt = os.urandom(SALT_SIZE)
        self._key, self._header, self._rank = key, header, rank
        self._payload: list[bytes] = []

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._payload.append(bytes(data))

    def digest(self) -> bytes:
        plain = self._header + b"".join(self._payload)
        sealed = seal_chunk(self._key, plain, rank=self._rank, salt=self.salt)
        return sealed[-MAC_SIZE:]


def seal_header(
    key: bytes, header: bytes | bytearray, *, rank: int
) -> tuple[bytes, RunningSeal]:
    """A plain encoded header as rank ``rank``'s sealed file's (v3), and the
    running seal the writer feeds the payload and appends the digest of."""
    running = RunningSeal(key, bytes(header), rank)
    sealed = seal_chunk(key, header, rank=rank, salt=running.salt)
    return sealed[: len(header)], running
