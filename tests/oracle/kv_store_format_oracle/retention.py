# SPDX-License-Identifier: Apache-2.0
"""Keep-K retention: which boundary manifests survive (a leaf walk)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .constants import MAX_KEEP_BOUNDARIES
from .format_error import FormatError, Reason


def kept_manifests(chains: Mapping[str, Sequence[str]], keep: int) -> set[str]:
    """Names of the manifests keep-K retains; every other one is superseded.

    `chains` maps a manifest name to its chain. A manifest's ancestors are the
    manifests whose chain is a proper prefix of its own; a leaf has no
    descendants. Each leaf keeps itself and its keep-1 deepest ancestors, so a
    manifest survives while it is among the K most recent boundaries of ANY
    chain containing it. keep == 0 disables retention (everything is kept).
    """
    if not 0 <= keep <= MAX_KEEP_BOUNDARIES:
        raise FormatError(Reason.FIELD_OUT_OF_RANGE, f"keep {keep}")
    if keep == 0:
        return set(chains)
    # A trie over the chains: one node per distinct prefix, so ancestry costs
    # one dict lookup per chain element even for thousands of long chains.
    nodes: dict[tuple[int, str], int] = {}
    paths: dict[str, list[int]] = {}
    names_at: dict[int, list[str]] = {}
    for name in sorted(chains):
        node = 0
        path = []
        for key in chains[name]:
            node = nodes.setdefault((node, key), len(nodes) + 1)
            path.append(node)
        paths[name] = path
        names_at.setdefault(node, []).append(name)
    not_leaf = {
        node for path in paths.values() for node in path[:-1] if node in names_at
    }
    kept: set[str] = set()
    for name, path in paths.items():
        end = path[-1] if path else 0
        if end in not_leaf:
            continue
        kept.add(name)
        ancestors = [node for node in reversed(path[:-1]) if node in names_at]
        for node in ancestors[: keep - 1]:
            kept.update(names_at[node])
    return kept
