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
        "transformers:Glm5NextTextConfig",
        "vllm.models.glm5next",
    ],
    "dsv2lite": [
        "vllm._C_stable_libtorch",
        "vllm._moe_C_stable_libtorch",
        "vllm.model_executor.models.deepseek_v2",
    ],
    "qwen3next": [
        "vllm._C_stable_libtorch",
        "vllm._moe_C_stable_libtorch",
        "transformers:Qwen3NextConfig",
        "vllm.model_executor.models.qwen3_next",
    ],
}


def probe(name: str) -> dict:
    """One import: ok, or the exception's type and message (the first line names the file)."""
    module, _, attr = name.lstrip("?").partition(":")
    try:
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
            f.get("error", ""),
            flush=True,
        )
    return 1 if res["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
