# SPDX-License-Identifier: Apache-2.0
"""The store-job side channel: what the scheduler tells each worker.

Built on the scheduler, read on the workers. ``kv_store_meta`` is a dict of
builtins so it pickles with the scheduler output and needs nothing of ours
to unpickle.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .deps import init_logger

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (
        TransferJob,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
        RequestOffloadState,
        TransferJobStatus,
    )

logger = init_logger(__name__)

META_VERSION = 1


def key_hash(key: bytes) -> bytes:
    """Block hash of an OffloadKey (hash bytes + 4-byte big-endian group)."""
    return bytes(key[:-4])


def key_group(key: bytes) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


@dataclass(frozen=True)
class SchedulerGroup:
    """What the scheduler side needs to know about one offloaded group."""

    group: int  # original KV cache group index
    tokens_per_chunk: int
    kind: str  # "full", "state" or "window"
    # Drafter layers share this group (an MTP layer beside the target's MLA):
    # vLLM's lookup then needs the chunk after a hit proven too, and drops it.
    eagle: bool = False


class SchedulerStoreMeta:
    """Attaches the versioned side channel to every store job.

    - ``keys``/``groups``/``tokens``: the job's keys in block order (the order
      of the CPU chunk ids in its dst spec), each with its original group and
      end token;
    - ``candidates``: boundary manifests these keys may complete, each with
      ``boundary``, ``chunk_tokens``, the cumulative ``chain`` of chunk hashes
      from token 0, and the ``full`` and ``state`` groups it names.
    """

    def __init__(self, groups: Sequence[SchedulerGroup], tokens_per_hash: int):
        self.groups = tuple(groups)
        self.tokens_per_hash = tokens_per_hash
        self._slot_of = {g.group: slot for slot, g in enumerate(self.groups)}
        self._full = tuple(g.group for g in self.groups if g.kind == "full")
        self._state = tuple(g.group for g in self.groups if g.kind == "state")
        self.eagle = any(g.eagle for g in self.groups if g.kind == "full")
        chunk_tokens = {g.tokens_per_chunk for g in self.groups if g.kind != "window"}
        # A manifest's chain has one chunk size; mixed sizes publish none.
        self.chunk_tokens = chunk_tokens.pop() if len(chunk_tokens) == 1 else None
        if self.chunk_tokens is None:
            logger.warning(
                "KV store: offloaded groups use different chunk sizes; chunks "
                "are written but no boundary manifest is published."
            )

    def attach(
        self,
        store_jobs: Mapping[int, "TransferJob"],
        job_status: Mapping[int, "TransferJobStatus"],
        req_states: Mapping[str, "RequestOffloadState"],
    ) -> None:
        for job_id, job in store_jobs.items():
            status = job_status.get(job_id)
            req_state = req_states.get(job.req_id)
            if status is None or req_state is None:
                continue
            job.kv_store_meta = self.build(status.keys, req_state)

    def build(
        self, keys: Iterable[bytes], req_state: "RequestOffloadState"
    ) -> dict[str, Any]:
        ctx = req_state.req_context
        positioned = []
        for key in keys:
            group = key_group(key)
            token = ctx.get_offload_key_position(key)
            slot = self._slot_of.get(group)
            if token is None or slot is None:
                # Unknown position: the job cannot be named; write nothing.
                return {"version": META_VERSION, "keys": None}
            positioned.append((slot, token, bytes(key), group))
        # The scheduler builds each job slot by slot, chunk by chunk. (A
        # plain tuple sort: no two keys of one slot share an end token.)
        positioned.sort()
        return {
            "version": META_VERSION,
            "keys": [item[2] for item in positioned],
            "groups": [item[3] for item in positioned],
            "tokens": [item[1] for item in positioned],
            "candidates": self._candidates(positioned, req_state.req.block_hashes),
        }

    def _candidates(
        self, positioned: list[tuple[int, int, bytes, int]], block_hashes: Sequence
    ) -> list[dict[str, Any]]:
        if self.chunk_tokens is None:
            return []
        state = set(self._state)
        ends = [tok for _, tok, _, g in positioned if g in self._full]
        # boundary -> the state groups its manifest names
        boundaries: dict[int, list[int]] = {}
        if state:
            for tok in sorted({tok for _, tok, _, g in positioned if g in state}):
                boundaries[tok] = list(self._state)
            if self.eagle and ends and max(ends) not in boundaries:
                # vLLM stores a hybrid's state one chunk before the full
                # chunks' end when drafter layers share a full group, and its
                # lookup asks for that next chunk before it drops it: a
                # manifest of the full groups alone proves it.
                boundaries[max(ends)] = []
        elif ends:
            boundaries[max(ends)] = []
        out = []
        for boundary, state_groups in sorted(boundaries.items()):
            chain = self._chain(boundary, block_hashes)
            if chain is None:
                continue
            out.append(
                {
                    "boundary": boundary,
                    "chunk_tokens": self.chunk_tokens,
                    "chain": chain,
                    "full": list(self._full),
                    "state": state_groups,
                }
            )
        return out

    def _chain(self, boundary: int, block_hashes: Sequence) -> list[bytes] | None:
        chunk_tokens = self.chunk_tokens
        assert chunk_tokens is not None
        if (
            boundary <= 0
            or boundary % chunk_tokens
            or chunk_tokens % self.tokens_per_hash
        ):
            return None
        per_chunk = chunk_tokens // self.tokens_per_hash
        count = boundary // chunk_tokens
        if count * per_chunk > len(block_hashes):
            return None
        return [bytes(block_hashes[(i + 1) * per_chunk - 1]) for i in range(count)]
