# SPDX-License-Identifier: Apache-2.0
"""Authenticated chunks and manifests (docs/FORMAT.md 3.6): the key's id
fenced in the namespace, the key file's checks, manifests under HMAC-SHA256,
chunks under the v3 seal (AES-GMAC, per-chunk subkey bound to the rank).

A sealed chunk is the plain chunk with flag bit 0 set in its header, its
version 3 (the header checksum recomputed), and a 32-byte trailer after the
payload: a random salt and the GMAC tag, over every byte before the trailer,
under HMAC-SHA256(key, "kvtier chunk mac v3" || salt || u32le(rank)). Stores
written before v3 hold v2 seals (version 2, an HMAC-SHA256 trailer): read,
never written. ``open_chunk`` checks the MAC before it parses anything and
gives back the plain chunk, so the unchanged reader (``verify_chunk``) checks
the rest; a keyless reader meets version 3 (or flags != 0) and refuses it.

Python's standard library has no AES: GMAC runs in the libcrypto this
Python's own ``_hashlib`` links (ctypes), loaded on first use, so a keyless
store never needs it. Production seals and checks chunks in the native
store library; this module is the write path kept for the fault-injection
tests, ``kvstore``'s and the restore's oracle, and the probe.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hmac
import os
import re
import stat
import struct
import threading
from collections.abc import Mapping
from typing import Any

from .checksum import crc32
from .format_error import FormatError, Reason
from .header import decode_header

FLAG_MAC = 0x0001
MAC_SIZE = 32  # the trailer: v3 salt || tag, or a v2 seal's HMAC
SALT_SIZE = 16
TAG_SIZE = 16
SEALED_VERSION = 3  # the v3 seal; the plain header it seals is version 2
_PLAIN_VERSION = 2
_SUBKEY_LABEL = b"kvtier chunk mac v3"
_VERSION_AT = 8
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


class MacUnavailable(RuntimeError):
    """No libcrypto with AES-256-GCM to check or make a v3 seal with."""


class _Crypto:
    """The few EVP calls GMAC needs, from the libcrypto ``_hashlib`` links
    (the one whose HMAC this module already uses), else the system's."""

    EVP_CTRL_GCM_GET_TAG = 0x10

    def __init__(self) -> None:
        lib = None
        for path in _libcrypto_candidates():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            if hasattr(lib, "EVP_aes_256_gcm"):
                break
            lib = None
        if lib is None:
            raise MacUnavailable(
                "keyed store: no libcrypto with AES-256-GCM could be loaded "
                "(tried the one Python's _hashlib links and "
                "ctypes.util.find_library('crypto')); install OpenSSL 3"
            )
        vp, cp, ip = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
        lib.EVP_CIPHER_CTX_new.restype = vp
        lib.EVP_CIPHER_CTX_new.argtypes = []
        lib.EVP_CIPHER_CTX_free.restype = None
        lib.EVP_CIPHER_CTX_free.argtypes = [vp]
        lib.EVP_aes_256_gcm.restype = vp
        lib.EVP_aes_256_gcm.argtypes = []
        lib.EVP_EncryptInit_ex.restype = ip
        lib.EVP_EncryptInit_ex.argtypes = [vp, vp, vp, cp, cp]
        lib.EVP_EncryptUpdate.restype = ip
        lib.EVP_EncryptUpdate.argtypes = [vp, vp, ctypes.POINTER(ip), vp, ip]
        lib.EVP_EncryptFinal_ex.restype = ip
        lib.EVP_EncryptFinal_ex.argtypes = [vp, cp, ctypes.POINTER(ip)]
        lib.EVP_CIPHER_CTX_ctrl.restype = ip
        lib.EVP_CIPHER_CTX_ctrl.argtypes = [vp, ip, ip, cp]
        self.lib = lib


def _libcrypto_candidates() -> list[str]:
    out: list[str] = []
    try:
        import _hashlib

        with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
            for line in f:
                path = line.split()[-1] if "/" in line else ""
                name = os.path.basename(path)
                if name.startswith("libcrypto.so") and path not in out:
                    out.append(path)
        del _hashlib
    except (ImportError, OSError):
        pass
    found = ctypes.util.find_library("crypto")
    if found:
        out.append(found)
    return out


_crypto: _Crypto | None = None
_crypto_lock = threading.Lock()


def _lib() -> Any:
    global _crypto
    with _crypto_lock:
        if _crypto is None:
            _crypto = _Crypto()
        return _crypto.lib


class Gmac:
    """AES-256-GCM with the bytes as additional data only, IV 0^96 (each
    subkey seals one message), fed in pieces; ``digest`` the 16-byte tag."""

    _PART = 1 << 30  # EVP lengths are ints

    def __init__(self, subkey: bytes) -> None:
        lib = _lib()
        self._lib = lib
        self._ctx = lib.EVP_CIPHER_CTX_new()
        if (
            not self._ctx
            or lib.EVP_EncryptInit_ex(
                self._ctx, lib.EVP_aes_256_gcm(), None, bytes(subkey), bytes(12)
            )
            != 1
        ):
            raise MacUnavailable("libcrypto refused AES-256-GCM")

    def __del__(self) -> None:
        if getattr(self, "_ctx", None):
            self._lib.EVP_CIPHER_CTX_free(self._ctx)
            self._ctx = None

    def update(self, data: bytes | bytearray | memoryview) -> None:
        out = ctypes.c_int(0)
        if isinstance(data, bytes) and len(data) <= self._PART:
            # ctypes passes a bytes object's own buffer: no copy.
            self._lib.EVP_EncryptUpdate(
                self._ctx, None, ctypes.byref(out), data, len(data)
            )
            return
        view = memoryview(data).cast("B")
        for at in range(0, len(view), self._PART):
            part = view[at : at + self._PART]
            if part.readonly:  # a copy only for read-only views
                self.update(bytes(part))
                continue
            buf = (ctypes.c_char * len(part)).from_buffer(part)
            self._lib.EVP_EncryptUpdate(
                self._ctx, None, ctypes.byref(out), ctypes.addressof(buf), len(part)
            )
            del buf

    def digest(self) -> bytes:
        out = ctypes.c_int(0)
        scratch = ctypes.create_string_buffer(16)
        tag = ctypes.create_string_buffer(TAG_SIZE)
        self._lib.EVP_EncryptFinal_ex(self._ctx, scratch, ctypes.byref(out))
        self._lib.EVP_CIPHER_CTX_ctrl(
            self._ctx, _Crypto.EVP_CTRL_GCM_GET_TAG, TAG_SIZE, tag
        )
        return tag.raw


def chunk_subkey(key: bytes, salt: bytes, rank: int) -> bytes:
    """The v3 seal's AES-256 key of one chunk: HMAC-SHA256(key, "kvtier
    chunk mac v3" || salt || u32le(rank))."""
    if len(salt) != SALT_SIZE:
        raise ValueError(f"salt of {len(salt)} bytes, needs {SALT_SIZE}")
    return _mac(key, _SUBKEY_LABEL + bytes(salt) + struct.pack("<I", rank))


class ChunkSealer:
    """The v3 seal of one file: fed the sealed header, then the payload;
    ``digest`` the 32-byte trailer (salt || tag)."""

    def __init__(self, key: bytes, rank: int, salt: bytes | None = None) -> None:
        self.salt = os.urandom(SALT_SIZE) if salt is None else bytes(salt)
        self._gmac = Gmac(chunk_subkey(key, self.salt, rank))

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._gmac.update(data)

    def digest(self) -> bytes:
        return self.salt + self._gmac.digest()


def _set_header(chunk: bytearray, version: int | None, flags: int) -> None:
    (header_length,) = struct.unpack_from("<I", chunk, _HEADER_LENGTH_AT)
    if not _MIN_CHUNK <= header_length <= len(chunk):
        raise FormatError(Reason.BAD_HEADER_LENGTH, f"header length {header_length}")
    if version is not None:
        struct.pack_into("<H", chunk, _VERSION_AT, version)
    struct.pack_into("<H", chunk, _FLAGS_AT, flags)
    end = header_length - 4
    struct.pack_into("<I", chunk, end, crc32(chunk[:end]))


def _unseal(chunk: bytearray) -> None:
    """Flag cleared, a v3 seal's version back to the 2 it seals."""
    (version,) = struct.unpack_from("<H", chunk, _VERSION_AT)
    _set_header(chunk, _PLAIN_VERSION if version == SEALED_VERSION else None, 0)


def seal_chunk(
    key: bytes,
    chunk: bytes | bytearray | memoryview,
    *,
    rank: int,
    salt: bytes | None = None,
) -> bytes:
    """The plain chunk (an ``encode_chunk`` result) as rank ``rank``'s keyed
    file, v3 seal (``salt`` random unless given: vectors fix it)."""
    out = bytearray(chunk)
    _set_header(out, SEALED_VERSION, FLAG_MAC)
    sealer = ChunkSealer(key, rank, salt)
    sealer.update(out)
    out += sealer.digest()
    return bytes(out)


def seal_chunk_v2(key: bytes, chunk: bytes | bytearray | memoryview) -> bytes:
    """The v2 seal (HMAC-SHA256 over the rest, no rank) stores written
    before v3 hold: for tests and vectors, never written by the tier."""
    out = bytearray(chunk)
    _set_header(out, None, FLAG_MAC)
    out += _mac(key, out)
    return bytes(out)


def is_sealed(data: bytes | bytearray | memoryview) -> bool:
    """Whether a file's first bytes carry the MAC flag (no other check)."""
    if len(data) < _FLAGS_AT + 2:
        return False
    (flags,) = struct.unpack_from("<H", data, _FLAGS_AT)
    return bool(flags & FLAG_MAC)


def _chunk_mac_matches(key: bytes, rank: int, body: memoryview, tag: bytes) -> bool:
    (version,) = struct.unpack_from("<H", body, _VERSION_AT)
    if version == SEALED_VERSION:
        gmac = Gmac(chunk_subkey(key, tag[:SALT_SIZE], rank))
        gmac.update(body)
        return hmac.compare_digest(gmac.digest(), tag[SALT_SIZE:])
    if version in (1, 2):
        return hmac.compare_digest(_mac(key, body), tag)
    raise FormatError(
        Reason.MAC_MISMATCH,
        f"sealed chunk of format version {version}: no MAC this reader knows",
    )


def open_chunk(
    key: bytes, data: bytes | bytearray | memoryview, *, rank: int
) -> bytearray:
    """The plain chunk of a keyed file of rank ``rank``'s store, the MAC
    checked before any byte is parsed (a v3 seal, or a v2 seal of an older
    store); ``mac_missing`` for a keyless file (never accepted with a key),
    ``mac_mismatch`` for a wrong MAC (a forgery, another key or rank, or
    rot)."""
    buf = memoryview(data).cast("B")
    if not is_sealed(buf):
        raise FormatError(Reason.MAC_MISSING, "chunk has no MAC; the store is keyed")
    if len(buf) < _MIN_CHUNK + MAC_SIZE:
        raise FormatError(Reason.TRUNCATED, f"{len(buf)} bytes, too short for a MAC")
    tag = bytes(buf[-MAC_SIZE:])
    out = bytearray(buf[:-MAC_SIZE])  # the one copy: MAC'd, then unsealed in place
    if not _chunk_mac_matches(key, rank, memoryview(out), tag):
        raise FormatError(Reason.MAC_MISMATCH, "chunk MAC differs")
    _unseal(out)
    return out


def plain_header_bytes(head: bytes | bytearray, file_size: int) -> bytearray:
    """A keyed file's first bytes as the plain header they seal (flag
    cleared, a v3 seal's version back to 2, header checksum redone), the MAC
    unchecked: what a reader that does not read the payload (the writer's
    dedup) can know. ``mac_missing`` without the flag, ``truncated`` when
    there is no room for a MAC."""
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
            rotten = bytearray(out)
            (version,) = struct.unpack_from("<H", rotten, _VERSION_AT)
            if version == SEALED_VERSION:  # named by its checksum, not step 2
                struct.pack_into("<H", rotten, _VERSION_AT, _PLAIN_VERSION)
            decode_header(rotten)  # raises: steps 1-7 on the bytes as they are
    _unseal(out)
    return out


def seal_header(
    key: bytes, header: bytes | bytearray, *, rank: int
) -> tuple[bytes, ChunkSealer]:
    """A plain encoded header as rank ``rank``'s sealed file's (v3), and the
    running seal over it: the writer feeds it the payload (``update``) and
    appends ``digest()`` (salt || tag)."""
    out = bytearray(header)
    _set_header(out, SEALED_VERSION, FLAG_MAC)
    running = ChunkSealer(key, rank)
    running.update(out)
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
