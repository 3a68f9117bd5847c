"""engine/turns.py: engines sharing one GPU time their rounds one at a time, in the
order the interleaved tier-cost judge pairs them (threads stand in for the engines)."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "engine"))

from turns import Turns, TurnTimeout  # noqa: E402

ORDER = ["off", "on", "ref"]


def test_rounds_run_one_at_a_time_in_a_rotating_order(tmp_path):
    log: list[tuple[str, int, str]] = []
    busy = threading.Lock()

    def engine(role: str, boot_s: float) -> None:
        turns = Turns(str(tmp_path / "g"), role, ORDER)
        time.sleep(boot_s)  # engines come up at different times
        turns.ready()
        for rnd in range(6):
            turns.wait(rnd)
            assert busy.acquire(blocking=False), "two engines timed at once"
            log.append((role, rnd, "start"))
            time.sleep(0.01)
            log.append((role, rnd, "end"))
            busy.release()
            turns.done(rnd)

    threads = [threading.Thread(target=engine, args=(r, b))
               for r, b in (("ref", 0.0), ("on", 0.15), ("off", 0.05))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    starts = [(role, rnd) for role, rnd, what in log if what == "start"]
    assert starts == [
        ("off", 0), ("on", 0), ("ref", 0),
        ("on", 1), ("ref", 1), ("off", 1),
        ("ref", 2), ("off", 2), ("on", 2),
        ("ref", 3), ("on", 3), ("off", 3),
        ("on", 4), ("off", 4), ("ref", 4),
        ("off", 5), ("ref", 5), ("on", 5),
    ]  # fmt: skip
    # Over the six rounds: each engine in each place twice, none twice in a row, and
    # "off" before "on" in as many rounds as after.
    order = [role for role, _ in starts]
    for place in range(3):
        assert sorted(order[place::3]) == sorted(ORDER * 2)
    assert all(a != b for a, b in zip(order, order[1:]))
    rounds = [order[i : i + 3] for i in range(0, 18, 3)]
    assert sum(r.index("off") < r.index("on") for r in rounds) == 3


def test_no_turn_starts_before_every_engine_is_ready(tmp_path):
    off = Turns(str(tmp_path), "off", ORDER, wait_s=0.3)
    off.ready()
    Turns(str(tmp_path), "on", ORDER).ready()
    with pytest.raises(TurnTimeout, match="ready \\['off', 'on'\\]"):
        off.wait(0)  # ref never came up: off waits, then says so


def test_a_turn_that_never_comes_names_the_step(tmp_path):
    for role in ORDER:
        Turns(str(tmp_path), role, ORDER).ready()
    on = Turns(str(tmp_path), "on", ORDER, wait_s=0.2)
    with pytest.raises(TurnTimeout, match="turn 1 .*step 0"):
        on.wait(0)  # off's round 0 never ended


def test_a_role_outside_the_order_is_refused(tmp_path):
    with pytest.raises(ValueError):
        Turns(str(tmp_path), "other", ORDER)
    with pytest.raises(ValueError):
        Turns(str(tmp_path), "on", ["on", "on"])
