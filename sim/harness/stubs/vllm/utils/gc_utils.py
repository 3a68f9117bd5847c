"""Stands for vllm.utils.gc_utils (vLLM 0.34.0): untracking lists from the
cyclic GC is an optimization; here it does nothing."""


def untrack_long_lists(lists, min_len: int = 256) -> None:
    return None
