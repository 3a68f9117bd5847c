# SPDX-License-Identifier: Apache-2.0
"""Worker-local disk tier for native KV offloading (store only).

Each tensor-parallel worker writes its own KV bytes, taken from its own CPU
staging slots, to its own local disk in the chunk store format
(kv_store_format). The scheduler never touches the disk; it only attaches a
side channel to every store job naming the job's keys in block order and the
boundary manifests those keys may complete.

Flow on a worker:

1. ``remember``: a store job arrives; keep its CPU chunk ids, GPU block ids
   and side channel. Keys still owed from the rows it names get a bounded
   last chance (a copy out of staging), then go stale.
2. ``submitted``: vLLM queued the job's GPU->CPU copy. On CUDA the job's
   real, unpadded bytes are queued right behind it, on the same stream,
   from the same GPU blocks into a pinned pool under a byte budget
   (capture_device, vllm_worker.StoreStreamDevice): the engine thread only
   queues. ``capture``: the job completed (vLLM's event now covers our copy)
   and this rank has not acked: hand the keys to the writer. Without a
   device the bytes are copied out of staging here, before the ack. A full
   budget drops that store (owed, taken again by the writer thread while
   its staging row holds it); serving never waits and acks are never
   deferred.
3. The writer thread hands a job's keys to the native store library in one
   call (header + payload to a temp file, fdatasync, rename, folder fsync).
   A boundary manifest is published only once every file it names is
   durable and its header verifies. Keep-K retention runs right after each
   publication.

The package is imported only when ``GLM53_KV_OFFLOAD=1``; the hooks in vLLM's
files check the variable first. The hooks import one adapter module each
(``vllm_scheduler`` on the scheduler, ``vllm_worker`` on the workers); every
other module is plain logic on plain values, standard library only, and is
tested without vLLM.

Scheduler side: side_channel, vllm_scheduler.
Worker side: layout, capture_device, capture_pool, copier, captured, stats,
durable_io, chunk_lookup, ledger, manifests, published, publisher, keep_k,
store_index, budget, writer, namespace, boot, block_moves, worker_store,
vllm_worker.
"""


def __getattr__(name: str) -> type:
    # The boot guard (docs/DEPLOY.md): with GLM53_KV_OFFLOAD=1 the launcher's
    # connector config names this spec through spec_module_path, so a vLLM
    # without this overlay fails at boot instead of offloading to CPU only.
    if name == "StoreLocalOffloadingSpec":
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        return TieringOffloadingSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
