# SPDX-License-Identifier: Apache-2.0
"""File writes with the durability the store format asks for.

Temp names carry the process and thread id, a failed write removes its temp,
and nothing is renamed before its data is fsynced. Files are created with
the store's private mode (store_perms). The writer calls these
through the module (``durable_io.write_chunk_file``) so tests can inject
faults in one place.
"""

import ctypes
import fcntl
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import store_perms
from .deps import fmt


def fsync_dir(path: str) -> None:
    fd = fmt.open_nofollow(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _temp_path(path: str) -> str:
    directory, name = os.path.split(path)
    return os.path.join(
        directory, fmt.temp_name(name, os.getpid(), threading.get_native_id())
    )


def write_file_durably(
    path: str, parts: Sequence[bytes | memoryview], sync_dir: bool = True
) -> None:
    """tmp (pid + thread id) -> write -> fsync -> rename -> fsync dir.

    On any error the temp file is removed and the error re-raised; the final
    name is never left partial.
    """
    tmp = _temp_path(path)
    fd = store_perms.create_file(tmp, os.O_WRONLY)
    try:
        # kvstore gc deletes a namespace-record temp only when nobody holds
        # its flock (FORMAT.md 7.1): the record is written outside the lock.
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            for part in parts:
                write_all(fd, part)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        _remove(tmp)
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(path))


def write_chunk_file(
    path: str, header: bytes, payload: memoryview, trailer: bytes = b""
) -> tuple[int, str]:
    """Write a chunk's temp file and start its writeback; return (fd, temp).
    ``trailer``: a keyed store's MAC, after the payload.

    The caller fsyncs, closes and renames it (``sync_and_rename``). On error
    the temp file is removed and the error raised: no partial file is left.
    """
    tmp = _temp_path(path)
    fd = store_perms.create_file(tmp, os.O_WRONLY)
    try:
        write_all(fd, header)
        write_all(fd, payload)
        if trailer:
            write_all(fd, trailer)
        _start_writeback(fd)
    except BaseException:
        os.close(fd)
        _remove(tmp)
        raise
    return fd, tmp


@dataclass
class StagedFile:
    """A chunk written to its temp file, waiting for fsync and rename."""

    ident: tuple[bytes, int]
    path: str
    tmp: str
    fd: int
    header: fmt.ChunkHeader
    size: int
    origin: Any = None  # CapturedKey.origin, handed back if the write fails
    error: OSError | None = None


def sync_and_rename(staged: Sequence[StagedFile]) -> None:
    """fsync, close and rename each file, then sync their directories; a
    failure removes the file (temp or renamed).

    Pure I/O on the given files (runs on the writer's I/O thread); errors are
    recorded on each file for the writer thread to handle.
    """
    for f in staged:
        try:
            try:
                os.fsync(f.fd)
            finally:
                os.close(f.fd)
            os.rename(f.tmp, f.path)
        except OSError as e:
            f.error = e
            _remove(f.tmp)
    # One sync per directory per batch, before the writer thread marks any
    # of these files durable (so before a manifest can name them).
    renamed: dict[str, list[StagedFile]] = {}
    for f in staged:
        if f.error is None:
            renamed.setdefault(os.path.dirname(f.path), []).append(f)
    for directory, files in renamed.items():
        try:
            fsync_dir(directory)
        except OSError as e:
            for f in files:
                f.error = e
                _remove(f.path)


def _remove(path: str) -> None:
    """Best effort: the error being reported is the one that matters."""
    try:
        os.unlink(path)
    except OSError:
        pass


_SYNC_FILE_RANGE_WRITE = 2
_SFR: list[Any] = []


def _start_writeback(fd: int) -> None:
    """Ask Linux to start writing the file back now (no wait); best effort."""
    if not _SFR:
        try:
            fn = ctypes.CDLL(None, use_errno=True).sync_file_range
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError):
            fn = None
        _SFR.append(fn)
    if _SFR[0] is not None:
        _SFR[0](fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
