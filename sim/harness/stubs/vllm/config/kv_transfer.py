"""Stands for vllm.config.kv_transfer (vLLM 0.34.0): the KV-cache access flags
the connector base class reports. The real config class is not needed."""

import enum


class KVCacheAccess(enum.IntFlag):
    IN_PROCESS = 0
    REGISTERS = enum.auto()
    EXPORTS_FD = enum.auto()
    EXPORTS_FABRIC = enum.auto()
    LEGACY_IPC = enum.auto()

    def needs_single_chunk(self) -> bool:
        exports = KVCacheAccess.EXPORTS_FD | KVCacheAccess.EXPORTS_FABRIC
        return bool(self & (KVCacheAccess.REGISTERS | exports))
