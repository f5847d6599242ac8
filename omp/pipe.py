"""In-process byte pipes: how a host and its ``serve()`` talk inside one trio program.

``memory_pipe()`` returns the two ends of a one-way, bounded, in-memory byte stream; two of
them connect a host to ``omp.serve`` (commands one way, frames the other). They are ordinary
``trio.abc.SendStream`` / ``ReceiveStream`` objects and pass trio's own conformance checks
(``trio.testing.check_one_way_stream``, see tests/test_pipe.py).

Why not ``trio.testing.memory_stream_one_way_pair``: it is a testing tool and says so. Its
``send_all`` and ``receive_some`` each checkpoint twice on purpose (to shake out racy test
code), so every batch of frames the writer sends costs four extra task switches, and four
scheduler rounds of latency, before the host sees it; and its buffer has no bound. A pipe
call here is one checkpoint, as trio requires of every stream call: it yields once, or waits
when it must. The bound (``max_buffer_bytes``) is the pipe's backpressure: a host that stops
reading makes ``serve()``'s writer wait, and the server's own spool then holds what follows
(``omp.rpc.output``), instead of the pipe growing without limit.

Cancellation: a ``send_all`` cancelled while it waits for room may have delivered part of its
data (trio's rule for every ``SendStream``); a cancelled ``receive_some`` takes nothing.
"""

from __future__ import annotations

import operator

import trio

DEFAULT_PIPE_BYTES = 1024 * 1024
"""Bytes a pipe holds before ``send_all`` waits for the reader."""


class _Pipe:
    """The state both ends share."""

    __slots__ = ("buffer", "limit", "readable", "receive_closed", "send_closed", "writable")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.send_closed = False  # EOF once the buffer is read
        self.receive_closed = False
        self.readable = trio.lowlevel.ParkingLot()
        self.writable = trio.lowlevel.ParkingLot()


class PipeSendStream(trio.abc.SendStream):
    """The writing end of a ``memory_pipe``."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self._busy = False

    def _enter(self) -> _Pipe:
        if self._busy:
            raise trio.BusyResourceError("another task is already sending on this pipe")
        self._busy = True
        return self._pipe

    def _check(self) -> None:
        if self._pipe.send_closed:
            raise trio.ClosedResourceError("this end of the pipe was closed")
        if self._pipe.receive_closed:
            raise trio.BrokenResourceError("the pipe's reading end was closed")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Add ``data`` to the pipe, waiting for the reader while the pipe is full.

        On cancellation while waiting, the part that fitted so far was delivered.
        """
        pipe = self._enter()
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._check()
            view = memoryview(data).cast("B")
            waited = False
            while True:
                room = pipe.limit - len(pipe.buffer)
                if room > 0:
                    pipe.buffer += view[:room]
                    view = view[room:]
                    if pipe.readable:
                        pipe.readable.unpark_all()
                    if not view:
                        break
                await pipe.writable.park()
                waited = True
                self._check()
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
        finally:
            self._busy = False

    def send_nowait(self, data: bytes | bytearray) -> bool:
        """Add all of ``data`` now if it fits; False (nothing added) if it does not, or while a
        ``send_all`` is in progress. Raises as ``send_all`` does once an end was closed.

        For a writer that must not wait: ``omp.rpc.output`` writes a frame straight into the
        pipe this way when nothing else is pending, saving its writer task a switch.
        """
        pipe = self._pipe
        if self._busy:
            return False
        if pipe.send_closed or pipe.receive_closed:
            self._check()  # raises the error that says which end
        if len(pipe.buffer) + len(data) > pipe.limit:
            return False
        pipe.buffer += data
        if pipe.readable:
            pipe.readable.unpark_all()
        return True

    async def wait_send_all_might_not_block(self) -> None:
        """Wait until the pipe has room (or an end was closed). On cancellation, stops
        waiting."""
        pipe = self._enter()
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            self._check()
            if len(pipe.buffer) < pipe.limit:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
            while len(pipe.buffer) >= pipe.limit and not pipe.receive_closed:
                await pipe.writable.park()
                self._check()
        finally:
            self._busy = False

    def close(self) -> None:
        """End the stream: the reader gets what is buffered, then EOF. A task waiting in
        ``send_all`` gets ``ClosedResourceError``."""
        pipe = self._pipe
        pipe.send_closed = True
        pipe.readable.unpark_all()
        pipe.writable.unpark_all()

    async def aclose(self) -> None:
        """Close (see ``close``); a checkpoint, as every stream call is. On cancellation the
        end is closed all the same (before the checkpoint) and ``Cancelled`` propagates."""
        self.close()
        await trio.lowlevel.checkpoint()


class PipeReceiveStream(trio.abc.ReceiveStream):
    """The reading end of a ``memory_pipe``."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self._busy = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """What is buffered (up to ``max_bytes``), waiting for data when there is none; ``b""``
        once the writer closed and everything was read.

        On cancellation while waiting, nothing was taken.
        """
        if max_bytes is not None:
            max_bytes = operator.index(max_bytes)  # TypeError for 1.5, as trio's streams
            if max_bytes < 1:
                raise ValueError(f"max_bytes must be at least 1 (got {max_bytes})")
        if self._busy:
            raise trio.BusyResourceError("another task is already receiving on this pipe")
        self._busy = True
        pipe = self._pipe
        try:
            await trio.lowlevel.checkpoint_if_cancelled()
            waited = False
            while True:
                if pipe.receive_closed:
                    raise trio.ClosedResourceError("this end of the pipe was closed")
                if pipe.buffer or pipe.send_closed:
                    break
                await pipe.readable.park()
                waited = True
            buffer = pipe.buffer
            if max_bytes is None or max_bytes >= len(buffer):
                data = bytes(buffer)
                buffer.clear()
            else:
                data = bytes(buffer[:max_bytes])
                del buffer[:max_bytes]
            if data and pipe.writable:
                pipe.writable.unpark_all()
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()
            return data
        finally:
            self._busy = False

    def close(self) -> None:
        """Stop reading: what is buffered is dropped, and the writer gets
        ``BrokenResourceError`` from then on (a waiting ``send_all`` too)."""
        pipe = self._pipe
        pipe.receive_closed = True
        pipe.buffer.clear()
        pipe.writable.unpark_all()
        pipe.readable.unpark_all()

    async def aclose(self) -> None:
        """Close (see ``close``); a checkpoint, as every stream call is. On cancellation the
        end is closed all the same (before the checkpoint, the buffer dropped) and
        ``Cancelled`` propagates."""
        self.close()
        await trio.lowlevel.checkpoint()


def memory_pipe(max_buffer_bytes: int = DEFAULT_PIPE_BYTES
                ) -> tuple[PipeSendStream, PipeReceiveStream]:
    """A one-way in-memory byte stream: bytes sent on the first end are received, in order, on
    the second. ``send_all`` waits while ``max_buffer_bytes`` are unread."""
    if max_buffer_bytes < 1:
        raise ValueError(f"max_buffer_bytes must be at least 1 (got {max_buffer_bytes})")
    pipe = _Pipe(max_buffer_bytes)
    return PipeSendStream(pipe), PipeReceiveStream(pipe)
