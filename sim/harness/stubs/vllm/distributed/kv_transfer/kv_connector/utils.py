"""Stands for vllm.distributed.kv_transfer.kv_connector.utils (torch-heavy).

Only yield_req_data, which the offloading scheduler uses to walk a step's
scheduled requests. Its documented contract: for each new request, (id, its
whole block table, True); for each cached request, (id, the block ids added
this step, whether it was resumed). Written from that contract; it is an input
adapter, not behaviour under test.
"""

from collections.abc import Iterator


def yield_req_data(
    scheduler_output,
) -> Iterator[tuple[str, tuple[list[int], ...] | None, bool]]:
    for new_req in scheduler_output.scheduled_new_reqs:
        yield new_req.req_id, new_req.block_ids, True
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, new_block_ids in zip(
        cached.req_ids, cached.new_block_ids, strict=False
    ):
        yield req_id, new_block_ids, req_id in cached.resumed_req_ids
