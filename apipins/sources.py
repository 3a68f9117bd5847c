"""The files a scan reads: one pinned release with the overlays applied.

The pinned tree (fixtures/fetch.py) is copied and patched by the real
``overlay apply``; every other vLLM file is read from the release wheel,
whose sha256 fetch.py has checked. What is ours is known from the patched
copy itself: a file that starts with a new-file header, and the lines from a
begin sentinel to its end sentinel in an edited file. A site names our code
the way a porter reads it: the overlay's own source file and line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

_BEGIN = re.compile(r"^\s*# >>> overlay (\S+)/(\S+) sha256=")
_END = re.compile(r"^\s*# <<< overlay (\S+)/(\S+)")
_NEW = re.compile(r"^# === overlay (\S+) new-file ")


class ScanError(Exception):
    pass


@dataclass
class Region:
    overlay: str
    edit: str
    begin: int  # 1-based line of the begin sentinel
    end: int  # 1-based line of the end sentinel


@dataclass
class Ours:
    """What the overlays put into a tree: new files and regions."""

    new_files: dict[str, str] = field(default_factory=dict)  # path -> overlay
    sources: dict[str, str] = field(
        default_factory=dict
    )  # path -> source in the overlay folder
    regions: dict[str, list[Region]] = field(default_factory=dict)
    fragments: dict[tuple[str, str], str] = field(
        default_factory=dict
    )  # (overlay, edit) -> fragment


class ReleaseSources:
    """Reads a patched copy of the pinned tree first, then the wheel."""

    def __init__(self, tree: Path, wheel: Path, ours: Ours):
        self.tree = tree
        self.ours = ours
        self._zip = zipfile.ZipFile(wheel)
        self._members = set(self._zip.namelist())
        self._cache: dict[str, str | None] = {}

    def read(self, path: str) -> str | None:
        if path in self._cache:
            return self._cache[path]
        text = None
        p = self.tree / path
        if p.is_file():
            text = p.read_text(encoding="utf-8")
        elif path in self._members:
            text = self._zip.read(path).decode("utf-8")
        self._cache[path] = text
        return text

    def is_ours(self, path: str, line: int) -> bool:
        if path in self.ours.new_files:
            return True
        return any(r.begin <= line <= r.end for r in self.ours.regions.get(path, ()))

    def site(self, path: str, line: int) -> str | None:
        """``overlay/source:line`` for our code, None for vLLM's."""
        if path in self.ours.new_files:
            overlay = self.ours.new_files[path]
            return f"{overlay}/{self.ours.sources[path]}:{line - 1}"  # line 1 is the header
        for r in self.ours.regions.get(path, ()):
            if r.begin <= line <= r.end:
                frag = self.ours.fragments.get((r.overlay, r.edit), r.edit)
                return f"{r.overlay}/{frag}:{max(line - r.begin, 1)}"
        return None

    def close(self) -> None:
        self._zip.close()


def patched_copy(
    pinned: Path, dest: Path, overlay_bin: Path, manifests: Path, overlays: list[str]
) -> None:
    """dest := the pinned tree with ``overlays`` applied by the real engine."""
    shutil.copytree(pinned, dest, symlinks=False)
    done = subprocess.run(
        [str(overlay_bin), "apply", "-q", "--root", str(dest), "--manifests", str(manifests),
         "--overlays", ",".join(overlays)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise ScanError(
            f"overlay apply on a copy of {pinned} failed (exit {done.returncode}): {done.stderr.strip()}"
        )


def find_ours(tree: Path, manifests: dict[str, dict]) -> Ours:
    """New files and regions in a patched tree, with the overlay source each
    came from (from the manifests: overlay name -> parsed TOML)."""
    ours = Ours()
    for overlay, m in manifests.items():
        for nf in m.get("new_files", []):
            ours.sources[nf["path"]] = nf["source"]
        for f in m.get("files", []):
            for e in f.get("edits", []):
                if "fragment" in e:
                    ours.fragments[(overlay, e["id"])] = e["fragment"]
    for path in sorted(p for p in tree.rglob("*.py") if p.is_file()):
        rel = path.relative_to(tree).as_posix()
        lines = path.read_text(encoding="utf-8").splitlines()
        if lines and (m := _NEW.match(lines[0])):
            ours.new_files[rel] = m.group(1)
            continue
        open_: list[tuple[str, str, int]] = []
        for i, line in enumerate(lines, 1):
            if m := _BEGIN.match(line):
                open_.append((m.group(1), m.group(2), i))
            elif (m := _END.match(line)) and open_:
                overlay, edit, begin = open_.pop()
                ours.regions.setdefault(rel, []).append(Region(overlay, edit, begin, i))
    missing = set(ours.new_files) - set(ours.sources)
    if missing:
        raise ScanError(f"new files no manifest names: {sorted(missing)}")
    return ours


def temp_tree() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="apipins-")
