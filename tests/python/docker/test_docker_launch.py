"""Launch configuration (docker/launch.sh): knob 0 adds nothing, knob 1 gives
every rank the same connector JSON, mount and env, and `compare` catches a
rank that differs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from docker_support import REPO, baked_rig

SERVE = ["vllm", "serve", "org/model", "--tensor-parallel-size", "2", "--port", "8000"]
BASE_ENV = (
    "HF_HOME=/models\n"
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:512\n"
    "VLLM_LOGGING_LEVEL=INFO\n"
)
SPEC_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local"
KNOB1 = {
    "GLM53_KV_OFFLOAD": "1",
    "GLM53_KV_OFFLOAD_DIR": "/data/glm53-kv-offload",
    "GLM53_KV_OFFLOAD_CPU_GB": "16",
}


@pytest.fixture
def rig(tmp_path):
    return baked_rig(tmp_path)


def plan(rig, out: Path, knobs: dict, ranks="0,1", base_env=BASE_ENV, argv=SERVE):
    args = ["plan", "--ranks", ranks, "--out", str(out), "--prefix", str(rig.prefix)]
    if "," in ranks:
        args += ["--master-addr", "h0"]
    if base_env is not None:
        env_file = out.parent / f"{out.name}.base-env"
        env_file.write_text(base_env)
        args += ["--base-env", str(env_file)]
    return rig.run("launch.sh", *args, "--", *argv, **knobs)


def node_args(rank: int, nnodes: int = 2) -> list[str]:
    """What a rank's argv ends with in a multi-node group (launch.sh plan)."""
    tail = ["--nnodes", str(nnodes), "--master-addr", "h0", "--master-port", "29501"]
    return tail + ["--node-rank", str(rank)] + (["--headless"] if rank else [])


def read_rank(out: Path, rank: int) -> dict[str, bytes]:
    d = out / f"rank{rank}"
    return {f: (d / f).read_bytes() for f in ("argv", "env", "mounts", "order")}


def connector(out: Path, rank: int) -> dict:
    argv = (out / f"rank{rank}" / "argv").read_text().splitlines()
    i = argv.index("--kv-transfer-config")
    return json.loads(argv[i + 1])


# ---------------------------------------------------------------- knob 0


@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"GLM53_KV_OFFLOAD": "0"},
        {
            "GLM53_KV_OFFLOAD": "0",
            "GLM53_KV_OFFLOAD_DRAFTER": "1",
            "GLM53_KV_OFFLOAD_CPU_GB": "8",
        },
    ],
    ids=["unset", "zero", "zero-with-other-knobs"],
)
def test_knob_0_is_byte_identical_to_no_tier(rig, tmp_path, knobs):
    out = tmp_path / "plan"
    res = plan(rig, out, knobs)
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        files = read_rank(out, rank)
        want = SERVE + node_args(rank)
        assert files["argv"] == "".join(a + "\n" for a in want).encode()
        assert files["env"] == BASE_ENV.encode()  # expandable_segments kept
        assert files["mounts"] == b""
    assert "expandable_segments" not in res.stderr


@pytest.mark.parametrize("knob", ["0", "1"])
def test_planning_creates_no_store_folder(rig, tmp_path, knob):
    store = tmp_path / "store"
    out = tmp_path / "plan"
    res = plan(
        rig, out, dict(KNOB1, GLM53_KV_OFFLOAD=knob, GLM53_KV_OFFLOAD_DIR=str(store))
    )
    assert res.returncode == 0, res.stderr
    assert not store.exists()  # the launcher makes it per node, knob 1 only
    mounts = (out / "rank0" / "mounts").read_text()
    assert mounts == ("" if knob == "0" else f"{store}:{store}:rw\n")


def test_knob_0_output_equals_a_run_without_any_knob(rig, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert plan(rig, a, {}).returncode == 0
    assert (
        plan(
            rig, b, {"GLM53_KV_OFFLOAD": "0", "GLM53_KV_OFFLOAD_KEEP_BOUNDARIES": "5"}
        ).returncode
        == 0
    )
    for rank in (0, 1):
        assert read_rank(a, rank) == read_rank(b, rank)


def test_knob_0_keeps_base_env_bytes_without_trailing_newline(rig, tmp_path):
    out = tmp_path / "plan"
    assert plan(rig, out, {}, base_env="A=1\nB=two words").returncode == 0
    assert (out / "rank0" / "env").read_bytes() == b"A=1\nB=two words"


def test_knob_0_without_base_env_gives_empty_env(rig, tmp_path):
    out = tmp_path / "plan"
    assert plan(rig, out, {}, base_env=None).returncode == 0
    assert (out / "rank1" / "env").read_bytes() == b""


# ---------------------------------------------------------------- knob 1


def test_knob_1_connector_json(rig, tmp_path):
    out = tmp_path / "plan"
    res = plan(rig, out, KNOB1, ranks="0,1,2,3")
    assert res.returncode == 0, res.stderr
    cfg = connector(out, 0)
    assert cfg == {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "StoreLocalOffloadingSpec",
            "spec_module_path": SPEC_MODULE,
            "cpu_bytes_to_use": 16 * 2**30,
            "blocks_per_chunk": 1,
            "offload_prompt_only": False,
            "secondary_tiers": [],
        },
    }
    rank0 = read_rank(out, 0)
    for rank in (1, 2, 3):
        assert connector(out, rank) == cfg
        files = read_rank(out, rank)
        # argv differs only in the rank arguments vLLM needs per node.
        lines = files.pop("argv").decode().splitlines()
        lines0 = rank0["argv"].decode().splitlines()
        assert lines[:-3] == lines0[:-2] and lines0[-2:] == ["--node-rank", "0"]
        assert lines[-3:] == ["--node-rank", str(rank), "--headless"]
        assert lines[-9:-3] == node_args(0, 4)[:6]
        assert files == {k: v for k, v in rank0.items() if k != "argv"}
    argv = (out / "rank0" / "argv").read_text().splitlines()
    assert argv[: len(SERVE)] == SERVE and argv.count("--kv-transfer-config") == 1
    assert rig.run("launch.sh", "compare", str(out)).returncode == 0


@pytest.mark.parametrize("gb", ["1", "64"])
def test_cpu_bytes_follow_cpu_gb(rig, tmp_path, gb):
    out = tmp_path / "plan"
    assert plan(rig, out, dict(KNOB1, GLM53_KV_OFFLOAD_CPU_GB=gb)).returncode == 0
    extra = connector(out, 1)["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == int(gb) << 30


def test_knob_1_env_mount_and_expandable_segments(rig, tmp_path):
    out = tmp_path / "plan"
    res = plan(rig, out, dict(KNOB1, GLM53_KV_OFFLOAD_BUILD_ID="b1"))
    assert res.returncode == 0, res.stderr
    env = (out / "rank0" / "env").read_text().splitlines()
    assert env == [
        "HF_HOME=/models",
        "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512",
        "VLLM_LOGGING_LEVEL=INFO",
        "GLM53_KV_OFFLOAD=1",
        "GLM53_KV_OFFLOAD_DIR=/data/glm53-kv-offload",
        "GLM53_KV_OFFLOAD_CPU_GB=16",
        "GLM53_KV_OFFLOAD_BUILD_ID=b1",
    ]
    assert (out / "rank1" / "mounts").read_text() == (
        "/data/glm53-kv-offload:/data/glm53-kv-offload:rw\n"
    )
    assert "dropping expandable_segments:True" in res.stderr
    assert "CuMem" in res.stderr


@pytest.mark.parametrize(
    "conf,after",
    [
        ("expandable_segments:True", None),
        (
            " expandable_segments:True ,garbage_collection_threshold:0.6",
            "garbage_collection_threshold:0.6",
        ),
        ("expandable_segments:False", "expandable_segments:False"),
        ("max_split_size_mb:128", "max_split_size_mb:128"),
    ],
)
def test_expandable_segments_removed_only_with_knob_1(rig, tmp_path, conf, after):
    base = f"A=1\nPYTORCH_CUDA_ALLOC_CONF={conf}\n"
    k0, k1 = tmp_path / "k0", tmp_path / "k1"
    assert plan(rig, k0, {}, base_env=base).returncode == 0
    res = plan(rig, k1, KNOB1, base_env=base)
    assert res.returncode == 0, res.stderr
    assert (k0 / "rank0" / "env").read_text() == base
    got = [
        ln
        for ln in (k1 / "rank0" / "env").read_text().splitlines()
        if ln.startswith("PYTORCH_CUDA_ALLOC_CONF=")
    ]
    assert got == ([] if after is None else [f"PYTORCH_CUDA_ALLOC_CONF={after}"])
    assert ("dropping expandable_segments" in res.stderr) == (after != conf)


def test_build_id_derived_from_baked_artifacts(rig, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert plan(rig, a, KNOB1).returncode == 0
    ids = {(a / f"rank{r}" / "env").read_text().splitlines()[-1] for r in (0, 1)}
    assert len(ids) == 1
    (build_id,) = ids
    assert re.fullmatch(r"GLM53_KV_OFFLOAD_BUILD_ID=kvtier-[0-9a-f]{16}", build_id)
    # Another overlay content -> another namespace fence.
    f = rig.prefix / "overlays/kv-offload-store-local/kv_store_local.py"
    f.write_text(f.read_text() + "# changed\n")
    assert rig.bake().returncode == 0
    assert plan(rig, b, KNOB1).returncode == 0
    assert (b / "rank0" / "env").read_text().splitlines()[-1] != build_id


def test_order_is_emitted_identically_from_the_one_order_file(rig, tmp_path):
    out = tmp_path / "plan"
    assert plan(rig, out, KNOB1, ranks="0,1,2").returncode == 0
    order = (rig.prefix / "anchors").glob("*/ORDER")
    want = next(order).read_bytes()
    for r in (0, 1, 2):
        assert (out / f"rank{r}" / "order").read_bytes() == want


# ---------------------------------------------------------------- compare


@pytest.mark.parametrize(
    "file,mutate,needle",
    [
        (
            "argv",
            lambda t: t.replace(
                '"cpu_bytes_to_use":17179869184', '"cpu_bytes_to_use":17179869185'
            ),
            "connector JSON",
        ),
        (
            "argv",
            lambda t: t.replace(
                '"offload_prompt_only":false', '"offload_prompt_only":true'
            ),
            "connector JSON",
        ),
        ("argv", lambda t: t.replace("8000", "8001"), "argv differs"),
        (
            "env",
            lambda t: t.replace(
                "GLM53_KV_OFFLOAD_CPU_GB=16", "GLM53_KV_OFFLOAD_CPU_GB=8"
            ),
            "env differs",
        ),
        ("mounts", lambda t: "", "mounts differs"),
        (
            "order",
            lambda t: "".join(reversed(t.splitlines(keepends=True))),
            "order differs",
        ),
    ],
)
def test_compare_detects_a_one_rank_mismatch(rig, tmp_path, file, mutate, needle):
    out = tmp_path / "plan"
    assert plan(rig, out, KNOB1, ranks="0,1,2").returncode == 0
    assert rig.run("launch.sh", "compare", str(out)).returncode == 0
    p = out / "rank2" / file
    text = p.read_text()
    assert mutate(text) != text
    p.write_text(mutate(text))
    res = rig.run("launch.sh", "compare", str(out))
    assert res.returncode == 2
    assert f"rank2: {needle}" in res.stderr


def test_compare_detects_a_missing_file(rig, tmp_path):
    out = tmp_path / "plan"
    assert plan(rig, out, KNOB1).returncode == 0
    (out / "rank1" / "mounts").unlink()
    res = rig.run("launch.sh", "compare", str(out))
    assert res.returncode == 2 and "rank1/mounts: missing" in res.stderr


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "knobs,kwargs,needle",
    [
        (
            dict(KNOB1, GLM53_KV_OFFLOAD_RESTORE="1"),
            {},
            "RESTORE=1 is refused: the kv-offload-restore overlay is not baked (not in",
        ),
        (dict(KNOB1, GLM53_KV_OFFLOAD="2"), {}, "GLM53_KV_OFFLOAD=2"),
        (KNOB1, {"argv": SERVE + ["--kv-transfer-config", "{}"]}, "owns the connector"),
        (KNOB1, {"argv": SERVE + ["--kv-transfer-config={}"]}, "owns the connector"),
        (KNOB1, {"argv": SERVE + ["--kv-offloading-size", "8"]}, "owns the connector"),
        (KNOB1, {"base_env": "GLM53_KV_OFFLOAD=1\n"}, "caller's environment"),
        ({}, {"base_env": "not an assignment\n"}, "expected KEY=VALUE"),
        ({}, {"ranks": "0,0"}, "listed twice"),
        ({}, {"ranks": "0;1"}, "expected e.g. 0,1"),
        ({}, {"argv": ["vllm", "serve", "two\nlines"]}, "contains a newline"),
        ({}, {"argv": []}, "no serve argv"),
    ],
)
def test_plan_refuses_and_writes_nothing(rig, tmp_path, knobs, kwargs, needle):
    out = tmp_path / "plan"
    res = plan(rig, out, knobs, **kwargs)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".launch.*"))


# ---------------------------------------------------------------- restore

RESTORE1 = dict(KNOB1, GLM53_KV_OFFLOAD_RESTORE="1")
LOCAL_STORE_TIER = {
    "type": "LocalStoreTier",
    "module_path": "vllm.distributed.kv_transfer.kv_connector.v1.offloading."
    "kv_restore_tier",
}


@pytest.fixture
def restore_rig(tmp_path):
    return baked_rig(tmp_path / "r", restore=True)


def test_restore_plan_names_the_local_store_tier(restore_rig, tmp_path):
    """Where ORDER bakes kv-offload-restore, RESTORE=1 is planned, and the
    connector carries the one secondary tier restore boots with."""
    out = tmp_path / "plan"
    res = plan(restore_rig, out, RESTORE1)
    assert res.returncode == 0, res.stderr
    extra = connector(out, 0)["kv_connector_extra_config"]
    assert extra["secondary_tiers"] == [LOCAL_STORE_TIER]
    assert connector(out, 1) == connector(out, 0)
    env = (out / "rank0" / "env").read_text().splitlines()
    assert "GLM53_KV_OFFLOAD_RESTORE=1" in env
    assert restore_rig.run("launch.sh", "compare", str(out)).returncode == 0
    # RESTORE=0 on the same prefix: the store alone, no secondary tier.
    out0 = tmp_path / "plan0"
    res = plan(restore_rig, out0, dict(KNOB1, GLM53_KV_OFFLOAD_RESTORE="0"))
    assert res.returncode == 0, res.stderr
    assert connector(out0, 0)["kv_connector_extra_config"]["secondary_tiers"] == []


def test_restore_knob_with_the_tier_off_changes_nothing(restore_rig, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert plan(restore_rig, a, {}).returncode == 0
    res = plan(restore_rig, b, {"GLM53_KV_OFFLOAD_RESTORE": "1"})
    assert res.returncode == 0, res.stderr
    assert read_rank(a, 0) == read_rank(b, 0) and read_rank(a, 1) == read_rank(b, 1)


@pytest.mark.parametrize(
    "algo_args", [["--prefix-caching-hash-algo", "xxhash"],
                  ["--prefix-caching-hash-algo=xxhash_cbor"]],
)  # fmt: skip
def test_restore_with_xxhash_needs_pythonhashseed(restore_rig, tmp_path, algo_args):
    res = plan(restore_rig, tmp_path / "a", RESTORE1, argv=SERVE + algo_args)
    assert res.returncode == 2 and "needs PYTHONHASHSEED" in res.stderr
    assert not (tmp_path / "a").exists()
    seeded = BASE_ENV + "PYTHONHASHSEED=0\n"
    res = plan(
        restore_rig, tmp_path / "b", RESTORE1, base_env=seeded, argv=SERVE + algo_args
    )
    assert res.returncode == 0, res.stderr
    # sha256 (vLLM's default) needs no seed: its keys are fixed across restarts.
    res = plan(restore_rig, tmp_path / "c", RESTORE1)
    assert res.returncode == 0, res.stderr


def test_repository_plans_restore_without_engine(tmp_path):
    """The repository's own prefix as a fresh clone has it (the example
    overlays' anchors beside the real engine's): no --engine needed, and
    RESTORE=1 planned with the tier the restore manifest creates."""
    assert (REPO / "anchors" / "example-1.0").is_dir()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), **RESTORE1}
    env["GLM53_KV_OFFLOAD_BUILD_ID"] = "kvtier-test"
    out = tmp_path / "plan"
    res = subprocess.run(
        [str(REPO / "docker/launch.sh"), "plan", "--ranks", "0", "--out", str(out),
         "--", *SERVE],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    order = (out / "rank0" / "order").read_text()
    assert order == (REPO / "anchors/vllm-0.33.0/ORDER").read_text()
    tier = connector(out, 0)["kv_connector_extra_config"]["secondary_tiers"]
    assert tier == [LOCAL_STORE_TIER]
    module = LOCAL_STORE_TIER["module_path"].replace(".", "/") + ".py"
    manifest = (REPO / "anchors/vllm-0.33.0/kv-offload-restore.toml").read_text()
    assert f'path = "{module}"' in manifest
    source = (REPO / "overlays/kv-offload-restore/kv_restore_tier.py").read_text()
    assert "class LocalStoreTier(" in source
    # Knob 0 in the same clone: also no --engine needed.
    res = subprocess.run(
        [str(REPO / "docker/launch.sh"), "plan", "--ranks", "0", "--out",
         str(tmp_path / "plan0"), "--", *SERVE],
        env={"PATH": env["PATH"], "HOME": str(tmp_path)},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


def test_plan_never_overwrites(rig, tmp_path):
    out = tmp_path / "plan"
    out.mkdir()
    (out / "keep").write_text("x")
    res = plan(rig, out, {})
    assert res.returncode == 2 and "already exists" in res.stderr
    assert os.listdir(out) == ["keep"]


def test_knob_1_without_baked_list_needs_a_build_id(rig, tmp_path):
    rig.artifacts.unlink()
    res = plan(rig, tmp_path / "a", KNOB1)
    assert res.returncode == 2 and "set GLM53_KV_OFFLOAD_BUILD_ID" in res.stderr
    res = plan(rig, tmp_path / "b", dict(KNOB1, GLM53_KV_OFFLOAD_BUILD_ID="x1"))
    assert res.returncode == 0, res.stderr


# ------------------------------------------------- against the pinned engine


def _pinned_wheel() -> Path | None:
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvtier/wheels"
    )
    for wheel_file in REPO.glob("fixtures/*/WHEEL"):
        engine, version = wheel_file.parent.name.split("-", 1)
        for whl in cache.glob(f"{engine}-{version}-*.whl"):
            return whl
    return None


def test_connector_keys_are_the_pinned_engines(rig, tmp_path):
    """Every key we emit is one the pinned engine reads, under that name."""
    whl = _pinned_wheel()
    if whl is None:
        pytest.skip("pinned wheel not cached (run scripts/setup.sh)")
    out = tmp_path / "plan"
    assert plan(rig, out, KNOB1).returncode == 0
    cfg = connector(out, 0)
    with zipfile.ZipFile(whl) as z:
        src = "\n".join(
            z.read(n).decode()
            for n in z.namelist()
            if n.endswith(".py")
            and (
                "kv_offload/" in n
                or "/offloading" in n
                or n.endswith("config/kv_transfer.py")
            )
        )
        registered = z.read("vllm/v1/kv_offload/factory.py").decode()
        wheel_files = set(z.namelist())
        connector_factory = z.read(
            "vllm/distributed/kv_transfer/kv_connector/factory.py"
        ).decode()
    for key in cfg["kv_connector_extra_config"]:
        assert re.search(rf'extra_config\.get\(\s*"{key}"', src), key
    for key in ("kv_connector", "kv_role", "kv_connector_extra_config"):
        assert re.search(rf"^    {key}: ", src, re.MULTILINE), key
    # The boot guard: the spec is not one vLLM registers, so vLLM imports it
    # from spec_module_path, a package only the store-local overlay creates.
    extra = cfg["kv_connector_extra_config"]
    assert f'"{extra["spec_name"]}"' not in registered
    module_file = extra["spec_module_path"].replace(".", "/") + "/__init__.py"
    assert module_file not in wheel_files  # stock vLLM has no such module
    toml = (REPO / "anchors/vllm-0.33.0/kv-offload-store-local.toml").read_text()
    assert f'path = "{module_file}"' in toml
    assert f'"{cfg["kv_connector"]}"' in connector_factory
    assert "kv_both" in src


# ------------------------------------------------------- multi-node pair


def test_two_node_pair_argv_differs_only_in_rank_arguments(rig, tmp_path):
    out = tmp_path / "plan"
    res = plan(rig, out, KNOB1)
    assert res.returncode == 0, res.stderr
    a0 = (out / "rank0" / "argv").read_text().splitlines()
    a1 = (out / "rank1" / "argv").read_text().splitlines()
    assert a0[-len(node_args(0)) :] == node_args(0)
    assert a1[-len(node_args(1)) :] == node_args(1)
    assert a0[: -len(node_args(0))] == a1[: -len(node_args(1))]
    assert "--headless" not in a0
    assert rig.run("launch.sh", "compare", str(out)).returncode == 0


@pytest.mark.parametrize(
    "rank,mutate,needle",
    [
        (1, lambda a: a.replace("--headless\n", ""), "does not end with its own"),
        (
            1,
            lambda a: a.replace("--node-rank\n1\n", "--node-rank\n0\n"),
            "does not end",
        ),
        (0, lambda a: a + "--headless\n", "does not end with its own"),
        (1, lambda a: a.replace("--nnodes\n2\n", "--nnodes\n3\n"), "lacks --nnodes 2"),
        (1, lambda a: a.replace("h0", "h1"), "argv differs from rank0's"),
        (1, lambda a: a.replace("--port\n8000\n", "--port\n8001\n"), "argv differs"),
    ],
    ids=["no-headless", "wrong-rank", "leader-headless", "nnodes", "master", "port"],
)
def test_compare_allows_only_the_rank_arguments_to_differ(
    rig, tmp_path, rank, mutate, needle
):
    out = tmp_path / "plan"
    assert plan(rig, out, {}).returncode == 0
    f = out / f"rank{rank}" / "argv"
    f.write_text(mutate(f.read_text()))
    res = rig.run("launch.sh", "compare", str(out))
    assert res.returncode == 2 and needle in res.stderr, res.stderr


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--node-rank", "1"], "argv already has --node-rank"),
        (["--headless"], "argv already has --headless"),
        (["--nnodes=2"], "argv already has --nnodes=2"),
        (["-r", "0"], "argv already has -r"),
    ],
)
def test_plan_owns_the_multi_node_arguments(rig, tmp_path, extra, needle):
    out = tmp_path / "plan"
    res = plan(rig, out, {}, argv=SERVE + extra)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert not out.exists()


def test_multi_node_needs_master_addr_and_ranks_from_zero(rig, tmp_path):
    out = tmp_path / "plan"
    args = ["plan", "--ranks", "0,1", "--out", str(out), "--prefix", str(rig.prefix)]
    res = rig.run("launch.sh", *args, "--", *SERVE)
    assert res.returncode == 2 and "--master-addr HOST is required" in res.stderr
    res = plan(rig, out, {}, ranks="1,2")
    assert res.returncode == 2 and "needs ranks 0..1" in res.stderr
    # One rank is a single-node launch: no multi-node arguments at all.
    assert plan(rig, out, {}, ranks="0").returncode == 0
    assert (out / "rank0" / "argv").read_text().splitlines() == SERVE


def test_rank_arguments_are_the_pinned_engines(rig, tmp_path):
    """--nnodes/--node-rank/--master-addr/--master-port are arg_utils' flags,
    --headless is `vllm serve`'s, in the pinned wheel."""
    whl = _pinned_wheel()
    if whl is None:
        pytest.skip("pinned wheel not cached (run scripts/setup.sh)")
    with zipfile.ZipFile(whl) as z:
        arg_utils = z.read("vllm/engine/arg_utils.py").decode()
        cli_args = z.read("vllm/entrypoints/common/cli_args.py").decode()
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port"):
        assert f'add_argument("{flag}"' in arg_utils, flag
    assert '"--headless"' in cli_args
    assert "master_port: int = ParallelConfig.master_port" in arg_utils


def test_deploy_restore_recipe_shows_the_json_launch_sh_writes(tmp_path):
    """docs/DEPLOY.md's restore section: its knobs, planned by the repository's
    launch.sh, give exactly the JSON the page shows."""
    text = (REPO / "docs/DEPLOY.md").read_text()
    section = text[text.index("## Restore") :]
    section = section[: section.index("\n## ", 1)]
    shown = re.search(r"```json\n(.+)\n\s*```", section).group(1).strip()
    knobs = dict(
        re.findall(
            r"(GLM53_KV_OFFLOAD\w*)=(\S+)", section.split("```sh", 1)[1].split("```")[0]
        )
    )
    assert knobs["GLM53_KV_OFFLOAD_RESTORE"] == "1"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), **knobs}
    env["GLM53_KV_OFFLOAD_BUILD_ID"] = "kvtier-docs"
    out = tmp_path / "plan"
    res = subprocess.run(
        [str(REPO / "docker/launch.sh"), "plan", "--ranks", "0", "--out", str(out),
         "--", *SERVE],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    argv = (out / "rank0" / "argv").read_text().splitlines()
    assert argv[argv.index("--kv-transfer-config") + 1] == shown
