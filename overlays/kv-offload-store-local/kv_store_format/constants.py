# SPDX-License-Identifier: Apache-2.0
"""Versions, sizes and limits of the chunk store format (docs/FORMAT.md) that
the overlays use. The codec's own limits are format/'s, enforced there."""

FORMAT_VERSION = 2  # what encoders write
PENDING_FORMAT_VERSION = 1  # the pending record (9.1) did not change in v2
DEFAULT_PREFIX = "glm53kv"

CHECKSUM_CRC32 = 1  # zlib's CRC-32 (reflected 0xEDB88320, init/xorout 0xFFFFFFFF)
CHECKSUM_CRC32C = 2  # reserved for a later version; v1/v2 readers reject it

FIXED_HEADER_SIZE = 144
SEGMENT_ENTRY_SIZE = 120
HEADER_CHECKSUM_SIZE = 4
MAX_SEGMENTS = 4096
MAX_HEADER_LENGTH = (
    FIXED_HEADER_SIZE + MAX_SEGMENTS * SEGMENT_ENTRY_SIZE + HEADER_CHECKSUM_SIZE
)
MAX_GROUP_INDEX = 1023
MAX_MANIFEST_BYTES = 64 << 20
MAX_RECORD_BYTES = 1 << 20
MAC_SIZE = 32  # a keyed chunk's trailer: v3 salt || tag, or a v2 seal's HMAC
SALT_SIZE = 16
SEALED_VERSION = 3  # a v3-sealed chunk's version; the plain header it seals is 2
