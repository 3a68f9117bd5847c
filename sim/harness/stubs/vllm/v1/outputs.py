"""Stands for vllm.v1.outputs (numpy/torch model outputs): KVConnectorOutput.

The connector's per-step report to the scheduler, with vLLM's field names and
defaults and is_empty(). Nothing else from outputs is provided.
"""

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorOutput:
    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: set[int] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self) -> bool:
        return not (
            self.finished_sending
            or self.finished_recving
            or self.kv_connector_stats
            or self.kv_cache_events
            or self.invalid_block_ids
            or self.failed_recving
            or self.kv_connector_worker_meta
        )
