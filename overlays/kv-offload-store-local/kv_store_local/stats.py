# SPDX-License-Identifier: Apache-2.0
"""Counters of one rank's writer, shared by the capture and writer sides."""

from dataclasses import dataclass

# Why a key was not written when first captured (``StoreStats.drops``).
DROP_REASONS = {
    "budget": "keys_dropped_budget",  # capture pool full (retried later)
    "paused": "keys_dropped_paused",  # writer paused on a full disk (retried)
    "write_failed": "keys_failed",  # write or fsync failed (retried)
    "incomplete": "keys_dropped_incomplete",  # chunk not filled by the DMA
    "window": "keys_dropped_window",  # sliding-window (drafter) group: never written
    "lost": "keys_lost",  # its staging row was reused before a retry fitted
    # its row was about to be reused and the engine thread's last-chance
    # copy had already spent its bound (WorkerStore.last_chance_bytes)
    "last_chance_bound": "keys_lost_last_chance_bound",
    "owed_limit": "keys_lost_owed_limit",  # too many keys waiting for a retry
    # GLM53_KV_OFFLOAD_DISK_GB reached and every chain left is protected
    "disk_budget": "keys_refused_disk_budget",
    # the writer raised on its job (a bug or an unforeseen OS error): the
    # keys it had not settled go back to be captured again
    "writer_error": "keys_lost_writer_error",
}


@dataclass
class StoreStats:
    jobs_captured: int = 0
    # Store jobs captured at shutdown: vLLM had deferred them to a next step.
    jobs_drained: int = 0
    keys_captured: int = 0
    bytes_captured: int = 0
    capture_seconds: float = 0.0
    keys_dropped_budget: int = 0
    keys_dropped_paused: int = 0
    keys_dropped_incomplete: int = 0
    keys_dropped_window: int = 0
    keys_recaptured: int = 0
    # keys_recaptured by path: on the writer thread (after a job or when
    # idle), and on the engine thread as a row's last chance (remember, a
    # restore promotion), bounded per call.
    keys_recaptured_writer: int = 0
    keys_recaptured_last_chance: int = 0
    bytes_recaptured_last_chance: int = 0
    last_chance_seconds: float = 0.0
    keys_lost_last_chance_bound: int = 0
    # First captures queued on the capture device (GPU blocks -> pool behind
    # vLLM's store copy), and acks that found its copy not done yet.
    jobs_queued_on_device: int = 0
    capture_fence_waits: int = 0
    keys_lost: int = 0
    keys_lost_owed_limit: int = 0
    keys_lost_writer_error: int = 0
    jobs_without_meta: int = 0
    jobs_mismatched: int = 0
    # Store jobs vLLM reported failed (its failure channel, 0.34.0), and their
    # keys: the copy to staging failed, so nothing of them is written.
    jobs_failed_transfer: int = 0
    keys_lost_transfer_failed: int = 0
    keys_written: int = 0
    bytes_written: int = 0
    keys_deduplicated: int = 0
    keys_failed: int = 0
    keys_distrusted: int = 0  # files a reader refused: written anew when captured
    write_seconds: float = 0.0
    manifests_published: int = 0
    manifests_dropped: int = 0
    manifests_superseded: int = 0
    state_files_removed: int = 0
    # Oldest unpublished chunks left out of the pending record (its bound):
    # a sweep may delete them, and a manifest needing one waits for a rewrite.
    pending_chunks_dropped: int = 0
    enospc_pauses: int = 0
    # The disk budget (budget.py): chain trees retired (one manifest root
    # each, least recently used first), their manifests, the bytes freed;
    # jobs refused because nothing evictable was left, and their keys.
    chain_trees_evicted: int = 0
    manifests_evicted: int = 0
    bytes_evicted: int = 0
    writes_refused_disk_budget: int = 0
    keys_refused_disk_budget: int = 0
    # Of those refusals, the ones where retiring every tree it may retire
    # would not have made room: nothing was evicted (issue 45).
    evictions_skipped: int = 0
    # Temps and exited writers' pending records the writer removed under
    # LOCK_EX between its jobs (budget.py), as a sweep would.
    stale_files_removed: int = 0

    def drops(self) -> dict[str, int]:
        """Keys not written when first captured, per reason."""
        return {reason: getattr(self, name) for reason, name in DROP_REASONS.items()}
