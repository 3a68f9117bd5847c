# SPDX-License-Identifier: Apache-2.0
"""The disk budget (``GLM53_KV_OFFLOAD_DISK_GB``): retire least recently used
chain trees so the rank's store stays under it (docs/FORMAT.md section 8.1).

A chain tree is every manifest whose chain starts with the same key (one
conversation and its forks, the unit keep-K already works in). Its recency
is the newest manifest mtime: publishing sets it, a restore sets it again
(``touch``), so it survives a restart. Runs on the writer thread; ``hold``
is taken by the promotion thread around the reads of a job.
"""

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from . import durable_io
from .deps import fmt


@dataclass
class Tree:
    root: str  # the chain's first key (hex)
    recency_ns: int = 0
    manifests: dict[str, int] = field(default_factory=dict)  # path -> size
    # Paths its manifests name -> (key hash, group), the writer's ident.
    chunks: dict[str, tuple[bytes, int]] = field(default_factory=dict)


@dataclass
class StoreView:
    used: int  # bytes of every regular file under the rank base
    trees: dict[str, Tree]
    sizes: dict[str, int]  # chunk path -> size
    # Chunk path -> the roots naming it; a chunk named by an unreadable
    # manifest is pinned (root "").
    named_by: dict[str, set[str]]


# A parsed manifest by name, valid while (size, mtime, inode) still match:
# its root and what it names (a manifest is never rewritten in place).
Parsed = dict[str, tuple[tuple[int, int, int], str, dict[str, tuple[bytes, int]]]]


def _entries(directory: str) -> Iterator[tuple[str, int, bool]]:
    """(path, size, is a directory) of each entry that still exists: another
    writer renames its temps and a sweep deletes files while this lists, so an
    entry gone before its stat (or a directory gone before its listing) is
    simply not there."""
    try:
        with os.scandir(directory) as it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        yield e.path, 0, True
                    elif e.is_file(follow_symlinks=False):
                        yield e.path, e.stat(follow_symlinks=False).st_size, False
                except FileNotFoundError:
                    continue
    except FileNotFoundError:
        return


def scan(
    layout: fmt.StoreLayout, cache: Parsed | None = None, key: bytes | None = None
) -> StoreView:
    """The rank base as the budget sees it (the C++ planner counts the same).
    ``cache`` keeps the manifests parsed by an earlier scan: a scan at budget
    then decodes only the new ones. ``key``: a keyed store's (its manifests
    are sealed; one that does not open is not the writer's)."""
    cache = {} if cache is None else cache
    used = 0
    sizes: dict[str, int] = {}
    stack = [layout.base]
    while stack:
        for path, size, is_dir in _entries(stack.pop()):
            if is_dir:
                stack.append(path)
            else:
                used += size
                sizes[path] = size
    trees: dict[str, Tree] = {}
    named_by: dict[str, set[str]] = {}
    names = sorted(os.listdir(layout.manifest_dir))
    for name in set(cache) - set(names):
        del cache[name]
    for name in names:
        path = os.path.join(layout.manifest_dir, name)
        try:
            fmt.parse_manifest_file_name(name)
            st = os.stat(path, follow_symlinks=False)
            ident = (st.st_size, st.st_ino, st.st_dev)
            known = cache.get(name)
            if known is None or known[0] != ident:
                manifest = fmt.decode_manifest(
                    fmt.read_regular(path, fmt.MAX_MANIFEST_BYTES), key
                )
                named = {
                    layout.chunk(e.key, g.group): (bytes.fromhex(e.key), g.group)
                    for g in manifest.groups
                    for e in g.entries
                }
                known = cache[name] = (ident, manifest.chain[0], named)
        except (OSError, fmt.FormatError):
            cache.pop(name, None)
            continue  # temps, damaged files: never retired here (kvstore gc's)
        root = known[1]
        tree = trees.setdefault(root, Tree(root))
        tree.recency_ns = max(tree.recency_ns, st.st_mtime_ns)
        tree.manifests[path] = st.st_size
        tree.chunks.update(known[2])
        for chunk in known[2]:
            named_by.setdefault(chunk, set()).add(root)
    return StoreView(used, trees, sizes, named_by)


def plan(
    view: StoreView, limit: int, incoming: int, protected: set[str]
) -> tuple[list[Tree], int]:
    """The trees to retire, oldest first (ties by root), until ``used +
    incoming <= limit``; and the bytes that frees. Protected roots are skipped.
    """
    retired: list[Tree] = []
    freed = 0
    gone: set[str] = set()
    for tree in sorted(view.trees.values(), key=lambda t: (t.recency_ns, t.root)):
        if view.used - freed + incoming <= limit:
            break
        if tree.root in protected:
            continue
        gone.add(tree.root)
        retired.append(tree)
        freed += sum(tree.manifests.values())
        freed += sum(
            view.sizes.get(c, 0) for c in tree.chunks if view.named_by[c] <= gone
        )
    return retired, freed


# When a write would cross the budget the writer frees down to this fraction
# below it (its low-water mark), so it scans the store once per 1/64 of the
# budget written, not once per job. `kvstore gc --max-bytes LOW` plans what
# the writer retires (LOW = budget - budget // 64).
LOW_WATER_DIVISOR = 64


def low_water(limit: int) -> int:
    return limit - limit // LOW_WATER_DIVISOR


class DiskBudget:
    def __init__(
        self, layout: fmt.StoreLayout, limit: int, stats, key: bytes | None = None
    ):
        self.key = key
        self.layout = layout
        self.limit = limit
        self.low = low_water(limit)
        self.stats = stats
        self._used: int | None = None  # an upper bound between scans
        self._parsed: Parsed = {}
        self._held: dict[str, int] = {}  # chunk path -> promotions reading it
        self._lock = threading.Lock()

    @contextmanager
    def hold(self, paths: Iterable[str]) -> Iterator[None]:
        """A promotion reads these files: no eviction deletes them meanwhile.
        A file gone before the hold is a miss, as for any vanished file."""
        paths = list(paths)
        with self._lock:
            for p in paths:
                self._held[p] = self._held.get(p, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                for p in paths:
                    if self._held[p] == 1:
                        del self._held[p]
                    else:
                        self._held[p] -= 1

    def touch(self, names: Iterable[str]) -> None:
        """A restore used these manifests: their mtime is their recency
        (FORMAT.md 8.1), so it outlives this process. A manifest gone
        meanwhile was retired: nothing to mark."""
        for name in names:
            try:
                os.utime(os.path.join(self.layout.manifest_dir, name))
            except OSError:
                pass

    def wrote(self, nbytes: int) -> None:
        if self._used is not None:
            self._used += nbytes

    def make_room(
        self,
        incoming: int,
        pending: Iterable[tuple[int, str]],
        roots: Iterable[str] = (),
    ) -> tuple[bool, list[Tree]]:
        """When ``incoming`` more bytes would cross the budget, retire LRU
        trees until they fit under the low-water mark: (whether they fit
        under the budget, the trees retired). They may not fit when everything left is
        protected: trees naming a pending-record chunk, a held file or a
        chunk an unreadable manifest names are never retired."""
        if self._used is not None and self._used + incoming <= self.limit:
            return True, []
        view = scan(self.layout, self._parsed, self.key)
        self._used = view.used
        if view.used + incoming <= self.limit:
            return True, []
        pinned = {self.layout.chunk(key, group) for group, key in pending}
        with self._lock:
            pinned |= set(self._held)
            protected = (
                set(roots)
                | {
                    t.root
                    for t in view.trees.values()
                    if not pinned.isdisjoint(t.chunks)
                }
                | {
                    r
                    for c, roots in view.named_by.items()
                    if "" in roots
                    for r in roots
                }
            )
            retired, freed = plan(view, self.low, incoming, protected)
            self._retire(view, retired)
        self._used = view.used - freed
        return self._used + incoming <= self.limit, retired

    def _retire(self, view: StoreView, retired: list[Tree]) -> None:
        """FORMAT.md 8: every manifest first, their folder synced, then the
        chunks only they named, each folder synced."""
        if not retired:
            return
        for tree in retired:
            for path in tree.manifests:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        durable_io.fsync_dir(self.layout.manifest_dir)
        gone = {t.root for t in retired}
        dirs: set[str] = set()
        freed = 0
        for tree in retired:
            freed += sum(tree.manifests.values())
            for chunk in sorted(tree.chunks):
                if not view.named_by[chunk] <= gone:
                    continue
                try:
                    os.unlink(chunk)
                except FileNotFoundError:
                    continue  # named by two retired trees: already gone
                freed += view.sizes.get(chunk, 0)
                dirs.add(os.path.dirname(chunk))
        for d in dirs:
            durable_io.fsync_dir(d)
        self.stats.chain_trees_evicted += len(retired)
        self.stats.manifests_evicted += sum(len(t.manifests) for t in retired)
        self.stats.bytes_evicted += freed


# A manifest's canonical JSON: its fixed fields, then per chain key (64 hex
# and separators) and per entry (key, length, checksum): upper bounds.
_MANIFEST_BASE = 512
_MANIFEST_PER_KEY = 72
_MANIFEST_PER_ENTRY = 120


def job_bytes(job, keep: int) -> int:
    """An upper bound of what a job adds: every key as a new chunk file (a
    deduplicated one adds nothing) and the manifests it may publish. With
    keep-K on, a tree holds at most K+1 new manifests at once (retain runs
    after each publish), so only the K+1 largest per tree count."""
    total = 0
    for item in job.keys:
        header = fmt.FIXED_HEADER_SIZE + fmt.HEADER_CHECKSUM_SIZE
        total += header + fmt.SEGMENT_ENTRY_SIZE * len(item.segments) + item.size
    per_tree: dict[bytes, list[int]] = {}
    for c in job.candidates:
        entries = len(c.chain) * len(c.full) + len(c.state)
        size = (
            _MANIFEST_BASE
            + _MANIFEST_PER_KEY * len(c.chain)
            + _MANIFEST_PER_ENTRY * entries
        )
        per_tree.setdefault(c.chain[0] if c.chain else b"", []).append(size)
    for sizes in per_tree.values():
        sizes.sort(reverse=True)
        total += sum(sizes if keep == 0 else sizes[: keep + 1])
    return total


def make_room_for_job(writer, job) -> bool:
    """The writer's few lines: room for the job, or its keys refused. The
    retired manifests and chunks are forgotten by the writer's book."""
    budget = writer.budget
    incoming = job_bytes(job, writer.manifests.keep)
    roots = {c.chain[0].hex() for c in job.candidates if c.chain}
    ok, retired = budget.make_room(incoming, writer.manifests.pending_chunks(), roots)
    book = writer.manifests
    for tree in retired:
        for path in tree.manifests:
            book.published.pop(os.path.basename(path), None)
    for tree in retired:
        for ident in tree.chunks.values():
            book.durable.pop(ident, None)
    if not ok:
        writer.stats.writes_refused_disk_budget += 1
        writer.stats.keys_refused_disk_budget += len(job.keys)
        for item in job.keys:
            writer._free(item)
            writer._lost(item.origin, "disk_budget")
        return False
    budget.wrote(incoming)
    return True
