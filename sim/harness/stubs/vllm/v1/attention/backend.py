"""Stands for vllm.v1.attention.backend: two names the pinned files import.

MultipleOf mirrors vLLM's marker for "a multiple of `base`" (a frozen value).
AttentionMetadata is a type name only.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class MultipleOf:
    base: int

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"


class AttentionMetadata:
    pass
