"""Our Python is ruff-formatted and lint-clean (ruff.toml), as vLLM's own is.

Whole files are checked as they stand. An overlay fragment is checked the
way it will read inside vLLM: indented like its anchor plus the edit's
`indent`, and linted without the rules that need a whole module, because
the names a hook uses come from the function around it.
"""

from __future__ import annotations

import difflib
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# F821 undefined name, F401 unused import (an import hook exists for its side
# effect), F706 `return` and F702 `continue` outside a function or loop.
FRAGMENT_IGNORES = "F401,F702,F706,F821"


def ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
    )


def fragment_uses() -> dict[str, set[int]]:
    """Each Python fragment (repo-relative path) with the columns it is injected at."""
    uses: dict[str, set[int]] = {}
    for path in sorted((REPO / "anchors").glob("*/*.toml")):
        manifest = tomllib.loads(path.read_text())
        for f in manifest.get("files", []):
            for edit in f.get("edits", []):
                name = edit.get("fragment", "")
                if not name.endswith(".py"):
                    continue
                anchor = edit["anchor"]
                column = len(anchor) - len(anchor.lstrip(" ")) + edit.get("indent", 0)
                rel = f"overlays/{manifest['overlay']}/{name}"
                uses.setdefault(rel, set()).add(column)
    return uses


def in_place(fragment: str, column: int) -> tuple[str, int]:
    """The fragment at `column` under enough `if True:` lines to parse there,
    and the number of those lines."""
    assert column % 4 == 0, f"column {column} is not a multiple of four"
    depth = column // 4
    lines = ["    " * level + "if True:" for level in range(depth)]
    pad = "    " * depth
    body = fragment.splitlines()
    lines += [pad + line if line else "" for line in body]
    code = [line for line in body if line.strip() and not line.lstrip().startswith("#")]
    if depth and not code:
        lines.append(pad + "pass")  # a comment alone is no block
    elif code and code[-1].rstrip().endswith(":"):
        # A block's header (a replaced `if` line): vLLM's own body follows it.
        lines.append(pad + "    pass")
    return "\n".join(lines) + "\n", depth


def body_of(text: str, depth: int) -> list[str]:
    """The fragment's lines again: the wrapper and the blank lines at either
    end (which depend on what surrounds the fragment in vLLM) left out."""
    lines = text.splitlines()[depth:]
    if lines and lines[-1].strip() == "pass":
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def test_fragments_are_found():
    uses = fragment_uses()
    # Both engines' overlays have Python hooks; each file exists.
    assert any(rel.startswith("overlays/kv-offload-store-local/") for rel in uses)
    assert any(rel.startswith("overlays/example-cache/") for rel in uses)
    for rel in uses:
        assert (REPO / rel).is_file(), rel


def test_ruff_config_leaves_out_exactly_the_fragments():
    # `ruff format .` must not format a fragment as if it stood at column 0.
    config = tomllib.loads((REPO / "ruff.toml").read_text())
    left_out = {p for p in config["extend-exclude"] if p.startswith("overlays/")}
    assert left_out == set(fragment_uses())


def test_whole_files_are_formatted_and_lint_clean():
    fmt = ruff("format", "--check", ".")
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr
    lint = ruff("check", "--output-format", "concise", ".")
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_fragments_are_formatted_where_they_are_injected():
    wrong = []
    for rel, columns in sorted(fragment_uses().items()):
        text = (REPO / rel).read_text()
        for column in sorted(columns):
            placed, depth = in_place(text, column)
            r = ruff("format", "--stdin-filename", rel, "-", stdin=placed)
            assert r.returncode == 0, f"{rel}: {r.stderr}"
            want, got = body_of(placed, depth), body_of(r.stdout, depth)
            if got != want:
                diff = difflib.unified_diff(
                    want,
                    got,
                    rel,
                    "formatted",
                    lineterm="",
                )
                wrong.append(f"{rel} at column {column}:\n" + "\n".join(diff))
    assert not wrong, "\n\n".join(wrong)


def is_header(rel: str) -> bool:
    """A fragment that ends in a block's header (vLLM's own body follows it)."""
    code = [
        line
        for line in (REPO / rel).read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    return bool(code) and code[-1].rstrip().endswith(":")


def test_fragments_are_lint_clean():
    uses = fragment_uses()
    whole = sorted(rel for rel in uses if not is_header(rel))
    lint = ruff(
        "check", "--output-format", "concise", "--ignore", FRAGMENT_IGNORES, *whole
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # A header alone does not parse: linted where it is injected, with a body.
    for rel in sorted(set(uses) - set(whole)):
        for column in sorted(uses[rel]):
            placed, _ = in_place((REPO / rel).read_text(), column)
            lint = ruff(
                "check",
                "--output-format",
                "concise",
                "--ignore",
                FRAGMENT_IGNORES,
                "--stdin-filename",
                rel,
                "-",
                stdin=placed,
            )
            assert lint.returncode == 0, lint.stdout + lint.stderr
