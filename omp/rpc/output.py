"""The stdout side of the server: one ordered frame queue, a spool, and the writer.

Every producer puts frames into one ``Output``, which encodes them at once with one
``FrameEncoder`` into a ``ByteSpool``; the writer task sends the spool to the stream. So frames
are never interleaved, reordered or dropped, and there is one task switch per batch of output,
not per frame. On an ``omp.memory_pipe`` (an embedding host) there is none while the host keeps
up: a frame queued while nothing is pending goes straight into the pipe (``Output.direct``),
and only what has to wait goes through the spool and the writer. What that buys is measured by
``bench/bench_many.py`` against ``--no-direct`` (which turns it off, ``DIRECT_INTO_PIPE``): at
30,000 deltas/s through 100 sessions, on a quiet run of this 2-core machine, 21 µs of CPU a delta
and a p99 of 13 ms with it, 28 µs and 30 ms without (the writer's wake and switch per burst of
frames, and one scheduler round more before the host can read them). Measured again on
2026-12-03 with the machine a third slower (HTTP + SSE alone 15 µs a delta): at a fast model's
pace (20,000 deltas/s) p99 14 ms with it, 35 ms without; at 50,000/s, where this process is
saturated either way, 157 ms against 398 ms; the same 21 µs of CPU a delta.

One way in, and a pace beside it (docs/internals.md#backpressure-without-deadlock):

* ``put_nowait`` never blocks. Every producer uses it: the reader and the command lanes for
  responses and for frames a host's own input causes (a host that writes commands while not
  reading our output must not deadlock us), the streaming producers for their events. What the
  stream cannot take yet waits in the spool, in memory up to a limit and then in a private temp
  file (0600, already unlinked: nothing is left in TMPDIR, whatever way the process ends), as
  the original does. The file has a size bound (``file_limit``); a host so far behind that it
  is reached is treated like a host whose stdout broke: the queue fails with
  ``SpillLimitError`` (an ``OutputClosedError``), and the server ends with exit status 1 and
  one line on stderr. Dropping frames instead would break the promise that every command is
  answered; waiting is impossible for ``put_nowait``.
* ``behind()`` and ``await wait_if_behind()``: the queue is the streaming producers' ``Pace``
  (``omp.llm.builder``). ``behind`` says whether the unsent backlog is above the high-water
  mark, ``wait_if_behind`` waits while it is. The producers (the provider stream, bash
  output) await it before they read more input, so a host that stops reading slows them down
  instead of growing the spool.

A trio memory channel does not fit: a bounded one makes a put wait when it is full, which the
reader must never do, and an unbounded one has no backpressure; this queue has both on one
order.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import IO

import msgspec
import trio

from ..pipe import PipeSendStream
from ..protocol.codec import FrameEncoder

SEND_BLOCK = 1024 * 1024
SEND_PIECE = 64 * 1024
"""Most bytes the writer hands to one ``send_all``: it counts ``delivered`` per piece, so a
host that reads a large block slowly is still seen to read (shutdown waits for it)."""
DIRECT_INTO_PIPE = True
"""Whether the writer lets the queue write frames straight into an ``omp.memory_pipe`` (see the
module docstring). Only ``bench/bench_many.py --no-direct`` turns it off, to show what it buys;
read when ``write_frames`` starts."""
DEFAULT_SPILL_LIMIT = 1024 * 1024 * 1024
"""Largest spill file (1 GiB); ``ServeOptions.output_spill_bytes``."""


class SwitchProtocol(msgspec.Struct, frozen=True):
    """Queue marker: frames after it are encoded with ``version`` (after the negotiate response)."""

    version: int


Item = msgspec.Struct | SwitchProtocol


class OutputClosedError(Exception):
    """Our stdout is gone (the host closed its end); nothing more can be delivered."""


class SpillLimitError(OutputClosedError):
    """The host fell so far behind that the spill file reached its size bound."""


class ByteSpool(msgspec.Struct, eq=False):
    """Encoded output not yet sent: in memory up to ``memory_limit``, past it in a temp file.

    Order is kept by one rule: while the file holds unsent bytes, new bytes go to the file too,
    so memory always holds the oldest bytes. The file is plain blocking I/O on purpose: it is a
    local, private, page-cached file written in large blocks, and it only exists while a host is
    far behind.
    """

    memory_limit: int = 8 * 1024 * 1024
    file_limit: int = DEFAULT_SPILL_LIMIT
    """Largest size of the temp file; ``append`` raises ``SpillLimitError`` past it."""
    spilled_bytes: int = 0
    """How many bytes ever went through the file (for tests and diagnostics)."""
    _memory: bytearray = msgspec.field(default_factory=bytearray)
    _file: IO[bytes] | None = None
    _file_read: int = 0
    _file_write: int = 0

    # Bytes taken by the sender whose send has not finished yet: still unsent for the host.
    _sending: int = 0

    @property
    def pending(self) -> int:
        """Bytes not yet delivered to the stream, including the block being sent."""
        return len(self._memory) + self._file_write - self._file_read + self._sending

    @property
    def in_memory(self) -> int:
        return len(self._memory)

    def append(self, data: bytes | bytearray) -> None:
        """Keep ``data`` after what is pending. Raises ``SpillLimitError`` (keeping nothing of
        it) when it would make the temp file larger than ``file_limit``."""
        if self._file_write == self._file_read and (
                len(self._memory) + len(data) <= self.memory_limit):
            self._memory += data
            return
        if self._file_write + len(data) > self.file_limit:
            raise SpillLimitError(
                f"the host is not reading stdout: the output waiting for it reached the spill "
                f"file's limit of {self.file_limit:,} bytes (output_spill_bytes)")
        if self._file is None:
            # Owned by the spool and closed by ByteSpool.close() (write_frames' finally).
            self._file = tempfile.TemporaryFile(prefix="omp-rpc-out-")  # noqa: SIM115
        self._file.seek(self._file_write)
        self._file.write(data)
        self._file_write += len(data)
        self.spilled_bytes += len(data)

    def take(self) -> bytes:
        """The oldest unsent bytes (memory first, then up to ``SEND_BLOCK`` of the file).

        They count as pending until ``sent()``.
        """
        self._sending = 0
        if self._memory:
            data = bytes(self._memory)
            self._memory.clear()
            self._sending = len(data)
            return data
        if self._file is None or self._file_read == self._file_write:
            return b""
        self._file.seek(self._file_read)
        data = self._file.read(min(SEND_BLOCK, self._file_write - self._file_read))
        self._file_read += len(data)
        if self._file_read == self._file_write:
            # Caught up: start the file over instead of letting it grow.
            self._file.seek(0)
            self._file.truncate()
            self._file_read = self._file_write = 0
        self._sending = len(data)
        return data

    def sent(self) -> None:
        self._sending = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Output(msgspec.Struct, eq=False):
    """Frames for the host, encoded as they are queued, in queue order, into the spool."""

    high_water_bytes: int = 1024 * 1024
    """Unsent bytes from which on the host is ``behind`` (and ``wait_if_behind`` waits)."""
    spool: ByteSpool = msgspec.field(default_factory=ByteSpool)
    encoder: FrameEncoder = msgspec.field(default_factory=FrameEncoder)
    _buffer: bytearray = msgspec.field(default_factory=bytearray)
    _readable: trio.lowlevel.ParkingLot = msgspec.field(default_factory=trio.lowlevel.ParkingLot)
    _writable: trio.lowlevel.ParkingLot = msgspec.field(default_factory=trio.lowlevel.ParkingLot)
    _drained: trio.lowlevel.ParkingLot = msgspec.field(default_factory=trio.lowlevel.ParkingLot)
    _closed: bool = False
    _failure: OutputClosedError | None = None
    send_scope: trio.CancelScope | None = None
    """Around the writer's loop: ``fail`` cancels it, even mid-send (the host may never read
    again)."""
    delivered: int = 0
    """Pieces delivered so far (a frame sent straight into a pipe, or up to ``SEND_PIECE``
    bytes of a block): whether a host is still reading, for shutdown."""
    direct: Callable[[bytes | bytearray], bool] | None = None
    """While the writer serves an ``omp.memory_pipe``: the pipe's ``send_nowait``. A frame
    queued while nothing is pending goes straight into the pipe, so the host can read it
    without the writer task's switch (one scheduler round less latency per batch)."""

    def put_nowait(self, item: Item) -> None:
        """Encode ``item`` into the spool now (a ``SwitchProtocol`` changes the framing of the
        frames after it). Never waits. Once the output failed (``failure``) the item is
        dropped: the writer has raised, and whoever runs it is ending."""
        if self._failure is not None:
            return
        if self._closed:
            raise trio.ClosedResourceError("the output queue is closed")
        if isinstance(item, SwitchProtocol):
            self.encoder.switch_protocol(item.version)
            return
        buffer = self._buffer
        self.encoder.encode_into(item, buffer)
        try:
            # Only when nothing is pending (queued, or taken by the writer and not yet sent):
            # the frame then follows everything before it, as through the spool.
            if self.direct is not None and not self.spool.pending:
                try:
                    if self.direct(buffer):
                        self.delivered += 1
                        return
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self.fail(OutputClosedError(f"stdout closed: {exc}"))
                    return
            self.spool.append(buffer)
        except SpillLimitError as exc:
            self.fail(exc)
            return
        finally:
            buffer.clear()
        if self._readable:  # the writer is parked
            self._readable.unpark()

    def behind(self) -> bool:
        """Whether the unsent backlog is above the high-water mark (``wait_if_behind`` would
        wait)."""
        return self.spool.pending >= self.high_water_bytes and not self._closed

    async def wait_if_behind(self) -> None:
        """Wait while the host is far behind (the unsent backlog above the high-water mark).

        Not a checkpoint (``Pace.wait_if_behind`` says why): a cancellation point that yields
        only when it waits. On cancellation it stops waiting.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while self.behind():
            await self._writable.park()

    def close(self) -> None:
        """No more frames: the writer sends what is queued, then stops."""
        self._closed = True
        self._readable.unpark_all()
        self._writable.unpark_all()
        self._drained.unpark_all()

    async def wait_drained(self) -> None:
        """Wait until everything queued so far was delivered to the stream (or the queue was
        closed). A host that does not read keeps it waiting: callers bound it. On
        cancellation, stops waiting."""
        while self.spool.pending and not self._closed:
            await self._drained.park()

    def fail(self, error: OutputClosedError) -> None:
        """The output is lost: the writer stops at once (even in the middle of a send) and
        raises ``error``; frames queued later are dropped."""
        if self._failure is None:
            self._failure = error
        if self.send_scope is not None:
            self.send_scope.cancel()
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def failure(self) -> OutputClosedError | None:
        """Why the output was lost, once it was."""
        return self._failure

    async def take(self) -> bytes:
        """The oldest unsent bytes (waiting for some); ``b""`` once closed and all taken, or
        once the queue failed.

        On cancellation while waiting, nothing was taken.
        """
        while True:
            if self._failure is not None:
                return b""
            if data := self.spool.take():
                return data
            if self._closed:
                return b""
            await self._readable.park()

    def sent(self) -> None:
        """The writer sent a block: producers waiting for room may go on."""
        self.spool.sent()
        # Checked first: unpark_all on an empty lot still costs a call per batch of output.
        if self._writable and not self.behind():
            self._writable.unpark_all()
        if self._drained and not self.spool.pending:
            self._drained.unpark_all()


async def write_frames(queue: Output, stream: trio.abc.SendStream) -> None:
    """Send everything ``queue`` receives until it is closed and fully sent.

    Frames are encoded when they are queued, so the writer only moves bytes and ``put_nowait``
    never waits for a slow host. Raises ``OutputClosedError`` when the stream is broken, or the
    queue's failure (``SpillLimitError``) when the queue failed. On cancellation, unsent frames
    are abandoned (the stream is gone or the server is being torn down).

    On an ``omp.memory_pipe`` the queue also writes frames straight into the pipe while nothing
    is pending (``Output.direct``, unless ``DIRECT_INTO_PIPE`` is off); the writer then only
    sends what had to wait.
    """
    if isinstance(stream, PipeSendStream) and DIRECT_INTO_PIPE:
        queue.direct = stream.send_nowait
    try:
        # One scope for the writer's whole life, not one per send (a send per batch of output):
        # ``fail`` cancels it, which stops a send in progress or the wait for more output.
        with trio.CancelScope() as queue.send_scope:
            while data := await queue.take():
                try:
                    # In pieces: a block can be megabytes (all of the spool's memory), and
                    # a host that reads it slowly must not look like one that stopped.
                    view = memoryview(data)
                    for start in range(0, len(view), SEND_PIECE):
                        await stream.send_all(view[start:start + SEND_PIECE])
                        queue.delivered += 1
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    reason = str(exc.__cause__ or exc) or type(exc).__name__
                    queue.fail(OutputClosedError(f"stdout closed: {reason}"))
                    assert queue.failure is not None
                    raise queue.failure from exc
                queue.sent()
        if queue.failure is not None:
            raise queue.failure
    finally:
        queue.direct = None
        queue.spool.close()
