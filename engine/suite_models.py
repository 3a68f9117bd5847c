"""The model stages of the GPU suite (issue 31; docs/ENGINE.md, "MLA, MoE and KDA"): per model
of engine/models/{glm5next,dsv2lite,qwen3next} the import probe (engine/opsprobe.py), then
pristine, knob 0 and knob 1, then the restore set; each stage after the probe is not started
when the probe failed (ops_failed).
"""

from __future__ import annotations

import os

from suite_stage import MODELS, Stage

# The issue-31 models (engine/models/<name>; ENGINE.md, "MLA, MoE and KDA"): a stage
# argument set per model. Attention: TRITON_MLA for DeepSeek-V2-Lite's dense MLA; GLM-5.3's
# MLA is sparse (the kpool indexer picks the keys), which TRITON_MLA refuses, so FlashMLA's
# sparse backend (set C carries _flashmla_C; on SM90 it serves GLM-5.3's 512-wide NoPE
# head); its mHC ops run tilelang's kernels (set K). DeepSeek-V2-Lite's MLA prefill is
# FlashAttention 3 (set F): on SM90 vLLM 0.34.0 lists no other MLA prefill backend.
# GLM-5.3's KDA prefill on FLA's Triton kernels, not _flashkda_C; the gated-DeltaNet
# family's prefill (Qwen3-Next's layers, and the GDN metadata GLM-5.3's KDA layers share)
# on FLA's Triton kernels too: "auto" picks FlashInfer on SM90, which is not carried.
# The hybrid models' KV block is 512 (GLM-5.3) and 192 (Qwen3-Next) tokens: their stages
# run the "blocks" workload, whose prompts fill several (run 29: "small" filled none).
GDN = '"gdn_prefill_backend": "triton"'
BLOCKS = ["--workload", "blocks"]
# GLM-5.3's backends, also what its real-width TTFT set boots with (suite_realsize.py).
GLM5 = ["--hybrid", "--attention-backend", "FLASHMLA_SPARSE", "--additional-config",
        '{"kda_prefill_backend": "triton", ' + GDN + "}"]  # fmt: skip
NEW_MODELS = {
    "glm5next": GLM5 + BLOCKS,
    "dsv2lite": ["--attention-backend", "TRITON_MLA"],
    "qwen3next": ["--hybrid", "--additional-config", "{" + GDN + "}"] + BLOCKS,
    # GLM-5.3 with its MTP drafter (one speculative token): the same folder and ops.
    "glm5mtp": GLM5 + BLOCKS + ["--mtp"],
}  # fmt: skip
# A stage set whose model folder (and import probe) is another set's.
SAME_MODEL = {"glm5mtp": "glm5next"}
# A restore stage's limit (s). GLM-5.3 with its drafter compiles the MTP shapes in its
# first round (61 s in run 44) after a 66 s boot: its write stage ended past 150 s.
RESTORE_TIMEOUT = {"glm5mtp": 300}


def model_stages() -> list[Stage]:
    """Per model: the import probe first (wave 20, all models side by side), then pristine,
    knob 0 and knob 1 (wave 21), then the restore set (waves 22-25) on the same store. Each
    stage after the probe needs it; selected by prefix only (ONLY=glm5next,...)."""
    small = ["--connector", "--cpu-bytes", str(256 << 20)]
    probe = ["--probe", "--compare"]
    on = {"GLM53_KV_OFFLOAD_RESTORE": "1"}
    out = []
    for m, extra in NEW_MODELS.items():
        folder = SAME_MODEL.get(m, m)
        path, ops = os.path.join(MODELS, folder), f"{folder}.ops"
        seq = small + ["--sequential"] + extra
        store, limit = f"{m}.restore", RESTORE_TIMEOUT.get(m, 150)
        mine = [] if m in SAME_MODEL else [
            Stage(ops, m, "patched", None, [], wave=20, timeout=120, verify=False)
        ]  # fmt: skip
        mine += [
            Stage(f"{m}.pristine", path, "pristine", None, small + extra, wave=21),
            Stage(f"{m}.knob0", path, "patched", "0", small + extra, wave=21),
            Stage(f"{m}.knob1", path, "patched", "1", small + extra + probe, wave=21),
            Stage(f"{store}.cold", path, "pristine", None, seq, wave=22, timeout=limit),
            Stage(f"{store}.write", path, "patched", "1", seq + probe,
                  env={"GLM53_KV_OFFLOAD_RESTORE": "0"}, wave=22, store=store, timeout=limit),
            Stage(f"{store}.hit", path, "patched", "1", seq + ["--restore-probe"],
                  env=on, wave=23, store=store, timeout=limit),
            Stage(f"{store}.bad", path, "patched", "1", seq + ["--restore-probe"],
                  env=on, wave=24, store=store, verify=False, corrupt=f"{store}.hit",
                  timeout=limit),
            Stage(f"{store}.healed", path, "patched", "1", seq + ["--restore-probe"],
                  env=on, wave=25, store=store, timeout=limit),
        ]  # fmt: skip
        for st in mine:
            st.diagnosis = True  # device minutes: selected by prefix only
            st.models_site = True
            if st.name != ops:
                st.needs = ops
        out += mine
    return out


def ops_failed(results: dict[str, dict], st: Stage) -> str | None:
    """Why a stage must not start: its model's import probe ran and failed."""
    if st.needs is None:
        return None
    res = results.get(st.needs)
    if res is None or res.get("rc") == 0:  # not selected (ONLY named the stage alone)
        return None
    failed = res.get("failed") or res.get("errors") or [f"rc={res.get('rc')}"]
    return f"{st.needs} failed: " + "; ".join(failed)
