# SPDX-License-Identifier: Apache-2.0
"""Restore, worker side: a promotion's chunk files read into memory, verified.

One call of the native library (kv_store_format/native.py, libkvtier_store.so)
per promotion job reads every file of the job on its own threads, without
the GIL: per file its two folders are checked, then the header in
docs/FORMAT.md's order and against the manifest entry and this boot's
layout, then the file size; the payload is read with preadv straight into
the memory runs it belongs to and its CRC-32 checked (``prepare_job``,
``queue_job``, ``job_bytes``). The Python codec's reading of the same
file stays as the independent oracle of the tests (sim/restore_read_py.py).
"""

import ctypes
from collections.abc import Sequence
from typing import Any

try:
    from . import kv_store_format as fmt
    from .kv_restore_inventory import Proof
    from .kv_store_format import native, read_queue
except ImportError:  # loaded as a top-level module: tests, tools
    import kv_store_format as fmt  # type: ignore[no-redef]
    from kv_restore_inventory import Proof  # type: ignore[no-redef]
    from kv_store_format import native, read_queue  # type: ignore[no-redef]


class PromotionFailed(Exception):
    def __init__(self, reason: str, message: str, key: bytes | None = None):
        super().__init__(message)
        self.reason = reason
        self.key = key


def buffer_address(buf: Any) -> int:
    if hasattr(buf, "data_ptr"):
        return buf.data_ptr()
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def request(
    proof: Proof,
    file: str | int,
    namespace: bytes,
    segments: Sequence[fmt.Segment],
    runs: Sequence[tuple[int, int]],
) -> native.ReadRequest:
    """What one file must be (the manifest entry, this boot's segment table)
    and where its payload goes; ``file`` is its path (the library opens it)
    or the caller's open descriptor."""
    return native.ReadRequest(
        group=proof.group,
        namespace_hash=namespace,
        key_hash=bytes.fromhex(proof.key_hex),
        boundary=proof.boundary,
        payload_length=proof.length,
        payload_checksum=proof.checksum,
        segments=segments,
        runs=runs,
        path=file if isinstance(file, str) else None,
        fd=file if isinstance(file, int) else -1,
    )


def prepare_job(
    lib: native.Library,
    requests: Sequence[native.ReadRequest],
    key: bytes | None = None,
    rank: int = 0,
) -> native.PreparedRead:
    """One promotion's read call, built (pure Python: the step's thread).
    ``key``: a keyed store's; a file whose MAC is missing or wrong fails the
    job (mac_missing, mac_mismatch) like any other refused file. ``rank``:
    the rank whose store the files are in (the v3 seal binds it: another
    rank's chunk copied here is mac_mismatch)."""
    return lib.prepare_read(requests, key, rank=rank)


def queue_job(
    queue: read_queue.ReadQueue,
    read: native.PreparedRead,
    threads: int,
    willneed: bool = False,
) -> read_queue.QueuedRead:
    """Queue the job's read on the library's read thread; it returns at once
    and the caller polls the QueuedRead. The library stops starting files
    after a failure, and checks each chunk file's two folders before it opens
    it (unsafe_folder: a folder that is a link or that others could change);
    it opens no path through a link (FORMAT.md 2)."""
    return queue.submit(
        read, threads, stop_on_failure=True, willneed=willneed, safe_folders=True
    )


def job_bytes(keys: Sequence[bytes], results: Sequence[native.Result]) -> int:
    """The payload bytes of a job whose every file was read; PromotionFailed
    for the first failed file in job order (the ones the library skipped
    come after it). On failure no byte of the job's memory may be used."""
    total = 0
    for key, result in zip(keys, results, strict=True):
        if not result.ok:
            raise PromotionFailed(result.reason, result.message, key)
        total += result.bytes
    return total
