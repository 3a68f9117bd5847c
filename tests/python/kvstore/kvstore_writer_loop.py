"""A stand-in writer for the concurrent GC test: follows FORMAT.md section 7.

Loops until STOP_FILE exists (or MAX boundaries): it extends (sometimes
forks) a chain by one chunk and writes each boundary in two jobs, as the real
writer does when a boundary's keys are captured at different steps. Job 1,
under flock(LOCK_SH) on the rank's .lock: write the missing full-group chunks
(tmp + fsync + rename + dir fsync, dedup only when the header verifies), list
them in this writer's pending record (FORMAT.md 9.1), release the lock. Job 2,
under the lock again: write the state payload, re-read every header, publish
the manifest, clear the pending record. A boundary whose chunk vanished
between the jobs is counted as lost, not published.

usage: kvstore_writer_loop.py TIER STOP_FILE MAX_BOUNDARIES
prints: "<published> <lost>"
Negative controls: KVSTORE_WRITER_NO_LOCK=1 skips the lock,
KVSTORE_WRITER_NO_PENDING=1 the pending record; sweeps then lose boundaries.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import random
import sys
import threading
import time
from pathlib import Path

# kvstore_support is in tests/python, one folder up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvstore_support import (  # noqa: E402
    CHUNK_TOKENS,
    FULL_GROUP,
    STATE_GROUP,
    Store,
    fmt,
    full_segments,
    payload_for,
    state_segments,
)


def write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / fmt.temp_name(path.name, os.getpid(), threading.get_native_id())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def ensure_chunk(
    store: Store, key: str, group: int, boundary: int
) -> fmt.ManifestEntry:
    path = Path(store.layout.chunk(key, group))
    segs = state_segments() if group == STATE_GROUP else full_segments()
    payload = payload_for(segs, f"{key}/{group}")
    want = fmt.make_header(
        store.ns_hash, group, bytes.fromhex(key), boundary, segs, payload
    )
    try:
        have = fmt.read_chunk_header(str(path))
        if (have.namespace_hash, have.group, have.key_hash, have.payload_checksum) == (
            want.namespace_hash,
            want.group,
            want.key_hash,
            want.payload_checksum,
        ):
            return fmt.ManifestEntry(key, have.payload_length, have.payload_checksum)
    except (OSError, fmt.FormatError):
        pass
    write_atomic(path, fmt.encode_header(want) + payload)
    got = fmt.verify_chunk_file(str(path))  # verify after durable (rule 4)
    return fmt.ManifestEntry(key, got.payload_length, got.payload_checksum)


class Pending:
    """This process's pending record: flock(LOCK_SH) held for its lifetime."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.fd: int | None = None

    def write(self, chunks: set[tuple[int, str]]) -> None:
        if os.environ.get("KVSTORE_WRITER_NO_PENDING"):
            return
        if self.fd is None:
            d = Path(self.store.layout.pending_dir)
            d.mkdir(exist_ok=True)
            name = fmt.pending_file_name(os.getpid(), threading.get_native_id())
            self.fd = os.open(d / name, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_SH)
        data = fmt.encode_pending_record(chunks)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def close(self) -> None:
        if self.fd is not None:
            os.unlink(
                Path(self.store.layout.pending_dir)
                / fmt.pending_file_name(os.getpid(), threading.get_native_id())
            )
            os.close(self.fd)


def existing_entry(
    store: Store, key: str, group: int, boundary: int
) -> fmt.ManifestEntry:
    """The entry of a chunk job 1 wrote, re-verified now (FORMAT.md 7.4)."""
    got = fmt.verify_chunk_file(store.layout.chunk(key, group))
    if got.boundary != boundary:
        raise fmt.FormatError(fmt.Reason.FIELD_OUT_OF_RANGE, "boundary")
    return fmt.ManifestEntry(key, got.payload_length, got.payload_checksum)


def main() -> int:
    tier, stop, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    store = Store(tier)
    rng = random.Random(7)
    chain: list[str] = []
    lock_fd = os.open(store.layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
    use_lock = not os.environ.get("KVSTORE_WRITER_NO_LOCK")
    pending = Pending(store)
    published = lost = 0
    while published + lost < limit and not stop.exists():
        if chain and rng.random() < 0.2:
            chain = chain[: rng.randrange(len(chain))]  # fork from an earlier prefix
        salt = rng.getrandbits(32)
        prev = chain[-1] if chain else ""
        chain = chain + [hashlib.sha256(f"{prev}/{salt}".encode()).hexdigest()[:32]]
        if use_lock:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
        try:  # job 1: the full-group chunks
            for i, k in enumerate(chain):
                ensure_chunk(store, k, FULL_GROUP, (i + 1) * CHUNK_TOKENS)
            pending.write({(FULL_GROUP, k) for k in chain})
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        time.sleep(0.005)  # a sweep may run between the jobs
        if use_lock:
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
        try:  # job 2: the state payload, then the manifest
            state = ensure_chunk(
                store, chain[-1], STATE_GROUP, len(chain) * CHUNK_TOKENS
            )
            try:
                full = [
                    existing_entry(store, k, FULL_GROUP, (i + 1) * CHUNK_TOKENS)
                    for i, k in enumerate(chain)
                ]
            except (OSError, fmt.FormatError):
                lost += 1  # a chunk of job 1 is gone: this boundary cannot be published
                chain = []
                pending.write(set())
                continue
            m = fmt.BoundaryManifest(
                namespace=store.ns_hash.hex(),
                rank=store.rank,
                boundary=len(chain) * CHUNK_TOKENS,
                chunk_tokens=CHUNK_TOKENS,
                chain=tuple(chain),
                groups=(
                    fmt.ManifestGroup(FULL_GROUP, fmt.GROUP_KIND_FULL, tuple(full)),
                    fmt.ManifestGroup(STATE_GROUP, fmt.GROUP_KIND_STATE, (state,)),
                ),
            )
            write_atomic(
                Path(store.layout.manifest(m.boundary, m.tip)), fmt.encode_manifest(m)
            )
            pending.write(set())
            published += 1
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        time.sleep(0.002)  # let a waiting sweep in
    pending.close()
    print(published, lost)
    return 0


if __name__ == "__main__":
    sys.exit(main())
