"""Stands for kv_connector.v1.metrics (it imports prometheus_client).

KVConnectorStats is the base dataclass connector stats extend: a `data` dict,
to_dict() returning it, the rest left to subclasses (as in vLLM).
KVConnectorPromMetrics keeps the metric classes and labels it is given; it
registers nothing with Prometheus. PromMetric is a plain type alias.
"""

from dataclasses import dataclass, field
from typing import Any, TypeVar


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return self.data

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        raise NotImplementedError

    def reduce(self) -> dict[str, int | float]:
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


class Gauge:
    pass


class Counter:
    pass


class Histogram:
    pass


PromMetric = Gauge | Counter | Histogram
PromMetricT = TypeVar("PromMetricT")


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._gauge_cls = metric_types[Gauge]
        self._counter_cls = metric_types[Counter]
        self._histogram_cls = metric_types[Histogram]
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        raise NotImplementedError
