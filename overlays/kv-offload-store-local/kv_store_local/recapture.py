# SPDX-License-Identifier: Apache-2.0
"""Keys the writer owes the disk, and whether their bytes are still in staging.

A key that is not written when its store completes (capture pool full,
writer paused on a full disk, a failed write) stays in vLLM's CPU tier, and
the offloading manager never offers it again while it is there: every later
boundary of that chain would wait for it forever. But its bytes stay in its
staging row until the manager hands the row to a new store, and every such
store reaches this worker first (``remember``, before its DMA is submitted).
So the worker keeps such keys as *owed*, with their row and the row's
generation, and copies them again when the pool has room; a row named by a
new store job bumps its generation, which makes the owed key stale (lost:
the manager evicted it, so a later request offers it again).
"""

import time
from collections import deque
from collections.abc import Iterable, Sequence

from .layout import GroupLayout
from .stats import DROP_REASONS, StoreStats

Ident = tuple[bytes, int]


class Owed:
    """A key to capture (again) from staging: which bytes, and when valid.

    A plain slotted class, not a dataclass: the engine thread makes one per
    key of every store job (tens of thousands a second under a burst), and
    its identity and size are asked for many times, so both are computed
    once here. Never changed after it is made (``retry_after`` copies)."""

    __slots__ = (
        "hash",
        "layout",
        "token",
        "chunk_id",
        "first",
        "count",
        "generation",
        "not_before",
        "blocks",
        "ident",
        "size",
    )

    def __init__(
        self,
        hash: bytes,
        layout: GroupLayout,
        token: int,  # end token of the chunk
        chunk_id: int,  # staging row
        first: int,  # first sub-block within the row
        count: int,  # sub-blocks
        generation: int,  # the row's generation when the DMA filled it
        not_before: float = 0.0,  # monotonic time of the next try
        # The GPU blocks the store job read these sub-blocks from: a first
        # capture's source, valid only until the job is acked (vLLM may reuse
        # them after); a recapture reads the staging row.
        blocks: tuple[int, ...] = (),
    ):
        self.hash = hash
        self.layout = layout
        self.token = token
        self.chunk_id = chunk_id
        self.first = first
        self.count = count
        self.generation = generation
        self.not_before = not_before
        self.blocks = blocks
        self.ident: Ident = (hash, layout.group)
        self.size: int = layout.block_bytes * count

    def retry_after(self, not_before: float) -> "Owed":
        return Owed(
            self.hash,
            self.layout,
            self.token,
            self.chunk_id,
            self.first,
            self.count,
            self.generation,
            not_before,
            self.blocks,
        )

    def __repr__(self) -> str:
        return (
            f"Owed({self.hash.hex()[:12]}, group {self.layout.group}, row "
            f"{self.chunk_id}, sub-blocks {self.first}+{self.count})"
        )


class OwedKeys:
    MAX_OWED = 4096
    # A failed write is tried again only after this long, so a disk that
    # keeps failing is not hammered by the idle writer thread.
    retry_failed_after = 5.0

    def __init__(self, stats: StoreStats, *, keep: bool = True):
        self.stats = stats
        self.keep = keep  # False: count drops only (the writer before recapture)
        self._generation: dict[int, int] = {}  # staging row -> generation
        # Oldest first (a key owed again moves to the end).
        self._owed: dict[Ident, Owed] = {}
        # staging row -> {owed key on it: when owed}: every store job asks
        # (on_rows), on the engine thread, so it must not walk all owed keys.
        self._by_row: dict[int, dict[Ident, int]] = {}
        self._count = 0
        # (origin, reason) of keys the writer thread could not write: it
        # appends without the lock the rest of this class is used under.
        self._returned: deque[tuple[Owed, str]] = deque()

    def __len__(self) -> int:
        return len(self._owed)

    def __contains__(self, ident: object) -> bool:
        return ident in self._owed

    def generation(self, chunk_id: int) -> int:
        return self._generation.get(chunk_id, 0)

    def owe(self, owed: Owed, reason: str | None) -> None:
        """Keep the key for a retry; count the drop under ``reason`` (None:
        already counted where it happened)."""
        self.owe_many((owed,), reason)

    def owe_many(self, entries: Sequence[Owed], reason: str | None) -> None:
        """``owe`` for each, oldest first; the drops counted at once."""
        if reason is not None and entries:
            name = DROP_REASONS[reason]
            setattr(self.stats, name, getattr(self.stats, name) + len(entries))
        if not self.keep:
            return
        owed_keys, by_row = self._owed, self._by_row
        for owed in entries:
            ident = owed.ident
            if ident in owed_keys:
                self._drop(ident)
            owed_keys[ident] = owed
            row = by_row.get(owed.chunk_id)
            if row is None:
                row = by_row[owed.chunk_id] = {}
            self._count += 1
            row[ident] = self._count
        while len(owed_keys) > self.MAX_OWED:
            self._drop(next(iter(owed_keys)))
            self.stats.keys_lost_owed_limit += 1

    def _drop(self, ident: Ident) -> None:
        old = self._owed.pop(ident, None)
        if old is not None:
            on_row = self._by_row.get(old.chunk_id)
            if on_row is not None:
                on_row.pop(ident, None)
                if not on_row:
                    del self._by_row[old.chunk_id]

    def on_rows(self, chunk_ids: Iterable[int]) -> list[Owed]:
        """Owed keys whose rows a new store is about to overwrite, oldest
        first."""
        by_row = self._by_row
        found = [
            (order, ident)
            for c in set(chunk_ids)
            if c in by_row
            for ident, order in by_row[c].items()
        ]
        if not found:
            return []
        found.sort()
        return [self._owed[i] for _, i in found]

    def rows_reused(self, chunk_ids: Iterable[int]) -> None:
        """A new store job names these rows: their old bytes are going, so
        the keys still owed from them are lost (counted) and forgotten now,
        not left for a later walk to find stale."""
        generation = self._generation
        get = generation.get
        by_row, owed_keys = self._by_row, self._owed
        lost = 0
        for chunk_id in chunk_ids:
            generation[chunk_id] = get(chunk_id, 0) + 1
            on_row = by_row.pop(chunk_id, None)
            if on_row:
                for ident in on_row:
                    del owed_keys[ident]
                lost += len(on_row)
        self.stats.keys_lost += lost

    def valid(self, owed: Owed) -> bool:
        return self._generation.get(owed.chunk_id, 0) == owed.generation

    def owe_failed(self, owed: Owed) -> None:
        """A key the writer failed to write (already counted): try it again
        after ``retry_failed_after`` seconds."""
        delay = time.monotonic() + self.retry_failed_after
        self.owe(owed.retry_after(delay), None)

    def next_due(self) -> Owed | None:
        """The oldest owed key due for a try; the stale ones before it are
        dropped as lost. One walk from the oldest: the writer thread asks
        once per key it recaptures, so it must not copy or walk them all."""
        now = time.monotonic()
        stale = []
        due = None
        for ident, owed in self._owed.items():
            if not self.valid(owed):
                stale.append(ident)
            elif owed.not_before <= now:
                due = owed
                break
        for ident in stale:
            self._drop(ident)
        self.stats.keys_lost += len(stale)
        return due

    def settle(self, owed: Owed) -> None:
        """The key was captured again (or no longer needs to be)."""
        self._drop(owed.ident)

    def take(self, owed: Iterable[Owed], free: int) -> list[Owed]:
        """The valid keys of ``owed``, oldest first, while they fit ``free``
        bytes (up to the first that does not), settled: the caller copies
        them now."""
        fits = []
        for entry in owed:
            size = entry.size
            if size > free:
                break
            if self.valid(entry):
                free -= size
                fits.append(entry)
        for entry in fits:
            self.settle(entry)
        return fits

    def lose_left_behind(self, owed: Iterable[Owed], room: int) -> None:
        """A last chance's bound stopped before these keys: the ones still
        owed that the pool had ``room`` for are lost to the bound (counted;
        one the pool had no room for goes stale: keys_lost)."""
        for entry in owed:
            size = entry.size
            if entry.ident in self._owed and self.valid(entry) and size <= room:
                room -= size
                self.settle(entry)
                self.stats.keys_lost_last_chance_bound += 1

    def returned(self, owed: Owed, reason: str) -> None:
        """Writer thread: a captured key was not written (counted there);
        owed again at the next ``take_returned``."""
        self._returned.append((owed, reason))

    def take_returned(self) -> None:
        """Owe again what the writer returned: a failed write after
        ``retry_failed_after``, anything else at once."""
        while self._returned:
            origin, reason = self._returned.popleft()
            if reason == "write_failed":
                self.owe_failed(origin)
            else:
                self.owe(origin, None)
