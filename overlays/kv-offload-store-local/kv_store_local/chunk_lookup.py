# SPDX-License-Identifier: Apache-2.0
"""Where a key's chunk file is, and its header when the file verifies: the
writer's dedup, a candidate looking for its files, a publication checking
them again. Reads only."""

import os

from .deps import fmt
from .ledger import Ident
from .store_perms import Folders


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


class ChunkLookup:
    # Chunk paths asked for again and again (dedup, register, publish): kept.
    MAX_PATHS = 1 << 16

    def __init__(
        self,
        layout: fmt.StoreLayout,
        namespace: bytes,
        key: bytes | None,
        folders: Folders,
    ):
        self.layout = layout
        self.namespace = namespace
        self.key = key  # a keyed store's: a file taken from disk must be sealed
        # A chunk folder found unsafe is never deduplicated onto.
        self.folders = folders
        self._paths: dict[Ident, str] = {}
        self._path_shapes: set[tuple[int, int]] = set()
        self._base = layout.base

    def path(self, ident: Ident) -> str:
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

    def header(self, ident: Ident) -> fmt.ChunkHeader | None:
        path = self.path(ident)
        # Most keys asked about under pressure were never written: their open
        # fails at once, so the folders are checked only for a file that is
        # there (the read trusts nothing; the open follows no link and takes
        # only a regular file).
        header = verified_header(self.layout, self.namespace, *ident, self.key, path)
        if header is None or self.folders.problem(os.path.dirname(path)):
            return None  # absent, not this key's, or in an unsafe chunk folder
        return header
