"""The checks of docker/doctor.sh that only the engine's own code can answer.

Run with the engine's python, it asks the code the engine will run (the
patched tree's kv_store_format and kv_store_local, and the prefix's knob
module) rather than a copy of its rules: whether the store library loads
and is the version the overlays need, whether the key file passes the
writer's checks, whether the store folder passes the writer's permission
checks, and whether the disk budget fits the disk. One line per check on
stdout: ``ok|warn|FAIL|skip<TAB>check<TAB>detail``. Standard library only.

    python3 doctor_probe.py --knobs KNOBS_PY --source DIR [--offloading DIR]
                            [--store-bytes N] [--ranks N]

--offloading is the patched tree's folder holding kv_store_format/ and
kv_store_local/ (absent when the tree is not patched); --source the
prefix's copy of the same overlay (overlays/kv-offload-store-local), whose
checks stand in for the tree's when the tree has none.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from types import ModuleType, SimpleNamespace


def _load(name: str, path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: cannot load")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _code_on_path(code: str) -> None:
    """Put the overlay code first on sys.path: store_perms and mac import the
    codec (kv_store_format) that sits beside them, by its top-level name when
    loaded from a folder rather than as the patched tree's package."""
    if code not in sys.path:
        sys.path.insert(0, code)


def _say(verdict: str, check: str, detail: str) -> None:
    print(f"{verdict}\t{check}\t{' '.join(detail.split())}")


def _gb(n: int) -> str:
    """Bytes in the largest decimal unit that leaves a number >= 1."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def store_library(offloading: str | None) -> None:
    if offloading is None:
        _say("skip", "store library", "the tree holds no kv_store_format/native.py")
        return
    sys.path.insert(0, offloading)
    try:
        from kv_store_format import native  # the tree's own loader and version check

        lib = native.load()
        _say(
            "ok",
            "store library",
            f"{lib.path} loads: library {native.LIBRARY_VERSION}, ABI {native.ABI_VERSION}",
        )
    except Exception as e:  # noqa: BLE001 (any failure to load is the finding)
        _say("FAIL", "store library", f"{type(e).__name__}: {e}")


def key_file(knobs: object, code: str) -> None:
    path = getattr(knobs, "key_file", "")
    if not path:
        _say(
            "skip", "key file", "GLM53_KV_OFFLOAD_KEY_FILE unset: no MAC (CRC-32 only)"
        )
        return
    _code_on_path(code)
    try:
        from kv_store_format import mac

        key = mac.load_key(path)
        _say("ok", "key file", f"{path}: {len(key)} bytes, key id {mac.key_id(key)}")
    except Exception as e:  # noqa: BLE001
        _say("FAIL", "key file", str(e))


def store_folder(knobs: object, code: str) -> None:
    root = getattr(knobs, "root", "")
    if not root:
        _say("skip", "store folder", "GLM53_KV_OFFLOAD_DIR unset")
        return
    _code_on_path(code)
    path = os.path.join(code, "kv_store_local", "store_perms.py")
    try:
        perms = _load("kvtier_doctor_store_perms", path)
        problem = perms.store_problem(root)
    except Exception as e:  # noqa: BLE001 (the checks after this one still run)
        _say("FAIL", "store folder", f"{path}: {type(e).__name__}: {e}")
        return
    if problem is not None:
        _say("FAIL", "store folder", f"store folder not safe: {problem}")
    elif not os.path.isdir(root):
        _say("warn", "store folder", f"{root} does not exist yet (the writer makes it)")
    else:
        _say(
            "ok",
            "store folder",
            f"{root}: only root and the serving user can change it",
        )


def disk_budget(knobs: object, store_bytes: int, ranks: int) -> None:
    root, budget = getattr(knobs, "root", ""), getattr(knobs, "disk_bytes", None)
    if not root:
        return
    if budget is None:
        _say(
            "warn",
            "disk budget",
            "GLM53_KV_OFFLOAD_DISK_GB unset: the store is bounded only by gc and the "
            "disk (docs/DEPLOY.md, 'Size the disk')",
        )
        return
    where = root
    while not os.path.isdir(where):
        where = os.path.dirname(where)
    st = os.statvfs(where)
    free = st.f_bavail * st.f_frsize
    need = budget * max(ranks, 1)
    room = free + store_bytes
    detail = (
        f"{max(ranks, 1)} rank(s) x {_gb(budget)} = {_gb(need)} against {_gb(free)} "
        f"free + {_gb(store_bytes)} held on {where}"
    )
    _say("ok" if need <= room else "FAIL", "disk budget", detail)


def _valid_knobs(mod: ModuleType) -> SimpleNamespace:
    """Of the knobs the checks here use, those whose own rule passes: the
    other checks still run when one knob is bad."""

    def ok(name: str) -> str:
        value = os.environ.get(name, "")
        rule = next(r for r in mod.RULES if r.name == name)
        return value if value and rule.check(value) is None else ""

    disk = ok(mod.DISK_GB)
    return SimpleNamespace(
        root=ok(mod.DIR),
        key_file=ok(mod.KEY_FILE),
        disk_bytes=mod.disk_budget_bytes(disk) if disk else None,
    )


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="doctor_probe.py")
    ap.add_argument("--knobs", required=True)
    ap.add_argument("--offloading")
    ap.add_argument("--source", required=True)
    ap.add_argument("--store-bytes", type=int, default=0)
    ap.add_argument("--ranks", type=int, default=1)
    args = ap.parse_args(argv)
    mod = _load("kvtier_doctor_knobs", args.knobs)
    try:
        knobs = mod.read_knobs()
    except mod.KnobError:
        knobs = _valid_knobs(mod)  # doctor.sh reports the bad one itself
    code = (
        args.offloading or args.source
    )  # the tree's own code, else the same overlay's
    store_library(args.offloading)
    key_file(knobs, code)
    store_folder(knobs, code)
    disk_budget(knobs, args.store_bytes, args.ranks)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
