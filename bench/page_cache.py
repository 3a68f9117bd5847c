"""Dropping files from the page cache, so a benchmark's next read goes to the disk."""

from __future__ import annotations

import os


def evict(files: list[str]) -> None:
    os.sync()  # dirty pages are not dropped: write them out first
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
