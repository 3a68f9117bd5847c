# SPDX-License-Identifier: Apache-2.0
"""The pending record (FORMAT.md section 9.1): chunks a live writer still
means to name in a manifest, so the GC leaves them alone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .canonical_json import canonical_json
from .constants import MAX_GROUP_INDEX, PENDING_FORMAT_VERSION
from .format_error import FormatError, Reason
from .json_fields import int_in, is_row, list_field, parse_versioned
from .names import is_key_hex

PENDING_KIND = "pending_chunks"
MAX_PENDING_BYTES = 64 << 20
MAX_PENDING_CHUNKS = 1 << 20


def encode_pending_record(chunks: Iterable[tuple[int, str]]) -> bytes:
    """Canonical JSON naming the chunks (group, key hex) a live writer still
    means to name in a manifest; sorted, each once."""
    items = sorted(set(chunks))
    body = {
        "chunks": [[g, k] for g, k in items],
        "format": PENDING_FORMAT_VERSION,
        "kind": PENDING_KIND,
    }
    _check_pending_body(body)
    return canonical_json(body)


def decode_pending_record(
    data: bytes | bytearray | memoryview,
) -> list[tuple[int, str]]:
    value, _ = parse_versioned(
        data, MAX_PENDING_BYTES, "pending record", (PENDING_FORMAT_VERSION,)
    )
    _check_pending_body(value)
    return [(g, k) for g, k in value["chunks"]]


def _check_pending_body(body: Mapping[str, Any]) -> None:
    if set(body) != {"chunks", "format", "kind"} or body["kind"] != PENDING_KIND:
        raise FormatError(
            Reason.BAD_FIELD, "pending record must be {chunks, format, kind}"
        )
    chunks = list_field(body, "chunks", 0, MAX_PENDING_CHUNKS, "chunks must be a list")
    previous = None
    for c in chunks:
        if not is_row(c, int_in(0, MAX_GROUP_INDEX), is_key_hex):
            raise FormatError(Reason.BAD_FIELD, "chunk must be [group, key hex]")
        # FORMAT.md 9.1: sorted by (group, key), each once.
        if previous is not None and not previous < (c[0], c[1]):
            raise FormatError(
                Reason.BAD_FIELD, "chunks must be sorted by (group, key), each once"
            )
        previous = (c[0], c[1])
