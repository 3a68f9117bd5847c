"""The GPU suite: runs engine/stage.py in the configurations below and judges the results.

    python3 engine/suite.py --pristine /tmp/v --patched /tmp/vp --site /tmp/site \
        --kvstore BIN --out DIR [--only NAME,...] [--gpus N]

Each stage is its own process (a fresh engine), its log and JSON under DIR/logs/. Stages of
one wave run side by side on GPU 0 (each engine gets a fixed KV-cache size, so they do not
size themselves from free memory); the throughput pair runs alone, one after the other.
DIR/results.json holds every stage's result and every check; DIR/summary.txt the verdicts.
Exit 0 when every check of every stage that ran passed.

This file: the stage table of the tiny models and what --only / --together select from the
whole table (plan), the runner every stage shares (the launch.sh plan, the env, the
page-cache step) and the judge that calls every other. Apart: the Stage record
(suite_stage.py), the comparisons of two stages' logprobs and KV bytes (suite_compare.py),
the restore sets' judge (suite_restore.py), the real-size stages with their judges
(suite_pressure.py: pressure.*; suite_realsize.py: ttft.*, burst8b.*), the model stages (suite_models.py:
glm5next.*, dsv2lite.*, qwen3next.*), the plain disk speeds (diskspeed.py) and the model
stages' import probe (opsprobe.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import diskspeed  # noqa: E402
import metrics_check  # noqa: E402
from suite_compare import same_logprobs  # noqa: E402
from suite_models import NEW_MODELS, model_stages, ops_failed  # noqa: E402
from suite_pressure import pressure_stages  # noqa: E402
from suite_realsize import real_size_judge, real_size_stages  # noqa: E402
from suite_restore import (  # noqa: E402
    ENV_SUITE_KEY,
    corrupt_chunk,
    keyed,
    restore_judge,
    suite_key_file,
)
from suite_stage import CPU_GB, MODELS, Stage  # noqa: E402
from transfer import newest_release  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# The release the knob-1 stages plan for (launch.sh --engine): the newest pinned one, as
# engine/prepare.sh picks it; --engine picks another (device-b.sh passes the one
# engine/prepare.sh packed).
ENGINE = newest_release()


def stages() -> list[Stage]:
    llama, lfm2, nemo = (
        os.path.join(MODELS, m) for m in ("llama", "lfm2", "nemotronh")
    )
    eagle = ["--eagle", os.path.join(MODELS, "eagle-llama")]
    hyb = ["--hybrid"]
    small = ["--connector", "--cpu-bytes", str(256 << 20)]
    probe = ["--probe", "--compare"]
    mp = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
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
        Stage(
            "eagle.knob1-drafter",
            llama,
            "patched",
            "1",
            small + eagle + probe,
            env={"GLM53_KV_OFFLOAD_DRAFTER": "1"},
        )
    )
    out.append(Stage("llama.mp", llama, "patched", "1", small + probe, mp, wave=2))
    out.append(Stage("lfm2.mp", lfm2, "patched", "1", small + hyb + probe, mp, wave=2))
    out.append(
        Stage(
            "llama.tp2",
            llama,
            "patched",
            "1",
            small + probe + ["--tp", "2", "--metrics"],
            mp,
            wave=2,
            gpus=2,
        )
    )
    out.append(
        Stage(
            "lfm2.tp2",
            lfm2,
            "patched",
            "1",
            small + hyb + probe + ["--tp", "2"],
            mp,
            wave=2,
            gpus=2,
        )
    )
    out += pressure_stages()
    # Restore across a restart (docs/overlays/kv-offload-restore.md): engine 1 writes the
    # store and exits; engine 2, a new process on the same store with RESTORE=1, serves the
    # same prompts; then one payload byte of a chunk engine 2 restored is flipped and engine
    # 3 serves them again (it refuses the chunk, recomputes, and its store writes the chunk
    # anew); engine 4 restores again, the rewritten chunk included. One request at a time,
    # so every engine's request sees the same prefix-hit split as the cold engine's request
    # with the same hit (suite.restore_judge).
    seq = small + ["--sequential"]
    # The tier's counters from vLLM's registry after the stage, against the probe's.
    metrics = ["--metrics"]
    for model, path, extra in (("llama", llama, []), ("lfm2", lfm2, hyb)):
        store = f"restore.{model}"
        on = {"GLM53_KV_OFFLOAD_RESTORE": "1"}
        out += [
            Stage(f"{store}.cold", path, "pristine", None, seq + extra, wave=7, timeout=150),
            Stage(f"{store}.write", path, "patched", "1", seq + extra + probe + metrics,
                  env={"GLM53_KV_OFFLOAD_RESTORE": "0"}, wave=7, store=store, timeout=150),
            Stage(f"{store}.hit", path, "patched", "1",
                  seq + extra + ["--restore-probe"] + metrics,
                  env=on, wave=8, store=store, timeout=150),
            Stage(f"{store}.bad", path, "patched", "1", seq + extra + ["--restore-probe"],
                  env=on, wave=9, store=store, verify=False, corrupt=f"{store}.hit",
                  timeout=150),
            Stage(f"{store}.healed", path, "patched", "1", seq + extra + ["--restore-probe"],
                  env=on, wave=10, store=store, timeout=150),
        ]  # fmt: skip
    out += real_size_stages()
    out += model_stages()
    return out


def launch_plan(
    launcher: str, env: dict[str, str], model: str, workdir: str, engine: str = ENGINE
) -> dict:
    """`docker/launch.sh plan` for one rank, run under the stage's knobs: its connector JSON
    (the argument after --kv-transfer-config, as the plan wrote it) and its env lines."""
    out = os.path.join(workdir, "plan")
    cmd = ["bash", os.path.join(launcher, "docker", "launch.sh"), "plan", "--ranks", "0",
           "--out", out, "--engine", engine, "--", "vllm", "serve", model]  # fmt: skip
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    plan: dict = {"cmd": cmd, "rc": p.returncode, "stderr": p.stderr[-1500:]}
    if p.returncode != 0:
        return plan
    with open(os.path.join(out, "rank0", "argv")) as f:
        argv = f.read().splitlines()
    with open(os.path.join(out, "rank0", "env")) as f:
        plan["env"] = f.read().splitlines()
    if argv.count("--kv-transfer-config") != 1:
        plan["rc"] = -1
        plan["stderr"] = f"the plan's argv has no single --kv-transfer-config: {argv}"
        return plan
    plan["json"] = argv[argv.index("--kv-transfer-config") + 1]
    return plan


def launcher_args(args: list[str], connector_json: str) -> list[str]:
    """A knob-1 stage's stage.py arguments: the stock --connector (and its --cpu-bytes)
    replaced by the file holding launch.sh's connector JSON."""
    out, rest = [], iter(args)
    for a in rest:
        if a == "--cpu-bytes":
            next(rest)
        elif a != "--connector":
            out.append(a)
    return out + ["--connector-json", connector_json]


def check_launcher(res: dict) -> dict:
    """A knob-1 stage booted with exactly launch.sh plan's connector JSON: the file stage.py
    read is the plan's text, and the engine's config after boot holds every key of it."""
    plan = res.get("launch_plan") or {}
    planned = json.loads(plan["json"]) if plan.get("json") else None
    engine = res.get("kv_transfer_config") or {}
    v: dict = {"plan_rc": plan.get("rc"), "planned": planned, "engine": engine}
    v["passed_verbatim"] = (
        planned is not None and res.get("connector_json") == plan["json"]
    )
    extra = (planned or {}).get("kv_connector_extra_config", {})
    booted = engine.get("kv_connector_extra_config") or {}
    v["engine_holds_it"] = (
        planned is not None
        and all(engine.get(k) == planned.get(k) for k in ("kv_connector", "kv_role"))
        and all(booted.get(k) == val for k, val in extra.items())
    )
    v["ok"] = res.get("rc") == 0 and v["passed_verbatim"] and v["engine_holds_it"]
    return v


def run_wave(
    batch: list[Stage], opts: argparse.Namespace, logs: str, done: dict | None = None
) -> dict[str, dict]:
    procs = []
    planned: dict[str, dict] = {}
    results: dict[str, dict] = {}
    for st in list(batch):
        why = ops_failed(done or {}, st)
        if why:
            results[st.name] = {"rc": None, "skipped": why, "errors": [why]}
            print(f"  {st.name}: not started: {why}", flush=True)
            batch = [b for b in batch if b is not st]
    for st in batch:
        env = dict(os.environ)
        tree = opts.pristine if st.tree == "pristine" else opts.patched
        sites = [opts.models_site] if st.models_site and opts.models_site else []
        env["PYTHONPATH"] = os.pathsep.join([HERE, tree, *sites, opts.site])
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
                store = os.path.join(opts.stores, st.store or st.name)
                env.update(
                    GLM53_KV_OFFLOAD_DIR=store,
                    GLM53_KV_OFFLOAD_CPU_GB=str(CPU_GB),
                    GLM53_KV_OFFLOAD_BUILD_ID="kvtier-engine-suite",
                )
        env.update(st.env)
        key_file = getattr(opts, "key_file", "")
        if keyed(st, key_file):
            env["GLM53_KV_OFFLOAD_KEY_FILE"] = key_file
        js = os.path.join(logs, st.name + ".json")
        args = st.args
        if st.knob == "1" and "--connector" in st.args:
            work = os.path.join(logs, st.name + ".launch")
            os.makedirs(work, exist_ok=True)
            engine = getattr(opts, "engine", ENGINE)
            plan = launch_plan(opts.launcher, env, st.model, work, engine)
            planned[st.name] = plan
            if plan["rc"] != 0:
                print(
                    f"  {st.name}: launch.sh plan refused: {plan['stderr']}", flush=True
                )
                continue
            path = os.path.join(work, "connector.json")
            with open(path, "w") as f:
                f.write(plan["json"])
            args = launcher_args(st.args, path)
            # The plan's env (the knobs as the container would get them) is the stage's.
            env.update(line.split("=", 1) for line in plan["env"])
        log = open(os.path.join(logs, st.name + ".log"), "w")
        cmd = ["timeout", str(st.timeout), sys.executable, os.path.join(HERE, "stage.py"),
               "--model", st.model, "--out", js, *args]  # fmt: skip
        if st.name.endswith(".ops"):  # the import probe: st.model is the model's key
            cmd = ["timeout", str(st.timeout), sys.executable,
                   os.path.join(HERE, "opsprobe.py"), "--model", st.model, "--out", js]  # fmt: skip
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        procs.append(
            (st, subprocess.Popen(cmd, env=env, stdout=log, stderr=log), log, js)
        )
    for name, plan in planned.items():
        if plan["rc"] != 0:
            results[name] = {
                "rc": None,
                "launch_plan": plan,
                "errors": [plan["stderr"]],
            }
    for st, proc, log, js in procs:
        rc = proc.wait()
        log.close()
        res: dict = {"rc": rc}
        if st.name in planned:
            res["launch_plan"] = planned[st.name]
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
        res["restore_lines"] = re.findall(r"KV restore: .*", text)[:20]
        if st.probe and rc == 0:
            store = os.path.join(opts.stores, st.store or st.name)
            key_file = getattr(opts, "key_file", "")
            key = key_file if keyed(st, key_file) else ""
            res["kvstore_verify"] = kvstore_verify(opts.kvstore, store, key)
            res["keyed"] = bool(key)
        results[st.name] = res
        print(f"  {st.name}: rc={rc} up={res.get('engine_up_s')}s", flush=True)
    return results


def prepare(st: Stage, opts: argparse.Namespace) -> dict:
    """The plain disk or page-cache speed a stage is judged against, measured on the
    store's own files (or beside the stores) just before the stage."""
    if st.before == "disk-write":
        return {"disk_write": diskspeed.write_speed(opts.stores)}
    root = os.path.join(opts.stores, st.store or st.name)
    return {"plain_read": diskspeed.read_speeds(root, from_disk=st.before == "evict")}


def kvstore_verify(binary: str, root: str, key_file: str = "") -> dict:
    """`kvstore verify ROOT` (with --key for a keyed store: every MAC checked too)."""
    key = ["--key", key_file] if key_file else []
    p = subprocess.run([binary, "verify", *key, root], capture_output=True, text=True)
    return {"rc": p.returncode, "out": (p.stdout + p.stderr)[-1500:]}


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
        i.get("writer_groups") == eligible[0] == i.get("offloaded_groups")
        for i in installs
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


def judge(
    results: dict[str, dict], corruptions: dict[str, dict] | None = None
) -> dict[str, dict]:
    verdicts: dict[str, dict] = {}
    for name, res in results.items():
        if name.endswith(".ops") or res.get("skipped"):
            verdicts[f"{name}: imports and kernels load" if name.endswith(".ops")
                     else f"{name}: started"] = {
                "failed": res.get("failed") or res.get("errors"),
                "torch": res.get("torch"),
                "ok": res.get("rc") == 0,
            }  # fmt: skip
    for model in ("llama", "lfm2", "nemotronh", "eagle", *NEW_MODELS):
        base = results.get(f"{model}.pristine")
        for variant in ("knob0", "knob1", "knob1-drafter"):
            other = results.get(f"{model}.{variant}")
            if base is None or other is None:
                continue
            name = f"{model}: {variant} logprobs == pristine"
            verdicts[name] = same_logprobs(base, other)
            verdicts[name]["ok"] = verdicts[name]["ok"] and base.get(
                "rc"
            ) == 0 == other.get("rc")
    verdicts.update(restore_judge(results, corruptions or {}))
    for name, res in results.items():
        if "launch_plan" in res:
            verdicts[f"{name}: booted with launch.sh plan's connector JSON"] = (
                check_launcher(res)
            )
    for name, res in results.items():
        if res.get("workers") is not None and not name.startswith(
            ("pressure", "ttft.", "burst8b.")
        ):  # the real-size stages do not compare bytes (minutes): see their judges
            tp = 2 if name.endswith("tp2") else 1
            verdicts[f"{name}: writer, groups, bytes, verify"] = check_writer(res, tp)
    for name, res in results.items():
        if "--metrics" in (res.get("argv") or []):
            verdicts[f"{name}: exported counters == probe"] = metrics_check.check(res)
    verdicts.update(real_size_judge(results))
    return verdicts


def selected(every: list[Stage], wanted: list[str], gpus: int) -> list[Stage]:
    """The stages --only names (a name or a prefix; all when empty) that fit
    the GPUs; a diagnosis stage only when named exactly (device minutes)."""

    def named(s: Stage) -> bool:
        if s.diagnosis and s.name.startswith(
            ("ttft.", "burst8b.", *(m + "." for m in NEW_MODELS))
        ):
            return any(s.name == w or s.name.startswith(w + ".") for w in wanted)
        if s.diagnosis:
            return s.name in wanted
        return not wanted or any(
            s.name == w or s.name.startswith(w + ".") for w in wanted
        )

    return [s for s in every if s.gpus <= gpus and named(s)]


def plan(only: str, together: str, gpus: int) -> list[Stage]:
    """What a run does, in table order: the stages --only selects for the GPUs, their waves
    with those --together names merged into the first of them (run in wave order)."""
    todo = selected(stages(), [w for w in only.split(",") if w], gpus)
    merged = sorted(int(w) for w in together.split(",") if w)
    for s in todo:
        if s.wave in merged:
            s.wave = merged[0]
    return todo


# Beside the stores: the stage results of the last call on this warm machine. A call under
# KVTIER_KEEP_STORES=1 (device-lib.sh keeps the stores) judges them with its own, so a set too
# long for one call (ttft.glm5wide at 127k: cold and write, then disk and cache) is judged whole.
EARLIER = "suite-results.json"
ENV_KEEP = "KVTIER_KEEP_STORES"


def earlier_results(stores: str) -> dict[str, dict]:
    """The results an earlier call left beside the stores it wrote, each marked
    ``earlier_call``; none unless the stores were kept."""
    path = os.path.join(stores, EARLIER)
    if os.environ.get(ENV_KEEP) != "1" or not os.path.exists(path):
        return {}
    with open(path) as f:
        old = json.load(f)
    return {name: {**res, "earlier_call": True} for name, res in old.items()}


def keep_results(stores: str, results: dict[str, dict]) -> None:
    os.makedirs(stores, exist_ok=True)
    with open(os.path.join(stores, EARLIER), "w") as f:
        json.dump(results, f, default=str)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--pristine", required=True)
    p.add_argument("--patched", required=True)
    p.add_argument("--site", required=True)
    p.add_argument(
        "--models-site",
        default="",
        help="site folder put before --site for the issue-31 model stages (transformers "
        "with their config classes; device-b.sh: /tmp/site-models when set C came)",
    )
    p.add_argument("--kvstore", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--stores", default="/tmp/kvstores")
    p.add_argument(
        "--launcher",
        default=os.path.dirname(HERE),
        help="the folder holding docker/launch.sh, anchors/ and the knob module "
        "(engine/prepare.sh packs them from the same revision as the overlays)",
    )
    p.add_argument("--only", default="", help="comma-separated stage names or prefixes")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--together", default="", help="waves to run as one, e.g. 1,2")
    p.add_argument(
        "--engine",
        default=ENGINE,
        help="the <engine>-<version> the trees are (anchors/ of the launcher)",
    )
    opts = p.parse_args()
    logs = os.path.join(opts.out, "logs")
    os.makedirs(logs, exist_ok=True)
    opts.key_file = suite_key_file(opts.stores)
    if opts.key_file:
        print(
            f"  keyed restore sets: {ENV_SUITE_KEY}=1, key file {opts.key_file}",
            flush=True,
        )
    todo = plan(opts.only, opts.together, opts.gpus)
    results = earlier_results(opts.stores)
    if results:
        print(f"  judged with an earlier call's stages: {sorted(results)}", flush=True)
    corruptions: dict[str, dict] = {}
    prepared: dict[str, dict] = {}
    t0 = time.time()
    for wave in sorted({s.wave for s in todo}):
        batch = [s for s in todo if s.wave == wave]
        for st in batch:
            if st.before:
                prepared[st.name] = prepare(st, opts)
                print(f"  before {st.name}: {prepared[st.name]}", flush=True)
            if st.corrupt:
                corruptions[st.name] = corrupt_chunk(results.get(st.corrupt, {}))
                print(
                    f"  corrupted before {st.name}: {corruptions[st.name]}", flush=True
                )
        print(
            f"== wave {wave}: {[s.name for s in batch]} t={time.time() - t0:.0f}s",
            flush=True,
        )
        results.update(run_wave(batch, opts, logs, results))
    for name, speeds in prepared.items():
        results.setdefault(name, {})["before"] = speeds
    keep_results(opts.stores, results)
    verdicts = judge(results, corruptions)
    with open(os.path.join(opts.out, "results.json"), "w") as f:
        json.dump({"results": results, "verdicts": verdicts, "corruptions": corruptions}, f,
                  indent=1, default=str)  # fmt: skip
    lines = [f"{'PASS' if v.get('ok') else 'FAIL'}  {k}" for k, v in verdicts.items()]
    lines.append(f"suite wall time {time.time() - t0:.0f} s")
    with open(os.path.join(opts.out, "summary.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if verdicts and all(v.get("ok") for v in verdicts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
