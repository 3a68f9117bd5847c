# SPDX-License-Identifier: Apache-2.0
"""Opening a store file for reading, as every reader must (docs/FORMAT.md 2).

Never through a symbolic link, neither the file nor any folder on its path
(a chunk folder or ``manifests/`` swapped for a link would lead the writer
and the restore out of the rank base: issue 45), and never anything but a
regular file: opening a FIFO for reading blocks until some process opens it
for writing, so a FIFO planted where a chunk or manifest belongs would hang
the engine's step.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from typing import Any

_AT_FDCWD = -100
_RESOLVE_NO_SYMLINKS = 0x04
_SYS_OPENAT2 = 437  # the same number on every Linux architecture


class _OpenHow(ctypes.Structure):
    _fields_ = [
        ("flags", ctypes.c_uint64),
        ("mode", ctypes.c_uint64),
        ("resolve", ctypes.c_uint64),
    ]


_openat2: list[Any] = []  # [syscall function or None]: resolved once


def _syscall() -> Any:
    if not _openat2:
        try:
            fn = ctypes.CDLL(None, use_errno=True).syscall
            fn.restype = ctypes.c_long
        except (OSError, AttributeError):
            fn = None
        _openat2.append(fn)
    return _openat2[0]


def _links_refused(path: str) -> OSError:
    return OSError(
        errno.ELOOP, "is or passes through a symlink (the store follows none)", path
    )


def _walk(path: str, flags: int, mode: int) -> int:
    """open(2) one component at a time from / (or the working folder), each
    with O_NOFOLLOW: for kernels (or seccomp filters) without openat2."""
    parts = [p for p in os.path.normpath(path).split("/") if p not in ("", ".")]
    at = os.open(
        "/" if path.startswith("/") else ".",
        os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC,
    )
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        want = flags if last else os.O_RDONLY | os.O_DIRECTORY
        try:
            fd = os.open(part, want | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=at)
        except OSError as e:
            try:
                link = stat.S_ISLNK(
                    os.stat(part, dir_fd=at, follow_symlinks=False).st_mode
                )
            except OSError:
                link = False
            os.close(at)
            if e.errno == errno.ELOOP or link:
                raise _links_refused(path) from None
            raise OSError(e.errno, e.strerror, path) from None
        os.close(at)
        at = fd
    return at


def open_nofollow(path: str, flags: int, mode: int = 0) -> int:
    """os.open(path, flags, mode), refusing a symbolic link anywhere on the
    path (ELOOP) instead of following it: openat2's RESOLVE_NO_SYMLINKS, or a
    walk component by component where the kernel lacks it."""
    fn = _syscall()
    if fn is not None:
        how = _OpenHow(
            flags | os.O_CLOEXEC,
            mode if flags & os.O_CREAT else 0,
            _RESOLVE_NO_SYMLINKS,
        )
        fd = fn(
            _SYS_OPENAT2,
            _AT_FDCWD,
            os.fsencode(path),
            ctypes.byref(how),
            ctypes.sizeof(how),
        )
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err == errno.ELOOP:
            raise _links_refused(path)
        if err not in (errno.ENOSYS, errno.EPERM, errno.E2BIG):
            raise OSError(err, os.strerror(err), path)
        _openat2[0] = None  # not here: walk from now on
    return _walk(path, flags, mode)


def open_regular(path: str) -> int:
    """A read-only descriptor of the regular file at ``path``.

    Raises OSError: ELOOP for a symbolic link (the file or a folder on its
    path), EINVAL for a FIFO, device, socket or directory, and whatever
    ``open`` raises otherwise.
    """
    fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
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
