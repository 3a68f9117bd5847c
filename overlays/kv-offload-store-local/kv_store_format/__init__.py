# SPDX-License-Identifier: Apache-2.0
"""Chunk store format v2 (docs/FORMAT.md of the kvtier project): the binding
to its one codec in production, the C++ ``format/`` library behind
libkvtier_store.so (native.py: the data path's reads and writes, codec.py:
records and chunk headers, names.py: file names, store_file.py: the no-links
open), and plain typed data (records, segment, layout, constants). Import the
package (`import kv_store_format as fmt`): it re-exports what the overlays
use. Standard library only: it runs inside vLLM. The calls only tests make
(a chunk built, sealed or judged in memory) are the kvtier project's
sim/chunk_calls.py; its pure-Python codec is the tests' oracle
(tests/oracle/kv_store_format_oracle/).
"""
# ruff: noqa: F401 (the re-exports are the package's interface)

from .codec import (
    canonical_json,
    decode_manifest,
    decode_namespace_record,
    encode_manifest,
    encode_namespace_record,
    encode_pending_record,
    kept_manifests,
    key_id,
    make_fenced,
    namespace_hash,
    read_chunk_header,
)
from .constants import (
    CHECKSUM_CRC32C,
    DEFAULT_PREFIX,
    FIXED_HEADER_SIZE,
    FORMAT_VERSION,
    HEADER_CHECKSUM_SIZE,
    MAC_SIZE,
    MAX_GROUP_INDEX,
    MAX_HEADER_LENGTH,
    MAX_MANIFEST_BYTES,
    MAX_RECORD_BYTES,
    PENDING_FORMAT_VERSION,
    SEALED_VERSION,
    SEGMENT_ENTRY_SIZE,
)
from .format_error import FormatError, KeyFileError, Reason
from .layout import StoreLayout
from .mac import fence_key, load_key
from .names import (
    MANIFEST_DIR,
    chunk_rel_path,
    manifest_file_name,
    namespace_record_name,
    parse_manifest_file_name,
    parse_pending_file_name,
    parse_temp_name,
    pending_file_name,
    rank_base_name,
    temp_name,
)
from .records import (
    GROUP_KIND_FULL,
    GROUP_KIND_STATE,
    PENDING_KIND,
    BoundaryManifest,
    ChunkHeader,
    ManifestEntry,
    ManifestGroup,
    NamespaceRecord,
)
from .segment import DTYPE_ITEMSIZE, DType, Segment, SegmentKind, make_segments
from .store_file import open_nofollow, open_regular, read_regular
