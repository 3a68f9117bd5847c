# SPDX-License-Identifier: Apache-2.0
"""Worker -> scheduler restore reports, carried in the connector's worker metadata.

vLLM sums ``OffloadingWorkerMetadata.completed_jobs`` over the TP ranks
(``aggregate``) and the scheduler skips every id below its stale-job threshold,
so a negative id is a counter that reaches the scheduler summed over ranks and
that the stock code ignores. Each report is one such id; its count is the
number of ranks that sent it. Ids fit in a signed 64-bit integer so any
serializer of the metadata carries them.

Kinds (the low 3 bits):

- READY: this rank finished its boot scan (its inventory follows or is empty);
- KEY_UP / KEY_DOWN: this rank can / can no longer prove a key with a
  manifest (the value is a 59-bit digest of the OffloadKey);
- PROMOTE_OK / PROMOTE_FAIL: this rank's result for a promotion job;
- READ_RATE / KEY_BYTES: this rank's measured read rate (bytes/s) and bytes
  per key, after a promotion (the value: the rank above, the number below
  ``RANK_SHIFT``), which the scheduler weighs against recomputing.
"""

import hashlib
from collections.abc import Iterable, MutableMapping

READY = 0
KEY_UP = 1
KEY_DOWN = 2
PROMOTE_OK = 3
PROMOTE_FAIL = 4
READ_RATE = 5
KEY_BYTES = 6
_KINDS = 8
_VALUE_BITS = 59
RANK_SHIFT = 44  # a rank's number: up to 16 TB/s or 16 TB a key


def key_digest(key: bytes) -> int:
    """59-bit digest of an OffloadKey (hash bytes + 4-byte group).

    A collision can only make the scheduler believe a key is provable on
    every rank; the worker then resolves the key exactly and fails closed.
    """
    digest = hashlib.blake2b(bytes(key), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> (64 - _VALUE_BITS)


def rank_value(rank: int, number: float) -> int:
    """One rank's measured number as a report value (rank, rounded number)."""
    return rank << RANK_SHIFT | min(max(round(number), 0), (1 << RANK_SHIFT) - 1)


def split_rank_value(value: int) -> tuple[int, int]:
    return value >> RANK_SHIFT, value & ((1 << RANK_SHIFT) - 1)


def encode(kind: int, value: int) -> int:
    if not 0 <= kind < _KINDS or not 0 <= value < (1 << _VALUE_BITS):
        raise ValueError(f"report kind {kind} value {value} out of range")
    return -(1 + (value << 3 | kind))


def decode(report_id: int) -> tuple[int, int] | None:
    """(kind, value) of a report id, or None for an ordinary job id."""
    if report_id >= 0:
        return None
    raw = -report_id - 1
    return raw & (_KINDS - 1), raw >> 3


def add(completed: MutableMapping[int, int], reports: Iterable[tuple[int, int]]):
    """Put this rank's reports into its completed_jobs (count 1 each)."""
    for kind, value in reports:
        completed[encode(kind, value)] = 1


def take(completed: MutableMapping[int, int]) -> list[tuple[int, int, int]]:
    """Remove the reports from aggregated completed_jobs: (kind, value, ranks)."""
    out = []
    for report_id in [j for j in completed if j < 0]:
        decoded = decode(report_id)
        assert decoded is not None
        out.append((*decoded, completed.pop(report_id)))
    return out
