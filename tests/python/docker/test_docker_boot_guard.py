"""The boot guard: GLM53_KV_OFFLOAD=1 on an engine without the overlays must
stop the engine at boot, never fall back to stock CPU offloading.

docker/launch.sh names the offloading spec through `spec_module_path`, a
package only the kv-offload-store-local overlay creates. This runs vLLM's
own spec factory (the pinned file, through the harness) with the exact
connector JSON launch.sh plans: on the pristine tree it raises, naming the
missing module; on the baked tree it resolves to the tiering spec."""

from __future__ import annotations

import json
import subprocess

import pytest
from docker_support import baked_rig

FACTORY = "vllm.v1.kv_offload.factory"
KNOB1 = {
    "GLM53_KV_OFFLOAD": "1",
    "GLM53_KV_OFFLOAD_DIR": "/data/glm53-kv-offload",
    "GLM53_KV_OFFLOAD_CPU_GB": "16",
}


@pytest.fixture
def extra_config(tmp_path) -> dict:
    """kv_connector_extra_config exactly as launch.sh plans it for knob 1."""
    rig = baked_rig(tmp_path / "rig")
    out = tmp_path / "plan"
    res = rig.run(
        "launch.sh", "plan", "--ranks", "0", "--out", str(out),
        "--prefix", str(rig.prefix), "--", "vllm", "serve", "m",
        **KNOB1,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    argv = (out / "rank0" / "argv").read_text().splitlines()
    return json.loads(argv[argv.index("--kv-transfer-config") + 1])[
        "kv_connector_extra_config"
    ]


def test_pristine_engine_fails_at_boot_naming_the_missing_overlay(
    pristine, extra_config
):
    factory = pristine.load(FACTORY).OffloadingSpecFactory
    # Stock vLLM accepts the spec vLLM registers itself; ours it does not know.
    assert extra_config["spec_name"] not in factory._registry
    with pytest.raises(ModuleNotFoundError) as e:
        factory.get_spec_cls(extra_config)
    assert "offloading.kv_store_local" in str(e.value)


def test_baked_engine_resolves_the_tiering_spec(
    tree_copy, overlay_bin, manifests_dir, order, extra_config
):
    import harness

    done = subprocess.run(
        [str(overlay_bin), "apply", "--root", str(tree_copy),
         "--manifests", str(manifests_dir), "--overlays", ",".join(order)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with harness.engine(tree_copy, package="vllm") as ns:
        factory = ns.load(FACTORY).OffloadingSpecFactory
        spec_cls = factory.get_spec_cls(extra_config)
        tiering = ns.load("vllm.v1.kv_offload.tiering.spec").TieringOffloadingSpec
        assert spec_cls is tiering
