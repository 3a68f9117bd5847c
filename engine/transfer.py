"""The GPU suite's transfers: the sets engine/prepare.sh writes into .device-<version>/, the
most each set may weigh, and which sets each device call carries, in order. One device call
takes at most 64 MiB with the checkout (tracked and untracked-not-ignored files), so every
call's checkout + sets must stay under that with room for the checkout to grow.

    python3 engine/transfer.py check DIR     a prepared folder: each set against its cap and
                                             each call with today's checkout (prepare.sh's
                                             last step); exit 1 naming the set to split
    python3 engine/transfer.py plan          the declared caps with today's checkout (what
                                             tests/python/engine/test_engine_transfer.py checks)
    python3 engine/transfer.py calls [DIR]   the device calls of each chain: command, carry
    python3 engine/transfer.py cut           the byte where the compiled ops are cut (A | A2)

The device side (engine/device-lib.sh): every call but a chain's last runs
`bash engine/device-a.sh SET...`, which stashes the sets it carried in /tmp/pv-<version>/
(kept while the machine is warm, 30 s between calls); the last runs engine/device-b.sh,
which takes each set from its own carry or from that stash, checked against B/sets.sha256.
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
LIMIT = 64 * MIB  # one device call: the checkout and the paths it carries
RESERVE = 1 * MIB  # kept free for what the transfer itself adds
GROWTH = 6 * MIB  # room for the checkout to grow after prepare.sh measured it
BUDGET = LIMIT - RESERVE - GROWTH  # the checkout + one call's sets, at most

# The compiled ops' xz is cut here: set A is its first OPS_CUT bytes, A2 the rest.
OPS_CUT = 40_000_000
# The most each set may weigh (bytes, every file in it). prepare.sh fails when a set is over
# its cap; with the caps every call below fits BUDGET with today's checkout (11.4 MB on
# disk). What prepare.sh wrote, 0.34.0 / 0.33.0 (docs/ENGINE-RUNS.md, "Sizes and device
# time"):
SETS = {
    # A: the compiled ops (vllm/_C_stable_libtorch.abi3.so, xz), their first OPS_CUT bytes:
    # 40,000,012 / 40,000,012
    "A": OPS_CUT + 100_000,
    # A2: the rest of them: 18,992,668 / 23,729,584
    "A2": 25_000_000,
    # W: the dependency wheels the device image lacks (engine/wheels.txt), py-spy among
    # them: 23,755,050 (20,991,712 before py-spy 0.4.1, 2,763,338)
    "W": 24_000_000,
    # B: the .py tree, the overlays' files, kvstore and its libraries, the launcher, the
    # other sets' sha256 list: 16,518,993 / 15,477,198
    "B": 20_000_000,
    # C: the model stages' MoE ops (_moe_C, xz): 25,697,468 / 38,054,808
    "C": 40_000_000,
    # C2: the model stages' other ops (one tar.xz) and their transformers wheel:
    # 24,753,649 / 24,437,817
    "C2": 26_000_000,
    # F: FlashAttention 3 (vllm_flash_attn/_vllm_fa3_C.abi3.so, xz), DeepSeek-V2-Lite's MLA
    # prefill on SM90 (vLLM's only MLA prefill backend there): 19,667,440 / ~34 MB
    "F": 36_000_000,
    # K: GLM-5.3's mHC kernels: tilelang, the z3 library it links and ml_dtypes (engine/
    # kernels.txt), installed at prepare time into one site tree (tar.xz): 35,3xx,xxx
    "K": 38_000_000,
}
# The device calls, in order, of each chain: the sets each carries. The last call runs the
# suite (engine/device-b.sh); every other stashes its sets (engine/device-a.sh).
CHAINS = {
    # the tiny-model, restore and real-size stages; W rides alone: with A2 the caps' call
    # (49 MB) and the 11.4 MB checkout are over BUDGET
    "suite": [("A",), ("A2",), ("W",), ("B",)],
    # the same with the model stages' ops (ONLY=glm5next,dsv2lite,qwen3next,...); F and K
    # ride alone: with C (0.33.0: 38 MB) or each other (55 MB) a call is over BUDGET
    "models": [("A",), ("A2",), ("W",), ("C",), ("F",), ("K",), ("B", "C2")],
}


def newest_release(root: str = ROOT) -> str:
    """The newest pinned release (fixtures/vllm-*/WHEEL), as prepare.sh picks it."""
    fixtures = os.path.join(root, "fixtures")
    found = [
        d
        for d in os.listdir(fixtures)
        if d.startswith("vllm-") and os.path.isfile(os.path.join(fixtures, d, "WHEEL"))
    ]
    if not found:
        raise SystemExit(f"transfer: no {fixtures}/vllm-*/WHEEL")
    return max(found, key=lambda d: [int(p) for p in d[5:].split(".") if p.isdigit()])


def device_dir(release: str) -> str:
    """The folder prepare.sh writes a release's sets into (relative to the root)."""
    return ".device-" + release.removeprefix("vllm-")


def checkout_bytes(root: str = ROOT) -> int:
    """What every device call sends besides its carry: the tracked files and the untracked
    ones git does not ignore, plus a shared/ folder inside the checkout."""
    out = subprocess.run(
        [
            "git",
            "-C",
            root,
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ],
        capture_output=True,
        check=True,
    ).stdout
    names = {n.decode() for n in out.split(b"\0") if n}
    shared = os.path.join(root, "shared")
    if os.path.isdir(shared):
        for d, _, files in os.walk(shared):
            names.update(os.path.relpath(os.path.join(d, f), root) for f in files)
    total = 0
    for name in names:
        try:
            total += disk_bytes(os.path.join(root, name))
        except FileNotFoundError:  # deleted, not yet committed: it does not travel
            continue
    return total


def disk_bytes(path: str) -> int:
    """A file's size as the disk holds it (whole blocks, as `du` counts): a call's size is
    counted so, which puts the checkout's 1,200 small files at 11.1 MiB, not 7.8."""
    st = os.lstat(path)
    return max(st.st_size, st.st_blocks * 512)


def set_bytes(folder: str) -> int | None:
    """Every file's bytes in a prepared set (None when the set was not prepared)."""
    if not os.path.isdir(folder):
        return None
    total = 0
    for d, _, files in os.walk(folder):
        total += sum(disk_bytes(os.path.join(d, f)) for f in files)
    return total


def call_sizes(
    sizes: dict[str, int], checkout: int, chain: list[tuple[str, ...]]
) -> list[tuple[tuple[str, ...], int]]:
    """Each call of a chain whose sets are all in sizes, with its bytes: the checkout + its
    sets (a chain whose sets were not all prepared is not judged: the model stages' C)."""
    if any(s not in sizes for call in chain for s in call):
        return []
    return [(call, checkout + sum(sizes[s] for s in call)) for call in chain]


def problems(
    sizes: dict[str, int], checkout: int, caps: dict[str, int] = SETS
) -> list[str]:
    """Why the sets cannot travel as CHAINS says: a set over its cap, or a call over BUDGET
    (each line names the set to split). Empty when every call fits."""
    out = []
    for name, got in sizes.items():
        if got > caps[name]:
            out.append(
                f"set {name} is {got:,} bytes, over its cap of {caps[name]:,} "
                f"(engine/transfer.py SETS): split set {name}"
            )
    for chain_name, chain in CHAINS.items():
        for call, total in call_sizes(sizes, checkout, chain):
            if total <= BUDGET:
                continue
            biggest = max(call, key=lambda s: sizes[s])
            out.append(
                f"chain {chain_name}: the call carrying {'+'.join(call)} is {total:,} bytes "
                f"with the {checkout:,}-byte checkout, over {BUDGET:,} (64 MiB less "
                f"{RESERVE >> 20} MiB reserve and {GROWTH >> 20} MiB for the checkout to "
                f"grow): split set {biggest} ({sizes[biggest]:,} bytes) or move it to a "
                f"call of its own"
            )
    return out


def prepared_sizes(folder: str) -> dict[str, int]:
    """The sets prepare.sh wrote into folder, by name."""
    sizes = {name: set_bytes(os.path.join(folder, name)) for name in SETS}
    return {name: n for name, n in sizes.items() if n is not None}


def table(sizes: dict[str, int], checkout: int) -> list[str]:
    lines = [f"checkout {checkout:,} bytes ({checkout / MIB:.1f} MiB)"]
    for name, n in sizes.items():
        lines.append(
            f"set {name:<3} {n:>12,} bytes ({n / MIB:5.1f} MiB, cap {SETS[name]:,})"
        )
    for chain_name, chain in CHAINS.items():
        for i, (call, total) in enumerate(call_sizes(sizes, checkout, chain), 1):
            lines.append(
                f"{chain_name} call {i} {'+'.join(call):<5} with the checkout "
                f"{total:>12,} bytes ({total / MIB:4.1f} MiB; "
                f"{(LIMIT - total) / MIB:4.1f} MiB under 64)"
            )
    return lines


def calls(folder: str) -> dict[str, list[dict]]:
    """Each chain's device calls as `run` takes them: command and carry (DEVICE_DIR named
    for any folder but the newest release's, which the device scripts default to)."""
    prefix = "" if folder == device_dir(newest_release()) else f"DEVICE_DIR={folder} "
    out: dict[str, list[dict]] = {}
    for chain_name, chain in CHAINS.items():
        steps = []
        for i, call in enumerate(chain):
            if i < len(chain) - 1:
                command = f"{prefix}bash engine/device-a.sh {' '.join(call)}"
            else:
                command = (
                    f"set -o pipefail; {prefix}bash engine/device-b.sh 2>&1 "
                    "| tee $OUT/device-b.log"
                )
            steps.append({"command": command, "carry": [f"{folder}/{s}" for s in call]})
        out[chain_name] = steps
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["cut"]:
        print(OPS_CUT)
        return 0
    if argv[:1] == ["plan"]:
        checkout = checkout_bytes()
        print("\n".join(table(dict(SETS), checkout)))
        bad = problems(dict(SETS), checkout)
        print("\n".join(bad) or "every call fits with the caps")
        return 1 if bad else 0
    if argv[:1] == ["calls"]:
        folder = argv[1] if len(argv) > 1 else device_dir(newest_release())
        for chain_name, steps in calls(folder.rstrip("/")).items():
            for i, step in enumerate(steps, 1):
                print(
                    f"{chain_name} {i}: command: {step['command']}  carry: {step['carry']}"
                )
        return 0
    if argv[:1] == ["check"] and len(argv) == 2:
        folder = argv[1]
        sizes = prepared_sizes(folder)
        missing = [s for s in ("A", "A2", "W", "B") if s not in sizes]
        if missing:
            print(f"transfer: {folder}: no set {', '.join(missing)}", file=sys.stderr)
            return 1
        checkout = checkout_bytes()
        print("\n".join(table(sizes, checkout)))
        bad = problems(sizes, checkout)
        for line in bad:
            print(f"transfer: {folder}: {line}", file=sys.stderr)
        return 1 if bad else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
