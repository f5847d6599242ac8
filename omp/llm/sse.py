"""Server-sent events: a sans-I/O decoder, and the reader that applies the stream watchdogs."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import httpx
import msgspec
import trio

from .errors import ProviderError


class SseEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event (a msgspec Struct: one is made per streamed delta)."""

    event: str | None
    data: str


class SseDecoder:
    """Bytes in, events out (the WHATWG event-stream rules that providers use).

    Written for the hot path: a provider streams one event per token, so a ``data: `` line is
    tested first and an event of one data line (nearly all of them) is not joined.
    """

    __slots__ = ("_data", "_event", "_partial")

    def __init__(self) -> None:
        self._partial = b""
        self._event: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[SseEvent]:
        data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out: list[SseEvent] = []
        for raw in lines:
            self._line(raw, out)
        return out

    def close(self) -> list[SseEvent]:
        out: list[SseEvent] = []
        if self._partial:
            self._line(self._partial, out)
            self._partial = b""
        self._line(b"", out)
        return out

    def _line(self, raw: bytes, out: list[SseEvent]) -> None:
        if raw[-1:] == b"\r":
            raw = raw[:-1]
        if raw.startswith(b"data: "):
            self._data.append(raw[6:].decode("utf-8", "replace"))
        elif not raw:
            data = self._data
            if data:
                out.append(SseEvent(self._event, data[0] if len(data) == 1 else "\n".join(data)))
                self._data = []
            self._event = None
        elif raw[0] != 0x3A:  # not a ":" comment / keep-alive
            name, _, value = raw.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value.decode("utf-8", "replace"))
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")


async def iter_sse(response: httpx.Response, *, first_timeout: float, idle_timeout: float,
                   provider: str, model: str) -> AsyncGenerator[SseEvent, None]:
    """The response's events; a stall past the watchdog limits is a retryable ProviderError.

    The first read is bounded by its own deadline (``first_timeout``). Later ones are bounded
    by httpx when the request's read timeout is the idle limit (``http.post_stream`` sets it
    so whenever that limit is the longer one): httpcore bounds every socket read anyway, so
    a deadline of ours per chunk would be a second cancel scope per token. Otherwise each
    read gets its own deadline here too. No cancel scope is held across a ``yield``.
    """
    decoder = SseDecoder()
    chunks = response.aiter_bytes()
    read_bound = response.request.extensions.get("timeout", {}).get("read")
    httpx_bounds_idle = read_bound is not None and read_bound <= idle_timeout
    timeout = first_timeout
    first = True
    while True:
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


async def _next(chunks: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


def _stalled(seconds: float, provider: str, model: str) -> ProviderError:
    return ProviderError(
        kind="network", provider=provider, model=model,
        message=f"Stream stalled: no data for {seconds:g} s (stream stall timeout)")
