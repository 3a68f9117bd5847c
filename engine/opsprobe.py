"""What a model stage needs before an engine can boot: each compiled extension, vendored
library and config class imported in a process of its own tree, one line each, so a stage
that cannot run says which import or kernel stopped it (ENGINE.md, "MLA, MoE and KDA").

    python3 engine/opsprobe.py --model glm5next --out FILE.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback

# What each model imports at boot or at its first forward (from the wheel's sources; the
# Triton paths need no compiled file and are not listed). "?": reported, not required (the
# stages take the Triton path; vLLM's own import of _moe_C at boot swallows an ImportError,
# so it is imported here directly to see why it fails).
NEEDS = {
    "glm5next": [
        "vllm._C_stable_libtorch",
        "vllm._moe_C_stable_libtorch",
        "?vllm._flashkda_C",
        "?vllm._deepselect_C",
        "vllm.third_party.deep_gemm",
        # set K: tilelang loads its libraries (libtvm_compiler needs z3's libz3) at import;
        # vllm.tilelang_utils raises "tilelang is required for mhc" on CUDA without it
        "z3",
        "tilelang",
        "vllm.tilelang_utils",
        "vllm.model_executor.layers.mhc",
        "transformers:Glm5NextTextConfig",
        "vllm.models.glm5next",
        "kernel:mhc_pre_tilelang",
    ],
    "dsv2lite": [
        "vllm._C_stable_libtorch",
        "vllm._moe_C_stable_libtorch",
        # set F: the MLA prefill's FlashAttention 3 (FA3_AVAILABLE false names the dlopen)
        "vllm.vllm_flash_attn._vllm_fa3_C",
        "vllm.model_executor.models.deepseek_v2",
        "kernel:fa3_varlen_mla_prefill",
    ],
    "qwen3next": [
        "vllm._C_stable_libtorch",
        "vllm._moe_C_stable_libtorch",
        "transformers:Qwen3NextConfig",
        "vllm.model_executor.models.qwen3_next",
        "vllm.third_party.flash_linear_attention.ops.chunk",
        # FlashInfer is not carried: reported, never required (gdn_prefill_backend triton)
        "?flashinfer",
        "?kernel:fla_chunk_gated_delta_rule",
    ],
}


def kernel_mhc_pre_tilelang() -> dict:
    """GLM-5.3's mHC pre block (hc_mult 4, hidden 256 as engine/models/glm5next) through
    tilelang's JIT (nvcc) and DeepGEMM's prenorm GEMM, against vLLM's torch reference."""
    import torch
    import vllm.model_executor.kernels.mhc as mhc

    torch.manual_seed(0)
    n, hidden, tokens = 4, 256, 8
    mix = (2 + n) * n
    dev = "cuda"
    residual = torch.randn(tokens, n, hidden, device=dev, dtype=torch.bfloat16)
    fn = torch.randn(mix, n * hidden, device=dev, dtype=torch.float32) * 0.02
    scale = torch.ones(3, device=dev, dtype=torch.float32)
    base = torch.zeros(mix, device=dev, dtype=torch.float32)
    eps = 1e-6
    args = (residual, fn, scale, base, eps, eps, eps, 2.0, 20)
    got = torch.ops.vllm.mhc_pre_tilelang(*args, 1, None, eps)
    ref = mhc.mhc_pre_torch(*args)
    torch.cuda.synchronize()
    return {
        "max_abs_diff": [
            float((g.float() - r.float()).abs().max()) for g, r in zip(got, ref)
        ]
    }


def kernel_fa3_varlen_mla_prefill() -> dict:
    """DeepSeek-V2-Lite's MLA prefill shape (q/k head 192 = 128 + 64, v head 128) through
    FA3's varlen kernel, against torch's attention."""
    import torch
    import torch.nn.functional as F
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    torch.manual_seed(0)
    t, h, dev = 64, 4, "cuda"
    q = torch.randn(t, h, 192, device=dev, dtype=torch.bfloat16)
    k = torch.randn(t, h, 192, device=dev, dtype=torch.bfloat16)
    v = torch.randn(t, h, 128, device=dev, dtype=torch.bfloat16)
    cu = torch.tensor([0, t], device=dev, dtype=torch.int32)
    out = flash_attn_varlen_func(q, k, v, t, cu, t, cu, causal=True, fa_version=3)
    out = out[0] if isinstance(out, tuple) else out
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    ).transpose(0, 1)
    torch.cuda.synchronize()
    return {"max_abs_diff": float((out.float() - ref.float()).abs().max())}


def kernel_fla_chunk_gated_delta_rule() -> dict:
    """Qwen3-Next's gated-DeltaNet prefill on FLA's Triton kernels (head 128, 64 tokens)."""
    import torch
    from vllm.third_party.flash_linear_attention.ops.chunk import chunk_gated_delta_rule

    torch.manual_seed(0)
    t, h, d, dev = 64, 4, 128, "cuda"
    q, k, v = (torch.randn(1, t, h, d, device=dev, dtype=torch.bfloat16) for _ in "qkv")
    g = -torch.rand(1, t, h, device=dev, dtype=torch.float32)
    beta = torch.rand(1, t, h, device=dev, dtype=torch.bfloat16)
    state = torch.zeros(1, h, d, d, device=dev, dtype=torch.float32)
    cu = torch.tensor([0, t], device=dev, dtype=torch.long)
    out, final = chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=state, output_final_state=True, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    torch.cuda.synchronize()
    return {"finite": bool(torch.isfinite(out).all() and torch.isfinite(final).all())}


KERNELS = {
    "mhc_pre_tilelang": kernel_mhc_pre_tilelang,
    "fa3_varlen_mla_prefill": kernel_fa3_varlen_mla_prefill,
    "fla_chunk_gated_delta_rule": kernel_fla_chunk_gated_delta_rule,
}


def probe(name: str) -> dict:
    """One import, or one kernel run ("kernel:NAME", after the imports): ok, or the
    exception's type and message (the first line names the file)."""
    module, _, attr = name.lstrip("?").partition(":")
    try:
        if module == "kernel":
            return {"name": name, "ok": True} | KERNELS[attr]()
        m = importlib.import_module(module)
        if attr:
            getattr(m, attr)
        return {"name": name, "ok": True, "file": getattr(m, "__file__", None)}
    except BaseException as e:  # a failed dlopen can raise anything; name it, go on
        return {
            "name": name,
            "ok": False,
            "error": f"{type(e).__name__}: {e}"[:600],
            "where": traceback.format_exc().splitlines()[-3:],
        }


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=sorted(NEEDS))
    p.add_argument("--out", required=True)
    args = p.parse_args()
    try:
        import torch

        versions = {"torch": torch.__version__, "cuda": torch.version.cuda}
    except ImportError as e:  # reported; every import below then says what it lacks
        versions = {"torch": None, "cuda": None, "torch_error": str(e)}
    found = [probe(n) for n in NEEDS[args.model]]
    res = versions | {"imports": found}
    res["failed"] = [
        f["name"] + ": " + f["error"]
        for f in found
        if not f["ok"] and not f["name"].startswith("?")
    ]
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    for f in found:
        print(
            "OPS",
            "ok  " if f["ok"] else "FAIL",
            f["name"],
            f.get("error", f.get("max_abs_diff", f.get("finite", ""))),
            flush=True,
        )
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
