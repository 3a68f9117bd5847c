# SPDX-License-Identifier: Apache-2.0
"""The pure-Python codec of docs/FORMAT.md: the test oracle.

Until issue 46 this package shipped inside vLLM as the overlays'
``kv_store_format``; production now encodes and judges every record,
header and MAC in the C++ ``format/`` library through libkvtier_store.so
(``kv_store_format.codec``), and this second, independent codec of the
spec stays here, in the tests only: both are checked against the shared
vectors (tests/python/store/test_format_vectors.py, test_kv_mac.py), the Python
read of a promotion (sim/restore_read_py.py) and the vector generator
(tests/vectors/generate.py) run on it. Standard library only.

Everything a reader rejects raises `FormatError` carrying a `Reason`; the
reason values are the names the C++ codec reports for the same bytes. Its
types are its own (``import kv_store_format_oracle as oracle``): compare its
results with the shipped package's by field, not by type.

One module a concept, named as in the C++ codec; import the package
(`import kv_store_format_oracle as oracle`), which re-exports every public name:

- constants: versions, magic, sizes and limits;
- format_error: `Reason`, `FormatError`;
- checksum: `crc32`, the checksum of headers, payloads and manifests;
- segment: the segment table (`Segment`, `SegmentKind`, `DType`);
- header: the chunk header (`ChunkHeader`, encode, decode);
- chunk: a whole chunk file (`encode_chunk`, `verify_chunk_file`);
- canonical_json: canonical JSON and the strict parser;
- json_fields: the field checks the JSON records share;
- namespace_record, boundary_manifest, pending_record: the JSON records;
- names, layout: file names and one rank's paths (`StoreLayout`);
- store_file: opening a store file for reading (never a link or a FIFO);
- retention: keep-K retention (`kept_manifests`);
- mac: keyed stores (`load_key`, `key_id`, `seal_chunk`, `open_chunk`; the
  v3 seal's AES-GMAC through libcrypto).
"""

from .boundary_manifest import (
    GROUP_KIND_FULL,
    GROUP_KIND_STATE,
    MANIFEST_KIND,
    BoundaryManifest,
    ManifestEntry,
    ManifestGroup,
    decode_manifest,
    encode_manifest,
)
from .canonical_json import (
    MAX_JSON_DEPTH,
    canonical_json,
    parse_json,
)
from .checksum import crc32
from .chunk import (
    check_file_size,
    check_payload_checksum,
    encode_chunk,
    read_chunk_header,
    read_header_bytes,
    verify_chunk,
    verify_chunk_file,
    verify_sealed_chunk,
)
from .constants import (
    CHECKSUM_CRC32,
    CHECKSUM_CRC32C,
    DEFAULT_PREFIX,
    FIXED_HEADER_SIZE,
    FORMAT_VERSION,
    HEADER_CHECKSUM_SIZE,
    MAGIC,
    MAX_CHAIN_LENGTH,
    MAX_GROUP_INDEX,
    MAX_HEADER_LENGTH,
    MAX_KEEP_BOUNDARIES,
    MAX_KEY_HASH_BYTES,
    MAX_LAYER_INDEX,
    MAX_MANIFEST_BYTES,
    MAX_MANIFEST_GROUPS,
    MAX_NDIM,
    MAX_PART,
    MAX_PAYLOAD_LENGTH,
    MAX_RANK,
    MAX_RECORD_BYTES,
    MAX_SEGMENTS,
    MAX_TOKEN_INDEX,
    MIN_HEADER_LENGTH,
    MIN_KEY_HASH_BYTES,
    MODEL_NAME_MAX,
    NS_SHORT_HEX,
    PENDING_FORMAT_VERSION,
    READABLE_VERSIONS,
    SEGMENT_ENTRY_SIZE,
)
from .format_error import (
    FormatError,
    Reason,
)
from .header import (
    ChunkHeader,
    declared_header_length,
    decode_header,
    encode_header,
    header_length_for,
    make_header,
)
from .layout import StoreLayout
from .mac import (
    MAC_SIZE,
    SALT_SIZE,
    SEALED_VERSION,
    ChunkSealer,
    KeyFileError,
    MacUnavailable,
    chunk_subkey,
    fence_key,
    is_sealed,
    key_id,
    load_key,
    open_chunk,
    open_manifest,
    plain_header_bytes,
    seal_chunk,
    seal_chunk_v2,
    seal_header,
    seal_manifest,
)
from .names import (
    LOCK_FILE,
    MANIFEST_DIR,
    PENDING_DIR,
    RankBaseName,
    chunk_rel_path,
    is_key_hex,
    manifest_file_name,
    namespace_record_name,
    parse_chunk_rel_path,
    parse_manifest_file_name,
    parse_pending_file_name,
    parse_rank_base_name,
    parse_temp_name,
    pending_file_name,
    rank_base_name,
    sanitize_model,
    temp_name,
)
from .namespace_record import (
    NamespaceRecord,
    check_fenced,
    decode_namespace_record,
    encode_namespace_record,
    make_fenced,
    namespace_hash,
)
from .pending_record import (
    MAX_PENDING_BYTES,
    MAX_PENDING_CHUNKS,
    PENDING_KIND,
    decode_pending_record,
    encode_pending_record,
)
from .retention import kept_manifests
from .segment import (
    DTYPE_ITEMSIZE,
    DType,
    Segment,
    SegmentKind,
    make_segments,
)
from .store_file import open_nofollow, open_regular, read_regular

__all__ = [
    "seal_header",
    "plain_header_bytes",
    "is_sealed",
    "MAC_SIZE",
    "SALT_SIZE",
    "SEALED_VERSION",
    "ChunkSealer",
    "MacUnavailable",
    "chunk_subkey",
    "seal_chunk_v2",
    "verify_sealed_chunk",
    "KeyFileError",
    "fence_key",
    "key_id",
    "load_key",
    "open_chunk",
    "open_manifest",
    "seal_chunk",
    "seal_manifest",
    "BoundaryManifest",
    "CHECKSUM_CRC32",
    "CHECKSUM_CRC32C",
    "ChunkHeader",
    "DEFAULT_PREFIX",
    "DTYPE_ITEMSIZE",
    "DType",
    "FIXED_HEADER_SIZE",
    "FORMAT_VERSION",
    "FormatError",
    "GROUP_KIND_FULL",
    "GROUP_KIND_STATE",
    "HEADER_CHECKSUM_SIZE",
    "LOCK_FILE",
    "MAGIC",
    "MANIFEST_DIR",
    "MANIFEST_KIND",
    "MAX_CHAIN_LENGTH",
    "MAX_GROUP_INDEX",
    "MAX_HEADER_LENGTH",
    "MAX_JSON_DEPTH",
    "MAX_KEEP_BOUNDARIES",
    "MAX_KEY_HASH_BYTES",
    "MAX_LAYER_INDEX",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_GROUPS",
    "MAX_NDIM",
    "MAX_PART",
    "MAX_PAYLOAD_LENGTH",
    "MAX_PENDING_BYTES",
    "MAX_PENDING_CHUNKS",
    "MAX_RANK",
    "MAX_RECORD_BYTES",
    "MAX_SEGMENTS",
    "MAX_TOKEN_INDEX",
    "MIN_HEADER_LENGTH",
    "MIN_KEY_HASH_BYTES",
    "MODEL_NAME_MAX",
    "ManifestEntry",
    "ManifestGroup",
    "NS_SHORT_HEX",
    "NamespaceRecord",
    "PENDING_DIR",
    "PENDING_FORMAT_VERSION",
    "PENDING_KIND",
    "READABLE_VERSIONS",
    "RankBaseName",
    "Reason",
    "SEGMENT_ENTRY_SIZE",
    "Segment",
    "SegmentKind",
    "StoreLayout",
    "canonical_json",
    "check_fenced",
    "check_file_size",
    "check_payload_checksum",
    "chunk_rel_path",
    "crc32",
    "declared_header_length",
    "decode_header",
    "decode_manifest",
    "decode_namespace_record",
    "decode_pending_record",
    "encode_chunk",
    "encode_header",
    "encode_manifest",
    "encode_namespace_record",
    "encode_pending_record",
    "header_length_for",
    "is_key_hex",
    "kept_manifests",
    "make_fenced",
    "make_header",
    "make_segments",
    "manifest_file_name",
    "namespace_hash",
    "namespace_record_name",
    "open_nofollow",
    "open_regular",
    "parse_chunk_rel_path",
    "parse_json",
    "parse_manifest_file_name",
    "parse_pending_file_name",
    "parse_rank_base_name",
    "parse_temp_name",
    "pending_file_name",
    "rank_base_name",
    "read_chunk_header",
    "read_header_bytes",
    "read_regular",
    "sanitize_model",
    "temp_name",
    "verify_chunk",
    "verify_chunk_file",
]
