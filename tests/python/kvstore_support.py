"""Builds chunk stores for the kvstore tests with the Python format codec.

A store here is a tier directory holding one rank base (or more): namespace
record, chunk files and boundary manifests exactly as the writer lays them
out (docs/FORMAT.md). Group 0 is a full-attention group (one kv segment per
layer) and group 2 a state group (conv + temporal per layer). Helpers break
it in the ways the catalogue needs.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OVERLAY_DIR = REPO_ROOT / "overlays" / "kv-offload-store-local"
for _folder in (OVERLAY_DIR, REPO_ROOT / "sim"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import kv_store_format  # noqa: E402
from chunk_calls import ChunkCalls  # noqa: E402

fmt = ChunkCalls(kv_store_format)  # the package, and the chunk calls tests make

FULL_GROUP = 0
STATE_GROUP = 2
CHUNK_TOKENS = 64
OLD = 3600  # seconds: older than the default grace period


def key_of(name: str) -> str:
    """A deterministic 16-byte chunk key (32 hex digits) for a short name."""
    return hashlib.sha256(name.encode()).hexdigest()[:32]


def full_segments(layers: int = 2, page: int = 48) -> tuple[fmt.Segment, ...]:
    return fmt.make_segments(
        [(i, fmt.SegmentKind.KV, fmt.DType.UINT8, (page,), (1,)) for i in range(layers)]
    )


def state_segments(layers: int = 2) -> tuple[fmt.Segment, ...]:
    specs = []
    for i in range(layers):
        specs.append((i, fmt.SegmentKind.CONV, fmt.DType.BFLOAT16, (4, 3), (3, 1)))
        specs.append((i, fmt.SegmentKind.TEMPORAL, fmt.DType.FLOAT32, (2, 4), (4, 1)))
    return fmt.make_segments(specs)


def payload_for(segments: tuple[fmt.Segment, ...], seed: str) -> bytes:
    n = sum(s.length for s in segments)
    out = b""
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{counter}".encode()).digest()
        counter += 1
    return out[:n]


@dataclass
class Store:
    """One rank of a store under `tier`."""

    tier: Path
    rank: int = 0
    model: str = "test/model"
    keep: int | None = 2
    build_id: str = "b1"
    entries: dict[str, fmt.ManifestEntry] = field(default_factory=dict)
    format_version: int = fmt.FORMAT_VERSION  # 1: a store an old writer left

    def __post_init__(self) -> None:
        self.fenced = fmt.make_fenced(
            model=self.model,
            vllm_version="0.0.test",
            build_id=self.build_id,
            tp_size=2,
            kv_dtype="auto",
            hash_algorithm="sha256_cbor",
            num_speculative_tokens=0,
            page_sizes={FULL_GROUP: 96, STATE_GROUP: 112},
            state_abi={"layers": 2},
            format_version=self.format_version,
        )
        self.ns_hash = fmt.namespace_hash(self.fenced)
        self.layout = fmt.StoreLayout.create(
            str(self.tier), self.model, self.ns_hash, self.rank
        )
        info = {"rank": self.rank}
        if self.keep is not None:
            info["keep_boundaries"] = self.keep
        record = fmt.encode_namespace_record(fmt.NamespaceRecord(self.fenced, info))
        self.tier.mkdir(parents=True, exist_ok=True)
        Path(self.layout.namespace_record).write_bytes(record)
        os.makedirs(self.layout.base, exist_ok=True)

    @property
    def base(self) -> Path:
        return Path(self.layout.base)

    @property
    def name(self) -> str:
        return self.layout.base_name

    def chunk(
        self, key: str, group: int, boundary: int, ns_hash: bytes | None = None
    ) -> Path:
        """Writes one chunk file (idempotent) and returns its path."""
        segs = state_segments() if group == STATE_GROUP else full_segments()
        payload = payload_for(segs, f"{key}/{group}")
        header = fmt.make_header(
            ns_hash or self.ns_hash,
            group,
            bytes.fromhex(key),
            boundary,
            segs,
            payload,
            self.format_version,
        )
        data = fmt.encode_chunk(header, payload)
        path = Path(self.layout.chunk(key, group))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        header = fmt.decode_header(data)
        self.entries[f"{group}/{key}"] = fmt.ManifestEntry(
            key, header.payload_length, header.payload_checksum
        )
        return path

    def manifest_for(self, chain: list[str]) -> fmt.BoundaryManifest:
        boundary = len(chain) * CHUNK_TOKENS
        return fmt.BoundaryManifest(
            namespace=self.ns_hash.hex(),
            rank=self.rank,
            boundary=boundary,
            chunk_tokens=CHUNK_TOKENS,
            chain=tuple(chain),
            groups=(
                fmt.ManifestGroup(
                    FULL_GROUP,
                    fmt.GROUP_KIND_FULL,
                    tuple(self.entries[f"{FULL_GROUP}/{k}"] for k in chain),
                ),
                fmt.ManifestGroup(
                    STATE_GROUP,
                    fmt.GROUP_KIND_STATE,
                    (self.entries[f"{STATE_GROUP}/{chain[-1]}"],),
                ),
            ),
            format=self.format_version,
        )

    def boundary(self, names: list[str]) -> Path:
        """Writes every chunk a boundary needs, then its manifest (in that order)."""
        chain = [key_of(n) for n in names]
        for i, key in enumerate(chain):
            self.chunk(key, FULL_GROUP, (i + 1) * CHUNK_TOKENS)
        self.chunk(chain[-1], STATE_GROUP, len(chain) * CHUNK_TOKENS)
        return self.write_manifest(self.manifest_for(chain))

    def write_manifest(self, m: fmt.BoundaryManifest) -> Path:
        path = Path(self.layout.manifest(m.boundary, m.tip))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(fmt.encode_manifest(m))
        return path

    def rel(self, path: Path) -> str:
        """Path relative to the tier directory, as kvstore reports it."""
        return str(Path(path).relative_to(self.tier))

    def chunk_rel(self, name: str, group: int) -> str:
        return f"{self.name}/{fmt.chunk_rel_path(key_of(name), group)}"

    def manifest_rel(self, names: list[str]) -> str:
        chain = [key_of(n) for n in names]
        return (
            f"{self.name}/manifests/"
            f"{fmt.manifest_file_name(len(chain) * CHUNK_TOKENS, chain[-1])}"
        )


def age(path: Path, seconds: float = OLD) -> None:
    """Moves a file's mtime into the past."""
    st = os.stat(path, follow_symlinks=False)
    os.utime(path, (st.st_atime, st.st_mtime - seconds), follow_symlinks=False)


def age_tree(root: Path, seconds: float = OLD) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            if not p.is_symlink():
                age(p, seconds)


def files_under(root: Path) -> set[str]:
    """Every non-directory entry under root, relative, symlinks included."""
    out = set()
    for dirpath, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if (Path(dirpath) / d).is_symlink()]:
            out.add(str((Path(dirpath) / name).relative_to(root)))
    return out


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


@dataclass
class Run:
    code: int
    out: str
    err: str


def run(binary: Path, *args: str, user: str | None = None) -> Run:
    cmd = [str(binary), *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return Run(p.returncode, p.stdout, p.stderr)
