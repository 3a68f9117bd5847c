"""realsched.Engine, the played model runner, keeps the runner's contract with the real
Scheduler: a request still prefilling gets no sampled token. schedule() has already added the
step's tokens to num_computed_tokens when the runner decides, so a prompt longer than the
step's token budget (max_num_batched_tokens 256) is sampled only in its last prefill chunk.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import realsched

BUDGET = 256  # realsched.engine_config's max_num_batched_tokens


def test_a_chunked_prefill_samples_only_when_the_prompt_is_computed(knobs):
    engine = realsched.Engine(realsched.boot())
    prompt = [(i * 7) % 800 + 10 for i in range(BUDGET + 44)]
    engine.add("long", prompt, max_tokens=2)
    req = engine.s.requests["long"]

    first = engine.step()
    assert first.scheduled == {"long": BUDGET}  # the first chunk of the prompt
    assert req.num_computed_tokens == BUDGET
    assert req.num_output_tokens == 0, "sampled in the middle of the prefill"
    # The rest of the prompt, in the chunks the scheduler picks (mamba "align" mode splits
    # at block boundaries): no token before the last of them, one token at it.
    while req.num_computed_tokens < len(prompt):
        engine.step()
        done = req.num_computed_tokens >= len(prompt)
        assert req.num_output_tokens == (1 if done else 0), req.num_computed_tokens
    assert req.num_computed_tokens == len(prompt)
    prefill_steps = len(engine.steps)

    engine.run()
    assert engine.finished == {"long"} and req.num_output_tokens == 2
    # The second token came from one decode step of one token (the steps after it only
    # acknowledge store jobs).
    decode = [st.scheduled for st in engine.steps[prefill_steps:] if st.scheduled]
    assert decode == [{"long": 1}]


def test_a_region_another_process_holds_is_excused_one_only_we_hold_is_not(tmp_path):
    """The leak check excuses a /dev/shm region only while another live process holds it
    (a boot test_model_layouts started ahead), never one this process keeps."""
    name = f"vllm_offload_harness-{uuid.uuid4()}.mmap"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as mine:
        mine.write(b"x")
        assert realsched.held_by_others({name}) == set()  # held by this process only
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"f = open({path!r}); print(1, flush=True); input()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout.readline() == "1\n"
            assert realsched.held_by_others({name}) == {name}
        finally:
            holder.communicate("")
        assert realsched.held_by_others({name}) == set()
    os.unlink(path)


def test_a_region_removed_while_the_check_settles_is_not_left_behind():
    """A boot between closing its region and removing it holds the file no more, yet
    leaves nothing behind (CI saw one so, 2026-12-08); a region that stays without a
    holder is reported once the check has settled."""
    gone, stays = (f"vllm_offload_harness-{uuid.uuid4()}.mmap" for _ in range(2))
    for name in (gone, stays):
        with open(f"/dev/shm/{name}", "wb") as f:
            f.write(b"x")
    remover = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time; time.sleep(0.5); os.unlink('/dev/shm/{gone}')",
        ]
    )
    try:
        assert realsched.left_behind({gone, stays}, settle_s=3.0) == {stays}
        assert not os.path.exists(f"/dev/shm/{gone}")
    finally:
        remover.wait()
        os.unlink(f"/dev/shm/{stays}")
