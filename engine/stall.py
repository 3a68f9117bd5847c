"""Decoders beside a restore: does a long prefix read from the store stall the requests
that are already generating?

Run in the stage's engine (in-process, LLM.llm_engine stepped by hand): ``decoders``
requests with short prompts of their own generate alone for ``alone_steps`` steps; then
the long prompt (one the store holds) arrives; the steps until the scheduler gives it
tokens to compute are the restore window; the steps from that one to the one that
reports it finished run its prefill tail (the tokens after the last restored chunk, which
vLLM computes as it would in any prefill) and are reported apart; then ``after_steps``
more. With async scheduling (0.34.0) the finish is reported a step after the tail ran,
so the step that scheduled it is found from the scheduler's output (run 53: classed by
the finish alone, the tail's 252 ms step was counted in the window). Each decoder's
inter-token gaps are timed at the step that returned the token.

Each step from three before the long prompt arrives to three after its tail is traced:
its wall time and the milliseconds spent in the scheduler, the model, vLLM's connector
and our hooks (engine/steptimer.py), so a slow step says where its time went.
"""

from __future__ import annotations

import collections
import random
import time
from typing import Any

import steptimer

WARM_STEPS = 20  # the decoders' own prefills and first steps are not timed
TRACE_AROUND = 3  # steps traced before the long prompt arrives and after its tail
LONG = "stall-long"


def _count_long_tokens(engine: Any, long_ids: set[str]) -> list[int]:
    """A counter of the long request's tokens each ``schedule()`` gives it (vLLM's
    SchedulerOutput.num_scheduled_tokens), read and reset by the caller each step; none
    when the scheduler is not in this process. The scheduler knows the request by the
    engine's id for it (``long_ids``, which the caller fills in when it adds it): vLLM
    adds eight random characters to the id it was given (run 57 counted none by ours)."""
    scheduler = getattr(steptimer.engine_core(engine), "scheduler", None)
    if scheduler is None:
        return []
    counter, inner = [0], scheduler.schedule

    def schedule(*args, **kwargs):
        out = inner(*args, **kwargs)
        tokens = getattr(out, "num_scheduled_tokens", None) or {}
        counter[0] += sum(n for rid, n in tokens.items() if rid in long_ids)
        return out

    scheduler.schedule = schedule
    return counter


def _summary(gaps: list[float]) -> dict:
    if not gaps:
        return {"gaps": 0}
    xs = sorted(gaps)

    def pick(q: float) -> float:
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 5)

    return {
        "gaps": len(xs),
        "p50_s": pick(0.5),
        "p99_s": pick(0.99),
        "max_s": round(xs[-1], 5),
    }


def run(llm, long_prompt: list[int], decoders: int, alone_steps: int = 200,
        after_steps: int = 50, prompt_tokens: int = 512,
        sampling: Any = None) -> dict:  # fmt: skip
    """The decoders' gaps alone, in the restore window and after, and the window's
    length; the long request's cached tokens (what the restore gave it). ``sampling``:
    vLLM's SamplingParams unless given."""
    if sampling is None:
        from vllm import SamplingParams as sampling

    engine = llm.llm_engine
    rng = random.Random(time.time_ns())
    decode = sampling(max_tokens=8192, ignore_eos=True, detokenize=False)
    once = sampling(max_tokens=1, detokenize=False)
    names = [f"stall-dec{i}" for i in range(decoders)]
    for name in names:
        ids = [rng.randrange(5, 30000) for _ in range(prompt_tokens)]
        engine.add_request(name, {"prompt_token_ids": ids}, decode)
    produced = dict.fromkeys(names, 0)
    last: dict[str, float] = {}
    gaps: dict[str, list[float]] = {"alone": [], "restore": [], "tail": [], "after": []}
    phase, steps, arrival, window_s, tail_s, cached = "alone", 0, 0.0, None, None, None
    after = 0
    timed = steptimer.install(llm)
    long_ids: set[str] = set()
    long_tokens = _count_long_tokens(engine, long_ids)
    tail_start = None
    trace: list[dict] = []
    before_arrival: collections.deque = collections.deque(maxlen=TRACE_AROUND)
    alone_steps_s: list[float] = []
    while True:
        spent0 = steptimer.snapshot()
        start = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        steps += 1
        step = {
            "phase": phase,
            "step_ms": round((now - start) * 1e3, 3),
            "in_ms": steptimer.spent(spent0, steptimer.snapshot()),
        }
        if phase == "alone":
            before_arrival.append(step)
            if steps > WARM_STEPS:
                alone_steps_s.append(now - start)
        elif phase in ("restore", "tail") or after < TRACE_AROUND:
            trace.append(step)
        scheduled = long_tokens[0] if long_tokens else 0
        if long_tokens:
            long_tokens[0] = 0
        if phase == "restore" and scheduled:  # its tail runs from this step on
            phase, window_s, tail_start = "tail", start - arrival, start
        long = [o for o in outputs if o.request_id == LONG and o.finished]
        finished_long = bool(long) and phase in ("restore", "tail")
        if finished_long and tail_start is None:  # no scheduler seen: the finish
            window_s, tail_start = start - arrival, start
        if finished_long or phase == "tail":
            step["phase"] = "tail"
            if scheduled:
                step["long_tokens"] = scheduled
        if long:
            cached = long[0].num_cached_tokens
        for out in outputs:
            count = len(out.outputs[0].token_ids)
            if out.request_id in produced and count > produced[out.request_id]:
                produced[out.request_id] = count
                if out.request_id in last and steps > WARM_STEPS:
                    gaps[step["phase"]].append(now - last[out.request_id])
                last[out.request_id] = now
        if phase == "alone" and steps >= alone_steps:
            long_ids.add(
                engine.add_request(LONG, {"prompt_token_ids": long_prompt}, once)
            )
            phase, arrival = "restore", now
            trace.extend(before_arrival)
        elif finished_long:
            phase, tail_s = "after", now - tail_start
        elif phase == "after":
            after += 1
            if after >= after_steps:
                break
    engine.abort_request(names)
    while engine.has_unfinished_requests():
        engine.step()
    alone = _summary(gaps["alone"])
    restore = _summary(gaps["restore"])
    ratio = (
        round(restore["p99_s"] / alone["p99_s"], 3)
        if restore.get("p99_s") and alone.get("p99_s")
        else None
    )
    return {
        "decoders": decoders,
        "long_tokens": len(long_prompt),
        "long_cached_tokens": cached,
        "restore_window_s": round(window_s, 4) if window_s is not None else None,
        "tail_step_s": round(tail_s, 4) if tail_s is not None else None,
        "alone": alone,
        "restore": restore,
        "tail": _summary(gaps["tail"]),
        "after": _summary(gaps["after"]),
        "p99_restore_vs_alone": ratio,
        "alone_step_s": _summary(alone_steps_s),
        "timed": timed,
        "trace": trace,
    }
