"""The GPU suite: runs engine/stage.py in the configurations below and judges the results.

    python3 engine/suite.py --pristine /tmp/v --patched /tmp/vp --site /tmp/site \
        --kvstore BIN --out DIR [--only NAME,...] [--gpus N]

Each stage is its own process (a fresh engine), its log and JSON under DIR/logs/. Stages of
one wave run side by side on GPU 0 (each engine gets a fixed KV-cache size, so they do not
size themselves from free memory); the throughput pair runs alone, one after the other.
DIR/results.json holds every stage's result and every check; DIR/summary.txt the verdicts.
Exit 0 when every check of every stage that ran passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "models")


@dataclass
class Stage:
    name: str
    model: str
    tree: str  # "pristine" or "patched"
    knob: str | None  # GLM53_KV_OFFLOAD, None = unset
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    wave: int = 1
    gpus: int = 1
    timeout: int = 240

    @property
    def probe(self) -> bool:
        return self.knob == "1"


def stages() -> list[Stage]:
    llama, lfm2, nemo = (os.path.join(MODELS, m) for m in ("llama", "lfm2", "nemotronh"))
    big = os.path.join(MODELS, "llama-big")
    eagle = ["--eagle", os.path.join(MODELS, "eagle-llama")]
    hyb = ["--hybrid"]
    small = ["--connector", "--cpu-bytes", str(256 << 20)]
    probe = ["--probe", "--compare"]
    mp = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    press = ["--connector", "--cpu-bytes", str(512 << 20), "--workload", "pressure",
             "--kv-cache-gb", "8", "--logprobs", "0", "--max-num-seqs", "32",
             "--warmup"]  # fmt: skip
    out = []
    for model, path, extra in (
        ("llama", llama, []),
        ("lfm2", lfm2, hyb),
        ("nemotronh", nemo, hyb + ["--workload", "long"]),
        ("eagle", llama, eagle),
    ):
        out.append(Stage(f"{model}.pristine", path, "pristine", None, small + extra))
        out.append(Stage(f"{model}.knob0", path, "patched", "0", small + extra))
        out.append(Stage(f"{model}.knob1", path, "patched", "1", small + extra + probe))
    out.append(
        Stage("eagle.knob1-drafter", llama, "patched", "1", small + eagle + probe,
              env={"GLM53_KV_OFFLOAD_DRAFTER": "1"})  # fmt: skip
    )
    out.append(Stage("llama.mp", llama, "patched", "1", small + probe, mp, wave=2))
    out.append(Stage("lfm2.mp", lfm2, "patched", "1", small + hyb + probe, mp, wave=2))
    out.append(
        Stage("llama.tp2", llama, "patched", "1", small + probe + ["--tp", "2"], mp,
              wave=2, gpus=2)  # fmt: skip
    )
    out.append(
        Stage("lfm2.tp2", lfm2, "patched", "1", small + hyb + probe + ["--tp", "2"], mp,
              wave=2, gpus=2)  # fmt: skip
    )
    # Throughput tier off vs on, same workload, alone on the GPU, one after the other in the
    # order off, on, on, off (a drift over time cancels in the mean); the "on" runs are also
    # the pressure runs (small CPU tier, a burst far above the capture budget).
    for wave, name, knob in ((3, "pressure.off", "0"), (4, "pressure.on", "1"),
                             (5, "pressure.on2", "1"), (6, "pressure.off2", "0")):  # fmt: skip
        extra = ["--probe"] if knob == "1" else []
        out.append(Stage(name, big, "patched", knob, press + extra, wave=wave, timeout=300))
    return out


def run_wave(batch: list[Stage], opts: argparse.Namespace, logs: str) -> dict[str, dict]:
    procs = []
    for st in batch:
        env = dict(os.environ)
        tree = opts.pristine if st.tree == "pristine" else opts.patched
        env["PYTHONPATH"] = os.pathsep.join([HERE, tree, opts.site])
        env.update(
            PYTHONUNBUFFERED="1",
            VLLM_USE_FLASHINFER_SAMPLER="0",
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
            HF_HUB_OFFLINE="1",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            VLLM_ALLOW_INSECURE_SERIALIZATION="1",
            CUDA_VISIBLE_DEVICES="0,1" if st.gpus == 2 else "0",
        )
        for k in [k for k in env if k.startswith("GLM53_KV_OFFLOAD")]:
            del env[k]
        if st.knob is not None:
            env["GLM53_KV_OFFLOAD"] = st.knob
            if st.knob == "1":
                store = os.path.join(opts.stores, st.name)
                env.update(
                    GLM53_KV_OFFLOAD_DIR=store,
                    GLM53_KV_OFFLOAD_CPU_GB="1",
                    GLM53_KV_OFFLOAD_BUILD_ID="kvtier-engine-suite",
                )
        env.update(st.env)
        js = os.path.join(logs, st.name + ".json")
        log = open(os.path.join(logs, st.name + ".log"), "w")
        cmd = ["timeout", str(st.timeout), sys.executable, os.path.join(HERE, "stage.py"),
               "--model", st.model, "--out", js, *st.args]  # fmt: skip
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        procs.append((st, subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log, js))
    results = {}
    for st, proc, log, js in procs:
        rc = proc.wait()
        log.close()
        res: dict = {"rc": rc}
        if os.path.exists(js):
            with open(js) as f:
                res.update(json.load(f))
        with open(os.path.join(logs, st.name + ".log"), errors="replace") as f:
            text = f.read()
        res["eligible_lines"] = re.findall(r"KV offloading eligible groups: .*", text)
        res["writer_lines"] = re.findall(r"KV store: .*", text)[:12]
        res["errors"] = [
            ln for ln in text.splitlines() if re.search(r"Error|Traceback|FAILED", ln)
        ][:10]
        if st.probe and rc == 0:
            res["kvstore_verify"] = kvstore_verify(opts.kvstore, os.path.join(opts.stores, st.name))
        results[st.name] = res
        print(f"  {st.name}: rc={rc} up={res.get('engine_up_s')}s", flush=True)
    return results


def kvstore_verify(binary: str, root: str) -> dict:
    p = subprocess.run([binary, "verify", root], capture_output=True, text=True)
    return {"rc": p.returncode, "out": (p.stdout + p.stderr)[-1500:]}


def _logprobs(res: dict) -> list:
    return [r.get("logprobs") for r in res.get("rounds", [])]


def same_logprobs(a: dict, b: dict) -> dict:
    la, lb = _logprobs(a), _logprobs(b)
    steps = diff_steps = 0
    max_abs = 0.0
    for ra, rb in zip(la, lb, strict=False):
        for qa, qb in zip(ra or [], rb or [], strict=False):
            for sa, sb in zip(qa, qb, strict=False):
                steps += 1
                if [t for t, _ in sa] != [t for t, _ in sb]:
                    diff_steps += 1
                    continue
                for (_, va), (_, vb) in zip(sa, sb, strict=True):
                    max_abs = max(max_abs, abs(va - vb))
    shape = [[len(q) for q in r or []] for r in la] == [[len(q) for q in r or []] for r in lb]
    return {
        "steps": steps,
        "top20_token_sets_differ": diff_steps,
        "max_abs_logprob_diff": max_abs,
        "ok": bool(steps) and shape and diff_steps == 0 and max_abs == 0.0,
    }


def check_writer(res: dict, tp: int) -> dict:
    workers = res.get("workers") or []
    eligible = []
    for line in res.get("eligible_lines", []):
        m = re.search(r"groups: (\[[^\]]*\])", line)
        if m:
            eligible.append(json.loads(m.group(1)))
    installs = res.get("install") or []
    checks = {
        "workers": len(workers),
        "all_active": bool(workers) and all(w.get("active") for w in workers),
        "eligible_printed": eligible[:1],
        "writer_groups": [i.get("writer_groups") for i in installs],
        "offloaded_groups": [i.get("offloaded_groups") for i in installs],
    }
    checks["groups_match"] = bool(eligible) and all(
        i.get("writer_groups") == eligible[0] == i.get("offloaded_groups") for i in installs
    )
    cmp = [w.get("compare", {}) for w in workers]
    checks["compare"] = cmp
    # A key with no file is only allowed where keep-K retention removed a state payload.
    removed = [w.get("stats", {}).get("state_files_removed", 0) for w in workers]
    checks["bytes_equal"] = bool(cmp) and all(
        c.get("equal", 0) > 0
        and c.get("different", 1) == 0
        and c.get("shape", 1) == 0
        and c.get("no_file", 1) <= gone
        for c, gone in zip(cmp, removed, strict=True)
    )
    checks["ranks"] = sorted(w.get("rank", -1) for w in workers)
    checks["bases"] = sorted(w.get("base", "") for w in workers)
    checks["tp_groups"] = [w.get("tp_group") for w in workers]
    checks["ranks_ok"] = (
        len(workers) == tp
        and checks["ranks"] == list(range(tp))
        and len(set(checks["bases"])) == tp
        and all(w.get("tp_group") == [w.get("rank"), tp] for w in workers)
    )
    v = res.get("kvstore_verify", {})
    checks["kvstore_verify_rc"] = v.get("rc")
    checks["ok"] = (
        res.get("rc") == 0
        and checks["all_active"]
        and checks["groups_match"]
        and checks["bytes_equal"]
        and checks["ranks_ok"]
        and v.get("rc") == 0
    )
    return checks


def judge(results: dict[str, dict]) -> dict[str, dict]:
    verdicts: dict[str, dict] = {}
    for model in ("llama", "lfm2", "nemotronh", "eagle"):
        base = results.get(f"{model}.pristine")
        for variant in ("knob0", "knob1", "knob1-drafter"):
            other = results.get(f"{model}.{variant}")
            if base is None or other is None:
                continue
            name = f"{model}: {variant} logprobs == pristine"
            verdicts[name] = same_logprobs(base, other)
            verdicts[name]["ok"] = verdicts[name]["ok"] and base.get("rc") == 0 == other.get("rc")
    for name, res in results.items():
        if res.get("workers") is not None and not name.startswith("pressure"):
            tp = 2 if name.endswith("tp2") else 1
            verdicts[f"{name}: writer, groups, bytes, verify"] = check_writer(res, tp)
    offs = [results[n] for n in ("pressure.off", "pressure.off2") if n in results]
    ons = [results[n] for n in ("pressure.on", "pressure.on2") if n in results]
    if offs and ons and all(r.get("rounds") for r in offs + ons):
        def rate(r: dict) -> float:
            return r["rounds"][0]["tokens_per_s"]

        off_rate = sum(rate(r) for r in offs) / len(offs)
        on_rate = sum(rate(r) for r in ons) / len(ons)
        stats = [w.get("stats", {}) for r in ons for w in r.get("workers", [])]
        verdicts["throughput tier on / off (round 0, tokens/s, mean of the runs)"] = {
            "off_tokens_per_s": [rate(r) for r in offs],
            "on_tokens_per_s": [rate(r) for r in ons],
            "ratio": round(on_rate / off_rate, 3),
            "off_s": [r["rounds"][0]["seconds"] for r in offs],
            "on_s": [r["rounds"][0]["seconds"] for r in ons],
            "capture_seconds": [round(s.get("capture_seconds", 0.0), 3) for s in stats],
            "ok": True,
        }
        for r, name in zip(ons, ("pressure.on", "pressure.on2"), strict=False):
            st = [w.get("stats", {}) for w in r.get("workers", [])]
            toks = r["rounds"][0]["tokens"]
            full = all(len(t) == 32 for t in toks)
            verify = r.get("kvstore_verify", {}).get("rc")
            verdicts[f"{name}: all requests served, drops counted, store clean"] = {
                "requests_finished": len(toks),
                "all_full_length": full,
                "stats": st,
                "kvstore_verify_rc": verify,
                "ok": r.get("rc") == 0
                and full
                and sum(x.get("keys_dropped_budget", 0) for x in st) > 0
                and verify == 0,
            }
    return verdicts


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pristine", required=True)
    p.add_argument("--patched", required=True)
    p.add_argument("--site", required=True)
    p.add_argument("--kvstore", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--stores", default="/tmp/kvstores")
    p.add_argument("--only", default="", help="comma-separated stage names or prefixes")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--together", default="", help="waves to run as one, e.g. 1,2")
    opts = p.parse_args()
    logs = os.path.join(opts.out, "logs")
    os.makedirs(logs, exist_ok=True)
    wanted = [w for w in opts.only.split(",") if w]
    todo = [
        s
        for s in stages()
        if s.gpus <= opts.gpus
        and (not wanted or any(s.name == w or s.name.startswith(w + ".") for w in wanted))
    ]
    together = sorted(int(w) for w in opts.together.split(",") if w)
    for s in todo:
        if s.wave in together:
            s.wave = together[0]
    results: dict[str, dict] = {}
    t0 = time.time()
    for wave in sorted({s.wave for s in todo}):
        batch = [s for s in todo if s.wave == wave]
        print(f"== wave {wave}: {[s.name for s in batch]} t={time.time() - t0:.0f}s", flush=True)
        results.update(run_wave(batch, opts, logs))
    verdicts = judge(results)
    with open(os.path.join(opts.out, "results.json"), "w") as f:
        json.dump({"results": results, "verdicts": verdicts}, f, indent=1, default=str)
    lines = [f"{'PASS' if v.get('ok') else 'FAIL'}  {k}" for k, v in verdicts.items()]
    lines.append(f"suite wall time {time.time() - t0:.0f} s")
    with open(os.path.join(opts.out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if verdicts and all(v.get("ok") for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
