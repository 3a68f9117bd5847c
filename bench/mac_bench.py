"""What a keyed store's MAC costs a core (issue 38, FORMAT.md 3.6), beside the
CRC-32 every chunk already pays: one chunk-sized buffer, checked whole.

    python3 bench/mac_bench.py [--mib 40] [--repeat 5] [--json out.json]

Prints GB/s on one thread (the best of ``--repeat``) for:

- ``crc32``: zlib's CRC-32 of the payload, what write and restore do today;
- ``hmac_sha256``: hashlib's HMAC-SHA256 (OpenSSL's libcrypto: SHA-NI
  where the CPU has it) of the same bytes: the v2 seal, and what a v2-sealed
  chunk of an older store still costs its reader;
- ``gmac``: the v3 seal's AES-256-GMAC (subkey derivation included) through
  the same libcrypto (ctypes; PCLMULQDQ/AVX GHASH where the CPU has them);
- ``crc32+hmac``, ``crc32+gmac``: what a keyed write or restore adds up to;
- ``open_chunk``: the pure-Python codec's open_chunk (the oracle,
  tests/oracle/kv_store_format_oracle) on a v3 sealed chunk of that size
  (one copy, the MAC check), then verify_chunk (CRC).

The 40 MiB default is restore_bench's chunk (Llama-3.1-70B at TP 2). The
C++ codec's own figures (the library the restore runs): build/format/
kvformat_mac_bench.
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "oracle"))

import kv_store_format_oracle as fmt  # noqa: E402


def _best(fn: Callable[[], object], nbytes: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return nbytes / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    payload = os.urandom(args.mib << 20)
    key = os.urandom(32)
    n = len(payload)

    def mac() -> bytes:
        return hmac.digest(key, payload, "sha256")

    def gmac() -> bytes:
        sealer = fmt.ChunkSealer(key, 0)
        sealer.update(payload)
        return sealer.digest()

    segments = fmt.make_segments([(0, fmt.SegmentKind.KV, fmt.DType.UINT8, (n,), (1,))])
    header = fmt.make_header(b"\0" * 32, 0, b"\1" * 16, 16, segments, payload)
    sealed = fmt.seal_chunk(key, fmt.encode_chunk(header, payload), rank=0)

    results = {
        "crc32": _best(lambda: zlib.crc32(payload), n, args.repeat),
        "hmac_sha256": _best(mac, n, args.repeat),
        "gmac": _best(gmac, n, args.repeat),
        "crc32+hmac": _best(lambda: (zlib.crc32(payload), mac()), n, args.repeat),
        "crc32+gmac": _best(lambda: (zlib.crc32(payload), gmac()), n, args.repeat),
        "open_chunk": _best(
            lambda: fmt.verify_chunk(fmt.open_chunk(key, sealed, rank=0)),
            n,
            args.repeat,
        ),
    }
    for name, gbs in results.items():
        print(f"{name:12s} {gbs:6.2f} GB/s  ({args.mib} MiB, one thread)")
    if args.json:
        args.json.write_text(json.dumps({"mib": args.mib, "gb_per_s": results}))


if __name__ == "__main__":
    main()
