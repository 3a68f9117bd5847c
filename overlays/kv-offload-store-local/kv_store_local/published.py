# SPDX-License-Identifier: Apache-2.0
"""The boundary manifests this rank has published: name -> chain (hex), with
lookups by chain and by root kept beside, so a job's work stays independent
of how many manifests the store holds. Filled at boot from the manifests an
earlier boot left; then told of each publication and of every name keep-K,
a reader's refusal or the disk budget retires."""

import os
from collections.abc import Iterator

from .deps import fmt
from .store_index import Parsed, named_chunks

Chain = tuple[str, ...]


def _file_ident(path: str) -> tuple[int, int, int]:
    st = os.stat(path, follow_symlinks=False)
    return st.st_size, st.st_ino, st.st_dev


class PublishedIndex:
    def __init__(self) -> None:
        self._names: dict[str, Chain] = {}
        self._chains: dict[Chain, int] = {}  # chain -> names
        self._by_root: dict[str, dict[str, None]] = {}  # root -> names
        self._version = 0

    def load(
        self, layout: fmt.StoreLayout, key: bytes | None, parsed: Parsed | None = None
    ) -> None:
        """Read the manifests an earlier boot left (for keep-K). ``parsed``
        (the disk budget's) keeps each one as decoded here, so the budget's
        first scan does not decode them again."""
        for name in sorted(os.listdir(layout.manifest_dir)):
            path = os.path.join(layout.manifest_dir, name)
            try:
                fmt.parse_manifest_file_name(name)
                before = None if parsed is None else _file_ident(path)
                manifest = fmt.decode_manifest(
                    fmt.read_regular(path, fmt.MAX_MANIFEST_BYTES), key
                )
                # The same file before and after the read: what it names.
                same = before is not None and _file_ident(path) == before
            except (OSError, fmt.FormatError):
                continue  # temps and damaged files are kvstore gc's business
            self.add(name, manifest.chain)
            if parsed is not None and same:
                named = named_chunks(layout, manifest)
                parsed[name] = (before, manifest.chain[0], named)

    def add(self, name: str, chain: Chain) -> None:
        self.forget(name)
        self._version += 1
        self._names[name] = chain
        self._chains[chain] = self._chains.get(chain, 0) + 1
        self._by_root.setdefault(chain[0], {})[name] = None

    def forget(self, name: str) -> None:
        """No longer published (keep-K, distrust, the budget retired it)."""
        chain = self._names.pop(name, None)
        if chain is None:
            return
        self._version += 1
        n = self._chains[chain] - 1
        if n:
            self._chains[chain] = n
        else:
            del self._chains[chain]
        names = self._by_root[chain[0]]
        del names[name]
        if not names:
            del self._by_root[chain[0]]

    def naming(self, key_hex: str) -> list[str]:
        """The names whose chain holds this key."""
        return [n for n, chain in self._names.items() if key_hex in chain]

    def tree(self, root: str) -> dict[str, Chain]:
        """Every published name whose chain starts at ``root``, with its chain."""
        return {n: self._names[n] for n in self._by_root.get(root, ())}

    def has_chain(self, chain: Chain) -> bool:
        return chain in self._chains

    def chain(self, name: str) -> Chain | None:
        return self._names.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def roots(self) -> dict[str, set[str]]:
        """Root -> names, as kept (tests compare it with the names)."""
        return {r: set(names) for r, names in self._by_root.items()}

    def chains(self) -> set[Chain]:
        return set(self._chains)

    @property
    def version(self) -> int:
        return self._version
