"""Scan the overlays' code for the vLLM names it uses; write or check the pins.

    python3 -m apipins --engine vllm-0.34.0            # print what differs
    python3 -m apipins --engine vllm-0.34.0 --write    # rewrite anchors/.../api/ and INTERFACE
    python3 -m apipins --engine vllm-0.34.0 --check    # exit 1 if stale

Reads fixtures/<engine>/ (PINS, WHEEL: the pinned tree and the verified
wheel, fetched by fixtures/fetch.py) and anchors/<engine>/ (ORDER and the
manifests), applies the Python overlays to a copy of the pinned tree with the
real ``overlay`` (--overlay-bin, default build/patcher/overlay) and walks
what they inject. Exit codes: 0 ok (--check: the pins are current), 1 stale
pins (--check) or unresolved accesses, 2 usage, 3 a fetch or apply failed.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from . import pins
from .index import Index
from .sources import ReleaseSources, ScanError, find_ours, patched_copy, temp_tree
from .walk import Walker, vllm_looking

REPO = Path(__file__).resolve().parent.parent


def load_fetch():
    sys.path.insert(0, str(REPO / "fixtures"))
    import fetch  # noqa: PLC0415

    return fetch


def python_overlays(manifests: Path) -> dict[str, dict]:
    """The overlays of ORDER whose targets are Python files, parsed."""
    order = [
        x.strip() for x in (manifests / "ORDER").read_text().splitlines() if x.strip()
    ]
    out = {}
    for name in order:
        m = tomllib.loads((manifests / f"{name}.toml").read_text())
        paths = [f["path"] for f in m.get("files", [])] + [
            f["path"] for f in m.get("new_files", [])
        ]
        if paths and all(p.endswith(".py") for p in paths):
            out[name] = m
    return out


def scan(engine: str, overlay_bin: Path):
    """(uses by overlay, unresolved, pinned files the uses need)."""
    fetch = load_fetch()
    pin_dir = REPO / "fixtures" / engine
    name, version = fetch.split_pin_dir(pin_dir)
    pinned = fetch.fetch(pin_dir / "PINS", name, version, False)
    sha, wheel_name = fetch.read_wheel_pin(pin_dir / "WHEEL")
    wheel = fetch.ensure_wheel(
        fetch.cache_root() / "wheels", wheel_name, sha, name, version
    )
    manifests = REPO / "anchors" / engine
    overlays = python_overlays(manifests)
    with temp_tree() as tmp:
        tree = Path(tmp) / "tree"
        patched_copy(pinned, tree, overlay_bin, manifests, list(overlays))
        ours = find_ours(tree, overlays)
        src = ReleaseSources(tree, wheel, ours)
        try:
            index = Index(src)
            walker = Walker(index, src.site)
            modules = sorted(
                {_module(p) for p in list(ours.new_files) + list(ours.regions)}
            )
            # Twice: the first pass learns what methods assign to self.<x>
            # (a module may read what a later one assigns); the second records.
            for mod in modules:
                walker.scan(mod)
            walker.uses.clear()
            walker.unresolved.clear()
            for mod in modules:
                walker.scan(mod)
            files = sorted({_file_of(index, u) for u in walker.uses.values()} - {""})
            pinned = [_module(p) for p in _pinned_paths(pin_dir) if p.endswith(".py")]
            unresolved = vllm_looking(index, walker.unresolved, pinned)
        finally:
            src.close()
    return (
        pins.split_by_overlay(list(walker.uses.values())),
        unresolved,
        files,
        name,
        version,
    )


def interface_text(engine: str, files: list[str]) -> str:
    """fixtures/<engine>/INTERFACE: sha256 lines, from the verified wheel, of
    the files the pins name that PINS does not list."""
    import hashlib
    import zipfile

    fetch = load_fetch()
    pin_dir = REPO / "fixtures" / engine
    name, version = fetch.split_pin_dir(pin_dir)
    sha, wheel_name = fetch.read_wheel_pin(pin_dir / "WHEEL")
    wheel = fetch.ensure_wheel(
        fetch.cache_root() / "wheels", wheel_name, sha, name, version
    )
    lines = [
        f"# Files the interface pins (anchors/{engine}/api/) name that PINS does not list:",
        "# fetched into the pinned tree so `overlay plan` checks the pins against it;",
        "# never run by the sim's harness. Written by `python3 -m apipins --write`.",
    ]
    with zipfile.ZipFile(wheel) as z:
        for f in sorted(files):
            lines.append(f"{hashlib.sha256(z.read(f)).hexdigest()}  {f}")
    return "\n".join(lines) + "\n"


def _pinned_paths(pin_dir: Path) -> list[str]:
    out = []
    for name in ("PINS", "INTERFACE"):
        f = pin_dir / name
        if f.is_file():
            out += [
                ln.split()[1]
                for ln in f.read_text().splitlines()
                if ln.strip() and not ln.startswith("#")
            ]
    return out


def _module(path: str) -> str:
    p = path.removesuffix(".py").removesuffix("/__init__")
    return p.replace("/", ".")


def _file_of(index: Index, u) -> str:
    if u.kind == "local":
        return u.file
    mod = index.module(u.module)
    return mod.path if mod else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m apipins", description=__doc__.split("\n")[0]
    )
    ap.add_argument(
        "--engine", required=True, help="a pinned release, e.g. vllm-0.33.0"
    )
    ap.add_argument(
        "--overlay-bin", type=Path, default=REPO / "build" / "patcher" / "overlay"
    )
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--write", action="store_true", help="rewrite anchors/<engine>/api/*.toml"
    )
    mode.add_argument(
        "--check", action="store_true", help="exit 1 when the committed pins differ"
    )
    args = ap.parse_args(argv)
    if not (REPO / "fixtures" / args.engine / "PINS").is_file():
        print(
            f"apipins: fixtures/{args.engine}/PINS: no such pinned release",
            file=sys.stderr,
        )
        return 2
    try:
        by_overlay, unresolved, files, name, version = scan(
            args.engine, args.overlay_bin
        )
    except ScanError as e:
        print(f"apipins: {e}", file=sys.stderr)
        return 3
    except load_fetch().FetchError as e:
        print(f"apipins: {e}", file=sys.stderr)
        return 3
    status = 0
    for u in unresolved:
        print(f"apipins: unresolved: {u.site}: .{u.name}", file=sys.stderr)
    if unresolved:
        status = 1
    api_dir = REPO / "anchors" / args.engine / "api"
    pin_dir = REPO / "fixtures" / args.engine
    pinned = {line.split()[1] for line in (pin_dir / "PINS").read_text().splitlines()
              if line.strip() and not line.startswith("#")}  # fmt: skip
    interface = interface_text(args.engine, [f for f in files if f not in pinned])
    path = pin_dir / "INTERFACE"
    current = path.read_text() if path.is_file() else None
    if current != interface:
        if args.write:
            path.write_text(interface)
            print(f"apipins: wrote {path.relative_to(REPO)}")
        else:
            print(
                f"apipins: {path.relative_to(REPO)} is {'stale' if current else 'missing'}"
            )
            status = 1 if args.check else status
    for overlay, uses in sorted(by_overlay.items()):
        text = pins.render(overlay, name, version, uses)
        path = api_dir / f"{overlay}.toml"
        current = path.read_text() if path.is_file() else None
        if args.write:
            api_dir.mkdir(exist_ok=True)
            if current != text:
                path.write_text(text)
                print(f"apipins: wrote {path.relative_to(REPO)} ({len(uses)} names)")
        elif current != text:
            print(f"apipins: {path.relative_to(REPO)} is {'stale' if current else 'missing'}"
                  f" ({len(uses)} names in a fresh scan)")  # fmt: skip
            if args.check:
                status = 1
            elif not args.write:
                sys.stdout.write(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
