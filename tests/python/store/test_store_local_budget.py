"""kv-offload-store-local: the disk budget (GLM53_KV_OFFLOAD_DISK_GB).

Four conversations (branches 0..3 of store_local_support: four chain trees
with distinct roots) are written into one store; the budget must retire the
least recently used trees, whole, and leave a store `kvstore verify` passes.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
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
        sls._INDEX.setdefault(sls.block_hash(b, branch), b)  # past branch 3
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
    for bad in ("", "0", "-1", "1e3", "1.5gb", " 2", "0.0000000001", "2000000000000"):
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
    manifests = set(sls.manifests(only_base(tmp_path)))
    maker = sls.JobMaker(staging)
    # Even with every other tree gone the job would not fit: nothing is
    # retired for nothing (issue 45), the job is refused and says why.
    write_tree(store, maker, 3, chunks=1)
    stats = store.stats
    store.shutdown()
    assert stats.writes_refused_disk_budget >= 1
    assert stats.keys_refused_disk_budget >= 1
    assert stats.evictions_skipped == stats.writes_refused_disk_budget
    assert stats.keys_written == 0
    assert stats.chain_trees_evicted == 0
    assert sorted(sls.chunk_files(tmp_path)) == before
    assert set(sls.manifests(only_base(tmp_path))) == manifests
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
    gc = [str(kvstore), "gc", str(gc_root), "--max-bytes", f"{low}B"]
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
    for bad in ("12g", "0", "-5", "1.5", "", "500"):
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


# --------------------------------------------------------------------------
# The index the writer keeps (store_index.py): one scan, then its own events
# --------------------------------------------------------------------------


def snapshot(layout) -> tuple:
    return ksl.budget.scan(layout).snapshot()


def at_budget_with_events(root: Path):
    """Three trees, then a writer at a budget writing three more (evicting),
    a restore touching the oldest tree left, keep-2 superseding: every event
    the index follows. Returns the open store."""
    full = three_trees(root)
    store, staging = sls.make_store(
        root, knobs=sls.knobs(root, disk_bytes=full + full // 3)
    )
    maker = sls.JobMaker(staging)
    maker.next_job = 1 << 20
    for branch in (3, 4):
        write_tree(store, maker, branch)
    base = only_base(root)
    oldest = min(
        store.writer.budget.index.trees.values(), key=lambda t: t.recency_ns
    ).root
    store.writer.budget.touch(
        n for n, m in sls.manifests(base).items() if m.chain[0] == oldest
    )
    write_tree(store, maker, 5)
    return store, oldest


def test_the_writer_keeps_its_index_as_a_fresh_scan_would_see_it(tmp_path):
    """Issue 33: the writer scans once (its first job) and then follows its
    own writes, publishes, keep-K's unlinks, its evictions and a restore's
    touch; the index equals a fresh scan's, and the touched tree stayed."""
    store, touched = at_budget_with_events(tmp_path)
    budget = store.writer.budget
    try:
        assert budget.scans == 1
        assert store.stats.chain_trees_evicted >= 2
        assert store.stats.manifests_superseded > 0
        assert budget.index.snapshot() == snapshot(store.writer.layout)
        assert touched in budget.index.trees
        # The published names' lookups follow them through keep-K and the
        # budget's retirements alike.
        published = store.writer.published
        assert set(published) == set(sls.manifests(only_base(tmp_path)))
        by_root: dict[str, set[str]] = {}
        for name in published:
            by_root.setdefault(published.chain(name)[0], set()).add(name)
        assert published.roots() == by_root
        assert published.chains() == {published.chain(n) for n in published}
    finally:
        store.shutdown()
    assert used(tmp_path) <= budget.limit
    assert sls.verify_store(tmp_path) == []


@pytest.mark.parametrize("over", [1, 12_000])  # one tree, then two
def test_kvstore_gc_max_bytes_retires_what_the_kept_index_retires(
    tmp_path, build_dir, over
):
    """The same comparison as above, the writer's index built from its own
    events this time, not from a scan: copy the store as it stands, tighten
    the budget, and the writer and `kvstore gc --max-bytes` agree."""
    writer_root = tmp_path / "writer"
    writer_root.mkdir(mode=0o700)
    store, _ = at_budget_with_events(writer_root)
    gc_root = tmp_path / "gc"
    budget = store.writer.budget
    try:
        # The writer's live pending record is not copied (a copy's would be
        # stale, and gc plans a stale record's removal first): its bytes are
        # taken off gc's target instead.
        shutil.copytree(writer_root, gc_root, ignore=shutil.ignore_patterns("pending"))
        index = budget.index
        own = sum(
            size
            for path, size in index.sizes.items()
            if path.startswith(store.writer.layout.pending_dir + os.sep)
        )
        limit = index.used - over
        budget.limit, budget.low = limit, ksl.budget.low_water(limit)
        before = set(index.trees)
        ok, retired = budget.make_room(0, [])
        assert budget.scans == 1  # decided on the kept index
    finally:
        store.shutdown()
    assert ok and retired
    kvstore = build_dir / "kvstore" / "kvstore"
    target = f"{budget.low - own}B"
    gc = [str(kvstore), "gc", str(gc_root), "--max-bytes", target, "--sweep"]
    done = subprocess.run(gc, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    left = {p.relative_to(writer_root) for p in writer_root.rglob("*.bin")}
    assert left == {p.relative_to(gc_root) for p in gc_root.rglob("*.bin")}
    kept = set(sls.manifests(only_base(writer_root)))
    assert kept == set(sls.manifests(only_base(gc_root)))
    assert roots(only_base(gc_root)) == before - {t.root for t in retired}
    kvstore_verify(build_dir, gc_root)


def over_by_one(budget) -> int:
    """An incoming size that takes the estimate just past the budget."""
    return budget.limit - budget.estimate + 1


def seeded(root: Path):
    """Three trees, then a writer at a budget whose first job seeded its index."""
    full = three_trees(root)
    store, staging = sls.make_store(root, knobs=sls.knobs(root, disk_bytes=full))
    maker = sls.JobMaker(staging)
    maker.next_job = 1 << 20
    write_tree(store, maker, 3, chunks=1)
    assert store.writer.budget.scans == 1
    return store, maker


def test_a_sweep_that_deleted_files_makes_the_writer_rescan(tmp_path, build_dir):
    """`kvstore gc --sweep` moves .lock's mtime when it deleted something
    (FORMAT.md 8): the writer's next eviction rescans, and decides on what
    the sweep left. A dry run, or a sweep that deleted nothing, leaves the
    generation alone: no rescan."""
    store, maker = seeded(tmp_path)
    budget = store.writer.budget
    kvstore = build_dir / "kvstore" / "kvstore"
    gc = [str(kvstore), "gc", str(tmp_path), "--grace", "0"]
    try:
        lock = Path(store.writer.layout.lock)
        mtime = lock.stat().st_mtime_ns
        for args in ([], ["--sweep"]):  # nothing to delete at keep-2
            done = subprocess.run([*gc, *args], capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr
        assert lock.stat().st_mtime_ns == mtime
        budget.make_room(over_by_one(budget), [])
        assert budget.scans == 1
        assert budget.index.snapshot() == snapshot(store.writer.layout)
        # keep 1: the sweep deletes superseded manifests the index counts.
        done = subprocess.run(
            [*gc, "--sweep", "--keep", "1"], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert lock.stat().st_mtime_ns > mtime
        stale = budget.index.snapshot()
        assert stale != snapshot(store.writer.layout)
        budget.make_room(over_by_one(budget), [])
        assert budget.scans == 2
        assert budget.index.snapshot() == snapshot(store.writer.layout)
    finally:
        store.shutdown()
    kvstore_verify(build_dir, tmp_path)


def test_the_index_is_rebuilt_at_least_every_rescan_seconds(tmp_path):
    """What no generation reports (an operator's rm): the bound catches it."""
    store, maker = seeded(tmp_path)
    budget = store.writer.budget
    # Whole seconds: with the machine's monotonic time as the start, start + 599 + 1
    # minus start can round to 599.99999999994 (CI saw no rescan once).
    now = [1000.0]
    budget._clock = lambda: now[0]
    budget._scanned_at = now[0]
    try:
        victim = max(budget.index.trees.values(), key=lambda t: t.recency_ns)
        for path in victim.manifests:
            os.unlink(path)  # behind the writer's back
        now[0] += ksl.budget.RESCAN_SECONDS - 1
        budget.make_room(over_by_one(budget), [])
        assert budget.scans == 1
        now[0] += 1
        budget.make_room(over_by_one(budget), [])
        assert budget.scans == 2
        assert victim.root not in budget.index.trees
    finally:
        store.shutdown()


def test_another_live_writer_on_the_base_makes_every_eviction_rescan(tmp_path):
    """Its files are not in this writer's index: while its pending record is
    locked each eviction rescans; once it exited (a stale record), none."""
    store, maker = seeded(tmp_path)
    budget = store.writer.budget
    pending = Path(store.writer.layout.pending_dir)
    other = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, threading\n"
            "d = sys.argv[1]\n"
            "name = f'{os.getpid()}.{threading.get_native_id()}.json'\n"
            "fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_SH)\n"
            "print(name, flush=True)\n"
            "sys.stdin.read()\n",
            str(pending),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert (pending / other.stdout.readline().strip()).exists()
        for scans in (2, 3):
            budget.make_room(over_by_one(budget), [])
            assert budget.scans == scans
    finally:
        other.communicate("", timeout=30)
    try:
        budget.make_room(over_by_one(budget), [])
        assert budget.scans == 3  # its record is stale now: not a writer
    finally:
        store.shutdown()


def test_a_rescan_leaves_out_this_process_temps_and_counts_others(tmp_path):
    """Temps in flight are counted through their jobs' bounds, not twice."""
    three_trees(tmp_path)
    base = only_base(tmp_path)
    layout = fmt.StoreLayout(str(tmp_path), base.name)
    chunk = next(base.rglob("*.bin"))
    mine = chunk.with_name(fmt.temp_name(chunk.name, os.getpid(), 7))
    theirs = chunk.with_name(fmt.temp_name(chunk.name, os.getpid() + 1, 7))
    mine.write_bytes(b"x" * 1000)
    theirs.write_bytes(b"y" * 300)
    everything = ksl.budget.scan(layout)
    own = ksl.budget.scan(layout, own_pid=os.getpid())
    assert str(mine) in everything.sizes and str(mine) not in own.sizes
    assert str(theirs) in own.sizes
    assert everything.used - own.used == 1000


def test_the_index_counts_nothing_that_vanished_before_its_stat(tmp_path):
    """As the scan (issue 33's CI race): a chunk a sweep took between its
    rename and the writer's stat, a manifest gone before it was told, a
    touched manifest retired meanwhile: none is counted, nothing raises."""
    three_trees(tmp_path)
    base = only_base(tmp_path)
    layout = fmt.StoreLayout(str(tmp_path), base.name)
    index = ksl.budget.scan(layout)
    name, manifest = next(iter(sls.manifests(base).items()))
    path = os.path.join(layout.manifest_dir, name)
    chunk = next(iter(ksl.store_index.named_chunks(layout, manifest)))
    os.unlink(chunk)
    index.wrote(chunk)  # landed, then gone before the stat
    assert chunk not in index.sizes
    os.unlink(path)
    index.touched(path)
    assert path not in index.sizes and all(
        path not in t.manifests for t in index.trees.values()
    )
    index.published(path, manifest)  # republished, and gone again
    assert path not in index.sizes
    index.reused(str(base / "never-there.bin"))
    assert index.snapshot() == ksl.budget.scan(layout).snapshot()


def test_a_failed_write_makes_the_next_eviction_rescan(tmp_path):
    """A write that failed may leave a file the index cannot account for: the
    writer says so (stale) and its next eviction decides on a fresh scan."""
    store, maker = seeded(tmp_path)
    budget = store.writer.budget
    lib = store.writer.store_lib
    try:
        budget.make_room(over_by_one(budget), [])
        assert (budget.scans, budget.stale) == (1, False)
        lib.test_fault(fmt.native.FAULT_WRITE, errno.EIO, 0, 1 << 30)
        sls._INDEX.setdefault(sls.block_hash(0, 6), 0)
        sls.run_job(store, maker.full_chunks(0, 1, 6))  # a new key: written
        lib.test_fault(fmt.native.FAULT_NONE)
        assert store.stats.keys_failed >= 1 and budget.stale
        budget.make_room(over_by_one(budget), [])
        assert (budget.scans, budget.stale) == (2, False)
        assert budget.index.snapshot() == snapshot(store.writer.layout)
    finally:
        lib.test_fault(fmt.native.FAULT_NONE)
        store.shutdown()


def test_the_seed_scan_decodes_no_manifest_the_boot_read_decoded(tmp_path, monkeypatch):
    """The book reads every manifest at boot (keep-K); the budget's first scan
    takes what it decoded instead of decoding them all again."""
    full = three_trees(tmp_path)
    store, _ = sls.make_store(tmp_path, knobs=sls.knobs(tmp_path, disk_bytes=full))
    budget = store.writer.budget
    decoded = []
    real = fmt.decode_manifest

    def counting(data):
        decoded.append(len(data))
        return real(data)

    try:
        assert set(budget.parsed) == set(sls.manifests(only_base(tmp_path)))
        monkeypatch.setattr(fmt, "decode_manifest", counting)
        budget.make_room(0, [])
        monkeypatch.undo()
        assert budget.scans == 1 and decoded == []
        assert budget.index.snapshot() == snapshot(store.writer.layout)
    finally:
        store.shutdown()


def orphans(store, maker, branches) -> None:
    """Full-attention chunks whose chains never complete (no state, so no
    manifest): after a clean shutdown, orphans only `kvstore gc` removes."""
    for branch in branches:
        sls._INDEX.setdefault(sls.block_hash(0, branch), 0)
        for b in range(3):
            sls._INDEX.setdefault(sls.block_hash(b, branch), b)
        sls.run_job(store, maker.full_chunks(0, 3, branch))


def test_orphans_alone_past_the_budget_evict_nothing(tmp_path):
    """Issue 45, 4: 8 chains, orphans left by a clean shutdown, then a budget
    the orphans alone exceed: the writer deleted every chain and still
    refused the job. Retiring what it may retire cannot make room, so it
    retires nothing, refuses the job and counts why."""
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    for branch in range(8):
        write_tree(store, maker, branch, chunks=1)
    orphans(store, maker, range(8, 14))
    store.shutdown()
    base = only_base(tmp_path)
    layout = fmt.StoreLayout(str(tmp_path), base.name)
    view = ksl.budget.scan(layout)
    in_trees = sum(sum(t.manifests.values()) for t in view.trees.values())
    named = {c for t in view.trees.values() for c in t.chunks}
    in_trees += sum(view.sizes[c] for c in named)
    unnamed = view.used - in_trees  # the orphans (and nothing else)
    assert unnamed > 0 and len(view.trees) == 8
    manifests = set(sls.manifests(base))
    chunks = sls.chunk_files(tmp_path)
    store, staging = sls.make_store(
        tmp_path,
        knobs=sls.knobs(tmp_path, disk_bytes=unnamed - 1),
    )
    maker = sls.JobMaker(staging)
    maker.next_job = 1 << 20
    write_tree(store, maker, 20, chunks=1)
    stats = store.stats
    store.shutdown()
    assert stats.chain_trees_evicted == 0 and stats.bytes_evicted == 0
    assert stats.writes_refused_disk_budget == 5 == stats.evictions_skipped
    assert stats.keys_refused_disk_budget == 5 and stats.keys_written == 0
    assert set(sls.manifests(base)) == manifests  # every chain kept
    assert sls.chunk_files(tmp_path) == chunks
    assert sls.verify_store(tmp_path) == []


def dead_leftovers(base: Path) -> list[Path]:
    """What writers that were killed leave: a chunk temp, a manifest temp and
    a pending record nobody holds a flock on."""
    chunk = next(base.rglob("*.bin"))
    made = [
        chunk.with_name(fmt.temp_name(chunk.name, 4242, 4243)),
        base
        / fmt.MANIFEST_DIR
        / fmt.temp_name("b16_" + "ab" * 32 + ".json", 4242, 4243),
        base / "pending" / fmt.pending_file_name(4242, 4243),
    ]
    made[-1].parent.mkdir(mode=0o700, exist_ok=True)
    for path in made:
        path.write_bytes(b"x" * 4000)
        path.chmod(0o600)
    return made


@pytest.mark.parametrize("lock_held", [False, True])
def test_the_writer_removes_what_exited_writers_left(tmp_path, lock_held):
    """Issue 45, 4: temps and exited writers' pending records count against
    the budget, and only `kvstore gc` removed them. The writer removes them
    itself between jobs, under LOCK_EX taken without waiting (the sweep's
    rule); while another process holds the store lock they stay."""
    full = three_trees(tmp_path)
    base = only_base(tmp_path)
    leftovers = dead_leftovers(base)
    # Room for the next tree only once the leftovers are gone.
    limit = full + 2000
    layout = fmt.StoreLayout(str(tmp_path), base.name)
    holder = os.open(layout.lock, os.O_RDWR)
    try:
        if lock_held:  # a sweep, a restore or another writer: never waited for
            import fcntl

            fcntl.flock(holder, fcntl.LOCK_SH)
        store, staging = sls.make_store(
            tmp_path, knobs=sls.knobs(tmp_path, disk_bytes=limit)
        )
        maker = sls.JobMaker(staging)
        maker.next_job = 1 << 20
        sls.run_job(store, maker.full_chunks(0, 1, 3))
        stats = store.stats
        index = store.writer.budget.index.snapshot()
        fresh = snapshot(layout)
        store.shutdown()
    finally:
        os.close(holder)
    if lock_held:
        assert all(p.exists() for p in leftovers)
        assert stats.stale_files_removed == 0
        return
    assert not any(p.exists() for p in leftovers)
    assert stats.stale_files_removed == 3
    assert stats.keys_written == 1 and stats.chain_trees_evicted == 0
    assert index[0] == fresh[0]  # the index knows they are gone
    assert roots(base) == {root_of(0), root_of(1), root_of(2)}


@pytest.mark.parametrize("limit", [16_000, 26_000])
def test_a_keyed_store_stays_under_its_budget_at_every_step(tmp_path, limit):
    """Issue 45, 6: the estimate left out each keyed chunk's 32-byte MAC and
    the pending record (which every job refused at the budget made grow by
    the keys its candidates waited for): a keyed store ended past its
    budget. Measured after every job (the record rewritten, as a sweep or
    `du` sees the base): never past it."""
    key = tmp_path / "kvtier.key"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    root = tmp_path / "kv"
    knobs = sls.knobs(root, key_file=str(key), disk_bytes=limit)
    store, staging = sls.make_store(root, knobs=knobs)
    assert store.active, store.disabled_reason
    maker = sls.JobMaker(staging)
    layout = store.writer.layout
    worst = 0
    for branch in range(8):
        for b in range(16):
            sls._INDEX.setdefault(sls.block_hash(b, branch), b)
        jobs = [maker.full_chunks(0, 16, branch)]
        jobs += [maker.state(15, g, branch) for g in sls.STATE_GROUPS]
        for job in jobs:
            sls.run_job(store, job)
            worst = max(worst, ksl.budget.scan(layout).used)
    stats = store.stats
    store.shutdown()
    assert worst <= limit, (worst, limit)
    assert ksl.budget.scan(layout).used <= limit
    assert stats.keys_written > 0
    assert sls.verify_store(root, key.read_bytes()) == []
