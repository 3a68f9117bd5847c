# SPDX-License-Identifier: Apache-2.0
"""The store library's read queue (kvtier_read_queue_*, ABI 7): read calls
run in order on a thread of the library's own, so the restore starts, polls
and cancels them from the step's thread and no Python thread takes part in a
read (docs/overlays/kv-offload-store-local.md, "ABI 7")."""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

from . import native

QUEUED, RUNNING, DONE, CANCELLED, UNKNOWN = 0, 1, 2, 3, -1  # KVTIER_TICKET_*


def _free_queue(fn: Any, handle: int, live: dict) -> None:
    fn.kvtier_read_queue_free(handle)  # returns once no call runs
    live.clear()


class ReadQueue:
    """kvtier_read_queue: read calls run in order on the library's own thread.

    Submitting, polling and cancelling return at once, so no Python thread
    has to win the GIL to start or to end a read (a stepping engine thread
    can keep it for a whole promotion: docs/ENGINE-RUNS.md, run 38). The
    queue keeps each submitted call's items alive until the call ended."""

    def __init__(self, lib: native.Library):
        self._lib = lib
        handle = lib.fn.kvtier_read_queue_new()
        if not handle:
            raise native.NativeLibraryError(
                lib.path, "cannot start the read queue's thread"
            )
        self._handle: int | None = handle
        # Ticket -> its PreparedRead, until the call ended: the library
        # writes into the items meanwhile. The finalizer waits for the
        # running call before any of them can go.
        self._live: dict[int, native.PreparedRead] = {}
        self._free = weakref.finalize(self, _free_queue, lib.fn, handle, self._live)

    def submit(
        self,
        read: native.PreparedRead,
        threads: int,
        stop_on_failure: bool = False,
        willneed: bool = False,
        safe_folders: bool = False,
    ) -> QueuedRead:
        """Queue ``read`` (flags as ``PreparedRead.run``); ValueError if the
        library refuses the arguments or the queue is closed."""
        flags = native.read_flags(stop_on_failure, willneed, safe_folders)
        ticket = -1
        if self._handle is not None:
            ticket = self._lib.fn.kvtier_read_queue_submit(
                self._handle, read._items, read._count, threads, flags
            )
        if ticket < 0:
            raise ValueError(f"{self._lib.path}: the read queue refused a call")
        self._live[ticket] = read
        return QueuedRead(self, ticket)

    def _state(self, ticket: int, timeout: float | None) -> tuple[int, int, float]:
        bad, seconds = ctypes.c_int64(0), ctypes.c_double(0.0)
        out = (ctypes.byref(bad), ctypes.byref(seconds))
        fn = self._lib.fn
        if self._handle is None:
            state = CANCELLED if ticket in self._live else UNKNOWN
        elif timeout == 0:
            state = fn.kvtier_read_queue_poll(self._handle, ticket, *out)
        else:
            ms = -1 if timeout is None else max(1, int(timeout * 1000))
            state = fn.kvtier_read_queue_wait(self._handle, ticket, ms, *out)
        if state in (DONE, CANCELLED, UNKNOWN):
            if self._handle is not None:
                fn.kvtier_read_queue_forget(self._handle, ticket)
            self._live.pop(ticket, None)
        return state, bad.value, seconds.value

    def _cancel(self, ticket: int) -> None:
        if self._handle is not None:
            self._lib.fn.kvtier_read_queue_cancel(self._handle, ticket)

    def close(self) -> None:
        """Cancel the queued calls, wait for the running one, end the thread."""
        self._handle = None
        self._free()


class QueuedRead:
    """One submitted call: ``poll``/``wait`` until it ended; then ``done``
    (it ran: ``failed`` items not OK, ``seconds`` its wall time in the
    library) or ``cancelled`` (it never touched an item)."""

    def __init__(self, queue: ReadQueue, ticket: int):
        self._queue: ReadQueue = queue
        self.ticket = ticket
        self.state, self.failed, self.seconds = QUEUED, 0, 0.0

    @property
    def ended(self) -> bool:
        return self.state in (DONE, CANCELLED, UNKNOWN)

    @property
    def done(self) -> bool:
        return self.state == DONE

    def poll(self) -> bool:
        """Whether the call ended; never waits."""
        return self.wait(0)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (None: until it ended); whether it did."""
        if not self.ended:
            self.state, self.failed, self.seconds = self._queue._state(
                self.ticket, timeout
            )
        return self.ended

    def cancel(self) -> None:
        """Keep a queued call from starting (a running one finishes)."""
        if not self.ended:
            self._queue._cancel(self.ticket)
