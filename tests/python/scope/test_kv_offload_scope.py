"""kv-offload-scope: the real 0.33.0 offloading modules, pristine and patched.

The patched tree is made by the real `overlay apply` on a copy of the pinned
tree; the harness then runs its config/scheduler/worker modules in-process.
Each requirement is checked on the patched tree, and where the overlay leaves
upstream alone (superseded edits, unaffected layouts) against pristine too.

Layout vocabulary (GLM-5.3-like, see hybrid_layout): g0 full attention, g1 a
scratch ring (not prefix-cacheable), g2-g5 mamba state groups in "align" mode,
g6 the drafter's attention group.

The scope rules apply only with the disk tier on (GLM53_KV_OFFLOAD=1, set for
every test here unless it says otherwise); with it off the patched tree must
give upstream's own values on every layout (test_tier_off_is_pristine).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass, replace
from types import SimpleNamespace

import harness
import pytest
from fake_offloading import make_spec
from hybrid_layout import HybridVllm, scheduler_output
from trees import patched_copy, run_overlay

OVERLAY = "kv-offload-scope"
OFFLOADING = "vllm.distributed.kv_transfer.kv_connector.v1.offloading"
DRAFTER_ENV = "GLM53_KV_OFFLOAD_DRAFTER"
TIER_ENV = "GLM53_KV_OFFLOAD"
SUPERSEDED = {
    "divisibility-eligible-only",
    "group-config-original-index",
    "offload-keys-original-index",
    "block-ids-original-index",
    "transfer-spec-config-order",
}
BLOCK = 256  # tokens per block of the prefix-cacheable groups
HASH = 64  # tokens per block hash (prefix_match_unit)
NUM_BLOCKS = 64


# --------------------------------------------------------------------------
# Trees


def apply_args(root, manifests, fragments) -> list[str]:
    return [
        "--root",
        str(root),
        "--manifests",
        str(manifests),
        "--fragments",
        str(fragments),
        "--overlays",
        OVERLAY,
    ]


@pytest.fixture(scope="module")
def scope_only(manifests_dir, repo_root, tmp_path_factory) -> list[str]:
    """Manifest folder holding this overlay alone, so these tests do not
    depend on the state of the overlays stacked after it."""
    folder = tmp_path_factory.mktemp("manifests")
    shutil.copy(manifests_dir / f"{OVERLAY}.toml", folder)
    (folder / "ORDER").write_text(f"{OVERLAY}\n")
    return [str(folder), str(repo_root / "overlays")]


@pytest.fixture(scope="module")
def patched_tree(overlay_bin, engine_tree, scope_only, tmp_path_factory):
    manifests, fragments = scope_only
    dst = tmp_path_factory.mktemp("scope")
    return patched_copy(
        overlay_bin, engine_tree, dst, manifests, OVERLAY, fragments=fragments
    )


@pytest.fixture
def patched(patched_tree, engine_name):
    with harness.engine(patched_tree, package=engine_name) as ns:
        yield ns


@pytest.fixture(autouse=True)
def tier_on(monkeypatch):
    """The disk tier on, the drafter knob unset (a test may change either)."""
    monkeypatch.delenv(DRAFTER_ENV, raising=False)
    monkeypatch.setenv(TIER_ENV, "1")


def set_tier(monkeypatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv(TIER_ENV, raising=False)
    else:
        monkeypatch.setenv(TIER_ENV, value)


# --------------------------------------------------------------------------
# Building vLLM inputs inside one engine namespace


class Vllm(HybridVllm):
    """The modules of one tree plus the connector pieces these tests build."""

    def spec(self, offloading_config):
        return make_spec(self, offloading_config)

    def scheduler_config(self, vllm_config, kv_cache_config):
        spec = self.spec(self.offloading_config(vllm_config, kv_cache_config))
        return self.scheduler.SchedulerOffloadConfig.from_spec(
            spec, vllm_config, kv_cache_config
        )


def group_ids(offloading_config) -> list[int]:
    return [group.group_id for group in offloading_config.groups]


# --------------------------------------------------------------------------
# Engine level


def test_apply_check_injected_on_pinned_tree(overlay_bin, tree_copy, scope_only):
    args = apply_args(tree_copy, *scope_only)
    done = run_overlay(overlay_bin, "apply", "--check-injected", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    module = tree_copy / "vllm/distributed/kv_transfer/kv_connector/v1/offloading"
    assert (module / "kv_offload_scope.py").is_file()
    check = run_overlay(overlay_bin, "check", "--check-injected", *args)
    assert check.returncode == 0, check.stdout + check.stderr
    again = run_overlay(overlay_bin, "apply", *args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already applied" in again.stdout


def tree_digests(root) -> dict[str, str]:
    return {
        path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_round_trip_and_idempotence(overlay_bin, tree_copy, engine_tree, scope_only):
    args = apply_args(tree_copy, *scope_only)
    pristine = tree_digests(engine_tree)
    assert run_overlay(overlay_bin, "apply", *args).returncode == 0
    applied = tree_digests(tree_copy)
    assert applied != pristine
    assert run_overlay(overlay_bin, "apply", *args).returncode == 0
    assert tree_digests(tree_copy) == applied
    done = run_overlay(overlay_bin, "revert", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert tree_digests(tree_copy) == pristine
    check = run_overlay(overlay_bin, "check", "--expect", "pristine", *args)
    assert check.returncode == 0, check.stdout + check.stderr


def test_apply_with_the_pinned_order(overlay_bin, tree_copy, manifests_dir, repo_root):
    """The real manifest folder (ORDER and every overlay of this version)."""
    args = apply_args(tree_copy, manifests_dir, repo_root / "overlays")
    done = run_overlay(overlay_bin, "apply", "--check-injected", *args)
    assert done.returncode == 0, done.stdout + done.stderr


def edit_states(overlay_bin, root, scope_only) -> dict[str, str]:
    done = run_overlay(overlay_bin, "status", "--json", *apply_args(root, *scope_only))
    assert done.returncode == 0, done.stdout + done.stderr
    states = {}
    for file in json.loads(done.stdout)["state"]["files"]:
        for overlay in file.get("overlays", []):
            if overlay["overlay"] == OVERLAY:
                states.update({e["id"]: e["state"] for e in overlay["edits"]})
    return states


def test_status_reports_superseded_edits(
    overlay_bin, engine_tree, patched_tree, scope_only
):
    for root in (engine_tree, patched_tree):
        states = edit_states(overlay_bin, root, scope_only)
        assert {i for i, state in states.items() if state == "superseded"} == SUPERSEDED
    applied = edit_states(overlay_bin, patched_tree, scope_only)
    assert {i for i, state in applied.items() if state == "applied"} == {
        "config-import",
        "eligible-groups",
        "scheduler-import",
        "partial-tail-all-eligible",
        "worker-import",
        "worker-group-ids",
    }


def test_hooks_call_the_scope_module(patched_tree):
    offloading = (
        patched_tree / "vllm/distributed/kv_transfer/kv_connector/v1/offloading"
    )
    assert (
        "kv_offload_scope.select_eligible_groups("
        in (offloading / "config.py").read_text()
    )
    assert (
        "kv_offload_scope.partial_tail_allowed("
        in (offloading / "scheduler.py").read_text()
    )
    assert (
        "kv_offload_scope.worker_group_ids(" in (offloading / "worker.py").read_text()
    )


def test_superseded_edits_are_upstream_text(engine_tree, manifests_dir):
    """Each superseded edit names text the pristine file really holds, once."""
    import tomllib

    manifest = tomllib.loads((manifests_dir / f"{OVERLAY}.toml").read_text())
    seen = set()
    for file in manifest["files"]:
        text = (engine_tree / file["path"]).read_text()
        for edit in file["edits"]:
            if "superseded_by" in edit:
                assert text.count(edit["superseded_by"]) == 1, edit["id"]
                seen.add(edit["id"])
    assert seen == SUPERSEDED


# --------------------------------------------------------------------------
# Eligibility


def test_seven_group_layout_eligible_set_and_boot_line(patched, caplog):
    vllm = Vllm(patched)
    needs_draft_marking(vllm)
    caplog.set_level(logging.INFO)
    config = vllm.offloading_config(vllm.vllm_config(), vllm.hybrid_layout())
    assert group_ids(config) == [0, 2, 3, 4, 5]
    lines = [
        r.getMessage() for r in caplog.records if "eligible groups" in r.getMessage()
    ]
    assert len(lines) == 1
    assert "eligible groups: [0, 2, 3, 4, 5] of 7" in lines[0]


def needs_draft_marking(vllm: Vllm) -> None:
    """Skip where vLLM marks no draft layers (KVCacheSpec.is_draft, 0.33.0 on):
    there the tier refuses an is_eagle_group group unless the drafter knob is
    1 (test_an_unmarked_eagle_group_stops_the_boot_unless_the_knob_is_1)."""
    if not vllm.marks_draft_layers:
        pytest.skip("this vLLM marks no draft layers")


def test_an_unmarked_eagle_group_stops_the_boot_unless_the_knob_is_1(
    patched, monkeypatch
):
    """vLLM 0.32.0: a drafter-only group and a shared MTP group look alike, so
    the tier refuses to guess; knob 1 offloads every group, as upstream."""
    vllm = Vllm(patched)
    if vllm.marks_draft_layers:
        pytest.skip("this vLLM marks draft layers: is_draft decides")
    layout = vllm.kv_cache_config((vllm.full(), False), (vllm.swa(), True))
    with pytest.raises(ValueError, match="cannot tell whether KV cache group 1"):
        vllm.offloading_config(vllm.vllm_config(), layout)
    monkeypatch.setenv(DRAFTER_ENV, "1")
    assert group_ids(vllm.offloading_config(vllm.vllm_config(), layout)) == [0, 1]


def test_pristine_offloads_the_drafter_group(pristine):
    """The gap the overlay closes: 0.33.0 offloads g6."""
    vllm = Vllm(pristine)
    layout = vllm.hybrid_layout(drafter="eagle")
    config = vllm.offloading_config(vllm.vllm_config(), layout)
    assert group_ids(config) == [0, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("drafter", ["eagle", "eagle-full"])
@pytest.mark.parametrize(
    ("knob", "offloaded"), [(None, False), ("0", False), ("1", True)]
)
def test_drafter_only_with_the_knob(patched, monkeypatch, drafter, knob, offloaded):
    if knob is not None:
        monkeypatch.setenv(DRAFTER_ENV, knob)
    vllm = Vllm(patched)
    needs_draft_marking(vllm)
    config = vllm.offloading_config(
        vllm.vllm_config(), vllm.hybrid_layout(drafter=drafter)
    )
    expected = [0, 2, 3, 4, 5] + ([6] if offloaded else [])
    assert group_ids(config) == expected


@pytest.mark.parametrize("knob", [None, "1"])
def test_scratch_group_never_offloaded(patched, monkeypatch, knob):
    if knob is not None:
        monkeypatch.setenv(DRAFTER_ENV, knob)
    vllm = Vllm(patched)
    layout = vllm.hybrid_layout(drafter=None)
    assert not layout.kv_cache_groups[1].kv_cache_spec.prefix_cacheable
    assert group_ids(vllm.offloading_config(vllm.vllm_config(), layout)) == [
        0,
        2,
        3,
        4,
        5,
    ]


@pytest.mark.parametrize("speculative", [None, "ngram", "eagle", "mtp"])
def test_target_swa_group_is_never_a_drafter(patched, speculative):
    """vLLM issue #52735 (upstream's TestSharedGroupMTPOffload): under EAGLE-style
    speculation the target's own sliding-window group is offloaded too. Only
    KVCacheSpec.is_draft makes a drafter, not the spec type."""
    vllm = Vllm(patched)
    config = vllm.offloading_config(
        vllm.vllm_config(speculative=speculative), vllm.hybrid_layout(drafter="swa")
    )
    assert group_ids(config) == [0, 2, 3, 4, 5, 6]


def test_swa_subclass_is_not_a_drafter(patched):
    """Only an exact SlidingWindowSpec counts (SlidingWindowMLASpec is target)."""
    vllm = Vllm(patched)
    layout = vllm.kv_cache_config((vllm.mla(), False), (vllm.swa_mla(), False))
    assert group_ids(vllm.offloading_config(vllm.vllm_config(), layout)) == [0, 1]


@pytest.mark.parametrize(
    "value", ["", "true", "yes", "on", "2", "-1", "01", " 1", "1 "]
)
@pytest.mark.parametrize("tier", ["1", "0", None])
@pytest.mark.parametrize("name", [DRAFTER_ENV, TIER_ENV])
def test_knobs_are_parsed_strictly(patched, monkeypatch, value, tier, name):
    """A set knob is validated whether the tier is on or off."""
    set_tier(monkeypatch, tier)
    monkeypatch.setenv(name, value)
    vllm = Vllm(patched)
    # Even a layout without any drafter group refuses to boot.
    layout = vllm.kv_cache_config((vllm.full(), False))
    with pytest.raises(ValueError) as failure:
        vllm.offloading_config(vllm.vllm_config(), layout)
    # The contract's message: NAME=value (quoted unless plain): the rule.
    assert f"{name}=" in str(failure.value)
    assert value in str(failure.value)


# --------------------------------------------------------------------------
# Divisibility


def misaligned_layout(vllm: Vllm, drafter_block: int):
    # Mamba outside "align" mode makes tokens_per_hash the LCM of all block
    # sizes (768 here), so 256-token groups no longer divide it.
    return vllm.kv_cache_config(
        (vllm.full(3 * BLOCK), False),
        (vllm.mamba(3 * BLOCK, mode="none"), False),
        (vllm.draft(vllm.swa(drafter_block)), True),
    )


def test_misaligned_eligible_group_still_fails(patched):
    vllm = Vllm(patched)
    layout = vllm.kv_cache_config(
        (vllm.full(BLOCK), False), (vllm.mamba(3 * BLOCK, mode="none"), False)
    )
    with pytest.raises(AssertionError, match="not divisible by tokens_per_hash=768"):
        vllm.offloading_config(vllm.vllm_config(prefix_match_unit=None), layout)


def test_divisibility_guards_only_eligible_groups(patched, monkeypatch):
    """A misaligned drafter left out of the offload set no longer stops the boot."""
    vllm = Vllm(patched)
    needs_draft_marking(vllm)
    config = vllm.vllm_config(prefix_match_unit=None)
    assert group_ids(
        vllm.offloading_config(config, misaligned_layout(vllm, BLOCK))
    ) == [
        0,
        1,
    ]
    monkeypatch.setenv(DRAFTER_ENV, "1")
    with pytest.raises(AssertionError, match="tokens_per_block=256 not divisible"):
        vllm.offloading_config(config, misaligned_layout(vllm, BLOCK))


def test_pristine_asserts_on_the_misaligned_drafter(pristine):
    vllm = Vllm(pristine)
    with pytest.raises(AssertionError, match="tokens_per_block=256 not divisible"):
        vllm.offloading_config(
            vllm.vllm_config(prefix_match_unit=None), misaligned_layout(vllm, BLOCK)
        )


# --------------------------------------------------------------------------
# Wrapper specs


def hidden_state(vllm: Vllm):
    return vllm.kci.HiddenStateCacheSpec(
        block_size=vllm.block,
        num_kv_heads=1,
        head_size=32,
        dtype=vllm.torch.bfloat16,
    )


# Mixed UniformTypeKVCacheSpecs groups upstream serves (its test_config.py:
# uniform-mla-fa, a DSA-style MLA + full-attention group, and MLA + hidden
# state): refused with the tier on, upstream's with it off.
MIXED_WRAPPERS = {
    "mla-plus-full": (lambda v: v.wrap(v.mla(), v.full()), "FullAttentionSpec"),
    "mla-plus-hidden-state": (
        lambda v: v.wrap(v.mla(), hidden_state(v)),
        "HiddenStateCacheSpec",
    ),
}


@pytest.mark.parametrize("wrapper", sorted(MIXED_WRAPPERS))
def test_wrapper_with_two_member_types_is_refused_with_the_tier_on(patched, wrapper):
    vllm = Vllm(patched)
    build, other = MIXED_WRAPPERS[wrapper]
    layout = vllm.kv_cache_config((build(vllm), False))
    with pytest.raises(ValueError, match="cannot classify KV cache group 0") as failure:
        vllm.offloading_config(vllm.vllm_config(layout=layout), layout)
    message = str(failure.value)
    assert other in message and "MLAAttentionSpec" in message
    # The boot message says what to do.
    assert f"set {TIER_ENV}=0" in message


@pytest.mark.parametrize("tier", [None, "0"])
@pytest.mark.parametrize("wrapper", sorted(MIXED_WRAPPERS))
def test_wrapper_with_two_member_types_boots_with_the_tier_off(
    patched_tree, engine_tree, monkeypatch, wrapper, tier
):
    """Upstream's offloading config (the scheduler's config is flattened to
    one member upstream; the workers keep the wrappers)."""
    set_tier(monkeypatch, tier)
    views = []
    for tree in (engine_tree, patched_tree):
        with harness.engine(tree) as ns:
            vllm = Vllm(ns)
            layout = vllm.kv_cache_config((MIXED_WRAPPERS[wrapper][0](vllm), False))
            config = vllm.offloading_config(vllm.vllm_config(layout=layout), layout)
            views.append((repr(config), group_ids(config)))
    assert views[1] == views[0]
    assert views[1][1] == [0]


def test_pristine_classifies_a_mixed_wrapper_by_its_first_member(pristine):
    """What the overlay refuses: upstream boots and guesses."""
    vllm = Vllm(pristine)
    layout = vllm.kv_cache_config((vllm.wrap(vllm.full(), vllm.mla()), False))
    config = vllm.vllm_config(layout=layout)
    assert group_ids(vllm.offloading_config(config, layout)) == [0]


def test_single_type_wrapper_is_classified_by_its_member(patched):
    vllm = Vllm(patched)
    needs_draft_marking(vllm)
    draft = vllm.draft(vllm.swa())
    layout = vllm.kv_cache_config(
        (vllm.wrap(vllm.mla(), vllm.mla()), False),
        (vllm.wrap(vllm.swa(), vllm.swa()), False),
        (vllm.wrap(draft, draft), True),
    )
    # Only the group whose every member is a draft layer is the drafter.
    assert group_ids(vllm.offloading_config(vllm.vllm_config(), layout)) == [0, 1]


def test_shared_mtp_group_is_offloaded(patched):
    """An MTP/EAGLE head beside target layers (is_eagle_group, a target layer's
    spec) holds target KV: offloaded with the tier on, with the knob unset."""
    vllm = Vllm(patched)
    needs_draft_marking(vllm)
    draft = vllm.draft(vllm.full())
    layout = vllm.kv_cache_config(
        (vllm.wrap(vllm.full(), draft), True),
        (vllm.swa(), True),
    )
    assert group_ids(vllm.offloading_config(vllm.vllm_config(), layout)) == [0, 1]


# --------------------------------------------------------------------------
# Scheduler: pairing, keys, partial tails


def test_partial_tail_only_when_every_group_is_offloaded(patched):
    vllm = Vllm(patched)
    needs_draft_marking(vllm)
    config = vllm.vllm_config()
    # Upstream's own conditions hold on all three layouts (one block size,
    # aligned mamba groups, no window); only the offload set differs.
    all_offloaded = vllm.hybrid_layout(scratch=False, drafter=None)
    assert vllm.scheduler_config(config, all_offloaded).supports_partial_tail
    with_scratch = vllm.hybrid_layout(drafter=None)
    assert not vllm.scheduler_config(config, with_scratch).supports_partial_tail
    drafter_left_out = vllm.hybrid_layout(scratch=False, drafter="eagle-full")
    assert not vllm.scheduler_config(config, drafter_left_out).supports_partial_tail


def test_pristine_claims_partial_tail_past_a_scratch_group(pristine):
    vllm = Vllm(pristine)
    layout = vllm.hybrid_layout(drafter=None)
    assert vllm.scheduler_config(vllm.vllm_config(), layout).supports_partial_tail


def new_request(vllm: Vllm, num_tokens: int, req_id: str = "r0"):
    request_mod = vllm.ns.load("vllm.v1.request")
    hashes = [i.to_bytes(4, "big") * 8 for i in range(num_tokens // HASH)]
    return request_mod.Request(
        request_id=req_id,
        block_hashes=hashes,
        num_tokens=num_tokens,
        num_prompt_tokens=num_tokens,
        num_computed_tokens=0,
        status=request_mod.RequestStatus.RUNNING,
        kv_transfer_params=None,
        kv_hints=None,
        shared_prefix_boundary=None,
    )


def test_offload_keys_and_block_ids_by_original_index(patched):
    vllm = Vllm(patched)
    kv_cache_config = vllm.hybrid_layout()
    config = vllm.scheduler_config(vllm.vllm_config(), kv_cache_config)
    state = vllm.scheduler.RequestOffloadState(
        config=config,
        req=new_request(vllm, 4 * BLOCK),
        req_context=vllm.base.ReqContext(req_id="r0"),
        offloading_context=vllm.base.RequestOffloadingContext(),
    )
    assert len(state.group_states) == len(config.kv_group_configs) == 5
    state.update_offload_keys()
    # Every group's table holds its own index, so a mix-up shows.
    state.update_block_id_groups(tuple([100 + g] * 4 for g in range(7)))
    for group_config, group_state in zip(
        config.kv_group_configs, state.group_states, strict=True
    ):
        original = group_config.group_idx
        assert {
            vllm.base.get_offload_group_idx(k) for k in group_state.offload_keys
        } == {original}
        assert group_state.block_ids == [100 + original] * 4
    assert [c.group_idx for c in config.kv_group_configs] == [0, 2, 3, 4, 5]


# --------------------------------------------------------------------------
# Transfer-spec shape: scheduler store jobs and the worker's layout


@dataclass
class StepResult:
    offloaded: list[int]
    jobs: list  # TransferJob
    stored_keys: list[list[bytes]]


def store_step(
    vllm: Vllm,
    kv_cache_config,
    *,
    handoff_group: int | None = None,
    speculative: str | None = "eagle",
):
    """One scheduler step storing a 4-block prompt; returns its store jobs."""
    vllm_config = vllm.vllm_config(layout=kv_cache_config, speculative=speculative)
    spec = vllm.spec(vllm.offloading_config(vllm_config, kv_cache_config))
    scheduler = vllm.scheduler.OffloadingConnectorScheduler(
        spec, vllm_config, kv_cache_config
    )
    request = new_request(vllm, 4 * BLOCK)
    scheduler.on_new_request(request)
    num_groups = len(kv_cache_config.kv_cache_groups)
    block_ids = tuple([1000 * g + b + 1 for b in range(4)] for g in range(num_groups))
    handoffs = None
    if handoff_group is not None:
        handoffs = {request.request_id: [(handoff_group, 7777, 2 * BLOCK)]}
    meta = scheduler.build_connector_meta(
        scheduler_output(request, block_ids, handoffs)
    )
    jobs = [meta.store_jobs[job_id] for job_id in sorted(meta.store_jobs)]
    return StepResult(group_ids(spec.config), jobs, spec.manager.stored)


def test_store_specs_are_compact_in_config_order(patched):
    vllm = Vllm(patched)
    step = store_step(vllm, vllm.hybrid_layout(), handoff_group=3)
    assert step.offloaded == [0, 2, 3, 4, 5]
    assert len(step.jobs) == 2
    boundary, chunks = step.jobs  # the CoW hand-off job is built first
    # One entry per offloaded group, no slot for g1 or g6.
    assert list(boundary.src_spec.group_sizes) == [0, 0, 1, 0, 0]
    assert list(boundary.src_spec.block_ids) == [7777]
    assert list(chunks.src_spec.group_sizes) == [4, 0, 0, 0, 0]
    assert list(chunks.src_spec.block_ids) == [1, 2, 3, 4]
    keys = step.stored_keys
    assert {vllm.base.get_offload_group_idx(k) for k in keys[0]} == {3}
    assert {vllm.base.get_offload_group_idx(k) for k in keys[1]} == {0}


def test_pristine_store_specs_carry_the_drafter_slot(pristine):
    vllm = Vllm(pristine)
    step = store_step(vllm, vllm.hybrid_layout(drafter="eagle"), handoff_group=3)
    assert step.offloaded == [0, 2, 3, 4, 5, 6]
    assert [len(job.src_spec.group_sizes) for job in step.jobs] == [6, 6]


class FakeTensor:
    """Just enough tensor for OffloadingConnectorWorker.register_kv_caches.

    Carries the layer it stands for so the layout can be read back.
    """

    def __init__(self, layer: str, shape: tuple[int, ...], strides: tuple[int, ...]):
        self.layer = layer
        self.shape = shape
        self._strides = strides
        self.device = "cpu"

    def element_size(self) -> int:
        return 1

    def storage_offset(self) -> int:
        return 0

    def stride(self, dim: int | None = None):
        return self._strides if dim is None else self._strides[dim]

    def untyped_storage(self):
        return self.layer

    def data_ptr(self) -> int:
        return id(self)

    def set_(self, storage, offset, size, stride):
        return FakeTensor(storage, tuple(size), tuple(stride))


def worker_layout(vllm: Vllm, kv_cache_config, offloading_config) -> list[set[str]]:
    """Runs the real register_kv_caches; returns each layout group's layers."""
    # PP=2 makes derive_canonical_mappings return {} (no canonical layout),
    # which is the direct-layout path the store uses.
    vllm_config = vllm.vllm_config(
        world_size=2, pipeline_parallel_size=2, layout=kv_cache_config
    )
    spec = vllm.spec(offloading_config)
    worker = vllm.worker.OffloadingConnectorWorker(spec, vllm_config, kv_cache_config)
    # One unpacked cache per layer: block stride == page size.
    kv_caches = {
        name: FakeTensor(name, (NUM_BLOCKS, page), (page, 1))
        for group in kv_cache_config.kv_cache_groups
        for name in group.layer_names
        for page in [group.kv_cache_spec.page_size_bytes]
    }
    torch = vllm.worker.torch
    fake_torch = SimpleNamespace(
        int8=torch.int8,
        tensor=lambda *a, **k: FakeTensor("", (0,), (1,)),
    )
    vllm.worker.torch = fake_torch
    try:
        worker.register_kv_caches(kv_caches)
    finally:
        vllm.worker.torch = torch
    caches = spec.worker_caches
    return [
        {caches.tensors[ref.tensor_idx].tensor.layer for ref in refs}
        for refs in caches.group_data_refs
    ]


def test_worker_lays_out_exactly_the_offloaded_groups(patched):
    vllm = Vllm(patched)
    layout = vllm.hybrid_layout()
    offloading_config = vllm.offloading_config(vllm.vllm_config(), layout)
    groups = worker_layout(vllm, layout, offloading_config)
    # Position i of a transfer spec and of the worker layout is config group i.
    assert groups == [{f"model.layers.{g}.mixer"} for g in (0, 2, 3, 4, 5)]


def test_pristine_worker_would_misalign_a_scoped_config(pristine):
    """Why worker-group-ids exists: 0.33.0's worker re-derives its groups.

    Given a config scoped to [0, 2, 3, 4, 5], the pristine worker still lays
    out six groups, so every store spec (five entries) would be misread.
    """
    vllm = Vllm(pristine)
    layout = vllm.hybrid_layout(drafter="eagle")
    full = vllm.offloading_config(vllm.vllm_config(), layout)
    scoped = replace(full, groups=tuple(g for g in full.groups if g.group_id != 6))
    assert len(worker_layout(vllm, layout, scoped)) == 6 != len(scoped.groups)


# --------------------------------------------------------------------------
# Knob unset: identical to pristine where upstream already works


def scheduler_view(vllm: Vllm, kv_cache_config, speculative: str | None):
    """What the connector's two sides decide, in plain values."""
    vllm_config = vllm.vllm_config(layout=kv_cache_config, speculative=speculative)
    offloading_config = vllm.offloading_config(vllm_config, kv_cache_config)
    config = vllm.scheduler_config(vllm_config, kv_cache_config)
    step = store_step(vllm, kv_cache_config, speculative=speculative)
    return {
        "offloading_config": repr(offloading_config),
        "group_configs": [
            (
                c.group_idx,
                c.tokens_per_block,
                c.tokens_per_chunk,
                c.hashes_per_chunk,
                c.sliding_window_size_in_chunks,
                c.requires_cow_source,
                c.is_eagle_group,
                type(c.kv_cache_spec).__name__,
            )
            for c in config.kv_group_configs
        ],
        "supports_partial_tail": config.supports_partial_tail,
        "alignment_tokens": config.alignment_tokens,
        "kv_bytes_per_token": getattr(config, "kv_bytes_per_token", None),
        "jobs": [
            (
                list(j.src_spec.group_sizes),
                list(j.src_spec.block_indices),
                [int(b) for b in j.src_spec.block_ids],
            )
            for j in step.jobs
        ],
        "stored_keys": step.stored_keys,
        "worker": worker_layout(vllm, kv_cache_config, offloading_config),
    }


def shared_mtp_layout(v):
    """Full + SWA under MTP, the MTP head (layer 2) sharing the full-attention
    group: vLLM flags it EAGLE and its spec is a target layer's."""
    return v.kv_cache_config(
        (v.full(), True, ["model.layers.0.mixer", "model.layers.2.mixer"]),
        (v.swa(), False, ["model.layers.1.mixer"]),
    )


# (layout, speculative method). The first ones have no draft-model group, no
# group outside the offload set and no mixed wrapper: there every hook must
# hand back upstream's own values even with the tier on.
LAYOUTS_UPSTREAM_SERVES = {
    "uniform-single-group": (lambda v: v.kv_cache_config((v.full(), False)), "eagle"),
    "uniform-no-speculation": (lambda v: v.kv_cache_config((v.full(), False)), None),
    "full-plus-mamba": (
        lambda v: v.hybrid_layout(scratch=False, drafter=None),
        "eagle",
    ),
    "full-plus-target-swa": (
        lambda v: v.kv_cache_config((v.full(), False), (v.swa(), False)),
        None,
    ),
    # vLLM issue #52735: the target's SWA group under EAGLE-style speculation.
    "full-plus-target-swa-eagle": (
        lambda v: v.kv_cache_config((v.full(), False), (v.swa(), False)),
        "eagle",
    ),
    "shared-mtp-group": (shared_mtp_layout, "mtp"),
}
# Layouts where the tier-on rules differ from upstream; with the tier off they
# must be upstream's too.
LAYOUTS_THE_TIER_SCOPES = {
    "hybrid-scratch-and-drafter": (lambda v: v.hybrid_layout(drafter="eagle"), "eagle"),
    "full-plus-scratch": (
        lambda v: v.hybrid_layout(drafter=None),
        "eagle",
    ),
}


def views_of_both_trees(patched_tree, engine_tree, build, speculative):
    views = []
    for tree in (engine_tree, patched_tree):
        with harness.engine(tree) as ns:
            vllm = Vllm(ns)
            views.append(scheduler_view(vllm, build(vllm), speculative))
    return views


@pytest.mark.parametrize("layout", sorted(LAYOUTS_UPSTREAM_SERVES))
@pytest.mark.parametrize("drafter", [None, "0", "1"])
def test_identical_to_pristine(patched_tree, engine_tree, monkeypatch, layout, drafter):
    if drafter is not None:
        monkeypatch.setenv(DRAFTER_ENV, drafter)
    build, speculative = LAYOUTS_UPSTREAM_SERVES[layout]
    if layout == "shared-mtp-group" and drafter != "1":
        with harness.engine(patched_tree) as ns:
            needs_draft_marking(Vllm(ns))
    pristine_view, patched_view = views_of_both_trees(
        patched_tree, engine_tree, build, speculative
    )
    assert patched_view == pristine_view
    assert patched_view["jobs"], "the scenario must store something"


@pytest.mark.parametrize(
    "layout", sorted(LAYOUTS_UPSTREAM_SERVES) + sorted(LAYOUTS_THE_TIER_SCOPES)
)
@pytest.mark.parametrize("tier", [None, "0"])
def test_tier_off_is_pristine(patched_tree, engine_tree, monkeypatch, layout, tier):
    """The disk tier off: upstream's offload set, partial-tail claim, store jobs
    and worker layout on every layout, the drafter knob set or not."""
    set_tier(monkeypatch, tier)
    monkeypatch.setenv(DRAFTER_ENV, "0")
    build, speculative = {**LAYOUTS_UPSTREAM_SERVES, **LAYOUTS_THE_TIER_SCOPES}[layout]
    pristine_view, patched_view = views_of_both_trees(
        patched_tree, engine_tree, build, speculative
    )
    assert patched_view == pristine_view
    assert patched_view["jobs"], "the scenario must store something"
