"""Where a step's time goes: wall seconds spent inside named methods of the engine's
objects, summed, so a slow step of a restore window (the stall check, engine/stall.py)
or a longer round of the pressure stages (stage.py --step-times) can be put down to the
scheduler, the model, vLLM's connector or our hooks.

Only an in-process engine: the timer is this module's, and the worker's wrappers reach
it because the worker runs in this process. Installing it again wraps nothing twice (the
stall check installs it, and a stage may ask for step times as well). Nested methods
count in both (``start_kv_transfers`` holds our ``promote``): read each line against
its parent. A name a release lacks is skipped, so the trace says which ones it timed.
"""

from __future__ import annotations

import time
from typing import Any

# Per object: the methods a step calls, by the name the trace prints.
# step_fn: the bound step (plain or batch-queue) EngineCore picked at init;
# _wait_for_output: 0.34.0's wait for the model's future (with async scheduling,
# the GPU's time shows there, not in execute_model; 0.33.0 waits inline, untimed).
ENGINE_CORE = ("step_fn", "_wait_for_output")
SCHEDULER = ("schedule", "update_from_output")
EXECUTOR = ("execute_model", "sample_tokens")
CONNECTOR_SCHEDULER = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "update_connector_output",
)
CONNECTOR_WORKER = (
    "handle_preemptions",
    "start_kv_transfers",
    "prepare_store_kv",
    "get_finished",
    "build_connector_worker_meta",
)
RESTORE = ("promote", "report", "_scan", "_harvest", "_finish")
STORE = ("submitted", "capture", "capture_jobs", "remember")

TOTALS: dict[str, float] = {}


def wrap(obj: Any, names: tuple[str, ...], prefix: str) -> list[str]:
    """Time each of ``names`` that ``obj`` has into TOTALS[prefix.name]; the names wrapped."""
    done = []
    for name in names:
        inner = getattr(obj, name, None)  # obj may be None: nothing to wrap
        if not callable(inner):
            continue
        label = f"{prefix}.{name}"
        done.append(label)
        if getattr(inner, "steptimer_label", None) == label:
            continue  # timed already: a second wrapper would count each call twice
        TOTALS.setdefault(label, 0.0)

        def timed(*args, _inner=inner, _label=label, **kwargs):
            t = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                TOTALS[_label] += time.perf_counter() - t

        timed.steptimer_label = label
        setattr(obj, name, timed)
    return done


def install_worker(worker: Any) -> list[str]:
    """In the worker (collective_rpc): vLLM's connector worker, our restore and store."""
    try:
        from vllm.distributed.kv_transfer import (
            get_kv_transfer_group,
            has_kv_transfer_group,
        )
    except ImportError:
        return []
    if not has_kv_transfer_group():
        return []
    cw = get_kv_transfer_group().connector_worker
    return (
        wrap(cw, CONNECTOR_WORKER, "worker")
        + wrap(getattr(cw, "_kv_restore", None), RESTORE, "restore")
        + wrap(getattr(cw, "_kv_store", None), STORE, "store")
    )


def engine_core(engine: Any) -> Any:
    """The EngineCore of an in-process LLMEngine (its client's), else None."""
    return getattr(getattr(engine, "engine_core", None), "engine_core", None)


def install(llm: Any) -> list[str]:
    """Wrap what an in-process LLM exposes; the names timed (none for another engine)."""
    core = engine_core(llm.llm_engine)
    if core is None:
        return []
    scheduler = getattr(core, "scheduler", None)
    connector = getattr(scheduler, "connector", None)
    names = (
        wrap(core, ENGINE_CORE, "core")
        + wrap(scheduler, SCHEDULER, "scheduler")
        + wrap(getattr(core, "model_executor", None), EXECUTOR, "executor")
        + wrap(getattr(connector, "connector_scheduler", None), CONNECTOR_SCHEDULER,
               "connector")
    )  # fmt: skip
    try:
        names += [n for got in llm.collective_rpc(install_worker) for n in got]
    except Exception:  # noqa: BLE001 - a diagnosis: the trace says what it timed
        pass
    return names


def snapshot() -> dict[str, float]:
    return dict(TOTALS)


def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Milliseconds each timed method took between two snapshots, the ones that ran."""
    out = {}
    for name, total in after.items():
        ms = (total - before.get(name, 0.0)) * 1e3
        if ms > 0:
            out[name] = round(ms, 3)
    return out
