# Knob 1 means the disk tier is on: a config without the offloading connector,
# which loads every other hook of ours, fails the boot here.
if os.environ.get("GLM53_KV_OFFLOAD", "0") != "0":
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local import (  # noqa: E501
        vllm_config,
    )

    vllm_config.require_connector(self.kv_transfer_config)
