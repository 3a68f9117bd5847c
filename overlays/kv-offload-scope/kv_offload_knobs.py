# SPDX-License-Identifier: Apache-2.0
"""The ``GLM53_KV_OFFLOAD*`` knobs: every rule, defined once.

Both overlays read their knobs through this module (the scope overlay the
drafter knob, the store-local writer all of them), and the launch gate runs
it with the serving image's interpreter before anything is stopped::

    python3 kv_offload_knobs.py check   # prints 0 or 1 (the tier); exit 2 on a bad knob
    python3 kv_offload_knobs.py check --restore-baked   # the prefix holds kv-offload-restore
    python3 kv_offload_knobs.py names   # every knob, one a line
    python3 kv_offload_knobs.py table   # the Markdown table the docs carry

A set knob is always validated, whether the tier is on or off; set but
empty counts as set. Any other exported ``GLM53_KV_OFFLOAD*`` name is a typo
and is refused. Standard library only: the gate runs it outside vLLM.
"""

import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

PREFIX = "GLM53_KV_OFFLOAD"
ENABLE = "GLM53_KV_OFFLOAD"
DIR = "GLM53_KV_OFFLOAD_DIR"
CPU_GB = "GLM53_KV_OFFLOAD_CPU_GB"
RESTORE = "GLM53_KV_OFFLOAD_RESTORE"
DRAFTER = "GLM53_KV_OFFLOAD_DRAFTER"
KEEP_BOUNDARIES = "GLM53_KV_OFFLOAD_KEEP_BOUNDARIES"
BUILD_ID = "GLM53_KV_OFFLOAD_BUILD_ID"
CAPTURE_MIB = "GLM53_KV_OFFLOAD_CAPTURE_MIB"
GROUP = "GLM53_KV_OFFLOAD_GROUP"
KEY_FILE = "GLM53_KV_OFFLOAD_KEY_FILE"
DISK_GB = "GLM53_KV_OFFLOAD_DISK_GB"

EXIT_REFUSED = 2

_DECIMAL = re.compile(r"0|[1-9][0-9]{0,5}")
# Safe in a docker -v spec and in a shell line: no whitespace, quotes, ':'
# or ','.
_DIR = re.compile(r"/[A-Za-z0-9._/@+-]+")
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_GROUP = re.compile(r"[A-Za-z_][A-Za-z0-9._-]{0,31}")
# A SIZE, as `kvstore gc --max-bytes` takes it (kvstore/gc_budget.cpp,
# parse_size; tests/vectors/sizes.txt holds both to one table): a decimal
# number and its unit; here a bare number is GB, the knob's own unit.
_SIZE = re.compile(r"([0-9]{1,19})(?:\.([0-9]{1,12}))?([A-Za-z]*)")
SIZE_UNITS = {
    "B": 1,
    "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6,
    "G": 10**9, "GB": 10**9, "T": 10**12, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}  # fmt: skip


class KnobError(ValueError):
    """A ``GLM53_KV_OFFLOAD*`` variable with a value this stage refuses."""


@dataclass(frozen=True)
class Rule:
    name: str
    accepted: str  # what the docs table says, word for word
    default: str
    check: Callable[[str], str | None]  # the problem with a value, or None


def _flag(value: str) -> str | None:
    return None if value in ("0", "1") else "must be 0 or 1"


def _bounded(low: int, high: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if _DECIMAL.fullmatch(value) and low <= int(value) <= high:
            return None
        return f"must be an integer {low}..{high}"

    return check


def _directory(value: str) -> str | None:
    parts = value.split("/")
    if not _DIR.fullmatch(value) or "." in parts or ".." in parts:
        return (
            "must be an absolute path of [A-Za-z0-9._/@+-] without '.' or '..' "
            "components"
        )
    if not value.strip("/"):
        return "must not be the root folder"
    return None


# Set by `check --restore-baked`: the gate's prefix holds the restore overlay.
_restore_baked_flag = False


def restore_baked() -> bool:
    """Whether the kv-offload-restore overlay is baked where this module runs.

    Inside vLLM both are new files of the offloading package, so its tier
    module sits beside this one; the launch gate says so with --restore-baked.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    return _restore_baked_flag or os.path.isfile(
        os.path.join(here, "kv_restore_tier.py")
    )


def _restore(value: str) -> str | None:
    if value == "1":
        if restore_baked():
            return None
        return "is refused: the kv-offload-restore overlay is not baked (store only)"
    return None if value == "0" else "must be 0 or 1"


def _token(value: str) -> str | None:
    if _TOKEN.fullmatch(value):
        return None
    return "must be 1-64 of [A-Za-z0-9._-], starting alphanumeric"


def _group(value: str) -> str | None:
    if _GROUP.fullmatch(value):
        return None
    return "must be a group name: 1-32 of [A-Za-z0-9._-], not starting with a digit"


def size_bytes(value: str, bare_unit: str | None) -> int | None:
    """A SIZE in bytes, or None when it is not one: a decimal number and its
    unit (B, K/M/G/T and KB..TB: powers of 1000; KiB..TiB: powers of 1024),
    a fraction only with a unit above B, more than 0 and below 2^63. A bare
    number takes ``bare_unit`` (None: refused)."""
    m = _SIZE.fullmatch(value)
    if m is None:
        return None
    whole, frac, unit = m.group(1), m.group(2) or "", m.group(3)
    if not unit:
        if bare_unit is None:
            return None
        unit = bare_unit
    scale = SIZE_UNITS.get(unit)
    if scale is None or (frac and scale == 1):
        return None
    n = int(whole) * scale + (int(frac) * scale // 10 ** len(frac) if frac else 0)
    return n if 0 < n < 2**63 else None


def _disk_gb(value: str) -> str | None:
    if size_bytes(value, "G") is not None:
        return None
    unit = _SIZE.fullmatch(value)
    if unit and unit.group(3).lower() in {u.lower() for u in SIZE_UNITS}:
        return "units are case-sensitive: B, K M G T, KB..TB, KiB..TiB (e.g. 500G)"
    return (
        "must be a SIZE: GB as a decimal number (500, 0.5), or a number and its "
        "unit as `kvstore gc --max-bytes` takes it (500G, 465GiB, 0.5T); > 0"
    )


def disk_budget_bytes(value: str) -> int:
    """A valid ``GLM53_KV_OFFLOAD_DISK_GB`` value in bytes."""
    n = size_bytes(value, "G")
    if n is None:
        raise KnobError(f"{DISK_GB}={value}: {_disk_gb(value)}")
    return n


RULES: tuple[Rule, ...] = (
    Rule(ENABLE, "`0` or `1`", "`0` (off)", _flag),
    Rule(
        DIR,
        "absolute path of `[A-Za-z0-9._/@+-]`, no `.`/`..` components, not `/`; "
        "required when on",
        "-",
        _directory,
    ),
    Rule(CPU_GB, "integer 1..64; required when on", "-", _bounded(1, 64)),
    Rule(
        RESTORE,
        "`0` or `1` (`1` only with the kv-offload-restore overlay baked)",
        "`0`",
        _restore,
    ),
    # The name says "offload the drafter", and that is all it does: draft-model
    # groups join vLLM's KV offload set (the CPU tier). What reaches the disk
    # is the writer's rule, by group kind: a sliding-window drafter (EAGLE's
    # own group) is never written, so for it the knob changes the CPU tier
    # only; a full-attention drafter group is written and restored like any.
    Rule(
        DRAFTER,
        "`0` or `1`; `1` adds draft-model groups to vLLM's CPU offload tier; the disk "
        "store writes only full-attention ones (a sliding-window drafter, EAGLE's "
        "own group, never: for it the knob changes the CPU tier only)",
        "`0`",
        _flag,
    ),
    Rule(
        KEEP_BOUNDARIES,
        "integer 0..1024; 0 keeps every manifest",
        "`2`",
        _bounded(0, 1024),
    ),
    Rule(
        BUILD_ID,
        "1-64 of `[A-Za-z0-9._-]`, starting alphanumeric (fenced in the namespace)",
        "empty",
        _token,
    ),
    Rule(CAPTURE_MIB, "integer 16..65536 (MiB)", "`512`", _bounded(16, 65536)),
    Rule(
        GROUP,
        "a group the serving user is in: it may read the store (folders `02750`, "
        "files `0640`)",
        "empty: the serving user only (`0700`/`0600`)",
        _group,
    ),
    # Only the path here: the file itself (mode, owner, size) is checked by
    # kv_store_format.mac.load_key when the writer or restore starts.
    Rule(
        KEY_FILE,
        "absolute path of a secret key file (32..4096 bytes, mode `0600` or "
        "`0400`, owned by the serving user): every chunk carries a MAC (AES-GMAC "
        "under a per-chunk subkey bound to the rank) and every manifest an "
        "HMAC-SHA256, which the restore checks before use; another key is another "
        "namespace",
        "empty: no MAC (CRC-32 only)",
        _directory,
    ),
    Rule(
        DISK_GB,
        "a SIZE, > 0: GB (10^9 bytes) as a bare number (`500`, `0.5`), or a number "
        "and its unit as `kvstore gc --max-bytes` takes it (`500G`, `465GiB`, `0.5T`; "
        "B, K/M/G/T, KB..TB, KiB..TiB); the most this rank's store may hold; the writer "
        "retires least recently used chains to stay under it",
        "empty: unbounded",
        _disk_gb,
    ),
)
REQUIRED_WHEN_ON = (DIR, CPU_GB)
NAMES = tuple(rule.name for rule in RULES)
DEFAULT_KEEP_BOUNDARIES = 2
DEFAULT_CAPTURE_MIB = 512


@dataclass(frozen=True)
class Knobs:
    enabled: bool
    root: str  # normalised; "" when unset
    cpu_gb: int | None
    drafter: bool
    keep_boundaries: int
    build_id: str
    capture_mib: int = DEFAULT_CAPTURE_MIB
    group: str = ""  # the group that may read the store; "": private
    restore: bool = False  # GLM53_KV_OFFLOAD_RESTORE=1 (accepted only where baked)
    key_file: str = ""  # the MAC key's path; "": a keyless store
    disk_bytes: int | None = None  # GLM53_KV_OFFLOAD_DISK_GB in bytes; None: unbounded

    @property
    def capture_bytes(self) -> int:
        return self.capture_mib << 20


_PLAIN = re.compile(r"[A-Za-z0-9._/@+,:=-]+")


def _problem(name: str, value: str, problem: str) -> KnobError:
    """``NAME=value: problem``, the value quoted when it is not plain."""
    shown = value if _PLAIN.fullmatch(value) else repr(value)
    sep = " " if problem.startswith("is ") else ": "
    return KnobError(f"{name}={shown}{sep}{problem}")


def validate(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Check every ``GLM53_KV_OFFLOAD*`` variable; return the set ones.

    Raises KnobError naming the first bad variable.
    """
    env = os.environ if environ is None else environ
    unknown = sorted(n for n in env if n.startswith(PREFIX) and n not in NAMES)
    if unknown:
        raise KnobError(f"unknown knob {unknown[0]} (known: {' '.join(NAMES)})")
    values = {rule.name: env[rule.name] for rule in RULES if rule.name in env}
    for rule in RULES:
        if rule.name in values:
            problem = rule.check(values[rule.name])
            if problem is not None:
                raise _problem(rule.name, values[rule.name], problem)
    if values.get(ENABLE) == "1":
        for name in REQUIRED_WHEN_ON:
            if name not in values:
                raise KnobError(f"{name} is required when {ENABLE}=1")
    return values


def read_knobs(environ: Mapping[str, str] | None = None) -> Knobs:
    """Every knob, validated, with its default filled in."""
    values = validate(environ)
    root = values.get(DIR, "")
    return Knobs(
        enabled=values.get(ENABLE) == "1",
        root=os.path.normpath(root) if root else "",
        cpu_gb=int(values[CPU_GB]) if CPU_GB in values else None,
        drafter=values.get(DRAFTER) == "1",
        keep_boundaries=int(values.get(KEEP_BOUNDARIES, DEFAULT_KEEP_BOUNDARIES)),
        build_id=values.get(BUILD_ID, ""),
        capture_mib=int(values.get(CAPTURE_MIB, DEFAULT_CAPTURE_MIB)),
        group=values.get(GROUP, ""),
        restore=values.get(RESTORE) == "1",
        key_file=values.get(KEY_FILE, ""),
        disk_bytes=disk_budget_bytes(values[DISK_GB]) if DISK_GB in values else None,
    )


def _flag_knob(name: str, environ: Mapping[str, str] | None) -> bool:
    env = os.environ if environ is None else environ
    value = env.get(name)
    if value is None:
        return False
    problem = _flag(value)
    if problem is not None:
        raise _problem(name, value, problem)
    return value == "1"


def tier_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """``GLM53_KV_OFFLOAD`` alone, by its rule: whether the disk tier is on.

    The scope overlay's rules apply only then; the store-local writer
    validates every other knob when it starts.
    """
    return _flag_knob(ENABLE, environ)


def drafter_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The drafter knob alone, by its rule (read by the scope overlay)."""
    return _flag_knob(DRAFTER, environ)


def table() -> str:
    """The knob table of docs/DOCKER.md and the store-local overlay page."""
    lines = ["| variable | accepted | default |", "| --- | --- | --- |"]
    lines += [f"| `{r.name}` | {r.accepted} | {r.default} |" for r in RULES]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    global _restore_baked_flag
    if argv == ["check", "--restore-baked"]:
        _restore_baked_flag = True
        argv = ["check"]
    if argv == ["check"]:
        try:
            knobs = read_knobs()
        except KnobError as e:
            print(e, file=sys.stderr)
            return EXIT_REFUSED
        print(1 if knobs.enabled else 0)
        return 0
    if argv == ["names"]:
        print("\n".join(NAMES))
        return 0
    if argv == ["table"]:
        sys.stdout.write(table())
        return 0
    print(
        "usage: kv_offload_knobs.py check [--restore-baked]|names|table",
        file=sys.stderr,
    )
    return EXIT_REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
