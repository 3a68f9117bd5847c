if os.environ.get("GLM53_KV_OFFLOAD", "0") != "0":
    # The local store's counters: the observer accepts only declared names.
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (  # noqa: E501
        exported,
    )

    self._offloading_metric_metadata.update(exported.definitions())
