"""docs/UPGRADING.md's support matrix is what this tree ships, and the
changelog has the version it ships: a new release's anchors, or a new
VERSION, fail here until the docs say so."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERSION = (REPO / "VERSION").read_text().strip()


def _releases() -> list[str]:
    found = [
        d.name.removeprefix("vllm-")
        for d in (REPO / "anchors").iterdir()
        if d.name.startswith("vllm-") and (d / "ORDER").is_file()
    ]
    return sorted(found, key=lambda v: [int(x) for x in re.findall(r"\d+", v)])


def test_support_matrix_row_is_this_tree():
    text = (REPO / "docs/UPGRADING.md").read_text()
    table = text.split("## Support matrix", 1)[1].split("\n## ", 1)[0]
    rows = {
        cells[0]: cells[1]
        for line in table.splitlines()
        if line.startswith("| ") and not line.startswith(("| kvtier", "| ---"))
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    assert VERSION in rows, (
        f"docs/UPGRADING.md: no support-matrix row for kvtier {VERSION}"
    )
    assert rows[VERSION] == ", ".join(_releases()), rows[VERSION]


def test_changelog_names_this_version():
    text = (REPO / "CHANGELOG.md").read_text()
    assert re.search(rf"^## {re.escape(VERSION)}\b", text, re.M), VERSION
    assert "docs/UPGRADING.md" in text
