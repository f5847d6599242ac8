"""Server-sent events: a sans-I/O decoder (linear in a line's length, with a bound on an
event), and the reader that applies the stream watchdogs and the other bounds of the ``stream``
settings (the whole response's size, progress), mapping each to its ProviderError."""

from __future__ import annotations

import itertools
import sys
from collections.abc import AsyncGenerator, AsyncIterator

import httpx
import msgspec
import trio

from . import errors
from .builder import NO_PACE, Pace
from .errors import ProviderError


class SseEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event (a msgspec Struct: one is made per streamed delta)."""

    event: str | None
    data: str


class EventTooLarge(Exception):
    """An event (or one line) grew past the decoder's ``max_event_bytes``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"an event of more than {limit} bytes ({size} so far)")
        self.size, self.limit = size, limit


class SseDecoder:
    """Bytes in, events out (the WHATWG event-stream rules that providers use).

    Written for the hot path: a provider streams one event per token. Each chunk's complete
    lines are decoded from UTF-8 at once (a line break is ASCII, so no character spans two
    lines), a ``data: `` line is tested first, and an event of one data line (nearly all of
    them) is not joined.

    Linear in a line's length however it is chunked: the pieces of an unfinished line are kept
    as they came and joined once, when its end arrives (joining them again for every chunk
    made a 100 MB event take 56 s). Bounded: an event whose lines (data lines counted in
    characters, the unfinished line in bytes) grow past ``max_event_bytes`` raises
    ``EventTooLarge`` as soon as it does, whatever it is (a comment line too).
    """

    __slots__ = ("_counted", "_data", "_event", "_held", "_long", "_max", "_partial", "_size",
                 "other_lines")

    def __init__(self, max_event_bytes: int = sys.maxsize) -> None:
        self._partial = b""
        """The end of the last chunk after its last line break: an unfinished line."""
        self._long: list[bytes] = []
        """Chunks without a line break that continue it, as they came (joined once)."""
        self._held = 0
        """Bytes in ``_long``."""
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0
        """Characters of the first ``_counted`` data lines of the unfinished event."""
        self._counted = 0
        self._max = max_event_bytes
        self.other_lines = 0
        """Lines that were neither data, a comment nor blank (an ``event:`` field, or what no
        event stream holds: the lines of an HTML page)."""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        end = chunk.rfind(b"\n")
        if end < 0:
            if chunk:
                self._long.append(chunk)
                self._held += len(chunk)
                held = self._size + len(self._partial) + self._held
                if held > self._max:
                    raise EventTooLarge(held, self._max)
            return []
        if self._long:  # the end of a long line
            data = b"".join((self._partial, *self._long, chunk))
            end += len(data) - len(chunk)
            self._long.clear()
            self._held = 0
        elif self._partial:
            end += len(self._partial)
            data = self._partial + chunk
        else:
            data = chunk
        self._partial = partial = data[end + 1:]
        out: list[SseEvent] = []
        pending = started = self._data
        limit = self._max
        for line in data[:end].decode("utf-8", "replace").split("\n"):
            if line[-1:] == "\r":
                line = line[:-1]
            if line.startswith("data: "):
                pending.append(line[6:])
            elif line:
                if len(line) > limit:  # a comment or field line alone over the bound
                    raise EventTooLarge(len(line), limit)
                self._field(line)
            elif pending:
                payload = pending[0] if len(pending) == 1 else "\n".join(pending)
                if len(payload) > limit:
                    raise EventTooLarge(len(payload), limit)
                out.append(SseEvent(self._event, payload))
                pending = self._data = []
                self._event = None
            else:
                self._event = None
        # Within one chunk an event is as large as the chunk at most (the network's size);
        # across chunks, what is held of an unfinished event is counted (each line once) and
        # checked here.
        if self._counted and pending is not started:  # dispatched: the one held is new
            self._size = self._counted = 0
        if pending and (count := len(pending)) > self._counted:
            self._size += sum(map(len, itertools.islice(pending, self._counted, count)))
            self._counted = count
        if self._size + len(partial) > limit:
            raise EventTooLarge(self._size + len(partial), limit)
        return out

    @property
    def progress(self) -> int:
        """A measure that grows with every byte of an event, and not with keep-alive comments:
        the characters of the unfinished event held (its data lines, and the line in progress
        unless it is a comment), plus the field lines seen."""
        line = self._partial or (self._long[0] if self._long else b"")
        unfinished = 0 if line[:1] == b":" else len(self._partial) + self._held
        return self._size + unfinished + self.other_lines

    def close(self) -> list[SseEvent]:
        out = self.feed(b"\n") if self._partial or self._long else []
        return out + self.feed(b"\n")

    def _field(self, line: str) -> None:
        if line[0] == ":":  # a comment / keep-alive
            return
        name, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        self.other_lines += 1
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value


async def iter_sse(response: httpx.Response, *, first_timeout: float, idle_timeout: float,
                   provider: str, model: str, pace: Pace = NO_PACE,
                   max_event_bytes: int = sys.maxsize,
                   max_response_bytes: int = sys.maxsize) -> AsyncGenerator[SseEvent, None]:
    """The response's events. A stall past the watchdog limits is a retryable ProviderError;
    a body over a bound or not an event stream at all is a ``bad_response`` one, never retried
    (``omp.llm.errors``).

    The bounds (the ``stream`` settings): no event larger than ``max_event_bytes``
    (``SseDecoder``), no more than ``max_response_bytes`` in all (after decompression), and no
    longer than ``idle_timeout`` without progress: no byte at all, or keep-alive comments only
    (a byte of an event, even one that takes many reads to arrive, is progress; before the
    first event the allowance is the longer of the two timeouts). A body that ended without one
    event but with lines that are not comments (an HTML page, a JSON error) is malformed,
    quoted in the error.

    ``pace`` is the consumer's backpressure (``MessageBuilder.pace``): ``pace.wait_if_behind()``
    is awaited before each read after the first, and after an event only while ``pace.behind()``;
    so a slow consumer stops the reading, a token costs no wait, and the time spent waiting does
    not count as a stall.

    The first read is bounded by its own deadline (``first_timeout``). Later ones are bounded
    by httpx when the request's read timeout is the idle limit (``http.post_stream`` sets it
    so whenever that limit is the longer one): httpcore bounds every socket read anyway, so
    a deadline of ours per chunk would be a second cancel scope per token. Otherwise each
    read gets its own deadline here too. Progress is looked at only for a read that brought no
    event (one clock read then), never per event. No cancel scope is held across a ``yield``.
    """
    decoder = SseDecoder(max_event_bytes)
    behind = pace.behind  # called after every event: the method is looked up once
    chunks = response.aiter_bytes()
    read_bound = response.request.extensions.get("timeout", {}).get("read")
    httpx_bounds_idle = read_bound is not None and read_bound <= idle_timeout
    timeout = first_timeout
    first = True
    total = 0
    head = b""  # the body's start, quoted when it turns out not to be an event stream
    sent = errors.SENT_CHARS
    # Keep-alives only since ``quiet_since`` (reset by any progress) may last ``allowance``.
    quiet_since = trio.current_time()
    allowance = max(first_timeout, idle_timeout)  # until the first event
    progressed = dispatched = False
    mark = 0
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
            try:
                last = decoder.close()
            except EventTooLarge as exc:
                raise _too_large(exc, provider, model) from None
            for event in last:
                yield event
                dispatched = True
            if not dispatched and decoder.other_lines:
                raise errors.malformed_stream("the response is not an event stream", head,
                                              provider, model)
            return
        timeout = idle_timeout
        first = False
        total += len(chunk)
        if total > max_response_bytes:
            raise errors.stream_over_limit(f"more than {max_response_bytes} bytes in one "
                                           "response", "maxResponseBytes", provider, model)
        if len(head) < sent:
            head += chunk[:sent]
        try:
            events = decoder.feed(chunk)
        except EventTooLarge as exc:
            raise _too_large(exc, provider, model) from None
        if events:
            progressed = dispatched = True
            allowance = idle_timeout
            for event in events:
                yield event
                if behind():
                    await pace.wait_if_behind()
            continue
        # No event: part of one, or keep-alives. (After events, the time a slow consumer
        # took is no stall: the quiet starts now.)
        now, before, mark = trio.current_time(), mark, decoder.progress
        if progressed or mark != before:
            quiet_since, progressed = now, False
        elif now - quiet_since > allowance:
            raise _stalled(allowance, provider, model, "no event (keep-alives only)")


def _too_large(exc: EventTooLarge, provider: str, model: str) -> ProviderError:
    return errors.stream_over_limit(f"an event of more than {exc.limit} bytes",
                                    "maxEventBytes", provider, model)


async def _next(chunks: AsyncIterator[bytes]) -> bytes | None:
    try:
        return await chunks.__anext__()
    except StopAsyncIteration:
        return None


def _stalled(seconds: float, provider: str, model: str, what: str = "no data") -> ProviderError:
    return ProviderError(
        kind="network", provider=provider, model=model,
        message=f"Stream stalled: {what} for {seconds:g} s (stream stall timeout; "
                "stream.idleTimeoutMs in config.yml)")
