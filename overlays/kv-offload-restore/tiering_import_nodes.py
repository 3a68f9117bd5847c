from vllm.distributed.kv_transfer.kv_connector.v1.offloading import kv_restore_nodes
