"""One engine run of the GPU suite: a tiny model with dummy weights on the real vLLM 0.33.0.

    python3 engine/stage.py --model engine/models/llama --connector --out R.json [...]

The interpreter's path decides which tree runs (pristine or patched; engine/device.sh sets
PYTHONPATH), the environment decides the knob (GLM53_KV_OFFLOAD*). The run records, into the
JSON file given by --out:
  - per generated step, the top-20 logprobs of every request (tokens alone prove nothing: the
    dummy models echo the last prompt token);
  - tokens/s of the generate call and the engine start time;
  - with --probe (knob 1): on every worker (in-process, multi-process or TP ranks alike,
    through LLM.collective_rpc), the writer's state, its stats, the eligible groups, and for
    every store job the worker saw, the payload of each chunk file compared byte for byte with
    the KV-cache bytes of the GPU block the scheduler stored it from, read straight from the
    engine's KV-cache tensors (engine/probe.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import probe  # noqa: E402  (the functions collective_rpc sends to the workers)


def workload(name: str) -> tuple[list[list[int]], int]:
    """Prompts (token ids) and max_tokens of a named workload."""
    if name == "small":
        # 40/70/100 share prefixes (dedup and prefix hits), the fourth is unrelated.
        prompts = [list(range(1, 1 + n)) for n in (40, 70, 100)]
        prompts.append([(7 * i) % 900 + 50 for i in range(90)])
        return prompts, 16
    if name == "long":
        # For models whose KV block is long (NemotronH here: 144 tokens, sized to the
        # mamba state page): several full blocks per prompt, shared prefixes again.
        prompts = [list((i * 3) % 1000 + 1 for i in range(n)) for n in (300, 450, 600)]
        prompts.append([(11 * i) % 900 + 50 for i in range(500)])
        return prompts, 16
    if name == "pressure":
        # Many long requests: far more KV than the small CPU tier and capture budget hold.
        prompts = [[(r * 131 + i * 7) % 1000 + 3 for i in range(1500)] for r in range(96)]
        return prompts, 32
    raise SystemExit(f"unknown workload {name}")


def engine_kwargs(args: argparse.Namespace) -> dict:
    kw: dict = dict(
        model=args.model,
        load_format="dummy",
        enforce_eager=True,
        max_model_len=4096,
        skip_tokenizer_init=True,
        attention_backend="TRITON_ATTN",
        dtype="bfloat16",
        max_num_seqs=args.max_num_seqs,
        seed=0,
        enable_prefix_caching=True,
        kv_cache_memory_bytes=args.kv_cache_gb << 30,
        # Engines share the GPU: vLLM still refuses to start when free memory is below
        # gpu_memory_utilization x total (0.92 by default; seen on the H200 with 10 engines).
        gpu_memory_utilization=0.2,
        tensor_parallel_size=args.tp,
    )
    if args.hybrid:
        kw["mamba_cache_mode"] = "align"
    if args.eagle:
        kw["speculative_config"] = {
            "method": "eagle",
            "model": args.eagle,
            "num_speculative_tokens": 2,
        }
    if args.connector:
        extra = {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": args.cpu_bytes,
            "blocks_per_chunk": 1,
            "offload_prompt_only": False,
            "secondary_tiers": [],
        }
        if os.environ.get("GLM53_KV_OFFLOAD") == "1":
            # As docker/launch.sh gives it with the tier on: the spec named through the
            # writer's module (the boot guard), which resolves to TieringOffloadingSpec.
            extra["spec_name"] = "StoreLocalOffloadingSpec"
            extra["spec_module_path"] = (
                "vllm.distributed.kv_transfer.kv_connector.v1.offloading.kv_store_local"
            )
        kw["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }
    return kw


def logprob_steps(output) -> list[list[list]]:
    """[[token, logprob], ...] top-20 per step, sorted by token id."""
    steps = []
    for step in output.outputs[0].logprobs or []:
        steps.append(sorted([int(t), float(lp.logprob)] for t, lp in step.items()))
    return steps


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workload", default="small")
    p.add_argument("--connector", action="store_true")
    p.add_argument("--cpu-bytes", type=int, default=1 << 30)
    p.add_argument("--kv-cache-gb", type=int, default=2)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--hybrid", action="store_true")
    p.add_argument("--eagle", default="")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--probe", action="store_true", help="knob 1: inspect every worker")
    p.add_argument("--compare", action="store_true", help="compare chunk bytes to GPU")
    p.add_argument("--logprobs", type=int, default=20)
    p.add_argument("--warmup", action="store_true", help="one untimed generate first")
    args = p.parse_args()

    from vllm import LLM, SamplingParams

    result: dict = {"argv": sys.argv[1:], "pythonpath": os.environ.get("PYTHONPATH")}
    result["knob"] = os.environ.get("GLM53_KV_OFFLOAD")
    t0 = time.time()
    llm = LLM(**engine_kwargs(args))
    result["engine_up_s"] = round(time.time() - t0, 2)
    print(f"ENGINE_UP {result['engine_up_s']}s", flush=True)
    if args.probe:
        result["install"] = llm.collective_rpc(probe.install_recorder)
        print("PROBE_INSTALLED", result["install"], flush=True)

    prompts, max_tokens = workload(args.workload)
    sp = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        logprobs=args.logprobs or None,
    )
    requests = [{"prompt_token_ids": ids} for ids in prompts]
    if args.warmup:
        # Kernels (Triton JIT) compiled before timing, on prompts sharing nothing with the
        # timed ones, so a run's timing does not depend on which run compiled first.
        warm = [{"prompt_token_ids": [(r * 17 + i) % 1000 + 5 for i in range(1200)]}
                for r in range(4)]  # fmt: skip
        llm.generate(warm, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    rounds = []
    for rnd in range(2):
        t = time.time()
        outs = llm.generate(requests, sp, use_tqdm=False)
        dt = time.time() - t
        generated = sum(len(o.outputs[0].token_ids) for o in outs)
        prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
        rounds.append(
            {
                "seconds": round(dt, 4),
                "generated_tokens": generated,
                "prompt_tokens": prompt_tokens,
                "tokens_per_s": round((generated + prompt_tokens) / dt, 1),
                "output_tokens_per_s": round(generated / dt, 1),
                "tokens": [list(o.outputs[0].token_ids) for o in outs],
                "logprobs": [logprob_steps(o) for o in outs] if args.logprobs else [],
            }
        )
        print(f"GEN round{rnd} {dt:.3f}s {generated} tokens", flush=True)
    result["rounds"] = rounds
    if args.probe:
        result["workers"] = llm.collective_rpc(
            probe.inspect_worker, kwargs={"compare": args.compare}
        )
        for w in result["workers"]:
            print("WORKER", json.dumps({k: v for k, v in w.items() if k != "jobs"}))
    with open(args.out, "w") as f:
        json.dump(result, f)
    print("STAGE_OK", flush=True)
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
