"""Schedules requests onto a worker, one step at a time."""

from dataclasses import dataclass, field

from example.worker import Worker
# >>> overlay example-cache/import-cache sha256=064866d7b60aaf7a
from example import cache_hooks
# >>> overlay example-cache-stats/stats-import sha256=01faa783100b5138
from example import cache_stats
# <<< overlay example-cache-stats/stats-import
# <<< overlay example-cache/import-cache


@dataclass
class Request:
    request_id: str
    prompt: str
    tokens: list[int] = field(default_factory=list)


class Scheduler:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.waiting: list[Request] = []

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def schedule(
        self,
        max_requests: int,
    ) -> list[Request]:
        """Pick the next batch of requests.

        The batch is taken in arrival order.
        """
        batch = self.waiting[:max_requests]
        self.waiting = self.waiting[max_requests:]
        for request in batch:
            # >>> overlay example-cache/lookup sha256=d96e72baa6437cd1
            cached = cache_hooks.lookup(request.prompt)
            if cached is not None:
                request.tokens = cached
                # >>> overlay example-cache-stats/count-hit sha256=cf40dd0049f1ddc5
                cache_stats.record_hit()
                # <<< overlay example-cache-stats/count-hit
                continue
            # <<< overlay example-cache/lookup
            request.tokens = self.worker.run(request.prompt)
        return batch
