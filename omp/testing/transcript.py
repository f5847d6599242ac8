"""A transcript of one connection, recorded on the wire: every frame the server wrote and every
frame the host wrote, in order, with when (relative to each other) each was written.

``Transcript.record(recv_stream, send_stream)`` wraps the host's ends of a connection; give the
wrappers to ``RpcClient.connect`` and the transcript holds everything, the responses the client
consumed itself included (``negotiate_protocol``, ``set_host_tools``, every ``call``), which the
client's ``events`` never show. v2 chunks (``rpc_chunk``) are reassembled into the frame they
carry. ``check()`` runs ``omp.testing.check_protocol`` over it.

The wrappers record and pass bytes on; they add no checkpoint and no task of their own, so the
connection behaves as without them.
"""

from __future__ import annotations

from typing import Any

import attrs
import msgspec
import trio

from ..protocol.codec import ChunkAssembler, ChunkError
from ..protocol.frames import RpcChunk
from .invariants import HOST_ANSWERS, Frame, Stops, check_protocol

__all__ = ["Transcript"]


@attrs.define(eq=False)
class Transcript:
    """What went over one connection."""

    received: list[Frame] = attrs.field(factory=list)
    """Every frame the server wrote, in the order the host read them (``ready`` first)."""
    sent: list[Frame] = attrs.field(factory=list)
    """Every frame the host wrote."""
    sent_at: list[int] = attrs.field(factory=list)
    """For each frame in ``sent``: how many frames the host had read when it wrote it."""
    input_closed_at: int | None = None
    """How many frames the host had read when it closed the server's input (None: it did not)."""
    _partial_in: bytes = b""
    _partial_out: bytes = b""
    _assembler: ChunkAssembler = attrs.field(factory=ChunkAssembler)
    _paused: trio.Event | None = None
    _reader: _RecordingReceive | None = None
    _writer: _RecordingSend | None = None

    def record(self, recv_stream: trio.abc.ReceiveStream, send_stream: trio.abc.SendStream
               ) -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
        """The host's ends of a connection, recording into this transcript."""
        return _RecordingReceive(recv_stream, self), _RecordingSend(send_stream, self)

    # -- what was seen --------------------------------------------------------------------------

    def commands(self) -> list[Frame]:
        """The commands the host wrote (frames with an ``id`` that are not answers)."""
        return [f for f in self.sent if "id" in f and f.get("type") not in HOST_ANSWERS]

    def response(self, request_id: Any) -> Frame | None:
        """The first response to ``request_id``, if it came."""
        return next((f for f in self.received
                     if f.get("type") == "response" and f.get("id") == request_id), None)

    def stops(self) -> Stops:
        """When the host aborted, cancelled a retry and closed the server's input, as
        ``check_protocol`` wants them: the first ``abort`` (with the index of its response) and
        the first ``abort_retry``."""
        abort: tuple[int, int] | None = None
        abort_retry: int | None = None
        for frame, at in zip(self.sent, self.sent_at, strict=True):
            if frame.get("type") == "abort" and abort is None:
                answered = next((i for i, f in enumerate(self.received)
                                 if f.get("type") == "response" and f.get("id") == frame.get("id")
                                 and "id" in frame), len(self.received))
                abort = (at, answered)
            elif frame.get("type") == "abort_retry" and abort_retry is None:
                abort_retry = at
        return Stops(abort=abort, abort_retry=abort_retry, eof=self.input_closed_at)

    def check(self, *, complete: bool = True, **options: Any) -> None:
        """``check_protocol`` over everything recorded (``options`` are its keywords);
        ``complete``: the connection has ended (or everything the host started is over)."""
        check_protocol(self.received, self.sent, stops=self.stops(), complete=complete,
                       **options)

    # -- what a host may do to the connection ------------------------------------------------

    def stop_reading(self) -> None:
        """The host stops reading the server's output (until ``resume_reading``): the client
        reads nothing more, the pipe fills, and the server feels backpressure."""
        if self._paused is None:
            self._paused = trio.Event()

    def resume_reading(self) -> None:
        if self._paused is not None:
            self._paused.set()
            self._paused = None

    async def close_input(self) -> None:
        """Close the server's input (EOF) while the host goes on reading. Later writes of the
        host fail as on a closed stream. On cancellation the input is closed all the same."""
        writer = self._writer
        assert writer is not None, "close_input: nothing recorded by this transcript"
        await writer.aclose()

    # -- recording ------------------------------------------------------------------------------

    def _server_wrote(self, data: bytes) -> None:
        *lines, self._partial_in = (self._partial_in + data).split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            frame = msgspec.json.decode(line)
            if isinstance(frame, dict) and frame.get("type") == "rpc_chunk":
                try:
                    whole = self._assembler.feed(msgspec.convert(frame, RpcChunk))
                except (ChunkError, msgspec.ValidationError):
                    self.received.append(frame)  # a broken sequence: kept as it came
                    continue
                if whole is None:
                    continue
                frame = msgspec.json.decode(whole)
            self.received.append(frame if isinstance(frame, dict) else {"type": "", "line": frame})

    def _host_wrote(self, data: bytes) -> None:
        *lines, self._partial_out = (self._partial_out + data).split(b"\n")
        for line in lines:
            if line.strip():
                frame = msgspec.json.decode(line)
                self.sent.append(frame if isinstance(frame, dict) else {"type": "", "line": frame})
                self.sent_at.append(len(self.received))


class _RecordingReceive(trio.abc.ReceiveStream):
    def __init__(self, inner: trio.abc.ReceiveStream, transcript: Transcript) -> None:
        self._inner = inner
        self._transcript = transcript
        transcript._reader = self

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        while (paused := self._transcript._paused) is not None:
            await paused.wait()
        data = await self._inner.receive_some(max_bytes)
        self._transcript._server_wrote(bytes(data))
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


class _RecordingSend(trio.abc.SendStream):
    def __init__(self, inner: trio.abc.SendStream, transcript: Transcript) -> None:
        self._inner = inner
        self._transcript = transcript
        transcript._writer = self

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._transcript.input_closed_at is not None:
            await trio.lowlevel.checkpoint()
            raise trio.ClosedResourceError("the host closed the server's input")
        # Recorded first: once send_all is called the bytes count as written (a cancelled
        # send_all may have delivered part of them).
        self._transcript._host_wrote(bytes(data))
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        if self._transcript.input_closed_at is None:
            self._transcript.input_closed_at = len(self._transcript.received)
        await trio.aclose_forcefully(self._inner)
