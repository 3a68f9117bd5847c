# SPDX-License-Identifier: Apache-2.0
"""Canonical JSON (namespace hash, manifest checksum) and the strict parser."""

from __future__ import annotations

import json
from typing import Any

from .format_error import FormatError, Reason

_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 63) - 1
# FORMAT.md 4.1: at most 64 arrays and objects open at once; scalars and keys
# add no level.
MAX_JSON_DEPTH = 64


def canonical_json(value: Any) -> bytes:
    """Sorted keys, no whitespace, ASCII only; integers, no floats."""
    _check_canonical(value)
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode("ascii")


def _check_canonical(value: Any, open_: int = 0) -> None:
    """`open_`: the arrays and objects around value."""
    if isinstance(value, (list, tuple, dict)) and open_ >= MAX_JSON_DEPTH:
        raise FormatError(Reason.BAD_JSON, f"nesting deeper than {MAX_JSON_DEPTH}")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            raise FormatError(Reason.BAD_JSON, f"integer {value} out of range")
        return
    if isinstance(value, str):
        _check_text(value)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_canonical(item, open_ + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FormatError(Reason.BAD_JSON, "object keys must be strings")
            _check_text(key)
            _check_canonical(item, open_ + 1)
        return
    raise FormatError(Reason.BAD_JSON, f"{type(value).__name__} is not allowed")


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise FormatError(Reason.BAD_JSON, "string is not valid Unicode") from e


def _reject_float(text: str) -> Any:
    raise FormatError(Reason.BAD_JSON, f"non-integer number {text}")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise FormatError(Reason.BAD_JSON, f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_json(data: bytes | bytearray | memoryview, limit: int) -> Any:
    """Strict JSON: UTF-8, no duplicate keys, no floats or NaN."""
    raw = bytes(data)
    if len(raw) > limit:
        raise FormatError(Reason.BAD_JSON, f"{len(raw)} bytes, limit {limit}")
    try:
        text = raw.decode("utf-8")
        value = json.loads(
            text,
            object_pairs_hook=_unique_pairs,
            parse_float=_reject_float,
            parse_constant=_reject_float,
        )
    except FormatError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FormatError(Reason.BAD_JSON, str(e).splitlines()[0]) from e
    _check_canonical(value)
    return value
