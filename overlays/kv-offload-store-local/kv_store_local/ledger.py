# SPDX-License-Identifier: Apache-2.0
"""The writer's ledger of chunk files: which are durable, which failed, which
no published manifest names yet, and which folders must be synced before a
manifest may name a file in them.

The writer thread hands it results (a file written, one found on disk or
deduplicated onto, a write failed or a reader refused a file, a manifest
published, a file removed, folders synced) and asks it questions; its state
changes through nothing else.
"""

from collections import OrderedDict
from collections.abc import Iterable, Iterator

from .stats import StoreStats

Ident = tuple[bytes, int]  # (chunk key hash, group)
Entry = tuple[int, int]  # (payload length, payload checksum), verified


class ChunkLedger:
    MAX_KNOWN_DURABLE = 1 << 18
    # Chunks counted on but named by no published manifest: at ~70 bytes a
    # pending-record entry, 64k of them is a 4.5 MB record.
    MAX_UNPUBLISHED = 1 << 16

    def __init__(self, stats: StoreStats):
        self._stats = stats
        # Durable files this boot knows, least recently used first.
        self._durable: OrderedDict[Ident, Entry] = OrderedDict()
        # Failed writes and refused files: not taken from disk or manifested
        # until written anew in full.
        self._failed: set[Ident] = set()
        # Every chunk written or reused this boot that no manifest published
        # since names yet, oldest first: the pending record lists them all,
        # so a sweep keeps a job's chunks even before any candidate names
        # them (a job of full-attention chunks only carries no candidate).
        self._unpublished: OrderedDict[Ident, None] = OrderedDict()
        # Folders whose entries must be synced before a manifest names a
        # file in them (new folders' parents, files the library did not sync).
        self._dirty: set[str] = set()
        # Entries added to the pending record's list since it was last
        # written (an upper bound: the disk budget counts their bytes until
        # the writer rewrites the record, budget.record_bytes).
        self._listed = 0
        self._version = 0

    # -- results -------------------------------------------------------------

    def written(self, ident: Ident, entry: Entry) -> None:
        """The library wrote the file in full this boot (its folder synced)."""
        self._failed.discard(ident)
        self._remember(ident, entry)

    def found(self, ident: Ident, entry: Entry, folder: str) -> None:
        """A file this boot did not write verifies on disk (an earlier boot's,
        or one deduplicated onto): its data was synced before its rename, but
        its folder entry may not be durable yet, so the folder is synced
        before any manifest names it."""
        self._dirty.add(folder)
        self._remember(ident, entry)

    def folder_made(self, parent: str) -> None:
        """A new folder's entry in ``parent`` must be durable before files in
        it are named."""
        self._dirty.add(parent)

    def failed(self, ident: Ident) -> None:
        """A write failed, or a reader refused the file: not taken from disk
        or manifested until written anew in full."""
        self._version += 1
        self._failed.add(ident)
        self._durable.pop(ident, None)
        self._unpublished.pop(ident, None)

    def unverified(self, ident: Ident) -> None:
        """At publication the file was missing or did not match what this
        boot knew: looked for on disk again next time."""
        self._durable.pop(ident, None)

    def published(self, idents: Iterable[Ident]) -> None:
        """A published manifest names these now."""
        self._version += 1
        for ident in idents:
            self._unpublished.pop(ident, None)

    def removed(self, ident: Ident) -> None:
        """The file was deleted (keep-K's state payloads, the budget's
        evictions)."""
        self._version += 1
        self._durable.pop(ident, None)
        self._unpublished.pop(ident, None)

    def synced(self, folders: Iterable[str]) -> None:
        """These folders were synced (``dirty_folders``)."""
        self._dirty.difference_update(folders)

    def record_written(self) -> None:
        """The writer rewrote its pending record: nothing listed since."""
        self._listed = 0

    # -- questions -----------------------------------------------------------

    def is_failed(self, ident: Ident) -> bool:
        return ident in self._failed

    def is_durable(self, ident: Ident) -> bool:
        return ident in self._durable

    def entry(self, ident: Ident) -> Entry | None:
        return self._durable.get(ident)

    def counted_on(self, ident: Ident) -> bool:
        """A candidate needs this file: True when it is known durable (then
        kept the longest, and listed in the pending record again)."""
        if ident not in self._durable:
            return False
        self._durable.move_to_end(ident)
        if ident not in self._unpublished:
            self._listed += 1  # named by a published manifest: listed again
        return True

    def unpublished(self) -> Iterator[Ident]:
        return iter(self._unpublished)

    def dirty_folders(self) -> list[str]:
        """Deepest first, so a parent's entry lands after its children's."""
        return sorted(self._dirty, key=len, reverse=True)

    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    @property
    def listed(self) -> int:
        return self._listed

    @property
    def version(self) -> int:
        """Changes whenever what the pending record lists may change."""
        return self._version

    def _remember(self, ident: Ident, entry: Entry) -> None:
        self._version += 1
        self._durable[ident] = entry
        self._durable.move_to_end(ident)
        while len(self._durable) > self.MAX_KNOWN_DURABLE:
            old, _ = self._durable.popitem(last=False)
            self._unpublished.pop(old, None)
        if ident not in self._unpublished:
            self._listed += 1
        self._unpublished[ident] = None
        self._unpublished.move_to_end(ident)
        while len(self._unpublished) > self.MAX_UNPUBLISHED:
            # No longer protected from a sweep: forget it was durable, so a
            # candidate naming it looks on disk again instead of trusting it.
            old, _ = self._unpublished.popitem(last=False)
            self._durable.pop(old, None)
            self._stats.pending_chunks_dropped += 1
