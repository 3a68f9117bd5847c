"""Crash consistency of `kvstore gc --sweep` (issue 9).

A store with every kind of garbage (superseded manifests under keep-K, the
state payloads only they name, orphans, stale temps, a corrupt chunk) is
swept under tests/crash/kill_at_step.c, an LD_PRELOAD shim that SIGKILLs
kvstore just before its Nth unlink/rename. For every N from 1 to the number
of deletion steps a full sweep makes:

- no manifest left on disk names a missing or mismatched chunk, checked
  both by `kvstore verify` and independently with the Python codec;
- nothing the full sweep keeps was deleted;
- a second, unkilled sweep reaches exactly the full sweep's result, and a
  third run plans nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT

SHIM_SOURCE = REPO_ROOT / "tests" / "crash" / "kill_at_step.c"
OVERLAY_DIR = REPO_ROOT / "overlays" / "kv-offload-store-local"
if str(OVERLAY_DIR) not in sys.path:
    sys.path.insert(0, str(OVERLAY_DIR))

import kv_store_format  # noqa: E402 (found through the path above)
from chunk_calls import ChunkCalls  # noqa: E402

fmt = ChunkCalls(kv_store_format)  # the package, and the chunk calls tests make

FULL = 0
STATE = 2
CHUNK_TOKENS = 16
AGE_S = 3600  # older than kvstore's default grace period (600 s)
KEEP = 2
# Two chains sharing a prefix: keep-2 by leaf walk keeps a..e, a..d, a,b,x,y
# and a,b,x; it supersedes a, a,b and a..c, whose state payloads go with them.
CHAINS = [
    ["a"],
    ["a", "b"],
    ["a", "b", "c"],
    ["a", "b", "c", "d"],
    ["a", "b", "c", "d", "e"],
    ["a", "b", "x"],
    ["a", "b", "x", "y"],
]
# Deletion-finding kinds that would mean the sweep broke the store.
BROKEN = {"missing", "mismatch", "bad-manifest", "bad-namespace"}


def key_of(name: str) -> str:
    return hashlib.sha256(f"crash/{name}".encode()).hexdigest()[:32]


def segments(group: int) -> tuple[fmt.Segment, ...]:
    if group == STATE:
        return fmt.make_segments(
            [
                (0, fmt.SegmentKind.CONV, fmt.DType.BFLOAT16, (2, 3), (3, 1)),
                (0, fmt.SegmentKind.TEMPORAL, fmt.DType.FLOAT32, (2, 2), (2, 1)),
            ]
        )
    return fmt.make_segments([(0, fmt.SegmentKind.KV, fmt.DType.UINT8, (32,), (1,))])


def payload(segs: tuple[fmt.Segment, ...], seed: str) -> bytes:
    n = sum(s.length for s in segs)
    out = b""
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{len(out)}".encode()).digest()
    return out[:n]


class CrashStore:
    """One rank under `tier`, built the same way every time."""

    def __init__(self, tier: Path) -> None:
        self.tier = tier
        fenced = fmt.make_fenced(
            model="crash/model",
            vllm_version="0.0.test",
            build_id="crash",
            tp_size=1,
            kv_dtype="auto",
            hash_algorithm="sha256_cbor",
            num_speculative_tokens=0,
            page_sizes={FULL: 32, STATE: 28},
            state_abi={"layers": 1},
        )
        self.ns_hash = fmt.namespace_hash(fenced)
        self.layout = fmt.StoreLayout.create(str(tier), "crash/model", self.ns_hash, 0)
        tier.mkdir(parents=True)
        record = fmt.NamespaceRecord(fenced, {"rank": 0, "keep_boundaries": KEEP})
        Path(self.layout.namespace_record).write_bytes(
            fmt.encode_namespace_record(record)
        )
        self.entries: dict[tuple[int, str], fmt.ManifestEntry] = {}

    @property
    def base(self) -> Path:
        return Path(self.layout.base)

    def chunk(self, name: str, group: int, boundary: int) -> Path:
        key = key_of(name)
        segs = segments(group)
        body = payload(segs, f"{name}/{group}")
        header = fmt.make_header(
            self.ns_hash, group, bytes.fromhex(key), boundary, segs, body
        )
        data = fmt.encode_chunk(header, body)
        path = Path(self.layout.chunk(key, group))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        header = fmt.decode_header(data)
        self.entries[(group, key)] = fmt.ManifestEntry(
            key, header.payload_length, header.payload_checksum
        )
        return path

    def boundary(self, names: list[str]) -> Path:
        """The writer's order: every chunk first, the manifest last."""
        chain = tuple(key_of(n) for n in names)
        for i, name in enumerate(names):
            self.chunk(name, FULL, (i + 1) * CHUNK_TOKENS)
        self.chunk(names[-1], STATE, len(names) * CHUNK_TOKENS)
        m = fmt.BoundaryManifest(
            namespace=self.ns_hash.hex(),
            rank=0,
            boundary=len(chain) * CHUNK_TOKENS,
            chunk_tokens=CHUNK_TOKENS,
            chain=chain,
            groups=(
                fmt.ManifestGroup(
                    FULL,
                    fmt.GROUP_KIND_FULL,
                    tuple(self.entries[(FULL, k)] for k in chain),
                ),
                fmt.ManifestGroup(
                    STATE, fmt.GROUP_KIND_STATE, (self.entries[(STATE, chain[-1])],)
                ),
            ),
        )
        path = Path(self.layout.manifest(m.boundary, m.tip))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(fmt.encode_manifest(m))
        return path


def build_store(tier: Path) -> CrashStore:
    store = CrashStore(tier)
    for names in CHAINS:
        store.boundary(names)
    # Orphans: state payloads no manifest names (a writer died before publishing).
    store.chunk("orphan-1", STATE, 5 * CHUNK_TOKENS)
    store.chunk("orphan-2", STATE, 6 * CHUNK_TOKENS)
    # A corrupt chunk: one bit of its header's namespace hash flipped.
    bad = store.chunk("corrupt", STATE, 7 * CHUNK_TOKENS)
    data = bytearray(bad.read_bytes())
    data[50] ^= 0x01
    bad.write_bytes(bytes(data))
    # Stale temps of a chunk and of a manifest (pid/tid of a dead writer).
    chunk_path = Path(store.layout.chunk(key_of("e"), FULL))
    temp = chunk_path.parent / fmt.temp_name(chunk_path.name, 4242, 4243)
    temp.write_bytes(chunk_path.read_bytes()[:100])
    manifest_dir = Path(store.layout.manifest_dir)
    some_manifest = min(manifest_dir.iterdir())
    (manifest_dir / fmt.temp_name(some_manifest.name, 4242, 4244)).write_bytes(b"{")
    for dirpath, _dirs, files in os.walk(tier):
        for f in files:
            p = Path(dirpath) / f
            st = p.stat()
            os.utime(p, (st.st_atime - AGE_S, st.st_mtime - AGE_S))
    return store


def files_under(root: Path) -> set[str]:
    out = set()
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            out.add(str((Path(dirpath) / f).relative_to(root)))
    return out


def broken_references(store: CrashStore) -> list[str]:
    """Independent of kvstore: every manifest on disk must name chunks that
    exist with the length and checksum it records."""
    problems = []
    manifest_dir = Path(store.layout.manifest_dir)
    for path in sorted(manifest_dir.glob("b*.json")):
        m = fmt.decode_manifest(path.read_bytes())
        for g in m.groups:
            for e in g.entries:
                chunk = Path(store.layout.chunk(e.key, g.group))
                if not chunk.is_file():
                    problems.append(f"{path.name} names missing {chunk.name}")
                    continue
                h = fmt.read_chunk_header(str(chunk))
                if (h.payload_length, h.payload_checksum) != (e.length, e.checksum):
                    problems.append(f"{path.name} names mismatched {chunk.name}")
    return problems


def kvstore(binary: Path, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [str(binary), *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def verify_findings(binary: Path, root: Path) -> list[dict]:
    p = kvstore(binary, "verify", "--json", str(root))
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)["findings"]


def planned(binary: Path, root: Path) -> list[str]:
    p = kvstore(binary, "gc", "--json", str(root))
    assert p.returncode == 0, p.stdout + p.stderr
    return [item["path"] for item in json.loads(p.stdout)["plan"]["items"]]


@pytest.fixture(scope="module")
def shim(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler for the LD_PRELOAD shim")
    out = tmp_path_factory.mktemp("shim") / "kill_at_step.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SHIM_SOURCE), "-ldl"],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def reference(kvstore_bin, shim, tmp_path_factory):
    """An uninterrupted sweep under the shim (counting only): the steps it
    takes and the files it leaves."""
    tier = tmp_path_factory.mktemp("reference") / "tier"
    build_store(tier)
    before = files_under(tier)
    log = tier.parent / "steps.log"
    env = {"LD_PRELOAD": str(shim), "KVTIER_CRASH_LOG": str(log)}
    p = kvstore(kvstore_bin, "gc", "--sweep", str(tier), env=env)
    # 0: the store held damage (the corrupt orphan) when the sweep began, and
    # the sweep removed it (issue 48: a repair is not a failure).
    assert p.returncode == 0, p.stdout + p.stderr
    assert "all 1 damaged removed by this sweep" in p.stdout, p.stdout
    after = files_under(tier)
    steps = log.read_text().splitlines() if log.exists() else []
    return before, after, steps


def test_the_shim_sees_every_deletion(reference):
    before, after, steps = reference
    removed = sorted(Path(f).name for f in before - after)
    unlinked = sorted(
        s.split(" ", 2)[2] for s in steps if s.split()[1].startswith("unlink")
    )
    # Every file the sweep removed went through the shim, so killing at each
    # step really covers each deletion.
    assert unlinked == removed
    # The store holds garbage of every kind: 3 superseded manifests, their 3
    # state payloads, 2 orphans, the corrupt orphan and 2 stale temps.
    assert len(removed) == 11
    assert {f for f in before - after if "/manifests/" in f and f.endswith(".json")}
    assert len(steps) >= len(removed)
    # The four manifests keep-2 retains by leaf walk survive, and nothing
    # they name was touched.
    assert len([f for f in after if "/manifests/b" in f]) == 4


def test_kill_at_every_deletion_step(kvstore_bin, shim, reference, tmp_path):
    _before, final, steps = reference
    assert steps, "the reference sweep deleted nothing"
    for n in range(1, len(steps) + 1):
        tier = tmp_path / f"kill{n}" / "tier"
        store = build_store(tier)
        env = {"LD_PRELOAD": str(shim), "KVTIER_CRASH_AT": str(n)}
        p = kvstore(kvstore_bin, "gc", "--sweep", str(tier), env=env)
        assert p.returncode == -signal.SIGKILL, (n, p.returncode, p.stderr)

        # The crash left no manifest naming a missing or mismatched chunk.
        broken = [f for f in verify_findings(kvstore_bin, tier) if f["kind"] in BROKEN]
        assert broken == [], (n, broken)
        assert broken_references(store) == [], n
        # Nothing that the complete sweep keeps is gone.
        left = files_under(tier)
        assert final - left == set(), (n, sorted(final - left))

        # A second sweep converges to the complete sweep's result ...
        p = kvstore(kvstore_bin, "gc", "--sweep", str(tier))
        assert p.returncode in (0, 1), (n, p.stdout + p.stderr)
        assert files_under(tier) == final, n
        # ... and after it there is nothing left to plan.
        assert planned(kvstore_bin, tier) == [], n
