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
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from .layout import GroupLayout
from .stats import DROP_REASONS, StoreStats

Ident = tuple[bytes, int]


@dataclass(frozen=True)
class Owed:
    """A key to capture (again) from staging: which bytes, and when valid."""

    hash: bytes
    layout: GroupLayout
    token: int  # end token of the chunk
    chunk_id: int  # staging row
    first: int  # first sub-block within the row
    count: int  # sub-blocks
    generation: int  # the row's generation when the DMA filled it
    not_before: float = 0.0  # monotonic time of the next try
    # The GPU blocks the store job read these sub-blocks from: a first
    # capture's source, valid only until the job is acked (vLLM may reuse
    # them after); a recapture reads the staging row.
    blocks: tuple[int, ...] = ()

    @property
    def ident(self) -> Ident:
        return self.hash, self.layout.group


class OwedKeys:
    MAX_OWED = 4096
    # A failed write is tried again only after this long, so a disk that
    # keeps failing is not hammered by the idle writer thread.
    retry_failed_after = 5.0

    def __init__(self, stats: StoreStats, *, keep: bool = True):
        self.stats = stats
        self.keep = keep  # False: count drops only (the writer before recapture)
        self._generation: dict[int, int] = {}  # staging row -> generation
        self._owed: OrderedDict[Ident, Owed] = OrderedDict()
        # staging row -> owed keys on it: every store job asks (on_rows), on
        # the engine thread, so it must not walk all owed keys.
        self._by_row: dict[int, set[Ident]] = {}
        self._order: dict[Ident, int] = {}  # when owed (oldest first)
        self._count = 0

    def __len__(self) -> int:
        return len(self._owed)

    def __contains__(self, ident: object) -> bool:
        return ident in self._owed

    def generation(self, chunk_id: int) -> int:
        return self._generation.get(chunk_id, 0)

    def owe(self, owed: Owed, reason: str | None) -> None:
        """Keep the key for a retry; count the drop under ``reason`` (None:
        already counted where it happened)."""
        if reason is not None:
            name = DROP_REASONS[reason]
            setattr(self.stats, name, getattr(self.stats, name) + 1)
        if not self.keep:
            return
        self._drop(owed.ident)
        self._owed[owed.ident] = owed
        self._by_row.setdefault(owed.chunk_id, set()).add(owed.ident)
        self._count += 1
        self._order[owed.ident] = self._count
        while len(self._owed) > self.MAX_OWED:
            self._drop(next(iter(self._owed)))
            self.stats.keys_lost_owed_limit += 1

    def _drop(self, ident: Ident) -> None:
        old = self._owed.pop(ident, None)
        if old is not None:
            del self._order[ident]
            on_row = self._by_row.get(old.chunk_id)
            if on_row is not None:
                on_row.discard(ident)
                if not on_row:
                    del self._by_row[old.chunk_id]

    def on_rows(self, chunk_ids: Iterable[int]) -> list[Owed]:
        """Owed keys whose rows a new store is about to overwrite, oldest
        first."""
        idents = [i for c in set(chunk_ids) for i in self._by_row.get(c, ())]
        idents.sort(key=self._order.__getitem__)
        return [self._owed[i] for i in idents]

    def rows_reused(self, chunk_ids: Iterable[int]) -> None:
        """A new store job names these rows: their old bytes are going."""
        for chunk_id in chunk_ids:
            self._generation[chunk_id] = self._generation.get(chunk_id, 0) + 1

    def valid(self, owed: Owed) -> bool:
        return self.generation(owed.chunk_id) == owed.generation

    def owe_failed(self, owed: Owed) -> None:
        """A key the writer failed to write (already counted): try it again
        after ``retry_failed_after`` seconds."""
        delay = time.monotonic() + self.retry_failed_after
        self.owe(replace(owed, not_before=delay), None)

    def pending(self) -> Iterator[Owed]:
        """Owed keys due for a try, oldest first; stale ones are dropped as
        lost."""
        now = time.monotonic()
        for ident, owed in list(self._owed.items()):
            if not self.valid(owed):
                self._drop(ident)
                self.stats.keys_lost += 1
                continue
            if owed.not_before <= now:
                yield owed

    def settle(self, owed: Owed) -> None:
        """The key was captured again (or no longer needs to be)."""
        self._drop(owed.ident)
