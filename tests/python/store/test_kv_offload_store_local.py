"""kv-offload-store-local: the writer module on its own (no vLLM, no torch).

The miniature 7-group layout of store_local_support stands in for the
deployment's hybrid model; staging is a plain bytearray laid out like
0.33.0's shared offload region.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pickle
import re
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import store_local_support as sls
from store_local_support import chunk_fmt, fmt, ksl

# Tests that break their store on purpose; kvstore verify rightly fails there.
DAMAGED = {"test_namespace_record_fences_exactly_and_ignores_info"}


@pytest.fixture(autouse=True)
def kvstore_verifies_what_the_writer_leaves(request, tmp_path, build_dir):
    """`kvstore verify` must pass on every store these tests leave behind."""
    yield
    kvstore = build_dir / "kvstore" / "kvstore"
    if request.node.originalname in DAMAGED or not (
        kvstore.is_file() and os.access(kvstore, os.X_OK)
    ):
        return
    if not any(p.is_dir() for p in tmp_path.iterdir()):
        return
    done = subprocess.run(
        [str(kvstore), "verify", "-q", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------
# Side channel


@dataclass
class TransferJob:
    """The shape of vLLM's TransferJob; the side channel rides as an attribute."""

    req_id: str
    sync: bool = False


def test_metadata_is_in_block_order_and_picklable():
    maker = sls.JobMaker(sls.Staging())
    state = sls.FakeReqState(0, 4)
    keys = []
    # Slot order (g0 first, then the state groups), chunk order inside.
    for i in range(4):
        keys.append(sls.offload_key(sls.block_hash(i), 0))
    keys += [sls.offload_key(sls.block_hash(3), g) for g in sls.STATE_GROUPS]
    for k in keys:
        state.positions[k] = (sls.k_index(k) + 1) * sls.TOKENS_PER_CHUNK
    shuffled = set(reversed(keys))
    meta = maker.meta.build(shuffled, state)
    assert meta["version"] == ksl.side_channel.META_VERSION
    assert meta["keys"] == keys
    assert meta["groups"] == [0, 0, 0, 0, 2, 3, 4, 5]
    assert meta["tokens"] == [16, 32, 48, 64, 64, 64, 64, 64]
    (candidate,) = meta["candidates"]
    assert candidate["boundary"] == 64
    assert candidate["chain"] == [sls.block_hash(i) for i in range(4)]
    assert candidate["full"] == [0] and candidate["state"] == list(sls.STATE_GROUPS)

    job = TransferJob("r0")
    job.kv_store_meta = meta
    back = pickle.loads(pickle.dumps(job))
    assert back.kv_store_meta == meta


def test_metadata_without_state_groups_names_the_job_end():
    meta = ksl.side_channel.SchedulerStoreMeta(
        [ksl.side_channel.SchedulerGroup(0, 16, "full")], 16
    )
    state = sls.FakeReqState(0, 3)
    keys = {sls.offload_key(sls.block_hash(i), 0) for i in (1, 2)}
    for k in keys:
        state.positions[k] = (sls.k_index(k) + 1) * 16
    built = meta.build(keys, state)
    assert [c["boundary"] for c in built["candidates"]] == [48]
    assert built["candidates"][0]["chain"] == [sls.block_hash(i) for i in range(3)]


def test_a_drafter_sharing_the_full_group_gets_the_next_chunk_proven():
    """GLM-5.3 with its MTP layer in the MLA group: vLLM stores the state one chunk
    before the full chunks' end, and its lookup asks for that next chunk before it
    drops it. The job names the state boundary and a manifest of the full group alone
    at the end; without drafter layers only the state boundary."""
    state = sls.FakeReqState(0, 4)
    keys = {sls.offload_key(sls.block_hash(i), 0) for i in range(4)}
    keys.add(sls.offload_key(sls.block_hash(2), 1))  # the state at 48 tokens
    for k in keys:
        state.positions[k] = (sls.k_index(k) + 1) * 16

    def candidates(eagle: bool) -> list[tuple[int, int, list[int]]]:
        meta = ksl.side_channel.SchedulerStoreMeta(
            [
                ksl.side_channel.SchedulerGroup(0, 16, "full", eagle=eagle),
                ksl.side_channel.SchedulerGroup(1, 16, "state"),
            ],
            16,
        )
        built = meta.build(keys, state)["candidates"]
        return [(c["boundary"], len(c["chain"]), c["state"]) for c in built]

    assert candidates(True) == [(48, 3, [1]), (64, 4, [])]
    assert candidates(False) == [(48, 3, [1])]


def test_metadata_with_an_unknown_position_names_nothing():
    maker = sls.JobMaker(sls.Staging())
    state = sls.FakeReqState(0, 1)
    built = maker.meta.build({sls.offload_key(sls.block_hash(0), 0)}, state)
    assert built["keys"] is None


# --------------------------------------------------------------------------
# Writer: bytes, headers, manifests


def only_base(root: Path) -> Path:
    (base,) = sls.rank_bases(root)
    return base


def write_boundary(store, maker, boundary_chunk: int, first: int = 0, branch: int = 0):
    """Full chunks first..boundary_chunk, then the four state payloads."""
    jobs = [maker.full_chunks(first, boundary_chunk - first + 1, branch)]
    jobs += [maker.state(boundary_chunk, g, branch) for g in sls.STATE_GROUPS]
    for job in jobs:
        sls.run_job(store, job)
    return jobs


@pytest.mark.parametrize(
    "model,served,folder",
    [
        ("/srv/run/../models/llama8b", "", "llama8b"),
        ("/srv/models/llama8b/", "", "llama8b"),
        ("./models/llama8b", "", "llama8b"),
        ("zai-org/GLM-5.3", "", "zai-org-GLM-5.3"),
        ("/srv/run/../models/llama8b", "/srv/run/../models/llama8b", "llama8b"),
        ("/srv/run/../models/llama8b", "glm-prod", "glm-prod"),
        ("zai-org/GLM-5.3", "GLM 5.3 (prod)", "GLM-5.3-prod"),
    ],
)
def test_the_folder_is_named_by_a_readable_model_name(tmp_path, model, served, folder):
    """Not the path as given (folders and `..` included): the served name, else
    the model's last folder; the identity stays in the fenced record."""
    store, staging = sls.make_store(
        tmp_path, settings=sls.settings(model=model, served_name=served)
    )
    write_boundary(store, sls.JobMaker(staging), 1)
    base = only_base(tmp_path)
    assert base.name.startswith(f"glm53kv_{folder}_") and base.name.endswith("_r1")
    parsed = chunk_fmt.parse_rank_base_name(base.name)
    assert parsed.model == folder
    record = fmt.decode_namespace_record(
        (tmp_path / fmt.namespace_record_name(base.name)).read_bytes()
    )
    assert record.fenced["model"] == model  # the identity, as vLLM was given it


def test_the_served_name_is_read_from_vllms_model_config():
    from types import SimpleNamespace as NS

    import kv_store_local.vllm_worker as vw

    served = vw.served_name
    assert served(NS(model_config=NS(served_model_name="glm-prod"))) == "glm-prod"
    assert served(NS(model_config=NS(served_model_name=["a", "b"]))) == "a"
    assert served(NS(model_config=NS(served_model_name=None))) == ""
    assert served(NS()) == ""


def test_two_spellings_of_one_path_share_the_folder_name_not_the_identity(tmp_path):
    for model in ("/srv/run/../models/llama8b", "/srv/models/llama8b"):
        store, staging = sls.make_store(tmp_path, settings=sls.settings(model=model))
        write_boundary(store, sls.JobMaker(staging), 1)
    names = [chunk_fmt.parse_rank_base_name(b.name) for b in sls.rank_bases(tmp_path)]
    assert len(names) == 2 and {n.model for n in names} == {"llama8b"}
    assert len({n.ns_short for n in names}) == 2  # the fence still tells them apart


def test_payloads_are_the_real_bytes_with_verified_headers(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    jobs = write_boundary(store, maker, 2)
    base = only_base(tmp_path)
    assert base.name.startswith("glm53kv_test-Mini-7g_") and base.name.endswith("_r1")
    record = fmt.decode_namespace_record(
        (tmp_path / fmt.namespace_record_name(base.name)).read_bytes()
    )
    ns = record.namespace_hash
    expected = {k: v for job in jobs for k, v in job.expected.items()}
    assert len(expected) == 3 + 4
    for (hash_, group), real in expected.items():
        path = store.writer.layout.chunk(hash_.hex(), group)
        header = chunk_fmt.verify_chunk_file(path)
        data = Path(path).read_bytes()
        assert data[header.header_length :] == real  # no padding on disk
        assert b"\xee" * 16 not in real  # the padding pattern never lands
        assert (header.namespace_hash, header.group, header.key_hash) == (
            ns,
            group,
            hash_,
        )
        assert header.boundary == (sls.k_index(hash_ + b"\0" * 4) + 1) * 16
    assert record.info["rank_source"] == "initialized TP group"
    assert record.fenced["tp_size"] == sls.TP_SIZE
    assert [g for g, _ in record.fenced["page_sizes"]] == list(sls.OFFLOADED)
    assert sls.temp_files(tmp_path) == []


def test_state_layers_split_into_conv_and_temporal_segments(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    job = maker.state(0, 3)
    sls.run_job(store, job)
    header = fmt.read_chunk_header(
        store.writer.layout.chunk(sls.block_hash(0).hex(), 3)
    )
    kinds = [
        (s.layer, s.kind, s.dtype, s.shape, s.offset, s.length) for s in header.segments
    ]
    assert kinds == [
        (0, fmt.SegmentKind.CONV, fmt.DType.BFLOAT16, (4, 3), 0, 24),
        (0, fmt.SegmentKind.TEMPORAL, fmt.DType.FLOAT32, (2, 4), 24, 32),
        (1, fmt.SegmentKind.CONV, fmt.DType.BFLOAT16, (4, 3), 56, 24),
        (1, fmt.SegmentKind.TEMPORAL, fmt.DType.FLOAT32, (2, 4), 80, 32),
    ]
    assert [s.stride for s in header.segments][:2] == [(3, 1), (4, 1)]
    full = maker.full_chunks(0, 1)
    sls.run_job(store, full)
    header = fmt.read_chunk_header(
        store.writer.layout.chunk(sls.block_hash(0).hex(), 0)
    )
    assert [(s.layer, s.kind, s.length) for s in header.segments] == [
        (0, fmt.SegmentKind.KV, sls.FULL_REAL),
        (1, fmt.SegmentKind.KV, sls.FULL_REAL),
    ]


def test_kda_conv_parts_are_one_segment_each(tmp_path, monkeypatch):
    """A KDA-style layer (q, k, v conv states + temporal) is written as format
    v2: one CONV segment per conv part with its own dtype, shape and strides
    (the v1 writer wrote one opaque uint8 CONV segment)."""
    q = ksl.layout.StatePart("bfloat16", (4, 3))  # 24 bytes
    k = ksl.layout.StatePart("bfloat16", (2, 3))  # 12 bytes
    v = ksl.layout.StatePart("float32", (2, 3))  # 24 bytes
    temporal = ksl.layout.StatePart("float32", (2, 4))  # 32 bytes
    kda = sls.hybrid_groups(sls.NUM_LAYERS, sls.FULL_REAL, sls.NUM_LAYERS, q, temporal)
    kda = [
        g
        if g.kind != "state"
        else ksl.layout.GroupLayout(
            g.group,
            g.slot,
            g.kind,
            tuple(
                ksl.layout.LayerLayout(i, 92, (q, k, v, temporal), 10 + i)
                for i in range(sls.NUM_LAYERS)
            ),
        )
        for g in kda
    ]
    monkeypatch.setattr(sls, "group_layouts", lambda: kda)
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    job = maker.state(0, 3)
    sls.run_job(store, job)
    path = store.writer.layout.chunk(sls.block_hash(0).hex(), 3)
    header = chunk_fmt.verify_chunk_file(path)
    assert header.format_version == 2
    conv, tmp = fmt.SegmentKind.CONV, fmt.SegmentKind.TEMPORAL
    bf16, f32 = fmt.DType.BFLOAT16, fmt.DType.FLOAT32
    assert [
        (s.layer, s.kind, s.part, s.dtype, s.shape, s.stride, s.offset, s.length)
        for s in header.segments
    ] == [
        (10, conv, 0, bf16, (4, 3), (3, 1), 0, 24),
        (10, conv, 1, bf16, (2, 3), (3, 1), 24, 12),
        (10, conv, 2, f32, (2, 3), (3, 1), 36, 24),
        (10, tmp, 0, f32, (2, 4), (4, 1), 60, 32),
        (11, conv, 0, bf16, (4, 3), (3, 1), 92, 24),
        (11, conv, 1, bf16, (2, 3), (3, 1), 116, 12),
        (11, conv, 2, f32, (2, 3), (3, 1), 128, 24),
        (11, tmp, 0, f32, (2, 4), (4, 1), 152, 32),
    ]
    # The payload is the DMA's real bytes, layer by layer, parts back to back.
    data = Path(path).read_bytes()
    key = (sls.block_hash(0), 3)
    assert data[header.header_length :] == job.expected[key]
    # Manifests and the namespace record are v2 too (a v1 store is another
    # namespace).
    record = fmt.decode_namespace_record(
        Path(store.writer.layout.namespace_record).read_bytes()
    )
    assert record.fenced["format_version"] == 2
    for g in sls.STATE_GROUPS:
        sls.run_job(store, maker.state(1, g))
    sls.run_job(store, maker.full_chunks(0, 2))
    (m,) = sls.manifests(Path(store.writer.layout.base)).values()
    assert m.format == 2 and m.boundary == 32
    assert sls.verify_store(tmp_path) == []


def test_manifest_waits_for_every_state_payload_and_full_chunk(tmp_path, monkeypatch):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    base = only_base(tmp_path)
    published = []
    real_write = ksl.durable_io.write_file_durably

    def checking_write(path, parts, sync_dir=True):
        # At the moment a manifest is written, every file it names must
        # already be durable and verify.
        if os.path.basename(os.path.dirname(path)) == fmt.MANIFEST_DIR:
            manifest = fmt.decode_manifest(b"".join(bytes(p) for p in parts))
            for g in manifest.groups:
                for e in g.entries:
                    chunk_fmt.verify_chunk_file(
                        store.writer.layout.chunk(e.key, g.group)
                    )
            published.append(os.path.basename(path))
        return real_write(path, parts, sync_dir)

    monkeypatch.setattr(ksl.durable_io, "write_file_durably", checking_write)
    # State payloads first, then the full chunks the boundary needs.
    for g in sls.STATE_GROUPS[:3]:
        sls.run_job(store, maker.state(1, g))
    sls.run_job(store, maker.full_chunks(0, 1))
    assert sls.manifests(base) == {}
    sls.run_job(store, maker.state(1, 5))
    assert sls.manifests(base) == {}  # chunk 1 of g0 is still missing
    sls.run_job(store, maker.full_chunks(1, 1))
    (name,) = sls.manifests(base)
    assert published == [name]
    m = sls.manifests(base)[name]
    assert m.boundary == 32 and m.rank == sls.RANK and m.chunk_tokens == 16
    assert m.chain == (sls.block_hash(0).hex(), sls.block_hash(1).hex())
    assert [(g.group, g.kind, len(g.entries)) for g in m.groups] == [
        (0, "full", 2),
        (2, "state", 1),
        (3, "state", 1),
        (4, "state", 1),
        (5, "state", 1),
    ]
    assert sls.verify_store(tmp_path) == []


def test_failed_key_is_manifested_only_after_a_full_rewrite(tmp_path):
    lib = sls.store_library()
    faulty = sls.FailingPaths(lib, (), fmt.native.FAULT_WRITE, errno.EIO)
    store, staging = sls.make_store(tmp_path, store_lib=faulty)
    store._owed.retry_failed_after = 0.0  # retry after the writer's next job
    maker = sls.JobMaker(staging)
    bad = store.writer.layout.chunk(sls.block_hash(1).hex(), 4)
    faulty.paths = {bad}  # every write of this file fails, in the library
    write_boundary(store, maker, 1)
    assert not os.path.exists(bad)
    assert store.writer.ledger.is_failed((sls.block_hash(1), 4))
    # The g4 job failed, and the writer's retries after the g4 and the g5
    # jobs failed again.
    assert store.stats.keys_failed == 3
    assert sls.manifests(only_base(tmp_path)) == {}
    # Still failing: every retry fails again; nothing is published, no temp.
    sls.run_job(store, maker.full_chunks(5, 1))
    assert store.stats.keys_failed == 4
    assert sls.manifests(only_base(tmp_path)) == {}
    assert sls.temp_files(tmp_path) == []
    # The disk works again: after the next job the writer takes the key
    # again from its staging row (still holding it), writes it in full, and
    # the boundary that waited for it is published.
    faulty.paths = set()
    sls.run_job(store, maker.full_chunks(6, 1))
    assert os.path.exists(bad)
    assert not store.writer.ledger.is_failed((sls.block_hash(1), 4))
    assert store.stats.keys_recaptured == store.stats.keys_recaptured_writer == 4
    assert [m.boundary for m in sls.manifests(only_base(tmp_path)).values()] == [32]
    assert sls.verify_store(tmp_path) == []


def test_failed_key_is_not_taken_from_disk(tmp_path, monkeypatch):
    """A key whose write failed this boot is rewritten, never deduplicated
    from a file found at its name (its state on disk is unknown)."""
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    write_boundary(store, maker, 0)
    path = store.writer.layout.chunk(sls.block_hash(0).hex(), 2)
    store.writer.ledger.failed((sls.block_hash(0), 2))  # as a failed write does
    before = os.stat(path).st_ino
    sls.run_job(store, maker.state(0, 2))
    assert os.stat(path).st_ino != before  # a new file, renamed over it
    assert not store.writer.ledger.is_failed((sls.block_hash(0), 2))
    assert sls.verify_store(tmp_path) == []


def test_a_refused_file_is_written_anew_and_its_manifests_published_again(tmp_path):
    """A payload bit flipped under a header that still verifies: dedup keeps
    the file. Once a reader refuses it (``distrust``, the restore overlay's
    call), the next capture writes it anew and every manifest naming it is
    published again under its name (a new file, which a reader reads again)."""
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    base = only_base(tmp_path)
    manifest_dir = Path(store.writer.layout.manifest_dir)
    write_boundary(store, maker, 1)
    write_boundary(store, maker, 2, first=2)
    names = sorted(sls.manifests(base))
    assert len(names) == 2
    path = Path(store.writer.layout.chunk(sls.block_hash(1).hex(), 0))
    good = path.read_bytes()
    path.write_bytes(good[:-1] + bytes([good[-1] ^ 0x01]))
    write_boundary(store, maker, 1)
    assert path.read_bytes() != good  # the header verifies: deduplicated
    assert store.stats.keys_written == 11 and store.stats.keys_distrusted == 0
    inodes = {n: (manifest_dir / n).stat().st_ino for n in names}
    store.writer.distrust((sls.block_hash(1), 0))
    write_boundary(store, maker, 1)
    assert store.stats.keys_distrusted == 1
    assert path.read_bytes() == good
    assert store.stats.keys_written == 12  # that key alone
    # Both boundaries' chains hold chunk 1: the one this job completes is
    # published again at once; B48's waits for its own candidate.
    assert sorted(sls.manifests(base)) == names
    again = [n for n in names if (manifest_dir / n).stat().st_ino != inodes[n]]
    assert [fmt.parse_manifest_file_name(n)[0] for n in again] == [32]
    write_boundary(store, maker, 2, first=2)
    assert all((manifest_dir / n).stat().st_ino != inodes[n] for n in names)
    assert sls.verify_store(tmp_path) == []


def test_keep_k_retains_the_newest_boundaries_of_every_chain(tmp_path):
    store, staging = sls.make_store(
        tmp_path, knobs=sls.knobs(tmp_path, keep_boundaries=2)
    )
    maker = sls.JobMaker(staging)
    base = only_base(tmp_path)
    layout = store.writer.layout
    write_boundary(store, maker, 0)
    write_boundary(store, maker, 1, first=1)
    write_boundary(store, maker, 2, first=2)
    names = sorted(sls.manifests(base))
    assert [fmt.parse_manifest_file_name(n)[0] for n in names] == [32, 48]
    # B16's state payloads went with its manifest; full chunks stay.
    assert not any(
        os.path.exists(layout.chunk(sls.block_hash(0).hex(), g))
        for g in sls.STATE_GROUPS
    )
    assert os.path.exists(layout.chunk(sls.block_hash(0).hex(), 0))
    assert store.stats.manifests_superseded == 1
    # A fork off chunk 1: branch 1 shares chunks 0..1 of branch 0's prefix.
    fork = sls.JobMaker(staging)
    fork.next_chunk = 40
    fork.next_job = 100

    def fork_hash(i: int) -> bytes:
        return sls.block_hash(i) if i <= 1 else sls.block_hash(i, 1)

    for i in (2, 3):
        k = sls.offload_key(fork_hash(i), 0)
        state = sls.FakeReqState(0, i + 1)
        state.req.block_hashes = [fork_hash(j) for j in range(i + 1)]
        state.positions[k] = (i + 1) * 16
        meta = fork.meta.build({k}, state)
        job = sls.Job(200 + i, [50 + i], [1, 0, 0, 0, 0], [i, 0, 0, 0, 0], meta)
        staging.dma(50 + i, fork.layouts[0], k)
        sls.run_job(store, job)
        for g in sls.STATE_GROUPS:
            ks = sls.offload_key(fork_hash(i), g)
            state.positions[ks] = (i + 1) * 16
            meta = fork.meta.build({ks}, state)
            sizes = [0] * 5
            sizes[fork.layouts[g].slot] = 1
            indices = [0] * 5
            indices[fork.layouts[g].slot] = i
            job = sls.Job(300 + 10 * i + g, [55 + g], sizes, indices, meta)
            staging.dma(55 + g, fork.layouts[g], ks)
            sls.run_job(store, job)
    boundaries = sorted(
        (fmt.parse_manifest_file_name(n)[0], m.tip)
        for n, m in sls.manifests(base).items()
    )
    # Branch 0 keeps B32 (its ancestor) and B48; branch 1 keeps B48' and B64'.
    assert boundaries == sorted(
        [
            (32, sls.block_hash(1).hex()),
            (48, sls.block_hash(2).hex()),
            (48, fork_hash(2).hex()),
            (64, fork_hash(3).hex()),
        ]
    )
    assert sls.verify_store(tmp_path) == []


def test_keep_zero_keeps_every_manifest(tmp_path):
    store, staging = sls.make_store(
        tmp_path, knobs=sls.knobs(tmp_path, keep_boundaries=0)
    )
    maker = sls.JobMaker(staging)
    for b in range(3):
        write_boundary(store, maker, b, first=b)
    assert len(sls.manifests(only_base(tmp_path))) == 3


def test_enospc_pauses_the_writer_and_leaves_no_partial_file(tmp_path):
    store, staging = sls.make_store(tmp_path)
    store._owed.retry_failed_after = 0.0
    store.writer.pause_seconds = 0.0
    store.writer.write_threads = 1  # the files in job order
    space = {"ok": False}
    store.writer.resume_probe = lambda: space["ok"]
    maker = sls.JobMaker(staging)
    # The library writes a file's payload, then its header: the 2nd file's
    # header write fails with its payload already in the temp (midway).
    lib = store.writer.store_lib
    lib.test_fault(fmt.native.FAULT_WRITE, errno.ENOSPC, 3, 1)
    try:
        sls.run_job(store, maker.full_chunks(0, 3))
    finally:
        lib.test_fault(fmt.native.FAULT_NONE)
    assert store.stats.enospc_pauses == 1
    assert not store.writer.accepting
    assert sls.temp_files(tmp_path) == []
    written = sls.chunk_files(tmp_path)
    # Chunks 0 and 2 (the same call); chunk 1 failed, nothing of it is left.
    assert len(written) == 2 and store.stats.keys_failed == 1
    for path in written:
        chunk_fmt.verify_chunk_file(str(path))
    # While paused, captures are dropped without copying or writing.
    sls.run_job(store, maker.full_chunks(3, 1))
    assert store.stats.keys_dropped_paused == 1
    assert len(sls.chunk_files(tmp_path)) == 2
    # Space is back: the writer resumes on its next job, and the keys it
    # could not write (chunk 1 failed, 3 dropped while paused) are captured
    # again from their staging rows, which still hold them.
    space["ok"] = True
    assert store.writer.maybe_resume()
    sls.run_job(store, maker.full_chunks(4, 1))
    assert len(sls.chunk_files(tmp_path)) == 5
    assert store.stats.keys_recaptured == 2
    for path in sls.chunk_files(tmp_path):
        chunk_fmt.verify_chunk_file(str(path))
    assert store.writer.pool.used == 0


def test_tp_rank_disagreement_refuses_the_boot(tmp_path):
    """Two ranks must never share one folder: a TP rank or size the
    connector config disagrees with refuses the boot, before anything is
    made under the store folder."""
    refused = re.escape(
        "KV store: GLM53_KV_OFFLOAD=1 is refused on this rank: TP rank 0/2 "
        f"disagrees with the connector config (rank {sls.RANK}, TP size 2)"
    )
    with pytest.raises(ksl.errors.StoreRefused, match=f"^{refused}$"):
        sls.make_store(tmp_path, tp=lambda: (0, sls.TP_SIZE))
    with pytest.raises(
        ksl.errors.StoreRefused,
        match=re.escape(f"TP rank {sls.RANK}/4 disagrees with the connector config"),
    ):
        sls.make_store(tmp_path, tp=lambda: (sls.RANK, 4))
    assert list(tmp_path.iterdir()) == []


def test_tp_group_unavailable_falls_back_to_the_config_rank(tmp_path):
    def no_group():
        raise AssertionError("tensor model parallel group is not initialized")

    store, _ = sls.make_store(tmp_path, tp=no_group)
    assert store.active
    record = fmt.decode_namespace_record(
        (tmp_path / fmt.namespace_record_name(only_base(tmp_path).name)).read_bytes()
    )
    assert record.info["rank_source"].startswith("connector config")


def test_namespace_record_fences_exactly_and_ignores_info(tmp_path):
    store, _ = sls.make_store(tmp_path)
    store.shutdown()
    base = only_base(tmp_path)
    record_path = tmp_path / fmt.namespace_record_name(base.name)
    first = record_path.read_bytes()
    # A later boot with another keep-K reuses the store; the record stays.
    store, _ = sls.make_store(tmp_path, knobs=sls.knobs(tmp_path, keep_boundaries=7))
    assert store.active and store.writer.layout.base == str(base)
    assert record_path.read_bytes() == first
    store.shutdown()
    # A record whose fenced part differs refuses the boot; the record stays.
    value = json.loads(first)
    value["fenced"]["model"] = "someone/else"
    other = fmt.encode_namespace_record(
        fmt.NamespaceRecord(value["fenced"], value["info"])
    )
    record_path.write_bytes(other)
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(
        ksl.errors.StoreRefused,
        match=re.escape(
            f"refused on this rank: namespace record {record_path} fences a "
            "different namespace"
        ),
    ):
        sls.make_store(tmp_path)
    assert record_path.read_bytes() == other
    # So does an unreadable one.
    record_path.write_bytes(b"{not json")
    with pytest.raises(
        ksl.errors.StoreRefused,
        match=re.escape(f"namespace record {record_path} is unreadable: "),
    ):
        sls.make_store(tmp_path)
    assert record_path.read_bytes() == b"{not json"
    assert sorted(tmp_path.rglob("*")) == before  # nothing made or removed


def test_other_build_gets_its_own_namespace(tmp_path):
    a, _ = sls.make_store(tmp_path)
    b, _ = sls.make_store(tmp_path, knobs=sls.knobs(tmp_path, build_id="other"))
    assert a.active and b.active
    assert a.writer.namespace != b.writer.namespace
    assert len(sls.rank_bases(tmp_path)) == 2


def test_capture_regression_zeroed_staging_leaves_disk_bytes(tmp_path):
    store, staging = sls.make_store(tmp_path)
    store.writer.submit = store.writer._queue.append  # capture now, write later
    maker = sls.JobMaker(staging)
    job = maker.full_chunks(0, 2)
    store.remember(job.job_id, job.entry())
    store.capture(job.job_id)
    assert store.writer._queue and sls.chunk_files(tmp_path) == []
    staging.zero()  # the rows are freed and reused right after the ack
    store.writer.drain()
    for (hash_, group), real in job.expected.items():
        data = Path(store.writer.layout.chunk(hash_.hex(), group)).read_bytes()
        assert data.endswith(real) and any(real)


def test_flush_path_captures_after_wait(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    jobs = [maker.full_chunks(0, 1), maker.full_chunks(1, 1)]
    for job in jobs:
        store.remember(job.job_id, job.entry())
    store.capture_jobs({j.job_id for j in jobs} | {999})  # 999: a load, unknown
    assert len(sls.chunk_files(tmp_path)) == 2
    store.capture(jobs[0].job_id)  # get_finished reports it later: no double work
    assert store.stats.jobs_captured == 2


def test_full_budget_drops_stores_and_never_blocks(tmp_path):
    per_key = sls.FULL_REAL * sls.NUM_LAYERS
    store, staging = sls.make_store(tmp_path, budget=3 * per_key)
    store.writer.submit = store.writer._queue.append  # nothing drains yet
    maker = sls.JobMaker(staging)
    sls.run_job(store, maker.full_chunks(0, 5))
    assert store.stats.keys_captured == 3
    assert store.stats.keys_dropped_budget == 2
    assert store.writer.pool.used == 3 * per_key
    # Once the writer is idle it takes the two dropped keys again from their
    # staging rows (no store reused them), so all five reach the disk.
    store.writer.drain()
    assert store.writer.pool.used == 0
    assert store.stats.keys_recaptured == 2
    assert len(sls.chunk_files(tmp_path)) == 5
    sls.run_job(store, maker.full_chunks(5, 3))
    store.writer.drain()
    assert store.stats.keys_captured == 8 and len(sls.chunk_files(tmp_path)) == 8


def test_dedup_only_on_a_header_that_verifies(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    sls.run_job(store, maker.full_chunks(0, 2))
    layout = store.writer.layout
    good = Path(layout.chunk(sls.block_hash(0).hex(), 0))
    bad = Path(layout.chunk(sls.block_hash(1).hex(), 0))
    good_inode = good.stat().st_ino
    data = bytearray(bad.read_bytes())
    data[20] ^= 0x01  # a header bit: the header checksum no longer matches
    bad.write_bytes(bytes(data))
    sls.run_job(store, maker.full_chunks(0, 2))
    assert good.stat().st_ino == good_inode
    assert store.stats.keys_deduplicated == 1
    chunk_fmt.verify_chunk_file(str(bad))
    assert store.stats.keys_written == 3


class LockProbe:
    """The store library, looking at the store lock before each write."""

    def __init__(self, lib, lock_path: str) -> None:
        self.lib = lib
        self.lock_path = lock_path
        self.seen: list[str] = []

    def __getattr__(self, name):
        return getattr(self.lib, name)

    def write_chunks(self, requests, threads, **kw):
        fd = os.open(self.lock_path, os.O_RDWR)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.seen.append("exclusive granted")
            except BlockingIOError:
                self.seen.append("exclusive refused")
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            self.seen.append("shared granted")
        finally:
            os.close(fd)
        return self.lib.write_chunks(requests, threads, **kw)


def test_writer_holds_the_store_lock_shared_while_writing(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    lock_path = store.writer.layout.lock
    probe = store.writer.store_lib = LockProbe(store.writer.store_lib, lock_path)
    sls.run_job(store, maker.full_chunks(0, 1))
    assert probe.seen == ["exclusive refused", "shared granted"]
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released between jobs
    finally:
        os.close(fd)


def pending_record(store) -> list[tuple[int, str]]:
    (path,) = Path(store.writer.layout.pending_dir).iterdir()
    return chunk_fmt.decode_pending_record(path.read_bytes())


def test_pending_record_names_chunks_no_candidate_names_yet(tmp_path):
    """Issue 37: a job of full-attention chunks only names no boundary
    candidate; between it and the job that does, the store lock is dropped
    and a sweep at --grace 0 may run. The pending record names the chunks,
    sorted, each once, until a published manifest names them."""
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    sls.run_job(store, maker.full_chunks(0, 2))
    assert pending_record(store) == sorted(
        (0, sls.block_hash(i).hex()) for i in range(2)
    )
    for g in sls.STATE_GROUPS:
        sls.run_job(store, maker.state(1, g))
    assert len(sls.manifests(only_base(tmp_path))) == 1
    assert pending_record(store) == []  # the manifest names them all now
    # Chunk 2 is written by a later job, with chunk 1 written again (dedup):
    # both are listed until a manifest names them.
    sls.run_job(store, maker.full_chunks(1, 2))
    assert pending_record(store) == sorted((0, sls.block_hash(i).hex()) for i in (1, 2))


def test_pending_record_encoded_without_rechecks_is_the_codecs():
    """The writer encodes its pending record without checking every entry
    again (pending.encode_listed, issue 29): the codec's bytes, for none, one
    and many chunks in groups of one and two digits (sorted as numbers)."""
    chunks = sorted(
        (g, sls.block_hash(i).hex()) for g in (0, 2, 10, 11) for i in range(3)
    )
    for listed in ([], chunks[:1], chunks):
        assert ksl.pending.encode_listed(listed) == fmt.encode_pending_record(listed)


def test_kept_chunk_paths_are_the_codecs(tmp_path):
    """The writer joins chunk paths itself once the codec accepted a key
    shape (issue 29): the same paths, and a name the codec refuses is still
    refused."""
    store, _ = sls.make_store(tmp_path)
    lookup, layout = store.writer.lookup, store.writer.layout
    for n in range(3):
        for group in (0, 3, 12):
            for digest in (sls.block_hash(n), sls.block_hash(n)[:8]):
                path = lookup.path((digest, group))
                assert path == layout.chunk(digest.hex(), group)
    with pytest.raises(fmt.FormatError):
        lookup.path((sls.block_hash(0), fmt.MAX_GROUP_INDEX + 1))
    store.shutdown()


def test_background_thread_writes_and_shuts_down(tmp_path):
    store, staging = sls.make_store(tmp_path, background=True)
    maker = sls.JobMaker(staging)
    for b in range(3):
        write_boundary(store, maker, b, first=b)
    assert store.writer.wait_idle()
    assert len(sls.manifests(only_base(tmp_path))) == 2
    store.shutdown()
    assert not store.writer._thread.is_alive()
    assert sls.verify_store(tmp_path) == []


def test_job_that_does_not_match_its_spec_is_dropped(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    job = maker.full_chunks(0, 2)
    job.group_sizes = [1, 0, 0, 0, 0]  # two keys, one chunk in the spec
    sls.run_job(store, job)
    job = maker.full_chunks(2, 1)
    job.meta = None
    sls.run_job(store, job)
    assert store.stats.jobs_without_meta == 1
    assert store.stats.jobs_mismatched == 1
    assert sls.chunk_files(tmp_path) == []


def test_partial_chunk_is_not_written(tmp_path):
    groups = [
        ksl.layout.GroupLayout(
            0, 0, "full", (ksl.layout.LayerLayout(0, 32), ksl.layout.LayerLayout(1, 32))
        )
    ]
    settings = sls.settings(groups=groups, blocks_per_chunk=2, mamba_types={})
    store, staging = sls.make_store(tmp_path, settings=settings)
    state = sls.FakeReqState(0, 2)
    keys = [sls.offload_key(sls.block_hash(i), 0) for i in range(2)]
    meta_builder = ksl.side_channel.SchedulerStoreMeta(
        [ksl.side_channel.SchedulerGroup(0, 32, "full")], 16
    )
    for i, k in enumerate(keys):
        state.positions[k] = (i + 1) * 32
    state.req.block_hashes = [sls.block_hash(j // 2) for j in range(4)]
    meta = meta_builder.build(set(keys), state)
    # 3 GPU blocks starting at block 1: chunk 0 only half filled, chunk 1 full.
    job = sls.Job(1, [7, 8], [3], [1], meta)
    sls.run_job(store, job)
    assert store.stats.keys_dropped_incomplete == 1
    (only,) = sls.chunk_files(tmp_path)
    assert only.name == sls.block_hash(1).hex() + ".bin"
    header = chunk_fmt.verify_chunk_file(str(only))
    assert header.payload_length == 2 * 32 * 2


# --------------------------------------------------------------------------
# Pieces


def test_capture_pool_is_a_fifo_ring():
    pool = ksl.capture_pool.CapturePool(100)
    a = pool.alloc(40)
    b = pool.alloc(40)
    assert (a, b) == (0, 40)
    assert pool.alloc(30) is None  # 20 left at the end, nothing free in front
    pool.free(a)
    c = pool.alloc(30)  # does not fit the end: wraps to the front
    assert c == 0
    assert pool.alloc(20) is None  # wrapped: only [30, 40) is free
    d = pool.alloc(10)
    assert d == 30
    pool.free(c)  # out of order: held until b goes
    assert pool.used == 80
    pool.free(b)
    assert pool.used == 10
    assert pool.alloc(101) is None and pool.alloc(0) is None


def test_coalesce_merges_runs_that_continue_on_both_sides():
    src = bytearray(10)
    other = bytearray(10)
    runs = [(src, 0, 0, 4), (src, 4, 4, 4), (src, 9, 8, 1), (other, 0, 9, 1)]
    assert ksl.copier.coalesce(runs) == [
        (src, 0, 0, 8),
        (src, 9, 8, 1),
        (other, 0, 9, 1),
    ]


def test_parallel_memmove_copies_every_byte():
    pool = ksl.capture_pool.CapturePool(24 << 20)
    src = bytearray(sls.pattern(b"x", 20 << 20))
    copier = ksl.copier.Copier(pool, "memmove", threads=4)
    copier.copy([(src, 1000, 0, (20 << 20) - 1000)])
    assert pool.view(0, (20 << 20) - 1000) == src[1000:]
    copier.close()


def test_bind_layers_refuses_a_layout_it_cannot_read():
    groups = sls.group_layouts()
    refs = [[(i, g.layers[i].real_bytes) for i in range(2)] for g in groups]
    bound = ksl.layout.bind_layers(groups, refs)
    assert [layer.tensor for layer in bound[0].layers] == [0, 1]
    with pytest.raises(ksl.errors.WriterDisabled, match="packed"):
        ksl.layout.bind_layers(groups, [[(0, 4096)] for _ in groups])
    refs[0][1] = (1, 128)  # padded size: the DMA would copy padding
    with pytest.raises(ksl.errors.WriterDisabled, match="copies 128 bytes"):
        ksl.layout.bind_layers(groups, refs)


def test_bind_layers_reads_a_packed_block_at_each_layers_offset():
    """GLM-5.3's layout (block-outermost): one ref per group for the whole block,
    each layer at its own offset; the indexer keys and MLA of one model layer are
    parts 0 and 1 of its index in the chunk header."""
    LayerLayout, GroupLayout = ksl.layout.LayerLayout, ksl.layout.GroupLayout
    layers = (
        LayerLayout(-1, 4224, (), 3, 0, offset=0),
        LayerLayout(-1, 524288, (), 3, 1, offset=8448),
        LayerLayout(-1, 4224, (), 7, 0, offset=4224),
        LayerLayout(-1, 524288, (), 7, 1, offset=8448 + 524288),
    )
    group = GroupLayout(4, 0, "full", layers)
    (bound,) = ksl.layout.bind_layers([group], [[(2, 1057792)]])
    assert [(x.tensor, x.offset) for x in bound.layers] == [
        (2, 0), (2, 8448), (2, 4224), (2, 532736)
    ]  # fmt: skip
    segments = bound.segments(1)
    assert [(s.layer, s.part, s.length) for s in segments] == [
        (3, 0, 4224), (3, 1, 524288), (7, 0, 4224), (7, 1, 524288)
    ]  # fmt: skip
    header = sls.fmt.ChunkHeader(
        namespace_hash=b"n" * 32, key_hash=b"k" * 32, group=4, boundary=512,
        payload_length=sum(s.length for s in segments), payload_checksum=0,
        segments=segments,
    )  # fmt: skip
    assert chunk_fmt.decode_header(chunk_fmt.encode_header(header)).segments == segments
    # Layers that overlap, or run past the block, are not read.
    with pytest.raises(ksl.errors.WriterDisabled, match="lie apart"):
        ksl.layout.bind_layers([group], [[(2, 532736 + 1000)]])
    overlapping = GroupLayout(4, 0, "full", (layers[0], replace(layers[2], offset=100)))
    with pytest.raises(ksl.errors.WriterDisabled, match="lie apart"):
        ksl.layout.bind_layers([overlapping], [[(2, 1057792)]])


def test_fsync_failure_removes_the_temp_and_ledgers_the_key(tmp_path):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    # Only chunk temp files fail (the library's fdatasync); folders and
    # manifests still sync.
    lib = store.writer.store_lib
    lib.test_fault(fmt.native.FAULT_SYNC, errno.EIO, 0, 2)
    try:
        sls.run_job(store, maker.full_chunks(0, 2))
    finally:
        lib.test_fault(fmt.native.FAULT_NONE)
    assert sls.chunk_files(tmp_path) == []
    assert sls.temp_files(tmp_path) == []
    assert store.stats.keys_failed == 2
    assert all(store.writer.ledger.is_failed((sls.block_hash(i), 0)) for i in range(2))


def test_files_found_on_disk_get_their_directory_synced_before_a_manifest(
    tmp_path, monkeypatch
):
    store, staging = sls.make_store(tmp_path)
    maker = sls.JobMaker(staging)
    sls.run_job(store, maker.full_chunks(0, 2))  # boot 1: chunks, no state yet
    store.shutdown()
    store, staging = sls.make_store(tmp_path)  # boot 2
    maker = sls.JobMaker(staging)
    layout = store.writer.layout
    old_dirs = {
        os.path.dirname(layout.chunk(sls.block_hash(i).hex(), 0)) for i in range(2)
    }
    events = []
    real_sync = ksl.durable_io.fsync_dir
    real_write = ksl.durable_io.write_file_durably

    def sync(path):
        events.append(("sync", path))
        return real_sync(path)

    def write(path, parts, sync_dir=True):
        events.append(("write", path))
        return real_write(path, parts, sync_dir)

    monkeypatch.setattr(ksl.durable_io, "fsync_dir", sync)
    monkeypatch.setattr(ksl.durable_io, "write_file_durably", write)
    for g in sls.STATE_GROUPS:
        sls.run_job(store, maker.state(1, g))
    (manifest_write,) = [
        i
        for i, (kind, path) in enumerate(events)
        if kind == "write" and "/manifests/" in path
    ]
    synced_before = {path for kind, path in events[:manifest_write] if kind == "sync"}
    assert old_dirs <= synced_before


# The library CRCs each payload in 1 MiB windows as it writes them.
WINDOW = 1 << 20


# (No 0: a chunk's payload is never empty, field_out_of_range.)
@pytest.mark.parametrize(
    "size", [1, 63, 64, 65, 200, 4096 + 7, WINDOW - 1, WINDOW, 2 * WINDOW + 7]
)
def test_windowed_checksum_equals_the_whole_payload_crc(tmp_path, size):
    """The CRC in the header, combined window by window over runs of any
    length (a window ends inside a run, a run inside a window), is the CRC
    of the whole payload."""
    lib = sls.store_library()
    payload = bytearray(sls.pattern(b"crc", size))
    base = ksl.capture_device.host_address(payload) if size else 0
    cuts = sorted({0, size, size // 3, min(size, size // 3 + 1), (2 * size) // 3})
    runs = [(base + a, b - a) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
    path = tmp_path / "chunk.bin"
    request = fmt.native.WriteRequest(
        path=str(path),
        group=0,
        namespace_hash=bytes(32),
        key_hash=sls.block_hash(0),
        boundary=16,
        segments=fmt.make_segments(
            [(0, fmt.SegmentKind.KV, fmt.DType.UINT8, (size,), (1,))]
        ),
        runs=runs,
    )
    (result,) = lib.write_chunks([request], 1)
    assert result.ok, result.message
    assert result.payload_checksum == chunk_fmt.crc32(payload)
    header = chunk_fmt.verify_chunk_file(str(path))
    assert path.read_bytes()[header.header_length :] == payload


class WriteLog:
    """The store library, noting which chunk files each call made durable."""

    def __init__(self, lib) -> None:
        self.lib = lib
        self.durable: set[str] = set()

    def __getattr__(self, name):
        return getattr(self.lib, name)

    def write_chunks(self, requests, threads, **kw):
        results = self.lib.write_chunks(requests, threads, **kw)
        for request, result in zip(requests, results, strict=True):
            if result.ok:
                self.durable.add(request.path)
        return results


def test_manifest_names_only_checksummed_files_in_synced_directories(
    tmp_path, monkeypatch
):
    """A manifest names only files the library reported durable (data
    synced, renamed, folder synced: storeio/write_chunks_test.cpp) or whose
    folders the writer synced itself, each with its real CRC; a file whose
    folder sync failed is named by none until written anew."""
    store, staging = sls.make_store(tmp_path)
    log = store.writer.store_lib = WriteLog(store.writer.store_lib)
    maker = sls.JobMaker(staging)
    layout = store.writer.layout
    events: list[tuple[str, str]] = []
    real_sync = ksl.durable_io.fsync_dir
    real_write = ksl.durable_io.write_file_durably

    def sync(path):
        events.append(("sync", path))
        return real_sync(path)

    def write(path, parts, sync_dir=True):
        if "/manifests/" in path:
            manifest = fmt.decode_manifest(b"".join(bytes(p) for p in parts))
            for g in manifest.groups:
                for e in g.entries:
                    chunk = layout.chunk(e.key, g.group)
                    # The payload CRC in the header is the real one ...
                    chunk_fmt.verify_chunk_file(chunk)
                    # ... and the file is durable: the library's, or synced here.
                    assert chunk in log.durable or (
                        ("sync", os.path.dirname(chunk)) in events
                    )
            events.append(("manifest", path))
        return real_write(path, parts, sync_dir)

    monkeypatch.setattr(ksl.durable_io, "fsync_dir", sync)
    monkeypatch.setattr(ksl.durable_io, "write_file_durably", write)
    write_boundary(store, maker, 2)
    # The last state payload's folder sync fails: not durable, not named.
    lib = log.lib
    store._owed.retry_failed_after = 3600.0  # no retry in this test
    jobs = [maker.full_chunks(3, 2)]
    jobs += [maker.state(4, g) for g in sls.STATE_GROUPS]
    for job in jobs[:-1]:
        sls.run_job(store, job)
    lib.test_fault(fmt.native.FAULT_DIR_SYNC, errno.EIO, 0, 1)
    try:
        sls.run_job(store, jobs[-1])
    finally:
        lib.test_fault(fmt.native.FAULT_NONE)
    assert sum(kind == "manifest" for kind, _ in events) == 1
    assert store.stats.keys_failed == 1
    # Written anew in full: the boundary is published.
    sls.run_job(store, maker.state(4, sls.STATE_GROUPS[-1]))
    assert sum(kind == "manifest" for kind, _ in events) == 2
    assert store.writer.pool.used == 0
    assert sls.verify_store(tmp_path) == []


def test_model_layer_index_comes_from_the_layer_name(tmp_path):
    index = ksl.layout.model_layer_index
    assert index("model.layers.12.mixer") == 12
    assert index("language_model.model.layers.0.self_attn.attn") == 0
    assert index("g0.l0") is None  # no all-digit component
    assert index("model.layers.1.experts.3") is None  # two: ambiguous
    # and the namespace says which meaning its headers use
    store, _ = sls.make_store(tmp_path)
    record = fmt.decode_namespace_record(
        Path(store.writer.layout.namespace_record).read_bytes()
    )
    assert record.fenced["layer_index"] == "model"
    group = ksl.layout.GroupLayout(
        0,
        0,
        "full",
        (
            ksl.layout.LayerLayout(0, 8, (), 7),
            ksl.layout.LayerLayout(1, 8, (), 9),
        ),
    )
    assert [s.layer for s in group.segments(1)] == [7, 9]


def test_state_strides_are_read_and_undescribable_views_refused():
    conv = ksl.layout.StatePart("bfloat16", (4, 3))  # 24 bytes
    temporal = ksl.layout.StatePart("float32", (2, 4))  # 32 bytes
    parts = (conv, temporal)
    dense = [((4, 3), (3, 1), 0), ((2, 4), (4, 1), 24)]
    read = ksl.layout.state_strides(parts, dense)
    assert [p.stride for p in read] == [(3, 1), (4, 1)]
    group = ksl.layout.GroupLayout(
        2, 1, "state", (ksl.layout.LayerLayout(0, 56, read),)
    )
    assert [s.stride for s in group.segments(1)] == [(3, 1), (4, 1)]
    bad = {
        "transposed conv": [((4, 3), (1, 4), 0), ((2, 4), (4, 1), 24)],
        "gap before temporal": [((4, 3), (3, 1), 0), ((2, 4), (4, 1), 32)],
        "other shape": [((3, 4), (4, 1), 0), ((2, 4), (4, 1), 24)],
        "one tensor missing": [((4, 3), (3, 1), 0)],
    }
    for case, views in bad.items():
        with pytest.raises(ksl.errors.WriterDisabled):
            ksl.layout.state_strides(parts, views)
        assert case
