# SPDX-License-Identifier: Apache-2.0
"""Publishing one boundary manifest whose files are all durable: every named
header read again now, under the store lock (the manifest may name chunks
written long ago or by an earlier boot), the manifest built from them and
written durably (temp, fsync, rename, folder fsync; FORMAT.md 7.5).

The caller tells the published names, the ledger and the disk budget of the
result, and runs keep-K after it.
"""

import os
from dataclasses import dataclass

from . import durable_io
from .captured import Candidate
from .chunk_lookup import ChunkLookup
from .deps import fmt, init_logger
from .ledger import ChunkLedger, Ident
from .stats import StoreStats

logger = init_logger(__name__)


@dataclass(frozen=True)
class Publication:
    """A manifest on disk: its name, path, content and the chunks it names."""

    name: str
    path: str
    manifest: fmt.BoundaryManifest
    named: tuple[Ident, ...]


class Publisher:
    def __init__(
        self,
        layout: fmt.StoreLayout,
        namespace: bytes,
        rank: int,
        key: bytes | None,
        lookup: ChunkLookup,
        ledger: ChunkLedger,
        stats: StoreStats,
    ):
        self.layout = layout
        self.key = key  # a keyed store's: every manifest sealed with it
        self.namespace = namespace
        self.rank = rank
        self._lookup = lookup
        self._ledger = ledger
        self._stats = stats

    def publish(self, candidate: Candidate) -> Publication | None:
        """The manifest written, or None when a named file is missing or no
        longer what this boot knew (counted, logged; the ledger told). A
        failed write raises (OSError, fmt.FormatError): nothing was renamed
        into place, or a rename whose sync failed may be left."""
        name = candidate.name
        entries: dict[Ident, fmt.ManifestEntry] = {}
        for ident in candidate.needed():
            header = (
                None if self._ledger.is_failed(ident) else self._lookup.header(ident)
            )
            known = self._ledger.entry(ident)
            if header is None or (
                known is not None
                and known != (header.payload_length, header.payload_checksum)
            ):
                self._ledger.unverified(ident)
                self._stats.manifests_dropped += 1
                logger.warning(
                    "KV store: not publishing %s: %s (group %d) is missing or "
                    "does not verify",
                    name,
                    ident[0].hex(),
                    ident[1],
                )
                return None
            entries[ident] = fmt.ManifestEntry(
                ident[0].hex(), header.payload_length, header.payload_checksum
            )
        manifest = self._manifest(candidate, entries)
        path = os.path.join(self.layout.manifest_dir, name)
        durable_io.write_file_durably(path, [fmt.encode_manifest(manifest, self.key)])
        return Publication(name, path, manifest, tuple(entries))

    def _manifest(
        self, candidate: Candidate, entries: dict[Ident, fmt.ManifestEntry]
    ) -> fmt.BoundaryManifest:
        groups = []
        for g in sorted((*candidate.full, *candidate.state)):
            if g in candidate.full:
                group_entries = tuple(entries[(h, g)] for h in candidate.chain)
                kind = fmt.GROUP_KIND_FULL
            else:
                group_entries = (entries[(candidate.chain[-1], g)],)
                kind = fmt.GROUP_KIND_STATE
            groups.append(fmt.ManifestGroup(g, kind, group_entries))
        return fmt.BoundaryManifest(
            namespace=self.namespace.hex(),
            rank=self.rank,
            boundary=candidate.boundary,
            chunk_tokens=candidate.chunk_tokens,
            chain=tuple(h.hex() for h in candidate.chain),
            groups=tuple(groups),
        )
