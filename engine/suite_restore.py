"""The restore-across-a-restart stages' judge (docs/overlays/kv-offload-restore.md): per set
<set>.cold, .write, .hit, .bad, .healed (the tiny models' and the model stages'), and the
corruption the suite makes before <set>.bad (corrupt_chunk).
"""

from __future__ import annotations

import os

from suite_compare import cached_tokens, matched_logprobs, same_kv
from suite_models import NEW_MODELS
from suite_stage import Stage

# Restore sets the judge knows: <set>.cold, .write, .hit, .bad, .healed.
RESTORE_SETS = ("restore.llama", "restore.lfm2") + tuple(
    f"{m}.restore" for m in NEW_MODELS
)
# KVTIER_SUITE_KEY=1: the restore sets' stages run on a keyed store (FORMAT.md 3.6, issue 38):
# a 0600 key file made once beside the stores, GLM53_KV_OFFLOAD_KEY_FILE set for every
# stage of those sets (the write stage too: the key is part of the namespace), kvstore
# verify run with --key, and the corrupted chunk refused as mac_mismatch.
ENV_SUITE_KEY = "KVTIER_SUITE_KEY"


def suite_key_file(stores: str, environ=os.environ) -> str:
    """The key file of a keyed run ("" unless KVTIER_SUITE_KEY=1): 32 random bytes,
    0600, beside the stores folder (never in a store, never in results.json)."""
    if not keyed_run(environ):
        return ""
    path = os.path.join(os.path.dirname(os.path.abspath(stores)), "kvtier-suite.key")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, os.urandom(32))
    finally:
        os.close(fd)
    return path


def keyed_run(environ=os.environ) -> bool:
    return environ.get(ENV_SUITE_KEY, "0") == "1"


def keyed(st: Stage, key_file: str) -> bool:
    """Whether the stage runs with the key: a knob-1 stage of a restore set."""
    return bool(key_file) and st.knob == "1" and (st.store or "") in RESTORE_SETS


def corrupt_chunk(restored: dict) -> dict:
    """Flip one payload byte (the middle one) of the first chunk the stage restored."""
    for w in restored.get("restore_workers") or []:
        for promotion in w.get("promotions", []):
            if not promotion.get("ok"):
                continue
            for item in promotion.get("keys", []):
                if "path" not in item or "header_length" not in item:
                    continue
                offset = item["header_length"] + item["payload_length"] // 2
                with open(item["path"], "r+b") as f:
                    f.seek(offset)
                    before = f.read(1)[0]
                    f.seek(offset)
                    f.write(bytes([before ^ 0xFF]))
                return {"key": item["key"], "group": item["group"], "path": item["path"],
                        "offset": offset, "before": before, "after": before ^ 0xFF}  # fmt: skip
    return {"error": "the stage restored no chunk: nothing to corrupt"}


def restore_judge(
    results: dict[str, dict], corruptions: dict[str, dict]
) -> dict[str, dict]:
    verdicts: dict[str, dict] = {}
    for name in RESTORE_SETS:
        cold, write = results.get(f"{name}.cold"), results.get(f"{name}.write")
        hit, bad = results.get(f"{name}.hit"), results.get(f"{name}.bad")
        healed = results.get(f"{name}.healed")
        if cold is None:
            continue
        if write is not None:
            v = matched_logprobs(cold, write)
            v["ok"] = v["ok"] and cold.get("rc") == 0 == write.get("rc")
            verdicts[f"{name}.write: logprobs == cold"] = v
        if hit is not None:
            verdicts[
                f"{name}.hit: restored after a restart, logprobs and KV bytes == cold"
            ] = _restored(cold, hit)
        if bad is not None:
            verdicts[
                f"{name}.bad: corrupted chunk refused, recomputed, logprobs == cold"
            ] = _refused(cold, hit or {}, bad, corruptions.get(f"{name}.bad", {}))
        if healed is not None:
            verdicts[
                f"{name}.healed: the refused chunk written anew and restored, "
                "logprobs and KV bytes == cold"
            ] = _healed(cold, bad or {}, healed, corruptions.get(f"{name}.bad", {}))
    return verdicts


def _external_hits(cold: dict, other: dict) -> int:
    """Round 0's prefix-hit tokens beyond what the cold engine's GPU cache gave."""
    a, b = cached_tokens(cold)[:1], cached_tokens(other)[:1]
    return sum(b[0]) - sum(a[0]) if a and b else 0


def _restored(cold: dict, hit: dict) -> dict:
    sched = hit.get("restore_scheduler") or {}
    workers = hit.get("restore_workers") or []
    stats = [w.get("stats", {}) for w in workers]
    v = {
        "rc": hit.get("rc"),
        "scheduler": sched,
        "worker_stats": stats,
        "external_hit_tokens": _external_hits(cold, hit),
        "num_cached_tokens": {
            "cold": cached_tokens(cold),
            "restored": cached_tokens(hit),
        },
        "logprobs": matched_logprobs(cold, hit),
        "kv": same_kv(cold, hit),
    }
    v["restored"] = (
        sched.get("keys_promoted", 0) > 0
        and sched.get("promotions_failed", 1) == 0
        and bool(stats)
        and all(
            s.get("keys_restored", 0) > 0 and s.get("jobs_failed", 1) == 0
            for s in stats
        )
        and v["external_hit_tokens"] > 0
    )
    v["ok"] = (
        hit.get("rc") == 0 == cold.get("rc")
        and v["restored"]
        and v["logprobs"]["ok"]
        and v["kv"]["ok"]
    )
    return v


def _loaded_keys(res: dict) -> list[str]:
    return [
        item.get("key")
        for w in res.get("restore_workers") or []
        for p in w.get("promotions", [])
        if p.get("ok")
        for item in p.get("keys", [])
    ]


def _refused(cold: dict, hit: dict, bad: dict, corruption: dict) -> dict:
    sched = bad.get("restore_scheduler") or {}
    workers = bad.get("restore_workers") or []
    key = corruption.get("key")
    failures = [f for w in workers for f in w.get("failures", [])]
    loaded = _loaded_keys(bad)
    v = {
        "rc": bad.get("rc"),
        "corruption": corruption,
        "scheduler": sched,
        "worker_stats": [w.get("stats", {}) for w in workers],
        "failures": failures[:5],
        "num_cached_tokens": {
            "restored": cached_tokens(hit),
            "after_corruption": cached_tokens(bad),
        },
        "logprobs": matched_logprobs(cold, bad),
        "kv": same_kv(cold, bad),
    }
    # A flipped payload byte is refused by its CRC, or in a keyed store by its MAC
    # first (FORMAT.md 3.6: the MAC's verdict comes before every other).
    expected = "mac_mismatch" if keyed_run() else "payload_checksum_mismatch"
    v["chunk_refused"] = bool(key) and any(
        f.get("key") == key and f.get("reason") == expected for f in failures
    )
    v["refusal_expected"] = expected
    # Marked bad, and still listed bad at the end unless the rank's writer was told to
    # write the chunk anew (distrust): it then publishes those manifests again, and a
    # rescan before the report reads the new files (seen on the H200: the list was empty).
    v["manifest_marked_bad"] = any(
        w.get("stats", {}).get("manifests_marked_bad", 0) > 0
        and (
            w.get("manifests_bad")
            or w.get("writer_stats", {}).get("keys_distrusted", 0) > 0
        )
        for w in workers
    )
    v["corrupted_chunk_loaded"] = key in loaded if key else None
    v["promotion_failed"] = sched.get("promotions_failed", 0) > 0
    # The request whose restore failed computed more of its prompt than with the restore.
    # Per request, not summed: a later request of round 0 may find the recomputed prefix in
    # the CPU tier (seen on the H200 with 0.34.0: [0, 64, 64, 0] restored, [0, 0, 64, 64]
    # after the corruption).
    hit0, bad0 = cached_tokens(hit)[:1], cached_tokens(bad)[:1]
    v["recomputed"] = bool(hit0 and bad0) and any(
        b < h for b, h in zip(bad0[0], hit0[0], strict=True)
    )
    v["ok"] = (
        bad.get("rc") == 0 == cold.get("rc")
        and "error" not in corruption
        and v["chunk_refused"]
        and v["manifest_marked_bad"]
        and v["corrupted_chunk_loaded"] is False
        and v["promotion_failed"]
        and v["recomputed"]
        and v["logprobs"]["ok"]
        and v["kv"]["ok"]
    )
    return v


def _healed(cold: dict, bad: dict, healed: dict, corruption: dict) -> dict:
    """Engine 3 refused the corrupted chunk and its store wrote the key anew;
    engine 4 restores that chunk among the rest, == cold, and the store verifies."""
    v = _restored(cold, healed)
    key = corruption.get("key")
    written = [w.get("writer_stats", {}) for w in bad.get("restore_workers") or []]
    v["bad_engine_writer"] = written
    v["rewritten"] = any(
        s.get("keys_distrusted", 0) >= 1 and s.get("keys_written", 0) >= 1
        for s in written
    )
    v["corrupted_chunk_restored"] = bool(key) and key in _loaded_keys(healed)
    v["kvstore_verify"] = healed.get("kvstore_verify")
    v["ok"] = (
        v["ok"]
        and "error" not in corruption
        and v["rewritten"]
        and v["corrupted_chunk_restored"]
        and (healed.get("kvstore_verify") or {}).get("rc") == 0
    )
    return v
