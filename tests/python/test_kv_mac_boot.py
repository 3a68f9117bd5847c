"""The key-file knob at the writer's boot (issue 38 part 3): a key file others
may read is refused with one line naming it and its mode, before anything is
created; a good key is refused too while the native write path has no MAC,
rather than write a store the operator believes authenticated."""

from __future__ import annotations

import os
from pathlib import Path

import store_local_support as sls


def _key(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "kvtier.key"
    path.write_bytes(os.urandom(32))
    path.chmod(mode)
    return path


def test_a_key_file_others_may_read_is_refused_at_boot(tmp_path):
    key = _key(tmp_path, 0o644)
    root = tmp_path / "kv"
    store, _ = sls.make_store(root, knobs=sls.knobs(root, key_file=str(key)))
    assert not store.active
    assert store.disabled_reason == (
        f"key file {key} has mode 0644: group/other may access it (chmod 600)"
    )
    assert not root.exists()  # refused before anything was made


def test_a_private_key_is_refused_until_the_writer_seals(tmp_path):
    key = _key(tmp_path, 0o600)
    root = tmp_path / "kv"
    store, _ = sls.make_store(root, knobs=sls.knobs(root, key_file=str(key)))
    assert not store.active
    assert "does not write MACs yet" in store.disabled_reason
    assert key.read_bytes().hex() not in store.disabled_reason
    assert not root.exists()
