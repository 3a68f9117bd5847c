# SPDX-License-Identifier: Apache-2.0
"""File and folder names of a store (FORMAT.md 2), built and parsed by the
store library's name calls (format/'s layout, which kvstore walks with)."""

from __future__ import annotations

from typing import Any

from .format_error import FormatError, Reason
from .native import call, fit

MANIFEST_DIR = "manifests"
LOCK_FILE = ".lock"
PENDING_DIR = "pending"
# KVTIER_NAME_*: what kvtier_parse_name reads a name as.
_MANIFEST, _PENDING, _TEMP = 4, 5, 6


def _raw(text: str) -> tuple[bytes, int]:
    raw = text.encode("utf-8", "surrogatepass")  # any str, lone surrogates too
    return raw, len(raw)


def _name(fn: str, *args: Any) -> str:
    return call(fn, *args).decode("utf-8", "surrogatepass")


def _parse(kind: int, name: str, *types: type) -> tuple[Any, ...]:
    """The fields kvtier_parse_name reads in ``name`` (one a line), typed."""
    fields = _name("kvtier_parse_name", kind, *_raw(name)).split("\n", len(types) - 1)
    return tuple(t(f) for t, f in zip(types, fields, strict=True))


def rank_base_name(prefix: str, model: str, ns_hash: bytes, rank: int) -> str:
    if len(ns_hash) != 32:
        raise FormatError(Reason.BAD_NAME, f"namespace hash of {len(ns_hash)} bytes")
    return _name(
        "kvtier_rank_base_name",
        *_raw(prefix),
        *_raw(model),
        bytes(ns_hash),
        fit(rank, 32),
    )


def namespace_record_name(rank_base: str) -> str:
    return f"{rank_base}.json"  # FORMAT.md 2: beside the rank base


def chunk_rel_path(key_hex: str, group: int) -> str:
    """`<hhh>/<hh>_g<g>/<hash>.bin`: hhh = hex[0:3], hh = hex[3:5]."""
    return _name("kvtier_chunk_rel_path", *_raw(key_hex), fit(group, 32))


def manifest_file_name(boundary: int, tip: str) -> str:
    return _name("kvtier_manifest_file_name", fit(boundary, 64), *_raw(tip))


def parse_manifest_file_name(name: str) -> tuple[int, str]:
    return _parse(_MANIFEST, name, int, str)


def pending_file_name(pid: int, tid: int) -> str:
    """`<pid>.<tid>.json` in `pending/`: one writer's pending record."""
    return _name("kvtier_pending_file_name", fit(pid, 64), fit(tid, 64))


def parse_pending_file_name(name: str) -> tuple[int, int]:
    return _parse(_PENDING, name, int, int)


def temp_name(final_name: str, pid: int, tid: int) -> str:
    """`<final>.tmp.<pid>.<tid>`; tid is threading.get_native_id()."""
    return _name("kvtier_temp_name", *_raw(final_name), fit(pid, 64), fit(tid, 64))


def parse_temp_name(name: str) -> tuple[str, int, int] | None:
    try:
        pid, tid, final = _parse(_TEMP, name, int, int, str)
    except FormatError:
        return None
    return final, pid, tid
