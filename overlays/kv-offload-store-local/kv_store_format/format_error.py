# SPDX-License-Identifier: Apache-2.0
"""The one error every reader raises, and why (`Reason`)."""

import enum


class Reason(str, enum.Enum):  # noqa: UP042 (StrEnum would change str() of a member)
    """Why a reader rejected a file. Values equal the C++ `reason_name()`."""

    TRUNCATED = "truncated"
    BAD_MAGIC = "bad_magic"
    UNSUPPORTED_VERSION = "unsupported_version"
    BAD_HEADER_LENGTH = "bad_header_length"
    UNSUPPORTED_CHECKSUM_ALGORITHM = "unsupported_checksum_algorithm"
    HEADER_CHECKSUM_MISMATCH = "header_checksum_mismatch"
    RESERVED_NONZERO = "reserved_nonzero"
    BAD_KEY_HASH = "bad_key_hash"
    FIELD_OUT_OF_RANGE = "field_out_of_range"
    BAD_SEGMENT_TABLE = "bad_segment_table"
    TRAILING_BYTES = "trailing_bytes"
    PAYLOAD_CHECKSUM_MISMATCH = "payload_checksum_mismatch"
    BAD_JSON = "bad_json"
    BAD_FIELD = "bad_field"
    MANIFEST_CHECKSUM_MISMATCH = "manifest_checksum_mismatch"
    MANIFEST_INCONSISTENT = "manifest_inconsistent"
    BAD_NAME = "bad_name"
    # Keyed stores (FORMAT.md 3.6).
    MAC_MISSING = "mac_missing"
    MAC_MISMATCH = "mac_mismatch"


class FormatError(ValueError):
    """A file or name that does not follow the format (v1 or v2)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.message = message


class KeyFileError(ValueError):
    """A key file the tier refuses (mac.load_key): names the file and the
    problem, never the key's bytes."""
