# SPDX-License-Identifier: Apache-2.0
"""Authenticated chunks and manifests (docs/FORMAT.md 3.6): HMAC-SHA256 with a
secret key, the key's id fenced in the namespace, the key file's checks.

A sealed chunk is the plain chunk with flag bit 0 set in its header (the
header checksum recomputed) and a 32-byte MAC after the payload, over every
byte before it. ``open_chunk`` checks the MAC before it parses anything and
gives back the plain chunk, so the unchanged reader (``verify_chunk``) checks
the rest; a keyless reader meets flags != 0 and refuses the file.
"""

from __future__ import annotations

import hmac
import os
import re
import stat
import struct
from collections.abc import Mapping
from typing import Any

from .checksum import crc32
from .format_error import FormatError, Reason
from .header import decode_header

FLAG_MAC = 0x0001
MAC_SIZE = 32
MIN_KEY_BYTES = 32
MAX_KEY_BYTES = 4096
KEY_ID_HEX = 16
FENCED_KEY_ID = "mac_key_id"
MANIFEST_MAC_FIELD = "mac"
_FLAGS_AT = 10
_HEADER_LENGTH_AT = 12
_MIN_CHUNK = 148  # fixed header and header checksum: the least a seal touches
_MAC_HEX = re.compile(r"[0-9a-f]{64}")


class KeyFileError(ValueError):
    """A key file the tier refuses: names the file and the problem."""


def load_key(path: str, store: str | None = None) -> bytes:
    """The secret key in ``path``, after the checks ssh makes of a private
    key: a regular file (not a symlink), owned by this user, no group or
    other permission bit, 32..4096 bytes; not inside the store folder
    ``store`` (whoever can write the store could read or swap it there),
    not all zero bytes. The file is opened without blocking and judged on
    the open descriptor, so a FIFO or anything swapped in after the first
    look is refused, never waited on (issue 45)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        raise KeyFileError(f"key file {path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise KeyFileError(f"key file {path} is a symlink: refused")
    _check_key_stat(path, st)
    if store:
        real, root = os.path.realpath(path), os.path.realpath(store)
        if real == root or real.startswith(root.rstrip("/") + "/"):
            raise KeyFileError(
                f"key file {path} is inside the store folder {store}: refused "
                "(keep it outside, where only the serving user can read it)"
            )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise KeyFileError(f"key file {path}: {e.strerror}") from None
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise KeyFileError(f"key file {path} changed while opened: refused")
        _check_key_stat(path, now)
        key = os.read(fd, MAX_KEY_BYTES + 1)
    finally:
        os.close(fd)
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise KeyFileError(f"key file {path} changed while read: refused")
    if not any(key):
        raise KeyFileError(
            f"key file {path} holds only zero bytes: refused (head -c 32 "
            "/dev/urandom makes a key)"
        )
    return key


def _check_key_stat(path: str, st: os.stat_result) -> None:
    mode = stat.S_IMODE(st.st_mode)
    if not stat.S_ISREG(st.st_mode):
        raise KeyFileError(f"key file {path} is not a regular file: refused")
    if mode & 0o077:
        raise KeyFileError(
            f"key file {path} has mode {mode:04o}: group/other may access it "
            "(chmod 600)"
        )
    if st.st_uid != os.geteuid():
        raise KeyFileError(
            f"key file {path} is owned by uid {st.st_uid}, not the serving user "
            f"{os.geteuid()}"
        )
    if not MIN_KEY_BYTES <= st.st_size <= MAX_KEY_BYTES:
        raise KeyFileError(
            f"key file {path} holds {st.st_size} bytes: needs "
            f"{MIN_KEY_BYTES}..{MAX_KEY_BYTES}"
        )


def key_id(key: bytes) -> str:
    """What the namespace record fences: never the key, a keyed hash of a
    constant, so two keys give two namespaces."""
    return _mac(key, b"kvtier key id").hex()[:KEY_ID_HEX]


def fence_key(fenced: Mapping[str, Any], key: bytes | None) -> dict[str, Any]:
    """The fenced part with the key's id added; a keyless store's stays as
    it was, so its namespace hash does not change."""
    out = dict(fenced)
    if key is not None:
        out[FENCED_KEY_ID] = key_id(key)
    return out


def _mac(key: bytes, data: bytes | bytearray | memoryview) -> bytes:
    # The one-shot form runs in OpenSSL (SHA-NI where present); hmac.new with
    # hashlib.sha256 measured 15% slower (bench/mac_bench.py).
    return hmac.digest(key, data, "sha256")


def _set_flags(chunk: bytearray, flags: int) -> None:
    (header_length,) = struct.unpack_from("<I", chunk, _HEADER_LENGTH_AT)
    if not _MIN_CHUNK <= header_length <= len(chunk):
        raise FormatError(Reason.BAD_HEADER_LENGTH, f"header length {header_length}")
    struct.pack_into("<H", chunk, _FLAGS_AT, flags)
    end = header_length - 4
    struct.pack_into("<I", chunk, end, crc32(chunk[:end]))


def seal_chunk(key: bytes, chunk: bytes | bytearray | memoryview) -> bytes:
    """The plain chunk (an ``encode_chunk`` result) as its keyed file."""
    out = bytearray(chunk)
    _set_flags(out, FLAG_MAC)
    out += _mac(key, out)
    return bytes(out)


def is_sealed(data: bytes | bytearray | memoryview) -> bool:
    """Whether a file's first bytes carry the MAC flag (no other check)."""
    if len(data) < _FLAGS_AT + 2:
        return False
    (flags,) = struct.unpack_from("<H", data, _FLAGS_AT)
    return bool(flags & FLAG_MAC)


def open_chunk(key: bytes, data: bytes | bytearray | memoryview) -> bytearray:
    """The plain chunk of a keyed file, the MAC checked before any byte is
    parsed; ``mac_missing`` for a keyless file (never accepted with a key),
    ``mac_mismatch`` for a wrong MAC (a forgery, another key, or rot)."""
    buf = memoryview(data).cast("B")
    if not is_sealed(buf):
        raise FormatError(Reason.MAC_MISSING, "chunk has no MAC; the store is keyed")
    if len(buf) < _MIN_CHUNK + MAC_SIZE:
        raise FormatError(Reason.TRUNCATED, f"{len(buf)} bytes, too short for a MAC")
    body, tag = buf[:-MAC_SIZE], buf[-MAC_SIZE:]
    if not hmac.compare_digest(_mac(key, body), bytes(tag)):
        raise FormatError(Reason.MAC_MISMATCH, "chunk MAC differs")
    out = bytearray(body)  # the one copy: the flag is cleared in it
    _set_flags(out, 0)
    return out


def plain_header_bytes(head: bytes | bytearray, file_size: int) -> bytearray:
    """A keyed file's first bytes as the plain header they seal (flag
    cleared, header checksum redone), the MAC unchecked: what a reader that
    does not read the payload (the writer's dedup) can know. ``mac_missing``
    without the flag, ``truncated`` when there is no room for a MAC."""
    if not is_sealed(head):
        raise FormatError(Reason.MAC_MISSING, "chunk has no MAC; the store is keyed")
    if file_size < _MIN_CHUNK + MAC_SIZE:
        raise FormatError(Reason.TRUNCATED, f"{file_size} bytes, too short for a MAC")
    out = bytearray(head[: file_size - MAC_SIZE])
    # The header's own checksum (over the flag as set) is what catches rot
    # without the key: one that fails it gets the plain reader's verdict.
    (header_length,) = struct.unpack_from("<I", out, _HEADER_LENGTH_AT)
    if _MIN_CHUNK <= header_length <= len(out):
        (stored,) = struct.unpack_from("<I", out, header_length - 4)
        if crc32(out[: header_length - 4]) != stored:
            decode_header(out)  # raises: steps 1-7 on the bytes as they are
    _set_flags(out, 0)
    return out


def seal_header(key: bytes, header: bytes | bytearray) -> tuple[bytes, Any]:
    """A plain encoded header as a sealed file's, and the running HMAC over
    it: the writer feeds it the payload (``update``) and appends ``digest()``."""
    out = bytearray(header)
    _set_flags(out, FLAG_MAC)
    running = hmac.new(key, out, "sha256")
    return bytes(out), running


def _manifest_body(manifest: Mapping[str, Any]) -> bytes:
    # Imported here: canonical_json is the codec's, mac.py stays importable alone.
    from .canonical_json import canonical_json

    return canonical_json({k: v for k, v in manifest.items() if k != "mac"})


def seal_manifest(key: bytes, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest object with ``mac``: the hex HMAC of its canonical JSON
    without that field."""
    out = dict(manifest)
    out[MANIFEST_MAC_FIELD] = _mac(key, _manifest_body(manifest)).hex()
    return out


def open_manifest(key: bytes, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest without ``mac``, after checking it (same reasons as
    ``open_chunk``)."""
    tag = manifest.get(MANIFEST_MAC_FIELD)
    if tag is None:
        raise FormatError(Reason.MAC_MISSING, "manifest has no mac; the store is keyed")
    # Bytes against bytes: compare_digest refuses a str that is not ASCII
    # (TypeError), and anything but 64 lowercase hex digits is no MAC of ours.
    if not isinstance(tag, str) or not _MAC_HEX.fullmatch(tag):
        raise FormatError(
            Reason.MAC_MISMATCH, "manifest mac is not 64 lowercase hex digits"
        )
    want = _mac(key, _manifest_body(manifest)).hex()
    if not hmac.compare_digest(want.encode("ascii"), tag.encode("ascii")):
        raise FormatError(Reason.MAC_MISMATCH, "manifest mac differs")
    return {k: v for k, v in manifest.items() if k != MANIFEST_MAC_FIELD}
