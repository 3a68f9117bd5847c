"""kv-offload-store-local: the disk budget (GLM53_KV_OFFLOAD_DISK_GB).

Four conversations (branches 0..3 of store_local_support: four chain trees
with distinct roots) are written into one store; the budget must retire the
least recently used trees, whole, and leave a store `kvstore verify` passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import store_local_support as sls
from store_local_support import fmt, ksl, kv_offload_knobs


def only_base(root: Path) -> Path:
    (base,) = sls.rank_bases(root)
    return base


def write_tree(store, maker, branch: int, chunks: int = 3) -> None:
    """Boundaries 0..chunks-1 of one branch (keep-2 retires the oldest)."""
    for b in range(chunks):
        jobs = [maker.full_chunks(b, 1, branch)]
        jobs += [maker.state(b, g, branch) for g in sls.STATE_GROUPS]
        for job in jobs:
            sls.run_job(store, job)


def roots(base: Path) -> set[str]:
    return {m.chain[0] for m in sls.manifests(base).values()}


def root_of(branch: int) -> str:
    return sls.block_hash(0, branch).hex()


def age(base: Path, branch: int, seconds_ago: int) -> None:
    """Set the recency of a branch's tree (every manifest's mtime)."""
    when = 1_000_000_000 + 10_000 - seconds_ago
    for p in (base / fmt.MANIFEST_DIR).iterdir():
        if fmt.decode_manifest(p.read_bytes()).chain[0] == root_of(branch):
            os.utime(p, (when, when))


def used(root: Path) -> int:
    store, _ = sls.make_store(root)
    try:
        return ksl.budget.scan(store.writer.layout).used
    finally:
        store.shutdown()


def three_trees(root: Path) -> int:
    """Branches 0, 1, 2 written unbounded; 1 the least recently used."""
    store, staging = sls.make_store(root)
    maker = sls.JobMaker(staging)
    for branch in (0, 1, 2):
        write_tree(store, maker, branch)
    store.shutdown()
    base = only_base(root)
    age(base, 0, 200)
    age(base, 1, 300)
    age(base, 2, 100)
    return used(root)


def kvstore_verify(build_dir: Path, root: Path) -> None:
    kvstore = build_dir / "kvstore" / "kvstore"
    done = subprocess.run(
        [str(kvstore), "verify", "-q", str(root)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_knob_is_decimal_gb_and_a_bad_value_names_it():
    env = {"GLM53_KV_OFFLOAD_DISK_GB": "0.5"}
    assert kv_offload_knobs.read_knobs(env).disk_bytes == 500_000_000
    assert kv_offload_knobs.read_knobs({}).disk_bytes is None
    env = {"GLM53_KV_OFFLOAD_DISK_GB": "12"}
    assert kv_offload_knobs.read_knobs(env).disk_bytes == 12 * 10**9
    for bad in ("", "0", "-1", "1e3", "1.5GB", " 2", "0.0000000001", "2000000"):
        with pytest.raises(
            kv_offload_knobs.KnobError, match="GLM53_KV_OFFLOAD_DISK_GB"
        ):
            kv_offload_knobs.read_knobs({"GLM53_KV_OFFLOAD_DISK_GB": bad})


def test_a_write_past_the_budget_retires_the_least_recently_used_tree(
    tmp_path, build_dir
):
    full = three_trees(tmp_path)
    # Room for a fourth tree, not for its peak (three boundaries on disk
    # before keep-2 retires the first).
    limit = full + full // 3
    store, staging = sls.make_store(
        tmp_path, knobs=sls.knobs(tmp_path, disk_bytes=limit)
    )
    maker = sls.JobMaker(staging)
    write_tree(store, maker, 3)
    stats = store.stats
    store.shutdown()
    base = only_base(tmp_path)
    # Branch 1 was the oldest: gone whole (manifests and every chunk of it);
    # the writes of branch 3 all landed.
    assert root_of(1) not in roots(base)
    assert {root_of(0), root_of(2), root_of(3)} <= roots(base)
    layout = fmt.StoreLayout(str(tmp_path), base.name)
    for g in (0, *sls.STATE_GROUPS):
        for i in range(3):
            assert not os.path.exists(layout.chunk(sls.block_hash(i, 1).hex(), g))
    assert used(tmp_path) <= limit
    assert stats.chain_trees_evicted >= 1
    assert stats.manifests_evicted >= 2
    assert stats.bytes_evicted > 0
    assert stats.writes_refused_disk_budget == 0
    assert sls.verify_store(tmp_path) == []
    kvstore_verify(build_dir, tmp_path)


def test_a_restore_makes_a_tree_recent_again(tmp_path):
    three_trees(tmp_path)
    store, _ = sls.make_store(tmp_path, knobs=sls.knobs(tmp_path, disk_bytes=1 << 40))
    base = only_base(tmp_path)
    names = [n for n, m in sls.manifests(base).items() if m.chain[0] == root_of(1)]
    store.writer.budget.touch(names)
    view = ksl.budget.scan(store.writer.layout)
    store.shutdown()
    newest = max(view.trees.values(), key=lambda t: t.recency_ns)
    assert newest.root == root_of(1)


def test_a_held_or_pending_tree_is_never_retired(tmp_path):
    full = three_trees(tmp_path)
    store, _ = sls.make_store(tmp_path, knobs=sls.knobs(tmp_path, disk_bytes=full))
    layout = store.writer.layout
    budget = store.writer.budget
    held = layout.chunk(sls.block_hash(0, 1).hex(), 0)  # oldest tree: branch 1
    pending = [(0, sls.block_hash(1, 0).hex())]  # next oldest: branch 0
    with budget.hold([held]):
        ok, retired = budget.make_room(1, pending)
    store.shutdown()
    assert ok
    assert [t.root for t in retired] == [root_of(2)]
    assert roots(only_base(tmp_path)) == {root_of(0), root_of(1)}


def test_nothing_evictable_left_refuses_the_write(tmp_path):
    three_trees(tmp_path)
    store, staging = sls.make_store(tmp_path, knobs=sls.knobs(tmp_path, disk_bytes=1))
    before = sorted(sls.chunk_files(tmp_path))
    maker = sls.JobMaker(staging)
    # Every job's own tree is protected, and everything else goes first.
    write_tree(store, maker, 3, chunks=1)
    stats = store.stats
    store.shutdown()
    assert stats.writes_refused_disk_budget >= 1
    assert stats.keys_refused_disk_budget >= 1
    assert stats.keys_written == 0
    assert set(sls.chunk_files(tmp_path)) < set(before) or not before
    assert sls.verify_store(tmp_path) == []


@pytest.mark.parametrize("over", [1, 12_000])  # one tree, then two
def test_kvstore_gc_max_bytes_retires_what_the_writer_retires(
    tmp_path, build_dir, over
):
    """The same store, the same budget: the writer online and `kvstore gc
    --max-bytes --sweep` offline leave the same chain trees."""
    writer_root = tmp_path / "writer"
    writer_root.mkdir(mode=0o700)
    full = three_trees(writer_root)
    gc_root = tmp_path / "gc"
    shutil.copytree(writer_root, gc_root)  # copy2: the mtimes (recency) too
    limit = full - over
    store, _ = sls.make_store(
        writer_root, knobs=sls.knobs(writer_root, disk_bytes=limit)
    )
    ok, retired = store.writer.budget.make_room(0, [])
    store.shutdown()
    assert ok and retired
    kvstore = build_dir / "kvstore" / "kvstore"
    low = ksl.budget.low_water(limit)  # what the writer frees down to
    gc = [str(kvstore), "gc", str(gc_root), "--max-bytes", str(low)]
    plan = subprocess.run(gc, capture_output=True, text=True)  # the dry run
    assert plan.returncode == 0, plan.stdout + plan.stderr
    assert ": budget: least recently used chain tree" in plan.stdout
    done = subprocess.run([*gc, "--sweep"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    left = {p.relative_to(writer_root) for p in writer_root.rglob("*.bin")}
    assert left == {p.relative_to(gc_root) for p in gc_root.rglob("*.bin")}
    kept = set(sls.manifests(only_base(writer_root)))
    assert kept == set(sls.manifests(only_base(gc_root)))
    assert roots(only_base(gc_root)) == {root_of(0), root_of(1), root_of(2)} - {
        t.root for t in retired
    }
    kvstore_verify(build_dir, gc_root)


def test_kvstore_gc_refuses_a_bad_size(tmp_path, build_dir):
    three_trees(tmp_path)
    before = sorted(p for p in tmp_path.rglob("*"))
    kvstore = build_dir / "kvstore" / "kvstore"
    for bad in ("12g", "0", "-5", "1.5", ""):
        done = subprocess.run(
            [str(kvstore), "gc", str(tmp_path), "--max-bytes", bad, "--sweep"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2, (bad, done.stdout, done.stderr)
        assert "--max-bytes" in done.stderr and "not a SIZE" in done.stderr, bad
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_a_scan_skips_what_vanishes_while_it_lists(tmp_path, monkeypatch):
    """CI once caught it: another writer renamed its temp between the scan's
    listing and its stat. What is gone by then is simply not counted."""
    three_trees(tmp_path)
    store, _ = sls.make_store(tmp_path)
    layout = store.writer.layout
    store.shutdown()
    base = Path(layout.base)
    temp = next(base.rglob("*.bin")).with_suffix(".bin.tmp.1.2")
    temp.write_bytes(b"x" * 4096)
    empty = base / "gone-before-its-listing"
    empty.mkdir()
    real = os.scandir
    vanish = {str(temp), str(empty)}

    class Listing:
        def __init__(self, path):
            self.entries = list(real(path))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __iter__(self):
            for e in self.entries:
                if e.path in vanish:  # listed, then gone
                    (os.rmdir if e.is_dir() else os.unlink)(e.path)
                yield e

    monkeypatch.setattr(ksl.budget.os, "scandir", Listing)
    view = ksl.budget.scan(layout)
    monkeypatch.undo()
    assert str(temp) not in view.sizes
    assert view.used == ksl.budget.scan(layout).used
