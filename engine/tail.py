"""Does the tail of the last request reach the store? (issue 29, on the GPU)

One long request with the tier on, then IDLE seconds with nothing to do, then a clean
shutdown of the engine. Counts the request's chunk files and the newest manifest's boundary
after the idle time and after the shutdown, and prints them as one JSON line. Run with
PYTHONPATH=<patched tree>:<site> and GLM53_KV_OFFLOAD=1, GLM53_KV_OFFLOAD_DIR=<store>;
VLLM_ENABLE_V1_MULTIPROCESSING says which engine loop (0: the offline in-process engine,
1: the engine core's busy loop in its own process).

    python3 engine/tail.py --model engine/models/llama-big --tokens 3000 --chunk 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import stage  # noqa: E402  (engine_kwargs: the suite's engine settings)

BLOCK = 16  # vLLM's default block size on CUDA; blocks_per_chunk is 1


def on_disk(store: str) -> dict:
    root = Path(store)
    chunks = sum(1 for p in root.rglob("*.bin") if ".tmp." not in p.name)
    boundaries = [
        json.loads(p.read_bytes())["boundary"] for p in root.glob("*/manifests/*.json")
    ]
    return {"chunks": chunks, "newest_boundary": max(boundaries, default=0)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=3000)
    p.add_argument("--chunk", type=int, default=1024, help="max_num_batched_tokens")
    p.add_argument("--idle", type=float, default=10.0)
    p.add_argument("--kv-cache-gb", type=int, default=4)
    args = p.parse_args()

    from vllm import LLM, SamplingParams

    ns = argparse.Namespace(
        model=args.model,
        max_num_seqs=4,
        kv_cache_gb=args.kv_cache_gb,
        tp=1,
        hybrid=False,
        eagle=None,
        connector=True,
        cpu_bytes=1 << 30,
    )
    kw = stage.engine_kwargs(ns)
    kw.update(max_num_batched_tokens=args.chunk, enable_chunked_prefill=True)
    llm = LLM(**kw)
    prompt = [(i * 31) % 1000 + 3 for i in range(args.tokens)]
    t = time.time()
    llm.generate(
        [{"prompt_token_ids": prompt}],
        SamplingParams(max_tokens=1, ignore_eos=True, detokenize=False),
        use_tqdm=False,
    )
    generate_s = time.time() - t
    time.sleep(args.idle)
    store = os.environ["GLM53_KV_OFFLOAD_DIR"]
    idle = on_disk(store)
    t = time.time()
    llm.llm_engine.engine_core.shutdown()
    shutdown_s = time.time() - t
    print(
        "TAIL",
        json.dumps(
            {
                "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING"),
                "tokens": args.tokens,
                "max_num_batched_tokens": args.chunk,
                "full_blocks": args.tokens // BLOCK,
                "generate_s": round(generate_s, 2),
                "idle_s": args.idle,
                "after_idle": idle,
                "after_shutdown": on_disk(store),
                "shutdown_s": round(shutdown_s, 2),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
