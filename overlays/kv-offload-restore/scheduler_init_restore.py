# Restore from the worker-local store: kv_restore_tier is imported only when
# GLM53_KV_OFFLOAD_RESTORE is set (it refuses an unsafe deployment at boot).
self._kv_restore = None
if os.environ.get("GLM53_KV_OFFLOAD_RESTORE", "0") != "0":
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        kv_restore_tier,
    )

    self._kv_restore = kv_restore_tier.SchedulerRestore.from_vllm(
        self, vllm_config
    )
