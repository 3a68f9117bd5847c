"""kvtier's wheel: `overlay` and `kvstore` (native, in bin/) and their data
(share/kvtier/: anchors, overlays, pins, docker scripts). The console scripts
are the shims in _cli.py; docs/DEPLOY.md, "With pip"."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # Read on demand: the console scripts import this package on every run.
    if name == "__version__":
        import importlib.metadata

        return importlib.metadata.version("kvtier")
    raise AttributeError(name)
