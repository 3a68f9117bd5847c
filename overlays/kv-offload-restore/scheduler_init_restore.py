# Restore from the worker-local store: kv_restore_scheduler is imported only
# when GLM53_KV_OFFLOAD_RESTORE is set (it refuses an unsafe deployment at boot).
self._kv_restore = None
if os.environ.get("GLM53_KV_OFFLOAD_RESTORE", "0") != "0":
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        kv_restore_scheduler,
    )

    self._kv_restore = kv_restore_scheduler.SchedulerRestore.from_vllm(
        self, vllm_config
    )
