# SPDX-License-Identifier: Apache-2.0
"""Checks shared by the JSON records (namespace record, manifest, pending)."""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from typing import Any

from .canonical_json import parse_json
from .format_error import FormatError, Reason


def parse_versioned(
    data: bytes | bytearray | memoryview,
    limit: int,
    what: str,
    versions: Container[int],
) -> tuple[dict[str, Any], int]:
    """A JSON object with an integer "format" this reader knows, and that format."""
    value = parse_json(data, limit)
    if not isinstance(value, dict):
        raise FormatError(Reason.BAD_FIELD, f"{what} must be an object")
    version = value.get("format")
    if type(version) is not int:
        raise FormatError(Reason.BAD_FIELD, "format missing")
    if version not in versions:
        raise FormatError(Reason.UNSUPPORTED_VERSION, f"format version {version}")
    return value, version


def int_in(low: int, high: int) -> Callable[[Any], bool]:
    """A check: an integer (not a bool) in [low, high]."""
    return lambda value: type(value) is int and low <= value <= high


def int_field(
    obj: Mapping[str, Any], name: str, low: int, high: int, where: str = ""
) -> int:
    value = obj.get(name)
    if not int_in(low, high)(value):
        raise FormatError(
            Reason.BAD_FIELD, f"{where}{name} must be an integer in [{low}, {high}]"
        )
    return value


def list_field(
    obj: Mapping[str, Any], name: str, low: int, high: int, message: str
) -> list[Any]:
    """A list of low to high items; raises BAD_FIELD with `message` if not."""
    value = obj.get(name)
    if not isinstance(value, list) or not low <= len(value) <= high:
        raise FormatError(Reason.BAD_FIELD, message)
    return value


def is_row(value: Any, *checks: Callable[[Any], bool]) -> bool:
    """A list of exactly len(checks) items, each passing its own check."""
    return (
        isinstance(value, list)
        and len(value) == len(checks)
        and all(check(item) for check, item in zip(checks, value, strict=True))
    )
