"""The GPU suite's real-size stages and their judges, each engine alone on the GPU:
Llama-3.1-8B's and GLM-5.3's time to first token cold and restored (ttft.*), the stall
check, and the 8B's burst tier off / on (burst8b.*); real_size_judge gathers them with the
throughput stages' (suite_pressure.py: pressure.*).
Benchmarks mostly: their figures print, only what a verdict names can fail.
"""

from __future__ import annotations

import os

from suite_compare import same_first_logprobs, same_kv
from suite_models import GLM5
from suite_pressure import engine_cpu, throughput_judge, tokens_rate, turns_judge
from suite_stage import MODELS, Stage

LLAMA_8B = os.path.join(MODELS, "llama-8b")
GLM5_WIDE = os.path.join(MODELS, "glm5wide")
# Each TTFT set's chunk (blocks_per_chunk 1): the 8B's 16-token blocks; GLM-5.3 at
# real width gets 4,608-token blocks (the MLA page aligned to the KDA state's;
# tests/realsched/test_model_layouts.py checks vLLM's planner still says so).
TTFT_SETS = {"ttft.llama8b": 16, "ttft.glm5wide": 4608}
# The prompt lengths of the TTFT stages (TTFT_TOKENS=32768 for a shorter run).
TTFT_TOKENS = tuple(
    int(n) for n in os.environ.get("TTFT_TOKENS", "32768,126976").split(",")
)


# Two full chunks of vLLM's default 16,384-token prefill step, at two depths.
WARMUP_PREFILL = 32768
# The slow store: 128 MiB/s, so reading 30k tokens of the 8B shape (128 KiB a token)
# takes about 30 s against a recompute of about 5 s, and 127k about 120 s against 60.
SLOW_READ = 128 << 20
LEARN_PREFIX = 2048
# A declined prompt's time to first token may exceed cold's by this much.
SLOW_VS_COLD = 1.1
# The pristine and the writing engine's times to first token (both compute the prompt)
# agree within this, or the TTFT table is not judged sound.
COMPUTING_AGREE = 1.5
# The stall check: decoders beside a restore, and the goal for their p99 gap against
# their p99 alone (issue 44).
STALL_DECODERS = 8
STALL_GOAL = 1.25


def ttft_set(
    store: str,
    model: str,
    args: list[str],
    budget: dict[str, str],
    wave: int,
    models_site: bool = False,
) -> list[Stage]:
    """A model's time to first token: cold (pristine), then knob 1 writing the store,
    restoring it from disk (page cache evicted) and from the page cache; waves
    ``wave``..``wave+3``. ``args`` hold the stock connector's: the pristine engine drops
    them (it runs no tier)."""
    pristine = args[: args.index("--connector")] + args[args.index("--cpu-bytes") + 2 :]
    restore = budget | {"GLM53_KV_OFFLOAD_RESTORE": "1"}
    out = [
        Stage(f"{store}.cold", model, "pristine", None, pristine, wave=wave, timeout=480),
        Stage(f"{store}.write", model, "patched", "1", args + ["--probe"],
              budget | {"GLM53_KV_OFFLOAD_RESTORE": "0"}, wave=wave + 1, store=store,
              timeout=480),
        Stage(f"{store}.disk", model, "patched", "1", args + ["--restore-probe"],
              restore, wave=wave + 2, store=store, verify=False, before="evict",
              timeout=480),
        Stage(f"{store}.cache", model, "patched", "1", args + ["--restore-probe"],
              restore, wave=wave + 3, store=store, verify=False, before="warm",
              timeout=480),
    ]  # fmt: skip
    for st in out:
        st.models_site = models_site
    return out


def real_size_stages() -> list[Stage]:
    """Llama-3.1-8B's shape (dummy weights): time to first token cold, restored from disk
    and restored from the page cache (ttft.*), and a burst of long prompts tier off / on
    (burst8b.*). Each engine alone on the GPU; minutes of device time, so they run only
    when --only names their prefix (ttft, burst8b)."""
    long = ["--max-model-len", "131072", "--kv-cache-gb", "40", "--warmup"]

    # The warm-up's full prefill steps are what the restore cost guard predicts a
    # recompute from (issue 47: from the 48-144-token tails alone it could not).
    def timed(warmup: int) -> list[str]:
        return ["--workload", "ttft:" + ",".join(map(str, TTFT_TOKENS)),
                "--sequential", "--rounds", "1",
                "--warmup-prefill", str(warmup), "--thread-cpu"]  # fmt: skip

    ttft = long + timed(WARMUP_PREFILL)
    tier = ["--connector", "--cpu-bytes", str(24 << 30)]
    # A CPU tier and a capture budget that hold the longest prompt whole (15.5 GiB).
    budget = {"GLM53_KV_OFFLOAD_CPU_GB": "20", "GLM53_KV_OFFLOAD_CAPTURE_MIB": "16384"}
    on = budget | {"GLM53_KV_OFFLOAD_RESTORE": "1"}
    store = "ttft.llama8b"
    out = ttft_set(store, LLAMA_8B, ttft + tier, budget, wave=30)
    # A store slower than recomputing (reads paced to SLOW_READ): the first prompt's
    # first LEARN_PREFIX tokens restore, so the tier knows its read rate; then the
    # guard must decline every prompt, and each serves about as fast as cold.
    out.append(
        Stage(f"{store}.slow", LLAMA_8B, "patched", "1",
              ttft + tier + ["--restore-probe", "--slow-read", str(SLOW_READ),
                             "--learn-prefix", str(LEARN_PREFIX)],
              on, wave=36, store=store, verify=False, timeout=480)
    )  # fmt: skip
    # GLM-5.3 at real width (engine/models/glm5wide: four layers, the 3:1 KDA:MLA
    # pattern, 288 experts; about 62 GB of dummy weights, so an H100 holds it), its
    # KV small beside the 8B's: 8 GiB of GPU KV cache is room for 127k tokens.
    # GLM-5.3's mHC kernels (TileLang) compile for each prefill length: the warm-up
    # prefills the timed length, or the first engine compiles in its timed request (run 50).
    wide = ["--max-model-len", "131072", "--kv-cache-gb", "8", "--warmup"]
    wide += timed(max(WARMUP_PREFILL, *TTFT_TOKENS))
    out += ttft_set("ttft.glm5wide", GLM5_WIDE, wide + GLM5 + tier, budget, wave=40,
                    models_site=True)  # fmt: skip
    # The stall check (issue 44): eight decoders generate while the first prompt
    # restores from disk beside them (engine/stall.py).
    stall = Stage("ttft.glm5wide.stall", GLM5_WIDE, "patched", "1",
                  wide + GLM5 + tier + ["--restore-probe", "--stall", str(STALL_DECODERS)],
                  on, wave=44, store="ttft.glm5wide", verify=False, before="evict",
                  timeout=480)  # fmt: skip
    stall.models_site = True
    out.append(stall)
    burst = long + ["--workload", "burst", "--rounds", "1", "--logprobs", "0",
                    "--max-num-seqs", "16", "--thread-cpu"]  # fmt: skip
    # The same 8 GiB CPU tier both ways (launch.sh sizes the knob-1 one from CPU_GB).
    tier = ["--connector", "--cpu-bytes", str(8 << 30)]
    out += [
        Stage("burst8b.off", LLAMA_8B, "patched", "0", burst + tier, wave=34, timeout=420),
        Stage("burst8b.on", LLAMA_8B, "patched", "1", burst + tier + ["--probe"],
              {"GLM53_KV_OFFLOAD_CPU_GB": "8", "GLM53_KV_OFFLOAD_CAPTURE_MIB": "8192"},
              wave=35, before="disk-write", timeout=420),
    ]  # fmt: skip
    for s in out:
        s.diagnosis = True  # selected by prefix only: see selected()
    return out


def real_size_judge(results: dict[str, dict]) -> dict[str, dict]:
    """Every real-size verdict, in the order summary.txt lists them."""
    verdicts: dict[str, dict] = {}
    pressure = [n for n in sorted(results) if n.startswith("pressure.")]
    if any(results[n].get("rounds") for n in pressure):
        verdicts["throughput: CPU seconds by thread, round 0 (diagnosis)"] = {
            n: {
                "seconds": results[n]["rounds"][0]["seconds"],
                "thread_cpu": results[n]["rounds"][0].get("thread_cpu", {}),
                "sampled": results[n]["rounds"][0].get("sampled", {}),
            }
            for n in pressure
            if results[n].get("rounds")
        } | {"ok": True}
    verdicts.update(throughput_judge(results))
    verdicts.update(turns_judge(results))
    verdicts.update(ttft_judge(results))
    verdicts.update(slow_store_judge(results))
    verdicts.update(stall_judge(results))
    verdicts.update(burst_judge(results))
    return verdicts


def stall_judge(results: dict[str, dict]) -> dict[str, dict]:
    """Each stage that ran the stall check (engine/stall.py): the decoders' p99 gap
    while the long prompt restored against their p99 alone (a benchmark: the goal is
    STALL_GOAL). Judged: the stage ran, the long prompt was restored (at least one
    chunk cached) and the window held decoder steps to time."""
    verdicts = {}
    for name in sorted(results):
        st = results[name].get("stall")
        if st is None:
            continue
        store = name.rsplit(".", 1)[0]
        chunk = TTFT_SETS.get(store, 16)
        ratio = st.get("p99_restore_vs_alone")
        verdicts[f"{name}: decoders' pace beside a restore (benchmark)"] = {
            **st,
            "goal": STALL_GOAL,
            "goal_met": ratio is not None and ratio <= STALL_GOAL,
            "ok": results[name].get("rc") == 0
            and (st.get("long_cached_tokens") or 0) >= chunk
            and (st.get("restore") or {}).get("gaps", 0) > 0,
        }
    return verdicts


def slow_store_judge(results: dict[str, dict]) -> dict[str, dict]:
    """ttft.llama8b.slow: with reads paced far below the recompute, after one restore
    of LEARN_PREFIX tokens (the read rate measured), the guard declines every prompt,
    each recomputes (no more cached than the learned prefix) as fast as cold within
    SLOW_VS_COLD; its first logprobs against cold's are recorded."""
    cold, slow = results.get("ttft.llama8b.cold"), results.get("ttft.llama8b.slow")
    if not (cold and slow and cold.get("rounds") and slow.get("rounds")):
        return {}
    sched = slow.get("restore_scheduler") or {}
    rows = []
    for i, tokens in enumerate(TTFT_TOKENS):
        c = cold["rounds"][0]["request_seconds"][i]
        t = slow["rounds"][0]["request_seconds"][i]
        cached = slow["rounds"][0]["num_cached_tokens"][i]
        rows.append(
            {
                "tokens": tokens,
                "cold_s": c,
                "slow_s": t,
                "vs_cold": round(t / c, 3) if c else None,
                "cached_tokens": cached,
                "recomputed": cached <= (LEARN_PREFIX if i == 0 else 0),
            }
        )
    declined = sched.get("restores_declined") or 0
    lp = same_first_logprobs(cold, slow)
    stats = [w.get("stats", {}) for w in slow.get("restore_workers") or []]
    return {
        "ttft.llama8b.slow: a slow store declined, time to first token near cold": {
            "paced_bytes_per_s": SLOW_READ,
            "learn_prefix_s": slow.get("learn_prefix_s"),
            "read_rate_measured": [s.get("read_rate") for s in stats],
            "rows": rows,
            "restores_declined": declined,
            "estimate": sched.get("last_estimate"),
            "logprobs": lp,
            "ok": slow.get("rc") == 0
            and declined >= len(TTFT_TOKENS)
            and all(r["recomputed"] for r in rows)
            and all(
                r["vs_cold"] is not None and r["vs_cold"] <= SLOW_VS_COLD for r in rows
            ),
        }
    }


def ttft_judge(results: dict[str, dict]) -> dict[str, dict]:
    """Every TTFT set's verdicts (TTFT_SETS), those of the sets that ran."""
    verdicts: dict[str, dict] = {}
    for store, chunk in TTFT_SETS.items():
        verdicts.update(ttft_set_judge(results, store, chunk))
    return verdicts


def ttft_set_judge(results: dict[str, dict], store: str, chunk: int) -> dict[str, dict]:
    """Per prompt length: the TTFT cold, restored from disk and from the page cache, the
    restore's read phase against the plain parallel read of the same files in the same
    run; restored first-step logprobs and KV bytes must equal the cold engine's. A
    restore covers every full chunk (``chunk`` tokens) before the prompt's last token."""
    verdicts: dict[str, dict] = {}
    cold = results.get(f"{store}.cold")
    if not cold or not cold.get("rounds"):
        return verdicts
    write = results.get(f"{store}.write") or {}
    rows = []
    for i, tokens in enumerate(TTFT_TOKENS):
        row: dict = {
            "tokens": tokens,
            "cold_s": cold["rounds"][0]["request_seconds"][i],
        }
        if write.get("rounds"):
            row["write_engine_s"] = write["rounds"][0]["request_seconds"][i]
        rows.append(row)
    for kind in ("disk", "cache"):
        res = results.get(f"{store}.{kind}")
        if not res or not res.get("rounds"):
            continue
        stats = [w.get("stats", {}) for w in res.get("restore_workers") or []]
        plain = (res.get("before") or {}).get("plain_read", {})
        read_s = sum(s.get("read_seconds", 0.0) for s in stats)
        read_b = sum(s.get("bytes_restored", 0) for s in stats)
        timed = _timed_reads(stats, res.get("restore_before") or [])
        for i, row in enumerate(rows):
            t = res["rounds"][0]["request_seconds"][i]
            row[f"{kind}_s"] = t
            row[f"{kind}_speedup"] = round(row["cold_s"] / t, 2) if t else None
            row[f"{kind}_cached_tokens"] = res["rounds"][0]["num_cached_tokens"][i]
        lp = same_first_logprobs(cold, res)
        digested = any(res["rounds"][0].get("kv_digests") or [])
        kv = same_kv(cold, res) if digested else None
        # The writer engine's own blocks: what the store was written from. Restored ==
        # written is the tier's promise; cold == written says whether the two engines
        # computed the same bytes at all (another chunking or kernel would differ).
        kv_write = same_kv(write, res) if digested and write.get("rounds") else None
        verdicts[f"{store}.{kind}: restored, logprobs and KV bytes == cold"] = {
            "stats": stats,
            "estimate": _estimate_row(res, rows),
            "plain_read": plain,
            "read_phase_s": round(read_s, 3),
            "read_phase_bytes": read_b,
            "read_phase_gb_per_s": round(read_b / read_s / 1e9, 3) if read_s else None,
            "read_vs_plain": round(read_b / read_s / 1e9 / plain["best_gb_per_s"], 3)
            if read_s and plain.get("best_gb_per_s")
            else None,
            # The timed requests' jobs alone (the warm-up's restores left out).
            "timed_read": timed,
            "timed_read_vs_plain": round(timed["gb_per_s"] / plain["best_gb_per_s"], 3)
            if timed.get("gb_per_s") and plain.get("best_gb_per_s")
            else None,
            # Whether the files were still cached and what the kernel did meanwhile
            # (engine/memstat.py): the timed round's vmstat deltas, the cgroup before it.
            "vmstat": res["rounds"][0].get("vmstat"),
            "thread_cpu": res["rounds"][0].get("thread_cpu"),
            "memory": (res.get("memory") or {}).get("rounds"),
            "warmup_vmstat": (res.get("memory") or {}).get("warmup_vmstat"),
            "page_cache": (res.get("memory") or {}).get("page_cache"),
            # KVTIER_SUITE_SAMPLE_STACKS=1: each thread's kernel state while it read.
            "task_samples": [
                w.get("task_samples") for w in res.get("restore_workers") or []
            ],
            # KVTIER_SUITE_READ_REPLAY=1: the largest job's read run again, varied.
            "read_replay": [
                w.get("read_replay") for w in res.get("restore_workers") or []
            ],
            # KVTIER_SUITE_GIL_WATCH=1: when the GIL was held long, and each read's span.
            "gil_watch": [w.get("gil_watch") for w in res.get("restore_workers") or []],
            # KVTIER_SUITE_PYSPY=1: py-spy's samples of the GIL's holder over the round.
            "pyspy": res.get("pyspy"),
            "logprobs": lp,
            "kv": kv,
            "kv_vs_write": kv_write,
            "ok": res.get("rc") == 0
            and all(s.get("keys_restored", 0) > 0 for s in stats)
            and bool(stats)
            and (kv is None or kv["ok"])
            and (kv_write is None or kv_write["ok"]),
        }
    if write.get("rounds"):
        verdicts[f"{store}.write: store written, kvstore verify clean"] = {
            "stats": [w.get("stats", {}) for w in write.get("workers") or []],
            "kvstore_verify": write.get("kvstore_verify"),
            # Recorded, not judged: whether the pristine and the writing engine computed
            # the same KV bytes (the restore is judged against the writer's).
            "kv_vs_cold": same_kv(cold, write),
            "ok": write.get("rc") == 0
            and (write.get("kvstore_verify") or {}).get("rc") == 0,
        }
    # Every full chunk of each prompt reached the store (the tail of the last request
    # included, written at the clean shutdown): a restore then covers the prompt up to the
    # chunk holding its last token, which vLLM always computes.
    covered = {
        kind: [
            (row.get(f"{kind}_cached_tokens") or 0)
            >= (row["tokens"] - 1) // chunk * chunk
            for row in rows
        ]
        for kind in ("disk", "cache")
        if f"{kind}_s" in rows[0]
    }
    if covered:
        verdicts[f"{store}: each prompt restored up to its last chunk"] = {
            "covered": covered,
            "ok": all(all(v) for v in covered.values()),
        }
    # Cold is the pristine engine's time; the writing engine computes the same prompt. Two
    # computing engines that disagree mean one of them did other work in its timed request
    # (run 50: the cold engine compiled TileLang kernels in it, 21.2 s against 1.59 s), and
    # a speedup over such a cold is not the tier's.
    for row in rows:
        if row.get("write_engine_s"):
            row["cold_vs_write_engine"] = round(
                row["cold_s"] / row["write_engine_s"], 2
            )
    verdicts[f"{store}: time to first token (s), cold vs restore (benchmark)"] = {
        "rows": rows,
        "computing_engines_agree_within": COMPUTING_AGREE,
        "ok": all(
            1 / COMPUTING_AGREE <= row.get("cold_vs_write_engine", 1) <= COMPUTING_AGREE
            for row in rows
        ),
    }
    return verdicts


def _timed_reads(after: list[dict], before: list[dict]) -> dict:
    """The read jobs between the stats taken before the timed rounds and after them,
    summed over ranks: seconds, bytes and each job's (keys, bytes, seconds)."""
    jobs: list = []
    for i, s in enumerate(after):
        b = before[i] if i < len(before) and before[i] else {}
        new = s.get("jobs_ok", 0) - b.get("jobs_ok", 0)  # a measured job is an ok one
        jobs += (s.get("job_reads") or [])[-new:] if new > 0 else []
    seconds = sum(j[2] for j in jobs)
    nbytes = sum(j[1] for j in jobs)
    return {
        "jobs": jobs,
        "seconds": round(seconds, 4),
        "bytes": nbytes,
        "gb_per_s": round(nbytes / seconds / 1e9, 3) if seconds else None,
    }


def _estimate_row(res: dict, rows: list[dict]) -> dict | None:
    """The cost guard's last estimate (the longest prompt's: they run shortest first)
    beside what it predicts: recompute against the cold TTFT, the read against the read
    phase. The steps its prefill fit saw stay in results.json (issue 47)."""
    sched = res.get("restore_scheduler") or {}
    est = sched.get("last_estimate")
    if not est:
        return None
    cold = rows[-1]["cold_s"]
    return {
        "tokens": est.get("tokens"),
        "recompute_s": est.get("recompute_s"),
        "cold_s": cold,
        "recompute_vs_cold": round(est["recompute_s"] / cold, 2) if cold else None,
        "read_s": est.get("read_s"),
        "restore": est.get("restore"),
        "prefill_steps": est.get("prefill_steps"),
        "prefill_trimmed": est.get("prefill_trimmed"),
        "prefill_fit": est.get("prefill_fit"),
        # lookups the guard could not weigh (no read rate yet, or prefill steps
        # too short to predict this one's): each restored unweighed
        "unmeasured": sched.get("restores_unmeasured"),
    }


def burst_judge(results: dict[str, dict]) -> dict[str, dict]:
    """Llama-3.1-8B's shape, 16 x 16k tokens at once, tier off vs on: tokens/s, the engine
    thread's CPU, and the writer's bytes per second against the disk's plain sequential
    write + fsync measured just before (a benchmark; every key must be accounted for)."""
    off, on = results.get("burst8b.off"), results.get("burst8b.on")
    if not (off and on and off.get("rounds") and on.get("rounds")):
        return {}
    stats = [w.get("stats", {}) for w in on.get("workers", [])]
    written = sum(s.get("bytes_written", 0) for s in stats)
    write_s = max((s.get("write_seconds", 0.0) for s in stats), default=0.0)
    disk = (on.get("before") or {}).get("disk_write", {})
    writer_rate = written / write_s / 1e9 if write_s else None
    return {
        "burst8b: tier on / off, writer vs disk (benchmark)": {
            "off_tokens_per_s": tokens_rate(off),
            "on_tokens_per_s": tokens_rate(on),
            "ratio": round(tokens_rate(on) / tokens_rate(off), 3),
            "engine_thread_cpu": [engine_cpu(off), engine_cpu(on)],
            "writer_bytes": written,
            "writer_seconds": round(write_s, 3),
            "writer_gb_per_s": round(writer_rate, 3) if writer_rate else None,
            "disk_write": disk,
            "writer_vs_disk": round(writer_rate / disk["gb_per_s"], 3)
            if writer_rate and disk.get("gb_per_s")
            else None,
            "stats": stats,
            "kvstore_verify_rc": on.get("kvstore_verify", {}).get("rc"),
            "ok": on.get("rc") == 0 == off.get("rc"),
        }
    }
