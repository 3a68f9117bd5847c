"""The GPU suite's comparisons of two stages' results: top-20 logprobs step by step (same
request, or the cold request of equal prefix hit) and the KV bytes' digests. Every judge that
says "== cold" or "== pristine" uses these (suite.py, suite_restore.py, suite_realsize.py).
"""

from __future__ import annotations

import json
import re


def _logprobs(res: dict) -> list:
    return [r.get("logprobs") for r in res.get("rounds", [])]


def compare_steps(a: list, b: list) -> tuple[int, int, float]:
    """Two requests' steps of [(token, logprob), ...] compared step by step: the steps,
    those whose top-20 token sets differ, and the largest logprob difference in the rest."""
    steps = differ = 0
    worst = 0.0
    for sa, sb in zip(a, b, strict=False):
        steps += 1
        if [t for t, _ in sa] != [t for t, _ in sb]:
            differ += 1
            continue
        for (_, va), (_, vb) in zip(sa, sb, strict=True):
            worst = max(worst, abs(va - vb))
    return steps, differ, worst


def same_logprobs(a: dict, b: dict) -> dict:
    la, lb = _logprobs(a), _logprobs(b)
    steps = diff_steps = 0
    max_abs = 0.0
    for ra, rb in zip(la, lb, strict=False):
        for qa, qb in zip(ra or [], rb or [], strict=False):
            n, differ, worst = compare_steps(qa, qb)
            steps, diff_steps, max_abs = (
                steps + n,
                diff_steps + differ,
                max(max_abs, worst),
            )
    shape = [[len(q) for q in r or []] for r in la] == [
        [len(q) for q in r or []] for r in lb
    ]
    return {
        "steps": steps,
        "top20_token_sets_differ": diff_steps,
        "max_abs_logprob_diff": max_abs,
        "ok": bool(steps) and shape and diff_steps == 0 and max_abs == 0.0,
    }


def cached_tokens(res: dict) -> list[list[int]]:
    return [list(r.get("num_cached_tokens") or []) for r in res.get("rounds", [])]


def matched_logprobs(cold: dict, other: dict) -> dict:
    """Every request of every round of `other` against the cold engine's same request in
    the round where it had the same number of cached (prefix-hit) tokens; the same round
    when none had. Exact equality of every top-20 token and logprob, every step."""
    cold_rounds, rounds = cold.get("rounds", []), other.get("rounds", [])
    cold_cached = cached_tokens(cold)
    steps = diff_steps = unmatched = 0
    max_abs = 0.0
    shape_ok = bool(rounds) and len(rounds) == len(cold_rounds)
    references = []
    for r, rnd in enumerate(rounds):
        refs = []
        for i, steps_i in enumerate(rnd.get("logprobs") or []):
            hit = (rnd.get("num_cached_tokens") or [None] * (i + 1))[i]
            ref = next((c for c, cc in enumerate(cold_cached) if i < len(cc) and cc[i] == hit),
                       None)  # fmt: skip
            if ref is None:
                unmatched += 1
                ref = r
            refs.append(ref)
            try:
                cold_i = cold_rounds[ref]["logprobs"][i]
            except (IndexError, KeyError, TypeError):
                shape_ok = False
                continue
            if len(cold_i) != len(steps_i):
                shape_ok = False
            n, differ, worst = compare_steps(cold_i, steps_i)
            steps, diff_steps, max_abs = (
                steps + n,
                diff_steps + differ,
                max(max_abs, worst),
            )
        references.append(refs)
    return {
        "steps": steps,
        "cold_round_per_request": references,
        "requests_without_a_cold_request_of_equal_hit": unmatched,
        "top20_token_sets_differ": diff_steps,
        "max_abs_logprob_diff": max_abs,
        "ok": bool(steps) and shape_ok and diff_steps == 0 and max_abs == 0.0,
    }


def offloaded_groups(res: dict) -> list[int] | None:
    """The KV cache groups the stage's engine offloads, from its scope line
    ("KV offloading eligible groups: [0, 1, 2, 3] of 5"); None if it printed none."""
    for line in res.get("eligible_lines") or []:
        m = re.search(r"eligible groups: (\[[^\]]*\])", line)
        if m:
            return json.loads(m.group(1))
    return None


def same_kv(cold: dict, other: dict) -> dict:
    """Round 0's KV digests of every full prompt block, per request, group and position,
    where both engines hold a block (a state group's null positions are skipped).

    Only the groups ``other`` offloads are compared when it says which: the tier stores
    and restores those. vLLM zeroes a restored request's blocks of the others (a drafter
    left out, the kpool tail ring: docs/overlays/kv-offload-restore.md), so their bytes
    differ from a computing engine's by design; the logprobs judge what they feed."""
    a = (cold.get("rounds") or [{}])[0].get("kv_digests") or []
    b = (other.get("rounds") or [{}])[0].get("kv_digests") or []
    groups = offloaded_groups(other)
    counts = {"compared": 0, "equal": 0, "different": 0, "missing": 0}
    where = []
    for i, (ra, rb) in enumerate(zip(a, b, strict=False)):
        if ra is None or rb is None:
            counts["missing"] += 1
            continue
        for g, (ga, gb) in enumerate(zip(ra, rb, strict=False)):
            if groups is not None and g not in groups:
                continue
            for pos, (da, db) in enumerate(zip(ga, gb, strict=False)):
                if da is None or db is None:
                    continue
                counts["compared"] += 1
                if da == db:
                    counts["equal"] += 1
                else:
                    counts["different"] += 1
                    where.append([i, g, pos])
    counts["requests"] = min(len(a), len(b))
    counts["groups"] = groups
    counts["different_at"] = where[:10]
    counts["ok"] = (
        counts["compared"] > 0
        and counts["different"] == 0
        and counts["missing"] == 0
        and len(a) == len(b)
    )
    return counts


def _first_logprobs(res: dict) -> list:
    rounds = res.get("rounds") or [{}]
    return rounds[0].get("logprobs") or []


def same_first_logprobs(cold: dict, other: dict) -> dict:
    """The first step's top-20 logprobs of every prompt, cold vs restored. Recorded, not
    judged: the cold engine prefilled every token, the restored one only the tail on top
    of the restored prefix (another attention split), so bit equality is not expected
    here; the KV bytes are (same_kv)."""
    n = diff = 0
    worst = 0.0
    for a, b in zip(_first_logprobs(cold), _first_logprobs(other), strict=False):
        steps, d, w = compare_steps(a, b)
        n, diff, worst = n + steps, diff + d, max(worst, w)
    return {"compared": n, "top20_sets_differ": diff, "max_abs": worst}
