"""What an attacker who can write the store can compute (issue 38): a chunk
whose payload it chose but whose CRC-32 is still the one the manifest names.
CRC-32 is affine over GF(2), so four bytes it may set fix any CRC it wants:
the header, the manifest and every CRC then agree, and only a MAC tells."""

from __future__ import annotations

import struct
import zlib


def _crc(data: bytes | bytearray) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


def with_crc(data: bytes | bytearray, want: int) -> bytearray:
    """``data`` with its last four bytes changed so that its CRC-32 is ``want``."""
    out = bytearray(data)
    base = _crc(out)
    # The effect of flipping each of the 32 bits, solved for base ^ want.
    rows = []
    for bit in range(32):
        probe = bytearray(out)
        probe[len(out) - 4 + bit // 8] ^= 1 << (bit % 8)
        rows.append((_crc(probe) ^ base, 1 << bit))
    target = base ^ want
    basis: dict[int, tuple[int, int]] = {}  # pivot bit -> (effect, flips)
    for effect, flips in rows:
        for pivot in sorted(basis, reverse=True):
            if effect >> pivot & 1:
                effect ^= basis[pivot][0]
                flips ^= basis[pivot][1]
        if effect:
            basis[effect.bit_length() - 1] = (effect, flips)
    flips = 0
    for pivot in sorted(basis, reverse=True):
        if target >> pivot & 1:
            target ^= basis[pivot][0]
            flips ^= basis[pivot][1]
    assert target == 0, "CRC-32 is affine: the system always has a solution"
    (tail,) = struct.unpack_from("<I", out, len(out) - 4)
    struct.pack_into("<I", out, len(out) - 4, tail ^ flips)
    assert _crc(out) == want
    return out


def forged_sealed_chunk(sealed: bytes, header_length: int) -> bytes:
    """A keyed chunk file with its payload replaced (same length, same CRC)
    and its header, header CRC, flag and old MAC kept as they were: every
    check but the MAC accepts it."""
    body, tag = sealed[:-32], sealed[-32:]
    payload = bytearray(body[header_length:])
    want = _crc(payload)
    payload[: min(16, len(payload) - 4)] = b"\xee" * min(16, len(payload) - 4)
    return bytes(body[:header_length]) + bytes(with_crc(payload, want)) + tag
