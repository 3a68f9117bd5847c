# SPDX-License-Identifier: Apache-2.0
"""This writer's pending record (FORMAT.md section 9.1).

A boundary's chunks can come from several jobs, and the writer drops the
store lock between jobs; ``kvstore gc --sweep`` would then see chunks no
manifest names yet. Before each unlock the writer lists them in
``pending/<pid>.<tid>.json``, a file it holds flock(LOCK_SH) on for as long
as it lives: gc keeps what a live writer lists and removes the record of a
writer that has exited. The file is rewritten in place, only under the
store's shared lock, so gc (under the exclusive lock) never reads it torn.
"""

import fcntl
import os
import threading
from collections.abc import Sequence

from . import store_perms
from .deps import fmt


class PendingFile:
    def __init__(self, layout: fmt.StoreLayout):
        self.layout = layout
        self.path: str | None = None
        self._fd: int | None = None
        self._written: bytes | None = None

    def update(self, chunks: Sequence[tuple[int, str]]) -> None:
        """Record (group, key hex) pairs, sorted and each once, as
        ``ManifestBook.pending_chunks`` (manifests.py) lists them; call with the store lock
        held."""
        data = encode_listed(chunks)
        if data == self._written:
            return
        if self._fd is None:
            # Created and locked under the store lock: a sweep never sees it
            # unlocked while this writer lives.
            store_perms.make_dirs(self.layout.pending_dir)
            name = fmt.pending_file_name(os.getpid(), threading.get_native_id())
            self.path = os.path.join(self.layout.pending_dir, name)
            self._fd = _open_locked(self.path)
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, data, 0)
        self._written = data

    def close(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None


def _open_locked(path: str) -> int:
    """The record opened (or created) and flock(LOCK_SH)'d, still under its
    name: a writer that exited may have had this name (a pid reused), and
    another writer removes such a record once its flock is free (budget.py,
    a sweep); a record unlinked before our flock is made again."""
    for _ in range(8):
        fd = store_perms.open_or_create(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            st = os.stat(path, follow_symlinks=False)
            if (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
                return fd
        except FileNotFoundError:
            pass
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise OSError(f"pending record {path} kept being removed while opened")


def encode_listed(chunks: Sequence[tuple[int, str]]) -> bytes:
    """``fmt.encode_pending_record``'s bytes (canonical JSON: keys sorted, no
    whitespace) for chunks this writer listed itself: sorted, each once, every
    key the hex of a hash already named in a chunk path. The codec checks
    every entry again; the writer rewrites the record before each unlock,
    naming every unpublished chunk (thousands under a burst), on the thread
    that holds the GIL beside the engine's, so it is spared that here (a test
    compares the two)."""
    body = ",".join([f'[{g},"{k}"]' for g, k in chunks])
    return (
        f'{{"chunks":[{body}],"format":{fmt.PENDING_FORMAT_VERSION},'
        f'"kind":"{fmt.PENDING_KIND}"}}'
    ).encode("ascii")
