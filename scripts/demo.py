"""The main job: show the whole system working on the pinned vLLM release.

scripts/demo.sh runs scripts/setup.sh, then this. Every step runs the real
tools on real files in one scratch folder, and the run fails (exit 1) the
moment a step does not end as it should:

  1. set up, and fetch + verify the pinned engine sources
  2. apply the overlays in their pinned order to a copy, compiling the
     injected code; show `overlay status`
  3. the pre-stop gate: knob 0, knob 1 (with the launch configuration it
     would use), RESTORE=1 (the restore overlay is baked), and a bad knob
     refused with exit 2
  4. drive the patched worker-local store path with generated KV bytes
  5. kvstore: verify, catch a corrupted chunk, gc dry run, sweep, stat
  6. restore (TP pair): write, restart, restore from disk, the bytes equal;
     a corrupted chunk falls back to recompute
  7. revert the overlays; the tree is byte-identical to the pins again
  8. the C++ overlay vllm-fs-durable on the pinned C++ sources: plan, apply
     with the Clang scope and compile check, the injected fdatasync/fsync,
     revert to the pins; then the wheel path: rebuild the pinned extension,
     revert to its pinned bytes (scripts/demo_cxx.py)
  9. a summary

Nothing is written outside the scratch folder (--scratch, or a new folder
under $TMPDIR), which is kept for a look afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import demo_cxx

REPO = Path(__file__).resolve().parents[1]
KNOBS = (
    "GLM53_KV_OFFLOAD",
    "GLM53_KV_OFFLOAD_DIR",
    "GLM53_KV_OFFLOAD_CPU_GB",
    "GLM53_KV_OFFLOAD_RESTORE",
    "GLM53_KV_OFFLOAD_DRAFTER",
    "GLM53_KV_OFFLOAD_KEEP_BOUNDARIES",
    "GLM53_KV_OFFLOAD_BUILD_ID",
)


class DemoFailed(Exception):
    pass


class Out:
    """Terminal output: numbered steps, colour only on a TTY."""

    def __init__(self) -> None:
        self.colour = sys.stdout.isatty() and os.environ.get("NO_COLOR") is None

    def _c(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.colour else text

    def step(self, n: int, title: str) -> None:
        print(f"\n{self._c('1;36', f'== {n}. {title}')}", flush=True)

    def cmd(self, argv: list[str]) -> None:
        shown = " ".join(str(a) for a in argv)
        print(self._c("2", f"$ {shown}"), flush=True)

    def text(self, body: str, limit: int = 40) -> None:
        lines = body.rstrip("\n").splitlines()
        for line in lines[:limit]:
            print(f"  {line}")
        if len(lines) > limit:
            print(f"  ... ({len(lines) - limit} more lines)")

    def ok(self, text: str) -> None:
        print(self._c("32", f"  ok: {text}"), flush=True)

    def bad(self, text: str) -> None:
        print(self._c("31", f"  FAILED: {text}"), flush=True)


class Demo:
    failure = DemoFailed
    repo = REPO

    def __init__(self, args: argparse.Namespace) -> None:
        self.out = Out()
        self.build = Path(args.build_dir).resolve()
        self.overlay = self.build / "patcher" / "overlay"
        self.kvstore = self.build / "kvstore" / "kvstore"
        # The overlays' native store library, for the demo's child processes.
        os.environ.setdefault(
            "KVTIER_STORE_LIB", str(self.build / "storeio" / "libkvtier_store.so")
        )
        self.pins = Path(args.pins).resolve()
        self.engine = self.pins.parent.name  # e.g. vllm-0.33.0
        self.manifests = REPO / "anchors" / self.engine
        self.scratch = Path(args.scratch).resolve()
        self.tree = self.scratch / "site-packages"
        self.store = self.scratch / "store"
        self.rows: list[tuple[str, str, float]] = []
        self.counters: list[str] = []  # the restore step's exported counters
        self.base_env = {k: v for k, v in os.environ.items() if k not in KNOBS}
        self.base_env["PYTHONDONTWRITEBYTECODE"] = "1"

    # -- helpers -------------------------------------------------------------

    def run(
        self,
        argv: list,
        *,
        expect: int = 0,
        env: dict[str, str] | None = None,
        show: bool = True,
        limit: int = 40,
    ) -> subprocess.CompletedProcess:
        argv = [str(a) for a in argv]
        self.out.cmd(argv)
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env or self.base_env,
            cwd=self.scratch,
            timeout=300,
        )
        if show:
            self.out.text(done.stdout + done.stderr, limit)
        if done.returncode != expect:
            if not show:
                self.out.text(done.stdout + done.stderr, limit)
            raise DemoFailed(
                f"{Path(argv[0]).name} exited {done.returncode}, expected {expect}"
            )
        self.out.ok(f"exit {done.returncode}" + (" (as expected)" if expect else ""))
        return done

    def overlay_cmd(self, verb: str, *extra) -> list:
        return [
            self.overlay,
            verb,
            "--root",
            self.tree,
            "--manifests",
            self.manifests,
            *extra,
        ]

    def pinned(self) -> dict[str, str]:
        """Every file of the pinned tree: PINS and INTERFACE (the files the
        interface pins read; fetch.py puts both in the tree)."""
        pins = demo_cxx.read_pins(self.pins)
        interface = Path(self.pins).parent / "INTERFACE"
        if interface.is_file():
            pins.update(demo_cxx.read_pins(interface))
        return pins

    def knob_env(self, **knobs: str) -> dict[str, str]:
        env = dict(self.base_env)
        env.update({f"GLM53_KV_OFFLOAD{k}": v for k, v in knobs.items()})
        return env

    # -- steps ---------------------------------------------------------------

    def fetch(self) -> str:
        done = self.run(
            [sys.executable, REPO / "fixtures" / "fetch.py", "--pins", self.pins],
            show=False,
        )
        self.pristine = Path(done.stdout.strip().splitlines()[-1])
        n = len(self.pinned())
        self.out.text(f"{n} pinned files, sha256-verified, in {self.pristine}")
        return f"{n} files verified"

    def apply(self) -> str:
        shutil.copytree(self.pristine, self.tree)
        order = (self.manifests / "ORDER").read_text().split()
        self.out.text("pinned order: " + " -> ".join(order))
        self.run(self.overlay_cmd("apply", "--check-injected"), limit=12)
        done = self.run(self.overlay_cmd("status"), limit=14)
        superseded = done.stdout.count("superseded upstream:")
        self.run(self.overlay_cmd("check", "--check-injected"), show=False)
        return f"{len(order)} overlays applied, {superseded} edits superseded upstream"

    def gate(self) -> str:
        docker = REPO / "docker"
        artifacts = self.scratch / "ARTIFACTS.sha256"
        common = [
            "--engine",
            self.engine,
            "--overlay",
            self.overlay,
            "--root",
            self.tree,
            "--artifacts",
            artifacts,
        ]
        # The bake records the checksummed artifact list the gate verifies; on
        # an applied tree it changes nothing.
        self.run([docker / "bake.sh", *common], show=False)
        serve = ["--", "vllm", "serve", "demo/hybrid-7g", "--tensor-parallel-size", "2"]
        base_env = self.scratch / "serve.env"
        base_env.write_text("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n")
        plan = [
            "plan",
            "--ranks",
            "0,1",
            "--master-addr",
            "10.0.0.1",
            "--engine",
            self.engine,
            "--artifacts",
            artifacts,
            "--base-env",
            base_env,
        ]

        print("  knob 0: the tier is off; the launch adds nothing")
        self.run([docker / "gate.sh", *common], show=False)
        off = self.scratch / "plan-knob0"
        self.run([docker / "launch.sh", *plan, "--out", off, *serve], show=False)
        argv0 = (off / "rank0" / "argv").read_text()
        if "--kv-transfer-config" in argv0:
            raise DemoFailed("knob 0 added a connector config")
        self.out.text("rank0 argv: " + " ".join(argv0.split()))

        print("  knob 1: the connector JSON and environment every rank gets")
        on_env = self.knob_env(
            **{
                "": "1",
                "_DIR": str(self.store),
                "_CPU_GB": "8",
                "_KEEP_BOUNDARIES": "2",
            }
        )
        self.run([docker / "gate.sh", *common], env=on_env, show=False)
        on = self.scratch / "plan-knob1"
        self.run(
            [docker / "launch.sh", *plan, "--out", on, *serve], env=on_env, show=False
        )
        self.run([docker / "launch.sh", "compare", on], show=False)
        argv1 = (on / "rank1" / "argv").read_text().splitlines()
        connector = argv1[argv1.index("--kv-transfer-config") + 1]
        self.out.text("connector: " + json.dumps(json.loads(connector), indent=None))
        self.out.text((on / "rank1" / "env").read_text(), limit=12)

        print("  RESTORE=1: accepted, the restore overlay is baked (in ORDER, applied)")
        restore = dict(on_env, GLM53_KV_OFFLOAD_RESTORE="1")
        self.run([docker / "gate.sh", *common], env=restore, show=False)

        print("  a bad knob: refused before anything is stopped")
        bad = self.knob_env(
            **{"": "1", "_DIR": str(self.store), "_CPU_GB": "8", "_RESTORE": "2"}
        )
        self.run([docker / "gate.sh", *common], env=bad, expect=2, limit=4)
        return "knob 0 go, knob 1 go, RESTORE=1 go, RESTORE=2 refused (2)"

    def write_store(self) -> str:
        done = self.run(
            [sys.executable, REPO / "scripts" / "demo_store.py", self.tree, self.store],
            show=False,
        )
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        stats = figures["stats"]
        self.out.text(
            f"{figures['requests']} requests (one forks another), {figures['jobs']} "
            f"store jobs captured by the patched worker; {stats['keys_written']} "
            f"chunk files written, {stats['manifests_published']} boundary "
            f"manifests published, {stats['manifests_superseded']} superseded "
            f"under keep-2"
        )
        return (
            f"{stats['keys_written']} chunks, {stats['manifests_published']} manifests"
        )

    def kvstore_steps(self) -> str:
        k = self.kvstore
        self.run([k, "verify", self.store], limit=6)
        victim = self.corrupt_one_chunk()
        self.out.text(f"flipped one payload byte of {victim.relative_to(self.store)}")
        self.run([k, "verify", self.store], expect=1, limit=8)
        # gc reads headers only unless asked; payload damage needs the checksum.
        # The dry run exits 1 (damage found, nothing deleted); the sweep 0: it
        # removed every damaged file it found (docs/KVSTORE.md, "Exit codes").
        self.run([k, "gc", "--verify-payloads", self.store], expect=1, limit=8)
        self.run([k, "gc", "--sweep", "--verify-payloads", self.store], limit=6)
        self.run([k, "verify", self.store], limit=6)
        prom = self.scratch / "kvstore.prom"
        self.run([k, "stat", self.store, "--prometheus", prom], limit=12)
        self.out.text(prom.read_text(), limit=10)
        if victim.exists():
            raise DemoFailed(f"the sweep left the corrupt chunk {victim}")
        return "verify clean, corruption caught, swept, verify clean; " + self.budget()

    def budget(self) -> str:
        """A store filled past GLM53_KV_OFFLOAD_DISK_GB stays under it."""
        store = self.scratch / "budget-store"
        done = self.run(
            [sys.executable, REPO / "scripts" / "demo_budget.py", store], show=False
        )
        b = json.loads(done.stdout.strip().splitlines()[-1])
        self.out.text(
            f"disk budget {b['budget']} bytes: {b['chains_written']} chains written, "
            f"{b['chain_trees_evicted']} least recently used evicted "
            f"({b['bytes_evicted']} bytes), {b['held']} bytes held"
        )
        self.run([self.kvstore, "verify", store], limit=6)
        return (
            f"budget: {b['chains_written']} chains into {b['budget']} bytes, "
            f"{b['chain_trees_evicted']} evicted, under budget, verify clean"
        )

    def restore_steps(self) -> str:
        store = self.scratch / "restore-store"
        done = self.run(
            [sys.executable, REPO / "scripts" / "demo_restore.py", self.tree, store],
            show=False,
        )
        f = json.loads(done.stdout.strip().splitlines()[-1])
        self.out.text(
            f"write: {f['chunks_written']} chunk files on {f['ranks']} ranks; "
            f"restart: {f['restored_tokens']} tokens restored from disk "
            f"({f['restored_bytes']} bytes verified), {f['blocks_equal']} GPU "
            f"blocks equal what each rank wrote"
        )
        self.out.text(
            f"flipped one payload byte of {f['corrupted']}: restart: "
            f"{f['after_corruption_hits']} tokens hit, {f['after_corruption_loads']} "
            f"loads, failures {f['failures']}; the request recomputes"
        )
        # What vLLM's /metrics would show for each engine (demo_restore.py says
        # how they are made without the GPU); the summary repeats them.
        self.counters = [
            f"{engine} engine: {line}"
            for engine, lines in f["exported_counters"].items()
            for line in lines
        ]
        self.out.text("exported counters:\n" + "\n".join(self.counters), limit=60)
        return (
            f"{f['restored_tokens']} tokens on {f['ranks']} ranks, bytes equal; "
            "corrupted chunk -> recompute"
        )

    def corrupt_one_chunk(self) -> Path:
        chunks = sorted(self.store.glob("*/*/*_g0/*.bin"))
        if not chunks:
            raise DemoFailed("the store has no full-attention chunk")
        victim = chunks[0]
        data = bytearray(victim.read_bytes())
        data[-1] ^= 0x01
        victim.write_bytes(bytes(data))
        return victim

    def revert(self) -> str:
        self.run(self.overlay_cmd("revert"), limit=6)
        self.run(self.overlay_cmd("check", "--expect", "pristine"), show=False)
        pins = self.pinned()
        found = {
            str(p.relative_to(self.tree)): p
            for p in self.tree.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
        if set(found) != set(pins):
            extra = sorted(set(found) - set(pins))
            missing = sorted(set(pins) - set(found))
            raise DemoFailed(f"file set differs: extra {extra}, missing {missing}")
        for path, digest in pins.items():
            if hashlib.sha256(found[path].read_bytes()).hexdigest() != digest:
                raise DemoFailed(f"{path}: sha256 differs from the pin")
        self.out.ok(f"all {len(pins)} files byte-identical to the pins")
        return f"{len(pins)} files equal their pins"

    # -- driver --------------------------------------------------------------

    def main(self, setup_seconds: float | None) -> int:
        steps = [
            ("fetch pinned sources", self.fetch),
            ("apply the overlays", self.apply),
            ("pre-stop gate", self.gate),
            ("write a store", self.write_store),
            ("kvstore", self.kvstore_steps),
            ("restore", self.restore_steps),
            ("revert", self.revert),
            ("C++ overlay", lambda: demo_cxx.stage(self)),
        ]
        self.scratch.mkdir(parents=True, exist_ok=True)
        print(f"kvtier main job: engine {self.engine}, scratch {self.scratch}")
        if setup_seconds is not None:
            self.rows.append(("setup", "scripts/setup.sh", setup_seconds))
        failed = False
        for n, (title, fn) in enumerate(steps, start=1):
            self.out.step(n, title)
            start = time.monotonic()
            try:
                result = fn()
            except (DemoFailed, OSError, subprocess.SubprocessError) as e:
                self.out.bad(str(e))
                self.rows.append((title, f"FAILED: {e}", time.monotonic() - start))
                failed = True
                break
            self.rows.append((title, result, time.monotonic() - start))
        self.out.step(len(steps) + 1, "summary")
        width = max(len(r[0]) for r in self.rows)
        for title, result, seconds in self.rows:
            print(f"  {title:<{width}}  {seconds:6.1f} s  {result}")
            if title == "restore":  # the counters the engine exports, after its row
                for line in self.counters:
                    print(f"  {'':<{width}}  {'':>8}  {line}")
        total = sum(r[2] for r in self.rows)
        verdict = "FAILED" if failed else "ok"
        print(f"demo: {verdict} in {total:.1f} s; scratch folder kept: {self.scratch}")
        return 1 if failed else 0


def _release_key(pins: Path) -> tuple:
    """fixtures/vllm-0.33.0/PINS -> ("vllm", (0, 33, 0)): version order, not text."""
    engine, _, version = pins.parent.name.partition("-")
    return engine, tuple(int(p) if p.isdigit() else 0 for p in version.split("."))


def default_pins() -> str:
    """The newest pinned release (vllm-0.34.0 beside vllm-0.33.0)."""
    pins = sorted(REPO.glob("fixtures/*/PINS"), key=_release_key)
    return str(pins[-1]) if pins else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--build-dir", default=os.environ.get("BUILD_DIR", REPO / "build")
    )
    parser.add_argument(
        "--pins", default=default_pins(), help="fixtures/<engine>-<version>/PINS"
    )
    parser.add_argument(
        "--engine",
        help="<engine>-<version> to run on (default: the newest pinned release); "
        "short for --pins fixtures/<engine>-<version>/PINS",
    )
    parser.add_argument("--scratch", help="folder for everything the job writes")
    parser.add_argument("--setup-seconds", type=float)
    args = parser.parse_args()
    if args.engine:
        pins = REPO / "fixtures" / args.engine / "PINS"
        if not pins.is_file():
            parser.error(f"--engine {args.engine}: no {pins}")
        args.pins = str(pins)
    if not args.pins:
        parser.error("no fixtures/*/PINS found; pass --pins")
    if args.scratch is None:
        args.scratch = tempfile.mkdtemp(prefix="kvtier-demo.")
    return Demo(args).main(args.setup_seconds)


if __name__ == "__main__":
    sys.exit(main())
