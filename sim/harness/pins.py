"""Reads a pin set (fixtures/<engine>-<version>/PINS) and names its modules."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@dataclass(frozen=True)
class Pin:
    sha256: str
    path: str  # inside the package tree, e.g. "vllm/v1/kv_cache_interface.py"

    @property
    def module(self) -> str | None:
        """The dotted module name, or None for a file that is not Python."""
        return module_name(self.path)


def module_name(path: str) -> str | None:
    if not path.endswith(".py"):
        return None
    parts = path[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def read_pins(pins_file: str | Path) -> list[Pin]:
    """Parses sha256sum-format lines; the format fetch.py writes and checks."""
    pins = []
    for line in Path(pins_file).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        digest, _, path = line.partition("  ")
        pins.append(Pin(digest, path.strip()))
    return pins


def split_pin_dir(pin_dir: str | Path) -> tuple[str, str]:
    """fixtures/vllm-0.33.0 -> ("vllm", "0.33.0")."""
    engine, _, version = Path(pin_dir).name.rpartition("-")
    return engine, version


def interface_only(tree: str | Path, package: str = "vllm") -> frozenset[str]:
    """The files of ``tree`` its release's INTERFACE lists (fetched for the
    interface pins, never run here), found by the tree's own version."""
    try:
        text = (Path(tree) / package / "_version.py").read_text(encoding="utf-8")
    except OSError:
        return frozenset()
    m = re.search(r"^__version__\s*=.*?['\"]([^'\"]+)['\"]", text, re.M)
    if m is None:
        return frozenset()
    listing = FIXTURES / f"{package}-{m.group(1)}" / "INTERFACE"
    if not listing.is_file():
        return frozenset()
    return frozenset(p.path for p in read_pins(listing))
