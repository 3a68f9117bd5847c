# SPDX-License-Identifier: Apache-2.0
"""Keep-K after a publication: within the tree of chains the new manifest
joins, only the newest ``keep`` boundaries of each chain stay
(``fmt.kept_manifests``, the GC's leaf walk). Superseded manifests are
unlinked, ``manifests/`` synced, and only then their state payloads (FORMAT.md
7.6); full-attention chunks stay (descendants name them)."""

import os

from . import durable_io
from .budget import DiskBudget
from .deps import fmt
from .ledger import ChunkLedger
from .published import PublishedIndex
from .stats import StoreStats


class KeepK:
    def __init__(
        self,
        layout: fmt.StoreLayout,
        key: bytes | None,
        keep: int,
        published: PublishedIndex,
        ledger: ChunkLedger,
        stats: StoreStats,
        budget: DiskBudget | None,
    ):
        self.layout = layout
        self.key = key  # a keyed store's: superseded manifests opened with it
        self.keep = keep  # 0: every manifest is kept
        self._published = published
        self._ledger = ledger
        self._stats = stats
        # Told of every file unlinked here; None: no disk budget.
        self._budget = budget

    def retain(self, manifest: fmt.BoundaryManifest) -> None:
        """Keep-K inline, within the tree of chains the new manifest joins."""
        if self.keep == 0:
            return
        root = manifest.chain[0]
        tree = self._published.tree(root)
        kept = fmt.kept_manifests(tree, self.keep)
        superseded = [n for n in tree if n not in kept]
        if not superseded:
            return
        kept_state = {tree[n][-1] for n in kept}
        removed_dirs: set[str] = set()
        old_manifests: dict[str, fmt.BoundaryManifest | None] = {}
        for n in superseded:
            try:
                old_manifests[n] = fmt.decode_manifest(
                    fmt.read_regular(
                        os.path.join(self.layout.manifest_dir, n),
                        fmt.MAX_MANIFEST_BYTES,
                    ),
                    self.key,
                )
            except (OSError, fmt.FormatError):
                old_manifests[n] = None
            try:
                os.unlink(os.path.join(self.layout.manifest_dir, n))
            except FileNotFoundError:
                pass
            if self._budget is not None:
                self._budget.removed(os.path.join(self.layout.manifest_dir, n))
        # FORMAT.md 7.6: the unlinks are durable before any payload they name
        # goes, so a power loss cannot bring back a manifest naming a deleted file.
        durable_io.fsync_dir(self.layout.manifest_dir)
        for n in superseded:
            manifest_chain = tree[n]
            old = old_manifests[n]
            self._published.forget(n)
            self._stats.manifests_superseded += 1
            if old is None or manifest_chain[-1] in kept_state:
                continue
            # Full-attention chunks stay (descendants name them); the state
            # payloads of a superseded boundary go with it.
            for group in old.groups:
                if group.kind != fmt.GROUP_KIND_STATE:
                    continue
                chunk = self.layout.chunk(old.tip, group.group)
                if self._budget is not None:
                    self._budget.removed(chunk)
                try:
                    os.unlink(chunk)
                except FileNotFoundError:
                    continue
                self._ledger.removed((bytes.fromhex(old.tip), group.group))
                self._stats.state_files_removed += 1
                removed_dirs.add(os.path.dirname(chunk))
        for d in removed_dirs:
            durable_io.fsync_dir(d)
