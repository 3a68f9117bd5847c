# SPDX-License-Identifier: Apache-2.0
"""The namespace record: what a store was written for, and its hash."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .canonical_json import canonical_json, parse_json
from .constants import (
    FORMAT_VERSION,
    MAX_GROUP_INDEX,
    MAX_MANIFEST_GROUPS,
    MAX_PAYLOAD_LENGTH,
    MAX_RANK,
    MAX_RECORD_BYTES,
    NS_SHORT_HEX,
    READABLE_VERSIONS,
)
from .format_error import FormatError, Reason
from .json_fields import int_field, int_in, is_row, list_field

_FENCED_STR = ("model", "vllm_version", "build_id", "kv_dtype", "hash_algorithm")


@dataclass(frozen=True)
class NamespaceRecord:
    """`fenced` is hashed and compared exactly; `info` is diagnostics only."""

    fenced: Mapping[str, Any]
    info: Mapping[str, Any]

    @property
    def namespace_hash(self) -> bytes:
        return namespace_hash(self.fenced)

    @property
    def namespace_short(self) -> str:
        return self.namespace_hash.hex()[:NS_SHORT_HEX]


def make_fenced(
    *,
    model: str,
    vllm_version: str,
    build_id: str,
    tp_size: int,
    kv_dtype: str,
    hash_algorithm: str,
    num_speculative_tokens: int,
    page_sizes: Mapping[int, int],
    state_abi: Mapping[str, Any],
    key_scheme: Mapping[str, str] | None = None,
    layer_index: str | None = None,
    model_identity: Mapping[str, str] | None = None,
    format_version: int = FORMAT_VERSION,
) -> dict[str, Any]:
    """The fenced part, checked. ``key_scheme`` (how chunk keys are hashed),
    ``layer_index`` (what a header's layer_index counts) and
    ``model_identity`` (what decides the KV values beside the layout) are the
    vLLM writer's extra keys (FORMAT.md 4); a reader only compares them."""
    fenced: dict[str, Any] = {
        "format_version": format_version,
        "model": model,
        "vllm_version": vllm_version,
        "build_id": build_id,
        "tp_size": tp_size,
        "kv_dtype": kv_dtype,
        "hash_algorithm": hash_algorithm,
        "num_speculative_tokens": num_speculative_tokens,
        "page_sizes": [[g, page_sizes[g]] for g in sorted(page_sizes)],
        "state_abi": dict(state_abi),
    }
    for name, strings in (
        ("key_scheme", key_scheme),
        ("model_identity", model_identity),
    ):
        if strings is None:
            continue
        if not all(
            isinstance(k, str) and isinstance(v, str) for k, v in strings.items()
        ):
            raise FormatError(
                Reason.BAD_FIELD, f"fenced.{name} must map strings to strings"
            )
        fenced[name] = dict(strings)
    if layer_index is not None:
        if not isinstance(layer_index, str) or not layer_index:
            raise FormatError(
                Reason.BAD_FIELD, "fenced.layer_index must be a non-empty string"
            )
        fenced["layer_index"] = layer_index
    check_fenced(fenced)
    return fenced


def check_fenced(fenced: Mapping[str, Any]) -> None:
    if not isinstance(fenced, Mapping):
        raise FormatError(Reason.BAD_FIELD, "fenced must be an object")
    version = fenced.get("format_version")
    if type(version) is not int:
        raise FormatError(Reason.BAD_FIELD, "fenced.format_version missing")
    if version not in READABLE_VERSIONS:
        raise FormatError(Reason.UNSUPPORTED_VERSION, f"format version {version}")
    for name in _FENCED_STR:
        value = fenced.get(name)
        if not isinstance(value, str) or len(value.encode("utf-8")) > 256:
            raise FormatError(Reason.BAD_FIELD, f"fenced.{name} must be a string")
        if name != "build_id" and not value:
            raise FormatError(Reason.BAD_FIELD, f"fenced.{name} is empty")
    int_field(fenced, "tp_size", 1, MAX_RANK + 1, "fenced.")
    int_field(fenced, "num_speculative_tokens", 0, 1024, "fenced.")
    pages = list_field(
        fenced,
        "page_sizes",
        1,
        MAX_MANIFEST_GROUPS,
        "fenced.page_sizes must be a list",
    )
    last = -1
    for pair in pages:
        # Groups ascending: each above the last.
        group = int_in(last + 1, MAX_GROUP_INDEX)
        if not is_row(pair, group, int_in(1, MAX_PAYLOAD_LENGTH)):
            raise FormatError(
                Reason.BAD_FIELD,
                "fenced.page_sizes: [[group, bytes], ...] with groups ascending",
            )
        last = pair[0]
    if not isinstance(fenced.get("state_abi"), Mapping):
        raise FormatError(Reason.BAD_FIELD, "fenced.state_abi must be an object")


def namespace_hash(fenced: Mapping[str, Any]) -> bytes:
    """sha256 of the canonical JSON of the fenced part (32 bytes)."""
    return hashlib.sha256(canonical_json(dict(fenced))).digest()


def encode_namespace_record(record: NamespaceRecord) -> bytes:
    check_fenced(record.fenced)
    if not isinstance(record.info, Mapping):
        raise FormatError(Reason.BAD_FIELD, "info must be an object")
    return canonical_json({"fenced": dict(record.fenced), "info": dict(record.info)})


def decode_namespace_record(data: bytes | bytearray | memoryview) -> NamespaceRecord:
    value = parse_json(data, MAX_RECORD_BYTES)
    if not isinstance(value, dict) or set(value) != {"fenced", "info"}:
        raise FormatError(Reason.BAD_FIELD, 'record must be {"fenced", "info"}')
    if not isinstance(value["info"], dict):
        raise FormatError(Reason.BAD_FIELD, "info must be an object")
    check_fenced(value["fenced"])
    return NamespaceRecord(fenced=value["fenced"], info=value["info"])
