# SPDX-License-Identifier: Apache-2.0
"""Keyed stores (docs/FORMAT.md 3.6): the key file, loaded and checked by the
store library (format/'s load_key_file, which kvstore runs too), and the
key's id fenced in the namespace. The MACs themselves are the native
codec's (codec.py, the store library's read and write)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .codec import key_id  # doctor_probe calls mac.key_id
from .native import call

FENCED_KEY_ID = "mac_key_id"


def load_key(path: str, store: str | None = None) -> bytes:
    """The secret key in ``path``, after the checks ssh makes of a private
    key: a regular file (not a symlink), owned by this user, no group or
    other permission bit, 32..4096 bytes, not all zero bytes, not inside the
    store folder ``store``; opened without blocking and judged on the open
    descriptor (a FIFO or a file swapped in is refused, never waited on).
    Raises KeyFileError naming the file and the problem."""
    return call(
        "kvtier_load_key", os.fsencode(path), os.fsencode(store) if store else None
    )


def fence_key(fenced: Mapping[str, Any], key: bytes | None) -> dict[str, Any]:
    """The fenced part with the key's id added; a keyless store's stays as
    it was, so its namespace hash does not change."""
    out = dict(fenced)
    if key is not None:
        out[FENCED_KEY_ID] = key_id(key)
    return out
