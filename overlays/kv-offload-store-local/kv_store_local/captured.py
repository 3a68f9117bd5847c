# SPDX-License-Identifier: Apache-2.0
"""Captured work, as the serving side hands it to the writer thread."""

from dataclasses import dataclass, field
from typing import Any

from .deps import fmt


@dataclass
class CapturedKey:
    hash: bytes
    group: int
    boundary: int  # end token of the chunk
    offset: int  # in the capture pool
    size: int
    segments: tuple[fmt.Segment, ...]
    # Where the bytes came from, so a key the writer could not write can be
    # captured again while its staging row still holds it (recapture.Owed).
    origin: Any = field(default=None, compare=False)
    freed: bool = field(default=False, compare=False)


@dataclass
class Candidate:
    """A boundary manifest the scheduler says these keys may complete."""

    boundary: int
    chunk_tokens: int
    chain: tuple[bytes, ...]
    full: tuple[int, ...]
    state: tuple[int, ...]

    @property
    def name(self) -> str:
        return fmt.manifest_file_name(self.boundary, self.chain[-1].hex())

    def needed(self) -> list[tuple[bytes, int]]:
        out = [(h, g) for g in self.full for h in self.chain]
        out += [(self.chain[-1], g) for g in self.state]
        return out


@dataclass
class CapturedJob:
    job_id: int
    keys: list[CapturedKey]
    candidates: list[Candidate]
