# SPDX-License-Identifier: Apache-2.0
"""Keyed stores (docs/FORMAT.md 3.6): the key file's checks and the key's
id fenced in the namespace. The MACs themselves (chunks: the v3 seal's
AES-GMAC and the v2 seal's HMAC; manifests: HMAC-SHA256) are computed and
checked by the native codec (codec.py, the store library's read and write).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from .codec import key_id
from .constants import MAC_SIZE, SALT_SIZE, SEALED_VERSION

__all__ = [
    "FENCED_KEY_ID",
    "MAC_SIZE",
    "SALT_SIZE",
    "SEALED_VERSION",
    "KeyFileError",
    "fence_key",
    "key_id",
    "load_key",
]

MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 4096
FENCED_KEY_ID = "mac_key_id"


class KeyFileError(ValueError):
    """A key file the tier refuses: names the file and the problem."""


def load_key(path: str, store: str | None = None) -> bytes:
    """The secret key in ``path``, after the checks ssh makes of a private
    key: a regular file (not a symlink), owned by this user, no group or
    other permission bit, 32..4096 bytes; not inside the store folder
    ``store`` (whoever can write the store could read or swap it there),
    not all zero bytes. The file is opened without blocking and judged on
    the open descriptor, so a FIFO or anything swapped in after the first
    look is refused, never waited on (issue 45)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise KeyFileError(f"key file {path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise KeyFileError(f"key file {path} is a symlink: refused")
    _check_key_stat(path, st)
    if store:
        real, root = os.path.realpath(path), os.path.realpath(store)
        if real == root or real.startswith(root.rstrip("/") + "/"):
            raise KeyFileError(
                f"key file {path} is inside the store folder {store}: refused "
                "(keep it outside, where only the serving user can read it)"
            )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise KeyFileError(f"key file {path}: {e.strerror}") from None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise KeyFileError(f"key file {path} changed while opened: refused")
        _check_key_stat(path, now)
        key = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise KeyFileError(f"key file {path} changed while read: refused")
    if not any(key):
        raise KeyFileError(
            f"key file {path} holds only zero bytes: refused (head -c 32 "
            "/dev/urandom makes a key)"
        )
    return key


def _check_key_stat(path: str, st: os.stat_result) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"key file {path} is not a regular file: refused")
    if mode & 0o077:
        raise KeyFileError(
            f"key file {path} has mode {mode:04o}: group/other may access it "
            "(chmod 600)"
        )
    if st.st_uid != os.geteuid():
        raise KeyFileError(
            f"key file {path} is owned by uid {st.st_uid}, not the serving user "
            f"{os.geteuid()}"
        )
    if not MIN_KEY_BYTES <= st.st_size <= MAX_KEY_BYTES:
        raise KeyFileError(
            f"key file {path} holds {st.st_size} bytes: needs "
            f"{MIN_KEY_BYTES}..{MAX_KEY_BYTES}"
        )


def fence_key(fenced: Mapping[str, Any], key: bytes | None) -> dict[str, Any]:
    """The fenced part with the key's id added; a keyless store's stays as
    it was, so its namespace hash does not change."""
    out = dict(fenced)
    if key is not None:
        out[FENCED_KEY_ID] = key_id(key)
    return out
