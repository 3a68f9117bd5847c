# SPDX-License-Identifier: Apache-2.0
"""What the disk budget knows of one rank base (docs/FORMAT.md section 8.1):
every regular file's size, and the chain trees with their recency and the
chunks they name.

One scan builds it; the writer then keeps it current from what it does
itself (a chunk landed, a manifest published, keep-K's and the budget's
unlinks, a restore's touch), so a write at the budget costs a few dict
operations instead of a rescan. ``budget.DiskBudget`` decides when only a
rescan will do (a sweep ran, another writer shares the base, the bound).
Writer thread only.
"""

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from .deps import fmt


@dataclass
class Tree:
    root: str  # the chain's first key (hex)
    recency_ns: int = 0
    manifests: dict[str, int] = field(default_factory=dict)  # path -> size
    # Paths its manifests name -> (key hash, group), the writer's ident.
    chunks: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    mtimes: dict[str, int] = field(default_factory=dict)  # manifest -> mtime
    # Chunk path -> how many of its manifests name it (keep-K removes one).
    refs: dict[str, int] = field(default_factory=dict)


# A parsed manifest by name, valid while (size, inode, device) still match:
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


def _own_temp(name: str, pid: int) -> bool:
    if ".tmp." not in name:
        return False
    parsed = fmt.parse_temp_name(name)
    return parsed is not None and parsed[1] == pid


def named_chunks(
    layout: fmt.StoreLayout, manifest: fmt.BoundaryManifest
) -> dict[str, tuple[bytes, int]]:
    return {
        layout.chunk(e.key, g.group): (bytes.fromhex(e.key), g.group)
        for g in manifest.groups
        for e in g.entries
    }


class StoreIndex:
    def __init__(self, layout: fmt.StoreLayout):
        self.layout = layout
        self.used = 0  # bytes of every regular file it knows under the base
        self.sizes: dict[str, int] = {}  # path -> size, every regular file
        self.trees: dict[str, Tree] = {}
        # Chunk path -> the roots of the trees naming it.
        self.named_by: dict[str, set[str]] = {}
        self._root_of: dict[str, str] = {}  # manifest path -> root
        # Every temp the last scan saw (this process's too, which it does
        # not count): what a writer removes under LOCK_EX (budget.py).
        self.temps: list[str] = []
        self._named: dict[str, dict[str, tuple[bytes, int]]] = {}

    # -- files ---------------------------------------------------------------

    def _set_size(self, path: str, size: int) -> None:
        self.used += size - self.sizes.get(path, 0)
        self.sizes[path] = size

    def wrote(self, path: str) -> None:
        """A file this writer created or replaced (a chunk landed, its
        pending record rewritten): its size now, or gone if it is."""
        try:
            size = os.stat(path, follow_symlinks=False).st_size
        except FileNotFoundError:
            self.gone(path)
            return
        self._set_size(path, size)

    def reused(self, path: str) -> None:
        """A file the writer deduplicated onto: already known, or counted now."""
        if path not in self.sizes:
            self.wrote(path)

    def gone(self, path: str) -> None:
        """A file unlinked (keep-K, the budget) or found missing."""
        self._remove_manifest(path)
        self.used -= self.sizes.pop(path, 0)

    # -- manifests -----------------------------------------------------------

    def published(self, path: str, manifest: fmt.BoundaryManifest) -> None:
        """A manifest renamed into place (a republished name replaces the
        old file: its tree and what it named go with it)."""
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            self.gone(path)
            return
        self._remove_manifest(path)
        self._set_size(path, st.st_size)
        named = named_chunks(self.layout, manifest)
        self._add_manifest(path, st.st_mtime_ns, manifest.chain[0], named)

    def touched(self, path: str) -> None:
        """A restore set this manifest's mtime (its tree's recency)."""
        root = self._root_of.get(path)
        if root is None:
            return
        try:
            mtime = os.stat(path, follow_symlinks=False).st_mtime_ns
        except FileNotFoundError:
            self.gone(path)
            return
        tree = self.trees[root]
        tree.mtimes[path] = mtime
        tree.recency_ns = max(tree.mtimes.values())

    def _add_manifest(
        self, path: str, mtime_ns: int, root: str, named: dict[str, tuple[bytes, int]]
    ) -> None:
        tree = self.trees.get(root)
        if tree is None:
            tree = self.trees[root] = Tree(root)
        tree.manifests[path] = self.sizes[path]
        tree.mtimes[path] = mtime_ns
        tree.recency_ns = max(tree.recency_ns, mtime_ns)
        for chunk, ident in named.items():
            n = tree.refs.get(chunk, 0)
            tree.refs[chunk] = n + 1
            if n == 0:
                tree.chunks[chunk] = ident
                self.named_by.setdefault(chunk, set()).add(root)
        self._root_of[path] = root
        self._named[path] = named

    def _remove_manifest(self, path: str) -> None:
        root = self._root_of.pop(path, None)
        if root is None:
            return
        named = self._named.pop(path)
        tree = self.trees[root]
        del tree.manifests[path]
        del tree.mtimes[path]
        for chunk in named:
            n = tree.refs[chunk] - 1
            if n:
                tree.refs[chunk] = n
                continue
            del tree.refs[chunk]
            del tree.chunks[chunk]
            self._unname(chunk, root)
        if tree.manifests:
            tree.recency_ns = max(tree.mtimes.values())
        else:
            del self.trees[root]

    def _unname(self, chunk: str, root: str) -> None:
        roots = self.named_by[chunk]
        roots.discard(root)
        if not roots:
            del self.named_by[chunk]

    def drop_tree(self, root: str, unlinked: list[str]) -> Tree:
        """The budget retired this tree: its manifests and ``unlinked`` (the
        chunks it deleted) are gone. The Tree itself is left as it was, for
        the caller's book."""
        tree = self.trees.pop(root)
        for path in tree.manifests:
            self._root_of.pop(path, None)
            self._named.pop(path, None)
            self.used -= self.sizes.pop(path, 0)
        for chunk in tree.chunks:
            self._unname(chunk, root)
        for chunk in unlinked:
            self.used -= self.sizes.pop(chunk, 0)
        return tree

    def snapshot(self) -> tuple:
        """Everything a decision reads, as plain data (tests compare an
        index kept current with a fresh scan's)."""
        trees = {
            r: (t.recency_ns, dict(t.manifests), dict(t.chunks))
            for r, t in self.trees.items()
        }
        named_by = {c: frozenset(r) for c, r in self.named_by.items()}
        return self.used, dict(self.sizes), trees, named_by


def scan(
    layout: fmt.StoreLayout,
    cache: Parsed | None = None,
    own_pid: int | None = None,
    key: bytes | None = None,
) -> StoreIndex:
    """The rank base as the budget sees it (the C++ planner counts the same).
    ``cache`` keeps the manifests parsed by an earlier scan: a rescan decodes
    only the new ones. With ``own_pid``, that process's temps are left out:
    its writer counts the files in flight through their jobs' bounds. ``key``:
    a keyed store's (its manifests are sealed; one that does not open is not
    the writer's)."""
    cache = {} if cache is None else cache
    index = StoreIndex(layout)
    stack = [layout.base]
    while stack:
        for path, size, is_dir in _entries(stack.pop()):
            if is_dir:
                stack.append(path)
                continue
            name = os.path.basename(path)
            if ".tmp." in name and fmt.parse_temp_name(name) is not None:
                index.temps.append(path)
            if own_pid is None or not _own_temp(name, own_pid):
                index._set_size(path, size)
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
                named = named_chunks(layout, manifest)
                known = cache[name] = (ident, manifest.chain[0], named)
        except (OSError, fmt.FormatError):
            cache.pop(name, None)
            continue  # temps, damaged files: never retired here (kvstore gc's)
        index._set_size(path, st.st_size)  # listed before, or new since
        index._add_manifest(path, st.st_mtime_ns, known[1], known[2])
    return index
