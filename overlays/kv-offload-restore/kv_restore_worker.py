# SPDX-License-Identifier: Apache-2.0
"""Restore, worker side: this rank's inventory and its promotions.

Every TP worker reads only its own store (the rank base the writer opened):

- **Inventory** (kv_restore_inventory): which key each good manifest proves,
  kept current by a rescan; changes go to the scheduler as KEY_UP / KEY_DOWN
  reports (kv_restore_reports), READY once the boot scan is complete.
- **Promotion.** The scheduler's tier sends (job, keys, CPU chunk ids). The
  worker takes the store lock shared (``kvstore gc --sweep`` needs it
  exclusive) and opens every file the job needs. One call of the native
  store library (libkvtier_store.so, no GIL, ``READERS`` threads) then
  reads the job's files; per file: the header is checked in docs/FORMAT.md's order and against the
  manifest entry (namespace, group, key, boundary index, payload length and
  checksum, segment table equal to this boot's layout), then the file size;
  then the payload is read straight into this rank's own slots of the job's
  CPU row (rows the tiering manager allocated for this promotion, loadable
  only once every rank succeeded) and its CRC is checked. Any failure fails
  the job on this rank: the manifests naming the key are marked bad (their
  keys go down) and the scheduler turns the whole job, on every rank, into a
  miss; its rows are freed unread. A refused file is handed to this rank's
  writer (``distrust``): the recompute's store writes it anew and publishes
  the manifests naming it again, so the keys come back up.

Promotions run synchronously in the worker's step (``start_kv_transfers``,
before any CPU->GPU load of that step is submitted), so a promotion is never
in flight across steps: a cache reset that frees its rows cannot be overtaken
by a late write. Chunk files are immutable (temp + rename), so a file opened
before keep-K unlinks it still reads as the verified bytes; one unlinked
before the open is a miss.

Modules: kv_restore_inventory (the manifests and the keys they prove),
kv_restore_read (a job's chunk files checked and read into memory by the
native library), and this one
(the knob, the counters, the promotions and the hooks' entry points).
"""

import errno
import fcntl
import logging
import os
import time
from collections import Counter
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    from . import kv_restore_read as chunk_read
    from . import kv_restore_reports as reports
    from . import kv_store_format as fmt
    from .kv_restore_inventory import Inventory, Proof
    from .kv_store_format import native
except ImportError:  # loaded as a top-level module: tests, tools
    import kv_restore_read as chunk_read  # type: ignore[no-redef]
    import kv_restore_reports as reports  # type: ignore[no-redef]
    import kv_store_format as fmt  # type: ignore[no-redef]
    from kv_restore_inventory import Inventory, Proof  # type: ignore[no-redef]
    from kv_store_format import native  # type: ignore[no-redef]

logger = logging.getLogger(__name__)

ENV_RESTORE = "GLM53_KV_OFFLOAD_RESTORE"
RESCAN_SECONDS = 1.0
READERS = 8  # threads of the native read of one job (bench/restore_read_bench.py)
# fadvise(WILLNEED) each payload before its read: off until a disk run shows
# it pays (bench/restore_bench.py evicts the page cache; set it there).
READ_WILLNEED = False
# Failures that say nothing against the chunk file: no rewrite is asked for.
NOT_THE_FILE = frozenset({"no_manifest", "unknown_group"})


class RestoreRefused(ValueError):
    """GLM53_KV_OFFLOAD_RESTORE=1 cannot be honoured by this deployment."""


def load_native() -> "native.Library":
    """The store library the reads run on; RestoreRefused (a boot error
    naming the file) when it is missing or of another version: restore never
    falls back to a Python read."""
    try:
        return native.load()
    except native.NativeLibraryError as e:
        raise RestoreRefused(f"KV restore needs the store library: {e}") from e


def restore_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Read GLM53_KV_OFFLOAD_RESTORE strictly: unset/0 off, 1 on."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_RESTORE)
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise RestoreRefused(f"{ENV_RESTORE} must be unset, '0' or '1'; got {value!r}.")


def key_scheme_refusal(fenced: Mapping[str, Any]) -> str | None:
    """Why a store's keys may not mean the same thing after a restart, or None.

    The writer fences ``key_scheme`` = {"hash": algorithm, "seed": policy} in
    the namespace (kv_store_local.namespace.key_scheme): a store without it,
    or whose keys were seeded per process, is never read.
    """
    scheme = fenced.get("key_scheme")
    if (
        not isinstance(scheme, Mapping)
        or not isinstance(scheme.get("hash"), str)
        or not isinstance(scheme.get("seed"), str)
    ):
        return "the namespace does not fence the key scheme (written before it did)"
    if scheme["seed"] == "per-process":
        return (
            f"its keys were seeded per process ({scheme['hash']} without "
            "PYTHONHASHSEED): they never match after a restart"
        )
    return None


@dataclass
class RestoreStats:
    """This rank's restore counters; the GPU suite's probe records them by
    these names (docs/engine/run*-results.json), so they stay one flat record."""

    manifests_loaded: int = 0
    manifests_rejected: int = 0
    manifests_marked_bad: int = 0
    jobs_ok: int = 0
    jobs_failed: int = 0
    keys_restored: int = 0
    bytes_restored: int = 0
    read_seconds: float = 0.0
    failures: Counter = field(default_factory=Counter)  # per failure reason


class WorkerRestore:
    """The worker-side object the hooks call. Never raises into vLLM."""

    def __init__(self, rescan_seconds: float = RESCAN_SECONDS):
        self.rescan_seconds = rescan_seconds
        self.stats = RestoreStats()
        self.inventory: Inventory | None = None
        self.disabled_reason: str | None = None
        self._bound = False
        self._store: Any = None
        self._groups: dict[int, Any] = {}
        self._reported: set[bytes] = set()
        self._pending: list[tuple[int, int]] = []
        self._ready_sent = False
        self._last_scan = 0.0
        self._lock_path = ""
        self._namespace = b""
        self._native = load_native()
        # Test seam: called with the job's opened files before they are read.
        self.before_read: Any = None

    @classmethod
    def from_env(cls) -> "WorkerRestore | None":
        return cls() if restore_requested() else None

    # -- binding to this rank's writer ---------------------------------------

    def bind(self, store: Any) -> None:
        """Use the store the writer opened (same rank base, same namespace)."""
        if self._bound:
            return
        self._bound = True
        self._store = store
        writer = getattr(store, "writer", None)
        if store is None or not getattr(store, "active", False) or writer is None:
            reason = getattr(store, "disabled_reason", None) or "no active writer"
            self._disable(f"this rank's store is not open ({reason})")
            return
        layout = writer.layout
        try:
            record = fmt.decode_namespace_record(
                fmt.read_regular(layout.namespace_record, fmt.MAX_RECORD_BYTES)
            )
        except (OSError, fmt.FormatError) as e:
            self._disable(f"namespace record unreadable: {e}")
            return
        refusal = key_scheme_refusal(record.fenced)
        if refusal is not None:
            self._disable(refusal)
            return
        if record.namespace_hash != writer.namespace:
            self._disable("namespace record differs from the writer's namespace")
            return
        self._namespace = writer.namespace
        self._lock_path = layout.lock
        self._groups = {g.group: g for g in store.settings.groups}
        self.inventory = Inventory(layout.manifest_dir, writer.namespace, writer.rank)
        self._scan()
        logger.info(
            "KV restore: rank %d serves %d manifests from %s",
            writer.rank,
            len(self.inventory.manifests),
            layout.base,
        )

    def _disable(self, reason: str) -> None:
        self.disabled_reason = reason
        self.inventory = None
        logger.warning("KV restore: off on this rank (every lookup misses): %s", reason)

    @property
    def active(self) -> bool:
        return self.inventory is not None

    def _scan(self) -> None:
        assert self.inventory is not None
        loaded, rejected = self.inventory.scan()
        self.stats.manifests_loaded += loaded
        self.stats.manifests_rejected += rejected
        self._last_scan = time.monotonic()

    # -- hooks -----------------------------------------------------------------

    def report(self, completed: MutableMapping[int, int], store: Any) -> None:
        """Add this rank's reports to the worker metadata of this step."""
        try:
            self.bind(store)
            if (
                self.inventory is not None
                and time.monotonic() - self._last_scan >= self.rescan_seconds
            ):
                self._scan()
            out = list(self._pending)
            self._pending.clear()
            if not self._ready_sent:
                out.append((reports.READY, 0))
                self._ready_sent = True
            current = self.inventory.keys() if self.inventory is not None else set()
            out += [
                (reports.KEY_UP, reports.key_digest(k))
                for k in current - self._reported
            ]
            out += [
                (reports.KEY_DOWN, reports.key_digest(k))
                for k in self._reported - current
            ]
            self._reported = current
            reports.add(completed, out)
        except Exception:
            logger.exception("KV restore: report failed")

    def promote(self, metadata: Any, store: Any) -> None:
        """Run the promotions the scheduler attached to this step's metadata."""
        requests = getattr(metadata, "kv_restore", None)
        if not requests:
            return
        self.bind(store)
        for request in requests:
            job_id = request["job"]
            # The promotion overwrites these rows: keys the writer still owes
            # from them (their earlier bytes) get their last chance first.
            if self._store is not None:
                self._store.rows_taken(request["chunks"])
            try:
                ok = self._promote(request["keys"], request["chunks"])
            except Exception:
                logger.exception("KV restore: promotion %d failed", job_id)
                self.stats.failures["internal_error"] += 1
                ok = False
            self.stats.jobs_ok += ok
            self.stats.jobs_failed += not ok
            self._pending.append(
                (reports.PROMOTE_OK if ok else reports.PROMOTE_FAIL, job_id)
            )

    # -- one promotion ---------------------------------------------------------

    def _promote(self, keys: Sequence[bytes], chunks: Sequence[int]) -> bool:
        if self.inventory is None or len(keys) != len(chunks):
            self.stats.failures["restore_off"] += 1
            return False
        lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        opened: list[tuple[bytes, int, Proof, int]] = []
        try:
            try:
                # Never wait for a sweep on the serving path: a busy lock is a miss.
                fcntl.flock(lock_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                self.stats.failures["lock_busy"] += 1
                return False
            try:
                for key, chunk in zip(keys, chunks, strict=True):
                    opened.append((bytes(key), int(chunk), *self._open(bytes(key))))
                if self.before_read is not None:
                    self.before_read([p for _, _, p, _ in opened])
                start = time.perf_counter()
                self._read_all(opened)
                self.stats.read_seconds += time.perf_counter() - start
            except chunk_read.PromotionFailed as e:
                self._fail(e)
                return False
        finally:
            for _, _, _, fd in opened:
                os.close(fd)
            os.close(lock_fd)  # releases the shared lock
        self.stats.keys_restored += len(opened)
        return True

    def _open(self, key: bytes) -> tuple[Proof, int]:
        assert self.inventory is not None
        proof = self.inventory.proof(key)
        if proof is None:
            raise chunk_read.PromotionFailed(
                "no_manifest", "no manifest of this rank proves it", key
            )
        if proof.group not in self._groups:
            raise chunk_read.PromotionFailed(
                "unknown_group", f"group {proof.group}", key
            )
        path = self._store.writer.layout.chunk(proof.key_hex, proof.group)
        try:
            fd = fmt.open_regular(path)
        except OSError as e:
            reason = "missing_file" if e.errno == errno.ENOENT else "io_error"
            raise chunk_read.PromotionFailed(
                reason, f"{path}: {e.strerror}", key
            ) from e
        return proof, fd

    def _read_all(self, opened: Sequence[tuple[bytes, int, Proof, int]]) -> None:
        """Read and verify the job's files: one call of the native library,
        ``READERS`` threads, the GIL released for the whole read."""
        requests = []
        for _, chunk, proof, fd in opened:
            layout, first, count = self._geometry(proof)
            requests.append(
                chunk_read.request(
                    proof,
                    fd,
                    self._namespace,
                    layout.segments(count),
                    self._runs(layout, chunk, first, count),
                )
            )
        keys = [key for key, _, _, _ in opened]
        self.stats.bytes_restored += chunk_read.read_job(
            self._native, keys, requests, READERS, READ_WILLNEED
        )

    def _geometry(self, proof: Proof) -> tuple[Any, int, int]:
        """(group layout, first sub-block, sub-blocks) of a key's CPU row."""
        layout = self._groups[proof.group]
        bpc = self._store.settings.blocks_per_chunk
        if proof.kind == fmt.GROUP_KIND_STATE:
            block_tokens = proof.chunk_tokens // bpc
            return layout, (proof.boundary // block_tokens - 1) % bpc, 1
        return layout, 0, bpc

    def _runs(self, layout: Any, chunk: int, first: int, count: int) -> list:
        """Where the payload goes, in payload order: per layer, per sub-block,
        the unpadded page bytes (the inverse of the writer's capture)."""
        bpc = self._store.settings.blocks_per_chunk
        runs = []
        for layer in layout.layers:
            t = self._store._staging[layer.tensor]
            page = t.width // bpc
            row = chunk_read.buffer_address(t.source) + t.offset + chunk * t.row_stride
            for j in range(first, first + count):
                runs.append((row + j * page, layer.real_bytes))
        return chunk_read.coalesce_runs(runs)

    def _fail(self, e: chunk_read.PromotionFailed) -> None:
        self.stats.failures[e.reason] += 1
        names: list[str] = []
        if e.key is not None and self.inventory is not None:
            names = self.inventory.mark_bad(e.key)
            self.stats.manifests_marked_bad += len(names)
        if e.key is not None and e.reason not in NOT_THE_FILE:
            # The header may still verify: without this the writer would keep
            # deduplicating onto the bad file and the keys would stay down.
            self._store.writer.distrust((e.key[:-4], int.from_bytes(e.key[-4:], "big")))
        logger.warning(
            "KV restore: promotion failed (%s: %s); manifests marked bad: %s; "
            "the request recomputes",
            e.reason,
            e,
            names,
        )
