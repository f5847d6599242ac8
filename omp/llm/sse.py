"""Server-sent events: a sans-I/O decoder, and the reader that applies the stream watchdogs."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import attrs
import httpx
import trio

from .errors import ProviderError


@attrs.frozen
class SseEvent:
    event: str | None
    data: str


@attrs.define
class SseDecoder:
    """Bytes in, events out (the WHATWG event-stream rules that providers use)."""

    _partial: bytes = b""
    _event: str | None = None
    _data: list[str] = attrs.field(factory=list)

    def feed(self, chunk: bytes) -> list[SseEvent]:
        data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        out: list[SseEvent] = []
        for raw in lines:
            self._line(raw.removesuffix(b"\r"), out)
        return out

    def close(self) -> list[SseEvent]:
        out: list[SseEvent] = []
        if self._partial:
            self._line(self._partial.removesuffix(b"\r"), out)
            self._partial = b""
        self._line(b"", out)
        return out

    def _line(self, raw: bytes, out: list[SseEvent]) -> None:
        if not raw:
            if self._data:
                out.append(SseEvent(self._event, "\n".join(self._data)))
            self._event = None
            self._data = []
            return
        if raw[0] == 0x3A:  # ":" comment / keep-alive
            return
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

    Every read is bounded by its own deadline (no cancel scope is held across a ``yield``).
    """
    decoder = SseDecoder()
    chunks = response.aiter_bytes()
    timeout = first_timeout
    while True:
        with trio.move_on_after(timeout) as waited:
            try:
                chunk = await chunks.__anext__()
            except StopAsyncIteration:
                chunk = None
        if waited.cancelled_caught:
            raise ProviderError(
                kind="network", provider=provider, model=model,
                message=f"Stream stalled: no data for {timeout:g} s (stream stall timeout)")
        if chunk is None:
            for event in decoder.close():
                yield event
            return
        timeout = idle_timeout
        for event in decoder.feed(chunk):
            yield event
