"""Stands for vllm.forward_context: the type name only (no model forward runs)."""


class ForwardContext:
    pass
