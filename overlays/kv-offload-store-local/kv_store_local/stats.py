# SPDX-License-Identifier: Apache-2.0
"""Counters of one rank's writer, shared by the capture and writer sides."""

from dataclasses import dataclass


@dataclass
class StoreStats:
    jobs_captured: int = 0
    keys_captured: int = 0
    bytes_captured: int = 0
    capture_seconds: float = 0.0
    keys_dropped_budget: int = 0
    keys_dropped_paused: int = 0
    keys_dropped_incomplete: int = 0
    jobs_without_meta: int = 0
    jobs_mismatched: int = 0
    keys_written: int = 0
    bytes_written: int = 0
    keys_deduplicated: int = 0
    keys_failed: int = 0
    write_seconds: float = 0.0
    manifests_published: int = 0
    manifests_dropped: int = 0
    manifests_superseded: int = 0
    state_files_removed: int = 0
    enospc_pauses: int = 0
