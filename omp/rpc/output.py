"""The stdout side of the server: one ordered frame queue and the writer task that drains it.

Every producer puts frames into one ``FrameQueue``; one writer task encodes them with one
``FrameEncoder`` and writes batches, so frames are never interleaved, reordered or dropped.

Two ways in, because the two kinds of producer need different things (DESIGN.md §2):

* ``put_nowait`` never blocks. The reader and the command lanes use it for responses and for
  frames a host's own input causes: a host that writes commands while not reading our output must
  not deadlock us.
* ``await put`` waits while the backlog is above the high-water mark. Streaming producers (the
  provider stream, bash output) use it, so a host that stops reading slows them down instead of
  growing our memory.

A trio memory channel offers one or the other per channel, not both on one ordered queue; hence
this small queue on a deque and two parking lots.
"""

from __future__ import annotations

from collections import deque

import attrs
import msgspec
import trio

from ..protocol.codec import FrameEncoder


@attrs.frozen
class SwitchProtocol:
    """Queue marker: frames after it are encoded with ``version`` (after the negotiate response)."""

    version: int


Item = msgspec.Struct | SwitchProtocol


class OutputClosedError(Exception):
    """Our stdout is gone (the host closed its end); nothing more can be delivered."""


@attrs.define(eq=False)
class FrameQueue:
    high_water: int = 1024
    _items: deque[Item] = attrs.field(factory=deque, init=False)
    _readable: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    _writable: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    def put_nowait(self, item: Item) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the output queue is closed")
        self._items.append(item)
        if self._readable.statistics().tasks_waiting:
            self._readable.unpark()

    async def put(self, item: Item) -> None:
        """Queue ``item``, first waiting while the backlog is at the high-water mark.

        On cancellation while waiting, nothing was queued.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        while len(self._items) >= self.high_water and not self._closed:
            await self._writable.park()
        self.put_nowait(item)
        await trio.lowlevel.cancel_shielded_checkpoint()

    def close(self) -> None:
        """No more frames: the writer drains what is queued, then stops."""
        self._closed = True
        self._readable.unpark_all()
        self._writable.unpark_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        return len(self._items)

    async def take_all(self) -> list[Item]:
        """Everything queued (waiting for at least one item); ``[]`` once closed and drained.

        On cancellation while waiting, nothing was taken.
        """
        while not self._items:
            if self._closed:
                return []
            await self._readable.park()
        items = list(self._items)
        self._items.clear()
        return items

    def taken(self) -> None:
        """The writer wrote a batch: producers waiting for room may go on."""
        self._writable.unpark_all()


async def write_frames(queue: FrameQueue, stream: trio.abc.SendStream,
                       encoder: FrameEncoder) -> None:
    """Drain ``queue`` to ``stream`` until the queue is closed and empty.

    Frames that are ready together are encoded into one buffer and written with one call.
    Raises ``OutputClosedError`` when the stream is broken. On cancellation, unwritten frames
    are abandoned (the stream is gone or the server is being torn down).
    """
    buffer = bytearray()
    while items := await queue.take_all():
        for item in items:
            if isinstance(item, SwitchProtocol):
                encoder.protocol_version = item.version
            else:
                encoder.encode_into(item, buffer)
        try:
            await stream.send_all(buffer)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            queue.close()
            reason = str(exc.__cause__ or exc) or type(exc).__name__
            raise OutputClosedError(f"stdout closed: {reason}") from exc
        buffer.clear()
        queue.taken()

