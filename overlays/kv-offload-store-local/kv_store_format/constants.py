# SPDX-License-Identifier: Apache-2.0
"""Versions, magic, sizes and limits of the chunk store format (docs/FORMAT.md)."""

FORMAT_VERSION = 2  # what encoders write
READABLE_VERSIONS = (1, 2)  # what readers accept (v1: no segment part)
PENDING_FORMAT_VERSION = 1  # the pending record (9.1) did not change in v2
MAGIC = b"KVTCHUNK"
DEFAULT_PREFIX = "glm53kv"

CHECKSUM_CRC32 = 1  # zlib's CRC-32 (reflected 0xEDB88320, init/xorout 0xFFFFFFFF)
CHECKSUM_CRC32C = 2  # reserved for a later version; v1/v2 readers reject it

FIXED_HEADER_SIZE = 144
SEGMENT_ENTRY_SIZE = 120
HEADER_CHECKSUM_SIZE = 4
MAX_SEGMENTS = 4096
MIN_HEADER_LENGTH = FIXED_HEADER_SIZE + SEGMENT_ENTRY_SIZE + HEADER_CHECKSUM_SIZE
MAX_HEADER_LENGTH = (
    FIXED_HEADER_SIZE + MAX_SEGMENTS * SEGMENT_ENTRY_SIZE + HEADER_CHECKSUM_SIZE
)
MIN_KEY_HASH_BYTES = 8
MAX_KEY_HASH_BYTES = 64
MAX_GROUP_INDEX = 1023
MAX_LAYER_INDEX = 65535
MAX_TOKEN_INDEX = 1 << 40
MAX_PAYLOAD_LENGTH = 1 << 34
MAX_NDIM = 6
MAX_PART = 255
MAX_CHAIN_LENGTH = 1 << 18
MAX_MANIFEST_GROUPS = MAX_GROUP_INDEX + 1
MAX_MANIFEST_BYTES = 64 << 20
MAX_RECORD_BYTES = 1 << 20
MAX_RANK = 65535
MAX_KEEP_BOUNDARIES = 1024
NS_SHORT_HEX = 16
MODEL_NAME_MAX = 64
MAX_JSON_DEPTH = 64  # FORMAT.md 4.1: arrays and objects open at once
MAX_PENDING_BYTES = 64 << 20
MAX_PENDING_CHUNKS = 1 << 20
MAC_SIZE = 32  # a keyed chunk's trailer: v3 salt || tag, or a v2 seal's HMAC
SALT_SIZE = 16
SEALED_VERSION = 3  # a v3-sealed chunk's version; the plain header it seals is 2
