# SPDX-License-Identifier: Apache-2.0
"""The binding: libkvtier_store.so (storeio/include/kvtier/store_abi.h)
through ctypes, declared once here: the structs, one table of signatures and
one result helper (``call``) for every call that fills a kvtier_result.

A ctypes call releases the GIL for its whole duration, and the library runs
its own threads, so the engine thread never waits on per-byte work. The file
``library_path`` finds must be of ``ABI_VERSION`` and ``LIBRARY_VERSION``, or
``load`` raises ``NativeLibraryError`` and the caller refuses to start: there
is no fallback. Standard library only: it runs inside vLLM.
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

from .format_error import FormatError, KeyFileError, Reason
from .segment import Segment

ENV_LIBRARY = "KVTIER_STORE_LIB"
LIBRARY_NAME = "libkvtier_store.so"
ABI_VERSION = 7  # KVTIER_STORE_ABI_VERSION (7: the read queue)
LIBRARY_VERSION = "0.1.0"  # the repository's VERSION (a test keeps them equal)

# KVTIER_OK, KVTIER_E_*: the status class; an item's reason is the finer name.
OK, E_FORMAT, E_MISMATCH, E_MISSING, E_IO, E_NO_SPACE, E_ARGUMENT = range(7)
E_SKIPPED, E_UNSAFE = 7, 8
READ_STOP_ON_FAILURE, READ_WILLNEED, READ_SAFE_FOLDERS = 1, 2, 4
WRITE_GROUP_READ = 1  # files 0640, not 0600
OPEN_REGULAR, OPEN_WALK = 1, 2  # kvtier_open's options
FAULT_NONE, FAULT_WRITE, FAULT_SYNC, FAULT_RENAME, FAULT_DIR_SYNC, FAULT_READ = range(6)

_CTYPES = "u8:uint8 u16:uint16 u32:uint32 u64:uint64 i32:int32 i64:int64 size:size_t f64:double"
_TYPES: dict[str, Any] = {
    k: getattr(ctypes, "c_" + v) for k, v in (t.split(":") for t in _CTYPES.split())
}
# "str" is also a const uint8_t*: bytes pass as they are.
_TYPES.update(str=ctypes.c_char_p, ptr=ctypes.c_void_p, char=ctypes.c_char, void=None)


def _type(token: str) -> Any:
    """``u64``, ``u64*6`` (an array of 6) or ``&SegmentEntry`` (a pointer)."""
    if token.startswith("&"):
        return ctypes.POINTER(_TYPES.get(token[1:]) or globals()[token[1:]])
    name, _, count = token.partition("*")
    return _TYPES[name] * int(count) if count else _TYPES[name]


def _fields(spec: str) -> list[tuple[str, Any]]:
    """A struct's ``_fields_`` from store_abi.h's "field type" pairs, in order."""
    w = spec.split()
    return [(f, _type(t)) for f, t in zip(w[::2], w[1::2], strict=True)]


_OUT = "status i32 sys_errno i32"
_TEXT = "reason char*40 message char*256"  # KVTIER_REASON_BYTES, _MESSAGE_BYTES
_MAC = "mac_key str mac_key_length u32 mac_rank u32"


class Run(ctypes.Structure):  # kvtier_run
    _fields_ = _fields("address u64 length u64")


class SegmentEntry(ctypes.Structure):  # kvtier_segment
    _fields_ = _fields(
        "layer u32 kind u8 dtype u8 ndim u8 part u8 offset u64 length u64"
        " shape u64*6 stride u64*6"
    )


class ReadItem(ctypes.Structure):  # kvtier_read_item
    _fields_ = _fields(
        "path str fd i32 group u32 namespace_hash str key_hash str"
        " key_hash_length u32 num_segments u32 boundary u64 payload_length u64"
        " payload_checksum u32 num_runs u32 segments &SegmentEntry runs &Run"
        f" {_MAC} {_OUT} bytes_read u64 {_TEXT}"
    )


class WriteItem(ctypes.Structure):  # kvtier_write_item
    _fields_ = _fields(
        "path str group u32 key_hash_length u32 namespace_hash str key_hash str"
        " boundary u64 payload_length u64 num_segments u32 num_runs u32"
        f" segments &SegmentEntry runs &Run {_MAC} {_OUT} payload_checksum u32"
        f" header_length u32 file_size u64 {_TEXT}"
    )


class CResult(ctypes.Structure):  # kvtier_result
    _fields_ = _fields(f"{_OUT} data ptr length u64 {_TEXT}")


class Header(ctypes.Structure):  # kvtier_chunk_header
    _fields_ = _fields(
        "format_version u16 checksum_algorithm u8 key_hash_length u8 group u32"
        " boundary u64 payload_length u64 payload_checksum u32 header_length u32"
        " num_segments u32 reserved u32 namespace_hash u8*32 key_hash u8*64"
    )


# Every call: the return type, then the arguments (store_abi.h's order).
_IN, _KEY, _TABLE = "str size", "str u32", "&Header &SegmentEntry u32"
_SIGNATURES = {
    "kvtier_read_chunks": "i64 &ReadItem size u32 u32",
    "kvtier_read_queue_new": "ptr",
    "kvtier_read_queue_submit": "i64 ptr &ReadItem size u32 u32",
    "kvtier_read_queue_poll": "i32 ptr i64 &i64 &f64",
    "kvtier_read_queue_wait": "i32 ptr i64 i64 &i64 &f64",
    "kvtier_read_queue_cancel": "i32 ptr i64",
    "kvtier_read_queue_forget": "void ptr i64",
    "kvtier_read_queue_free": "void ptr",
    "kvtier_store_test_hold_reads": "void str",
    "kvtier_write_chunks": "i64 &WriteItem size u32 u32",
    "kvtier_open": "i32 str i32 u32 u32",
    "kvtier_free": "void ptr",
    "kvtier_store_test_fault": "void i32 i32 u32 u32",
    "kvtier_store_test_pace_reads": "void u64",
    # "res": returns its status and fills a kvtier_result (a last argument).
    "kvtier_manifest_encode": f"res {_IN} {_KEY}",
    "kvtier_manifest_decode": f"res {_IN} {_KEY}",
    "kvtier_namespace_record_encode": f"res {_IN}",
    "kvtier_namespace_record_decode": f"res {_IN}",
    "kvtier_namespace_hash": f"res {_IN} u32",
    "kvtier_canonical_json": f"res {_IN}",
    "kvtier_pending_record_encode": f"res {_IN}",
    "kvtier_pending_record_decode": f"res {_IN}",
    "kvtier_kept_manifests": f"res {_IN} u32",
    "kvtier_mac_key_id": f"res {_KEY}",
    "kvtier_read_chunk_header": f"res str u32 {_TABLE}",
    "kvtier_parse_chunk_header": f"res {_IN} {_TABLE}",
    "kvtier_encode_chunk_header": "res &Header &SegmentEntry",
    "kvtier_verify_chunk": f"res {_IN} {_KEY} u32 {_TABLE}",
    "kvtier_verify_chunk_file": f"res str u64 {_KEY} u32 {_TABLE}",
    "kvtier_open_chunk": f"res {_IN} {_KEY} u32",
    "kvtier_seal_chunk": f"res {_IN} {_KEY} u32 str u32",
    "kvtier_sanitize_model": f"res {_IN}",
    "kvtier_rank_base_name": f"res {_IN} {_IN} str u32",
    "kvtier_chunk_rel_path": f"res {_IN} u32",
    "kvtier_manifest_file_name": f"res u64 {_IN}",
    "kvtier_pending_file_name": "res u64 u64",
    "kvtier_temp_name": f"res {_IN} u64 u64",
    "kvtier_parse_name": f"res u32 {_IN}",
    "kvtier_load_key": "res str str",
}


class NativeLibraryError(RuntimeError):
    """libkvtier_store.so is missing, unloadable or of another version."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


def fit(value: int, bits: int) -> int:
    """``value`` as the ABI's unsigned field holds it; out of its range the
    field's maximum, which the codec then refuses as the value would be."""
    return value if 0 <= value < 1 << bits else (1 << bits) - 1


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _result(i: ReadItem | WriteItem, count: int, *written: int) -> Result:
    return Result(
        i.status, _text(i.reason), _text(i.message), i.sys_errno, count, *written
    )


@dataclass(frozen=True)
class ReadRequest:
    """One chunk file to read and verify, and where its payload goes."""

    group: int
    namespace_hash: bytes  # 32 bytes
    key_hash: bytes
    boundary: int
    payload_length: int
    payload_checksum: int
    segments: Sequence[Segment]
    runs: Sequence[tuple[int, int]]  # (address, length), in payload order
    path: str | None = None  # opened by the library (no link, regular only)
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
    codec and the restore use (truncated, wrong_key, no_space, ...)."""

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


def segment_table(segments: Sequence[Segment]) -> ctypes.Array:
    """kvtier_segment[] of a table (a value out of its field's range as
    ``fit`` gives it: the codec refuses it)."""
    out: ctypes.Array[SegmentEntry] = (SegmentEntry * max(1, len(segments)))()
    for e, seg in zip(out, segments, strict=False):
        if len(seg.shape) != len(seg.stride) or len(seg.shape) > len(e.shape):
            raise FormatError(Reason.BAD_SEGMENT_TABLE, "shape/stride rank")
        if not 0 <= seg.part <= 255:
            raise FormatError(Reason.BAD_SEGMENT_TABLE, f"part {seg.part}")
        e.layer, e.kind = fit(seg.layer, 32), fit(seg.kind, 8)
        e.dtype, e.ndim, e.part = fit(seg.dtype, 8), len(seg.shape), seg.part
        e.offset, e.length = fit(seg.offset, 64), fit(seg.length, 64)
        for i, (d, s) in enumerate(zip(seg.shape, seg.stride, strict=True)):
            e.shape[i], e.stride[i] = fit(d, 64), fit(s, 64)
    return out


# id(table) -> (table, its kvtier_segment[]): a promotion passes the same few
# tables for every file, so each is converted once (the entry keeps the table
# alive, so its id is not reused while cached). Bounded, cleared when full.
_ARRAYS: dict[int, tuple[Sequence[Segment], ctypes.Array]] = {}
_ARRAYS_LOCK = threading.Lock()


def _segment_array(segments: Sequence[Segment]) -> ctypes.Array:
    with _ARRAYS_LOCK:
        hit = _ARRAYS.get(id(segments))
        if hit is None or hit[0] is not segments:
            if len(_ARRAYS) >= 64:
                _ARRAYS.clear()
            hit = _ARRAYS[id(segments)] = (segments, segment_table(segments))
        return hit[1]


def _items(
    kind: type[ReadItem] | type[WriteItem],
    requests: Sequence[ReadRequest] | Sequence[WriteRequest],
    key: bytes | None,
    rank: int,
) -> tuple[ctypes.Array, list[array]]:
    """The items of one call, and the runs arrays they point into (kept
    until the call returns)."""
    items = (kind * max(1, len(requests)))()
    keep = []
    for i, r in enumerate(requests):
        item: ReadItem | WriteItem = items[i]
        flat = array("Q", itertools.chain.from_iterable(r.runs)) or array("Q", [0])
        keep.append(flat)
        item.path = None if r.path is None else os.fsencode(r.path)
        item.mac_key, item.mac_key_length, item.mac_rank = key, len(key or b""), rank
        item.group, item.boundary = r.group, r.boundary
        item.namespace_hash, item.key_hash = bytes(r.namespace_hash), bytes(r.key_hash)
        item.key_hash_length, item.payload_length = len(r.key_hash), r.payload_length
        item.num_segments, item.num_runs = len(r.segments), len(r.runs)
        item.segments = _segment_array(r.segments)
        item.runs = ctypes.cast(flat.buffer_info()[0], ctypes.POINTER(Run))
        if kind is ReadItem:
            item.fd, item.payload_checksum = r.fd, r.payload_checksum
    return items, keep


def _run(lib: Library, name: str, items: ctypes.Array, *args: int) -> None:
    """kvtier_read_chunks or kvtier_write_chunks on ``items``."""
    if getattr(lib.fn, name)(items, *args) < 0:
        raise ValueError(f"{lib.path}: {name} refused its arguments")


def read_flags(stop_on_failure: bool, willneed: bool, safe_folders: bool) -> int:
    return (
        (READ_STOP_ON_FAILURE if stop_on_failure else 0)
        | (READ_WILLNEED if willneed else 0)
        | (READ_SAFE_FOLDERS if safe_folders else 0)
    )


class PreparedRead:
    """One kvtier_read_chunks call's items (``Library.prepare_read``)."""

    def __init__(
        self,
        lib: Library,
        requests: Sequence[ReadRequest],
        key: bytes | None,
        rank: int,
    ):
        self._lib, self._count = lib, len(requests)
        self._items, self._runs = _items(ReadItem, requests, key, rank)

    def run(
        self,
        threads: int,
        stop_on_failure: bool = False,
        willneed: bool = False,
        safe_folders: bool = False,
    ) -> None:
        """The call itself on ``threads`` threads (the GIL released for all of
        it); ``willneed``: fadvise each payload first."""
        flags = read_flags(stop_on_failure, willneed, safe_folders)
        _run(self._lib, "kvtier_read_chunks", self._items, self._count, threads, flags)

    def results(self) -> list[Result]:
        """One Result per request, in order (after ``run``)."""
        return [_result(i, i.bytes_read) for i in self._items[: self._count]]


class Library:
    """A loaded, version-checked libkvtier_store.so; ``fn``: its typed calls."""

    def __init__(self, path: str):
        self.path = path
        if not os.path.isfile(path):
            raise NativeLibraryError(
                path, "no such file (build or bake libkvtier_store.so)"
            )
        try:
            fn = ctypes.CDLL(path)
        except OSError as e:
            raise NativeLibraryError(path, f"cannot be loaded: {e}") from e
        try:
            fn.kvtier_store_abi_version.restype = ctypes.c_uint32
            fn.kvtier_store_library_version.restype = ctypes.c_char_p
            self.abi = fn.kvtier_store_abi_version()
            self.version = _text(fn.kvtier_store_library_version() or b"")
        except AttributeError as e:
            raise NativeLibraryError(path, f"not a kvtier store library: {e}") from e
        if self.abi != ABI_VERSION:
            raise NativeLibraryError(
                path, f"ABI version {self.abi}, this overlay needs {ABI_VERSION}"
            )
        if self.version != LIBRARY_VERSION:
            raise NativeLibraryError(
                path,
                f"library version {self.version!r}, this overlay needs {LIBRARY_VERSION!r}",
            )
        for name, spec in _SIGNATURES.items():
            f, types = getattr(fn, name), spec.split()
            if types[0] == "res":
                types = ["i32", *types[1:], "&CResult"]
            f.restype, f.argtypes = _type(types[0]), [_type(t) for t in types[1:]]
        self.fn = fn

    def call(self, name: str, *args: Any) -> bytes:
        """A call that fills a kvtier_result: its output bytes, or its verdict
        raised (FormatError, OSError for a file, ValueError for an argument)."""
        out = CResult()
        status = getattr(self.fn, name)(*args, ctypes.byref(out))
        data = ctypes.string_at(out.data, out.length) if out.data else b""
        self.fn.kvtier_free(out.data)
        if status == OK:
            return data
        reason, message = out.reason.decode("ascii", "replace"), _text(out.message)
        if status == E_FORMAT and reason in Reason._value2member_map_:
            raise FormatError(Reason(reason), message)
        if status in (E_MISSING, E_IO) and out.sys_errno:
            raise OSError(out.sys_errno, message)
        if status == E_ARGUMENT:
            raise ValueError(message)
        if reason == "unsafe_key_file":  # the whole refusal is in data
            raise KeyFileError(_text(data))
        raise RuntimeError(f"{name}: {reason}: {message}")

    def prepare_read(
        self, requests: Sequence[ReadRequest], key: bytes | None = None, rank: int = 0
    ) -> PreparedRead:
        """The items of one read call (read and verify every request; ``key``:
        a keyed store's secret, every MAC checked, the v3 seal binding
        ``rank``, whose store the files are in), built now; ``PreparedRead.run``
        is then the call alone, or ``read_queue.ReadQueue.submit`` queues it
        (the restore builds on the step's thread and queues it there: no
        Python thread waits). A failed item's memory is garbage."""
        return PreparedRead(self, requests, key, rank)

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
        with group_read. ``key``: sealed for a keyed store (FORMAT.md 3.6,
        the v3 seal bound to ``rank``, the writing rank; ``bytes`` counts it)."""
        items, _runs = _items(WriteItem, requests, key, rank)  # _runs: for the call
        flags = WRITE_GROUP_READ if group_read else 0
        _run(self, "kvtier_write_chunks", items, len(requests), threads, flags)
        return [
            _result(i, i.file_size, i.payload_checksum, i.header_length)
            for i in items[: len(requests)]
        ]

    def supports_mac(self) -> bool:
        """Whether this build seals and checks MACs (it links libcrypto)."""
        probe = ReadRequest(0, bytes(32), b"", 0, 0, 0, (), (), path="/")
        read = self.prepare_read([probe], key=b"\0" * 32)
        read.run(1)
        return "OpenSSL" not in read.results()[0].message

    def test_fault(self, op: int, err: int = 0, skip: int = 0, count: int = 0) -> None:
        """Tests only: the next ``count`` ops of kind ``op`` after ``skip``
        fail with ``err``; ``test_fault(FAULT_NONE)`` clears."""
        self.fn.kvtier_store_test_fault(op, err, skip, count)

    def test_hold_reads(self, prefix: str | None) -> None:
        """Tests only: a queued read whose first file's path starts with
        ``prefix`` waits, running, before it opens anything; None releases."""
        self.fn.kvtier_store_test_hold_reads(
            None if prefix is None else os.fsencode(prefix)
        )

    def test_pace_reads(self, bytes_per_second: int) -> None:
        """Benchmarks and the GPU suite only: this process's payload reads
        paced to ``bytes_per_second`` in all (0: as fast as they come)."""
        self.fn.kvtier_store_test_pace_reads(bytes_per_second)


def library_path(environ: Mapping[str, str] | None = None) -> str:
    """KVTIER_STORE_LIB; else the library beside this file (a bake or the
    image put it there); else the installed kvtier wheel's (`pip install
    kvtier && overlay apply`: the apply copies no binary), found without
    importing it."""
    env = os.environ if environ is None else environ
    if env.get(ENV_LIBRARY):
        return env[ENV_LIBRARY]
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
# (KVTIER_STORE_LIB as last seen, its library): load() looks for the file (a
# stat) each time; a codec or name call should not.
_LAST: tuple[str | None, Library] | None = None


def load(path: str | None = None) -> Library:
    """The library at ``path`` (default ``library_path()``), loaded once per
    path; raises NativeLibraryError naming the file when it cannot be used."""
    path = library_path() if path is None else path
    with _LOCK:
        lib = _LOADED.get(path)
        if lib is None:
            lib = _LOADED[path] = Library(path)
        return lib


def current() -> Library:
    """The library ``load()`` finds, kept until KVTIER_STORE_LIB changes."""
    global _LAST
    chosen, last = os.environ.get(ENV_LIBRARY), _LAST
    if last is None or last[0] != chosen:
        last = _LAST = (chosen, load())
    return last[1]


def call(name: str, *args: Any) -> bytes:
    """``Library.call`` on the current library."""
    return current().call(name, *args)
