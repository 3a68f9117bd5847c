"""tests/upstream/run.py's comparison and selection (pure functions, no venv): the CI
stage that runs vLLM's own offloading tests on the pristine and the patched tree."""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import REPO_ROOT

# run.py names its release at import; this interpreter need not have vLLM installed.
os.environ.setdefault("KVTIER_RELEASE", "vllm-0.34.0")
_spec = importlib.util.spec_from_file_location(
    "upstream_run", REPO_ROOT / "tests" / "upstream" / "run.py"
)
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)

A, B = "tests/t.py::test_a", "tests/t.py::test_b[x]"


def test_same_outcomes_are_no_difference():
    same = {A: ["passed", ""], B: ["failed", "E"]}
    assert run.compare(same, dict(same), {}) == ([], [])


def test_an_unexplained_difference_is_named():
    problems, stale = run.compare({A: ["passed", ""]}, {A: ["failed", "boom"]}, {})
    assert problems == [f"{A}: passed -> failed  boom"] and stale == []


def test_a_missing_test_is_a_difference():
    problems, _ = run.compare({A: ["passed", ""]}, {}, {})
    assert problems == [f"{A}: passed -> absent  "]


def test_an_explanation_must_name_the_same_outcomes():
    pristine, patched = {A: ["passed", ""]}, {A: ["error", "E"]}
    assert run.compare(pristine, patched, {A: ("passed", "error")}) == ([], [])
    problems, _ = run.compare(pristine, patched, {A: ("passed", "failed")})
    assert problems


def test_a_stale_explanation_fails_too():
    same = {A: ["passed", ""]}
    _, stale = run.compare(same, same, {A: ("passed", "failed")})
    assert stale == [f"{A}: listed but not a difference"]


def test_explained_file_format(tmp_path):
    path = tmp_path / "d.txt"
    path.write_text(f"# comment\n\n{B} | passed -> failed | the reason\n")
    assert run.read_explained(path) == {B: ("passed", "failed")}
    path.write_text(f"{B} | passed failed | the reason\n")
    with pytest.raises(run.SetupError, match=r"d\.txt:1: expected"):
        run.read_explained(path)


def test_the_committed_knob1_files_parse():
    files = sorted((REPO_ROOT / "tests" / "upstream").glob("knob1-differences-*.txt"))
    assert {f.name for f in files} == {
        f"knob1-differences-{p.name}.txt"
        for p in (REPO_ROOT / "fixtures").glob("vllm-*")
        if (p / "PINS").is_file()
    }
    for path in files:
        explained = run.read_explained(path)
        assert all(o[0] != o[1] for o in explained.values()), path


def test_a_missing_explained_file_is_a_setup_error(tmp_path):
    with pytest.raises(run.SetupError, match="no such file"):
        run.read_explained(tmp_path / "knob1-differences-vllm-9.9.9.txt")


def test_selection_is_the_files_naming_the_connector(tmp_path):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_uses.py").write_text(
        "from vllm.distributed.kv_transfer.kv_connector.v1.offloading import x\n"
    )
    (tmp_path / "tests" / "a" / "test_named.py").write_text(
        'c = "OffloadingConnector"\n'
    )
    (tmp_path / "tests" / "a" / "test_other.py").write_text(
        "import vllm.v1.kv_offload\n"
    )
    (tmp_path / "tests" / "a" / "helper.py").write_text("OffloadingConnector\n")
    assert run.select_files(tmp_path, False) == [
        "tests/a/test_named.py",
        "tests/a/test_uses.py",
    ]
    assert len(run.select_files(tmp_path, True)) == 3


def test_unexplained_names_only_what_no_entry_covers():
    pristine = {A: ["passed", ""], B: ["passed", ""]}
    patched = {A: ["failed", "E"], B: ["failed", "E"]}
    assert run.unexplained(pristine, patched, {A: ("passed", "failed")}) == [B]


def test_a_difference_a_second_run_does_not_reproduce_is_flaky():
    results = {
        "pristine": {A: ["passed", ""], B: ["passed", ""]},
        "patched-1": {A: ["failed", "timeout"], B: ["failed", "E"]},
    }
    again = {  # A agrees on both trees the second time, B still differs
        "pristine": {A: ["passed", ""], B: ["passed", ""]},
        "patched-1": {A: ["passed", ""], B: ["failed", "E"]},
    }
    assert run.settle_flaky(results, "patched-1", again, [A, B]) == [A]
    problems, _ = run.compare(results["pristine"], results["patched-1"], {})
    assert problems == [f"{B}: passed -> failed  E"]


def test_a_tree_that_changes_its_own_outcome_is_flaky_not_a_difference():
    """Seen in CI: the pristine tree failed a zmq timing test, the patched one passed;
    on the second run the pristine tree passed and the patched one failed. Neither
    tree decides the test, so it is flaky; a difference both runs repeat is not."""
    results = {
        "pristine": {A: ["failed", "timeout"], B: ["passed", ""]},
        "patched-0": {A: ["passed", ""], B: ["failed", "E"]},
    }
    again = {
        "pristine": {A: ["passed", ""], B: ["passed", ""]},
        "patched-0": {A: ["failed", "timeout"], B: ["failed", "E"]},
    }
    assert run.settle_flaky(results, "patched-0", again, [A, B]) == [A]
    problems, _ = run.compare(results["pristine"], results["patched-0"], {})
    assert problems == [f"{B}: passed -> failed  E"]


def test_the_pristine_outcomes_of_every_second_run_count():
    """The pristine tree failed the test in the first run and passed it in another
    knob's second run: the same difference on this knob, repeated once, is flaky."""
    results = {
        "pristine": {A: ["failed", "timeout"]},
        "patched-0": {A: ["passed", ""]},
    }
    again = {"pristine": {A: ["failed", "timeout"]}, "patched-0": {A: ["passed", ""]}}
    assert run.settle_flaky(results, "patched-0", again, [A]) == []
    seen = {A: {"passed"}}  # what knob unset's second run gave
    results["patched-0"][A] = ["passed", ""]
    assert run.settle_flaky(results, "patched-0", again, [A], seen) == [A]
