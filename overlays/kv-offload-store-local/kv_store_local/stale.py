# SPDX-License-Identifier: Apache-2.0
"""What writers that exited left under a rank base, removed by the writer
itself (issue 45): their temps and their pending records.

Both count against the disk budget, and until now only ``kvstore gc
--sweep`` removed them: a store whose dead files alone passed the budget
refused every write. The writer removes them by the sweep's own rule
(docs/FORMAT.md 8, step 3): a temp may go only while ``LOCK_EX`` on
``.lock`` is held (every writer holds ``LOCK_SH`` while it has one in
flight), a pending record only once nobody holds its flock. The writer
takes ``LOCK_EX`` without waiting, between its jobs (when it holds no lock
and has nothing in flight): if a sweep, a restore or another writer holds
the lock, it tries again later. Writer thread only.
"""

import errno
import fcntl
import os

from .deps import fmt, init_logger

logger = init_logger(__name__)


def _exited(path: str) -> bool:
    """The writer of this pending record has exited: nobody holds its flock
    (a crash releases it). Anything that cannot be opened is left alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # a live writer holds it (or it cannot be locked)
    finally:
        os.close(fd)
    return True


def dead_pending_records(layout: fmt.StoreLayout, own: str | None) -> list[str]:
    """Paths of the pending records whose writer exited (never ``own``)."""
    try:
        names = sorted(os.listdir(layout.pending_dir))
    except OSError:
        return []
    out = []
    for name in names:
        try:
            fmt.parse_pending_file_name(name)
        except fmt.FormatError:
            continue  # a temp or a foreign file: not a record
        path = os.path.join(layout.pending_dir, name)
        if path != own and _exited(path):
            out.append(path)
    return out


def remove_under_exclusive_lock(
    lock_fd: int, temps: list[str], records: list[str]
) -> list[str] | None:
    """Unlink ``temps`` (every temp under the base) and ``records`` (exited
    writers' pending records) while holding ``LOCK_EX`` on ``lock_fd``, taken
    without waiting; None when the lock is busy (nothing removed). Returns
    the paths removed; the folders they were in are synced."""
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    removed: list[str] = []
    try:
        for path in [*temps, *records]:
            if path in records and not _exited(path):
                continue  # a writer took its name again meanwhile
            try:
                os.unlink(path)
            except OSError as e:
                if e.errno != errno.ENOENT:
                    logger.warning("KV store: cannot remove %s: %s", path, e)
                continue
            removed.append(path)
        for folder in sorted({os.path.dirname(p) for p in removed}):
            fd = fmt.open_nofollow(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
    return removed
