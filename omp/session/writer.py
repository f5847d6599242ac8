"""Writing a session file behind the event loop: a writer thread per file, lines kept in order.

A session appends a line for every finished message and every model or thinking-level change,
on the event loop. Writing it there (open, ``write``, close; ``fsync`` on request) costs
microseconds on a local disk and can cost seconds on a slow one (a network filesystem, a disk
that is busy or failing), with every host waiting. :class:`LineWriter` takes the write off the
loop while keeping the API synchronous: :meth:`LineWriter.append` only queues the bytes; one
thread, started when a line arrives and none is running, writes what is queued in order and
ends when the queue is empty. Appends that arrive while it writes are written together by its
next ``write`` (one open and one ``write`` per batch: a slow disk is paid per batch, not per
line).

The trade-off, and why it is this one:

* Order and completeness are kept: one thread, one queue, lines written in the order they were
  appended, each batch with one ``write`` to an ``O_APPEND`` descriptor. A crash in the middle
  of a ``write`` leaves at most a torn last line, which loading skips, as before.
* What a crash (``SIGKILL``, a power cut) loses is what was not yet handed to the kernel: the
  line (or batch) being written and, on a disk slower than the session, the lines queued behind
  it. On a healthy disk the thread writes a line as soon as it is queued, so that is the line
  being written; the queue grows only while the disk is slow, which is exactly when writing on
  the loop would have frozen the session (those lines would not exist yet: nothing would have
  happened after the first slow write). A normal exit loses nothing: the thread is not a
  daemon, so the interpreter waits for it; ``omp``'s own exit, which does not wait for threads
  extensions leave running, waits for these first (:func:`join_writers`, bounded by
  ``WRITERS_EXIT_SECONDS``); and :meth:`LineWriter.flush` waits for it explicitly (the session
  does at the end of each run and at ``close``).
* The cost on the loop is queueing the bytes, plus starting the thread when none runs (tens of
  microseconds; the thread ends when it has nothing to write, so an idle session holds none).
* What the host sees may run a little ahead of the file: an append returns before its line is
  on disk, so the response to a command that only records something (a name, a model) can
  reach the host just before its line reaches the file. The session waits for the writer (in a
  worker thread: the loop stays free) before the frames that end a run (``agent_end``,
  ``prompt_result``, ``session_settled``) and when it closes, so a host that saw a run end, or
  the process exit, finds all of it in the file (``abort`` does not wait for the disk).
* The alternative, a trio task draining a channel, would need a nursery owner before the first
  append (the startup file is written before the session nursery exists) and to survive that
  nursery's cancellation at shutdown to write the last lines; a thread has neither problem.
* A failed write stops the writer: the lines after it are dropped (the file would have a hole
  otherwise) and the failure is delivered once: to ``on_failure`` (called from the writer
  thread; :func:`on_loop` makes such a callback run on the trio loop) when there is one, else
  raised by the next :meth:`~LineWriter.append` or :meth:`~LineWriter.flush`. That is the
  session's persistence failure (one ``notice``, the session goes on in memory, exit status 1).

A FIFO or a device put in place of the file is refused by the regular-file gate
(``omp.files.open_regular``) like any failed write; it is never waited on.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Final

import trio

from omp.files import UnusableFile, open_regular

__all__ = ["WRITERS_EXIT_SECONDS", "LineWriter", "join_writers", "on_loop", "open_for_write",
           "write_all"]

WRITERS_EXIT_SECONDS: Final = 10.0
"""How long the process's exit waits for writer threads still writing (:func:`join_writers`):
long enough for a busy disk, bounded for one that hangs (a dead network filesystem)."""

_APPEND: Final = -1
"""The offset of a queued append (anything else is a ``pwrite`` at that offset)."""


def write_all(fd: int, data: bytes) -> None:
    """``data`` in full to ``fd`` (``os.write`` may take less than it was given)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def open_for_write(path: Path, flags: int) -> int:
    """The session file, opened for writing; something other than a regular file put in its
    place (a FIFO would block the write) is an ``OSError`` like any failed write."""
    try:
        return open_regular(path, flags)
    except UnusableFile as exc:
        raise OSError(f"{exc}; the session file was replaced") from None


class LineWriter:
    """The writer thread of one session file (see the module docstring).

    ``on_failure`` is called once, from the writer thread, with the ``OSError`` that stopped
    it; without one, that error is raised by the next ``append`` or ``flush``.
    """

    def __init__(self, path: Path, *, fsync: bool = False,
                 on_failure: Callable[[OSError], None] | None = None) -> None:
        self.path = path
        self.fsync = fsync
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self._running = False
        self._failure: OSError | None = None
        self._delivered = False
        """The failure went to ``on_failure`` or was raised once: it is not raised again."""

    def append(self, data: bytes) -> None:
        """Queue ``data`` for the end of the file; never waits for the disk."""
        self._put(_APPEND, data)

    def overwrite(self, offset: int, data: bytes) -> None:
        """Queue ``data`` to be written at ``offset`` (in order with the appends)."""
        if offset < 0:
            raise ValueError("overwrite: offset must not be negative")
        self._put(offset, data)

    def _put(self, offset: int, data: bytes) -> None:
        with self._lock:
            self._raise_failure()
            if self._failure is not None:
                return  # stopped, failure delivered: the line is dropped, as the ones before
            self._queue.append((offset, data))
            if self._running:
                return
            self._running = True
        try:
            _WriterThread(target=self._drain, name=f"omp-session-writer {self.path.name}",
                          daemon=False).start()
        except RuntimeError:  # no thread to be had (the interpreter is shutting down)
            self._drain()

    def _raise_failure(self) -> None:
        """(With the lock held.) Raise the failure once when nobody was told of it."""
        if self._failure is not None and not self._delivered:
            self._delivered = True
            raise self._failure

    @property
    def pending(self) -> bool:
        """Something is queued or being written, or a failure waits to be raised."""
        with self._lock:
            return self._running or (self._failure is not None and not self._delivered)

    def flush(self) -> None:
        """Block until everything queued is written (or the writer stopped). Raises the failure
        that stopped it when ``on_failure`` did not take it and it was not raised before."""
        with self._lock:
            while self._running:
                self._idle.wait()
            self._raise_failure()

    def _drain(self) -> None:
        """The writer thread: batches in order until the queue is empty or a write fails."""
        while True:
            with self._lock:
                batch = list(self._queue)
                self._queue.clear()
                if not batch or self._failure is not None:
                    self._stop()
                    return
            try:
                self._write(batch)
            except OSError as exc:
                self._fail(exc)
                return

    def _stop(self) -> None:
        """(With the lock held.) The thread ends: ``flush`` may return."""
        self._running = False
        self._idle.notify_all()

    def _fail(self, exc: OSError) -> None:
        with self._lock:
            self._failure = exc
            self._queue.clear()
            report = self._on_failure
            self._delivered = report is not None
        if report is not None:
            # Before the thread counts as stopped: whoever waits in ``flush`` (the session at
            # close) finds the failure already on its way to the loop.
            try:
                report(exc)
            except Exception:  # a bug in the report must not lose the writer's state
                traceback.print_exc(file=sys.stderr)
        with self._lock:
            self._stop()

    def _write(self, batch: list[tuple[int, bytes]]) -> None:
        """One batch: each run of appends as one ``write``, each overwrite as a ``pwrite``."""
        run: list[bytes] = []
        for offset, data in batch:
            if offset == _APPEND:
                run.append(data)
                continue
            self._append(run)
            run = []
            fd = open_for_write(self.path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, offset)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        self._append(run)

    def _append(self, run: list[bytes]) -> None:
        if not run:
            return
        fd = open_for_write(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            write_all(fd, b"".join(run))
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)


class _WriterThread(threading.Thread):
    """A :class:`LineWriter`'s thread: the type :func:`join_writers` knows it by."""


def join_writers(timeout: float = WRITERS_EXIT_SECONDS) -> list[str]:
    """Wait (at most ``timeout`` seconds in all) for every writer thread still writing, and
    return the names of those still alive after it. The process's exit calls this before it
    looks for threads left running: a session torn down by a signal (cancelled, not closed)
    leaves its writer writing its last lines, and they must reach the file."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if isinstance(thread, _WriterThread):
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threading.enumerate() if isinstance(t, _WriterThread) and t.is_alive()]


def on_loop(report: Callable[[OSError], None]) -> Callable[[OSError], None] | None:
    """``report``, made callable from any thread: it then runs on the trio loop this is called
    in (soon, never waiting for it; dropped once that loop has ended). None outside trio: the
    failure is then raised by the file's next append instead."""
    try:
        token = trio.lowlevel.current_trio_token()
    except RuntimeError:
        return None

    def on_the_loop(exc: OSError) -> None:
        try:
            report(exc)
        except Exception:  # raised here, it would end trio.run with a TrioInternalError
            traceback.print_exc(file=sys.stderr)

    def from_thread(exc: OSError) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(on_the_loop, exc)

    return from_thread
