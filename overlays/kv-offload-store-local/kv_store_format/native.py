# SPDX-License-Identifier: Apache-2.0
"""The store's data path in C++: libkvtier_store.so through ctypes.

The chunk reads of a restore and the chunk writes of the writer run in the
C++ ``format/`` codec behind the C ABI of storeio/include/kvtier/store_abi.h.
A ctypes call releases the GIL for its whole duration, and the library runs
its own threads, so neither the engine thread nor the other Python threads
wait on the per-byte work.

Which file: ``KVTIER_STORE_LIB`` (a path to the .so) when set, else
``libkvtier_store.so`` beside this module (where the image bakes it). The
library's ABI and library versions must equal ``ABI_VERSION`` and
``LIBRARY_VERSION``; anything else raises ``NativeLibraryError`` naming the
file, and the caller refuses to start: there is no fallback to the Python
codec (which stays as a test oracle: tests/python/store/test_store_native.py).

Standard library only: it runs inside vLLM.
"""

from __future__ import annotations

import ctypes
import importlib.util
import itertools
import os
import threading
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .constants import MAX_NDIM
from .segment import Segment

ENV_LIBRARY = "KVTIER_STORE_LIB"
LIBRARY_NAME = "libkvtier_store.so"
ABI_VERSION = 5  # KVTIER_STORE_ABI_VERSION (2: keyed stores; 3: READ_SAFE_FOLDERS;
# 4: mac_rank, the v3 seal; 5: the record calls)
LIBRARY_VERSION = "0.1.0"  # the repository's VERSION (a test keeps them equal)

# Status classes (KVTIER_OK, KVTIER_E_*): the reason string is the finer name.
OK = 0
E_FORMAT = 1
E_MISMATCH = 2
E_MISSING = 3
E_IO = 4
E_NO_SPACE = 5
E_ARGUMENT = 6
E_SKIPPED = 7
E_UNSAFE = 8  # unsafe_folder (READ_SAFE_FOLDERS)

READ_STOP_ON_FAILURE = 1
READ_WILLNEED = 2
READ_SAFE_FOLDERS = 4  # a chunk file's two folders checked before its open
WRITE_GROUP_READ = 1  # kvtier_write_chunks: files 0640, not 0600

FAULT_NONE = 0
FAULT_WRITE = 1
FAULT_SYNC = 2
FAULT_RENAME = 3
FAULT_DIR_SYNC = 4
FAULT_READ = 5

_REASON_BYTES = 40
_MESSAGE_BYTES = 256


class NativeLibraryError(RuntimeError):
    """libkvtier_store.so is missing, unloadable or of another version."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class _Run(ctypes.Structure):
    _fields_ = [("address", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class _Segment(ctypes.Structure):
    _fields_ = [
        ("layer", ctypes.c_uint32),
        ("kind", ctypes.c_uint8),
        ("dtype", ctypes.c_uint8),
        ("ndim", ctypes.c_uint8),
        ("part", ctypes.c_uint8),
        ("offset", ctypes.c_uint64),
        ("length", ctypes.c_uint64),
        ("shape", ctypes.c_uint64 * MAX_NDIM),
        ("stride", ctypes.c_uint64 * MAX_NDIM),
    ]


class _ReadItem(ctypes.Structure):
    _fields_ = [
        ("path", ctypes.c_char_p),
        ("fd", ctypes.c_int32),
        ("group", ctypes.c_uint32),
        ("namespace_hash", ctypes.c_char_p),
        ("key_hash", ctypes.c_char_p),
        ("key_hash_length", ctypes.c_uint32),
        ("num_segments", ctypes.c_uint32),
        ("boundary", ctypes.c_uint64),
        ("payload_length", ctypes.c_uint64),
        ("payload_checksum", ctypes.c_uint32),
        ("num_runs", ctypes.c_uint32),
        ("segments", ctypes.POINTER(_Segment)),
        ("runs", ctypes.POINTER(_Run)),
        ("mac_key", ctypes.c_char_p),
        ("mac_key_length", ctypes.c_uint32),
        ("mac_rank", ctypes.c_uint32),
        ("status", ctypes.c_int32),
        ("sys_errno", ctypes.c_int32),
        ("bytes_read", ctypes.c_uint64),
        ("reason", ctypes.c_char * _REASON_BYTES),
        ("message", ctypes.c_char * _MESSAGE_BYTES),
    ]


class _WriteItem(ctypes.Structure):
    _fields_ = [
        ("path", ctypes.c_char_p),
        ("group", ctypes.c_uint32),
        ("key_hash_length", ctypes.c_uint32),
        ("namespace_hash", ctypes.c_char_p),
        ("key_hash", ctypes.c_char_p),
        ("boundary", ctypes.c_uint64),
        ("payload_length", ctypes.c_uint64),
        ("num_segments", ctypes.c_uint32),
        ("num_runs", ctypes.c_uint32),
        ("segments", ctypes.POINTER(_Segment)),
        ("runs", ctypes.POINTER(_Run)),
        ("mac_key", ctypes.c_char_p),
        ("mac_key_length", ctypes.c_uint32),
        ("mac_rank", ctypes.c_uint32),
        ("status", ctypes.c_int32),
        ("sys_errno", ctypes.c_int32),
        ("payload_checksum", ctypes.c_uint32),
        ("header_length", ctypes.c_uint32),
        ("file_size", ctypes.c_uint64),
        ("reason", ctypes.c_char * _REASON_BYTES),
        ("message", ctypes.c_char * _MESSAGE_BYTES),
    ]


@dataclass(frozen=True)
class ReadRequest:
    """One chunk file to read and verify: what the manifest entry and this
    boot's layout expect, and where its payload goes."""

    group: int
    namespace_hash: bytes  # 32 bytes
    key_hash: bytes
    boundary: int
    payload_length: int
    payload_checksum: int
    segments: Sequence[Segment]
    runs: Sequence[tuple[int, int]]  # (address, length), in payload order
    path: str | None = None  # opened by the library (O_NOFOLLOW, regular only)
    fd: int = -1  # or an open descriptor the caller keeps


@dataclass(frozen=True)
class WriteRequest:
    """One chunk file to write durably from memory runs."""

    path: str  # final path; the folder must exist
    group: int
    namespace_hash: bytes
    key_hash: bytes
    boundary: int
    segments: Sequence[Segment]
    runs: Sequence[tuple[int, int]]  # the payload, in payload order

    @property
    def payload_length(self) -> int:
        return sum(n for _, n in self.runs)


@dataclass(frozen=True)
class Result:
    """One item's outcome. ``reason`` is "" when ``ok``; else the name the
    Python codec and the restore use (truncated, wrong_key, no_space, ...)."""

    status: int
    reason: str
    message: str
    sys_errno: int
    bytes: int  # payload bytes read (reads) or file size (writes)
    payload_checksum: int = 0  # writes: the CRC-32 in the header
    header_length: int = 0  # writes

    @property
    def ok(self) -> bool:
        return self.status == OK


def _segments(segments: Sequence[Segment]) -> ctypes.Array:
    out: ctypes.Array[_Segment] = (_Segment * max(1, len(segments)))()
    for dst, seg in zip(out, segments, strict=False):
        dst.layer = seg.layer
        dst.kind = int(seg.kind)
        dst.dtype = int(seg.dtype)
        dst.ndim = len(seg.shape)
        dst.part = seg.part
        dst.offset = seg.offset
        dst.length = seg.length
        for i, d in enumerate(seg.shape):
            dst.shape[i] = d
        for i, s in enumerate(seg.stride):
            dst.stride[i] = s
    return out


def _runs(runs: Sequence[tuple[int, int]]) -> tuple[array, Any]:
    """The runs as kvtier_run[] (two uint64 each), built at C speed; the
    array must outlive the call."""
    flat = array("Q", itertools.chain.from_iterable(runs))
    if not flat:
        flat.append(0)
    return flat, ctypes.cast(flat.buffer_info()[0], ctypes.POINTER(_Run))


class _SegmentCache:
    """kvtier_segment[] per segment table: a promotion passes the same few
    tables (one per group and sub-block count) for every file, so each is
    converted once. Keyed by the table object, which the cache keeps alive."""

    LIMIT = 64

    def __init__(self) -> None:
        self._arrays: dict[int, tuple[Sequence[Segment], ctypes.Array]] = {}
        self._lock = threading.Lock()

    def get(self, segments: Sequence[Segment]) -> ctypes.Array:
        with self._lock:
            hit = self._arrays.get(id(segments))
            if hit is not None and hit[0] is segments:
                return hit[1]
            if len(self._arrays) >= self.LIMIT:
                self._arrays.clear()
            converted = _segments(segments)
            self._arrays[id(segments)] = (segments, converted)
            return converted


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


class PreparedRead:
    """One kvtier_read_chunks call's items (``Library.prepare_read``)."""

    def __init__(
        self,
        lib: Library,
        items: ctypes.Array[_ReadItem],
        count: int,
        keep: list[object],
    ):
        self._lib = lib
        self._items: ctypes.Array[_ReadItem] = items
        self._count = count
        self._keep = keep  # the runs arrays the items point into

    def run(
        self,
        threads: int,
        stop_on_failure: bool = False,
        willneed: bool = False,
        safe_folders: bool = False,
    ) -> None:
        """The call itself (the GIL released for all of it)."""
        flags = (
            (READ_STOP_ON_FAILURE if stop_on_failure else 0)
            | (READ_WILLNEED if willneed else 0)
            | (READ_SAFE_FOLDERS if safe_folders else 0)
        )
        n = self._lib._lib.kvtier_read_chunks(self._items, self._count, threads, flags)
        if n < 0:
            raise ValueError(
                f"{self._lib.path}: kvtier_read_chunks refused its arguments"
            )

    def results(self) -> list[Result]:
        """One Result per request, in order (after ``run``)."""
        return [
            Result(
                item.status,
                _text(item.reason),
                _text(item.message),
                item.sys_errno,
                item.bytes_read,
            )
            for item in self._items[: self._count]
        ]


class Library:
    """A loaded, version-checked libkvtier_store.so."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise NativeLibraryError(
                path, "no such file (build or bake libkvtier_store.so)"
            )
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise NativeLibraryError(path, f"cannot be loaded: {e}") from e
        try:
            lib.kvtier_store_abi_version.restype = ctypes.c_uint32
            lib.kvtier_store_abi_version.argtypes = []
            lib.kvtier_store_library_version.restype = ctypes.c_char_p
            lib.kvtier_store_library_version.argtypes = []
            abi = lib.kvtier_store_abi_version()
            version = _text(lib.kvtier_store_library_version() or b"")
        except AttributeError as e:
            raise NativeLibraryError(path, f"not a kvtier store library: {e}") from e
        if abi != ABI_VERSION:
            raise NativeLibraryError(
                path, f"ABI version {abi}, this overlay needs {ABI_VERSION}"
            )
        if version != LIBRARY_VERSION:
            raise NativeLibraryError(
                path,
                f"library version {version!r}, this overlay needs {LIBRARY_VERSION!r}",
            )
        self.version = version
        self.abi = abi
        for name, item in (
            ("kvtier_read_chunks", _ReadItem),
            ("kvtier_write_chunks", _WriteItem),
        ):
            fn = getattr(lib, name)
            fn.restype = ctypes.c_int64
            fn.argtypes = [
                ctypes.POINTER(item),
                ctypes.c_size_t,
                ctypes.c_uint32,
                ctypes.c_uint32,
            ]
        lib.kvtier_store_test_pace_reads.restype = None
        lib.kvtier_store_test_pace_reads.argtypes = [ctypes.c_uint64]
        lib.kvtier_store_test_fault.restype = None
        lib.kvtier_store_test_fault.argtypes = [
            ctypes.c_int32,
            ctypes.c_int32,
            ctypes.c_uint32,
            ctypes.c_uint32,
        ]
        self._lib = lib
        self._segment_arrays = _SegmentCache()

    def read_chunks(
        self,
        requests: Sequence[ReadRequest],
        threads: int,
        stop_on_failure: bool = False,
        willneed: bool = False,
        key: bytes | None = None,
        safe_folders: bool = False,
        rank: int = 0,
    ) -> list[Result]:
        """Read and verify every request (one call, ``threads`` threads);
        one Result per request, in order. A failed item's memory is garbage.
        ``willneed``: fadvise each payload before reading it (a disk hint).
        ``key``: a keyed store's secret; every file's MAC is checked
        (mac_missing, mac_mismatch) before the item is OK; ``rank``: the
        rank whose store the files are in, which the v3 seal binds. ``safe_folders``:
        each path is a chunk file whose two folders must be safe
        (unsafe_folder otherwise; READ_SAFE_FOLDERS)."""
        read = self.prepare_read(requests, key, rank=rank)
        read.run(threads, stop_on_failure, willneed, safe_folders)
        return read.results()

    def prepare_read(
        self,
        requests: Sequence[ReadRequest],
        key: bytes | None = None,
        rank: int = 0,
    ) -> PreparedRead:
        """The items of one read call, built now; ``PreparedRead.run`` is then
        the call alone (the restore builds on the step's thread and runs on
        its promotion thread, which so needs the GIL only around the call)."""
        items: ctypes.Array[_ReadItem] = (_ReadItem * max(1, len(requests)))()
        keep: list[object] = []  # the arrays the items point into
        for item, r in zip(items, requests, strict=False):
            segments = self._segment_arrays.get(r.segments)
            flat, runs = _runs(r.runs)
            keep.append(flat)
            item.path = None if r.path is None else os.fsencode(r.path)
            item.fd = r.fd
            item.group = r.group
            item.namespace_hash = bytes(r.namespace_hash)
            item.key_hash = bytes(r.key_hash)
            item.key_hash_length = len(r.key_hash)
            item.num_segments = len(r.segments)
            item.boundary = r.boundary
            item.payload_length = r.payload_length
            item.payload_checksum = r.payload_checksum
            item.num_runs = len(r.runs)
            item.segments = segments
            item.runs = runs
            item.mac_key = key
            item.mac_key_length = len(key or b"")
            item.mac_rank = rank
        return PreparedRead(self, items, len(requests), keep)

    def write_chunks(
        self,
        requests: Sequence[WriteRequest],
        threads: int,
        group_read: bool = False,
        key: bytes | None = None,
        rank: int = 0,
    ) -> list[Result]:
        """Write every request durably (temp, fdatasync, rename, folder
        fsync); one Result per request, in order. Files are 0600, or 0640
        with group_read (store_perms.Modes.group_read). ``key``: sealed
        for a keyed store (FORMAT.md 3.6, the v3 seal, bound to ``rank``, the
        writing rank; ``bytes`` counts the MAC)."""
        items: ctypes.Array[_WriteItem] = (_WriteItem * max(1, len(requests)))()
        keep: list[object] = []
        for item, r in zip(items, requests, strict=False):
            segments = self._segment_arrays.get(r.segments)
            flat, runs = _runs(r.runs)
            keep.append(flat)
            item.path = os.fsencode(r.path)
            item.group = r.group
            item.key_hash_length = len(r.key_hash)
            item.namespace_hash = bytes(r.namespace_hash)
            item.key_hash = bytes(r.key_hash)
            item.boundary = r.boundary
            item.payload_length = r.payload_length
            item.num_segments = len(r.segments)
            item.num_runs = len(r.runs)
            item.segments = segments
            item.runs = runs
            item.mac_key = key
            item.mac_key_length = len(key or b"")
            item.mac_rank = rank
        flags = WRITE_GROUP_READ if group_read else 0
        n = self._lib.kvtier_write_chunks(items, len(requests), threads, flags)
        if n < 0:
            raise ValueError(f"{self.path}: kvtier_write_chunks refused its arguments")
        return [
            Result(
                item.status,
                _text(item.reason),
                _text(item.message),
                item.sys_errno,
                item.file_size,
                item.payload_checksum,
                item.header_length,
            )
            for item in items[: len(requests)]
        ]

    def supports_mac(self) -> bool:
        """Whether this build seals and checks MACs (it links libcrypto):
        a keyed item is refused as bad_argument before any file is opened
        when it does not."""
        probe = ReadRequest(0, bytes(32), b"", 0, 0, 0, (), (), path="/")
        (result,) = self.read_chunks([probe], 1, key=b"\0" * 32)
        return "OpenSSL" not in result.message

    def test_fault(self, op: int, err: int = 0, skip: int = 0, count: int = 0) -> None:
        """Tests only: the next ``count`` ops of kind ``op`` after ``skip``
        fail with ``err``; ``test_fault(FAULT_NONE)`` clears."""
        self._lib.kvtier_store_test_fault(op, err, skip, count)

    def test_pace_reads(self, bytes_per_second: int) -> None:
        """Benchmarks and the GPU suite only: every payload read of this
        process, all threads together, at most ``bytes_per_second`` (0: as
        fast as the files come)."""
        self._lib.kvtier_store_test_pace_reads(bytes_per_second)


def library_path(environ: Mapping[str, str] | None = None) -> str:
    """KVTIER_STORE_LIB; else the library beside this file (a bake or the
    image put it there); else the installed kvtier wheel's (`pip install
    kvtier && overlay apply`: the apply copies no binary). The wheel is found
    without importing it."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENV_LIBRARY)
    if chosen:
        return chosen
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)
    if os.path.exists(beside):
        return beside
    try:
        spec = importlib.util.find_spec("kvtier")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        wheel = os.path.join(
            os.path.dirname(spec.origin), "lib", "kvtier", LIBRARY_NAME
        )
        if os.path.exists(wheel):
            return wheel
    return beside  # missing: load() names the file it looked for


_LOADED: dict[str, Library] = {}
_LOCK = threading.Lock()


def load(path: str | None = None) -> Library:
    """The library at ``path`` (default ``library_path()``), loaded once per
    path; raises NativeLibraryError naming the file when it cannot be used."""
    path = library_path() if path is None else path
    with _LOCK:
        lib = _LOADED.get(path)
        if lib is None:
            lib = _LOADED[path] = Library(path)
        return lib
