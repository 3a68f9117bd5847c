"""Stands for vllm.v1.request (sampling params, multimodal inputs, ...).

RequestStatus keeps vLLM's member order, so "finished" means "after
PREEMPTED" exactly as in vLLM. Request is an attribute bag: a test sets the
fields the code under test reads (request_id, block_hashes, num_tokens,
num_prompt_tokens, num_computed_tokens, status, ...); a missing one raises
AttributeError, and so does a field the release's own Request does not have
(checked against the tree's vllm/v1/request.py: a stub never answers a name
vLLM renamed). It does not track tokens or compute block hashes.
"""

import enum
from types import SimpleNamespace

from harness.release import check_fields, imitate


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


class Request(SimpleNamespace):
    def __init__(self, **fields) -> None:
        tree = globals().get("__harness_tree__")
        if tree is not None:
            check_fields(tree, "vllm.v1.request.Request", fields)
        super().__init__(**fields)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)


# The release's own class surface (its methods and properties), for probes.
imitate(Request, globals().get("__harness_tree__"), "vllm.v1.request.Request")
