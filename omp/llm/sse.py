"""Server-sent events: a sans-I/O decoder, and the reader that applies the stream watchdogs."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import httpx
import msgspec
import trio

from .builder import NO_PACE, Pace
from .errors import ProviderError


class SseEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event (a msgspec Struct: one is made per streamed delta)."""

    event: str | None
    data: str


class SseDecoder:
    """Bytes in, events out (the WHATWG event-stream rules that providers use).

    Written for the hot path: a provider streams one event per token. Each chunk's complete
    lines are decoded from UTF-8 at once (a line break is ASCII, so no character spans two
    lines), a ``data: `` line is tested first, and an event of one data line (nearly all of
    them) is not joined.
    """

    __slots__ = ("_data", "_event", "_partial")

    def __init__(self) -> None:
        self._partial = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        data = self._partial + chunk if self._partial else chunk
        end = data.rfind(b"\n")
        if end < 0:
            self._partial = data
            return []
        self._partial = data[end + 1:]
        out: list[SseEvent] = []
        pending = self._data
        for line in data[:end].decode("utf-8", "replace").split("\n"):
            if line[-1:] == "\r":
                line = line[:-1]
            if line.startswith("data: "):
                pending.append(line[6:])
            elif line:
                self._field(line)
            elif pending:
                out.append(SseEvent(self._event,
                                    pending[0] if len(pending) == 1 else "\n".join(pending)))
                pending = self._data = []
                self._event = None
            else:
                self._event = None
        return out

    def close(self) -> list[SseEvent]:
        out = self.feed(b"\n") if self._partial else []
        return out + self.feed(b"\n")

    def _field(self, line: str) -> None:
        if line[0] == ":":  # a comment / keep-alive
            return
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value


async def iter_sse(response: httpx.Response, *, first_timeout: float, idle_timeout: float,
                   provider: str, model: str,
                   pace: Pace = NO_PACE) -> AsyncGenerator[SseEvent, None]:
    """The response's events; a stall past the watchdog limits is a retryable ProviderError.

    ``pace`` is the consumer's backpressure (``MessageBuilder.pace``): ``pace.wait_if_behind()``
    is awaited before each read after the first, and after an event only while ``pace.behind()``;
    so a slow consumer stops the reading, a token costs no wait, and the time spent waiting does
    not count as a stall.

    The first read is bounded by its own deadline (``first_timeout``). Later ones are bounded
    by httpx when the request's read timeout is the idle limit (``http.post_stream`` sets it
    so whenever that limit is the longer one): httpcore bounds every socket read anyway, so
    a deadline of ours per chunk would be a second cancel scope per token. Otherwise each
    read gets its own deadline here too. No cancel scope is held across a ``yield``.
    """
    decoder = SseDecoder()
    behind = pace.behind  # called after every event: the method is looked up once
    chunks = response.aiter_bytes()
    read_bound = response.request.extensions.get("timeout", {}).get("read")
    httpx_bounds_idle = read_bound is not None and read_bound <= idle_timeout
    timeout = first_timeout
    first = True
    while True:
        if not first:
            await pace.wait_if_behind()
        try:
            if first or not httpx_bounds_idle:
                with trio.move_on_after(timeout) as waited:
                    chunk = await _next(chunks)
                if waited.cancelled_caught:
                    raise _stalled(timeout, provider, model)
            else:
                chunk = await _next(chunks)
        except httpx.ReadTimeout:
            raise _stalled(read_bound or timeout, provider, model) from None
        if chunk is None:
            for event in decoder.close():
                yield event
            return
        timeout = idle_timeout
        first = False
        for event in decoder.feed(chunk):
            yield event
            if behind():
                await pace.wait_if_behind()


async def _next(chunks: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


def _stalled(seconds: float, provider: str, model: str) -> ProviderError:
    return ProviderError(
        kind="network", provider=provider, model=model,
        message=f"Stream stalled: no data for {seconds:g} s (stream stall timeout)")
