"""Issue 48: corruption is removed the way the docs say. After a flipped
payload byte `kvstore verify` reports it; a plain `gc --sweep` reads headers
only and leaves it (docs/KVSTORE.md); `gc --sweep --verify-payloads` removes
it and exits 0 because nothing damaged is left (it exited 1 although it had
succeeded); its dry run still exits 1 (it found damage, deleted nothing);
damage a sweep cannot remove keeps exit 1."""

from __future__ import annotations

import json
import os

import pytest
from kvstore_support import FULL_GROUP, Store, age_tree, flip_bit, run


@pytest.fixture
def rotted(tmp_path) -> tuple[Store, object]:
    """Two chains; one payload byte of chain a's second chunk flipped."""
    s = Store(tmp_path / "glm53-kv-offload")
    for names in (["a"], ["a", "b"], ["c"], ["c", "d"]):
        s.boundary(names)
    age_tree(s.tier)
    chunk = s.tier / s.chunk_rel("b", FULL_GROUP)
    flip_bit(chunk, chunk.stat().st_size - 1)
    return s, chunk


def test_verify_then_sweep_with_payloads_removes_the_damage(kvstore_bin, rotted):
    s, chunk = rotted
    tier = str(s.tier)
    verify = run(kvstore_bin, "verify", tier)
    assert verify.code == 1 and "1 corrupt, 1 mismatch" in verify.out
    plain = run(kvstore_bin, "gc", "--sweep", tier)
    assert plain.code == 0 and chunk.exists()  # headers only: not seen
    dry = run(kvstore_bin, "gc", "--verify-payloads", tier)
    assert dry.code == 1 and chunk.exists()
    sweep = run(kvstore_bin, "gc", "--sweep", "--verify-payloads", "--json", tier)
    doc = json.loads(sweep.out)
    assert sweep.code == 0 and doc["ok"] is True, sweep.out + sweep.err
    assert doc["summary"]["damage"] == 2  # what the sweep found, and removed
    assert not chunk.exists()
    text = run(kvstore_bin, "gc", "--sweep", "--verify-payloads", tier)
    assert text.code == 0 and text.out.endswith("no problems\n"), text.out
    assert run(kvstore_bin, "verify", tier).code == 0


def test_the_sweep_says_it_removed_the_damage(kvstore_bin, rotted):
    s, _ = rotted
    r = run(kvstore_bin, "gc", "--sweep", "--verify-payloads", "-q", str(s.tier))
    assert r.code == 0
    assert r.out.endswith(
        "2 finding(s): 1 corrupt, 1 mismatch; all 2 damaged removed by this sweep\n"
    )


def test_damage_the_sweep_leaves_keeps_exit_1(kvstore_bin, rotted):
    """A foreign file is never deleted: found, left, exit 1 after a sweep."""
    s, _ = rotted
    (s.base / "notes.txt").write_text("an operator's file\n")
    os.utime(s.base / "notes.txt", (0, 0))
    r = run(kvstore_bin, "gc", "--sweep", "--verify-payloads", str(s.tier))
    assert r.code == 1, r.out + r.err
    assert "1 of 3 damaged left after this sweep" in r.out
    assert (s.base / "notes.txt").exists()
