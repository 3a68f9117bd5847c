"""Stands for vllm.v1.attention.backends.registry: the Mamba backend names.

An enum of names only; it resolves no backend classes.
"""

import enum


class MambaAttentionBackendEnum(enum.Enum):
    MAMBA1 = "MAMBA1"
    MAMBA2 = "MAMBA2"
    SHORT_CONV = "SHORT_CONV"
    LINEAR = "LINEAR"
    GDN_ATTN = "GDN_ATTN"
    CUSTOM = "CUSTOM"
