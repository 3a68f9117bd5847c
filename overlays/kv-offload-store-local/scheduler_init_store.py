# Worker-local disk tier: kv_store_local is imported only when GLM53_KV_OFFLOAD
# is set (it then validates every GLM53_KV_OFFLOAD* variable strictly).
self._kv_store_meta = None
if os.environ.get("GLM53_KV_OFFLOAD", "0") != "0":
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (  # noqa: E501
        vllm_scheduler,
    )

    self._kv_store_meta = vllm_scheduler.store_meta(
        self.config, self.manager, vllm_config
    )
