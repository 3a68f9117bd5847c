# === overlay example-cache-stats new-file sha256=7a75dc0bbff54212 (managed by overlay; do not edit)
"""Counts prompt-cache hits for the example engine."""

HITS: dict[str, int] = {"hits": 0}


def record_hit() -> None:
    HITS["hits"] += 1
