# SPDX-License-Identifier: Apache-2.0
"""The tier's counters on vLLM's own Prometheus endpoint.

Each worker sends the increase of its writer's ``StoreStats`` and its
restorer's ``RestoreStats`` since its last step as an
``OffloadingConnectorStats`` payload from ``get_kv_connector_stats``; vLLM sums
the ranks' payloads (counters add per label tuple), merges the scheduler's
(our tier's ``TierStats``: lookups, promotions, restore-vs-recompute
decisions) and hands the sum to ``OffloadPromMetrics``, which only knows the
names that ``definitions()`` adds. vLLM appends ``_total`` to every counter.

One table: a new stats field joins with one row in ``COUNTERS`` (or one entry
in ``EXCLUDED`` saying why it is not a counter); a test holds every field of
the three records to that.
"""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.worker import (
        OffloadingConnectorWorker,
    )

# Where a row's value lives: the worker's writer, the worker's restorer, or
# the scheduler's tier.
STORE, RESTORE, TIER = "store", "restore", "tier"


@dataclass(frozen=True)
class Row:
    source: str  # STORE / RESTORE / TIER
    field: str  # the stats record's field
    name: str  # the metric (vLLM adds _total)
    help: str
    # (label name, value) when several fields share one metric by label; a
    # Counter field (per reason) uses its keys as the label's values instead.
    label: tuple[str, str] | None = None


def _r(source, field, name, help, label=None):
    return Row(source, field, "vllm:kv_offload_" + name, help, label)


_DROP = "KV offload keys not written to the local store when first captured"
_LOST = "KV offload keys the local store will never write"
COUNTERS: tuple[Row, ...] = (
    # -- the writer (StoreStats), one rank's, summed over ranks by vLLM
    _r(STORE, "jobs_captured", "store_jobs_captured", "Store jobs captured for the local store."),
    _r(STORE, "jobs_drained", "store_jobs_drained", "Store jobs captured at shutdown (deferred by vLLM)."),
    _r(STORE, "keys_captured", "store_keys_captured", "KV offload keys captured for the local store."),
    _r(STORE, "bytes_captured", "store_captured_bytes", "Bytes captured for the local store."),
    _r(STORE, "capture_seconds", "store_capture_seconds", "Engine-thread time spent capturing, in seconds."),
    _r(STORE, "keys_dropped_budget", "store_keys_dropped", _DROP + ", by reason.", ("reason", "budget")),
    _r(STORE, "keys_dropped_paused", "store_keys_dropped", _DROP + ", by reason.", ("reason", "paused")),
    _r(STORE, "keys_dropped_incomplete", "store_keys_dropped", _DROP + ", by reason.", ("reason", "incomplete")),
    _r(STORE, "keys_dropped_window", "store_keys_dropped", _DROP + ", by reason.", ("reason", "window")),
    _r(STORE, "keys_recaptured", "store_keys_recaptured", "Dropped keys captured again and written."),
    _r(STORE, "keys_recaptured_writer", "store_keys_recaptured_by_path", "Keys recaptured, by path.", ("path", "writer")),
    _r(STORE, "keys_recaptured_last_chance", "store_keys_recaptured_by_path", "Keys recaptured, by path.", ("path", "last_chance")),
    _r(STORE, "bytes_recaptured_last_chance", "store_last_chance_bytes", "Bytes copied as a staging row's last chance."),
    _r(STORE, "last_chance_seconds", "store_last_chance_seconds", "Engine-thread time of last-chance copies, in seconds."),
    _r(STORE, "keys_lost", "store_keys_lost", _LOST + ", by reason.", ("reason", "staging_reused")),
    _r(STORE, "keys_lost_last_chance_bound", "store_keys_lost", _LOST + ", by reason.", ("reason", "last_chance_bound")),
    _r(STORE, "keys_lost_owed_limit", "store_keys_lost", _LOST + ", by reason.", ("reason", "owed_limit")),
    _r(STORE, "keys_lost_writer_error", "store_keys_lost", _LOST + ", by reason.", ("reason", "writer_error")),
    _r(STORE, "jobs_queued_on_device", "store_jobs_queued_on_device", "First captures queued on the capture stream."),
    _r(STORE, "capture_fence_waits", "store_capture_fence_waits", "Acks that waited for the capture copy."),
    _r(STORE, "jobs_without_meta", "store_jobs_invalid", "Store jobs the writer could not use, by reason.", ("reason", "without_meta")),
    _r(STORE, "jobs_mismatched", "store_jobs_invalid", "Store jobs the writer could not use, by reason.", ("reason", "mismatched")),
    _r(STORE, "jobs_failed_transfer", "store_jobs_invalid", "Store jobs the writer could not use, by reason.", ("reason", "transfer_failed")),
    _r(STORE, "keys_lost_transfer_failed", "store_keys_lost", _LOST + ", by reason.", ("reason", "transfer_failed")),
    _r(STORE, "keys_written", "store_keys_written", "KV offload keys written durably to the local store."),
    _r(STORE, "bytes_written", "store_written_bytes", "Bytes written durably to the local store."),
    _r(STORE, "keys_deduplicated", "store_keys_deduplicated", "Keys already in the local store (not written again)."),
    _r(STORE, "keys_failed", "store_keys_failed", "Key writes that failed (write or fsync; retried)."),
    _r(STORE, "keys_distrusted", "store_keys_distrusted", "Store files a reader refused (written anew)."),
    _r(STORE, "write_seconds", "store_write_seconds", "Writer-thread time spent writing, in seconds."),
    _r(STORE, "manifests_published", "store_manifests", "Boundary manifests, by outcome.", ("outcome", "published")),
    _r(STORE, "manifests_dropped", "store_manifests", "Boundary manifests, by outcome.", ("outcome", "dropped")),
    _r(STORE, "manifests_superseded", "store_manifests", "Boundary manifests, by outcome.", ("outcome", "superseded")),
    _r(STORE, "state_files_removed", "store_state_files_removed", "Files removed by keep-K retention."),
    _r(STORE, "pending_chunks_dropped", "store_pending_chunks_dropped", "Chunks left out of the bounded pending record."),
    _r(STORE, "enospc_pauses", "store_enospc_pauses", "Times the writer paused on a full disk."),
    _r(STORE, "chain_trees_evicted", "store_evictions", "Chain trees the disk budget retired."),
    _r(STORE, "manifests_evicted", "store_evicted_manifests", "Manifests the disk budget retired."),
    _r(STORE, "bytes_evicted", "store_evicted_bytes", "Bytes the disk budget retired."),
    _r(STORE, "writes_refused_disk_budget", "store_writes_refused_disk_budget", "Store jobs refused at the disk budget (nothing evictable)."),
    _r(STORE, "keys_refused_disk_budget", "store_keys_lost", _LOST + ", by reason.", ("reason", "disk_budget")),
    _r(STORE, "evictions_skipped", "store_evictions_skipped", "Store jobs refused without evicting: no eviction could make room."),
    _r(STORE, "stale_files_removed", "store_stale_files_removed", "Temps and exited writers' pending records the writer removed."),
    # -- the restorer (RestoreStats), one rank's
    _r(RESTORE, "manifests_loaded", "restore_manifests", "Boundary manifests the restorer read, by outcome.", ("outcome", "loaded")),
    _r(RESTORE, "manifests_rejected", "restore_manifests", "Boundary manifests the restorer read, by outcome.", ("outcome", "rejected")),
    _r(RESTORE, "manifests_marked_bad", "restore_manifests", "Boundary manifests the restorer read, by outcome.", ("outcome", "marked_bad")),
    _r(RESTORE, "jobs_ok", "restore_jobs", "Restore (promotion) jobs on a rank, by result.", ("result", "ok")),
    _r(RESTORE, "jobs_failed", "restore_jobs", "Restore (promotion) jobs on a rank, by result.", ("result", "failed")),
    _r(RESTORE, "failures", "restore_jobs_refused", "Restore jobs a rank refused (fail closed), by reason.", ("reason", "")),
    _r(RESTORE, "jobs_fenced", "restore_jobs_fenced", "Restore jobs a cache reset cancelled or waited for."),
    _r(RESTORE, "keys_restored", "restore_keys", "KV offload keys restored from the local store."),
    _r(RESTORE, "bytes_restored", "restore_read_bytes", "Bytes read from the local store by restores."),
    _r(RESTORE, "read_seconds", "restore_read_seconds", "Time spent reading restores, in seconds."),
    # -- the scheduler's tier (TierStats)
    _r(TIER, "lookups", "restore_lookups", "Local-store tier lookups, by result.", ("result", "")),
    _r(TIER, "promotions_ok", "restore_promotions", "Promotions from the local store, by result.", ("result", "ok")),
    _r(TIER, "promotions_failed", "restore_promotions", "Promotions from the local store, by result.", ("result", "failed")),
    _r(TIER, "promotions_fenced", "restore_promotions", "Promotions from the local store, by result.", ("result", "fenced")),
    _r(TIER, "keys_promoted", "restore_keys_promoted", "Keys promoted from the local store to the CPU tier."),
    _r(TIER, "keys_failed", "restore_keys_failed", "Keys whose promotion failed."),
    _r(TIER, "restores_weighed", "restore_decisions", "Restore-vs-recompute decisions, by decision.", ("decision", "weighed")),
    _r(TIER, "restores_declined", "restore_decisions", "Restore-vs-recompute decisions, by decision.", ("decision", "declined")),
    _r(TIER, "restores_unmeasured", "restore_decisions", "Restore-vs-recompute decisions, by decision.", ("decision", "unmeasured")),
)  # fmt: skip

# Fields that are not counters, and why.
EXCLUDED: dict[tuple[str, str], str] = {
    (RESTORE, "read_rate"): "an estimate (bytes/s), not a count",
    (RESTORE, "key_bytes"): "an estimate (bytes a key), not a count",
    (RESTORE, "job_reads"): "the newest jobs' reads, a list for the GPU suite's judge",
    (TIER, "last_estimate"): "the last decision's numbers, logged",
}


def definitions(metadata: Callable[..., Any] | None = None) -> dict[str, Any]:
    """Metric name -> vLLM's OffloadingCounterMetadata, for OffloadPromMetrics."""
    if metadata is None:
        from vllm.v1.kv_offload.base import OffloadingCounterMetadata as metadata
    out: dict[str, Any] = {}
    for row in COUNTERS:
        labels = (row.label[0],) if row.label else ()
        out.setdefault(row.name, metadata(documentation=row.help, labelnames=labels))
    return out


def samples(source: str, stats: Any) -> Iterable[tuple[str, tuple[str, ...], float]]:
    """(metric, label values, running total) of one stats record."""
    for row in COUNTERS:
        if row.source != source:
            continue
        value = getattr(stats, row.field)
        if isinstance(value, Mapping):  # per reason: its keys are the labels
            for key, count in value.items():
                yield row.name, (str(key),), count
        else:
            yield row.name, (row.label[1],) if row.label else (), value


class Exporter:
    """Sends the increase of running totals since the last call."""

    def __init__(self) -> None:
        self._sent: dict[tuple[str, tuple[str, ...]], float] = {}

    def increases(self, records: Iterable[tuple[str, Any]]):
        out = []
        for source, stats in records:
            if stats is None:
                continue
            for name, labels, total in samples(source, stats):
                step = total - self._sent.get((name, labels), 0)
                if step > 0:
                    self._sent[(name, labels)] = total
                    out.append((name, labels, step))
        return out

    def take(
        self,
        records: Iterable[tuple[str, Any]],
        payload: "OffloadingConnectorStats | None" = None,
    ) -> "OffloadingConnectorStats | None":
        """An OffloadingConnectorStats of the increases (None: nothing new)."""
        steps = self.increases(records)
        if not steps:
            return None
        if payload is None:
            from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (  # noqa: E501
                OffloadingConnectorStats,
            )

            payload = OffloadingConnectorStats()
        for name, labels, step in steps:
            payload.increase_counter(name, step, labels)
        return payload


def worker_stats(
    connector_worker: "OffloadingConnectorWorker",
) -> "OffloadingConnectorStats | None":
    """The hook in OffloadingConnector.get_kv_connector_stats (a worker)."""
    store = getattr(connector_worker, "_kv_store", None)
    restore = getattr(connector_worker, "_kv_restore", None)
    if store is None and restore is None:
        return None
    exporter = connector_worker.__dict__.setdefault("_kv_exported", Exporter())
    return exporter.take(
        (
            (STORE, getattr(store, "stats", None)),
            (RESTORE, getattr(restore, "stats", None)),
        )
    )
