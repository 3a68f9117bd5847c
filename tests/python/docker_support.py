"""Shared pieces of the docker/ tests: a synthetic prefix, stub commands on
PATH that record their calls, and a runner with a clean environment.

The synthetic prefix mirrors the real layout (anchors/<engine>-<version>/ORDER,
manifests, overlays/<name>/ fragments) with made-up content, so the gate's
artifact rules are tested without the real overlays. The stub `overlay` keeps
its tree state in <root>/.fake-state and answers with the real CLI's exit
codes (0 ok, 1 not in the expected state, 3 drift, 4 tampered, 5 compile).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
ENGINE_DIR = "vllm-9.9.9"  # synthetic on purpose: nothing may hard-code a version
ORDER = ("kv-offload-scope", "kv-offload-store-local")

FILES = {
    "kv-offload-scope": {
        "config_eligible.py": "groups = eligible(groups)\n",
        "kv_offload_scope.py": "def eligible(groups):\n    return groups\n",
    },
    "kv-offload-store-local": {
        "worker_capture.py": "capture(job)\n",
        "kv_store_local.py": "def capture(job):\n    return None\n",
        "kv_store_format.py": "MAGIC = b'KVT1'\n",
    },
    # Only in a rig made with restore=True (ORDER then lists it last).
    "kv-offload-restore": {
        "scheduler_init_restore.py": "restore = tier()\n",
        "kv_restore_tier.py": "def tier():\n    return None\n",
    },
}
RESTORE = "kv-offload-restore"

MANIFEST = """format = 1
overlay = "{name}"
engine = "vllm"
engine_version = "9.9.9"
after = [{after}]
summary = "synthetic"

[[files]]
path = "vllm/a.py"
sha256 = "{zeros}"

  [[files.edits]]
  id = "one"
  anchor = '''x = 1'''
  action = "insert_after"
  fragment = "{fragment}"

[[new_files]]
path = "vllm/{module}"
source = "{module}"
"""

STUB_OVERLAY = r"""#!/usr/bin/env bash
printf '%s\n' "overlay $*" >>"$STUB_LOG"
sub=$1; shift
root="" expect="" inject=0
while (($#)); do
  case $1 in
  --root) root=$2; shift 2 ;;
  --expect) expect=$2; shift 2 ;;
  --check-injected) inject=1; shift ;;
  *) shift ;;
  esac
done
state=$(cat "$root/.fake-state" 2>/dev/null || echo pristine)
case $state in drift) exit 3 ;; tampered) exit 4 ;; esac
if ((inject)) && [[ -e $root/.fake-bad-inject ]]; then exit 5; fi
case $sub in
apply) echo applied >"$root/.fake-state"; exit 0 ;;
check) [[ $state == "$expect" ]] && exit 0 || exit 1 ;;
esac
exit 2
"""

# docker and ssh stand-ins: one line per call, the command name then its
# arguments, tab-separated.
STUB_RECORDER = r"""#!/usr/bin/env bash
{ printf '%s' "$(basename "$0")"; printf '\t%s' "$@"; printf '\n'; } >>"$CALL_LOG"
exit 0
"""


@dataclass
class Rig:
    prefix: Path
    tree: Path
    stubs: Path
    stub_log: Path
    call_log: Path

    @property
    def anchors(self) -> Path:
        return self.prefix / "anchors" / ENGINE_DIR

    @property
    def artifacts(self) -> Path:
        return self.prefix / "ARTIFACTS.sha256"

    def calls(self) -> list[list[str]]:
        if not self.call_log.exists():
            return []
        return [ln.split("\t") for ln in self.call_log.read_text().splitlines()]

    def overlay_calls(self) -> list[str]:
        if not self.stub_log.exists():
            return []
        return self.stub_log.read_text().splitlines()

    def set_state(self, state: str) -> None:
        (self.tree / ".fake-state").write_text(state + "\n")

    def env(self, **knobs: str) -> dict[str, str]:
        """A clean environment: the stubs first on PATH, no inherited knobs."""
        env = {
            "PATH": f"{self.stubs}:/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "LC_ALL": "C.UTF-8",
            "STUB_LOG": str(self.stub_log),
            "CALL_LOG": str(self.call_log),
            "TMPDIR": str(self.prefix.parent),
        }
        env.update(knobs)
        return env

    def run(self, script: str, *args: str, **knobs: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(DOCKER / script), *args],
            env=self.env(**knobs),
            capture_output=True,
            text=True,
            check=False,
        )

    def bake(self) -> subprocess.CompletedProcess:
        return self.run(
            "bake.sh", "--prefix", str(self.prefix), "--root", str(self.tree)
        )

    def gate(self, **knobs: str) -> subprocess.CompletedProcess:
        return self.run(
            "gate.sh", "--prefix", str(self.prefix), "--root", str(self.tree), **knobs
        )


def write_exec(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def make_rig(tmp: Path, restore: bool = False) -> Rig:
    """A synthetic prefix with a stub overlay CLI in bin/, a pristine tree,
    and docker/ssh recorders on PATH. Not baked yet. restore=True adds the
    kv-offload-restore overlay, last in ORDER."""
    prefix = tmp / "prefix"
    anchors = prefix / "anchors" / ENGINE_DIR
    anchors.mkdir(parents=True)
    order = ORDER + ((RESTORE,) if restore else ())
    (anchors / "ORDER").write_text("".join(f"{n}\n" for n in order))
    for i, name in enumerate(order):
        files = FILES[name]
        fragment, module = next(iter(files)), list(files)[1]
        after = ", ".join(f'"{n}"' for n in order[:i])
        (anchors / f"{name}.toml").write_text(
            MANIFEST.format(
                name=name, after=after, zeros="0" * 64, fragment=fragment, module=module
            )
        )
        d = prefix / "overlays" / name
        d.mkdir(parents=True)
        for fname, text in files.items():
            (d / fname).write_text(text)
    (prefix / "bin").mkdir()
    write_exec(prefix / "bin" / "overlay", STUB_OVERLAY)

    stubs = tmp / "stubs"
    stubs.mkdir()
    for name in ("docker", "ssh"):
        write_exec(stubs / name, STUB_RECORDER)

    tree = tmp / "tree"
    (tree / "vllm").mkdir(parents=True)
    return Rig(prefix, tree, stubs, tmp / "overlay.log", tmp / "calls.log")


def baked_rig(tmp: Path, restore: bool = False) -> Rig:
    rig = make_rig(tmp, restore)
    res = rig.bake()
    assert res.returncode == 0, res.stderr
    rig.stub_log.unlink()
    return rig


def copy_prefix(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)
