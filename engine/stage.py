"""One engine run of the GPU suite: a tiny model with dummy weights on a real pinned vLLM release.

    python3 engine/stage.py --model engine/models/llama --connector --out R.json [...]
    python3 engine/stage.py --model ... --connector-json PLAN.json --out R.json [...]   (knob 1)

The interpreter's path decides which tree runs (pristine or patched; engine/device.sh sets
PYTHONPATH), the environment decides the knob (GLM53_KV_OFFLOAD*). With the knob at 1 the
connector config is docker/launch.sh plan's, read from the file --connector-json names (the
suite writes it from the plan's argv); --connector is vLLM's stock CPU offloading, for the
pristine and knob-0 stages only. The run records, into the
JSON file given by --out:
  - per generated step, the top-20 logprobs of every request (tokens alone prove nothing: the
    dummy models echo the last prompt token);
  - tokens/s of the generate call and the engine start time;
  - with --probe (knob 1): on every worker (in-process, multi-process or TP ranks alike,
    through LLM.collective_rpc), the writer's state, its stats, the eligible groups, and for
    every store job the worker saw, the payload of each chunk file compared byte for byte with
    the KV-cache bytes of the GPU block the scheduler stored it from, read straight from the
    engine's KV-cache tensors (engine/probe.py);
  - the host's memory counters (engine/memstat.py): snapshots at boot, once up, before the
    timed rounds and at the end, and each round's vmstat deltas (page-cache refaults, faults,
    reclaim: what a read "from the page cache" really did);
  - with --stall, instead of the timed rounds, decoders' inter-token gaps beside a restore
    (engine/stall.py);
  - with KVTIER_SUITE_PYSPY=1, py-spy's samples of the thread holding the GIL over the timed
    rounds (engine/pyspy.py): the file beside --out (.pyspy.txt), a summary as "pyspy".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import memstat  # noqa: E402
import metrics_check  # noqa: E402
import probe  # noqa: E402  (the functions collective_rpc sends to the workers)
import pyspy  # noqa: E402
import stall  # noqa: E402
import steptimer  # noqa: E402
from turns import Turns  # noqa: E402


def workload(name: str, rnd: int = 0) -> tuple[list[list[int]], int]:
    """Prompts (token ids) and max_tokens of a named workload (round ``rnd``: the
    pressure burst is new in every round, the others repeat)."""
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
    if name == "blocks":
        # For KV blocks of 192-512 tokens (Qwen3-Next's attention block sized to its
        # gated-DeltaNet state page; GLM-5.3's on FlashMLA sparse): 2-10 full blocks a
        # prompt, shared prefixes again (the "small" prompts fill none, so nothing is stored).
        prompts = [
            list((i * 5) % 1000 + 1 for i in range(n)) for n in (1100, 1600, 2100)
        ]
        prompts.append([(13 * i) % 900 + 50 for i in range(1500)])
        return prompts, 16
    if name.startswith("ttft:"):
        # Long prompts for the time-to-first-token stages, one per length; no two share
        # a first token, so no prompt is a prefix hit of another.
        lengths = [int(n) for n in name[5:].split(",")]
        prompts = [
            [(r * 977 + i * 13 + 1) % 120000 + 2 for i in range(n)]
            for r, n in enumerate(lengths)
        ]
        return prompts, 1
    if name == "burst":
        # Sixteen long prompts at once on a real model shape: the write path under a
        # store burst of about 32 GiB of KV (Llama-3.1-8B's shape).
        prompts = [
            [(r * 389 + i * 11 + 5) % 120000 + 2 for i in range(16384)]
            for r in range(16)
        ]
        return prompts, 32
    if name == "pressure":
        # Many long requests: far more KV than the small CPU tier and capture budget hold.
        # Each round's own (no first token repeats in 10 rounds): a later round is
        # another burst, not prefix hits of the first.
        prompts = [
            [(r * 131 + i * 7) % 1000 + 3 for i in range(1500)]
            for r in range(96 * rnd, 96 * (rnd + 1))
        ]
        return prompts, 32
    raise SystemExit(f"unknown workload {name}")


def mtp_folder(model: str) -> str:
    """A folder whose config.json wraps the model's text config as GLM-5.3's checkpoint
    does (model_type glm5_next, the text config inside): vLLM derives the MTP drafter
    (Glm5NextMTPModel) from that outer config only. The same path in every stage (the
    store's folder is named after the model folder's)."""
    with open(os.path.join(model, "config.json")) as f:
        text = json.load(f)
    folder = os.path.join(tempfile.gettempdir(), "kvtier-mtp", os.path.basename(model))
    os.makedirs(folder, exist_ok=True)
    outer = {"architectures": text["architectures"], "model_type": "glm5_next"}
    fd, tmp = tempfile.mkstemp(dir=folder)  # stages of one wave write it side by side
    with os.fdopen(fd, "w") as f:
        json.dump({**outer, "text_config": text}, f)
    os.replace(tmp, os.path.join(folder, "config.json"))
    return folder


def engine_kwargs(args: argparse.Namespace) -> dict:
    kw: dict = dict(
        model=args.model,
        load_format="dummy",
        enforce_eager=True,
        max_model_len=args.max_model_len,
        skip_tokenizer_init=True,
        attention_backend=getattr(args, "attention_backend", "TRITON_ATTN"),
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
    if getattr(args, "metrics", False):
        kw["disable_log_stats"] = False  # the stat loggers fill what get_metrics reads
    if args.hybrid:
        kw["mamba_cache_mode"] = "align"
    if getattr(args, "additional_config", ""):
        # e.g. GLM-5.3's KDA prefill on its Triton kernels ({"kda_prefill_backend": "triton"})
        kw["additional_config"] = json.loads(args.additional_config)
    if getattr(args, "mtp", False):
        kw["model"] = mtp_folder(args.model)
        kw["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    if args.eagle:
        kw["speculative_config"] = {
            "method": "eagle",
            "model": args.eagle,
            "num_speculative_tokens": 2,
        }
    if args.connector_json:
        # Knob 1: the connector JSON docker/launch.sh plan wrote for this stage, verbatim
        # (engine/suite.py runs the plan and hands over its --kv-transfer-config line).
        with open(args.connector_json) as f:
            kw["kv_transfer_config"] = json.loads(f.read())
    elif args.connector:
        if os.environ.get("GLM53_KV_OFFLOAD") == "1":
            raise SystemExit(
                "stage.py: GLM53_KV_OFFLOAD=1 boots with docker/launch.sh plan's connector "
                "JSON (--connector-json FILE), never one built here"
            )
        # Stock vLLM CPU offloading (pristine and knob-0 stages): what an operator would
        # pass by hand to the unpatched engine, the same keys launch.sh sets.
        kw["kv_transfer_config"] = {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": "TieringOffloadingSpec",
                "cpu_bytes_to_use": args.cpu_bytes,
                "blocks_per_chunk": 1,
                "offload_prompt_only": False,
                "secondary_tiers": [],
            },
        }
    return kw


def engine_connector(llm) -> dict | None:
    """The connector config as the engine holds it after boot (the suite checks it is
    the one launch.sh planned)."""
    try:
        cfg = llm.llm_engine.vllm_config.kv_transfer_config
    except AttributeError as e:
        return {"error": f"not reachable: {e}"}
    if cfg is None:
        return None
    keys = ("kv_connector", "kv_role", "kv_connector_extra_config")
    return json.loads(json.dumps({k: getattr(cfg, k, None) for k in keys}, default=str))


def logprob_steps(output) -> list[list[list]]:
    """[[token, logprob], ...] top-20 per step, sorted by token id."""
    steps = []
    for step in output.outputs[0].logprobs or []:
        steps.append(sorted([int(t), float(lp.logprob)] for t, lp in step.items()))
    return steps


def scheduler_restore(llm) -> dict:
    """The restore tier's scheduler-side stats (in-process engine only)."""
    try:
        sched = llm.llm_engine.engine_core.engine_core.scheduler
        restore = sched.connector.connector_scheduler._kv_restore
    except AttributeError as e:
        return {"error": f"not reachable: {e}"}
    if restore is None:
        return {"restore": False}
    stats = restore.tier.stats
    return {
        "restore": True,
        "lookups": dict(stats.lookups),
        "promotions_ok": stats.promotions_ok,
        "promotions_failed": stats.promotions_failed,
        "promotions_fenced": stats.promotions_fenced,
        "keys_promoted": stats.keys_promoted,
        "keys_failed": stats.keys_failed,
        # Restore only when it pays (docs/overlays/kv-offload-restore.md).
        "restores_weighed": getattr(stats, "restores_weighed", None),
        "restores_declined": getattr(stats, "restores_declined", None),
        "restores_unmeasured": getattr(stats, "restores_unmeasured", None),
        "last_estimate": getattr(stats, "last_estimate", None),
    }


def record_block_ids(llm) -> dict[str, tuple]:
    """Wrap the scheduler's _free_request: the request's GPU block ids when it finishes
    (before any delayed free), by request id. In-process engine only."""
    sched = llm.llm_engine.engine_core.engine_core.scheduler
    seen: dict[str, tuple] = {}
    original = sched._free_request

    def free_request(request, *args, **kwargs):
        seen[request.request_id] = sched.kv_cache_manager.get_block_ids(
            request.request_id
        )
        return original(request, *args, **kwargs)

    sched._free_request = free_request
    return seen


def warm_prefill(llm, tokens: int) -> None:
    """A prompt no store holds (its tokens drawn anew in each process), so each of its
    chunks is a full prefill step the restore cost guard can time; then the same prompt
    and 16 tokens more, which runs what a restored request runs, a short prefill over a
    long cached prefix. The writer's bytes of it reach the disk before anything is
    timed."""
    from vllm import SamplingParams

    rng = random.Random(time.time_ns())
    ids = [rng.randrange(5, 30000) for _ in range(tokens)]
    # Four tokens: the guard times a step once the request is scheduled in the
    # two steps after it, so the last prefill chunk needs two decode steps behind it.
    sp = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": ids}], sp, use_tqdm=False)
    tail = ids + [rng.randrange(5, 30000) for _ in range(16)]
    llm.generate([{"prompt_token_ids": tail}], sp, use_tqdm=False)
    if not all(llm.collective_rpc(probe.wait_writer_idle)):
        print(
            "stage: the writer did not drain the warm-up within 120 s", file=sys.stderr
        )


def took_ablation(replies: list[dict], mode: str) -> bool:
    """Whether a worker's writer took ``--ablate mode`` (probe.ablate_writer's replies):
    an ablation that found no writer would otherwise pass for one that ran."""
    return any(r.get("ablated") == mode for r in replies)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workload", default="small")
    p.add_argument("--connector", action="store_true", help="stock CPU offloading")
    p.add_argument(
        "--connector-json",
        default="",
        help="a file holding the connector JSON to boot with, verbatim (knob 1)",
    )
    p.add_argument("--cpu-bytes", type=int, default=1 << 30)
    p.add_argument("--kv-cache-gb", type=int, default=2)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=2, help="timed rounds (TTFT: 1)")
    p.add_argument(
        "--no-digests",
        action="store_true",
        help="with --sequential: skip the KV digests (long prompts: seconds each)",
    )
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--hybrid", action="store_true")
    p.add_argument(
        "--attention-backend",
        default="TRITON_ATTN",
        help="TRITON_MLA for the MLA models (no FlashMLA / FlashInfer kernels carried)",
    )
    p.add_argument(
        "--additional-config", default="", help="vLLM additional_config JSON"
    )
    p.add_argument("--eagle", default="")
    p.add_argument(
        "--mtp",
        action="store_true",
        help="GLM-5.3's MTP drafter, one speculative token (the model folder's config "
        "wrapped as the checkpoint's outer config: mtp_folder)",
    )
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--probe", action="store_true", help="knob 1: inspect every worker")
    p.add_argument("--compare", action="store_true", help="compare chunk bytes to GPU")
    p.add_argument("--logprobs", type=int, default=20)
    p.add_argument("--warmup", action="store_true", help="one untimed generate first")
    p.add_argument(
        "--warmup-prefill",
        type=int,
        default=0,
        help="with --warmup: then one new prompt of this many tokens, and it again with "
        "16 more (the restore cost guard times full prefill steps, and the kernels of a "
        "short prefill over a long cached prefix compile before the timed requests)",
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="one request at a time (each request's prefix-hit split is then the same "
        "in every engine that holds the same prefixes), with the KV digests of its "
        "full prompt blocks read right after it finished (in-process engine only)",
    )
    p.add_argument("--restore-probe", action="store_true", help="record promotions")
    p.add_argument(
        "--metrics",
        action="store_true",
        help="after the probes: the tier's counters from vLLM's registry "
        "(LLM.get_metrics; the suite checks them against the probe)",
    )
    p.add_argument(
        "--thread-cpu",
        action="store_true",
        help="each round: CPU seconds of the process's threads, by name",
    )
    p.add_argument(
        "--sample",
        action="store_true",
        help="each round: sample the engine thread's Python stack (probe.start_sampler)",
    )
    p.add_argument(
        "--ablate",
        default="",
        help="diagnosis: 'capture' releases captured jobs unwritten (probe.py)",
    )
    p.add_argument(
        "--step-times",
        action="store_true",
        help="each round: the ms spent in the scheduler, the model, vLLM's connector "
        "and our hooks (engine/steptimer.py; an in-process engine)",
    )
    p.add_argument(
        "--turns",
        default="",
        help="GROUP:ROLE:ORDER (e.g. pressure.turns:on:off,on,ref): time each round "
        "in turn with the group's other engines on this GPU (engine/turns.py)",
    )
    p.add_argument(
        "--slow-read",
        type=int,
        default=0,
        help="bytes/s: the store library paces this process's chunk reads to it (a "
        "slow store for the restore cost guard, probe.slow_reads)",
    )
    p.add_argument(
        "--stall",
        type=int,
        default=0,
        help="instead of the timed rounds: this many decoders generate, then the "
        "workload's first prompt arrives and restores beside them (engine/stall.py)",
    )
    p.add_argument(
        "--learn-prefix",
        type=int,
        default=0,
        help="before the timed rounds: the first prompt's first N tokens, a restore "
        "the tier measures its read rate on",
    )
    args = p.parse_args()

    from vllm import LLM, SamplingParams

    result: dict = {"argv": sys.argv[1:], "pythonpath": os.environ.get("PYTHONPATH")}
    result["knob"] = os.environ.get("GLM53_KV_OFFLOAD")
    if args.connector_json:
        with open(args.connector_json) as f:
            result["connector_json"] = f.read()  # the text booted with, for the suite
    memory = {"boot": memstat.snapshot()}
    t0 = time.time()
    llm = LLM(**engine_kwargs(args))
    memory["up"] = memstat.snapshot()
    result["engine_up_s"] = round(time.time() - t0, 2)
    result["kv_transfer_config"] = engine_connector(llm)
    print(f"ENGINE_UP {result['engine_up_s']}s", flush=True)
    if args.probe:
        result["install"] = llm.collective_rpc(probe.install_recorder)
        print("PROBE_INSTALLED", result["install"], flush=True)
    if args.restore_probe:
        result["restore_install"] = llm.collective_rpc(probe.install_restore_recorder)
        print("RESTORE_PROBE_INSTALLED", result["restore_install"], flush=True)
    if args.ablate:
        result["ablate"] = llm.collective_rpc(probe.ablate_writer, args=(args.ablate,))
        print("ABLATED", result["ablate"], flush=True)
        if not took_ablation(result["ablate"], args.ablate):
            print(
                f"STAGE_FAIL --ablate {args.ablate}: no worker has a writer", flush=True
            )
            return 1
    if args.slow_read:
        result["slow_read"] = llm.collective_rpc(
            probe.slow_reads, args=(args.slow_read,)
        )
        print("SLOW_READ", result["slow_read"], flush=True)
    block_ids = record_block_ids(llm) if args.sequential else {}
    turns = None
    if args.turns:
        group, role, order = args.turns.split(":")
        folder = os.path.join(os.path.dirname(os.path.abspath(args.out)), group)
        turns = Turns(folder, role, order.split(","))

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
        llm.generate(
            warm, SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False
        )
        if args.warmup_prefill:
            warm_prefill(llm, args.warmup_prefill)
        block_ids.clear()  # the warm-up requests' blocks are not the timed ones
    if args.learn_prefix:
        t = time.time()
        learn = {"prompt_token_ids": prompts[0][: args.learn_prefix]}
        llm.generate(
            [learn], SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False
        )
        result["learn_prefix_s"] = round(time.time() - t, 4)
        block_ids.clear()
    if args.restore_probe:
        result["restore_before"] = llm.collective_rpc(probe.restore_stats)
        memory["page_cache"] = llm.collective_rpc(probe.page_cache)
    memory["rounds"] = memstat.snapshot()
    memory["warmup_vmstat"] = memstat.delta(memory["up"], memory["rounds"])
    if turns:
        turns.ready()
    spy = pyspy.start(args.out + ".pyspy.txt") if pyspy.enabled() else None
    if spy is not None:
        print("PYSPY_START", spy.get("error") or " ".join(spy["argv"]), flush=True)
    if args.stall:
        result["stall"] = stall.run(llm, prompts[0], args.stall)
        print("STALL", json.dumps(result["stall"]), flush=True)
    result["step_timed"] = steptimer.install(llm) if args.step_times else []
    rounds = []
    for rnd in range(0 if args.stall else args.rounds):
        waited = turns.wait(rnd) if turns else 0.0
        if rnd:
            prompts, _ = workload(args.workload, rnd)
            requests = [{"prompt_token_ids": ids} for ids in prompts]
        cpu0 = llm.collective_rpc(probe.thread_cpu)[0] if args.thread_cpu else {}
        mem0 = memstat.snapshot()
        steps0 = steptimer.snapshot()
        if args.sample:
            llm.collective_rpc(probe.start_sampler)
        t = time.time()
        digests = []
        request_seconds = []
        if args.sequential:
            outs = []
            for req in requests:
                t_req = time.time()
                (out,) = llm.generate([req], sp, use_tqdm=False)
                request_seconds.append(round(time.time() - t_req, 4))
                outs.append(out)
                # One request per call: the one the scheduler freed (its internal id may
                # carry a suffix the output's id lacks).
                ids = list(block_ids.values())[-1] if len(block_ids) == 1 else None
                block_ids.clear()
                digests.append(
                    llm.collective_rpc(
                        probe.block_digests,
                        args=([list(g) for g in ids], len(req["prompt_token_ids"])),
                    )[0]
                    if ids is not None and not args.no_digests
                    else None
                )
        else:
            outs = llm.generate(requests, sp, use_tqdm=False)
        dt = time.time() - t
        # The writer's backlog of this round drains before the next engine's turn,
        # so it does not slow the other engine's round (its time is recorded).
        t_drain = time.time()
        if turns and (args.probe or args.ablate):
            llm.collective_rpc(probe.wait_writer_idle)
        drain = time.time() - t_drain
        cpu1 = llm.collective_rpc(probe.thread_cpu)[0] if args.thread_cpu else {}
        vmstat = memstat.delta(mem0, memstat.snapshot())
        sampled = llm.collective_rpc(probe.stop_sampler)[0] if args.sample else {}
        generated = sum(len(o.outputs[0].token_ids) for o in outs)
        prompt_tokens = sum(len(o.prompt_token_ids) for o in outs)
        rounds.append(
            {
                "seconds": round(dt, 4),
                "started": round(t, 3),
                "turn_wait_s": round(waited, 3),
                "drain_s": round(drain, 3),
                "request_seconds": request_seconds,
                "generated_tokens": generated,
                "prompt_tokens": prompt_tokens,
                "tokens_per_s": round((generated + prompt_tokens) / dt, 1),
                "output_tokens_per_s": round(generated / dt, 1),
                "tokens": [list(o.outputs[0].token_ids) for o in outs],
                "logprobs": [logprob_steps(o) for o in outs] if args.logprobs else [],
                "num_cached_tokens": [o.num_cached_tokens for o in outs],
                "kv_digests": digests,
                "sampled": sampled,
                "vmstat": vmstat,
                "in_ms": steptimer.spent(steps0, steptimer.snapshot()),
                "thread_cpu": {
                    k: round(v - cpu0.get(k, 0.0), 2)
                    for k, v in cpu1.items()
                    if v - cpu0.get(k, 0.0) >= 0.01
                },
            }
        )
        print(f"GEN round{rnd} {dt:.3f}s {generated} tokens", flush=True)
        if turns:
            turns.done(rnd)
    result["rounds"] = rounds
    if spy is not None:
        result["pyspy"] = pyspy.stop(spy)
        print("PYSPY", json.dumps({k: v for k, v in result["pyspy"].items()
              if k not in ("top", "top_leaves", "argv")}), flush=True)  # fmt: skip
    memory["end"] = memstat.snapshot()
    result["memory"] = memory
    if args.probe:
        result["workers"] = llm.collective_rpc(
            probe.inspect_worker, kwargs={"compare": args.compare}
        )
        for w in result["workers"]:
            print("WORKER", json.dumps({k: v for k, v in w.items() if k != "jobs"}))
    elif args.ablate:
        # What the ablated writer captured and dropped, beside the probed engine's.
        workers = llm.collective_rpc(probe.inspect_worker, kwargs={"compare": False})
        result["ablate_stats"] = [w.get("stats", {}) for w in workers]
    if args.restore_probe:
        result["restore_workers"] = llm.collective_rpc(probe.restore_report)
        result["restore_scheduler"] = scheduler_restore(llm)
        for w in result["restore_workers"]:
            print("RESTORE_WORKER", json.dumps({k: w[k] for k in ("stats", "manifests",
                  "manifests_bad") if k in w}))  # fmt: skip
        print("RESTORE_SCHEDULER", json.dumps(result["restore_scheduler"]))
    if args.metrics:
        result["metrics"] = metrics_check.scrape(llm)
        print("METRICS", json.dumps(result["metrics"]))
    with open(args.out, "w") as f:
        json.dump(result, f)
    print("STAGE_OK", flush=True)
    del llm
    return 0


if __name__ == "__main__":
    sys.exit(main())
