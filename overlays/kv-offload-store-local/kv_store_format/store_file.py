# SPDX-License-Identifier: Apache-2.0
"""Opening a store file as every reader and the writer must (FORMAT.md 2):
the store library's kvtier_open. Never through a symbolic link, the file or
any folder on its path (issue 45), and for a read never anything but a
regular file (a FIFO planted where a chunk belongs would hang the step)."""

from __future__ import annotations

import errno
import os

from . import native

_WALK = 0  # tests: native.OPEN_WALK, the walk of kernels without openat2


def _open(path: str, flags: int, mode: int, options: int) -> int:
    fd = native.current().fn.kvtier_open(
        os.fsencode(path), flags, mode, options | _WALK
    )
    if fd >= 0:
        return fd
    if -fd == errno.ELOOP:
        why = "is or passes through a symlink (the store follows none)"
    elif -fd == errno.EINVAL and options & native.OPEN_REGULAR:
        why = "not a regular file"
    else:
        why = os.strerror(-fd)
    raise OSError(-fd, why, path)


def open_nofollow(path: str, flags: int, mode: int = 0) -> int:
    """os.open(path, flags, mode) (O_CLOEXEC added), refusing a symbolic
    link anywhere on the path (ELOOP) instead of following it."""
    return _open(path, flags, mode, 0)


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at ``path``. OSError:
    ELOOP for a link on the path, EINVAL for a FIFO, device, socket or
    directory, and whatever ``open`` raises otherwise."""
    return _open(path, os.O_RDONLY | os.O_NONBLOCK, 0, native.OPEN_REGULAR)


def read_regular(path: str, limit: int) -> bytes:
    """The regular file at ``path``, at most ``limit + 1`` bytes: one more
    than a record may hold, so the decoder sees an oversized one as such."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read(limit + 1)
