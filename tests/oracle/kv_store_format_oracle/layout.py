# SPDX-License-Identifier: Apache-2.0
"""Where one rank's store keeps each of its files."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .constants import DEFAULT_PREFIX
from .names import (
    LOCK_FILE,
    MANIFEST_DIR,
    PENDING_DIR,
    chunk_rel_path,
    manifest_file_name,
    namespace_record_name,
    rank_base_name,
)


@dataclass(frozen=True)
class StoreLayout:
    """Paths of one rank's store under the tier directory."""

    root: str  # GLM53_KV_OFFLOAD_DIR
    base_name: str  # <prefix>_<model>_<ns>_r<rank>

    @classmethod
    def create(
        cls,
        root: str,
        model: str,
        ns_hash: bytes,
        rank: int,
        prefix: str = DEFAULT_PREFIX,
    ) -> StoreLayout:
        return cls(root, rank_base_name(prefix, model, ns_hash, rank))

    @property
    def base(self) -> str:
        return os.path.join(self.root, self.base_name)

    @property
    def namespace_record(self) -> str:
        return os.path.join(self.root, namespace_record_name(self.base_name))

    @property
    def manifest_dir(self) -> str:
        return os.path.join(self.base, MANIFEST_DIR)

    @property
    def lock(self) -> str:
        return os.path.join(self.base, LOCK_FILE)

    @property
    def pending_dir(self) -> str:
        return os.path.join(self.base, PENDING_DIR)

    def chunk(self, key_hex: str, group: int) -> str:
        return os.path.join(self.base, chunk_rel_path(key_hex, group))

    def manifest(self, boundary: int, tip: str) -> str:
        return os.path.join(self.manifest_dir, manifest_file_name(boundary, tip))
