"""Stands for vllm.triton_utils with Triton absent (HAS_TRITON is False)."""

HAS_TRITON = False


class _Missing:
    def __getattr__(self, name: str):
        raise AttributeError(f"vllm.triton_utils stub: triton.{name} is not available")

    def jit(self, fn=None, **kwargs):
        # Decorating is allowed so kernel modules import; launching is not.
        return fn if fn is not None else (lambda f: f)


triton = _Missing()
tl = _Missing()
