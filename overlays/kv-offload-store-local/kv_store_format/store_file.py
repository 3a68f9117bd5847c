# SPDX-License-Identifier: Apache-2.0
"""Opening a store file for reading, as every reader must (docs/FORMAT.md 2).

Never through a symbolic link, and never anything but a regular file: opening
a FIFO for reading blocks until some process opens it for writing, so a FIFO
planted where a chunk or manifest belongs would hang the engine's step.
"""

from __future__ import annotations

import errno
import os
import stat


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at ``path``.

    Raises OSError: ELOOP for a symbolic link, EINVAL for a FIFO, device,
    socket or directory, and whatever ``open`` raises otherwise.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, limit: int) -> bytes:
    """The regular file at ``path``, at most ``limit + 1`` bytes: one more
    than a record may hold, so the decoder sees an oversized one as such."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read(limit + 1)
