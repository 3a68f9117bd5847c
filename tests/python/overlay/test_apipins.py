"""Interface pins (issue 43): the scanner (apipins/) finds the vLLM names the
overlays' code relies on, the committed pins are what it finds, and the
patch engine refuses a release where one moved."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PIN_DIRS, REPO_ROOT, fetch_tree

sys.path.insert(0, str(REPO_ROOT))
from apipins.index import Index  # noqa: E402
from apipins.walk import Walker, vllm_looking  # noqa: E402

PINNED = [d for d in PIN_DIRS if (REPO_ROOT / "anchors" / d.name / "api").is_dir()]


@pytest.mark.parametrize("pin_dir", PINNED, ids=[d.name for d in PINNED])
def test_the_committed_pins_are_what_a_scan_finds(pin_dir, build_dir):
    """Every name of the overlays' code is pinned, no stale pin stays, no
    access is left untyped, and INTERFACE lists the files the pins name."""
    done = subprocess.run(
        [sys.executable, "-m", "apipins", "--engine", pin_dir.name, "--check",
         "--overlay-bin", str(build_dir / "patcher" / "overlay")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unresolved" not in done.stderr


# vLLM 0.34.0 moved these names that 0.33.0's overlay code used before the
# port (the two worker.py anchors moved too): the report must name each, and
# nothing else. data/api-vllm-0.33.0-before-port/ holds the pins that code
# had (our own scan of it, commit bbb9553).
BREAKS_0_34 = {
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler.TransferJobStatus.keys",
    "vllm.v1.kv_offload.cpu.gpu_worker.CPUOffloadingWorker.submit_store",
    "vllm.v1.kv_offload.cpu.gpu_worker.SingleDirectionOffloadingHandler.dst_tensors",
    "vllm.v1.kv_offload.cpu.gpu_worker.SingleDirectionOffloadingHandler.src_tensors",
    "vllm.v1.request.Request.skip_reading_prefix_cache",
}
# What the ported code branches on: absent in 0.33.0, present in 0.34.0.
PROBES_0_34 = {
    "vllm.v1.kv_offload.cpu.gpu_worker.SingleDirectionOffloadingHandler.cpu_tensors",
    "vllm.v1.kv_offload.cpu.gpu_worker.Transfer.failed",
    "vllm.v1.request.Request.skip_reading_external_kv",
}


def plan_0_34(overlay_bin, manifests: Path) -> dict:
    import json

    tree = fetch_tree(REPO_ROOT / "fixtures/vllm-0.34.0")
    done = subprocess.run(
        [str(overlay_bin), "plan", "--json", "--root", str(tree), "--manifests",
         str(manifests), "--fragments", str(REPO_ROOT / "overlays"), "--overlays",
         "kv-offload-scope,kv-offload-store-local,kv-offload-restore"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    return json.loads(done.stdout)["error"]


def findings(err: dict, kind: str) -> dict:
    return {
        (e["symbol"] if kind == "api" else e["edit"]): e
        for f in err["files"]
        for e in f["edits"]
        if e["kind"] == kind
    }


def test_0_34_with_0_33_manifests_names_every_break(overlay_bin, tmp_path):
    """What a user who upgrades vLLM under the pre-port overlays sees: drift,
    nothing written, every anchor and engine name that moved, each with who
    uses it."""
    import shutil

    manifests = tmp_path / "vllm-0.33.0"
    shutil.copytree(REPO_ROOT / "anchors/vllm-0.33.0", manifests)
    shutil.rmtree(manifests / "api")
    shutil.copytree(
        Path(__file__).parent / "data/api-vllm-0.33.0-before-port", manifests / "api"
    )
    err = plan_0_34(overlay_bin, manifests)
    api = findings(err, "api")
    assert set(api) == BREAKS_0_34
    # restore-bind came with the port (in both releases' manifests): today's 0.33.0
    # manifests anchor it in the writer's attach region as 0.33.0's port writes it.
    assert set(findings(err, "anchor")) == {
        "queue-capture",
        "queue-capture-flushed",
        "restore-bind",
    }
    assert api["vllm.v1.kv_offload.cpu.gpu_worker.CPUOffloadingWorker.submit_store"][
        "problem"
    ] == (
        "parameters changed: we pass (job_id, src_spec, dst_spec) by position, "
        "it now takes (job_id, device_ptrs, dst_spec)"
    )
    for e in api.values():
        assert e["used_by"], e


def test_the_ported_code_names_what_it_branches_on(overlay_bin):
    """The ported code's 0.33.0 pins on 0.34.0: each release probe whose
    answer differs, and the names only the branch 0.33.0 takes reads (the
    0.34.0 pins are the ones that hold there)."""
    err = plan_0_34(overlay_bin, REPO_ROOT / "anchors/vllm-0.33.0")
    api = findings(err, "api")
    only_0_33 = {
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler.TransferJobStatus.keys",
        "vllm.v1.kv_offload.cpu.gpu_worker.SingleDirectionOffloadingHandler.dst_tensors",
        "vllm.v1.request.Request.skip_reading_prefix_cache",
        # the restore's boot check (binding_problem) probes it when the 0.34.0 name
        # is absent
        "vllm.v1.request.Request.get_skip_reading_prefix_cache",
    }
    assert set(api) == PROBES_0_34 | only_0_33
    for name in PROBES_0_34:
        assert api[name]["problem"] == "now defined (our code relies on its absence)"


# -- the scanner on small made-up trees --------------------------------------


class Sources:
    """Files by path; ours are the paths under ``ours/`` and marked lines."""

    def __init__(self, files: dict[str, str], ours: set[str]):
        self.files = files
        self.ours = ours

    def read(self, path: str) -> str | None:
        return self.files.get(path)

    def is_ours(self, path: str, line: int) -> bool:
        return path in self.ours

    def site(self, path: str, line: int) -> str | None:
        return f"ov/{path}:{line}" if path in self.ours else None


ENGINE = """
from abc import ABC, abstractmethod


class Handler:
    def __init__(self, cpu):
        self.cpu_tensors = cpu
        self.gpu_to_cpu: bool = True


class Worker(ABC):
    def __init__(self):
        self._store_handler: Handler = Handler([])

    @abstractmethod
    def submit(self, job_id: int, spec) -> bool: ...

    def get_finished(self) -> list["Result"]:
        return []


class Result:
    job_id: int
    success: bool
"""


def scan(ours: str) -> Walker:
    src = Sources({"eng/api.py": ENGINE, "eng/ours.py": ours}, {"eng/ours.py"})
    walker = Walker(Index(src), src.site)
    walker.scan("eng.ours")
    return walker


def pins_of(walker: Walker) -> dict[str, object]:
    return {
        ".".join(x for x in (u.module, u.name, u.member) if x): u
        for u in walker.uses.values()
    }


def test_a_typed_access_is_pinned_with_its_call_shape():
    w = scan(
        "from eng.api import Worker\n\n"
        "def go(worker: Worker) -> None:\n"
        "    h = worker._store_handler\n"
        "    if h.gpu_to_cpu:\n"
        "        worker.submit(1, h.cpu_tensors)\n"
        "    for r in worker.get_finished():\n"
        "        print(r.job_id)\n"
    )
    pins = pins_of(w)
    assert "eng.api.Worker" in pins  # the import
    assert pins["eng.api.Worker._store_handler"].type == "Handler"
    assert pins["eng.api.Handler.gpu_to_cpu"].annotation == "bool"
    assert "eng.api.Handler.cpu_tensors" in pins
    assert pins["eng.api.Worker.submit"].params == ["job_id", "spec"]
    assert pins["eng.api.Result.job_id"].sites == {"ov/eng/ours.py:8"}
    assert not w.unresolved


def test_an_untyped_access_to_a_vllm_looking_name_is_reported():
    w = scan("def go(worker):\n    return worker._store_handler.cpu_tensors\n")
    names = {u.name for u in vllm_looking(w.index, w.unresolved, ["eng.api"])}
    assert names == {"_store_handler", "cpu_tensors"}  # both untyped: both named


def test_a_probe_of_a_missing_name_pins_its_absence():
    w = scan(
        "from eng.api import Handler\n\n"
        "def go(h: Handler) -> bool:\n"
        "    return hasattr(h, 'src_tensors')\n"
    )
    use = pins_of(w)["eng.api.Handler.src_tensors"]
    assert use.present is False


def test_a_subclass_pins_the_abstract_methods_and_each_override():
    w = scan(
        "from eng.api import Worker\n\n"
        "class Mine(Worker):\n"
        "    def submit(self, job_id, spec):\n"
        "        return True\n"
    )
    pins = pins_of(w)
    abstract = [u for u in w.uses.values() if u.kind == "abstract"]
    assert [u.methods for u in abstract] == [["submit"]]
    assert pins["eng.api.Worker.submit"].signature == ["job_id", "spec"]


def test_injected_code_pins_the_engine_locals_it_reads():
    engine = "def step(self, job_id):\n    spec = 1\n    return spec\n"
    src = Sources({"eng/worker.py": engine}, set())

    class Marked(Sources):
        def is_ours(self, path, line):
            return line == 3

        def site(self, path, line):
            return "ov/frag.py:1" if line == 3 else None

    src = Marked({"eng/worker.py": engine}, set())
    w = Walker(Index(src), src.site)
    w.scan("eng.worker")
    locals_ = {u.name for u in w.uses.values() if u.kind == "local"}
    assert locals_ == {"spec"}
    assert ast.parse(engine)  # the made-up engine is valid Python


def test_the_scanner_refuses_an_unknown_release():
    done = subprocess.run(
        [sys.executable, "-m", "apipins", "--engine", "vllm-9.9.9"],
        cwd=REPO_ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2
    assert "fixtures/vllm-9.9.9/PINS: no such pinned release" in done.stderr


def test_pins_name_only_files_the_pinned_tree_holds():
    for pin_dir in PINNED:
        tree = fetch_tree(pin_dir)
        for pins in (REPO_ROOT / "anchors" / pin_dir.name / "api").glob("*.toml"):
            for line in pins.read_text().splitlines():
                if line.startswith("file = "):
                    assert (tree / line.split('"')[1]).is_file(), (pins, line)
    assert Path(REPO_ROOT / "apipins" / "__main__.py").is_file()
