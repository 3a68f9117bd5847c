# SPDX-License-Identifier: Apache-2.0
"""Restore, worker side: the inventory of this rank's store.

At the first step the worker scans its manifests and keeps, in memory, which
key each good manifest proves (a full-attention key as part of a chain, a
state key only at the manifest's boundary). Later manifests the writer
publishes, and the ones keep-K or ``kvstore gc`` remove, are picked up by a
rescan of the manifest directory (names only). A manifest naming a key whose
promotion failed is marked bad and never used again by this process.
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

    def __init__(self, manifest_dir: str, namespace: bytes, rank: int):
        self.manifest_dir = manifest_dir
        self.namespace_hex = namespace.hex()
        self.rank = rank
        self.manifests: dict[str, list[Proof]] = {}
        self.bad: set[str] = set()
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
        self.bad &= names
        for name in sorted(names - self.manifests.keys() - self.bad):
            proofs = self._load(name)
            if proofs is None:
                rejected += 1
                self.bad.add(name)
                continue
            loaded += 1
            self.manifests[name] = proofs
            for p in proofs:
                self._by_key.setdefault(offload_key(p.key_hex, p.group), {})[name] = p
        return loaded, rejected

    def _load(self, name: str) -> list[Proof] | None:
        path = os.path.join(self.manifest_dir, name)
        try:
            m = fmt.decode_manifest(fmt.read_regular(path, fmt.MAX_MANIFEST_BYTES))
        except (OSError, fmt.FormatError) as e:
            logger.warning("KV restore: manifest %s not used: %s", path, e)
            return None
        if (
            m.namespace != self.namespace_hex
            or m.rank != self.rank
            or m.file_name != name
        ):
            logger.warning(
                "KV restore: manifest %s not used: namespace, rank or name differ",
                path,
            )
            return None
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
        return proofs

    def _drop(self, name: str) -> None:
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
            self._drop(name)
            self.bad.add(name)
        return names

    def proof(self, key: bytes) -> Proof | None:
        named = self._by_key.get(key)
        if not named:
            return None
        return named[min(named)]

    def keys(self) -> set[bytes]:
        return set(self._by_key)
