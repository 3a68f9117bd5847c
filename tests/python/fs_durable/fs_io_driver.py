"""Loads vLLM's fs_io_C extension from a file and round-trips blocks through it.

    python3 fs_io_driver.py EXTENSION.so DIR

Stores three blocks with batch_store_block (temp file + rename, as vLLM's
filesystem tier does), loads them back with batch_load_block and exits 1 if a
byte differs. Prints the temp and destination paths as JSON. Only the one
extension is loaded: importing the vllm package would need torch.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import sys


def main() -> int:
    so, folder = sys.argv[1], sys.argv[2]
    loader = importlib.machinery.ExtensionFileLoader("fs_io_C", so)
    spec = importlib.util.spec_from_file_location("fs_io_C", so, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    blocks = [os.urandom(4096 * (i + 1)) for i in range(3)]
    dest = [os.path.join(folder, "blocks", f"{i:02x}", "block.bin") for i in range(3)]
    tmp = [d + ".tmp" for d in dest]
    # O_DIRECT off: the test folder may be a tmpfs, and bytes are not aligned.
    mod.batch_store_block(tmp, dest, blocks, False)
    back = [bytearray(len(b)) for b in blocks]
    mod.batch_load_block(dest, back, False)
    same = all(bytes(x) == y for x, y in zip(back, blocks, strict=True))
    print(json.dumps({"tmp": tmp, "dest": dest, "round_trip": same}))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
