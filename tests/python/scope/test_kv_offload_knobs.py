"""The knob contract (overlays/kv-offload-scope/kv_offload_knobs.py).

One module defines every GLM53_KV_OFFLOAD* rule; the writer, the scope
overlay and the launch gate use it, and the docs carry its table.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT as REPO
from store_local_support import kv_offload_knobs

MODULE = REPO / "overlays" / "kv-offload-scope" / "kv_offload_knobs.py"
GOOD = {
    "GLM53_KV_OFFLOAD": "1",
    "GLM53_KV_OFFLOAD_DIR": "/data/kv",
    "GLM53_KV_OFFLOAD_CPU_GB": "8",
}


def env(**values: str) -> dict[str, str]:
    base = dict(GOOD)
    base.update(
        {
            f"GLM53_KV_OFFLOAD_{k}" if k else "GLM53_KV_OFFLOAD": v
            for k, v in values.items()
        }
    )
    return base


def test_defaults_and_values():
    knobs = kv_offload_knobs.read_knobs(env())
    assert knobs == kv_offload_knobs.Knobs(
        enabled=True,
        root="/data/kv",
        cpu_gb=8,
        drafter=False,
        keep_boundaries=2,
        build_id="",
        capture_mib=512,
    )
    assert knobs.capture_bytes == 512 << 20
    knobs = kv_offload_knobs.read_knobs(
        env(
            CPU_GB="64",
            KEEP_BOUNDARIES="0",
            DRAFTER="1",
            BUILD_ID="abc.1-2",
            RESTORE="0",
            CAPTURE_MIB="16",
        )
    )
    assert (
        knobs.cpu_gb,
        knobs.keep_boundaries,
        knobs.drafter,
        knobs.build_id,
        knobs.capture_mib,
    ) == (64, 0, True, "abc.1-2", 16)
    assert not kv_offload_knobs.read_knobs({}).enabled
    assert not kv_offload_knobs.read_knobs({"GLM53_KV_OFFLOAD": "0"}).enabled


BAD = [
    ("GLM53_KV_OFFLOAD", "yes"),
    ("GLM53_KV_OFFLOAD", ""),
    ("GLM53_KV_OFFLOAD", " 1"),
    ("GLM53_KV_OFFLOAD_DIR", "relative/dir"),
    ("GLM53_KV_OFFLOAD_DIR", "/data/kv store"),
    ("GLM53_KV_OFFLOAD_DIR", "'/data/kv'"),
    ("GLM53_KV_OFFLOAD_DIR", '"/data/kv"'),
    ("GLM53_KV_OFFLOAD_DIR", "/data/kv\t"),
    ("GLM53_KV_OFFLOAD_DIR", "/data:/etc"),
    ("GLM53_KV_OFFLOAD_DIR", "/data/../etc"),
    ("GLM53_KV_OFFLOAD_DIR", "/"),
    ("GLM53_KV_OFFLOAD_DIR", ""),
    ("GLM53_KV_OFFLOAD_CPU_GB", "0"),
    ("GLM53_KV_OFFLOAD_CPU_GB", "65"),
    ("GLM53_KV_OFFLOAD_CPU_GB", "8.5"),
    ("GLM53_KV_OFFLOAD_CPU_GB", "+8"),
    ("GLM53_KV_OFFLOAD_RESTORE", "1"),
    ("GLM53_KV_OFFLOAD_RESTORE", "true"),
    ("GLM53_KV_OFFLOAD_DRAFTER", "2"),
    ("GLM53_KV_OFFLOAD_KEEP_BOUNDARIES", "1025"),
    ("GLM53_KV_OFFLOAD_KEEP_BOUNDARIES", "-1"),
    ("GLM53_KV_OFFLOAD_KEEP_BOUNDARIES", "02"),
    ("GLM53_KV_OFFLOAD_BUILD_ID", "has space"),
    ("GLM53_KV_OFFLOAD_BUILD_ID", "quote'd"),
    ("GLM53_KV_OFFLOAD_BUILD_ID", ""),
    ("GLM53_KV_OFFLOAD_BUILD_ID", "-lead"),
    ("GLM53_KV_OFFLOAD_BUILD_ID", "x" * 65),
    ("GLM53_KV_OFFLOAD_CAPTURE_MIB", "15"),
    ("GLM53_KV_OFFLOAD_CAPTURE_MIB", "65537"),
    ("GLM53_KV_OFFLOAD_CAPTURE_MIB", "512M"),
]


@pytest.mark.parametrize(("name", "value"), BAD)
def test_bad_knob_is_an_error_naming_it(name, value):
    values = env()
    values[name] = value
    with pytest.raises(kv_offload_knobs.KnobError) as err:
        kv_offload_knobs.read_knobs(values)
    assert f"{name}=" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["GLM53_KV_OFFLOAD_DIR", "GLM53_KV_OFFLOAD_CPU_GB"])
def test_dir_and_cpu_gb_are_required_when_on(name):
    values = env()
    del values[name]
    with pytest.raises(kv_offload_knobs.KnobError, match=f"{name} is required"):
        kv_offload_knobs.read_knobs(values)
    # Off, neither is needed.
    values["GLM53_KV_OFFLOAD"] = "0"
    assert not kv_offload_knobs.read_knobs(values).enabled


def test_set_knobs_are_checked_with_the_tier_off():
    with pytest.raises(kv_offload_knobs.KnobError, match="RESTORE=1 is refused"):
        kv_offload_knobs.read_knobs({"GLM53_KV_OFFLOAD_RESTORE": "1"})
    with pytest.raises(kv_offload_knobs.KnobError, match="KEEP_BOUNDARIES"):
        kv_offload_knobs.read_knobs({"GLM53_KV_OFFLOAD_KEEP_BOUNDARIES": "x"})


def test_unknown_knob_name_is_a_typo():
    with pytest.raises(kv_offload_knobs.KnobError, match="unknown knob .*_CPUGB"):
        kv_offload_knobs.read_knobs(env(CPUGB="8"))


def test_drafter_alone_follows_the_same_rule():
    assert kv_offload_knobs.drafter_enabled({"GLM53_KV_OFFLOAD_DRAFTER": "1"})
    assert not kv_offload_knobs.drafter_enabled({})
    with pytest.raises(kv_offload_knobs.KnobError, match="DRAFTER=01"):
        kv_offload_knobs.drafter_enabled({"GLM53_KV_OFFLOAD_DRAFTER": "01"})


def run_check(values: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GLM53")}
    return subprocess.run(
        [sys.executable, str(MODULE), "check"],
        env={**clean, **values},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_check_command_is_what_the_gate_runs():
    done = run_check(env())
    assert (done.returncode, done.stdout, done.stderr) == (0, "1\n", "")
    done = run_check({})
    assert (done.returncode, done.stdout) == (0, "0\n")
    done = run_check(env(CPU_GB="65"))
    assert done.returncode == kv_offload_knobs.EXIT_REFUSED
    assert done.stdout == ""
    assert "GLM53_KV_OFFLOAD_CPU_GB=65: must be an integer 1..64" in done.stderr


@pytest.mark.parametrize(
    "doc", ["docs/DOCKER.md", "docs/overlays/kv-offload-store-local.md"]
)
def test_docs_carry_the_contract_table(doc):
    """Each doc holds the table `kv_offload_knobs.py table` prints, verbatim."""
    assert kv_offload_knobs.table() in (REPO / doc).read_text(), (
        f"{doc}: regenerate the knob table with "
        "`python3 overlays/kv-offload-scope/kv_offload_knobs.py table`"
    )


def test_gate_knob_list_comes_from_the_contract():
    """docker/lib.sh keeps no rule of its own: it runs the contract module."""
    lib = (REPO / "docker" / "lib.sh").read_text()
    assert "kv_offload_knobs.py" in lib
    code = "\n".join(
        line for line in lib.splitlines() if not line.lstrip().startswith("#")
    )
    for name in kv_offload_knobs.NAMES[1:]:
        assert name not in code, f"docker/lib.sh has its own rule for {name}"


def test_drafter_knob_says_what_it_does():
    """GLM53_KV_OFFLOAD_DRAFTER=1 puts draft-model groups into vLLM's CPU tier;
    the writer stores only full-attention groups (job_plan drops "window"
    keys), so the documented promise must say where the drafter's KV goes."""
    (rule,) = [r for r in kv_offload_knobs.RULES if r.name == kv_offload_knobs.DRAFTER]
    assert "CPU offload tier" in rule.accepted
    assert "only full-attention" in rule.accepted and "sliding-window" in rule.accepted
    plan = MODULE.parents[1] / "kv-offload-store-local/kv_store_local/job_plan.py"
    assert 'layout.kind == "window"' in plan.read_text()


def _size_rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in (REPO / "tests/vectors/sizes.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            *words, max_bytes, disk = line.split()
            rows.append((" ".join(words), max_bytes, disk))
    return rows


@pytest.mark.parametrize(("text", "max_bytes", "disk"), _size_rows())
def test_disk_gb_takes_the_size_syntax_kvstore_takes(text, max_bytes, disk):
    """One size syntax (tests/vectors/sizes.txt, which kvstore's gc_plan_test
    reads too): the knob and `kvstore gc --max-bytes` accept the same units;
    a bare number is GB to the knob and refused by --max-bytes."""
    assert kv_offload_knobs.size_bytes(text, None) == (
        None if max_bytes == "-" else int(max_bytes)
    )
    values = env(DISK_GB=text)
    if disk == "-":
        with pytest.raises(kv_offload_knobs.KnobError) as err:
            kv_offload_knobs.read_knobs(values)
        assert f"GLM53_KV_OFFLOAD_DISK_GB={text}" in str(err.value) or "'" in str(
            err.value
        )
    else:
        assert kv_offload_knobs.read_knobs(values).disk_bytes == int(disk)


def test_disk_gb_says_what_is_wrong():
    for text, words in (
        ("500gb", "units are case-sensitive"),
        ("5e2G", "must be a SIZE"),
    ):
        with pytest.raises(kv_offload_knobs.KnobError, match=words):
            kv_offload_knobs.read_knobs(env(DISK_GB=text))
