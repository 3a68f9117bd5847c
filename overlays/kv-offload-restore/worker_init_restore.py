# Restore from this rank's local store: imported only when
# GLM53_KV_OFFLOAD_RESTORE is set; it binds to the writer when the caches register.
self._kv_restore = None
if os.environ.get("GLM53_KV_OFFLOAD_RESTORE", "0") != "0":
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        kv_restore_worker,
    )

    self._kv_restore = kv_restore_worker.WorkerRestore.from_env()
