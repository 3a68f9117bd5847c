"""Counts prompt-cache hits for the example engine."""

HITS: dict[str, int] = {"hits": 0}


def record_hit() -> None:
    HITS["hits"] += 1
