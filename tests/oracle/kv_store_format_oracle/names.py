# SPDX-License-Identifier: Apache-2.0
"""File and folder names of a store: build them and parse them back."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .constants import (
    MAX_GROUP_INDEX,
    MAX_RANK,
    MAX_TOKEN_INDEX,
    MODEL_NAME_MAX,
    NS_SHORT_HEX,
)
from .format_error import FormatError, Reason

_KEY_HEX = re.compile(r"(?:[0-9a-f]{2}){8,64}")
_PREFIX = re.compile(r"[a-z0-9]{1,32}")
_MODEL_BAD = re.compile(r"[^A-Za-z0-9.-]+")
_RANK_BASE = re.compile(
    r"(?P<prefix>[a-z0-9]{1,32})_(?P<model>[A-Za-z0-9.-]{1,64})"
    r"_(?P<ns>[0-9a-f]{16})_r(?P<rank>0|[1-9][0-9]{0,4})"
)
_MANIFEST_NAME = re.compile(
    r"b(?P<boundary>[1-9][0-9]{0,12})_(?P<tip>(?:[0-9a-f]{2}){8,64})\.json"
)
_TEMP = re.compile(
    r"(?P<final>.+)\.tmp\.(?P<pid>[1-9][0-9]{0,18})\.(?P<tid>[1-9][0-9]{0,18})"
)
MANIFEST_DIR = "manifests"
LOCK_FILE = ".lock"
PENDING_DIR = "pending"
_PENDING_NAME = re.compile(
    r"(?P<pid>[1-9][0-9]{0,18})\.(?P<tid>[1-9][0-9]{0,18})\.json"
)


def is_key_hex(value: Any) -> bool:
    return isinstance(value, str) and _KEY_HEX.fullmatch(value) is not None


def sanitize_model(model: str) -> str:
    """Model name as it appears in directory names: [A-Za-z0-9.-], <= 64."""
    out = _MODEL_BAD.sub("-", model)
    out = re.sub(r"-{2,}", "-", out).strip("-.")
    out = out[:MODEL_NAME_MAX].rstrip("-.")
    return out or "model"


def rank_base_name(prefix: str, model: str, ns_hash: bytes, rank: int) -> str:
    if not _PREFIX.fullmatch(prefix):
        raise FormatError(Reason.BAD_NAME, f"prefix {prefix!r}: [a-z0-9]{{1,32}}")
    if not 0 <= rank <= MAX_RANK:
        raise FormatError(Reason.BAD_NAME, f"rank {rank}")
    short = ns_hash.hex()[:NS_SHORT_HEX]
    return f"{prefix}_{sanitize_model(model)}_{short}_r{rank}"


@dataclass(frozen=True)
class RankBaseName:
    prefix: str
    model: str
    ns_short: str
    rank: int


def parse_rank_base_name(name: str) -> RankBaseName:
    m = _RANK_BASE.fullmatch(name)
    if (
        m is None
        or int(m["rank"]) > MAX_RANK
        or sanitize_model(m["model"]) != m["model"]
    ):
        raise FormatError(Reason.BAD_NAME, f"not a rank base name: {name!r}")
    return RankBaseName(m["prefix"], m["model"], m["ns"], int(m["rank"]))


def namespace_record_name(rank_base: str) -> str:
    return f"{rank_base}.json"


def chunk_rel_path(key_hex: str, group: int) -> str:
    """`<hhh>/<hh>_g<g>/<hash>.bin`: hhh = hex[0:3], hh = hex[3:5]."""
    if not is_key_hex(key_hex):
        raise FormatError(Reason.BAD_NAME, f"chunk key {key_hex[:80]!r}")
    if not 0 <= group <= MAX_GROUP_INDEX:
        raise FormatError(Reason.BAD_NAME, f"group {group}")
    return f"{key_hex[0:3]}/{key_hex[3:5]}_g{group}/{key_hex}.bin"


def parse_chunk_rel_path(rel: str) -> tuple[str, int]:
    """Inverse of chunk_rel_path; returns (key hex, group)."""
    m = re.fullmatch(
        r"(?P<a>[0-9a-f]{3})/(?P<b>[0-9a-f]{2})_g(?P<g>0|[1-9][0-9]{0,3})/"
        r"(?P<key>[0-9a-f]+)\.bin",
        rel,
    )
    if (
        m is None
        or not is_key_hex(m["key"])
        or m["key"][0:3] != m["a"]
        or m["key"][3:5] != m["b"]
        or int(m["g"]) > MAX_GROUP_INDEX
    ):
        raise FormatError(Reason.BAD_NAME, f"not a chunk path: {rel!r}")
    return m["key"], int(m["g"])


def manifest_file_name(boundary: int, tip: str) -> str:
    if not is_key_hex(tip) or not 0 < boundary <= MAX_TOKEN_INDEX:
        raise FormatError(Reason.BAD_NAME, f"manifest name for {boundary}, {tip!r}")
    return f"b{boundary}_{tip}.json"


def parse_manifest_file_name(name: str) -> tuple[int, str]:
    m = _MANIFEST_NAME.fullmatch(name)
    if m is None or int(m["boundary"]) > MAX_TOKEN_INDEX:
        raise FormatError(Reason.BAD_NAME, f"not a manifest name: {name!r}")
    return int(m["boundary"]), m["tip"]


def pending_file_name(pid: int, tid: int) -> str:
    """`<pid>.<tid>.json` in `pending/`: one writer's pending record."""
    if not (0 < pid < 10**19 and 0 < tid < 10**19):
        raise FormatError(Reason.BAD_NAME, f"pending name for {pid}, {tid}")
    return f"{pid}.{tid}.json"


def parse_pending_file_name(name: str) -> tuple[int, int]:
    m = _PENDING_NAME.fullmatch(name)
    if m is None:
        raise FormatError(Reason.BAD_NAME, f"not a pending record name: {name!r}")
    return int(m["pid"]), int(m["tid"])


def temp_name(final_name: str, pid: int, tid: int) -> str:
    """`<final>.tmp.<pid>.<tid>`; tid is threading.get_native_id()."""
    return f"{final_name}.tmp.{pid}.{tid}"


def parse_temp_name(name: str) -> tuple[str, int, int] | None:
    m = _TEMP.fullmatch(name)
    if m is None:
        return None
    return m["final"], int(m["pid"]), int(m["tid"])
