"""Writing a session file behind the event loop: a writer thread per file, lines kept in order.

A session appends a line for every finished message and every model or thinking-level change,
on the event loop. Writing it there (open, ``write``, close; ``fsync`` on request) costs
microseconds on a local disk and can cost seconds on a slow one (a network filesystem, a disk
that is busy or failing), with every host waiting. :class:`LineWriter` takes the write off the
loop while keeping the API synchronous: :meth:`LineWriter.append` only queues the bytes (encoded
on the loop: the thread gets bytes and does nothing but system calls); one thread writes what
is queued in order, each batch with one open and one ``write`` (a slow disk is paid per batch,
not per line), and lingers ``LINGER_SECONDS`` for the next line before it ends.

Frames first, disk second. Waking a thread from the loop hands it the interpreter (and often
the CPU) in the middle of what the loop was doing, which, when a message ends, is writing that
message's frames. So an append on a trio loop does not wake the thread: the loop's
:class:`_Kicker` does, once the loop has nothing left to run (the frames are in the pipe), or
after ``KICK_SECONDS`` on a loop that never idles. No frame waits for the file either: the end
of a run goes to the host while its last line may still be on its way to the disk.

The trade-off, and why it is this one:

* Order and completeness are kept: one thread, one queue, lines written in the order they were
  appended, each batch with one ``write`` to an ``O_APPEND`` descriptor. A crash in the middle
  of a ``write`` leaves at most a torn last line, which loading skips, as before.
* What a crash (``SIGKILL``, a power cut) loses is what was not yet handed to the kernel: the
  line (or batch) being written and, on a disk slower than the session, the lines queued behind
  it. On a healthy disk the thread writes a line as soon as the loop has a moment, so that is
  the line being written; the queue grows only while the disk is slow, which is exactly when
  writing on the loop would have frozen the session (those lines would not exist yet: nothing
  would have happened after the first slow write). A normal exit loses nothing: the threads are
  daemons (one that only lingers must not hold the exit), so the exit waits for those still
  writing: ``omp``'s own exit first (:func:`join_writers`, bounded by ``WRITERS_EXIT_SECONDS``),
  ``atexit`` for a program that embeds omp; and :meth:`LineWriter.flush` waits for it
  explicitly (the session does when it closes, and before it reads a session file, which may
  be one it wrote).
* The cost on the loop is queueing the bytes (and, once per burst, installing the kicker); the
  thread is started or woken while the loop sleeps, and it ends when it had nothing to write
  for ``LINGER_SECONDS``, so an idle session holds none.
* What the host sees may run ahead of the file: a frame (``agent_end`` included) may reach the
  host before its line reaches the file, by microseconds on a healthy disk and by as long as
  the disk takes on a slow one. A host that must find the run in the file closes the session
  (or the process) first.
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

import atexit
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

__all__ = ["KICK_SECONDS", "LINGER_SECONDS", "WRITERS_EXIT_SECONDS", "LineWriter",
           "join_writers", "on_loop", "open_for_write", "write_all"]

WRITERS_EXIT_SECONDS: Final = 10.0
"""How long the process's exit waits for writer threads still writing (:func:`join_writers`):
long enough for a busy disk, bounded for one that hangs (a dead network filesystem)."""

LINGER_SECONDS: Final = 2.0
"""How long a writer thread waits for the next line before it ends. A run appends a line per
message, seconds apart while the model streams: the thread that wrote one is still there for
the next (starting a thread costs the loop a hand-over of the interpreter, at the moment a
message ends), and an idle session holds no thread."""

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
        """Notified when the queue is written (``flush`` waits on it)."""
        self._work = threading.Condition(self._lock)
        """Notified when a line is queued for a thread that lingers (or it must end)."""
        self._queue: collections.deque[tuple[int, bytes]] = collections.deque()
        self._thread = False
        """A thread runs (writing, or lingering for the next line)."""
        self._lingering = False
        self._writing = False
        self._retired = False
        """The process exits: a thread that lingers ends at once."""
        self._deferred = False
        """The loop's :class:`_Kicker` wakes the thread once the loop is idle."""
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
            if (self._thread and not self._lingering) or self._deferred:
                return  # the thread will find it, or a wake-up is on its way
            _LIVE.add(self)
            kicker = _kicker()
            if kicker is not None:
                self._deferred = True
        if kicker is not None:
            kicker.defer(self)
        else:
            self._wake()

    def _wake(self) -> None:
        """Start the thread, or wake the one that lingers, for what is queued."""
        with self._lock:
            self._deferred = False
            if self._thread:
                if self._lingering:
                    self._work.notify()
                return
            if not self._queue:
                return
            self._thread = True
        try:
            _WriterThread(target=self._drain, name=f"omp-session-writer {self.path.name}",
                          daemon=True).start()
        except RuntimeError:  # no thread to be had (the interpreter is shutting down)
            with self._lock:
                self._retired = True
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
            return (self._writing or bool(self._queue)
                    or (self._failure is not None and not self._delivered))

    def flush(self) -> None:
        """Block until everything queued is written (or the writer stopped). Raises the failure
        that stopped it when ``on_failure`` did not take it and it was not raised before."""
        self._wake()
        with self._lock:
            while self._writing or (self._queue and self._thread):
                self._idle.wait()
            self._raise_failure()

    def _retire(self) -> None:
        """The process exits: the thread writes what is queued and ends without lingering."""
        with self._lock:
            self._retired = True
        self._wake()

    def _drain(self) -> None:
        """The writer thread: batches in order; once the queue is empty it lingers for the
        next line (``LINGER_SECONDS``), then ends (or at once when a write fails)."""
        while True:
            with self._lock:
                if not self._queue and self._failure is None and not self._retired:
                    self._writing = False
                    self._idle.notify_all()
                    self._lingering = True
                    self._work.wait(LINGER_SECONDS)
                    self._lingering = False
                batch = list(self._queue)
                self._queue.clear()
                if not batch or self._failure is not None:
                    self._stop()
                    return
                self._writing = True
            try:
                self._write(batch)
            except OSError as exc:
                self._fail(exc)
                return

    def _stop(self) -> None:
        """(With the lock held.) The thread ends: ``flush`` may return."""
        self._thread = self._writing = False
        self._idle.notify_all()
        _LIVE.discard(self)

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


_LIVE: Final[set[LineWriter]] = set()
"""Writers whose thread runs: :func:`join_writers` ends the lingering ones."""


class _WriterThread(threading.Thread):
    """A :class:`LineWriter`'s thread: the type :func:`join_writers` knows it by."""


class _Kicker(trio.abc.Instrument):
    """Wakes the writers of one trio run once that loop has nothing left to run.

    Waking a thread on the loop hands the interpreter over (and the CPU: the woken thread may
    preempt the loop on its core) in the middle of whatever the loop was doing, which is, when
    a message ends, writing that message's frames. Deferred to ``before_io_wait`` with a
    positive timeout (no task is runnable: the frames are in the pipe or waiting for the host),
    the thread writes while the loop sleeps. A loop that never idles (a heavy stream) still
    wakes them after ``KICK_SECONDS``. Installed only while a wake-up is deferred: an idle loop
    pays nothing.
    """

    def __init__(self) -> None:
        self._writers: list[LineWriter] = []
        self._since = 0.0

    def defer(self, writer: LineWriter) -> None:
        if not self._writers:
            self._since = time.monotonic()
            trio.lowlevel.add_instrument(self)
        self._writers.append(writer)

    def before_io_wait(self, timeout: float) -> None:
        if timeout > 0 or time.monotonic() - self._since > KICK_SECONDS:
            self._kick()

    def after_run(self) -> None:
        self._kick()

    def _kick(self) -> None:
        writers, self._writers = self._writers, []
        trio.lowlevel.remove_instrument(self)
        for writer in writers:
            writer._wake()


KICK_SECONDS: Final = 0.005
"""The longest a line waits for an idle loop before its writer thread is woken anyway."""

_KICKER: Final[trio.lowlevel.RunVar[_Kicker]] = trio.lowlevel.RunVar("omp_session_writers")


def _kicker() -> _Kicker | None:
    """The current trio run's :class:`_Kicker`; None outside one (a worker thread, no trio):
    the writer is woken at once."""
    try:
        return _KICKER.get()
    except LookupError:
        kicker = _Kicker()
        _KICKER.set(kicker)
        return kicker
    except RuntimeError:
        return None


def join_writers(timeout: float = WRITERS_EXIT_SECONDS) -> list[str]:
    """Wait (at most ``timeout`` seconds in all) for every writer thread still writing, and
    return the names of those still alive after it; threads that only linger end at once. The
    process's exit calls this (``omp``'s own exit, and ``atexit`` for a program that embeds
    omp) before it looks for threads left running: a session torn down by a signal (cancelled,
    not closed) leaves its writer writing its last lines, and they must reach the file."""
    deadline = time.monotonic() + timeout
    for writer in list(_LIVE):
        writer._retire()
    for thread in threading.enumerate():
        if isinstance(thread, _WriterThread):
            thread.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threading.enumerate() if isinstance(t, _WriterThread) and t.is_alive()]


# The threads are daemons (one lingering for its next line must not hold the interpreter's
# exit), so the exit waits for the ones still writing here: ``atexit`` runs before daemon
# threads are stopped.
atexit.register(join_writers)


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
