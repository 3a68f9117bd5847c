"""kvtier-cxxscope on vLLM's real C++/CUDA sources (pinned from the sdist) and
on small synthetic files: exact definition ranges without torch or CUDA
headers, inactive preprocessor branches, macro bodies, and refusals.

The ranges are checked against an independent oracle: vLLM's sources are
clang-formatted, so a function that starts at column 0 ends at the next line
that is exactly "}", and a namespace at its "}  // namespace ..." line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cxx_support import fetch, pin_dirs_with, run_scope, scope_tool

SOURCE_PIN_DIRS = pin_dirs_with("SDIST")


@pytest.fixture(
    scope="module", params=SOURCE_PIN_DIRS, ids=[d.name for d in SOURCE_PIN_DIRS]
)
def sources(request) -> Path:
    return fetch(request.param, "sources")


@pytest.fixture(scope="module")
def tool(build_dir) -> Path:
    return scope_tool(build_dir)


_CLOSE = re.compile(r"^\};?$")
_CLOSE_NAMESPACE = re.compile(r"^\}\s*//\s*namespace")


def _oracle_end(lines: list[str], begin: int, kind: str = "function") -> int:
    close = _CLOSE_NAMESPACE if kind == "namespace" else _CLOSE
    for i in range(begin - 1, len(lines)):
        if close.match(lines[i]):
            return i + 1
    raise AssertionError(f"no closing brace after line {begin}")


def _column0_definitions(result: dict, lines: list[str]) -> list[dict]:
    out = []
    for d in result["definitions"]:
        first = lines[d["begin"] - 1]
        if first and not first[0].isspace() and d["kind"] in ("function", "namespace"):
            out.append(d)
    return out


def test_cache_kernels_ranges_without_torch_or_cuda(tool, sources):
    path = sources / "csrc/cache_kernels.cu"
    lines = path.read_text().splitlines()
    [res] = run_scope(
        tool,
        [
            {
                "root": str(sources),
                "file": "csrc/cache_kernels.cu",
                "args": ["-std=c++17", "-Icsrc"],
            }
        ],
    )
    assert res["ok"], res.get("error")
    # Really without them: torch and the CUDA runtime were recovered as empty.
    assert any(h.startswith("torch/") for h in res["missing_headers"])
    assert "cuda_runtime.h" in res["missing_headers"] or any(
        "cuda" in h for h in res["missing_headers"]
    )
    assert res["diagnostics"], (
        "without torch the file cannot compile; errors are expected"
    )
    defs = _column0_definitions(res, lines)
    assert len(defs) >= 30
    for d in defs:
        assert d["valid"], d
        assert d["end"] == _oracle_end(lines, d["begin"], d["kind"]), d
    names = {d["name"] for d in defs}
    assert {"swap_blocks_batch", "reshape_and_cache", "vllm", "concat_mla_q"} <= names
    # Every textual column-0 function definition is found (none lost to recovery).
    textual = {
        m.group(1)
        for line in lines
        if (
            m := re.match(
                r"^(?:__global__ )?(?:void|int64_t|static void) (\w+)\(", line
            )
        )
    }
    assert textual <= names, textual - names
    # Reopened namespaces are reported once per block.
    assert sum(1 for d in defs if d["name"] == "vllm") >= 3


def test_inactive_branch_follows_the_flags(tool, sources):
    lines = (sources / "csrc/cache_kernels.cu").read_text().splitlines()
    guard = next(
        i + 1
        for i, line in enumerate(lines)
        if "CUDA_VERSION >= 12080" in line and line.startswith("#if")
    )
    call = next(i + 1 for i, line in enumerate(lines) if 'cuMemcpyBatchAsync"' in line)
    req = {
        "root": str(sources),
        "file": "csrc/cache_kernels.cu",
        "args": ["-std=c++17", "-Icsrc"],
    }
    live = dict(req, args=req["args"] + ["-DCUDA_VERSION=13000"])
    off, on = run_scope(tool, [req, live])
    assert any(a <= call <= b for a, b in off["inactive"]), off["inactive"]
    assert any(a == guard + 1 for a, _ in off["inactive"])
    assert not any(a <= call <= b for a, b in on["inactive"]), on["inactive"]


def test_fs_io_store_block_range(tool, sources):
    lines = (sources / "csrc/fs_io.cpp").read_text().splitlines()
    [res] = run_scope(
        tool, [{"root": str(sources), "file": "csrc/fs_io.cpp", "args": ["-std=c++17"]}]
    )
    [d] = [d for d in res["definitions"] if d["name"] == "_store_block"]
    begin = next(
        i + 1
        for i, line in enumerate(lines)
        if line.startswith("inline int _store_block(")
    )
    assert (d["begin"], d["end"], d["valid"]) == (
        begin,
        _oracle_end(lines, begin),
        True,
    )
    assert d["qualified"] == "(anonymous namespace)::_store_block"


SYNTHETIC = """\
#include <not_here/at_all.h>
#define MAKE_FN(name) \\
  int name() {        \\
    return 1;         \\
  }
MAKE_FN(made_by_macro)

namespace outer {
struct Point {
  int x;
  int norm() const {
    return x;
  }
};
template <typename T>
T twice(T v) {
  return v + v;
}
#if 0
int dead() { return 0; }
#endif
}  // namespace outer
"""


def test_synthetic_kinds_macros_and_refusals(tool, tmp_path):
    (tmp_path / "a.cpp").write_text(SYNTHETIC)
    [res] = run_scope(tool, [{"root": str(tmp_path), "file": "a.cpp", "args": []}])
    by = {d["name"]: d for d in res["definitions"]}
    assert (by["outer"]["kind"], by["outer"]["begin"], by["outer"]["end"]) == (
        "namespace",
        8,
        22,
    )
    assert (by["Point"]["kind"], by["Point"]["begin"], by["Point"]["end"]) == (
        "struct",
        9,
        14,
    )
    assert (by["norm"]["kind"], by["norm"]["begin"], by["norm"]["end"]) == (
        "method",
        11,
        13,
    )
    # A template's range starts at its `template` line.
    assert (by["twice"]["begin"], by["twice"]["end"]) == (15, 18)
    # A function written by a macro has no trustworthy range: invalid, with why.
    assert by["made_by_macro"]["valid"] is False
    assert "macro" in by["made_by_macro"]["why"]
    assert "dead" not in by
    assert res["inactive"] == [[20, 20]]
    assert res["macros"] == [[2, 5]]
    assert res["missing_headers"] == ["not_here/at_all.h"]


def test_mapped_text_replaces_the_file_on_disk(tool, tmp_path):
    (tmp_path / "b.cpp").write_text("int f() { return 0; }\n")
    mapped = '#include "new.h"\nint g() {\n  return h();\n}\n'
    [res] = run_scope(
        tool,
        [
            {
                "root": str(tmp_path),
                "file": "b.cpp",
                "args": [],
                "files": {"b.cpp": mapped, "new.h": "int h();\n"},
            }
        ],
    )
    assert [d["name"] for d in res["definitions"]] == ["g"]
    assert res["diagnostics"] == [] and res["missing_headers"] == []


def test_bad_request_is_refused(tool):
    import subprocess

    done = subprocess.run(
        [str(tool)], input="{not json", capture_output=True, text=True
    )
    assert done.returncode == 2 and "not JSON" in done.stderr
