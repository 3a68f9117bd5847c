"""A stand-in writer for the concurrent GC test: follows FORMAT.md section 7.

Loops until STOP_FILE exists (or MAX boundaries): under flock(LOCK_SH) on the
rank's .lock it extends (sometimes forks) a chain by one chunk, writes the
missing full-group chunks and the state payload (tmp + fsync + rename + dir
fsync, dedup only when the header verifies), re-reads every header, then
publishes the boundary manifest, and only then releases the lock.

usage: kvstore_writer_loop.py TIER STOP_FILE MAX_BOUNDARIES
KVSTORE_WRITER_NO_LOCK=1 skips the lock: a negative control (the writer then
fails when a sweep deletes its in-flight chunks).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

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


def ensure_chunk(store: Store, key: str, group: int, boundary: int) -> fmt.ManifestEntry:
    path = Path(store.layout.chunk(key, group))
    segs = state_segments() if group == STATE_GROUP else full_segments()
    payload = payload_for(segs, f"{key}/{group}")
    want = fmt.make_header(store.ns_hash, group, bytes.fromhex(key), boundary, segs, payload)
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


def main() -> int:
    tier, stop, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    store = Store(tier)
    rng = random.Random(7)
    chain: list[str] = []
    lock_fd = os.open(store.layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
    published = 0
    while published < limit and not stop.exists():
        if chain and rng.random() < 0.2:
            chain = chain[: rng.randrange(len(chain))]  # fork from an earlier prefix
        salt = rng.getrandbits(32)
        prev = chain[-1] if chain else ""
        chain = chain + [hashlib.sha256(f"{prev}/{salt}".encode()).hexdigest()[:32]]
        if not os.environ.get("KVSTORE_WRITER_NO_LOCK"):
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
        try:
            full = [
                ensure_chunk(store, k, FULL_GROUP, (i + 1) * CHUNK_TOKENS)
                for i, k in enumerate(chain)
            ]
            state = ensure_chunk(store, chain[-1], STATE_GROUP, len(chain) * CHUNK_TOKENS)
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
            write_atomic(Path(store.layout.manifest(m.boundary, m.tip)), fmt.encode_manifest(m))
            published += 1
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
        time.sleep(0.002)  # let a waiting sweep in
    print(published)
    return 0


if __name__ == "__main__":
    sys.exit(main())
