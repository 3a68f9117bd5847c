"""The model stages' kernels (issue 44; docs/ENGINE.md, "MLA, MoE and KDA"): what the GPU
suite carries for GLM-5.3's mHC (tilelang, set K), DeepSeek-V2-Lite's MLA prefill
(FlashAttention 3, set F) and which backends the stages pick so that nothing else is needed
(Qwen3-Next's and GLM-5.3's gated-DeltaNet prefill on FLA's Triton kernels, not FlashInfer);
the import probe names each, and runs one kernel each, before a model stage boots. No device
and no download: the wheels' sha256 are checked by engine/prepare.sh."""

from __future__ import annotations

import json
import re
import sys

from conftest import REPO_ROOT as REPO

sys.path.insert(0, str(REPO / "engine"))

import opsprobe  # noqa: E402
import suite_models  # noqa: E402


def kernel_pins() -> dict[str, str]:
    lines = (REPO / "engine/kernels.txt").read_text().splitlines()
    pins = {}
    for line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        req, sha = line.split()
        assert re.fullmatch(r"[a-z0-9-]+==[0-9.]+", req), line
        assert re.fullmatch(r"[0-9a-f]{64}", sha), line
        pins[req] = sha
    return pins


def test_set_k_pins_tilelang_and_what_its_libraries_load():
    pins = kernel_pins()
    # vLLM 0.34.0 and 0.33.0 both require tilelang==0.1.12; its libtvm_compiler.so needs
    # libz3.so.4.15 (z3-solver <4.15.5, >=4.13.0 as tilelang requires)
    assert "tilelang==0.1.12" in pins
    z3 = [r for r in pins if r.startswith("z3-solver==")]
    assert z3 == ["z3-solver==4.15.4.0"]
    # not carried: the stages pick Triton where vLLM would pick FlashInfer
    assert not any(r.startswith("flashinfer") for r in pins)


def test_prepare_builds_f_and_k_and_refuses_another_wheel():
    prepare = (REPO / "engine/prepare.sh").read_text()
    assert "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in prepare
    assert "done <engine/kernels.txt" in prepare
    assert "the wheel's sha256 is not engine/kernels.txt's" in prepare
    assert '--target "$W/ksite"' in prepare and "site.tar.xz" in prepare


def test_the_device_puts_fa3_in_the_tree_and_tilelang_beside_tvm_ffi():
    lib = (REPO / "engine/device-lib.sh").read_text()
    models = lib[lib.index('if [ "${1:-0}" = 1 ]; then') :]
    assert "f=$(set_dir F) && k=$(set_dir K)" in models
    assert "/tmp/v/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" in models
    # tilelang's RUNPATH is $ORIGIN/../../tvm_ffi/lib: tvm_ffi in the same site as K's tree
    assert '"$w"/apache_tvm_ffi-*.whl' in models
    assert 'tar xJf "$k/site.tar.xz" -C /tmp/site-models' in models
    # FA3 goes in before the patched tree is copied from the pristine one
    assert models.index("_vllm_fa3_C.abi3.so") < lib.index(
        "cp -a /tmp/v /tmp/vp"
    ) - lib.index('if [ "${1:-0}" = 1 ]; then')


def additional_config(model: str) -> dict:
    args = suite_models.NEW_MODELS[model]
    return json.loads(args[args.index("--additional-config") + 1])


def test_the_gated_deltanet_prefill_runs_on_triton_not_flashinfer():
    # vLLM 0.34.0's _resolve_gdn_prefill_backend: "auto" is FlashInfer on SM90
    assert additional_config("qwen3next")["gdn_prefill_backend"] == "triton"
    glm = additional_config("glm5next")
    assert glm == {"kda_prefill_backend": "triton", "gdn_prefill_backend": "triton"}
    dsv2 = suite_models.NEW_MODELS["dsv2lite"]
    assert dsv2[dsv2.index("--attention-backend") + 1] == "TRITON_MLA"


def test_the_probe_names_each_kernel_library_and_runs_one_kernel_each():
    needs = opsprobe.NEEDS
    assert {"z3", "tilelang", "vllm.tilelang_utils", "kernel:mhc_pre_tilelang"} <= set(
        needs["glm5next"]
    )
    assert {"vllm.vllm_flash_attn._vllm_fa3_C", "kernel:fa3_varlen_mla_prefill"} <= set(
        needs["dsv2lite"]
    )
    assert "?flashinfer" in needs["qwen3next"]  # reported, never required
    for model, names in needs.items():
        kernels = [n for n in names if n.lstrip("?").startswith("kernel:")]
        assert kernels, model
        # kernels run after every import of the model (a missing import names itself first)
        assert names[-len(kernels) :] == kernels or names[-1] in kernels, model
        for n in kernels:
            assert n.lstrip("?").split(":", 1)[1] in opsprobe.KERNELS


def test_a_kernel_probe_reports_its_fields_or_the_error(monkeypatch):
    monkeypatch.setitem(opsprobe.KERNELS, "good", lambda: {"max_abs_diff": 0.0})

    def bad():
        raise RuntimeError("nvcc exited 1")

    monkeypatch.setitem(opsprobe.KERNELS, "bad", bad)
    assert opsprobe.probe("kernel:good") == {
        "name": "kernel:good",
        "ok": True,
        "max_abs_diff": 0.0,
    }
    res = opsprobe.probe("?kernel:bad")
    assert res["ok"] is False and res["error"] == "RuntimeError: nvcc exited 1"
