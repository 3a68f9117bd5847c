"""The GPU suite's transfers (engine/transfer.py, engine/prepare.sh, engine/device-lib.sh): every
device call of every chain, the checkout included, stays under the 64 MiB one call takes with
6 MiB to spare for the checkout to grow (from the prepared .device-<version>/ folder where
there is one, from the declared caps otherwise); an oversized set or call is named; the device
scripts stash, find and check the sets as the chains carry them. No device needed."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO_ROOT as REPO

sys.path.insert(0, str(REPO / "engine"))

import transfer  # noqa: E402

RELEASES = sorted(
    p.parent.name for p in (REPO / "fixtures").glob("vllm-*/WHEEL")
)  # fmt: skip
MIB = 1 << 20


def sizes_for(release: str) -> tuple[dict[str, int], str]:
    """The prepared sets' sizes when .device-<version>/ holds every set, else the caps."""
    prepared = transfer.prepared_sizes(str(REPO / transfer.device_dir(release)))
    if set(prepared) == set(transfer.SETS):
        return prepared, "prepared"
    return dict(transfer.SETS), "declared caps"


def test_the_margin_is_at_least_6_mib_below_64():
    assert transfer.LIMIT == 64 * MIB
    assert transfer.GROWTH >= 6 * MIB
    assert transfer.BUDGET == transfer.LIMIT - transfer.RESERVE - transfer.GROWTH


@pytest.mark.parametrize("release", RELEASES)
def test_every_call_fits_with_the_margin(release):
    checkout = transfer.checkout_bytes()
    assert checkout > 1 * MIB  # the measure saw the checkout (a few MB)
    sizes, source = sizes_for(release)
    assert transfer.problems(sizes, checkout) == [], source
    for chain in transfer.CHAINS.values():
        for call, total in transfer.call_sizes(sizes, checkout, chain):
            assert total + transfer.GROWTH + transfer.RESERVE <= 64 * MIB, (
                call,
                source,
            )


def test_the_caps_fit_every_call_with_todays_checkout():
    """What CI can check without a prepared folder: a checkout that grew past the margin
    fails here before anyone spends device time."""
    checkout = transfer.checkout_bytes()
    assert transfer.problems(dict(transfer.SETS), checkout) == []
    run = subprocess.run(
        [sys.executable, str(REPO / "engine/transfer.py"), "plan"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "every call fits with the caps" in run.stdout


def test_the_chains_carry_each_set_once_and_end_with_b():
    for name, chain in transfer.CHAINS.items():
        flat = [s for call in chain for s in call]
        assert len(flat) == len(set(flat)), name
        assert {"A", "A2", "W", "B"} <= set(flat), name
        assert "B" in chain[-1], name
        assert set(flat) <= set(transfer.SETS), name
    models = {s for call in transfer.CHAINS["models"] for s in call}
    assert {"C", "C2", "F", "K"} <= models
    # the kernel sets ride in calls of their own: with C (0.33.0's is 38 MB) or with each
    # other the caps are over BUDGET
    for s in ("C", "F", "K"):
        assert (s,) in transfer.CHAINS["models"], s
    for s in ("F", "K"):
        assert transfer.SETS["C"] + transfer.SETS[s] > transfer.BUDGET - 6 * MIB, s
    assert transfer.SETS["F"] + transfer.SETS["K"] > transfer.BUDGET - 6 * MIB


def test_a_set_over_its_cap_is_named():
    sizes = dict(transfer.SETS, A2=transfer.SETS["A2"] + 1)
    bad = transfer.problems(sizes, 0)
    assert len(bad) == 1 and "set A2 is" in bad[0] and "split set A2" in bad[0]


def test_a_call_over_the_budget_names_its_biggest_set():
    sizes = dict.fromkeys(("A", "A2", "W", "C", "F", "K"), 100)
    sizes.update(B=19 * MIB, C2=22 * MIB)
    checkout = transfer.BUDGET - 41 * MIB + 1  # B + C2 one byte over with this checkout
    bad = transfer.problems(sizes, checkout)
    assert len(bad) == 1, bad
    assert "the call carrying B+C2" in bad[0] and "split set C2" in bad[0]
    assert transfer.problems(sizes, checkout - 1) == []


def test_a_call_is_counted_in_whole_disk_blocks(tmp_path):
    """A 1-byte file takes a block: the checkout's many small files weigh 11.4 MB on disk
    against 8.2 MB of bytes, and a call is counted as the disk holds it."""
    (tmp_path / "W").mkdir()
    for i in range(10):
        (tmp_path / "W" / f"f{i}").write_bytes(b"x")
    block = os.lstat(tmp_path / "W" / "f0").st_blocks * 512
    assert block >= 512 and transfer.set_bytes(str(tmp_path / "W")) == 10 * block
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.split("\0")  # fmt: skip
    in_bytes = sum(os.lstat(REPO / n).st_size for n in tracked if (REPO / n).is_file())
    assert transfer.checkout_bytes() > in_bytes


def sparse_sets(folder: Path, sizes: dict[str, int]) -> None:
    for name, n in sizes.items():
        (folder / name).mkdir(parents=True)
        with open(folder / name / "part", "wb") as f:
            f.truncate(n)


def test_check_exits_1_naming_the_set_to_split(tmp_path):
    sparse_sets(tmp_path, {"A": 10, "A2": transfer.SETS["A2"] + 5, "W": 10, "B": 10})
    cmd = [sys.executable, str(REPO / "engine/transfer.py"), "check", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert run.returncode == 1
    assert "split set A2" in run.stderr and str(tmp_path) in run.stderr
    with open(tmp_path / "A2" / "part", "wb") as f:
        f.truncate(1000)
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert re.search(r"suite call 2 A2 +with the checkout", run.stdout)
    assert re.search(r"suite call 3 W +with the checkout", run.stdout)


def test_check_refuses_a_folder_without_the_suite_sets(tmp_path):
    sparse_sets(tmp_path, {"A": 10, "B": 10})
    cmd = [sys.executable, str(REPO / "engine/transfer.py"), "check", str(tmp_path)]
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert run.returncode == 1 and "no set A2, W" in run.stderr


def test_prepare_cuts_and_checks_as_transfer_declares():
    prepare = (REPO / "engine/prepare.sh").read_text()
    assert "cut=$(python3 engine/transfer.py cut)" in prepare
    assert 'head -c "$cut"' in prepare and "tail -c +$((cut + 1))" in prepare
    assert 'python3 engine/transfer.py check "$OUT"' in prepare
    assert "OUT=$ROOT/.device-${ENGINE#vllm-}" in prepare
    # every set prepare.sh stamps is a declared one, and the manifest covers all but B
    stamped = re.search(r"for s in ([A-Z0-9 ]+); do echo \"\$ENGINE\"", prepare)
    assert stamped and set(stamped.group(1).split()) == set(transfer.SETS)
    assert "find A A2 W C C2 F K -type f" in prepare


def newest_by_shell() -> str:
    line = (REPO / "engine/device-lib.sh").read_text()
    body = re.search(r"newest_release\(\) \{\n(.*?)\n\}", line, re.S).group(1)
    run = subprocess.run(["bash", "-c", body], cwd=REPO, capture_output=True, text=True)
    return run.stdout.strip()


def test_the_default_release_is_the_newest_pinned_everywhere():
    newest = transfer.newest_release()
    assert newest in RELEASES and newest_by_shell() == newest
    import suite

    assert suite.ENGINE == newest


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_folder_is_git_ignored(release):
    path = f"{transfer.device_dir(release)}/B/vtree.tar.xz"
    run = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO, check=False)
    assert run.returncode == 0, f"{path} is not ignored"


def test_the_docs_give_each_call_transfer_declares():
    docs = (REPO / "docs/ENGINE.md").read_text()
    folder = transfer.device_dir(transfer.newest_release())
    for chain in transfer.calls(folder).values():
        for step in chain:
            carry = "[" + ", ".join(f'"{c}"' for c in step["carry"]) + "]"
            assert carry in docs, carry
            assert step["command"] in docs, step["command"]


# -- the device side: device-a.sh stashes, device-lib.sh finds and checks -----------------


@pytest.fixture
def rig(tmp_path):
    """A copy of the project root as the device sees it: fixtures of two releases, the
    engine scripts, and a prepared (tiny) .device-<newest>/ carried whole."""
    root = tmp_path / "repo"
    for rel in ("vllm-0.33.0", "vllm-0.34.0"):
        (root / "fixtures" / rel).mkdir(parents=True)
        (root / "fixtures" / rel / "WHEEL").write_text("0 x.whl\n")
    (root / "engine").mkdir()
    for name in ("device-lib.sh", "device-a.sh", "suite.py"):
        (root / "engine" / name).symlink_to(REPO / "engine" / name)
    dev = root / ".device-0.34.0"
    files = {"A/so_C.xz.1": b"a" * 10, "A2/so_C.xz.2": b"b" * 5, "W/x.whl": b"w"}
    for rel, data in files.items():
        (dev / rel).parent.mkdir(parents=True, exist_ok=True)
        (dev / rel).write_bytes(data)
    (dev / "B").mkdir()
    for s in ("A", "A2", "W", "B"):
        (dev / s / "engine").write_text("vllm-0.34.0\n")
    lines = []
    for rel in sorted([*files, "A/engine", "A2/engine", "W/engine"]):
        lines.append(f"{hashlib.sha256((dev / rel).read_bytes()).hexdigest()}  {rel}")
    (dev / "B" / "sets.sha256").write_text("\n".join(lines) + "\n")
    env = {"PATH": os.environ["PATH"], "KVTIER_PV_ROOT": str(tmp_path / "tmp")}
    return root, dev, env, tmp_path / "tmp" / "pv-0.34.0"


def bash(root, env, script, *args):
    return subprocess.run(["bash", "-c", script, "-", *args], cwd=root, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip


LIB = ". engine/device-lib.sh; B=$PWD/$DEV/B; PV=$(pv_dir vllm-0.34.0); "


def test_device_a_stashes_the_carried_sets_of_the_newest_release(rig):
    root, dev, env, pv = rig
    run = bash(root, env, "bash engine/device-a.sh A2 W")
    assert run.returncode == 0, run.stderr
    assert "engine vllm-0.34.0: stashed A2 W" in run.stdout
    assert (pv / "A2" / "so_C.xz.2").read_bytes() == b"b" * 5
    assert (pv / "W" / "x.whl").exists() and (pv / "engine").exists()
    # the last call carries only B: A2 and W are found in the stash, A is not anywhere
    shutil.rmtree(dev / "A2")
    shutil.rmtree(dev / "W")
    run = bash(root, env, LIB + "set_dir A2 && set_dir W && set_dir A")
    assert run.stdout.split() == [str(pv / "A2"), str(pv / "W"), ".device-0.34.0/A"]
    shutil.rmtree(dev / "A")
    run = bash(root, env, LIB + "set_dir A")
    assert run.returncode == 1 and run.stdout == ""
    assert "set A: neither .device-0.34.0/A" in run.stderr
    assert "device-a.sh A" in run.stderr


def test_a_stale_or_altered_set_is_refused(rig):
    root, dev, env, pv = rig
    assert bash(root, env, "bash engine/device-a.sh A").returncode == 0
    (pv / "A" / "so_C.xz.1").write_bytes(
        b"a" * 9 + b"X"
    )  # another prepare's, or damaged
    (dev / "A" / "so_C.xz.1").write_bytes(b"a" * 9 + b"Y")
    run = bash(root, env, LIB + "set_dir A")
    assert (
        run.returncode == 1 and "holds what .device-0.34.0/B/sets.sha256" in run.stderr
    )
    (dev / "A" / "so_C.xz.1").write_bytes(b"a" * 10)  # the carried copy is right again
    assert bash(root, env, LIB + "set_dir A").stdout.strip() == ".device-0.34.0/A"


def test_device_a_refuses_a_set_not_carried_or_of_another_release(rig):
    root, dev, env, _ = rig
    run = bash(root, env, "bash engine/device-a.sh C")
    assert run.returncode == 3 and "carry .device-0.34.0/C with this call" in run.stderr
    (dev / "W" / "engine").write_text("vllm-0.33.0\n")
    run = bash(root, env, "bash engine/device-a.sh A W")
    assert run.returncode == 3 and "vllm-0.33.0's set" in run.stderr
    assert bash(root, env, "bash engine/device-a.sh").returncode == 2


def test_device_dir_picks_another_release(rig):
    root, dev, env, _ = rig
    dev.rename(root / ".device-0.33.0")
    run = bash(root, env, "bash engine/device-a.sh A")
    assert run.returncode == 3 and ".device-0.34.0/A" in run.stderr
    env = dict(env, DEVICE_DIR=".device-0.33.0")
    for s in ("A",):
        (root / ".device-0.33.0" / s / "engine").write_text("vllm-0.33.0\n")
    run = bash(root, env, "bash engine/device-a.sh A")
    assert run.returncode == 0, run.stderr
    assert "stashed A in" in run.stdout and "pv-0.33.0" in run.stdout


def test_the_model_stages_need_sets_c_and_c2(rig):
    root, _, env, _ = rig
    for name in ("suite_stage.py", "suite_models.py", "suite_realsize.py", "suite_pressure.py",
                 "suite_restore.py", "suite_compare.py", "diskspeed.py",
                 "metrics_check.py", "transfer.py"):  # fmt: skip
        (root / "engine" / name).symlink_to(REPO / "engine" / name)
    run = bash(root, env, LIB + 'needs_models "$1"', "glm5next")
    assert run.returncode == 0, run.stderr
    for only in ("", "llama,restore", "ttft.llama8b"):
        assert bash(root, env, LIB + 'needs_models "$1"', only).returncode == 1, only


def test_a_call_clears_the_last_ones_stores_unless_told_to_keep_them(rig, tmp_path):
    root, _, env, _ = rig
    run_root = tmp_path / "run"
    for folder in ("v/vllm", "vp", "site-models", "kvstores/ttft.glm5wide"):
        (run_root / folder).mkdir(parents=True)
    (run_root / "kvstores/ttft.glm5wide/m.json").write_text("{}")
    kept = bash(
        root, {**env, "KVTIER_KEEP_STORES": "1"}, LIB + 'clear_run "$1"', run_root
    )
    assert kept.returncode == 0, kept.stderr
    assert (run_root / "kvstores/ttft.glm5wide/m.json").exists()
    assert not (run_root / "vp").exists() and not (run_root / "site-models").exists()
    assert (run_root / "v").is_dir() and not (run_root / "v/vllm").exists()
    cleared = bash(root, env, LIB + 'clear_run "$1"', run_root)
    assert cleared.returncode == 0, cleared.stderr
    assert not (run_root / "kvstores").exists()
