# SPDX-License-Identifier: Apache-2.0
"""Boundary-manifest candidates: which wait for which chunk files, and which
are ready to publish.

The writer registers each job's candidates and tells the book of every file
the ledger now holds durable; the book answers with the names that no longer
miss a file. What a sweep must keep for them is listed by
``pending_chunks`` (the pending record, FORMAT.md 9.1). Writer thread only.
"""

import os
from collections import OrderedDict
from collections.abc import Iterable

from .captured import Candidate
from .chunk_lookup import ChunkLookup
from .ledger import ChunkLedger, Ident
from .published import PublishedIndex
from .stats import StoreStats


class ManifestBook:
    MAX_PENDING_CANDIDATES = 1024

    def __init__(
        self,
        ledger: ChunkLedger,
        lookup: ChunkLookup,
        published: PublishedIndex,
        stats: StoreStats,
    ):
        # Read here; the ledger is told only of files found on disk.
        self._ledger = ledger
        self._lookup = lookup
        self._published = published
        self._stats = stats
        self._pending: OrderedDict[str, tuple[Candidate, set[Ident]]] = OrderedDict()
        self._waiting: dict[Ident, set[str]] = {}
        self._version = 0

    @property
    def pending_version(self) -> tuple[int, int, int]:
        """Changes when pending_chunks() may: the candidates, the ledger, and
        the published names (keep-K and the disk budget retire some)."""
        return self._version, self._ledger.version, self._published.version

    def register(self, candidate: Candidate) -> list[str]:
        """Track a candidate; returns it when nothing it names is missing.

        The caller publishes only after syncing the ledger's dirty folders
        (files found on disk here have theirs marked).
        """
        name = candidate.name
        if name in self._published or name in self._pending:
            return []
        self._version += 1
        missing: set[Ident] = set()
        for ident in candidate.needed():
            if self._ledger.is_failed(ident):
                missing.add(ident)  # waits for the key's rewrite
                continue
            if self._ledger.counted_on(ident):
                continue
            if ident in self._waiting:
                # A candidate registered earlier found it missing and it has
                # not become durable since (completed() tells both): not
                # looked for on disk again. Each job's candidate names the
                # whole chain, so a burst asked for its missing keys again
                # and again.
                missing.add(ident)
                continue
            header = self._lookup.header(ident)
            if header is not None:
                entry = (header.payload_length, header.payload_checksum)
                folder = os.path.dirname(self._lookup.path(ident))
                self._ledger.found(ident, entry, folder)
            else:
                missing.add(ident)
        self._pending[name] = (candidate, missing)
        for ident in missing:
            self._waiting.setdefault(ident, set()).add(name)
        if not missing:
            return [name]
        while len(self._pending) > self.MAX_PENDING_CANDIDATES:
            old, (_, old_missing) = self._pending.popitem(last=False)
            self._forget_waiting(old, old_missing)
            self._stats.manifests_dropped += 1
        return []

    def _forget_waiting(self, name: str, missing: Iterable[Ident]) -> None:
        for ident in missing:
            names = self._waiting.get(ident)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._waiting[ident]

    def completed(self, ident: Ident) -> list[str]:
        """The ledger holds this file durable now: the candidates it completes."""
        ready = []
        for name in self._waiting.pop(ident, ()):
            pending = self._pending.get(name)
            if pending is None:
                continue
            pending[1].discard(ident)
            if not pending[1]:
                ready.append(name)
        return ready

    def take(self, name: str) -> Candidate | None:
        """The ready candidate of that name, no longer waiting (None: taken
        before, or dropped)."""
        pending = self._pending.pop(name, None)
        if pending is None:
            return None
        self._version += 1
        return pending[0]

    def pending_chunks(self) -> list[tuple[int, str]]:
        """(group, key hex), sorted, each once: every chunk written or reused
        this boot that no published manifest names yet, and, of what waiting
        candidates need beyond their longest published prefix, the chunks it
        knows are on disk (a key not written yet has no file to keep: issue
        45, listing those made every refused job grow the record past the
        disk budget). What gc must not take for orphans (FORMAT.md 9.1)."""
        published = self._published
        durable = self._ledger.is_durable
        out = {(g, h.hex()) for h, g in self._ledger.unpublished()}
        for candidate, _ in self._pending.values():
            chain = candidate.chain
            hexes = tuple(h.hex() for h in chain)
            done = next(
                (k for k in range(len(hexes), 0, -1) if published.has_chain(hexes[:k])),
                0,
            )
            out.update(
                (g, hexes[i])
                for g in candidate.full
                for i in range(done, len(chain))
                if durable((chain[i], g))
            )
            out.update(
                (g, hexes[-1]) for g in candidate.state if durable((chain[-1], g))
            )
        return sorted(out)
