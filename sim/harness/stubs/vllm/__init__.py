"""Stands for vllm/__init__.py, which imports the whole engine (torch included).

Provides only the version, taken from the REAL pinned vllm.version, so code
that reports the engine version sees the tree's own. Nothing else is exported:
code importing other names from the top-level package fails loudly.
"""

from vllm.version import __version__, __version_tuple__

__all__ = ["__version__", "__version_tuple__"]
