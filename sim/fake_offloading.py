"""A recording offloading spec for the harness: real vLLM base classes, a
manager that never misses a store and never evicts.

The scope tests, the store-local hook tests and the main job's store stage
all boot the real offloading connector on it. It is the simplest manager
that satisfies the interface: every lookup misses, every store is accepted
and gets the next CPU chunk ids (wrapping at ``rows`` when given). Tests
that need deduplication, eviction or a full CPU tier use vLLM's real
``CPUOffloadingManager`` instead.
"""

from __future__ import annotations

from types import SimpleNamespace


def make_spec(
    vllm, offloading_config, *, worker=None, rows: int | None = None, manager=None
):
    """An ``OffloadingSpec`` subclass instance over ``offloading_config``.

    vllm: a ``hybrid_layout.HybridVllm`` (its ``base`` and ``cpu`` modules).
    worker: what ``get_worker`` returns (default: a namespace holding the
    canonical KV caches it was given, also kept as ``spec.worker_caches``).
    manager: the manager to hand out instead of the recording one, e.g. the
    tree's real ``CPUOffloadingManager``.
    """
    base = vllm.base
    cpu_spec = vllm.cpu.CPULoadStoreSpec

    class RecordingManager(base.OffloadingManager):
        def __init__(self) -> None:
            self.lookups = 0
            self.stored: list[list[bytes]] = []
            self.next_chunk = 0

        def lookup(self, key, req_context):
            self.lookups += 1
            return base.LookupResult.MISS

        def prepare_load(self, keys, req_context):
            raise AssertionError("no load is expected")

        def prepare_store(self, keys, req_context):
            keys = list(keys)
            self.stored.append(keys)
            chunks = [self.next_chunk + i for i in range(len(keys))]
            if rows is not None:
                chunks = [c % rows for c in chunks]
            self.next_chunk += len(keys)
            return base.PrepareStoreOutput(
                keys_to_store=keys, store_spec=cpu_spec(chunks), evicted_keys=[]
            )

        def on_new_request(self, req_context):
            return base.RequestOffloadingContext()

    class RecordingSpec(base.OffloadingSpec):
        def __init__(self, config) -> None:
            super().__init__(config)
            self.manager = manager if manager is not None else RecordingManager()
            self.worker_caches = None

        def get_manager(self):
            return self.manager

        def get_worker(self, kv_caches):
            self.worker_caches = kv_caches
            if worker is not None:
                return worker
            return SimpleNamespace(kv_caches=kv_caches)

    return RecordingSpec(offloading_config)


class HostTensor:
    """A KV cache tensor's rows in host memory, where a GPU tensor would be:
    what vLLM reads of a canonical KV tensor (its address, row stride and
    rows; vLLM 0.34.0 resolves a job's block addresses from them). Never
    dereferenced by the fakes: they only count transfers."""

    is_cuda = False

    def __init__(self, buffer: bytearray, row_bytes: int) -> None:
        import ctypes

        self.buffer = buffer  # kept alive: the address is into it
        self._address = (
            ctypes.addressof(ctypes.c_char.from_buffer(buffer)) if buffer else 0
        )
        self.row_bytes = row_bytes
        self.shape = (len(buffer) // row_bytes, row_bytes)

    def data_ptr(self) -> int:
        return self._address

    def stride(self, dim: int = 0) -> int:
        return self.row_bytes if dim == 0 else 1

    def numel(self) -> int:
        return len(self.buffer)

    def element_size(self) -> int:
        return 1


class FakeTransferWorker:
    """The CPU offloading worker's surface: a transfer finishes when told.

    Tests and the main job play the GPU: they fill the staging rows a store
    job names, move its id from ``submitted`` to ``done``, and call the
    connector worker's ``get_finished``.
    """

    def __init__(self, base) -> None:
        self.base = base
        self.submitted: list[int] = []
        self.done: list[int] = []
        self.waited: list[set[int]] = []

    def submit_store(self, job_id, src_spec, dst_spec):
        self.submitted.append(job_id)
        return True

    def get_finished(self):
        done, self.done = self.done, []
        return [self.base.TransferResult(job_id, True, 1, 0.001) for job_id in done]

    def wait(self, job_ids):
        self.waited.append(set(job_ids))

    def shutdown(self):
        return
