"""kv-offload-store-local hooks in the real 0.33.0 modules, patched by `overlay apply`.

Both overlays are applied in ORDER (scope, then store-local) to a copy of the
pinned tree; the harness then runs the patched scheduler and worker modules.
The writer itself runs for real; only the staging tensors (torch, a GPU) are
replaced by a bytearray laid out the same way.
"""

from __future__ import annotations

import ast
import importlib
import os
import pickle
import sys
from types import SimpleNamespace

import harness
import pytest
from conftest import REPO_ROOT as REPO
from fake_offloading import make_spec
from hybrid_layout import OFFLOADING, STATE_GROUPS, HybridVllm, scheduler_output
from store_rig import StoreRig
from trees import patched_copy, run_overlay

OVERLAYS = "kv-offload-scope,kv-offload-store-local"
BLOCK = 256
HASH = 64
NUM_BLOCKS = 64


def apply_args(root, manifests_dir) -> list[str]:
    return [
        "--root",
        str(root),
        "--manifests",
        str(manifests_dir),
        "--overlays",
        OVERLAYS,
    ]


@pytest.fixture(scope="module")
def patched_tree(overlay_bin, engine_tree, manifests_dir, tmp_path_factory):
    dst = tmp_path_factory.mktemp("store-local")
    return patched_copy(
        overlay_bin, engine_tree, dst, manifests_dir, OVERLAYS, check_injected=True
    )


@pytest.fixture
def patched(patched_tree, engine_name):
    with harness.engine(patched_tree, package=engine_name) as ns:
        yield ns


@pytest.fixture(autouse=True)
def knobs_unset(monkeypatch):
    for name in list(os.environ):
        if name.startswith("GLM53_KV_OFFLOAD"):
            monkeypatch.delenv(name)


@pytest.fixture
def knob_on(monkeypatch, tmp_path):
    monkeypatch.setenv("GLM53_KV_OFFLOAD", "1")
    monkeypatch.setenv("GLM53_KV_OFFLOAD_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("GLM53_KV_OFFLOAD_CPU_GB", "1")
    return tmp_path / "store"


class Vllm(HybridVllm):
    """The patched modules plus builders for the 7-group hybrid layout."""

    def __init__(self, ns) -> None:
        super().__init__(
            ns,
            block=BLOCK,
            hash_unit=HASH,
            num_blocks=NUM_BLOCKS,
            model="test/hybrid-7g",
        )

    def layout(self):
        return self.hybrid_layout()

    def spec(self, vllm_config, kv_cache_config, worker=None):
        return make_spec(
            self, self.offloading_config(vllm_config, kv_cache_config), worker=worker
        )

    def request(self, num_tokens: int, req_id: str = "r0"):
        hashes = [i.to_bytes(4, "big") * 8 for i in range(num_tokens // HASH)]
        return super().request(req_id, hashes, num_tokens)


def store_step(vllm: Vllm):
    """One scheduler step: a 4-block prompt plus one state hand-off (g3 at 2 blocks)."""
    kv_cache_config = vllm.layout()
    vllm_config = vllm.vllm_config()
    spec = vllm.spec(vllm_config, kv_cache_config)
    scheduler = vllm.scheduler.OffloadingConnectorScheduler(
        spec, vllm_config, kv_cache_config
    )
    request = vllm.request(4 * BLOCK)
    scheduler.on_new_request(request)
    hits = scheduler.get_num_new_matched_tokens(request, 0)
    block_ids = tuple([1000 * g + b + 1 for b in range(4)] for g in range(7))
    handoffs = {request.request_id: [(3, 7777, 2 * BLOCK)]}
    meta = scheduler.build_connector_meta(
        scheduler_output(request, block_ids, handoffs)
    )
    return SimpleNamespace(
        scheduler=scheduler, spec=spec, request=request, meta=meta, hits=hits
    )


def writer_loaded() -> bool:
    """Whether the tree's writer module was imported in this engine namespace."""
    return f"{OFFLOADING}.kv_store_local" in sys.modules


# --------------------------------------------------------------------------
# Engine level


def test_both_overlays_apply_and_check_on_the_pinned_tree(
    overlay_bin, tree_copy, manifests_dir
):
    done = run_overlay(
        overlay_bin, "apply", "--check-injected", *apply_args(tree_copy, manifests_dir)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    module = tree_copy / OFFLOADING.replace(".", "/")
    for name in ("kv_store_local", "kv_store_format"):
        package = REPO / "overlays" / "kv-offload-store-local" / name
        for source in package.glob("*.py"):  # every module of the package, installed
            installed = (module / name / source.name).read_bytes()
            assert installed.endswith(source.read_bytes()), f"{name}/{source.name}"
    assert (module / "kv_offload_knobs.py").is_file()
    check = run_overlay(
        overlay_bin, "check", "--check-injected", *apply_args(tree_copy, manifests_dir)
    )
    assert check.returncode == 0, check.stdout + check.stderr
    # Reverting store-local alone leaves the scoped tree.
    done = run_overlay(
        overlay_bin,
        "revert",
        "--root",
        str(tree_copy),
        "--manifests",
        str(manifests_dir),
        "--overlays",
        "kv-offload-store-local",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (module / "kv_store_local").exists()
    assert (module / "kv_offload_knobs.py").is_file()  # the scope overlay's
    assert "kv_store" not in (module / "worker.py").read_text()


def test_hooks_are_behind_the_knob(patched_tree):
    """Every import of the writer sits inside `if os.environ.get("GLM53_KV_OFFLOAD"...)`."""
    module = patched_tree / OFFLOADING.replace(".", "/")
    for name in (
        "scheduler.py",
        "worker.py",
        "metrics.py",
        "../offloading_connector.py",
    ):
        tree = ast.parse((module / name).read_text())
        guarded = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "GLM53_KV_OFFLOAD" in ast.unparse(
                node.test
            ):
                guarded.update(id(n) for n in ast.walk(node))
        imports = [
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            and "kv_store_local" in ast.unparse(node)
        ]
        assert imports, name
        assert all(id(node) in guarded for node in imports), name


# --------------------------------------------------------------------------
# Knob unset: the scoped tree's behaviour, writer never imported


def test_knob_unset_never_imports_the_writer(patched):
    vllm = Vllm(patched)
    step = store_step(vllm)
    assert not writer_loaded()
    assert step.spec.manager.lookups > 0  # lookups run as upstream's do
    assert step.scheduler._kv_store_meta is None
    for job in step.meta.store_jobs.values():
        assert not hasattr(job, "kv_store_meta")


@pytest.mark.parametrize("value", ["yes", "", "2"])
def test_bad_knob_fails_the_boot(patched, monkeypatch, value):
    monkeypatch.setenv("GLM53_KV_OFFLOAD", value)
    vllm = Vllm(patched)
    with pytest.raises(ValueError, match="GLM53_KV_OFFLOAD=.*must be 0 or 1"):
        store_step(vllm)


def test_restore_one_fails_the_boot(patched, knob_on, monkeypatch):
    monkeypatch.setenv("GLM53_KV_OFFLOAD_RESTORE", "1")
    with pytest.raises(ValueError, match="RESTORE=1 is refused"):
        store_step(Vllm(patched))


def test_model_identity_forks_the_namespace(patched, tmp_path):
    """KV computed by other weights, quantization or config overrides has
    the same layout, so only the fence keeps it from being restored."""
    import importlib

    vw = importlib.import_module(f"{OFFLOADING}.kv_store_local.vllm_worker")
    fmt = importlib.import_module(f"{OFFLOADING}.kv_store_format")
    weights = tmp_path / "model"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"w" * 10)
    (weights / "README.md").write_text("not weights")

    def namespace(**change):
        # an object with a default repr: its address must not reach the fence
        config = {"rope_scaling": change.pop("rope", None), "hook": object()}
        mc = {
            "revision": None,
            "quantization": None,
            "dtype": "torch.bfloat16",
            "model": str(weights),
            "hf_config": SimpleNamespace(to_dict=lambda: dict(config)),
        }
        mc.update(change)
        identity = vw.model_identity(
            SimpleNamespace(model_config=SimpleNamespace(**mc))
        )
        fenced = fmt.make_fenced(
            model="m", vllm_version="0.33.0", build_id="", tp_size=1,
            kv_dtype="bfloat16", hash_algorithm="sha256", num_speculative_tokens=0,
            page_sizes={0: 64}, state_abi={}, model_identity=identity,
        )  # fmt: skip
        return fmt.namespace_hash(fenced)

    base = namespace()
    assert namespace() == base  # a restart
    os.utime(weights / "model.safetensors", (1, 1))  # a fresh download
    (weights / "README.md").write_text("edited")
    assert namespace() == base
    forks = [
        namespace(quantization="fp8"),
        namespace(revision="abc123"),
        namespace(dtype="torch.float16"),
        namespace(rope={"type": "yarn", "factor": 4.0}),
    ]
    (weights / "model.safetensors").write_bytes(b"w" * 11)  # other weights
    forks.append(namespace())
    assert len({base, *forks}) == 1 + len(forks)
    assert vw.model_identity(SimpleNamespace()) == {}  # nothing to read: no key


# --------------------------------------------------------------------------
# Knob on: scheduler side


def test_store_only_asks_the_cpu_tier_as_upstream_does(patched, knob_on):
    """Knob 1 without restore keeps vLLM's own CPU-tier lookup (issue 48: it used to
    answer no hits without asking, a slower engine than the tier off); the empty tier
    has none."""
    vllm = Vllm(patched)
    step = store_step(vllm)
    assert step.hits == (0, False)
    assert step.spec.manager.lookups > 0
    assert writer_loaded()


def test_scheduler_attaches_metadata_aligned_with_block_order(patched, knob_on):
    vllm = Vllm(patched)
    step = store_step(vllm)
    jobs = [step.meta.store_jobs[j] for j in sorted(step.meta.store_jobs)]
    assert len(jobs) == 2
    stored = step.spec.manager.stored  # prepare_store's keys, in its order
    for job, keys in zip(jobs, stored, strict=True):
        meta = job.kv_store_meta
        assert meta["version"] == 1
        # One key per CPU chunk, in the chunk order of the dst spec.
        assert meta["keys"] == keys
        assert len(meta["keys"]) == len(job.dst_spec.block_ids)
        assert meta["groups"] == [vllm.base.get_offload_group_idx(k) for k in keys]
        back = pickle.loads(pickle.dumps(job))
        assert back.kv_store_meta == meta
    boundary, chunks = jobs
    assert boundary.kv_store_meta["groups"] == [3]
    assert boundary.kv_store_meta["tokens"] == [2 * BLOCK]
    (candidate,) = boundary.kv_store_meta["candidates"]
    assert candidate["boundary"] == 2 * BLOCK
    assert candidate["full"] == [0] and candidate["state"] == [2, 3, 4, 5]
    hashes = step.request.block_hashes
    per_chunk = BLOCK // HASH
    assert candidate["chain"] == [hashes[per_chunk - 1], hashes[2 * per_chunk - 1]]
    assert chunks.kv_store_meta["groups"] == [0, 0, 0, 0]
    assert chunks.kv_store_meta["tokens"] == [BLOCK, 2 * BLOCK, 3 * BLOCK, 4 * BLOCK]
    assert chunks.kv_store_meta["candidates"] == []  # state groups name boundaries


# --------------------------------------------------------------------------
# Knob on: worker side


ROW = 64 << 10  # one staging row: the full-attention page (32 KiB) + room


def worker_with_store(vllm: Vllm, monkeypatch):
    rig = StoreRig(vllm, rows=8, row_bytes=ROW)
    assert rig.store.active, rig.store.disabled_reason
    return SimpleNamespace(
        worker=rig.worker,
        fake=rig.gpu,
        store=rig.store,
        region=rig.region,
        spec=rig.spec,
    )


def full_chunk_job(vllm: Vllm, env, chunk: int, fill: int):
    key = (chunk + 1).to_bytes(4, "big") * 8 + (0).to_bytes(4, "big")
    page = 2 * BLOCK * 2 * 16 * 2
    env.region[chunk * ROW : chunk * ROW + page] = bytes([fill]) * page
    job = vllm.common.TransferJob(
        req_id="r0",
        src_spec=vllm.base.GPULoadStoreSpec(
            [chunk + 10], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]
        ),
        dst_spec=vllm.cpu.CPULoadStoreSpec([chunk]),
    )
    job.kv_store_meta = {
        "version": 1,
        "keys": [key],
        "groups": [0],
        "tokens": [BLOCK],
        "candidates": [],
    }
    return job, key, page


def test_worker_captures_before_this_rank_acks(patched, knob_on, monkeypatch):
    vllm = Vllm(patched)
    env = worker_with_store(vllm, monkeypatch)
    job, key, page = full_chunk_job(vllm, env, 1, 0x5A)
    metadata = vllm.common.OffloadingConnectorMetadata(
        load_jobs={}, store_jobs={7: job}
    )
    env.worker.prepare_store_kv(metadata)
    env.worker.start_kv_transfers(
        vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
    )
    assert env.fake.submitted == [7]
    order = []
    meta = env.worker._connector_worker_meta
    real_mark = meta.mark_completed

    def mark(job_id):
        order.append(("ack", job_id, env.store.stats.jobs_captured))
        real_mark(job_id)

    meta.mark_completed = mark
    env.fake.done = [7]
    assert env.worker.get_finished(set()) == (set(), set())
    assert order == [("ack", 7, 1)]  # captured before the ack, ack not deferred
    assert env.worker.build_connector_worker_meta().completed_jobs == {7: 1}
    env.region[ROW : 2 * ROW] = bytes(ROW)  # the row is reused after the ack
    assert env.store.writer.wait_idle()
    path = env.store.writer.layout.chunk(key[:-4].hex(), 0)
    with open(path, "rb") as f:
        data = f.read()
    assert data.endswith(bytes([0x5A]) * page)
    env.worker.shutdown()


def test_flush_path_captures_right_after_the_wait(patched, knob_on, monkeypatch):
    vllm = Vllm(patched)
    env = worker_with_store(vllm, monkeypatch)
    job, key, page = full_chunk_job(vllm, env, 2, 0xA5)
    metadata = vllm.common.OffloadingConnectorMetadata(
        load_jobs={}, store_jobs={9: job}, jobs_to_flush={9}
    )
    env.worker.handle_preemptions(metadata)
    assert env.fake.waited == [{9}]
    assert env.store.stats.jobs_captured == 1
    env.region[2 * ROW : 3 * ROW] = bytes(ROW)  # a reset hands the row on
    env.fake.done = [9]
    env.worker.get_finished(set())  # reported later: acked, not captured twice
    assert env.store.stats.jobs_captured == 1
    assert env.store.writer.wait_idle()
    with open(env.store.writer.layout.chunk(key[:-4].hex(), 0), "rb") as f:
        assert f.read().endswith(bytes([0xA5]) * page)
    env.worker.shutdown()
    assert not env.store.writer._thread.is_alive()


def test_shutdown_captures_the_store_job_vllm_deferred(patched, knob_on, monkeypatch):
    """Issue 29: vLLM submits a step's store jobs at the start of the next
    step, which an engine that stops stepping (the offline LLM, once no
    request is unfinished) never takes. The shutdown hook submits the job,
    waits for its copy and captures it before the writer stops."""
    vllm = Vllm(patched)
    env = worker_with_store(vllm, monkeypatch)
    job, key, page = full_chunk_job(vllm, env, 1, 0x3C)
    env.worker.prepare_store_kv(
        vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={7: job})
    )
    assert env.fake.submitted == []  # deferred to a next step

    def wait(job_ids):  # the copy completes while it is waited for
        env.fake.waited.append(set(job_ids))
        env.fake.done += [j for j in env.fake.submitted if j in job_ids]

    monkeypatch.setattr(env.fake, "wait", wait)
    env.worker.shutdown()
    assert env.fake.submitted == [7] and env.fake.waited == [{7}]
    assert env.store.stats.jobs_drained == 1
    assert not env.store.writer._thread.is_alive()
    with open(env.store.writer.layout.chunk(key[:-4].hex(), 0), "rb") as f:
        assert f.read().endswith(bytes([0x3C]) * page)


def test_worker_queues_the_capture_on_the_device_right_after_the_submit(
    patched, knob_on
):
    """The CUDA path, with a host device standing in: the capture is queued
    when vLLM submits the store copy, from the job's GPU block, and neither
    staging nor the block is read after; the ack follows, not deferred."""
    vllm = Vllm(patched)
    devices = importlib.import_module(f"{OFFLOADING}.kv_store_local.capture_device")
    order = []

    class Device(devices.HostCopy):
        def queue(self, job_id, moves):
            order.append(("queued", job_id, list(env.fake.submitted)))
            return super().queue(job_id, moves)

    rig = StoreRig(vllm, rows=8, row_bytes=ROW, device=Device(), gpu_blocks=32)
    env = SimpleNamespace(worker=rig.worker, fake=rig.gpu, store=rig.store)
    assert rig.store.active, rig.store.disabled_reason
    job, key, page = full_chunk_job(vllm, rig, 1, 0x00)
    rig.kv[11 * ROW : 11 * ROW + page] = bytes([0x3C]) * page  # GPU block 11
    env.worker.prepare_store_kv(
        vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={7: job})
    )
    env.worker.start_kv_transfers(
        vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
    )
    assert order == [("queued", 7, [7])]  # right after vLLM's submit of job 7
    meta = env.worker._connector_worker_meta
    real_mark = meta.mark_completed
    meta.mark_completed = lambda job_id: (
        order.append(("ack", job_id, env.store.stats.jobs_captured)),
        real_mark(job_id),
    )
    env.fake.done = [7]
    env.worker.get_finished(set())
    assert order[1:] == [("ack", 7, 1)]
    rig.kv[:] = bytes(len(rig.kv))  # after the ack vLLM reuses the block
    rig.region[:] = bytes(len(rig.region))  # and the row
    assert env.store.writer.wait_idle()
    with open(env.store.writer.layout.chunk(key[:-4].hex(), 0), "rb") as f:
        assert f.read().endswith(bytes([0x3C]) * page)
    assert env.store.stats.jobs_queued_on_device == 1
    env.worker.shutdown()


def test_shutdown_writes_a_job_queued_on_the_device_that_vllm_never_reported(
    patched, knob_on
):
    """Issue 29, seen on the H200 (ttft.llama8b.write: 768 keys captured, never
    written, the last 12,288 tokens of a 127k prompt missing after a restart):
    the offline engine stops stepping once the last request finished, so vLLM
    never reports its last submitted store job, whose capture was queued on
    the device. The shutdown waits for that job too and writes it."""
    vllm = Vllm(patched)
    devices = importlib.import_module(f"{OFFLOADING}.kv_store_local.capture_device")
    rig = StoreRig(
        vllm, rows=8, row_bytes=ROW, device=devices.HostCopy(), gpu_blocks=32
    )
    env = SimpleNamespace(worker=rig.worker, fake=rig.gpu, store=rig.store)
    assert rig.store.active, rig.store.disabled_reason
    job, key, page = full_chunk_job(vllm, rig, 1, 0x00)
    rig.kv[11 * ROW : 11 * ROW + page] = bytes([0x5A]) * page  # GPU block 11
    env.worker.prepare_store_kv(
        vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={7: job})
    )
    env.worker.start_kv_transfers(
        vllm.common.OffloadingConnectorMetadata(load_jobs={}, store_jobs={})
    )
    assert env.store.stats.jobs_queued_on_device == 1
    real_wait = env.fake.wait

    def wait(job_ids):  # the copy completes while it is waited for
        real_wait(job_ids)
        env.fake.done += [j for j in env.fake.submitted if j in job_ids]

    env.fake.wait = wait
    env.worker.shutdown()  # no get_finished before: the engine stopped stepping
    assert env.fake.waited == [{7}]
    assert env.store.stats.jobs_drained == 1
    with open(env.store.writer.layout.chunk(key[:-4].hex(), 0), "rb") as f:
        assert f.read().endswith(bytes([0x5A]) * page)


def test_flush_path_waits_for_the_device_capture(patched, knob_on):
    vllm = Vllm(patched)
    devices = importlib.import_module(f"{OFFLOADING}.kv_store_local.capture_device")
    rig = StoreRig(
        vllm, rows=8, row_bytes=ROW, device=devices.HostCopy(True), gpu_blocks=32
    )
    job, key, page = full_chunk_job(vllm, rig, 2, 0x00)
    rig.kv[12 * ROW : 12 * ROW + page] = bytes([0xC3]) * page
    rig.worker.handle_preemptions(
        vllm.common.OffloadingConnectorMetadata(
            load_jobs={}, store_jobs={9: job}, jobs_to_flush={9}
        )
    )
    assert rig.gpu.waited == [{9}]
    assert rig.store.stats.jobs_captured == 1  # handed over right after the wait
    rig.kv[:] = bytes(len(rig.kv))
    rig.region[:] = bytes(len(rig.region))
    rig.gpu.done = [9]
    rig.worker.get_finished(set())  # reported later: acked, not captured twice
    assert rig.store.stats.jobs_captured == 1
    assert rig.store.writer.wait_idle()
    with open(rig.store.writer.layout.chunk(key[:-4].hex(), 0), "rb") as f:
        assert f.read().endswith(bytes([0xC3]) * page)
    rig.worker.shutdown()


# --------------------------------------------------------------------------
# The seed's mamba alignment case: 3584-token blocks, hashes every 64 tokens


def test_mamba_alignment_3584_on_the_real_scheduler(patched, knob_on):
    """GLM-style sizes: every group at 3584 tokens a block (56 hashes of 64).

    The real scheduler resolves the mamba alignment to 3584 tokens; the
    side channel puts the state key at token 3584 and names the boundary's
    chain by the hash at token 3584 (index 55), the full-attention chunk's."""
    block, unit = 3584, 64
    vllm = HybridVllm(
        patched,
        block=block,
        hash_unit=unit,
        num_blocks=16,
        max_model_len=4 * block,
        model="test/hybrid-7g",
    )
    kv_cache_config = vllm.hybrid_layout()
    vllm_config = vllm.vllm_config()
    spec = make_spec(vllm, vllm.offloading_config(vllm_config, kv_cache_config))
    config = vllm.scheduler.SchedulerOffloadConfig.from_spec(
        spec, vllm_config, kv_cache_config
    )
    assert config.alignment_tokens == block
    assert config.tokens_per_hash == unit
    scheduler = vllm.scheduler.OffloadingConnectorScheduler(
        spec, vllm_config, kv_cache_config
    )
    hashes = [i.to_bytes(4, "big") * 8 for i in range(2 * block // unit)]
    request = vllm.request("r0", hashes, 2 * block)
    scheduler.on_new_request(request)
    assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)
    block_ids = tuple([100 * g + b + 1 for b in range(2)] for g in range(7))
    handoffs = {"r0": [(g, 9000 + g, block) for g in STATE_GROUPS]}
    meta = scheduler.build_connector_meta(
        scheduler_output(request, block_ids, handoffs)
    )
    metas = [job.kv_store_meta for job in meta.store_jobs.values()]
    full = [m for m in metas if m["groups"][0] == 0]
    state = [m for m in metas if m["groups"][0] != 0]
    assert [m["tokens"] for m in full] == [[block, 2 * block]]
    assert sorted(m["groups"][0] for m in state) == list(STATE_GROUPS)
    for m in state:
        assert m["tokens"] == [block]
        assert m["keys"][0][:-4] == hashes[block // unit - 1]
        (candidate,) = m["candidates"]
        assert candidate["boundary"] == block
        assert candidate["chunk_tokens"] == block
        assert candidate["chain"] == [hashes[block // unit - 1]]


def test_headers_name_layers_by_the_model_layer_index(patched, knob_on, monkeypatch):
    """layer_index is the model's (from the layer name), not the position in
    the group: g3's only layer is model.layers.3, position 0."""
    vllm = Vllm(patched)
    env = worker_with_store(vllm, monkeypatch)
    groups = {g.group: g for g in env.store.settings.groups}
    assert {g: [layer.index for layer in groups[g].layers] for g in groups} == {
        0: [0],
        2: [2],
        3: [3],
        4: [4],
        5: [5],
    }
    assert [s.layer for s in groups[3].segments(1)] == [3, 3]  # conv, temporal
    env.worker.shutdown()


def test_capture_budget_is_the_knob(patched, knob_on, monkeypatch):
    monkeypatch.setenv("GLM53_KV_OFFLOAD_CAPTURE_MIB", "16")
    env = worker_with_store(Vllm(patched), monkeypatch)
    assert env.store.writer.pool.capacity == 16 << 20
    env.worker.shutdown()
    monkeypatch.setenv("GLM53_KV_OFFLOAD_CAPTURE_MIB", "8")  # below the floor
    with pytest.raises(ValueError, match="CAPTURE_MIB=8: must be an integer 16.."):
        worker_with_store(Vllm(patched), monkeypatch)


class FakeView:
    """A state tensor's geometry as vLLM's mamba views have it (the block
    dimension first), for register_kv_caches' hook."""

    def __init__(self, address, shape, stride):
        self.address, self.shape, self._stride = address, shape, stride

    def data_ptr(self):
        return self.address

    def stride(self):
        return self._stride


def state_views(transposed: bool = False):
    # The harness MambaSpec: conv (2, 8) bf16 = 32 bytes, temporal (4, 16) f32.
    conv_stride = (1, 2) if transposed else (8, 1)
    return [
        FakeView(4096, (64, 2, 8), (1024, *conv_stride)),
        FakeView(4096 + 32, (64, 4, 16), (256, 16, 1)),
    ]


@pytest.mark.parametrize("transposed", [False, True])
def test_state_strides_come_from_the_registered_views(
    patched, knob_on, monkeypatch, transposed
):
    vllm = Vllm(patched)
    kv_cache_config = vllm.layout()
    vllm_config = vllm.vllm_config()
    spec = vllm.spec(vllm_config, kv_cache_config)
    worker = vllm.worker.OffloadingConnectorWorker(spec, vllm_config, kv_cache_config)
    store = worker._kv_store
    store.note_kv_caches(
        {f"model.layers.{g}.mixer": state_views(transposed) for g in STATE_GROUPS}
    )
    if transposed:
        assert "not the dense layout" in store.settings.unsupported
        return
    assert store.settings.unsupported is None
    groups = {g.group: g for g in store.settings.groups}
    (layer,) = groups[3].layers
    assert [p.stride for p in layer.state] == [(8, 1), (16, 1)]


def test_state_strides_come_from_the_layers_views_behind_a_raw_page_view(
    patched, knob_on, monkeypatch
):
    # vLLM 0.33.0 registers one raw [B, 1, 1, C] int8 page view per state layer with
    # the connector; the layer's bind_kv_cache unpacked it into its state views. On the
    # H200 the writer read the raw view and disabled itself ("state part 0: shape
    # (1, 1, 1024), spec (2, 256)", LFM2, docs/ENGINE-RUNS.md run 4).
    vllm = Vllm(patched)
    kv_cache_config = vllm.layout()
    vllm_config = vllm.vllm_config()
    spec = vllm.spec(vllm_config, kv_cache_config)
    worker = vllm.worker.OffloadingConnectorWorker(spec, vllm_config, kv_cache_config)
    store = worker._kv_store
    names = [f"model.layers.{g}.mixer" for g in STATE_GROUPS]
    raw = {n: FakeView(4096, (64, 1, 1, 1024), (1024, 1024, 1024, 1)) for n in names}
    config = patched.load("vllm.config")
    context = {n: SimpleNamespace(kv_cache=tuple(state_views())) for n in names}
    monkeypatch.setattr(
        config,
        "_current",
        SimpleNamespace(
            compilation_config=SimpleNamespace(static_forward_context=context)
        ),
    )
    store.note_kv_caches(raw)
    assert store.settings.unsupported is None
    groups = {g.group: g for g in store.settings.groups}
    (layer,) = groups[3].layers
    assert [p.stride for p in layer.state] == [(8, 1), (16, 1)]


def test_a_raw_page_view_without_a_vllm_config_disables_the_writer(patched, knob_on):
    vllm = Vllm(patched)
    kv_cache_config = vllm.layout()
    vllm_config = vllm.vllm_config()
    spec = vllm.spec(vllm_config, kv_cache_config)
    worker = vllm.worker.OffloadingConnectorWorker(spec, vllm_config, kv_cache_config)
    store = worker._kv_store
    store.note_kv_caches(
        {
            f"model.layers.{g}.mixer": FakeView(
                4096, (64, 1, 1, 1024), (1024,) * 3 + (1,)
            )
            for g in STATE_GROUPS
        }
    )
    assert "no vLLM config to find its state views" in store.settings.unsupported
