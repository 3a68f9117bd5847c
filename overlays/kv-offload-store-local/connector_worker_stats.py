if getattr(self.connector_worker, "_kv_store", None) is not None:
    # A worker with the local store on: its counters' increase since the
    # last step (vLLM sums the ranks' payloads).
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (  # noqa: E501
        exported,
    )

    return exported.worker_stats(self.connector_worker)
