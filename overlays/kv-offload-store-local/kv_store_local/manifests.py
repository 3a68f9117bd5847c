# SPDX-License-Identifier: Apache-2.0
"""Boundary manifests: when one may be published, publishing it, keep-K.

The writer tells the book which files became durable; the book tracks the
candidates waiting for them and publishes a manifest once every file it
names is durable (or verifies on disk) and its directory is synced. Runs on
the writer thread only.
"""

import errno
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from . import durable_io
from .captured import Candidate
from .deps import fmt, init_logger
from .stats import StoreStats
from .store_index import Parsed, named_chunks

if TYPE_CHECKING:
    from .budget import DiskBudget

logger = init_logger(__name__)

Ident = tuple[bytes, int]  # (chunk key hash, group)


def verified_header(
    layout: fmt.StoreLayout,
    namespace: bytes,
    hash_: bytes,
    group: int,
    key: bytes | None = None,
    path: str | None = None,
) -> fmt.ChunkHeader | None:
    """The chunk's header if the file is there and names this key, else None.
    In a keyed store the file must be sealed (its MAC is the reader's to
    check: a forgery dedup'd onto here is refused at restore and rewritten)."""
    try:
        header = fmt.read_chunk_header(path or layout.chunk(hash_.hex(), group), key)
    except (OSError, fmt.FormatError):
        return None
    if (
        header.namespace_hash != namespace
        or header.group != group
        or header.key_hash != hash_
    ):
        return None
    return header


def _file_ident(path: str) -> tuple[int, int, int]:
    st = os.stat(path, follow_symlinks=False)
    return st.st_size, st.st_ino, st.st_dev


class ManifestBook:
    MAX_PENDING_CANDIDATES = 1024
    MAX_KNOWN_DURABLE = 1 << 18
    # Chunks counted on but named by no published manifest: at ~70 bytes a
    # pending-record entry, 64k of them is a 4.5 MB record.
    MAX_UNPUBLISHED = 1 << 16
    # Chunk paths asked for again and again (dedup, register, publish): kept.
    MAX_PATHS = 1 << 16

    def __init__(
        self,
        layout: fmt.StoreLayout,
        namespace: bytes,
        rank: int,
        keep_boundaries: int,
        stats: StoreStats,
        *,
        dirty_dirs: set[str],
        on_enospc: Callable[[], None],
        key: bytes | None = None,
    ):
        self.layout = layout
        self.key = key  # a keyed store's: manifests sealed and opened with it
        self.namespace = namespace
        self.rank = rank
        self.keep = keep_boundaries
        self.stats = stats
        # Directories whose entries must be synced before a manifest names
        # a file in them (shared with the writer, which syncs them).
        self.dirty_dirs = dirty_dirs
        self._on_enospc = on_enospc
        # (hash, group) -> (payload length, payload checksum), verified.
        self.durable: OrderedDict[Ident, tuple[int, int]] = OrderedDict()
        # Failed writes and refused files: not manifested until written anew.
        self.failed: set[Ident] = set()
        self._pending: OrderedDict[str, tuple[Candidate, set[Ident]]] = OrderedDict()
        self._waiting: dict[Ident, set[str]] = {}
        # Every chunk written or reused this boot that no manifest published
        # since names yet, oldest first: the pending record lists them all,
        # so a sweep keeps a job's chunks even before any candidate names
        # them (a job of full-attention chunks only carries no candidate).
        self._unpublished: OrderedDict[Ident, None] = OrderedDict()
        # Name -> chain (hex); changed only through _set_published/forget,
        # which keep the two lookups below (a job's work stays independent
        # of how many manifests the store holds).
        self.published: dict[str, tuple[str, ...]] = {}
        self._chains: dict[tuple[str, ...], int] = {}  # chain -> names
        self._by_root: dict[str, dict[str, None]] = {}  # root -> names
        # The disk budget (budget.DiskBudget), told of every manifest
        # published and every file keep-K unlinks; None: no budget.
        self.budget: DiskBudget | None = None
        # Bumped whenever what pending_chunks() returns may change, so the
        # writer rewrites its pending record only then.
        self.changes = 0
        self._paths: dict[Ident, str] = {}
        # Entries added to the pending record's list since it was last
        # written (an upper bound: the disk budget counts their bytes until
        # the writer rewrites the record, budget.record_bytes).
        self.listed = 0
        # The writer's store_perms.Folders: a chunk folder found unsafe is
        # never deduplicated onto (set by the writer; None: not checked).
        self.folders = None
        self._path_shapes: set[tuple[int, int]] = set()
        self._base = layout.base

    @property
    def pending_version(self) -> tuple[int, int]:
        """Changes when pending_chunks() may: the book's own changes, and the
        published names the disk budget (budget.py) retires from outside."""
        return self.changes, len(self.published)

    def chunk_path(self, ident: Ident) -> str:
        """``layout.chunk`` of the key, kept. The codec checks the name (hex
        of an allowed length, group in range) and joins; once it accepted a
        (hex length, group) and built the same string, keys of that shape
        are joined here directly (bytes.hex is always lowercase hex)."""
        path = self._paths.get(ident)
        if path is None:
            if len(self._paths) >= self.MAX_PATHS:
                self._paths.clear()
            key_hex, group = ident[0].hex(), ident[1]
            shape = (len(key_hex), group)
            if shape in self._path_shapes:
                path = (
                    f"{self._base}/{key_hex[:3]}/{key_hex[3:5]}_g{group}/{key_hex}.bin"
                )
            else:
                path = self.layout.chunk(key_hex, group)
                self._base = self.layout.base
                joined = (
                    f"{self._base}/{key_hex[:3]}/{key_hex[3:5]}_g{group}/{key_hex}.bin"
                )
                if joined == path:
                    self._path_shapes.add(shape)
            self._paths[ident] = path
        return path

    def load_existing(self, parsed: Parsed | None = None) -> None:
        """Read the manifests an earlier boot left (for keep-K). ``parsed``
        (the disk budget's) keeps each one as decoded here, so the budget's
        first scan does not decode them again."""
        for name in sorted(os.listdir(self.layout.manifest_dir)):
            path = os.path.join(self.layout.manifest_dir, name)
            try:
                fmt.parse_manifest_file_name(name)
                before = None if parsed is None else _file_ident(path)
                manifest = fmt.decode_manifest(
                    fmt.read_regular(path, fmt.MAX_MANIFEST_BYTES), self.key
                )
                # The same file before and after the read: what it names.
                same = before is not None and _file_ident(path) == before
            except (OSError, fmt.FormatError):
                continue  # temps and damaged files are kvstore gc's business
            self._set_published(name, manifest.chain)
            if parsed is not None and same:
                named = named_chunks(self.layout, manifest)
                parsed[name] = (before, manifest.chain[0], named)

    def _set_published(self, name: str, chain: tuple[str, ...]) -> None:
        self.forget(name)
        self.changes += 1
        self.published[name] = chain
        self._chains[chain] = self._chains.get(chain, 0) + 1
        self._by_root.setdefault(chain[0], {})[name] = None

    def forget(self, name: str) -> None:
        """No longer published (keep-K, distrust, the budget retired it)."""
        chain = self.published.pop(name, None)
        if chain is None:
            return
        self.changes += 1
        n = self._chains[chain] - 1
        if n:
            self._chains[chain] = n
        else:
            del self._chains[chain]
        names = self._by_root[chain[0]]
        del names[name]
        if not names:
            del self._by_root[chain[0]]

    def header(self, ident: Ident) -> fmt.ChunkHeader | None:
        path = self.chunk_path(ident)
        if self.folders is not None and self.folders.problem(os.path.dirname(path)):
            return None  # an unsafe chunk folder: nothing in it is taken
        return verified_header(self.layout, self.namespace, *ident, self.key, path)

    # -- tracking ------------------------------------------------------------

    def register(self, candidate: Candidate) -> list[str]:
        """Track a candidate; returns it when nothing it names is missing.

        The caller publishes only after syncing the directories of every
        file found on disk here (see found_on_disk).
        """
        name = candidate.name
        if name in self.published or name in self._pending:
            return []
        self.changes += 1
        missing: set[Ident] = set()
        for ident in candidate.needed():
            if ident in self.failed:
                missing.add(ident)  # waits for the key's rewrite
                continue
            if ident in self.durable:
                self.durable.move_to_end(ident)
                if ident not in self._unpublished:
                    self.listed += 1  # named by a published manifest: listed again
                continue
            if ident in self._waiting:
                # A candidate registered earlier found it missing and it has
                # not become durable since (mark_durable tells both): not
                # looked for on disk again. Each job's candidate names the
                # whole chain, so a burst asked for its missing keys again
                # and again.
                missing.add(ident)
                continue
            header = self.header(ident)
            if header is not None:
                self.found_on_disk(ident, header)
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
            self.stats.manifests_dropped += 1
        return []

    def _forget_waiting(self, name: str, missing: Iterable[Ident]) -> None:
        for ident in missing:
            names = self._waiting.get(ident)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._waiting[ident]

    def found_on_disk(self, ident: Ident, header: fmt.ChunkHeader) -> None:
        """A file this boot did not sync (an earlier boot's, or one renamed on
        the I/O thread a moment ago): its data was fsynced before its rename,
        but its directory entry may not be durable yet, so sync that too
        before any manifest names it."""
        self.dirty_dirs.add(os.path.dirname(self.chunk_path(ident)))
        self._remember(ident, (header.payload_length, header.payload_checksum))

    def _remember(self, ident: Ident, entry: tuple[int, int]) -> None:
        self.changes += 1
        self.durable[ident] = entry
        self.durable.move_to_end(ident)
        while len(self.durable) > self.MAX_KNOWN_DURABLE:
            old, _ = self.durable.popitem(last=False)
            self._unpublished.pop(old, None)
        if ident not in self._unpublished:
            self.listed += 1
        self._unpublished[ident] = None
        self._unpublished.move_to_end(ident)
        while len(self._unpublished) > self.MAX_UNPUBLISHED:
            # No longer protected from a sweep: forget it was durable, so a
            # candidate naming it looks on disk again instead of trusting it.
            old, _ = self._unpublished.popitem(last=False)
            self.durable.pop(old, None)
            self.stats.pending_chunks_dropped += 1

    def mark_durable(self, ident: Ident, entry: tuple[int, int]) -> list[str]:
        """A file is durable; returns the candidates it completes."""
        self._remember(ident, entry)
        ready = []
        for name in self._waiting.pop(ident, ()):
            pending = self._pending.get(name)
            if pending is None:
                continue
            pending[1].discard(ident)
            if not pending[1]:
                ready.append(name)
        return ready

    def pending_chunks(self) -> list[tuple[int, str]]:
        """(group, key hex), sorted, each once: every chunk written or reused
        this boot that no published manifest names yet, and, of what waiting
        candidates need beyond their longest published prefix, the chunks it
        knows are on disk (a key not written yet has no file to keep: issue
        45, listing those made every refused job grow the record past the
        disk budget). What gc must not take for orphans (FORMAT.md 9.1)."""
        published = self._chains
        durable = self.durable
        out = {(g, h.hex()) for h, g in self._unpublished}
        for candidate, _ in self._pending.values():
            chain = candidate.chain
            hexes = tuple(h.hex() for h in chain)
            done = next(
                (k for k in range(len(hexes), 0, -1) if hexes[:k] in published), 0
            )
            out.update(
                (g, hexes[i])
                for g in candidate.full
                for i in range(done, len(chain))
                if (chain[i], g) in durable
            )
            out.update(
                (g, hexes[-1]) for g in candidate.state if (chain[-1], g) in durable
            )
        return sorted(out)

    def mark_failed(self, ident: Ident) -> None:
        """Not taken from disk or manifested until written anew in full."""
        self.changes += 1
        self.failed.add(ident)
        self.durable.pop(ident, None)
        self._unpublished.pop(ident, None)

    def distrust(self, ident: Ident) -> None:
        """A reader refused this key's file: it counts as failed, and the
        manifests whose chain holds its key are forgotten as published, so
        their candidates publish them again under the same names (new files,
        which a reader that marked the old ones bad reads again)."""
        self.mark_failed(ident)
        key = ident[0].hex()
        for name in [n for n, chain in self.published.items() if key in chain]:
            self.forget(name)

    # -- publishing ----------------------------------------------------------

    def publish(self, name: str) -> None:
        pending = self._pending.pop(name, None)
        if pending is None:
            return
        self.changes += 1
        candidate = pending[0]
        entries: dict[Ident, fmt.ManifestEntry] = {}
        # Re-verify every named file now, under the shared lock: the manifest
        # may name chunks written long ago or by an earlier boot.
        for ident in candidate.needed():
            header = None if ident in self.failed else self.header(ident)
            known = self.durable.get(ident)
            if header is None or (
                known is not None
                and known != (header.payload_length, header.payload_checksum)
            ):
                self.durable.pop(ident, None)
                self.stats.manifests_dropped += 1
                logger.warning(
                    "KV store: not publishing %s: %s (group %d) is missing or "
                    "does not verify",
                    name,
                    ident[0].hex(),
                    ident[1],
                )
                return
            entries[ident] = fmt.ManifestEntry(
                ident[0].hex(), header.payload_length, header.payload_checksum
            )
        manifest = self._manifest(candidate, entries)
        path = os.path.join(self.layout.manifest_dir, name)
        try:
            durable_io.write_file_durably(
                path, [fmt.encode_manifest(manifest, self.key)]
            )
        except (OSError, fmt.FormatError) as e:
            if self.budget is not None:
                self.budget.stale = True  # renamed before its sync failed?
            self.stats.manifests_dropped += 1
            if isinstance(e, OSError) and e.errno == errno.ENOSPC:
                self._on_enospc()
            logger.warning("KV store: publishing manifest %s failed: %s", name, e)
            return
        self.stats.manifests_published += 1
        if self.budget is not None:
            self.budget.published(path, manifest)
        self._set_published(name, manifest.chain)
        for ident in entries:
            self._unpublished.pop(ident, None)
        self.retain(manifest)

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

    # -- keep-K --------------------------------------------------------------

    def retain(self, manifest: fmt.BoundaryManifest) -> None:
        """Keep-K inline, within the tree of chains the new manifest joins."""
        if self.keep == 0:
            return
        self.changes += 1
        root = manifest.chain[0]
        tree = {n: self.published[n] for n in self._by_root.get(root, ())}
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
            if self.budget is not None:
                self.budget.removed(os.path.join(self.layout.manifest_dir, n))
        # FORMAT.md 7.6: the unlinks are durable before any payload they name
        # goes, so a power loss cannot bring back a manifest naming a deleted file.
        durable_io.fsync_dir(self.layout.manifest_dir)
        for n in superseded:
            manifest_chain = tree[n]
            old = old_manifests[n]
            self.forget(n)
            self.stats.manifests_superseded += 1
            if old is None or manifest_chain[-1] in kept_state:
                continue
            # Full-attention chunks stay (descendants name them); the state
            # payloads of a superseded boundary go with it.
            for group in old.groups:
                if group.kind != fmt.GROUP_KIND_STATE:
                    continue
                chunk = self.layout.chunk(old.tip, group.group)
                if self.budget is not None:
                    self.budget.removed(chunk)
                try:
                    os.unlink(chunk)
                except FileNotFoundError:
                    continue
                self.durable.pop((bytes.fromhex(old.tip), group.group), None)
                self._unpublished.pop((bytes.fromhex(old.tip), group.group), None)
                self.stats.state_files_removed += 1
                removed_dirs.add(os.path.dirname(chunk))
        for d in removed_dirs:
            durable_io.fsync_dir(d)
