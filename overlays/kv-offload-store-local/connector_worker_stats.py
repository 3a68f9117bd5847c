worker = self.connector_worker
if os.environ.get("GLM53_KV_OFFLOAD", "0") != "0" and worker is not None:
    # A worker with the knob on: its counters' increase since the last step
    # (vLLM sums the ranks' payloads); None when its store is off.
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (  # noqa: E501
        exported,
    )

    return exported.worker_stats(worker)
