"""The kvstore CLI against a catalogue of deliberately broken stores.

Every store is generated here with the Python format codec; each case asserts
the exit code, the exact report, and after a sweep the exact set of files left.
Exit codes: 0 clean, 1 problems, 2 usage, 3 I/O error, 4 refused.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO_ROOT, TESTS_PYTHON
from kvstore_support import (
    FULL_GROUP,
    STATE_GROUP,
    Store,
    age,
    age_tree,
    files_under,
    flip_bit,
    fmt,
    key_of,
    run,
)

HERE = Path(__file__).resolve().parent


@pytest.fixture
def kv(kvstore_bin):
    def call(*args: str, user: str | None = None):
        return run(kvstore_bin, *args, user=user)

    return call


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "tier")


def tree_bytes(root: Path) -> int:
    return sum(
        p.stat().st_size
        for p in root.rglob("*.bin")
        if p.is_file() and not p.is_symlink() and ".tmp." not in p.name
    )


def summary(verb: str, store: Store, chunks: int, manifests: int, **kinds: int) -> str:
    total = sum(kinds.values())
    if total:
        parts = ", ".join(
            f"{n} {k.replace('_', '-')}" for k, n in sorted(kinds.items()) if n
        )
        tail = f"{total} finding(s): {parts}"
    else:
        tail = "no problems"
    return (
        f"{verb}: 1 rank(s), {chunks} chunk(s), {manifests} manifest(s), "
        f"{tree_bytes(store.base)} bytes; {tail}\n"
    )


def in_rank(store: Store, rel: str) -> str:
    """A path inside the rank base as the tier-level report shows it."""
    return f"{store.name}/{rel}"


def chunk_path(store: Store, name: str, group: int) -> Path:
    return store.tier / store.chunk_rel(name, group)


def manifest_path(store: Store, names: list[str]) -> Path:
    return store.tier / store.manifest_rel(names)


def chunk_in_rank(name: str, group: int) -> str:
    return fmt.chunk_rel_path(key_of(name), group)


def lines(text: str) -> list[str]:
    return text.splitlines()


def two_boundaries(store: Store) -> None:
    store.boundary(["a"])
    store.boundary(["a", "b"])
    age_tree(store.tier)


# --------------------------------------------------------------------------
# Clean stores
# --------------------------------------------------------------------------


def test_clean_store_verifies(kv, store):
    two_boundaries(store)
    r = kv("verify", str(store.tier))
    assert r.code == 0, r.err
    assert r.out == summary("verify", store, 4, 2)
    assert r.err == ""  # no progress line when piped


def test_clean_rank_base_as_root(kv, store):
    two_boundaries(store)
    r = kv("verify", str(store.base))
    assert r.code == 0, r.out
    assert r.out == summary("verify", store, 4, 2)


def test_clean_store_gc_plans_nothing(kv, store):
    two_boundaries(store)
    r = kv("gc", str(store.tier))
    assert r.code == 0
    assert (
        lines(r.out)[0]
        == "plan: 0 file(s), 0 bytes would be freed (dry run; --sweep deletes)"
    )


def test_several_ranks(kv, tmp_path):
    tier = tmp_path / "tier"
    stores = [Store(tier, rank=0), Store(tier, rank=1)]
    for s in stores:
        s.boundary(["a"])
    age_tree(tier)
    r = kv("verify", str(tier))
    assert r.code == 0, r.out
    assert r.out.startswith("verify: 2 rank(s), 4 chunk(s), 2 manifest(s)")


# --------------------------------------------------------------------------
# Damaged chunks and manifests
# --------------------------------------------------------------------------


def test_a_named_chunk_that_is_a_fifo_is_not_called_missing(kv, store):
    """Something is there, so the manifest is not 'missing' its chunk: the
    report says what is there (the FIFO itself is also foreign)."""
    two_boundaries(store)
    path = chunk_path(store, "b", STATE_GROUP)
    path.unlink()
    os.mkfifo(path)
    m2 = store.manifest_rel(["a", "b"])
    r = kv("verify", str(store.tier))
    assert r.code == 1
    got = lines(r.out)[:-1]
    assert (
        f"{m2}: mismatch: names {chunk_in_rank('b', STATE_GROUP)}, "
        "which is not a regular file"
    ) in got, got
    assert not any(": missing:" in line for line in got), got


def test_missing_chunk(kv, store):
    two_boundaries(store)
    chunk_path(store, "b", STATE_GROUP).unlink()
    m2 = store.manifest_rel(["a", "b"])
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == [
        f"{m2}: missing: names {chunk_in_rank('b', STATE_GROUP)}, which does not exist"
    ]
    assert r.out.endswith(summary("verify", store, 3, 2, missing=1))

    r = kv("gc", str(store.tier))
    assert r.code == 1  # damage found
    assert lines(r.out)[:3] == [
        f"would delete {m2}: bad-manifest: names a missing or damaged chunk "
        f"({manifest_path(store, ['a', 'b']).stat().st_size} bytes)",
        f"would delete {store.chunk_rel('b', FULL_GROUP)}: superseded-payload: "
        f"named only by manifests this plan deletes "
        f"({chunk_path(store, 'b', FULL_GROUP).stat().st_size} bytes)",
        "plan: 2 file(s), "
        f"{manifest_path(store, ['a', 'b']).stat().st_size + chunk_path(store, 'b', FULL_GROUP).stat().st_size}"
        " bytes would be freed (dry run; --sweep deletes)",
    ]

    r = kv("gc", "--sweep", str(store.tier))
    # Every damaged file it found is gone: a repair, exit 0 (issue 48).
    assert r.code == 0, r.out
    assert r.out.endswith("; all 1 damaged removed by this sweep\n"), r.out
    assert files_under(store.tier) == {
        f"{store.name}.json",
        in_rank(store, ".lock"),
        store.manifest_rel(["a"]),
        store.chunk_rel("a", FULL_GROUP),
        store.chunk_rel("a", STATE_GROUP),
    }
    r = kv("verify", str(store.tier))
    assert r.code == 0, r.out


def test_truncated_chunk(kv, store):
    two_boundaries(store)
    p = chunk_path(store, "b", STATE_GROUP)
    size = p.stat().st_size
    os.truncate(p, size - 10)
    age(p)
    m2 = store.manifest_rel(["a", "b"])
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == [
        f"{store.chunk_rel('b', STATE_GROUP)}: truncated: "
        f"{size - 10} bytes, chunk needs {size}",
        f"{m2}: mismatch: names {chunk_in_rank('b', STATE_GROUP)}, "
        "which is damaged or unreadable",
    ]
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 0 and r.out.endswith("; all 2 damaged removed by this sweep\n"), (
        r.out
    )
    assert files_under(store.tier) == {
        f"{store.name}.json",
        in_rank(store, ".lock"),
        store.manifest_rel(["a"]),
        store.chunk_rel("a", FULL_GROUP),
        store.chunk_rel("a", STATE_GROUP),
    }


def test_flipped_header_bit_breaks_every_manifest_and_refuses(kv, store):
    two_boundaries(store)
    p = chunk_path(store, "a", FULL_GROUP)
    flip_bit(p, 50)  # inside the namespace hash
    age(p)
    r = kv("verify", str(store.tier))
    assert r.code == 1
    out = lines(r.out)
    assert out[0].startswith(
        f"{store.chunk_rel('a', FULL_GROUP)}: corrupt: header_checksum_mismatch: "
        "header checksum "
    )
    assert out[1:3] == [
        f"{store.manifest_rel(['a', 'b'])}: mismatch: names "
        f"{chunk_in_rank('a', FULL_GROUP)}, which is damaged or unreadable",
        f"{store.manifest_rel(['a'])}: mismatch: names "
        f"{chunk_in_rank('a', FULL_GROUP)}, which is damaged or unreadable",
    ]
    before = files_under(store.tier)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 4
    assert f"refused {store.name}: the plan would delete every manifest (2)" in lines(
        r.out
    )
    assert files_under(store.tier) == before | {in_rank(store, ".lock")}


def test_flipped_payload_bit(kv, store):
    two_boundaries(store)
    p = chunk_path(store, "b", STATE_GROUP)
    flip_bit(p, p.stat().st_size - 1, 3)
    age(p)
    r = kv("verify", str(store.tier))
    assert r.code == 1
    out = lines(r.out)
    assert out[0].startswith(
        f"{store.chunk_rel('b', STATE_GROUP)}: corrupt: payload_checksum_mismatch: "
    )
    assert out[1] == (
        f"{store.manifest_rel(['a', 'b'])}: mismatch: names "
        f"{chunk_in_rank('b', STATE_GROUP)}, which is damaged or unreadable"
    )
    # gc reads headers only by default: a payload flip needs --verify-payloads.
    r = kv("gc", str(store.tier))
    assert r.code == 0
    assert "plan: 0 file(s)" in r.out
    r = kv("gc", "--verify-payloads", "--sweep", str(store.tier))
    assert r.code == 0 and r.out.endswith("; all 2 damaged removed by this sweep\n"), (
        r.out
    )
    assert files_under(store.tier) == {
        f"{store.name}.json",
        in_rank(store, ".lock"),
        store.manifest_rel(["a"]),
        store.chunk_rel("a", FULL_GROUP),
        store.chunk_rel("a", STATE_GROUP),
    }


def test_wrong_namespace_chunk(kv, store):
    store.boundary(["a"])
    other = bytes(32)
    store.chunk(key_of("a"), STATE_GROUP, 64, ns_hash=other)
    age_tree(store.tier)
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == [
        f"{store.chunk_rel('a', STATE_GROUP)}: wrong-namespace: header namespace "
        f"0000000000000000 differs from the record's {store.ns_hash.hex()[:16]}",
        f"{store.manifest_rel(['a'])}: mismatch: names "
        f"{chunk_in_rank('a', STATE_GROUP)}, which is damaged or unreadable",
    ]


def test_manifest_naming_a_mismatched_chunk(kv, store):
    two_boundaries(store)
    m = store.manifest_for([key_of("a"), key_of("b")])
    state = m.groups[1]
    entry = state.entries[0]
    bad = fmt.ManifestEntry(entry.key, entry.length, entry.checksum ^ 1)
    m = fmt.BoundaryManifest(
        m.namespace,
        m.rank,
        m.boundary,
        m.chunk_tokens,
        m.chain,
        (m.groups[0], fmt.ManifestGroup(state.group, state.kind, (bad,))),
    )
    age(store.write_manifest(m))
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == [
        f"{store.manifest_rel(['a', 'b'])}: mismatch: names "
        f"{chunk_in_rank('b', STATE_GROUP)} as length {entry.length} checksum "
        f"{entry.checksum ^ 1:08x}; its header says length {entry.length} checksum "
        f"{entry.checksum:08x}"
    ]


def test_manifest_entry_with_dotdot_refuses_sweep(kv, store):
    two_boundaries(store)
    path = manifest_path(store, ["a", "b"])
    body = json.loads(path.read_bytes())
    body["groups"][1]["entries"][0][0] = "../../../../etc/passwd"
    del body["checksum"]
    body["checksum"] = f"{fmt.crc32(fmt.canonical_json(body)):08x}"
    path.write_bytes(fmt.canonical_json(body))
    age(path)
    m2 = store.manifest_rel(["a", "b"])
    r = kv("verify", str(store.tier))
    assert r.code == 1
    out = lines(r.out)[:-1]
    # Unparsed, it names nothing: the b chunks look like orphans, which is why
    # a sweep must refuse until someone looks.
    assert out[:2] == [
        f"{store.chunk_rel('b', FULL_GROUP)}: orphan: named by no manifest "
        f"(full group {FULL_GROUP})",
        f"{store.chunk_rel('b', STATE_GROUP)}: orphan: named by no manifest "
        f"(state group {STATE_GROUP})",
    ]
    assert out[2].startswith(f"{m2}: bad-manifest: bad_field: ")
    assert len(out) == 3

    before = files_under(store.tier)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 4
    assert f"refused {m2}: manifest could not be parsed" in lines(r.out)
    assert files_under(store.tier) == before | {in_rank(store, ".lock")}

    # Forced: an unparsable manifest hides what it names as an unreadable one
    # does (issue 37), so it stays, the b payloads it may name stay, and
    # nothing outside the root is touched.
    r = kv("gc", "--sweep", "--force", str(store.tier))
    assert r.code == 1, r.out
    assert files_under(store.tier) == before | {in_rank(store, ".lock")}


# --------------------------------------------------------------------------
# Retention, orphans, temps
# --------------------------------------------------------------------------

FORK = [
    ["a"],
    ["a", "b"],
    ["a", "b", "c"],
    ["a", "b", "c", "d"],
    ["a", "b", "x"],
    ["a", "b", "x", "y"],
    ["a", "b", "x", "y", "z"],
]


def test_forked_chains_keep_k(kv, store):
    for names in FORK:
        store.boundary(names)
    age_tree(store.tier)
    r = kv("gc", "--keep", "3", str(store.tier))
    assert r.code == 0
    planned = [line.split(": ")[0] for line in lines(r.out) if line.startswith("would")]
    assert planned == [
        f"would delete {store.manifest_rel(['a'])}",
        f"would delete {store.chunk_rel('a', STATE_GROUP)}",
    ]
    # keep 2 comes from the namespace record's info.keep_boundaries.
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 0, r.out
    kept = [FORK[2], FORK[3], FORK[5], FORK[6]]
    full = {"a", "b", "c", "d", "x", "y", "z"}
    assert files_under(store.tier) == (
        {f"{store.name}.json", in_rank(store, ".lock")}
        | {store.manifest_rel(n) for n in kept}
        | {store.chunk_rel(n[-1], STATE_GROUP) for n in kept}
        | {store.chunk_rel(k, FULL_GROUP) for k in full}
    )
    assert kv("verify", str(store.tier)).code == 0


def test_zero_manifests_with_orphans(kv, store):
    store.chunk(key_of("s1"), STATE_GROUP, 64)
    store.chunk(key_of("s2"), STATE_GROUP, 128)
    store.chunk(key_of("f1"), FULL_GROUP, 64)
    age_tree(store.tier)
    store.chunk(key_of("fresh"), STATE_GROUP, 64)  # in flight: within grace
    r = kv("verify", str(store.tier))
    assert r.code == 1
    expected = sorted(
        [
            f"{store.chunk_rel('s1', STATE_GROUP)}: orphan: named by no manifest "
            f"(state group {STATE_GROUP})",
            f"{store.chunk_rel('s2', STATE_GROUP)}: orphan: named by no manifest "
            f"(state group {STATE_GROUP})",
            f"{store.chunk_rel('f1', FULL_GROUP)}: orphan: named by no manifest "
            f"(full group {FULL_GROUP})",
        ]
    )
    assert lines(r.out)[:-1] == expected
    r = kv("gc", str(store.tier))
    assert r.code == 0  # orphans are garbage, not damage
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 0, r.out
    assert files_under(store.tier) == {
        f"{store.name}.json",
        in_rank(store, ".lock"),
        store.chunk_rel("fresh", STATE_GROUP),
    }


def test_stale_and_fresh_temps(kv, store):
    store.boundary(["a"])
    age_tree(store.tier)
    leaf = chunk_path(store, "a", FULL_GROUP).parent
    stale = leaf / f"{key_of('t1')[:3]}x.bin.tmp.1.2"  # not a chunk name: foreign
    stale.write_bytes(b"x")
    chunk_tmp = leaf / f"{chunk_path(store, 'a', FULL_GROUP).name}.tmp.11.12"
    chunk_tmp.write_bytes(b"partial")
    age(chunk_tmp)
    fresh_tmp = leaf / f"{chunk_path(store, 'a', FULL_GROUP).name}.tmp.13.14"
    fresh_tmp.write_bytes(b"partial")
    mtmp = store.base / "manifests" / f"{manifest_path(store, ['a']).name}.tmp.5.6"
    mtmp.write_bytes(b"{")
    age(mtmp)
    rec_old = store.tier / f"{store.name}.json.tmp.7.8"
    rec_old.write_bytes(b"{")
    age(rec_old)
    rec_new = store.tier / f"{store.name}.json.tmp.9.10"
    rec_new.write_bytes(b"{")
    age(stale)
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == sorted(
        [
            f"{store.rel(rec_old)}: stale-temp: namespace record temp older than the "
            "grace period",
            f"{store.rel(stale)}: foreign: not part of the store format",
            f"{store.rel(chunk_tmp)}: stale-temp: writer temp older than the grace period",
            f"{store.rel(mtmp)}: stale-temp: writer temp older than the grace period",
        ]
    )
    r = kv("gc", str(store.tier))
    planned = sorted(
        line.split(": ")[0] for line in lines(r.out) if line.startswith("would")
    )
    assert planned == sorted(
        f"would delete {store.rel(p)}" for p in (rec_old, chunk_tmp, mtmp)
    )
    # Under LOCK_EX no writer is mid-job, so even the fresh chunk temp goes;
    # the fresh record temp (written outside the lock) stays for its grace.
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 1, r.out  # the foreign file is damage, and is never deleted
    assert files_under(store.tier) == {
        f"{store.name}.json",
        store.rel(rec_new),
        in_rank(store, ".lock"),
        store.rel(stale),
        store.manifest_rel(["a"]),
        store.chunk_rel("a", FULL_GROUP),
        store.chunk_rel("a", STATE_GROUP),
    }


# --------------------------------------------------------------------------
# Safety: symlinks, foreign files, unreadable files, namespace record
# --------------------------------------------------------------------------


def test_symlinks_are_reported_never_followed(kv, store, tmp_path):
    two_boundaries(store)
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.bin"
    victim.write_bytes(b"precious")
    age(victim)
    leaf = chunk_path(store, "a", STATE_GROUP).parent
    link = leaf / f"{key_of('zz')}.bin"
    link.symlink_to(victim)
    dir_link = store.tier / "elsewhere"
    dir_link.symlink_to(outside)
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == sorted(
        [
            f"{store.rel(link)}: symlink: symlink, not followed",
            "elsewhere: symlink: symlink, not followed",
        ]
    )
    r = kv("gc", "--sweep", "--keep", "1", str(store.tier))
    assert r.code == 1, r.out
    assert victim.read_bytes() == b"precious"
    assert link.is_symlink() and dir_link.is_symlink()
    assert (
        kv("verify", str(dir_link)).code == 6
    )  # a symlinked ROOT is refused (I/O, README's table)


def test_foreign_files_are_reported_never_deleted(kv, store):
    two_boundaries(store)
    (store.base / "notes.txt").write_text("ops notes")
    (store.base / "junk").mkdir()
    (store.base / "junk" / "x.bin").write_bytes(b"x")
    age_tree(store.tier)
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == [
        f"{in_rank(store, 'junk')}: foreign: directory not part of the store format",
        f"{in_rank(store, 'notes.txt')}: foreign: not part of the store format",
    ]
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 1
    assert (store.base / "notes.txt").exists()
    assert (store.base / "junk" / "x.bin").exists()


def _unprivileged_store(tmp_root: Path) -> tuple[Store, str | None]:
    """A store another user can read; returns it and the user to run as."""
    if os.geteuid() != 0:
        return Store(tmp_root / "tier"), None
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a file unreadable")
    tmp_root.chmod(0o755)
    s = Store(tmp_root / "tier")
    return s, "65534"


def test_a_rank_base_root_needs_only_search_permission_on_its_tier(kv):
    """The namespace record beside a rank base is read through the tier
    folder, which a user may only pass through (0711), as cat can."""
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store, user = _unprivileged_store(Path(tmp))
        if user is None:
            pytest.skip("needs root to run as another user")
        two_boundaries(store)
        age_tree(store.tier)
        for dirpath, dirs, files in os.walk(store.tier):
            for n in dirs + files:
                os.chown(Path(dirpath) / n, 65534, 65534)
        store.tier.chmod(0o711)  # root's: nobody can pass through, not list
        r = kv("verify", str(store.base), user=user)
        assert r.code == 0, r.out + r.err
        assert r.out.startswith("verify: 1 rank(s), 4 chunk(s), 2 manifest(s)"), r.out


def test_unreadable_file_is_reported_and_refuses_sweep(kv):
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store, user = _unprivileged_store(Path(tmp))
        two_boundaries(store)
        target = chunk_path(store, "b", STATE_GROUP)
        if user is not None:
            for dirpath, dirs, files in os.walk(store.tier):
                for n in dirs + files:
                    os.chown(Path(dirpath) / n, 65534, 65534)
            os.chown(store.tier, 65534, 65534)
            os.chown(target, 0, 0)
        target.chmod(0)
        try:
            r = kv("verify", str(store.tier), user=user)
            assert r.code == 1, r.err
            assert lines(r.out)[:-1] == [
                f"{store.chunk_rel('b', STATE_GROUP)}: unreadable: cannot open: "
                "Permission denied",
                f"{store.manifest_rel(['a', 'b'])}: mismatch: names "
                f"{chunk_in_rank('b', STATE_GROUP)}, which is damaged or unreadable",
            ]
            before = files_under(store.tier)
            r = kv("gc", "--sweep", str(store.tier), user=user)
            assert r.code == 4, r.out + r.err
            assert files_under(store.tier) == before | {in_rank(store, ".lock")}
        finally:
            target.chmod(0o644)


def test_a_fifo_namespace_record_is_one_finding_and_no_hang(kv, store):
    two_boundaries(store)
    record = Path(store.layout.namespace_record)
    record.unlink()
    os.mkfifo(record)
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == [f"{record.name}: bad-namespace: not a regular file"]
    assert kv("gc", "--sweep", str(store.tier)).code == 4  # refused, nothing deleted


def test_missing_namespace_record_refuses_sweep(kv, store):
    two_boundaries(store)
    Path(store.layout.namespace_record).unlink()
    r = kv("verify", str(store.tier))
    assert r.code == 1
    assert lines(r.out)[:-1] == [
        f"{store.name}.json: bad-namespace: namespace record missing"
    ]
    r = kv("gc", "--sweep", "--keep", "1", str(store.tier))
    assert r.code == 4
    assert (
        f"refused {store.name}: rank folder without its namespace record: "
        f"{store.name}.json does not exist beside it"
    ) in lines(r.out)


# --------------------------------------------------------------------------
# stat, inspect, usage
# --------------------------------------------------------------------------


def test_stat_json_and_prometheus(kv, store, tmp_path):
    for names in FORK:
        store.boundary(names)
    age_tree(store.tier)
    prom = tmp_path / "kvstore.prom"
    r = kv("stat", "--json", "--prometheus", str(prom), str(store.tier))
    assert r.code == 0, r.err
    data = json.loads(r.out)
    (rank,) = data["ranks"]
    assert rank["rank"] == 0
    assert rank["chunks"] == 14 and rank["manifests"] == 7
    assert [(g["group"], g["kind"], g["chunks"]) for g in rank["groups"]] == [
        (FULL_GROUP, "full", 7),
        (STATE_GROUP, "state", 7),
    ]
    assert sorted((c["boundary"], c["manifests"]) for c in rank["chains"]) == [
        (256, 4),
        (320, 5),
    ]
    assert rank["newest_boundary_age_s"] >= 3599
    text = prom.read_text()
    labels = f'rank="0",base="{store.name}"'
    assert (
        f'kvstore_group_chunks{{{labels},group="2",kind="state"}} 7'
        in text.splitlines()
    )
    assert f"kvstore_rank_manifests{{{labels}}} 7" in text.splitlines()
    assert f"kvstore_rank_chains{{{labels}}} 2" in text.splitlines()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("kvstore")] == [
        "kvstore.prom"
    ]


def test_inspect(kv, store):
    store.boundary(["a"])
    p = chunk_path(store, "a", STATE_GROUP)
    r = kv("inspect", "--json", str(p))
    assert r.code == 0, r.err
    h = json.loads(r.out)
    assert h["group"] == STATE_GROUP and h["key"] == key_of("a")
    assert h["boundary"] == 64 and h["payload"] == "ok"
    assert [(s["layer"], s["kind"]) for s in h["segments"]] == [
        (0, "conv"),
        (0, "temporal"),
        (1, "conv"),
        (1, "temporal"),
    ]
    r = kv("inspect", str(p))
    assert r.code == 0
    assert f"key                 {key_of('a')}" in lines(r.out)
    flip_bit(p, 9)
    r = kv("inspect", str(p))
    assert r.code == 1
    assert r.out.startswith(f"{p}: invalid chunk: unsupported_version: ")
    link = p.parent / "link.bin"
    link.symlink_to(p)
    assert kv("inspect", str(link)).code == 6


def test_v1_and_v2_stores_verify_and_inspect_shows_parts(kv, tmp_path):
    """kvstore reads format v1 (an old writer's store) and v2 side by side;
    inspect shows each file's version and, in v2, each segment's part."""
    old = Store(tmp_path, format_version=1)
    old.boundary(["a", "b"])
    new = Store(tmp_path)
    assert new.name != old.name  # the version is fenced: another namespace
    new.boundary(["a"])
    # A KDA-style state payload: conv parts q, k, v, then the temporal state.
    segs = fmt.make_segments(
        [
            (0, fmt.SegmentKind.CONV, fmt.DType.BFLOAT16, (4, 3), (3, 1), 0),
            (0, fmt.SegmentKind.CONV, fmt.DType.BFLOAT16, (2, 3), (3, 1), 1),
            (0, fmt.SegmentKind.CONV, fmt.DType.FLOAT32, (2, 3), (3, 1), 2),
            (0, fmt.SegmentKind.TEMPORAL, fmt.DType.FLOAT32, (2, 4), (4, 1)),
        ]
    )
    key = key_of("a")
    body = bytes(range(92))
    data = fmt.encode_chunk(
        fmt.make_header(new.ns_hash, STATE_GROUP, bytes.fromhex(key), 64, segs, body),
        body,
    )
    p = chunk_path(new, "a", STATE_GROUP)
    p.write_bytes(data)
    header = fmt.decode_header(data)
    new.entries[f"{STATE_GROUP}/{key}"] = fmt.ManifestEntry(
        key, header.payload_length, header.payload_checksum
    )
    new.write_manifest(new.manifest_for([key]))
    r = kv("verify", str(tmp_path))
    assert r.code == 0, r.out + r.err
    h = json.loads(kv("inspect", "--json", str(p)).out)
    assert h["format_version"] == 2 and h["payload"] == "ok"
    assert [(s["kind"], s["part"], s["dtype"]) for s in h["segments"]] == [
        ("conv", 0, "bfloat16"),
        ("conv", 1, "bfloat16"),
        ("conv", 2, "float32"),
        ("temporal", 0, "float32"),
    ]
    text = kv("inspect", str(p)).out
    assert "format_version      2" in lines(text)
    assert any(" conv     part   2 float32 " in line for line in lines(text)), text
    h = json.loads(kv("inspect", "--json", str(chunk_path(old, "b", STATE_GROUP))).out)
    assert h["format_version"] == 1 and {s["part"] for s in h["segments"]} == {0}
    # A v1 file whose reserved byte is set stays invalid (it is no part).
    v1 = chunk_path(old, "b", STATE_GROUP)
    raw = bytearray(v1.read_bytes())
    raw[144 + 120 + 7] = 1
    hl = fmt.header_length_for(len(h["segments"]))
    raw[hl - 4 : hl] = fmt.crc32(bytes(raw[: hl - 4])).to_bytes(4, "little")
    v1.write_bytes(bytes(raw))
    r = kv("inspect", str(v1))
    assert r.code == 1 and "reserved_nonzero" in r.out, r.out
    assert kv("verify", str(tmp_path)).code == 1


def test_usage_and_io_errors(kv, tmp_path):
    assert kv().code == 2
    assert kv("verify").code == 2
    assert kv("gc", "--bogus", str(tmp_path)).code == 2
    assert kv("gc", "--force", str(tmp_path)).code == 2
    assert kv("gc", "--keep", "2000", str(tmp_path)).code == 2
    r = kv("verify", str(tmp_path / "missing"))
    assert r.code == 2
    assert r.err == f"kvstore: {tmp_path / 'missing'}: does not exist\n"
    r = kv("--help")
    assert r.code == 0 and "4  refused for safety" in r.out


def test_empty_tier_is_no_store_here(kv, tmp_path):
    """An empty folder (an unmounted disk) is not a clean store (issue 48)."""
    r = kv("verify", str(tmp_path))
    assert r.code == 8 and r.out == ""
    assert "no store here (empty" in r.err


# --------------------------------------------------------------------------
# A live writer
# --------------------------------------------------------------------------


def test_sweeps_beside_a_live_writer_never_break_a_manifest(kv, tmp_path):
    """Sweeps with --grace 0 while a writer publishes: only the lock protects
    the writer's in-flight chunks, so a manifest naming a missing file would
    show that the lock failed."""
    tier = tmp_path / "tier"
    Store(tier)  # namespace record + rank base before the writer starts
    stop = tmp_path / "stop"
    writer = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "kvstore_writer_loop.py"),
            str(tier),
            str(stop),
            "200",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    deleted = 0
    manifests = tier / Store(tier).name / "manifests"
    try:
        deadline = time.monotonic() + 30
        while not (manifests.is_dir() and any(manifests.iterdir())):
            assert time.monotonic() < deadline, "the writer published nothing"
            time.sleep(0.01)
        for _ in range(12):
            r = kv("gc", "--sweep", "--json", "--grace", "0", "--keep", "2", str(tier))
            # Exit 0: the summary is the locked scan's, which sees no damage.
            assert r.code == 0, r.out + r.err
            deleted += sum(s["deleted"] for s in json.loads(r.out)["sweeps"])
    finally:
        stop.touch()
        out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0
    published, lost = map(int, out.split())
    assert published > 0
    # Each boundary is written in two jobs with the lock dropped between them:
    # only the pending record keeps job 1's chunks from being swept as orphans.
    assert lost == 0
    assert deleted > 0  # the sweeps did delete superseded manifests and payloads
    r = kv("verify", "--json", str(tier))
    findings = json.loads(r.out)["findings"]
    assert [f for f in findings if f["kind"] not in ("orphan", "stale-temp")] == []
    assert r.code == 0, r.out


def sweep_beside_real_writers(
    kv, tier: Path, seconds: float, disk_bytes: int | None = None
) -> dict:
    """Two real store-local writers (ranks 0 and 1) and `gc --sweep --grace 0`
    back to back for ``seconds``; returns the writers' reports and the sweeps'
    figures."""
    stop = tier.parent / "stop"
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "store_local_sweep_writer.py"),
                str(tier),
                str(stop),
                str(rank),
                "100000",
                *([str(disk_bytes)] if disk_bytes else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    sweeps = deleted = 0
    try:
        deadline = time.monotonic() + 60
        while len([p for p in tier.glob("*/manifests/*.json")]) < 2:
            assert time.monotonic() < deadline, "the writers published nothing"
            assert all(w.poll() is None for w in writers)
            time.sleep(0.01)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            r = kv("gc", "--sweep", "--json", "--grace", "0", str(tier))
            assert r.code == 0, r.out + r.err
            deleted += sum(s["deleted"] for s in json.loads(r.out)["sweeps"])
            sweeps += 1
    finally:
        stop.touch()
        reports = []
        for w in writers:
            out, _ = w.communicate(timeout=120)
            reports.append(out)
    assert [w.returncode for w in writers] == [0, 0], reports
    return {
        "writers": [json.loads(out.splitlines()[-1]) for out in reports],
        "sweeps": sweeps,
        "deleted": deleted,
    }


def test_sweeps_beside_real_writers_at_their_disk_budget(kv, tmp_path):
    """Issue 33: the same, with each writer at a disk budget (about four of
    its six-chunk conversations): the writers evict while sweeps run, and
    the store still verifies (orphans at most), every boundary published."""
    tier = tmp_path / "tier"
    got = sweep_beside_real_writers(kv, tier, 4, disk_bytes=60_000)
    for report in got["writers"]:
        assert report["boundaries"] > 0, report
        assert report["chain_trees_evicted"] > 0, report
        assert report["writes_refused_disk_budget"] == 0, report
        assert (report["published"], report["dropped"]) == (
            report["boundaries"],
            0,
        ), report
    r = kv("verify", "--json", str(tier))
    findings = json.loads(r.out)["findings"]
    assert [f for f in findings if f["kind"] not in ("orphan", "stale-temp")] == []
    for base in (p for p in tier.iterdir() if p.is_dir()):
        held = sum(f.stat().st_size for f in base.rglob("*") if f.is_file())
        assert held <= 60_000, (base, held)


def test_sweeps_at_grace_0_beside_real_writers_lose_no_boundary(kv, tmp_path):
    """Issue 37: the real writer (kv_store_local) writes a boundary's
    full-attention chunks in a job that names no candidate, goes idle (lock
    dropped), then writes its state payloads. Sweeps at --grace 0 in between
    must find job 1's chunks in the pending record: every boundary published.
    KVTIER_LIVE_SWEEP_SECONDS sets the length (docs/KVSTORE.md: the long run)."""
    seconds = float(os.environ.get("KVTIER_LIVE_SWEEP_SECONDS", "6"))
    tier = tmp_path / "tier"
    got = sweep_beside_real_writers(kv, tier, seconds)
    print(json.dumps(got))  # the long run's figures (pytest -s)
    for report in got["writers"]:
        assert report["boundaries"] > 0, report
        assert report["keys_failed"] == 0, report
        # Every boundary submitted was published (none refused for a chunk
        # a sweep deleted); superseded ones went by keep-K afterwards.
        assert (report["published"], report["dropped"]) == (
            report["boundaries"],
            0,
        ), report
    assert got["sweeps"] > 0, got
    r = kv("verify", "--json", str(tier))
    findings = json.loads(r.out)["findings"]
    # The writers shut down cleanly: nothing pending, nothing orphaned.
    assert findings == [], findings
    assert r.code == 0, r.out


def test_bench_smoke(kvstore_bin, tmp_path):
    """The benchmark script runs end to end on tiny sizes (figures not judged)."""
    r = subprocess.run(
        [
            sys.executable,
            str(REPO_ROOT / "bench" / "kvstore_bench.py"),
            "--smoke",
            "--kvstore",
            str(kvstore_bin),
            "--dir",
            str(tmp_path / "bench"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for part in (
        "verify-large (written)",
        "verify-large (re-read)",
        "verify-small",
        "gc:",
        "gc-manifests",
        "sweep:",
    ):
        assert part in out
    for label in (
        "ratio verify/C reference",
        "ratio verify/C walk+read+CRC",
        "ratio verify/C walk+read+CRC, no fstat",
        "ratio verify/python",
        "ratio gc/find",
        "ratio sweep/(rm + sync)",
        "ratio sweep/(find -delete + sync)",
    ):
        assert label in out
    # Every ratio also comes as the median over the rounds (one in --smoke).
    ratios = [line for line in out.splitlines() if line.startswith("  ratio ")]
    assert len(ratios) >= 10
    assert all("(median of 1 rounds: wall " in line for line in ratios), ratios


# --------------------------------------------------------------------------
# Issue 21: what a reader from the spec, broken stores and a live writer found
# --------------------------------------------------------------------------


def _rewrite_manifest(path: Path, edit) -> None:
    """Edits a manifest's JSON body and re-signs it (checksum recomputed)."""
    body = json.loads(path.read_bytes())
    del body["checksum"]
    edit(body)
    body["checksum"] = f"{fmt.crc32(fmt.canonical_json(body)):08x}"
    path.write_bytes(fmt.canonical_json(body))


def test_verify_checks_each_chunks_boundary_token_index(kv, store):
    two_boundaries(store)
    # Chunk b of the full group claims to end at token 3 x 64, but it is the
    # second chunk of the chain: FORMAT.md 5 says 2 x 64. Payload unchanged.
    path = store.chunk(key_of("b"), FULL_GROUP, 3 * 64)
    age(path)
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out
    assert lines(r.out)[:-1] == [
        f"{store.manifest_rel(['a', 'b'])}: mismatch: names {chunk_in_rank('b', FULL_GROUP)} "
        "at boundary token index 128; its header says 192",
    ]


def test_verify_checks_a_groups_kind_against_its_segments(kv, store):
    two_boundaries(store)
    path = manifest_path(store, ["a", "b"])
    # A state group (3) whose one entry is a chunk with full-group segments.
    full_b = store.chunk(key_of("b"), STATE_GROUP + 1, 128)  # full segments, group 3
    age(full_b)
    m = store.manifest_for([key_of("a"), key_of("b")])
    wrong = fmt.ManifestGroup(
        STATE_GROUP + 1,
        fmt.GROUP_KIND_STATE,
        (store.entries[f"{STATE_GROUP + 1}/{key_of('b')}"],),
    )
    m = fmt.BoundaryManifest(
        m.namespace, m.rank, m.boundary, m.chunk_tokens, m.chain, (*m.groups, wrong)
    )
    path.write_bytes(fmt.encode_manifest(m))
    age(path)
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out
    rel3 = fmt.chunk_rel_path(key_of("b"), STATE_GROUP + 1)
    assert lines(r.out)[:-1] == [
        f"{store.manifest_rel(['a', 'b'])}: mismatch: names {rel3} in a state group; "
        "its segments are those of a full group",
    ]


def test_chain_that_repeats_a_key_is_a_bad_manifest(kv, store):
    two_boundaries(store)
    path = manifest_path(store, ["a", "b"])

    def repeat(body):
        a = body["chain"][0]
        body["chain"] = [a, a]
        body["groups"][0]["entries"][1] = body["groups"][0]["entries"][0]
        body["groups"][1]["entries"][0][0] = a

    _rewrite_manifest(path, repeat)
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out
    out = lines(r.out)[:-1]
    assert (
        f"{store.manifest_rel(['a', 'b'])}: bad-manifest: manifest_inconsistent: chain repeats a key"
        in out
    )


def test_symlinked_manifests_folder_refuses_the_sweep(kv, store, tmp_path):
    two_boundaries(store)
    real = tmp_path / "elsewhere"
    (store.base / "manifests").rename(real)
    (store.base / "manifests").symlink_to(real)
    before = files_under(store.tier)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 4, r.out
    assert (
        f"refused {in_rank(store, 'manifests')}: could not be read (not a readable directory: "
        "which chunks are named is unknown)" in lines(r.out)
    )
    assert files_under(store.tier) == before | {in_rank(store, ".lock")}
    # --force may skip what it cannot read, never delete what it might name.
    r = kv("gc", "--sweep", "--force", str(store.tier))
    assert files_under(store.tier) == before | {in_rank(store, ".lock")}, r.out


def test_forced_sweep_beside_unreadable_manifests_leaves_no_dangling_manifest(kv):
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store, user = _unprivileged_store(Path(tmp))
        store.boundary(["a"])
        store.boundary(["a", "b"])
        store.boundary(["x"])
        age_tree(store.tier)
        if user is not None:
            for dirpath, dirs, files in os.walk(store.tier):
                for n in dirs + files:
                    os.chown(Path(dirpath) / n, 65534, 65534)
            os.chown(store.tier, 65534, 65534)
        hidden = manifest_path(store, ["x"])
        if user is not None:
            os.chown(hidden, 0, 0)
        hidden.chmod(0)
        try:
            r = kv("gc", "--sweep", str(store.tier), user=user)
            assert r.code == 4, r.out + r.err
            r = kv(
                "gc", "--sweep", "--force", "--keep", "1", str(store.tier), user=user
            )
            assert store.chunk_rel("x", FULL_GROUP) in files_under(store.tier), r.out
            assert store.chunk_rel("x", STATE_GROUP) in files_under(store.tier), r.out
        finally:
            hidden.chmod(0o644)
        r = kv("verify", "--json", str(store.tier))
        bad = [
            f
            for f in json.loads(r.out)["findings"]
            if f["kind"] in ("missing", "mismatch")
        ]
        assert bad == []


def test_forced_sweep_beside_an_unlistable_manifests_folder_deletes_no_chunk(kv):
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        store, user = _unprivileged_store(Path(tmp))
        two_boundaries(store)
        if user is not None:
            for dirpath, dirs, files in os.walk(store.tier):
                for n in dirs + files:
                    os.chown(Path(dirpath) / n, 65534, 65534)
            os.chown(store.tier, 65534, 65534)
            os.chown(store.base / "manifests", 0, 0)
        (store.base / "manifests").chmod(0)
        try:
            chunks = {p for p in files_under(store.tier) if p.endswith(".bin")}
            r = kv("gc", "--sweep", "--force", str(store.tier), user=user)
            assert {
                p for p in files_under(store.tier) if p.endswith(".bin")
            } == chunks, r.out
        finally:
            (store.base / "manifests").chmod(0o755)
        r = kv("verify", str(store.tier))
        assert r.code == 0, r.out


def _hold_pending(
    store: Store, chunks: set[tuple[int, str]], data: bytes | None = None
) -> subprocess.Popen:
    """A process that writes a pending record (`data`, else the codec's
    record of `chunks`), holds its flock and waits."""
    content = (
        repr(data)
        if data is not None
        else f"fmt.encode_pending_record({sorted(chunks)!r})"
    )
    code = (
        "import fcntl, os, sys, threading\n"
        f"sys.path.insert(0, {str(TESTS_PYTHON)!r})\n"
        "from kvstore_support import fmt\n"
        f"d = {store.layout.pending_dir!r}\n"
        "os.makedirs(d, exist_ok=True)\n"
        "p = os.path.join(d, fmt.pending_file_name(os.getpid(), threading.get_native_id()))\n"
        "fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_SH)\n"
        f"os.write(fd, {content})\n"
        "print(p, flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    proc.pending_path = Path(proc.stdout.readline().strip())
    return proc


def test_live_writers_pending_chunks_survive_a_sweep_with_grace_0(kv, store):
    two_boundaries(store)
    # Job 1 of boundary [a, b, c] wrote c's full chunk; its manifest is not out yet.
    c = store.chunk(key_of("c"), FULL_GROUP, 3 * 64)
    age(c)
    writer = _hold_pending(store, {(FULL_GROUP, key_of("c"))})
    try:
        r = kv("verify", str(store.tier))
        assert r.code == 0, r.out  # not an orphan: a live writer expects it
        r = kv("gc", "--sweep", "--grace", "0", str(store.tier))
        assert r.code == 0, r.out
        assert c.exists()
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    # The writer is gone: its record is stale and c is an orphan like any other.
    r = kv("gc", "--sweep", "--grace", "0", str(store.tier))
    assert r.code == 0, r.out
    assert not c.exists()
    assert not writer.pending_path.exists()


def test_fresh_namespace_record_temp_survives_grace_0(kv, store):
    two_boundaries(store)
    temp = store.tier / f"{store.name}.json.tmp.{os.getpid()}.1"
    temp.write_bytes(b"{")
    r = kv("gc", "--sweep", "--grace", "0", str(store.tier))
    assert r.code == 0, r.out
    assert temp.exists()  # it may be a writer's, mid-write
    # Old and unlocked: its writer is gone.
    age(temp)
    r = kv("gc", "--sweep", "--grace", "0", str(store.tier))
    assert not temp.exists(), r.out


def test_old_namespace_record_temp_held_by_a_writer_survives(kv, store):
    two_boundaries(store)
    temp = store.tier / f"{store.name}.json.tmp.{os.getpid()}.2"
    temp.write_bytes(b"{")
    age(temp)
    import fcntl

    fd = os.open(temp, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = kv("gc", "--sweep", "--grace", "0", str(store.tier))
        assert r.code == 0, r.out
        assert temp.exists()
    finally:
        os.close(fd)


def test_sweep_reports_what_the_locked_scan_found(kvstore_bin, store):
    """A manifest that names a chunk still being written looks broken before
    the lock; once the writer releases the lock it is whole. The sweep's
    summary and exit code are those of the scan under the lock."""
    import fcntl

    store.boundary(["a"])
    chain = [key_of("a"), key_of("b")]
    store.chunk(chain[0], FULL_GROUP, 64)
    b_full = store.chunk(chain[1], FULL_GROUP, 128)
    b_state = store.chunk(chain[1], STATE_GROUP, 128)
    store.write_manifest(store.manifest_for(chain))
    age_tree(store.tier)
    b_state_bytes = b_state.read_bytes()
    b_state.unlink()  # "the writer has not renamed it yet"
    lock = os.open(store.base / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock, fcntl.LOCK_SH)
    proc = subprocess.Popen(
        [str(kvstore_bin), "gc", "--sweep", "--json", str(store.tier)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)  # the sweep waits for the lock
        b_state.write_bytes(b_state_bytes)
        age(b_state)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert json.loads(out)["summary"]["damage"] == 0
    assert b_full.exists() and b_state.exists()


def test_sweep_waiting_past_lock_timeout_is_busy(kv, store):
    """A writer holding the lock past --lock-timeout: exit 7, nothing deleted."""
    import fcntl

    two_boundaries(store)
    orphan = store.chunk(key_of("z"), FULL_GROUP, 64)
    age(orphan)
    lock = os.open(store.base / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)
        r = kv("gc", "--sweep", "--lock-timeout", "0.2", str(store.tier))
        assert r.code == 7, r.out + r.err
        assert orphan.exists()
    finally:
        os.close(lock)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 0, r.out
    assert not orphan.exists()


# --------------------------------------------------------------------------
# Issue 37
# --------------------------------------------------------------------------


def test_nul_then_junk_after_a_record_or_manifest_is_bad_json(kv, store):
    """The C++ parser stopped at a NUL byte: `printf '\\0junk' >> record`
    passed verify while the writer disabled itself on it (bad_json)."""
    two_boundaries(store)
    record = Path(store.layout.namespace_record)
    with open(record, "ab") as f:
        f.write(b"\0junk")
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out
    assert lines(r.out)[:-1] == [
        f"{record.name}: bad-namespace: bad_json: NUL byte at offset "
        f"{record.stat().st_size - 5}"
    ]
    with pytest.raises(fmt.FormatError):  # the writer's codec agrees
        fmt.decode_namespace_record(record.read_bytes())
    record.write_bytes(record.read_bytes()[:-5])
    path = manifest_path(store, ["a", "b"])
    with open(path, "ab") as f:
        f.write(b"\0junk")
    r = kv("verify", str(store.tier))
    assert r.code == 1, r.out
    assert (
        f"{store.manifest_rel(['a', 'b'])}: bad-manifest: bad_json: NUL byte" in r.out
    )
    assert "no problems" not in r.out


@pytest.mark.parametrize("kind", ["nul_then_junk", "unsorted", "repeated"])
def test_live_pending_record_that_breaks_9_1_is_bad_pending(kv, store, kind):
    """FORMAT.md 9.1: chunks sorted, each once, and a NUL is bad_json: kvstore
    reports it and a sweep refuses the rank (nothing deleted)."""
    two_boundaries(store)
    a, b = sorted([key_of("a"), key_of("b")])
    good = fmt.encode_pending_record([(0, a), (0, b)])
    data = {
        "nul_then_junk": good + b"\0junk",
        "unsorted": good.replace(a.encode(), b"K")
        .replace(b.encode(), a.encode())
        .replace(b"K", b.encode()),
        "repeated": good.replace(b.encode(), a.encode()),
    }[kind]
    verdict = "bad_json" if kind == "nul_then_junk" else "bad_field"
    writer = _hold_pending(store, set(), data)
    try:
        rel = store.rel(writer.pending_path)
        r = kv("verify", str(store.tier))
        assert r.code == 1, r.out
        assert any(
            ln.startswith(f"{rel}: bad-pending: {verdict}: ") for ln in lines(r.out)
        ), r.out
        before = files_under(store.tier)
        r = kv("gc", "--sweep", "--grace", "0", str(store.tier))
        assert r.code == 4, r.out
        assert files_under(store.tier) == before | {in_rank(store, ".lock")}
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)


def test_forced_sweep_beside_unparsable_manifests_deletes_no_chunk(kv, store):
    """--force on a rank whose manifests were all unparsable deleted every
    chunk as an orphan. Unparsable hides what a manifest names exactly as
    unreadable does: chunks are held back and the manifests stay."""
    two_boundaries(store)
    for names in (["a"], ["a", "b"]):
        path = manifest_path(store, names)
        path.write_bytes(path.read_bytes()[:-1])  # torn: bad_json
        age(path)
    before = files_under(store.tier)
    r = kv("gc", "--sweep", str(store.tier))
    assert r.code == 4, r.out
    r = kv("gc", "--sweep", "--force", "--grace", "0", str(store.tier))
    assert r.code == 1, r.out  # damage found, nothing of it deleted
    assert files_under(store.tier) == before | {in_rank(store, ".lock")}, r.out
    assert (
        f"refusal: {store.manifest_rel(['a'])}: manifest could not be parsed" in r.out
    )
    # And so the next sweep cannot take them for orphans either.
    r = kv("gc", "--sweep", "--force", "--grace", "0", str(store.tier))
    assert files_under(store.tier) == before | {in_rank(store, ".lock")}, r.out


def test_one_unparsable_manifest_beside_good_ones_holds_chunks_back(kv, store):
    two_boundaries(store)
    store.boundary(["x"])
    age_tree(store.tier)
    bad = manifest_path(store, ["x"])
    bad.write_bytes(b'{"format":3}')  # a later writer's, say: unparsable here
    age(bad)
    chunks = {p for p in files_under(store.tier) if p.endswith(".bin")}
    r = kv("gc", "--sweep", "--force", "--keep", "1", "--grace", "0", str(store.tier))
    assert {p for p in files_under(store.tier) if p.endswith(".bin")} == chunks, r.out
    assert bad.exists()
    assert not manifest_path(store, ["a"]).exists()  # superseded readable ones go


@pytest.mark.parametrize("kind", ["fifo", "folder", "symlink", "device"])
def test_a_lock_that_is_not_a_regular_file_refuses_the_sweep(kv, store, kind, tmp_path):
    """A .lock folder stopped a sweep (exit 6), a FIFO let it go ahead: one
    rule, refused (exit 4), even --force, nothing deleted."""
    two_boundaries(store)
    orphan = store.chunk(key_of("z"), FULL_GROUP, 64)
    age(orphan)
    lock = store.base / ".lock"
    if kind == "fifo":
        os.mkfifo(lock)
    elif kind == "folder":
        lock.mkdir()
    elif kind == "symlink":
        (tmp_path / "elsewhere").write_bytes(b"")
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        try:
            os.mknod(lock, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    before = files_under(store.tier)
    what = {
        "fifo": "a FIFO",
        "folder": "a folder",
        "symlink": "a symlink",
        "device": "a device",
    }
    for force in ([], ["--force"]):
        r = kv("gc", "--sweep", *force, "--grace", "0", str(store.tier))
        assert r.code == 4, (force, r.out + r.err)
        assert (
            f"refused {store.name}/.lock: is {what[kind]}, not a regular file" in r.out
        ), r.out
        assert "no problems" not in r.out
        assert files_under(store.tier) == before, r.out
    assert (tmp_path / "elsewhere").exists() or kind != "symlink"
