"""Stands for vllm.v1.kv_hints (msgspec structs): the envelope type name only."""


class KvHintsEnvelope:
    pass
