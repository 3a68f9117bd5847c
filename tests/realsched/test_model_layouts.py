"""Issue 31 on CPU: the KV-cache layouts vLLM 0.33.0 builds for the suite's GLM-5.3 (glm5next),
Qwen3-Next and DeepSeek-V2-Lite configs (engine/models), from the models' own layers, and the
store jobs the real Scheduler plans for them: pristine, and patched at knob 0 and knob 1; then
the worker side at knob 1 (every chunk equals its block) and with restore on (a restart
restores blocks equal to the stored ones; a corrupted state chunk is refused and recomputed).
The worker side binds the caches as the GPU runner does: at glm5wide's 4,608-token blocks the
indexer keys in 512-token kernel blocks (issue 44), which the GPU suite's checks read back by
manager block.

Each boot runs model_layout.py in its own process (it sets up torch.distributed and builds the
model on the meta device), forked by a layout_server.py that imported vLLM once: one server
with no path added for pristine boots, one with this session's patched tree first on
PYTHONPATH for patched boots.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import real_release
import realsched

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# Every boot is a process that builds a model (a few seconds once its server imported vLLM);
# the module starts the boots its selected tests need two at a time (the CI machine has two
# cores) and each test waits for its own. "{tier}" in a knob is the boot's own folder.
TIER_DIR = "{tier}"
BOOT_TIMEOUT_S = 600
Key = tuple[str, bool, tuple[tuple[str, str], ...], tuple[str, ...]]
_pool = ThreadPoolExecutor(2, thread_name_prefix="model-layout")
_boots: dict[Key, Future] = {}
_state: dict[str, Path] = {}


def _key(model: str, patched: bool, knobs: dict[str, str], args=()) -> Key:
    return (model, patched, tuple(sorted(knobs.items())), tuple(args))


class _Server:
    """A layout_server.py process for one tree (pristine or patched): it imported vLLM
    once and forks each boot from there."""

    def __init__(self, patched: bool, base: Path):
        env = {k: v for k, v in os.environ.items() if not k.startswith("GLM53_")}
        env.pop("PYTHONPATH", None)
        path = real_release.subprocess_path(*([str(_state["tree"])] if patched else []))
        if path:
            env["PYTHONPATH"] = path
        self.log = base / f"server-{'patched' if patched else 'pristine'}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "layout_server.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                cwd=str(REPO),
            )
        self.lock = threading.Lock()
        self.ready = False

    def submit(self, args: tuple[str, ...], env: dict[str, str], out: Path) -> None:
        with self.lock:
            if not self.ready:
                if self.proc.stdout.readline().strip() != "ready":
                    self.proc.wait(timeout=60)
                    raise AssertionError(
                        f"layout_server.py exited {self.proc.returncode}:\n"
                        + self.log.read_text()[-4000:]
                    )
                self.ready = True
            request = {"args": list(args), "env": env, "dir": str(out)}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


_servers: dict[bool, _Server] = {}
_servers_lock = threading.Lock()


def _server(patched: bool) -> _Server:
    with _servers_lock:
        if patched not in _servers:
            _servers[patched] = _Server(patched, _state["base"])
        return _servers[patched]


def _boot(key: Key, number: int) -> dict:
    model, patched, knobs, args = key
    out = _state["base"] / f"boot{number}"
    out.mkdir()
    tier = out / "tier"
    env = {k: v.replace(TIER_DIR, str(tier)) for k, v in knobs}
    _server(patched).submit((model, *args), env, out)
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while not (out / "rc").exists():
        if time.monotonic() > deadline:
            if (out / "pid").exists():
                os.kill(int((out / "pid").read_text()), signal.SIGKILL)
            raise AssertionError(
                f"{model}: model_layout.py ran over {BOOT_TIMEOUT_S} s"
            )
        time.sleep(0.1)
    rc = int((out / "rc").read_text())
    stdout, stderr = (out / "stdout").read_text(), (out / "stderr").read_text()
    if rc != 0:
        raise AssertionError(f"{model}: model_layout.py exited {rc}:\n{stderr[-4000:]}")
    result = json.loads(stdout.splitlines()[-1])
    result["log"] = stdout + stderr
    return result


@pytest.fixture(scope="module", autouse=True)
def no_boot_leaves_a_region():
    """Once every boot of the module ended, no CPU-tier region any of them made is
    left in /dev/shm (each test's own check excuses a boot still running)."""
    before = realsched.offload_regions()
    yield
    for boot in list(_boots.values()):
        boot.exception()  # waits; a failed boot already failed its test
    left = realsched.offload_regions() - before
    assert not left, f"left in /dev/shm by a model_layout.py boot: {sorted(left)}"


def _start(key: Key) -> Future:
    if key not in _boots:
        _boots[key] = _pool.submit(_boot, key, len(_boots))
    return _boots[key]


def layout(
    model: str, patched: bool, knobs: dict[str, str], args: tuple[str, ...] = ()
) -> dict:
    return _start(_key(model, patched, knobs, args)).result()


def tier_on(restore: bool = False) -> dict[str, str]:
    return {
        "GLM53_KV_OFFLOAD": "1",
        "GLM53_KV_OFFLOAD_DIR": TIER_DIR,
        "GLM53_KV_OFFLOAD_CPU_GB": "1",
        **({"GLM53_KV_OFFLOAD_RESTORE": "1"} if restore else {}),
    }


def kinds(out: dict) -> list[str]:
    return [g["type"] for g in out["groups"]]


def test_glm5next_is_four_kda_groups_an_mla_indexer_group_and_the_tail_ring():
    """The real layer classes give the layout the tier was designed for (less the MTP
    drafter, which this config does not load): the KDA conv + temporal state in four
    groups, MLA and the kpool indexer's compressed keys (16 tokens a state) sharing one
    block table, and the kpool tail ring, a CircularBufferSpec of 16-token blocks. The
    stock OffloadingConnector boots and leaves the ring out."""
    out = layout("glm5next", False, {})
    assert "error" not in out, out.get("error")
    assert out["block_size"] == 512  # the MLA page aligned to the KDA state page
    assert out["layout"] == "BLHNC"  # block-outermost: the groups are packed
    assert kinds(out) == ["MambaSpec"] * 4 + ["MLAAttentionSpec", "CircularBufferSpec"]
    kda = [len(g["layers"]) for g in out["groups"][:4]]
    assert sorted(kda) == [1, 2, 2, 2]  # seven KDA layers
    mla, ring = out["groups"][4], out["groups"][5]
    assert sorted(n.rsplit(".", 1)[-1] for n in mla["layers"]) == [
        "attn", "attn", "k_cache", "k_cache"
    ]  # fmt: skip
    assert mla["tokens_per_state"] == 16 and mla["cache_role"] == "indexer"
    assert ring["block_size"] == 16
    assert all(n.endswith("indexer.tail_cache") for n in ring["layers"])
    assert out["offloaded_groups"] == [0, 1, 2, 3, 4]
    assert out["finished"] == ["r"]


@pytest.mark.parametrize("knob", ["0", "1"])
def test_glm5next_patched_plans_the_stores_pristine_plans(knob):
    pristine = layout("glm5next", False, {})
    env = tier_on() if knob == "1" else {"GLM53_KV_OFFLOAD": "0"}
    patched = layout("glm5next", True, env)
    assert "error" not in patched, patched.get("error")
    for field in ("block_size", "layout", "groups", "offloaded_groups"):
        assert patched[field] == pristine[field], field
    assert patched["store_keys_by_group"] == pristine["store_keys_by_group"]
    if knob == "1":
        # The scope overlay's boot line: every group but the ring.
        assert "KV offloading eligible groups: [0, 1, 2, 3, 4] of 6" in patched["log"]


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        # Gated DeltaNet state in three groups beside full attention.
        ("qwen3next", ["MambaSpec"] * 3 + ["FullAttentionSpec"]),
        ("dsv2lite", ["MLAAttentionSpec"]),  # MLA, one group
    ],
)
def test_the_relatives_patched_at_knob_1_plan_the_stores_pristine_plans(
    model, expected
):
    pristine = layout(model, False, {})
    assert "error" not in pristine, pristine.get("error")
    assert kinds(pristine) == expected
    assert pristine["offloaded_groups"] == list(range(len(expected)))
    patched = layout(model, True, tier_on())
    assert "error" not in patched, patched.get("error")
    for field in ("block_size", "groups", "offloaded_groups", "store_keys_by_group"):
        assert patched[field] == pristine[field], field


def test_the_glm5next_stage_asks_for_a_backend_that_serves_its_sparse_mla():
    """GLM-5.3's attention is sparse MLA with a 512-wide NoPE head: on an H200 (SM90)
    vLLM refuses TRITON_MLA for it (the stage asked for it until this test) and takes
    FLASHMLA_SPARSE, which engine/suite_models.py now names."""
    import torch
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend

    sys.path.insert(0, str(REPO / "engine"))
    from suite_models import NEW_MODELS

    def reasons(backend) -> list[str]:
        return backend.validate_configuration(
            head_size=512, dtype=torch.bfloat16, kv_cache_dtype="auto",
            block_size=512, use_mla=True, has_sink=False, use_sparse=True,
            use_mm_prefix=False, use_per_head_quant_scales=False,
            device_capability=DeviceCapability(9, 0), attn_type="decoder",
        )  # fmt: skip

    realsched.use_cpu_platform()
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):  # no model: the NoPE check is skipped
        assert "sparse not supported" in reasons(TritonMLABackend)
        assert reasons(FlashMLASparseBackend) == []
    args = NEW_MODELS["glm5next"]
    assert args[args.index("--attention-backend") + 1] == "FLASHMLA_SPARSE"


def test_glm5next_every_stored_chunk_equals_its_block():
    """The worker side at knob 1 on the real layout: vLLM allocates the packed caches, the
    real worker-role connector registers them, the writer binds every eligible group, and
    each chunk on disk holds exactly its block's bytes (the GPU suite's own comparison,
    engine/probe.py): MLA with the indexer's states, and each KDA layer's conv and
    temporal state."""
    out = layout(
        "glm5next",
        True,
        tier_on(),
        ("--store", "2100", "--num-blocks", "24"),
    )
    assert "error" not in out, out.get("error")
    store = out["store"]
    writer, compare = store["writer"], store["compare"]
    print(json.dumps(store, indent=1)[:3000])
    assert writer["active"], writer["disabled"]
    assert writer["writer_groups"] == [0, 1, 2, 3, 4]
    counts = compare["compare"]
    assert counts["keys"] > 0 and counts["equal"] == counts["keys"], compare
    assert set(compare["equal_per_group"]) == {"0", "1", "2", "3", "4"}
    # Bound as the GPU runner binds it (worker_side: vLLM's init_attn_backend and
    # init_kv_cache): at 512-token blocks the indexer's own kernel sizes (index_kpool
    # 16 x paged-MQA pages of 32 or 64) take the manager block, so no group is split
    # (glm5wide's 4,608-token blocks are: test_glm5wide_every_stored_chunk_...).
    binding = store["binding"]
    assert binding["backends"][4] == ["DEEPSEEK_V32_INDEXER", "FLASHMLA_SPARSE"]
    assert binding["kernel_block_sizes"] == binding["manager_block_sizes"]
    assert binding["split"] == [] and store["mapped"] == []


def kvstore_verify(root: str) -> subprocess.CompletedProcess:
    build = Path(os.environ.get("KVTIER_BUILD_DIR", REPO / "build"))
    return subprocess.run(
        [str(build / "kvstore" / "kvstore"), "verify", root],
        capture_output=True,
        text=True,
    )


# A 2,100-token prompt in 512-token blocks: four full blocks a prefix hit can cover.
RESTORE_ARGS = ("--restore", "2100", "--num-blocks", "24")


def test_glm5next_restores_after_a_restart_the_blocks_it_stored():
    """Knob 1 with restore on, the real layout on both sides: engine 1 stores the prompt,
    a restarted engine 2 (other bytes in its caches) restores it from disk through the
    real scheduler, the restore tier's promotion into CPU rows and vLLM's load job; each
    block it loaded holds engine 1's bytes at that position (the GPU suite's digests):
    the MLA + indexer pages of four blocks and each KDA group's state at the boundary."""
    out = layout("glm5next", True, tier_on(True), RESTORE_ARGS)
    assert "error" not in out, out.get("error")
    r = out["restore"]
    print(json.dumps(r, indent=1))
    assert r["computed_a"] == 2100
    assert r["loaded"] == {"0": [3], "1": [3], "2": [3], "3": [3], "4": [0, 1, 2, 3]}
    assert_restored(out)


def assert_restored(out: dict, prompt: int = 2100) -> None:
    """Every offloaded group loaded: an attention group its first k blocks, a state group
    its state at block k; each loaded block equal to engine 1's; only the tokens after the
    boundary computed; the store clean."""
    r = out["restore"]
    assert r["failures"] == {} and r["computed_a"] == prompt
    block = out["block_size"]
    hit = max(len(p) for p in r["loaded"].values())
    assert hit >= 1
    for group in out["offloaded_groups"]:
        state = out["groups"][group]["type"] == "MambaSpec"
        want = [hit - 1] if state else list(range(hit))
        assert r["loaded"].get(str(group)) == want, (group, r["loaded"])
    assert r["differ"] == []
    assert r["equal"] == sum(len(p) for p in r["loaded"].values())
    assert r["computed_b"] == prompt - hit * block  # only the tail after the boundary
    done = kvstore_verify(r["root"])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("model", "blocks"), [("qwen3next", "40"), ("dsv2lite", "400")]
)
def test_the_relatives_restore_after_a_restart_the_blocks_they_stored(model, blocks):
    """The same restart and verdict on Qwen3-Next's layout (gated DeltaNet state beside
    attention, not packed) and DeepSeek-V2-Lite's (MLA alone)."""
    args = ("--restore", "2100", "--num-blocks", blocks)
    out = layout(model, True, tier_on(True), args)
    assert "error" not in out, out.get("error")
    print(json.dumps(out["restore"], indent=1))
    assert_restored(out)


def test_glm5next_refuses_a_corrupted_kda_chunk_and_recomputes():
    """One flipped byte in the KDA state chunk the restore needs: the promotion refuses
    the job before any byte reaches a GPU block, the request recomputes the whole
    prompt, and the writer stores the refused key again, so the store verifies clean."""
    args = (*RESTORE_ARGS, "--corrupt")
    out = layout("glm5next", True, tier_on(True), args)
    assert "error" not in out, out.get("error")
    r = out["restore"]
    print(json.dumps(r, indent=1))
    assert r["corrupted"]["group"] in (0, 1, 2, 3)  # a KDA state group
    assert r["loaded"] == {} and r["keys_restored"] == 0
    assert r["computed_b"] == 2100
    assert r["failures"] == {"payload_checksum_mismatch": 1}
    done = kvstore_verify(r["root"])
    assert done.returncode == 0, done.stdout + done.stderr


def test_glm5next_with_its_mtp_drafter_keeps_the_drafter_in_the_mla_group():
    """GLM-5.3 as the seed deployment runs it, with the MTP drafter (one speculative
    token; vLLM's Glm5NextMTPModel, built as the proposer loads it): the drafter layer's
    MLA and indexer caches join the target's MLA group (an EAGLE group, no group of its
    own), its tail ring joins the ring group, whose block grows to 32. The stock and the
    patched connector offload the same groups and plan the same stores."""
    pristine = layout("glm5next", False, {}, ("--mtp",))
    assert "error" not in pristine, pristine.get("error")
    assert kinds(pristine) == ["MambaSpec"] * 3 + [
        "MLAAttentionSpec",
        "CircularBufferSpec",
    ]
    mla, ring = pristine["groups"][3], pristine["groups"][4]
    assert "model.layers.9.self_attn.attn" in mla["layers"]  # the MTP layer
    assert "model.layers.9.self_attn.indexer.tail_cache" in ring["layers"]
    assert ring["block_size"] == 32
    assert pristine["offloaded_groups"] == [0, 1, 2, 3]
    patched = layout("glm5next", True, tier_on(), ("--mtp",))
    assert "error" not in patched, patched.get("error")
    for field in ("block_size", "groups", "offloaded_groups", "store_keys_by_group"):
        assert patched[field] == pristine[field], field
    assert "KV offloading eligible groups: [0, 1, 2, 3] of 5" in patched["log"]


def test_glm5next_with_its_mtp_drafter_restores_after_a_restart():
    """Without lookahead hashes (0.33.0), with the drafter in the MLA group vLLM stores the KDA state one chunk before the
    prompt's last full chunk (1,536 of 2,048 tokens) and its lookup asks for the chunk
    after a hit before it drops it. The writer publishes the state boundary and a
    manifest of the MLA chunks alone at 2,048 that proves that chunk; without the second
    one no restore ever hit (every request recomputed). The restart restores 1,536
    tokens, each loaded block equal to engine 1's."""
    out = layout("glm5next", True, tier_on(True), ("--mtp", *RESTORE_ARGS))
    assert "error" not in out, out.get("error")
    r = out["restore"]
    print(json.dumps(r, indent=1))
    if out["lookahead"]:
        # 0.34.0 hashes each block with the drafter's next token: vLLM stores the state at
        # the last full chunk itself, no drafter manifest is needed, the restart restores
        # all 2,048 tokens.
        assert r["manifests"] == [[2048, [0, 1, 2]]]
        assert r["loaded"] == {"0": [3], "1": [3], "2": [3], "3": [0, 1, 2, 3]}
    else:
        assert r["manifests"] == [[1536, [0, 1, 2]], [2048, []]]
        assert r["loaded"] == {"0": [2], "1": [2], "2": [2], "3": [0, 1, 2]}
    assert_restored(out)


# glm5wide's 4,608-token blocks: a 9,300-token prompt holds two full blocks.
WIDE_PROMPT = 9300
WIDE_ARGS = ("--num-blocks", "8", "--max-model-len", "10240")


def assert_indexer_in_kernel_blocks(part: dict) -> None:
    """glm5wide's worker side bound the MLA group's indexer keys as the GPU runner does:
    vLLM's helpers picked 512-token kernel blocks of the 4,608-token manager block
    (index_kpool 16 x the 32-entry paged-MQA page; 1,024 does not divide 4,608), the
    packed layout put other layers' pages between them (a kernel block stride), and
    engine/probe.py read exactly those layers back by manager block."""
    binding = part["binding"]
    assert binding["manager_block_sizes"][3] == 4608
    (split,) = binding["split"]  # the one attention group bound in kernel blocks
    assert split["group"] == 3 and split["backend"] == "DEEPSEEK_V32_INDEXER"
    assert split["layers"] and all(
        n.endswith("indexer.k_cache") for n in split["layers"]
    )
    assert split["kernel_block_size"] == 512
    # Kernel block j of block b is b * stride + j: the bound view spans the other
    # layers' pages between blocks, so it has far more pages than 9 a block.
    ratio = 4608 // 512
    assert split["kernel_block_stride"] > ratio
    assert split["bound_pages"] == (
        (split["num_blocks"] - 1) * split["kernel_block_stride"] + ratio
    )
    assert part["mapped"] == sorted(split["layers"])


def test_glm5wide_every_stored_chunk_equals_its_manager_block():
    """Knob 1 at GLM-5.3's real widths, bound as on the GPU (the indexer keys in 512-token
    kernel blocks): every chunk the writer stored equals its 4,608-token manager block as
    engine/probe.py reads it back through vLLM's map_kv_cache_to_manager_blocks."""
    out = layout("glm5wide", True, tier_on(), ("--store", str(WIDE_PROMPT), *WIDE_ARGS))
    assert "error" not in out, out.get("error")
    store = out["store"]
    print(json.dumps({k: store[k] for k in ("binding", "mapped")}, indent=1))
    writer, compare = store["writer"], store["compare"]
    assert writer["active"], writer["disabled"]
    assert writer["writer_groups"] == [0, 1, 2, 3]
    counts = compare["compare"]
    assert counts["keys"] > 0 and counts["equal"] == counts["keys"], compare
    # Group 3 is MLA with the indexer keys: its two full blocks each equal.
    assert compare["equal_per_group"] == {"0": 1, "1": 1, "2": 1, "3": 2}
    assert_indexer_in_kernel_blocks(store)


def test_glm5wide_restores_after_a_restart_the_blocks_it_stored():
    """The restart on glm5wide's layout bound in kernel blocks on both engines: engine 2
    restores both 4,608-token blocks of MLA + indexer keys and the KDA state at the
    boundary, each loaded block's KV bytes (read by manager block) equal to engine 1's."""
    args = ("--restore", str(WIDE_PROMPT), *WIDE_ARGS)
    out = layout("glm5wide", True, tier_on(True), args)
    assert "error" not in out, out.get("error")
    r = out["restore"]
    print(json.dumps(r, indent=1))
    assert r["loaded"] == {"0": [1], "1": [1], "2": [1], "3": [0, 1]}
    assert_restored(out, WIDE_PROMPT)
    assert_indexer_in_kernel_blocks(r)


def test_glm5_at_real_width_plans_4608_token_blocks_for_its_ttft_set():
    """engine/models/glm5wide (GLM-5.3's widths: 64 KDA heads of 128, 288 experts; four
    layers, the real 3:1 KDA:MLA pattern): the KDA state page is 4.5 MiB, vLLM aligns the
    MLA page to it with 4,608-token blocks, and the GPU suite's TTFT set judges its
    restores by that chunk (engine/suite_realsize.py TTFT_SETS)."""
    out = layout("glm5wide", False, {})
    assert "error" not in out, out.get("error")
    assert kinds(out) == ["MambaSpec"] * 3 + ["MLAAttentionSpec", "CircularBufferSpec"]
    assert out["block_size"] == 4608
    assert {g["page_size_bytes"] for g in out["groups"][:3]} == {4608 << 10}
    assert out["offloaded_groups"] == [0, 1, 2, 3]
    sys.path.insert(0, str(REPO / "engine"))
    import suite_realsize

    assert suite_realsize.TTFT_SETS["ttft.glm5wide"] == out["block_size"]


def _plan() -> dict[str, list[Key]]:
    """The boots each test asks for (every parametrization), by function name."""
    mtp = ("--mtp",)
    pristine = {m: _key(m, False, {}) for m in ("glm5next", "qwen3next", "dsv2lite")}
    knob1 = {m: _key(m, True, tier_on()) for m in pristine}

    def restore(model: str, args: tuple[str, ...]) -> Key:
        return _key(model, True, tier_on(True), args)

    return {
        "test_glm5_at_real_width_plans_4608_token_blocks_for_its_ttft_set": [
            _key("glm5wide", False, {})
        ],
        "test_glm5wide_every_stored_chunk_equals_its_manager_block": [
            _key("glm5wide", True, tier_on(), ("--store", str(WIDE_PROMPT), *WIDE_ARGS))
        ],
        "test_glm5wide_restores_after_a_restart_the_blocks_it_stored": [
            restore("glm5wide", ("--restore", str(WIDE_PROMPT), *WIDE_ARGS))
        ],
        "test_glm5next_is_four_kda_groups_an_mla_indexer_group_and_the_tail_ring": [
            pristine["glm5next"]
        ],
        "test_glm5next_patched_plans_the_stores_pristine_plans": [
            pristine["glm5next"],
            _key("glm5next", True, {"GLM53_KV_OFFLOAD": "0"}),
            knob1["glm5next"],
        ],
        "test_the_relatives_patched_at_knob_1_plan_the_stores_pristine_plans": [
            pristine["qwen3next"],
            knob1["qwen3next"],
            pristine["dsv2lite"],
            knob1["dsv2lite"],
        ],
        "test_glm5next_every_stored_chunk_equals_its_block": [
            _key("glm5next", True, tier_on(), ("--store", "2100", "--num-blocks", "24"))
        ],
        "test_glm5next_restores_after_a_restart_the_blocks_it_stored": [
            restore("glm5next", RESTORE_ARGS)
        ],
        "test_the_relatives_restore_after_a_restart_the_blocks_they_stored": [
            restore("qwen3next", ("--restore", "2100", "--num-blocks", "40")),
            restore("dsv2lite", ("--restore", "2100", "--num-blocks", "400")),
        ],
        "test_glm5next_refuses_a_corrupted_kda_chunk_and_recomputes": [
            restore("glm5next", (*RESTORE_ARGS, "--corrupt"))
        ],
        "test_glm5next_with_its_mtp_drafter_keeps_the_drafter_in_the_mla_group": [
            _key("glm5next", False, {}, mtp),
            _key("glm5next", True, tier_on(), mtp),
        ],
        "test_glm5next_with_its_mtp_drafter_restores_after_a_restart": [
            restore("glm5next", (*mtp, *RESTORE_ARGS))
        ],
    }


@pytest.fixture(scope="module", autouse=True)
def _boots_two_at_a_time(request, patched_root, tmp_path_factory):
    """Starts every boot the selected tests of this module need, slowest first."""
    _state["tree"] = patched_root
    _state["base"] = tmp_path_factory.mktemp("model-layouts")
    plan = _plan()
    selected = {
        item.originalname
        for item in request.session.items
        if item.module is request.module
    }
    wanted = [k for name in sorted(selected) for k in plan.get(name, [])]
    for key in sorted(dict.fromkeys(wanted), key=lambda k: "--restore" not in k[3]):
        _start(key)
    yield
    print(f"\nmodel-layout boots: {len(_boots)} started, {len(set(wanted))} planned")
    for future in _boots.values():
        future.cancel()
    _pool.shutdown(wait=True)
    for server in _servers.values():
        server.close()
