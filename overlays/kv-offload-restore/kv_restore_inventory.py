# SPDX-License-Identifier: Apache-2.0
"""Restore, worker side: the inventory of this rank's store.

At the first step the worker scans its manifests and keeps, in memory, which
key each good manifest proves (a full-attention key as part of a chain, a
state key only at the manifest's boundary). Later manifests the writer
publishes, and the ones keep-K or ``kvstore gc`` remove, are picked up by a
rescan of the manifest directory (names only). A manifest naming a key whose
promotion failed is marked bad and not used again by this process unless a
writer replaces the file (same name, new inode, size or mtime).
"""

import logging
import os
from dataclasses import dataclass

try:
    from . import kv_store_format as fmt
except ImportError:  # loaded as a top-level module: tests, tools
    import kv_store_format as fmt  # type: ignore[no-redef]

logger = logging.getLogger(__name__)


def offload_key(key_hex: str, group: int) -> bytes:
    """vLLM's OffloadKey: the block hash plus the 4-byte big-endian group."""
    return bytes.fromhex(key_hex) + group.to_bytes(4, "big")


Identity = tuple[int, int, int]  # inode, size, mtime_ns of a manifest file


@dataclass(frozen=True)
class Proof:
    """One key a manifest of this rank proves, and what its file must say."""

    manifest: str  # manifest file name
    key_hex: str
    group: int
    kind: str  # fmt.GROUP_KIND_FULL or fmt.GROUP_KIND_STATE
    boundary: int  # the chunk header's boundary_token_index
    length: int
    checksum: int
    chunk_tokens: int


class Inventory:
    """The keys this rank's manifests prove; memory only after the scan."""

    def __init__(
        self, manifest_dir: str, namespace: bytes, rank: int, key: bytes | None = None
    ):
        self.manifest_dir = manifest_dir
        self.key = key  # a keyed store's: a manifest whose MAC fails is rejected
        self.namespace_hex = namespace.hex()
        self.rank = rank
        self.manifests: dict[str, list[Proof]] = {}
        # name -> the file's identity when it was judged bad: a manifest
        # rewritten under the same name (a boundary published again) is read
        # again, an unchanged bad one never.
        self.bad: dict[str, Identity | None] = {}
        self._identity: dict[str, Identity] = {}  # of each loaded manifest
        self._by_key: dict[bytes, dict[str, Proof]] = {}

    def scan(self) -> tuple[int, int]:
        """Load new manifests, forget removed ones (names only if unchanged).

        Returns how many new manifests were loaded and how many rejected.
        """
        loaded = rejected = 0
        try:
            names = {
                n
                for n in os.listdir(self.manifest_dir)
                if n.endswith(".json") and ".tmp." not in n
            }
        except FileNotFoundError:
            names = set()
        for gone in [n for n in self.manifests if n not in names]:
            self._drop(gone)
        for name, seen in list(self.bad.items()):
            if name not in names or self._lstat(name) != seen:
                del self.bad[name]
        for name in sorted(names - self.manifests.keys() - self.bad.keys()):
            proofs, identity = self._load(name)
            if proofs is None:
                rejected += 1
                self.bad[name] = identity
                continue
            loaded += 1
            self.manifests[name] = proofs
            self._identity[name] = identity
            for p in proofs:
                self._by_key.setdefault(offload_key(p.key_hex, p.group), {})[name] = p
        return loaded, rejected

    def _lstat(self, name: str) -> Identity | None:
        try:
            st = os.lstat(os.path.join(self.manifest_dir, name))
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _load(self, name: str) -> tuple[list[Proof] | None, Identity | None]:
        """The proofs of one manifest (None: not usable), and the identity
        of the file they were read from."""
        path = os.path.join(self.manifest_dir, name)
        identity = self._lstat(name)
        try:
            fd = fmt.open_regular(path)
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(f.fileno())
                identity = (st.st_ino, st.st_size, st.st_mtime_ns)
                m = fmt.decode_manifest(f.read(fmt.MAX_MANIFEST_BYTES + 1), self.key)
        except (OSError, fmt.FormatError) as e:
            logger.warning("KV restore: manifest %s not used: %s", path, e)
            return None, identity
        if (
            m.namespace != self.namespace_hex
            or m.rank != self.rank
            or m.file_name != name
        ):
            logger.warning(
                "KV restore: manifest %s not used: namespace, rank or name differ",
                path,
            )
            return None, identity
        proofs = []
        for g in m.groups:
            for i, e in enumerate(g.entries):
                boundary = (
                    (i + 1) * m.chunk_tokens
                    if g.kind == fmt.GROUP_KIND_FULL
                    else m.boundary
                )
                proofs.append(
                    Proof(
                        name,
                        e.key,
                        g.group,
                        g.kind,
                        boundary,
                        e.length,
                        e.checksum,
                        m.chunk_tokens,
                    )
                )
        return proofs, identity

    def _drop(self, name: str) -> None:
        self._identity.pop(name, None)
        for p in self.manifests.pop(name, ()):
            key = offload_key(p.key_hex, p.group)
            named = self._by_key.get(key)
            if named is not None:
                named.pop(name, None)
                if not named:
                    del self._by_key[key]

    def mark_bad(self, key: bytes) -> list[str]:
        """Stop using every manifest that names ``key``; returns their names."""
        names = list(self._by_key.get(key, {}))
        for name in names:
            identity = self._identity.get(name)
            self._drop(name)
            self.bad[name] = identity
        return names

    def proof(self, key: bytes) -> Proof | None:
        named = self._by_key.get(key)
        if not named:
            return None
        return named[min(named)]

    def keys(self) -> set[bytes]:
        return set(self._by_key)
