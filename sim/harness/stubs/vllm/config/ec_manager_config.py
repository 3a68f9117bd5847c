"""Stands for vllm.config.ec_manager_config: a type name for scheduler output."""


class EncoderCacheManagerMetadata:
    pass
