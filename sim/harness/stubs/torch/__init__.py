"""Stands for PyTorch, as far as the pinned files touch it outside a GPU.

Provides: dtype objects with their element size (so KV-cache specs compute real
page sizes), and the type names the pinned files use in annotations and
isinstance checks (Tensor, device, Event, Size, cuda.Stream).

Deliberately does not: allocate or copy tensors, run kernels or streams. Every
tensor constructor raises, so code that really needs a GPU/tensor fails loudly
instead of passing on fake data.
"""

from __future__ import annotations


class dtype:
    def __init__(self, name: str, itemsize: int, is_floating_point: bool) -> None:
        self.name = name
        self.itemsize = itemsize
        self.is_floating_point = is_floating_point

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    def __reduce__(self):
        return (getattr, (_module(), self.name))


def _module():
    import sys

    return sys.modules[__name__]


float16 = half = dtype("float16", 2, True)
bfloat16 = dtype("bfloat16", 2, True)
float32 = float = dtype("float32", 4, True)
float64 = double = dtype("float64", 8, True)
float8_e4m3fn = dtype("float8_e4m3fn", 1, True)
float8_e5m2 = dtype("float8_e5m2", 1, True)
uint8 = dtype("uint8", 1, False)
int8 = dtype("int8", 1, False)
int16 = dtype("int16", 2, False)
int32 = dtype("int32", 4, False)
int64 = long = dtype("int64", 8, False)
uint64 = dtype("uint64", 8, False)
bool = dtype("bool", 1, False)

Size = tuple


class device:
    def __init__(self, type: str, index: int | None = None) -> None:
        self.type, _, idx = str(type).partition(":")
        self.index = int(idx) if idx else index

    def __repr__(self) -> str:
        return f"device(type={self.type!r}, index={self.index})"


def _no_tensors(*args, **kwargs):
    raise NotImplementedError("torch stub: tensors are not available in the harness")


class Tensor:
    """Type name only: constructing one raises."""

    def __init__(self, *args, **kwargs) -> None:
        _no_tensors()


class Event:
    """Type name only: constructing one raises."""

    def __init__(self, *args, **kwargs) -> None:
        _no_tensors()


empty = zeros = tensor = frombuffer = as_strided = _no_tensors


class _Cuda:
    class Stream:
        """Type name only: constructing one raises."""

        def __init__(self, *args, **kwargs) -> None:
            _no_tensors()

    @staticmethod
    def is_available() -> bool:
        return False


cuda = _Cuda()
