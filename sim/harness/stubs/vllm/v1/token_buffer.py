"""Stands for vllm.v1.token_buffer (vLLM 0.34.0): a slice of a token list."""


def token_slice(tokens, start: int, stop: int):
    return tokens[start:stop]
