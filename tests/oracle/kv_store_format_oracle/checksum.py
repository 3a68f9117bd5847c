# SPDX-License-Identifier: Apache-2.0
"""The checksum of headers, payloads and manifests (algorithm id 1)."""

import zlib


def crc32(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    """CRC-32 (algorithm id 1). Pass the previous value to continue a stream."""
    return zlib.crc32(data, value) & 0xFFFFFFFF
