"""Prompt cache for the example engine: skip work for prompts seen before."""

_CACHE: dict[str, list[int]] = {}


def lookup(prompt: str) -> list[int] | None:
    return _CACHE.get(prompt)


def remember(prompt: str, tokens: list[int]) -> None:
    _CACHE[prompt] = list(tokens)
