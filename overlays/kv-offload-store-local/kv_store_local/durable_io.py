# SPDX-License-Identifier: Apache-2.0
"""The writer's small files (manifests, the namespace record) written with
the durability the store format asks for, and folder fsyncs.

Temp names carry the process and thread id, a failed write removes its temp,
and nothing is renamed before its data is fsynced. Files are created with
the store's private mode (store_perms). Chunk files are the native store
library's (kv_store_format.native), never written here.
"""

import fcntl
import os
import threading
from collections.abc import Sequence

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


def _remove(path: str) -> None:
    """Best effort: the error being reported is the one that matters."""
    try:
        os.unlink(path)
    except OSError:
        pass
