"""The main job's C++ stage: overlay vllm-fs-durable on the pinned sources.

Called by scripts/demo.py. On a copy of the pinned vLLM C++ sources (from the
sdist, fetched into the cache by `fixtures/fetch.py --sources`): plan, apply
with --check-injected (Clang resolves `fn _store_block`; the patched file is
compiled syntax-only), status, the injected regions and the header's
fdatasync/fsync, revert, and every file equal to its pin again. Then the wheel
path on a copy of the pinned built extension: apply rebuilds
vllm/fs_io_C.abi3.so from the patched source, the rebuilt binary imports
fdatasync and fsync (the pinned one does not), and revert restores the pinned
bytes.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

OVERLAY = "vllm-fs-durable"
TARGET = "csrc/fs_io.cpp"
HEADER = "csrc/kvtier_fs_durable.h"
SO = "vllm/fs_io_C.abi3.so"


def read_pins(path: Path) -> dict[str, str]:
    """A pin file's "<sha256>  <path>" lines as {path: sha256} (demo.py's too)."""
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(None, 1)
            pins[name.strip()] = digest
    return pins


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copy_writable(src: Path, dst: Path) -> None:
    # The cache's files are read-only; the copy must be patchable.
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


def regions(text: str) -> dict[str, list[str]]:
    """The overlay's sentinel regions in a patched file, by edit id."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if f">>> overlay {OVERLAY}/" in line:
            current = line.split(f">>> overlay {OVERLAY}/", 1)[1].split()[0]
            found[current] = [line]
        elif current is not None:
            found[current].append(line)
            if f"<<< overlay {OVERLAY}/" in line:
                current = None
    return found


def equal_pins(demo, tree: Path, pins: dict[str, str], what: str) -> None:
    found = {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()}
    if found != set(pins):
        extra, missing = sorted(found - set(pins)), sorted(set(pins) - found)
        raise demo.failure(
            f"{what}: file set differs: extra {extra}, missing {missing}"
        )
    for rel, digest in pins.items():
        if sha256(tree / rel) != digest:
            raise demo.failure(f"{what}: {rel}: sha256 differs from the pin")
    demo.out.ok(f"{what}: all {len(pins)} files byte-identical to the pins")


def imports(demo, so: Path) -> set[str]:
    done = demo.run(["nm", "-D", "--undefined-only", so], show=False)
    return {
        line.split()[-1].split("@")[0]
        for line in done.stdout.splitlines()
        if line.strip()
    }


def stage(demo) -> str:
    pin_dir = demo.pins.parent
    fetch = [sys.executable, demo.repo / "fixtures" / "fetch.py", "--pins", demo.pins]
    cache = Path(
        demo.run([*fetch, "--sources"], show=False).stdout.strip().splitlines()[-1]
    )
    source_pins = read_pins(pin_dir / "SOURCES")
    src = demo.scratch / "vllm-src"
    copy_writable(cache, src)
    demo.out.text(
        f"{len(source_pins)} pinned C++ source files (vLLM's sdist) copied to {src}"
    )

    def ov(verb: str, root: Path, *extra) -> list:
        return [
            demo.overlay,
            verb,
            "--root",
            root,
            "--manifests",
            demo.manifests,
            "--overlays",
            OVERLAY,
            *extra,
        ]

    demo.run(ov("plan", src), limit=12)
    demo.run(ov("apply", src, "--check-injected"), limit=8)
    status = demo.run(ov("status", src), show=False).stdout
    demo.out.text(
        "\n".join(
            ln
            for ln in status.splitlines()
            if OVERLAY in ln or "fs_io" in ln or "fs_durable" in ln
        )
    )
    demo.run(ov("check", src), show=False)

    patched = regions((src / TARGET).read_text())
    if set(patched) != {"include", "sync-data", "sync-dir"}:
        raise demo.failure(
            f"{TARGET}: injected regions {sorted(patched)}, expected include, sync-data, sync-dir"
        )
    for edit in ("sync-data", "sync-dir"):
        demo.out.text("\n".join(patched[edit]), limit=12)
    header = (src / HEADER).read_text()
    calls = [c for c in ("fdatasync(fd)", "fsync(fd)") if c in header]
    if len(calls) != 2:
        raise demo.failure(
            f"{HEADER}: expected fdatasync(fd) and fsync(fd), found {calls}"
        )
    demo.out.ok(f"{TARGET}: 3 regions injected; {HEADER} calls {' and '.join(calls)}")

    demo.run(ov("revert", src), limit=6)
    demo.run(ov("check", src, "--expect", "pristine"), show=False)
    equal_pins(demo, src, source_pins, "source tree")

    built_pins = read_pins(pin_dir / "BUILT") if (pin_dir / "BUILT").is_file() else {}
    if SO not in built_pins:
        return f"{OVERLAY} applied, compile-checked, reverted"
    built = Path(
        demo.run([*fetch, "--built"], show=False).stdout.strip().splitlines()[-1]
    )
    wheel = demo.scratch / "wheel-site-packages"
    (wheel / SO).parent.mkdir(parents=True)
    shutil.copyfile(built / SO, wheel / SO)
    print(
        f"  wheel install: the pinned {SO} in {wheel}; apply rebuilds it from the patched source"
    )
    if {"fdatasync", "fsync"} & imports(demo, wheel / SO):
        raise demo.failure(f"the pinned {SO} already imports fdatasync/fsync")
    demo.run(ov("apply", wheel, "--sources", cache, "--check-injected"), limit=6)
    syms = imports(demo, wheel / SO)
    if not {"fdatasync", "fsync"} <= syms:
        raise demo.failure(f"the rebuilt {SO} does not import fdatasync and fsync")
    demo.out.ok(f"rebuilt {SO} imports fdatasync and fsync (the pinned one: neither)")
    demo.run(ov("revert", wheel), limit=6)
    equal_pins(demo, wheel, {SO: built_pins[SO]}, "wheel install")
    return f"{OVERLAY} applied, compile-checked, reverted; .so rebuilt, reverted"
