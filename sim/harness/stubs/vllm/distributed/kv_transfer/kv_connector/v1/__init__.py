"""Stands for the kv_connector.v1 package __init__.

The real one also imports every bundled connector (each with heavy imports).
This one re-exports the base-class names from the REAL pinned base.py, so the
offloading connector subclasses the genuine KVConnectorBase_V1.
"""

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
    supports_hma,
)

__all__ = ["KVConnectorBase_V1", "KVConnectorRole", "SupportsHMA", "supports_hma"]
