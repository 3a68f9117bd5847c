# SPDX-License-Identifier: Apache-2.0
"""What the restore overlay may use of this rank's store, and nothing more.

kv-offload-restore reads back the chunk files this rank's writer wrote, into
the same CPU rows the writer captures from. It sees the store only through a
RestoreAccess (``WorkerStore.restore_access``), so the writer and the store
may change inside without restore noticing, and what restore depends on is
listed here, in one place.
"""

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .budget import DiskBudget
    from .deps import fmt
    from .layout import GroupLayout, StagingTensor
    from .ledger import Ident


class StoreNotOpen(RuntimeError):
    """This rank's store is not open: nothing may read it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class RestoreAccess:
    """One rank's store as restore sees it. Built once the writer is open;
    every member stays the same for the store's life but ``staging``."""

    layout: "fmt.StoreLayout"  # this rank's folders, lock and chunk paths
    namespace: bytes  # the namespace hash the writer fenced
    key: bytes | None  # a keyed store's secret (FORMAT.md 3.6), else None
    rank: int  # the rank whose store this is: a sealed chunk binds it
    groups: tuple["GroupLayout", ...]  # with each layer bound to its tensor
    blocks_per_chunk: int
    # The current staging tensors (source buffer, offset, row stride, width),
    # indexed like a layer's ``tensor``. A call, not a value: the store
    # replaces the list when it starts again or shuts down, and a reader's
    # plans of it are good only while it is the same list.
    staging: Callable[[], Sequence["StagingTensor"]]
    # A promotion overwrites these CPU rows: keys the writer still owes from
    # them get their last chance first.
    rows_taken: Callable[[Iterable[int]], None]
    # A reader refused this key's file: the writer writes it anew.
    distrust: Callable[["Ident"], None]
    # The disk budget, or None (unbounded): used through hold and touch.
    budget: "DiskBudget | None" = field(default=None, repr=False)

    def hold(self, paths: Iterable[str]) -> contextlib.AbstractContextManager[None]:
        """While held, the disk budget deletes none of these files (a
        promotion reads them). Without a budget nothing is ever deleted."""
        if self.budget is None:
            return contextlib.nullcontext()
        return self.budget.hold(paths)

    def touch(self, manifests: Iterable[str]) -> None:
        """A restore used these manifests: the budget evicts them last."""
        if self.budget is not None:
            self.budget.touch(manifests)
