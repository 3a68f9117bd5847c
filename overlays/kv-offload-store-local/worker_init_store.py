# Worker-local disk writer: kv_store_local is imported only when
# GLM53_KV_OFFLOAD is set (it then validates every GLM53_KV_OFFLOAD* variable).
self._kv_store = None
if os.environ.get("GLM53_KV_OFFLOAD", "0") != "0":
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (  # noqa: E501
        vllm_worker,
    )

    self._kv_store = vllm_worker.VllmWorkerStore.from_vllm(
        spec, vllm_config, kv_cache_config
    )
