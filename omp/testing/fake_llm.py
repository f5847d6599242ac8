"""A scripted fake LLM server: real HTTP/1.1 on loopback, speaking four providers' streams.

``open_fake_llm(script)`` serves a :mod:`omp.testing.script` script on an ephemeral port with
trio + h11. Each request takes the first unused reply whose ``match`` fits and gets it rendered
in the streaming format of the API its path names (``/chat/completions``, ``/responses``,
``/messages``, ``:streamGenerateContent``), so one script drives every provider. Nothing in the
client's code path is mocked: httpx talks real HTTP, sees chunks as they are flushed, and meets
real dropped and hung connections.

Streaming rules, the same for every format:

- The response head (status 200, ``content-type: text/event-stream``, chunked) goes out at once.
  A format's preamble (``message_start``, ``response.created``, the role chunk) is written lazily
  with the first content chunk (or the finish), so ``hangAfter: 0`` sends the head and nothing else.
- ``chunks[i].delay`` waits before chunk ``i``; ``chunks[i].at`` waits until that many seconds
  after the reply began (a pace that does not drift); ``chunks[i].gate`` waits until the test
  calls ``FakeLLM.open_gate`` with its name (``FakeLLM.waiting`` counts the responses waiting
  at each gate). Everything rendered before a wait is flushed first; chunks without a wait are
  batched into writes of about 64 KiB.
- ``dropAfter: N`` / ``hangAfter: N`` act after the first ``N`` entries of ``chunks`` (delay-only
  entries count; with ``raw``, after ``N`` raw lines), before any finish. ``dropAfter`` closes
  the TCP connection mid-body; ``hangAfter`` keeps it open, silent, until the client goes away.
- ``errorEvent`` replaces the finish with the provider's in-stream error; the body then ends.
- ``flood`` follows ``raw`` (or replaces ``chunks``): bytes made as they are sent, in writes of
  about 64 KiB, never held whole; without ``bytes`` they go on until the client goes away.
- A client that goes away before the response is complete (a failed write, or EOF on the socket
  while streaming, waiting or hanging) is counted in ``FakeLLM.disconnects``.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, urlsplit

import attrs
import h11
import msgspec
import trio
from msgspec import UNSET

from ..groups import unwrap
from .listen import accept_forever, one_listener
from .script import Chunk, Flood, Reply, Script, ScriptUsage, ToolCallChunk, load_script

__all__ = [
    "FakeLLM",
    "RecordedRequest",
    "main",
    "open_fake_llm",
    "serve_fake_llm",
]

ScriptSource = Script | Sequence[Reply | dict[str, Any]] | str | bytes | os.PathLike[str]
"""A script: ``Reply`` objects, their JSON-shaped dicts, JSON text, or the path of a JSON file."""

_FLUSH_BYTES = 64 * 1024
_RECEIVE_BYTES = 64 * 1024
_encode = msgspec.json.Encoder().encode

StopReason = Literal["stop", "length", "toolUse", "error"]


# --------------------------------------------------------------------------- recorded requests


@attrs.frozen
class RecordedRequest:
    """One request as the server received it."""

    method: str
    target: str
    """The request target as sent: path plus ``?query``."""
    path: str
    query: dict[str, str]
    """Query parameters (the last value wins for a repeated name)."""
    headers: dict[str, str]
    """Header names lower-cased; repeated headers joined with ``", "``."""
    body: bytes
    connection: int
    """Serial number of the TCP connection it arrived on (1, 2, ...): shows keep-alive reuse."""

    def json(self) -> Any:
        """The body decoded as JSON (raises ``msgspec.DecodeError`` if it is not JSON)."""
        return msgspec.json.decode(self.body)

    @property
    def model(self) -> str | None:
        """The model id asked for: the JSON body's ``model``, or Google's ``models/<id>:`` path."""
        return _model_of(self.path, self.body)


_GOOGLE_MODEL = re.compile(r"models/([^/:]+):")


def _model_of(path: str, body: bytes) -> str | None:
    found = _GOOGLE_MODEL.search(path)
    if found:
        return found.group(1)
    payload = _json_object(body)
    model = payload.get("model")
    return model if isinstance(model, str) else None


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        payload = msgspec.json.decode(body) if body else None
    except msgspec.DecodeError:
        return {}
    return payload if isinstance(payload, dict) else {}


# --------------------------------------------------------------------------- the server object


def _to_script(source: ScriptSource) -> Script:
    """Any accepted script form as ``Reply`` objects; a bad one raises msgspec's error."""
    if isinstance(source, str | bytes):
        return load_script(source)
    if isinstance(source, os.PathLike):
        with open(source, "rb") as file:
            return load_script(file.read())
    return [_to_reply(entry) for entry in source]


def _to_reply(entry: Reply | dict[str, Any]) -> Reply:
    if isinstance(entry, Reply):
        return entry
    return msgspec.convert(entry, type=Reply)


@attrs.define
class _Entry:
    reply: Reply
    used: bool = False


@attrs.define(eq=False, repr=False)
class FakeLLM:
    """A running fake LLM server: its address, what it was asked, and what it saw.

    The counters change only inside the server's tasks; ``wait_until`` and its two shorthands
    let a test wait for a state instead of sleeping.
    """

    base_url: str
    """``http://HOST:PORT`` without a trailing slash; append the provider's path."""
    requests: list[RecordedRequest] = attrs.field(factory=list)
    disconnects: int = 0
    """Responses cut off because the client went away before they were complete."""
    active: int = 0
    """Responses in progress."""
    connections: int = 0
    """TCP connections open right now."""
    finished_at: list[float] = attrs.field(factory=list)
    """``time.monotonic()`` when each complete response was handed to the socket (the clock
    is system-wide, so another process on this machine can compare its own times to it)."""
    waiting: dict[str, int] = attrs.field(factory=dict)
    """Responses waiting right now at each gate (``Chunk.gate``) not yet opened."""
    _entries: list[_Entry] = attrs.field(factory=list)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _gates: dict[str, trio.Event] = attrs.field(factory=dict)
    _connection_serial: int = 0
    _response_serial: int = 0

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def add(self, reply: Reply | dict[str, Any]) -> None:
        """Append a reply to the script (a dict is validated like a JSON script entry)."""
        self._entries.append(_Entry(_to_reply(reply)))

    @property
    def remaining(self) -> int:
        """Replies not yet used (``repeat`` replies always count)."""
        return sum(1 for entry in self._entries if not entry.used)

    async def wait_until(self, predicate: Callable[[FakeLLM], bool]) -> None:
        """Return once ``predicate(self)`` holds; it is re-checked after every change.

        Cancellation just stops the waiting; nothing else is affected.
        """
        while not predicate(self):
            await self._changed.wait()

    def open_gate(self, name: str) -> None:
        """Let every response waiting at the gate ``name`` go on, and every later one pass it
        (a gate stays open)."""
        self._gate(name).set()

    def _gate(self, name: str) -> trio.Event:
        return self._gates.setdefault(name, trio.Event())

    async def _pass_gate(self, name: str) -> None:
        """Wait until the gate ``name`` is open; cancellation (the client left) stops it."""
        gate = self._gate(name)
        if gate.is_set():
            return
        self.waiting[name] = self.waiting.get(name, 0) + 1
        self._notify()
        try:
            await gate.wait()
        finally:
            self.waiting[name] -= 1
            if not self.waiting[name]:
                del self.waiting[name]
            self._notify()

    async def wait_for_disconnect(self, count: int = 1) -> None:
        """Return once ``disconnects >= count``. Cancellation just stops the waiting."""
        await self.wait_until(lambda fake: fake.disconnects >= count)

    async def wait_idle(self) -> None:
        """Return once no response is in progress. Cancellation just stops the waiting."""
        await self.wait_until(lambda fake: fake.active == 0)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _select(self, request: RecordedRequest) -> Reply | None:
        model: str | Literal[False] | None = False  # decoded lazily: most replies don't match
        for entry in self._entries:
            if entry.used:
                continue
            match = entry.reply.match
            if match is not UNSET:
                if match.path is not UNSET and match.path not in request.path:
                    continue
                if (match.bodyContains is not UNSET
                        and match.bodyContains.encode() not in request.body):
                    continue
                if match.model is not UNSET:
                    if model is False:
                        model = request.model
                    if match.model != model:
                        continue
            if not entry.reply.repeat:
                entry.used = True
            return entry.reply
        return None

    # ----------------------------------------------------------------------- connections

    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        """Serve one keep-alive connection until either side closes it."""
        self._connection_serial += 1
        serial = self._connection_serial
        conn = h11.Connection(h11.SERVER)
        self.connections += 1
        self._notify()
        try:
            while True:
                request = await _receive_request(conn, stream, serial)
                if request is None:
                    break
                if not await self._respond(conn, stream, request):
                    break
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break  # "Connection: close", or an HTTP/1.0 client
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client reset the connection between requests
        except h11.RemoteProtocolError as exc:
            await _send_bad_request(conn, stream, exc)
        finally:
            await trio.aclose_forcefully(stream)
            self.connections -= 1
            self._notify()

    async def _respond(self, conn: h11.Connection, stream: trio.SocketStream,
                       request: RecordedRequest) -> bool:
        """Answer one request; whether the connection can carry another."""
        self.requests.append(request)
        reply = self._select(request)
        self.active += 1
        self._notify()
        try:
            if reply is None:
                message = (f"fake LLM: script exhausted: no unused reply matches "
                           f"{request.method} {request.path}")
                return await _send_body(conn, stream, 500, {}, _error_body(message, "exhausted"))
            if reply.status != 200 or reply.body is not UNSET:
                return await _send_body(conn, stream, reply.status, reply.headers,
                                        UNSET if reply.body is UNSET else reply.body)
            api = _api_of(request.path)
            if api is None and reply.raw is UNSET:
                message = f"fake LLM: no streaming API at path {request.path}"
                return await _send_body(conn, stream, 404, {}, _error_body(message, "not_found"))
            if api is _Google and reply.raw is UNSET:
                problem = _google_arguments_problem(reply)
                if problem is not None:
                    return await _send_body(conn, stream, 500, {}, _error_body(problem, "script"))
            self._response_serial += 1
            return await self._stream(conn, stream, request, reply, api)
        finally:
            self.active -= 1
            self._notify()

    async def _stream(self, conn: h11.Connection, stream: trio.SocketStream,
                      request: RecordedRequest, reply: Reply,
                      api: type[_Renderer] | None) -> bool:
        state = _StreamState()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_client, conn, stream, state, nursery.cancel_scope)
            try:
                await _write_stream(conn, stream, request, reply, api, state,
                                    self._response_serial, self._pass_gate)
                if state.finished:
                    self.finished_at.append(time.monotonic())
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                state.client_gone = True
            nursery.cancel_scope.cancel()
        if state.client_gone and not state.finished:
            self.disconnects += 1
        return state.finished and not state.client_eof


@attrs.define
class _StreamState:
    finished: bool = False
    """The whole response, terminator included, was handed to the socket."""
    client_gone: bool = False
    client_eof: bool = False


async def _watch_client(conn: h11.Connection, stream: trio.SocketStream, state: _StreamState,
                        scope: trio.CancelScope) -> None:
    """Read while a response streams: EOF means the client left, so stop the response."""
    while True:
        try:
            data = await stream.receive_some(_RECEIVE_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            state.client_eof = True
            if not state.finished:
                state.client_gone = True
            scope.cancel()
            return
        conn.receive_data(data)  # a pipelined next request: h11 keeps it for the next cycle


async def _receive_request(conn: h11.Connection, stream: trio.SocketStream,
                           serial: int) -> RecordedRequest | None:
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            if conn.they_are_waiting_for_100_continue:
                await stream.send_all(conn.send(h11.InformationalResponse(
                    status_code=100, headers=[])))
            conn.receive_data(await stream.receive_some(_RECEIVE_BYTES))
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return _recorded(head, bytes(body), serial)
        else:  # ConnectionClosed, or PAUSED (cannot happen: we answer before reading on)
            return None


def _recorded(head: h11.Request, body: bytes, serial: int) -> RecordedRequest:
    target = head.target.decode("latin-1")
    parts = urlsplit(target)
    headers: dict[str, str] = {}
    for name, value in head.headers:
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return RecordedRequest(
        method=head.method.decode("latin-1"), target=target, path=parts.path,
        query=dict(parse_qsl(parts.query, keep_blank_values=True)), headers=headers,
        body=body, connection=serial)


def _error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": f"fake_llm_{kind}"}}


async def _send_body(conn: h11.Connection, stream: trio.SocketStream, status: int,
                     headers: dict[str, str], body: Any) -> bool:
    """A complete non-streaming response; whether the connection stays usable."""
    if body is UNSET:
        data, content_type = b"", None
    elif isinstance(body, str):
        data, content_type = body.encode(), "text/plain; charset=utf-8"
    else:
        data, content_type = _encode(body), "application/json"
    wire: list[tuple[str, str]] = list(headers.items())
    names = {name.lower() for name in headers}
    if content_type is not None and "content-type" not in names:
        wire.append(("content-type", content_type))
    wire = [(k, v) for k, v in wire if k.lower() not in ("content-length", "transfer-encoding")]
    wire.append(("content-length", str(len(data))))
    out = conn.send(h11.Response(status_code=status, headers=wire))
    if data:
        out += conn.send(h11.Data(data=data))
    out += conn.send(h11.EndOfMessage())
    await stream.send_all(out)
    return True


async def _send_bad_request(conn: h11.Connection, stream: trio.SocketStream,
                            exc: h11.RemoteProtocolError) -> None:
    if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
        return
    body = _encode(_error_body(f"fake LLM: bad HTTP request: {exc}", "bad_request"))
    with suppress(trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
        await stream.send_all(
            conn.send(h11.Response(status_code=exc.error_status_hint, headers=[
                ("content-type", "application/json"), ("content-length", str(len(body))),
                ("connection", "close")]))
            + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage()))


async def _send_flood(conn: h11.Connection, stream: trio.SocketStream, flood: Flood) -> None:
    """``flood``'s bytes, made as they are sent (endless: until the client goes away)."""
    fill = flood.fill.encode() or b"x"
    piece = fill if flood.every > 0 else fill * max(1, _FLUSH_BYTES // len(fill))
    if flood.prefix:
        await stream.send_all(conn.send(h11.Data(data=flood.prefix.encode())))
    left = None if flood.bytes is UNSET else flood.bytes
    while left is None or left > 0:
        data = piece if left is None or left >= len(piece) else piece[:left]
        await stream.send_all(conn.send(h11.Data(data=data)))
        if left is not None:
            left -= len(data)
        if flood.every > 0:
            await trio.sleep(flood.every)
    if flood.suffix:
        await stream.send_all(conn.send(h11.Data(data=flood.suffix.encode())))


async def _write_stream(conn: h11.Connection, stream: trio.SocketStream,
                        request: RecordedRequest, reply: Reply, api: type[_Renderer] | None,
                        state: _StreamState, serial: int,
                        pass_gate: Callable[[str], Awaitable[None]]) -> None:
    """Head, chunks (batched between waits), then the finish or the in-stream error.

    Returns early, leaving the body unterminated, for ``dropAfter``; sleeps until cancelled
    (by the client watcher) for ``hangAfter``.
    """
    headers = [(k, v) for k, v in reply.headers.items()
               if k.lower() not in ("content-length", "transfer-encoding")]
    if not any(k.lower() == "content-type" for k, _ in headers):
        headers.append(("content-type", "text/event-stream"))
    headers.append(("cache-control", "no-cache"))
    await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)))
    out = bytearray()

    async def flush() -> None:
        if out:
            data = bytes(out)
            out.clear()
            await stream.send_all(conn.send(h11.Data(data=data)))

    if reply.flood is not UNSET:
        for line in [] if reply.raw is UNSET else reply.raw:
            out += line.encode() + b"\n"
        await flush()
        await _send_flood(conn, stream, reply.flood)
        await stream.send_all(conn.send(h11.EndOfMessage()))
        state.finished = True
        return
    items: Sequence[Chunk] | list[str] = reply.chunks if reply.raw is UNSET else reply.raw
    drop = len(items) + 1 if reply.dropAfter is UNSET else min(reply.dropAfter, len(items))
    hang = len(items) + 1 if reply.hangAfter is UNSET else min(reply.hangAfter, len(items))
    cut = min(drop, hang)
    if reply.raw is not UNSET:
        for line in reply.raw[:cut]:
            out += line.encode()
            out += b"\n"
    else:
        assert api is not None
        options = _json_object(request.body).get("stream_options")
        renderer = api(out, model=request.model or "fake-model", serial=serial,
                       usage=reply.usage, include_usage=(
                           isinstance(options, dict) and options.get("include_usage") is True))
        began = trio.current_time()
        for chunk in reply.chunks[:cut] if cut < len(items) else reply.chunks:
            if chunk.delay > 0:
                await flush()
                await trio.sleep(chunk.delay)
            if chunk.at is not UNSET:
                await flush()
                await trio.sleep_until(began + chunk.at)
            if chunk.gate is not UNSET:
                await flush()
                await pass_gate(chunk.gate)
            renderer.chunk(chunk)
            if len(out) >= _FLUSH_BYTES:
                await flush()
        if cut > len(items):
            if reply.errorEvent is not UNSET:
                renderer.error(reply.errorEvent)
            else:
                stop: StopReason = reply.stop if reply.stop is not UNSET else (
                    "toolUse" if renderer.saw_tool_call else "stop")
                renderer.finish(stop)
    if cut <= len(items):
        await flush()
        if cut == hang and cut != drop:
            await trio.sleep_forever()
        return  # dropAfter: the caller closes the connection mid-body
    final = conn.send(h11.Data(data=bytes(out))) if out else b""
    await stream.send_all(final + conn.send(h11.EndOfMessage()))
    state.finished = True


# --------------------------------------------------------------------------- rendering


class _Renderer:
    """Turns script chunks into one API's SSE bytes, appended to ``out``.

    Consecutive ``text`` chunks form one text block, consecutive ``thinking`` chunks one
    thinking block; a redacted thinking and each tool call are blocks of their own.
    """

    def __init__(self, out: bytearray, *, model: str, serial: int, usage: ScriptUsage,
                 include_usage: bool) -> None:
        self.out = out
        self.model = model
        self.serial = serial
        self.usage = usage
        self.include_usage = include_usage
        self.created = int(time.time())
        self.begun = False
        self.saw_tool_call = False

    def chunk(self, chunk: Chunk) -> None:
        text = chunk.text
        if (chunk.thinking is UNSET and chunk.signature is UNSET
                and chunk.redactedThinking is UNSET and chunk.toolCall is UNSET):
            if text is not UNSET:  # the hot path: a plain text delta
                if not self.begun:
                    self.begin()
                self.text(text)
            return
        if not self.begun:
            self.begin()
        if chunk.thinking is not UNSET or chunk.signature is not UNSET:
            self.thinking("" if chunk.thinking is UNSET else chunk.thinking,
                          "" if chunk.signature is UNSET else chunk.signature)
        if chunk.redactedThinking is not UNSET:
            self.redacted_thinking(chunk.redactedThinking)
        if text is not UNSET:
            self.text(text)
        if chunk.toolCall is not UNSET:
            self.saw_tool_call = True
            self.tool_call(chunk.toolCall)

    def begin(self) -> None:
        self.begun = True

    def text(self, text: str) -> None:
        raise NotImplementedError

    def thinking(self, text: str, signature: str) -> None:
        raise NotImplementedError

    def redacted_thinking(self, data: str) -> None:
        raise NotImplementedError

    def tool_call(self, call: ToolCallChunk) -> None:
        raise NotImplementedError

    def finish(self, stop: StopReason) -> None:
        raise NotImplementedError

    def error(self, message: str) -> None:
        raise NotImplementedError


class _Completions(_Renderer):
    """openai-completions: ``data: {chat.completion.chunk}`` lines, then ``data: [DONE]``."""

    FINISH: ClassVar[dict[str, str]] = {
        "stop": "stop", "length": "length", "toolUse": "tool_calls", "error": "content_filter"}

    def __init__(self, out: bytearray, **kwargs: Any) -> None:
        super().__init__(out, **kwargs)
        self.id = f"chatcmpl-fake-{self.serial}"
        self.head = (b'data: {"id":' + _encode(self.id)
                     + b',"object":"chat.completion.chunk","created":' + str(self.created).encode()
                     + b',"model":' + _encode(self.model) + b',"choices":[{"index":0,"delta":')
        self.tail = b',"finish_reason":null}]}\n\n'
        self.tool_index = 0

    def delta(self, delta: dict[str, Any]) -> None:
        self.out += self.head + _encode(delta) + self.tail

    def begin(self) -> None:
        super().begin()
        self.delta({"role": "assistant", "content": ""})

    def text(self, text: str) -> None:
        self.out += self.head + b'{"content":' + _encode(text) + b"}" + self.tail

    def thinking(self, text: str, signature: str) -> None:
        if text:
            self.out += self.head + b'{"reasoning_content":' + _encode(text) + b"}" + self.tail

    def redacted_thinking(self, data: str) -> None:
        pass  # Chat Completions has no redacted reasoning

    def tool_call(self, call: ToolCallChunk) -> None:
        index = self.tool_index
        self.tool_index += 1
        pieces = call.arguments or [""]
        self.delta({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                    "function": {"name": call.name, "arguments": pieces[0]}}]})
        for piece in pieces[1:]:
            self.delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})

    def finish(self, stop: StopReason) -> None:
        if not self.begun:
            self.begin()
        self.out += (self.head + b'{},"finish_reason":' + _encode(self.FINISH[stop])
                     + b"}]}\n\n")
        if self.include_usage:
            usage = self.usage
            prompt = usage.input + usage.cacheRead
            self.out += b"data: " + _encode({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [],
                "usage": {"prompt_tokens": prompt, "completion_tokens": usage.output,
                          "total_tokens": prompt + usage.output,
                          "prompt_tokens_details": {"cached_tokens": usage.cacheRead},
                          "completion_tokens_details": {"reasoning_tokens": usage.reasoning}},
            }) + b"\n\n"
        self.out += b"data: [DONE]\n\n"

    def error(self, message: str) -> None:
        self.out += b"data: " + _encode({"error": {
            "message": message, "type": "server_error", "param": None, "code": None}}) + b"\n\n"


class _Responses(_Renderer):
    """openai-responses: ``event: <type>`` + ``data: {"type", "sequence_number", ...}``."""

    def __init__(self, out: bytearray, **kwargs: Any) -> None:
        super().__init__(out, **kwargs)
        self.id = f"resp_fake_{self.serial}"
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.open: Literal["text", "thinking"] | None = None
        self.item_id = ""
        self.parts: list[str] = []
        self.signature = ""
        self.text_tail = b""

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        data = _encode({"type": kind, "sequence_number": self.sequence, **fields})
        self.sequence += 1
        self.out += b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    def response(self, status: str, **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": status, "model": self.model, "output": list(self.output), **extra}

    @property
    def output_index(self) -> int:
        return len(self.output)

    def begin(self) -> None:
        super().begin()
        self.event("response.created", {"response": self.response("in_progress")})
        self.event("response.in_progress", {"response": self.response("in_progress")})

    def add_item(self, item: dict[str, Any]) -> None:
        self.event("response.output_item.added", {"output_index": self.output_index, "item": item})

    def done_item(self, item: dict[str, Any]) -> None:
        self.event("response.output_item.done", {"output_index": self.output_index, "item": item})
        self.output.append(item)

    def close(self) -> None:
        if self.open is None:
            return
        text = "".join(self.parts)
        common = {"item_id": self.item_id, "output_index": self.output_index}
        if self.open == "text":
            part = {"type": "output_text", "text": text, "annotations": []}
            self.event("response.output_text.done", {**common, "content_index": 0, "text": text})
            self.event("response.content_part.done", {**common, "content_index": 0, "part": part})
            self.done_item({"id": self.item_id, "type": "message", "status": "completed",
                            "role": "assistant", "content": [part]})
        else:
            part = {"type": "summary_text", "text": text}
            self.event("response.reasoning_summary_text.done",
                       {**common, "summary_index": 0, "text": text})
            self.event("response.reasoning_summary_part.done",
                       {**common, "summary_index": 0, "part": part})
            item: dict[str, Any] = {"id": self.item_id, "type": "reasoning", "summary": [part]}
            if self.signature:
                item["encrypted_content"] = self.signature
            self.done_item(item)
        self.open = None
        self.parts = []
        self.signature = ""

    def text(self, text: str) -> None:
        if self.open != "text":
            self.close()
            self.open = "text"
            self.item_id = f"msg_fake_{self.serial}_{self.output_index}"
            self.add_item({"id": self.item_id, "type": "message", "status": "in_progress",
                           "role": "assistant", "content": []})
            self.event("response.content_part.added", {
                "item_id": self.item_id, "output_index": self.output_index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}})
            self.text_tail = (b',"item_id":' + _encode(self.item_id) + b',"output_index":'
                              + str(self.output_index).encode() + b',"content_index":0,"delta":')
        self.parts.append(text)
        # The hot path, written by hand: same bytes as event("response.output_text.delta", ...).
        self.out += (b"event: response.output_text.delta\n"
                     b'data: {"type":"response.output_text.delta","sequence_number":'
                     + str(self.sequence).encode() + self.text_tail
                     + _encode(text) + b"}\n\n")
        self.sequence += 1

    def thinking(self, text: str, signature: str) -> None:
        if self.open != "thinking":
            self.close()
            self.open = "thinking"
            self.item_id = f"rs_fake_{self.serial}_{self.output_index}"
            self.add_item({"id": self.item_id, "type": "reasoning", "summary": []})
            self.event("response.reasoning_summary_part.added", {
                "item_id": self.item_id, "output_index": self.output_index, "summary_index": 0,
                "part": {"type": "summary_text", "text": ""}})
        if text:
            self.parts.append(text)
            self.event("response.reasoning_summary_text.delta", {
                "item_id": self.item_id, "output_index": self.output_index, "summary_index": 0,
                "delta": text})
        self.signature += signature

    def redacted_thinking(self, data: str) -> None:
        self.close()
        item_id = f"rs_fake_{self.serial}_{self.output_index}"
        self.add_item({"id": item_id, "type": "reasoning", "summary": []})
        self.done_item({"id": item_id, "type": "reasoning", "summary": [],
                        "encrypted_content": data})

    def tool_call(self, call: ToolCallChunk) -> None:
        self.close()
        item_id = f"fc_fake_{self.serial}_{self.output_index}"
        item = {"id": item_id, "type": "function_call", "status": "in_progress",
                "call_id": call.id, "name": call.name, "arguments": ""}
        self.add_item(item)
        for piece in call.arguments:
            self.event("response.function_call_arguments.delta",
                       {"item_id": item_id, "output_index": self.output_index, "delta": piece})
        arguments = "".join(call.arguments)
        self.event("response.function_call_arguments.done",
                   {"item_id": item_id, "output_index": self.output_index,
                    "arguments": arguments})
        self.done_item({**item, "status": "completed", "arguments": arguments})

    def usage_json(self) -> dict[str, Any]:
        usage = self.usage
        prompt = usage.input + usage.cacheRead
        return {"input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": usage.cacheRead},
                "output_tokens": usage.output,
                "output_tokens_details": {"reasoning_tokens": usage.reasoning},
                "total_tokens": prompt + usage.output}

    def finish(self, stop: StopReason) -> None:
        if not self.begun:
            self.begin()
        self.close()
        if stop == "length":
            response = self.response("incomplete",
                                     incomplete_details={"reason": "max_output_tokens"})
        elif stop == "error":
            response = self.response("failed", error={
                "code": "server_error", "message": "fake LLM: stop reason error"})
        else:
            response = self.response("completed")
        response["usage"] = self.usage_json()
        self.event("response.completed", {"response": response})

    def error(self, message: str) -> None:
        if not self.begun:
            self.begin()
        self.event("error", {"code": "server_error", "message": message, "param": None})
        response = self.response("failed", error={"code": "server_error", "message": message})
        self.event("response.failed", {"response": response})


class _Anthropic(_Renderer):
    """anthropic-messages: ``event: <type>`` + ``data: {"type": <type>, ...}``."""

    STOP: ClassVar[dict[str, str]] = {
        "stop": "end_turn", "length": "max_tokens", "toolUse": "tool_use", "error": "refusal"}

    def __init__(self, out: bytearray, **kwargs: Any) -> None:
        super().__init__(out, **kwargs)
        self.index = 0
        self.open: Literal["text", "thinking"] | None = None
        self.text_head = b""

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        self.out += (b"event: " + kind.encode() + b"\ndata: "
                     + _encode({"type": kind, **fields}) + b"\n\n")

    def begin(self) -> None:
        super().begin()
        usage = self.usage
        self.event("message_start", {"message": {
            "id": f"msg_fake_{self.serial}", "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": usage.input,
                      "cache_creation_input_tokens": usage.cacheWrite,
                      "cache_read_input_tokens": usage.cacheRead, "output_tokens": 0}}})
        self.out += b'event: ping\ndata: {"type":"ping"}\n\n'

    def start_block(self, block: dict[str, Any]) -> None:
        self.event("content_block_start", {"index": self.index, "content_block": block})

    def close(self) -> None:
        if self.open is not None:
            self.stop_block()
            self.open = None

    def stop_block(self) -> None:
        self.event("content_block_stop", {"index": self.index})
        self.index += 1

    def text(self, text: str) -> None:
        if self.open != "text":
            self.close()
            self.open = "text"
            self.start_block({"type": "text", "text": ""})
            self.text_head = (b'event: content_block_delta\ndata: {"type":"content_block_delta",'
                              b'"index":' + str(self.index).encode()
                              + b',"delta":{"type":"text_delta","text":')
        self.out += self.text_head + _encode(text) + b"}}\n\n"

    def thinking(self, text: str, signature: str) -> None:
        if self.open != "thinking":
            self.close()
            self.open = "thinking"
            self.start_block({"type": "thinking", "thinking": ""})
        if text:
            self.event("content_block_delta", {
                "index": self.index, "delta": {"type": "thinking_delta", "thinking": text}})
        if signature:
            self.event("content_block_delta", {
                "index": self.index, "delta": {"type": "signature_delta", "signature": signature}})

    def redacted_thinking(self, data: str) -> None:
        self.close()
        self.start_block({"type": "redacted_thinking", "data": data})
        self.stop_block()

    def tool_call(self, call: ToolCallChunk) -> None:
        self.close()
        self.start_block({"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        for piece in call.arguments:
            self.event("content_block_delta", {
                "index": self.index, "delta": {"type": "input_json_delta", "partial_json": piece}})
        self.stop_block()

    def finish(self, stop: StopReason) -> None:
        if not self.begun:
            self.begin()
        self.close()
        self.event("message_delta", {
            "delta": {"stop_reason": self.STOP[stop], "stop_sequence": None},
            "usage": {"output_tokens": self.usage.output}})
        self.event("message_stop", {})

    def error(self, message: str) -> None:
        if not self.begun:
            self.begin()
        self.event("error", {"error": {"type": "overloaded_error", "message": message}})


class _Google(_Renderer):
    """google-generative-ai: ``data: {GenerateContentResponse}`` lines ending in CRLF CRLF."""

    FINISH: ClassVar[dict[str, str]] = {
        "stop": "STOP", "length": "MAX_TOKENS", "toolUse": "STOP", "error": "SAFETY"}

    def __init__(self, out: bytearray, **kwargs: Any) -> None:
        super().__init__(out, **kwargs)
        self.response_id = f"fake-{self.serial}"
        self.head = b'data: {"candidates":[{"content":{"parts":['
        self.tail = (b'],"role":"model"},"index":0}],"modelVersion":' + _encode(self.model)
                     + b',"responseId":' + _encode(self.response_id) + b"}\r\n\r\n")

    def part(self, part: dict[str, Any]) -> None:
        self.out += self.head + _encode(part) + self.tail

    def text(self, text: str) -> None:
        self.out += self.head + b'{"text":' + _encode(text) + b"}" + self.tail

    def thinking(self, text: str, signature: str) -> None:
        part: dict[str, Any] = {"text": text, "thought": True}
        if signature:
            part["thoughtSignature"] = signature
        self.part(part)

    def redacted_thinking(self, data: str) -> None:
        pass  # Gemini has no redacted thinking

    def tool_call(self, call: ToolCallChunk) -> None:
        joined = "".join(call.arguments)
        args = msgspec.json.decode(joined) if joined else {}
        self.part({"functionCall": {"name": call.name, "args": args, "id": call.id}})

    def finish(self, stop: StopReason) -> None:
        usage = self.usage
        prompt = usage.input + usage.cacheRead
        candidates = max(usage.output - usage.reasoning, 0)
        metadata: dict[str, Any] = {"promptTokenCount": prompt,
                                    "candidatesTokenCount": candidates}
        if usage.reasoning:
            metadata["thoughtsTokenCount"] = usage.reasoning
        if usage.cacheRead:
            metadata["cachedContentTokenCount"] = usage.cacheRead
        metadata["totalTokenCount"] = prompt + candidates + usage.reasoning
        self.out += b"data: " + _encode({
            "candidates": [{"content": {"parts": [], "role": "model"},
                            "finishReason": self.FINISH[stop], "index": 0}],
            "usageMetadata": metadata, "modelVersion": self.model,
            "responseId": self.response_id}) + b"\r\n\r\n"

    def error(self, message: str) -> None:
        self.out += b"data: " + _encode({"error": {
            "code": 503, "message": message, "status": "UNAVAILABLE"}}) + b"\r\n\r\n"


def _api_of(path: str) -> type[_Renderer] | None:
    if ":streamGenerateContent" in path:
        return _Google
    if path.endswith("/chat/completions"):
        return _Completions
    if path.endswith("/responses"):
        return _Responses
    if path.endswith("/messages"):
        return _Anthropic
    return None


def _google_arguments_problem(reply: Reply) -> str | None:
    """Gemini sends ``args`` as an object, so the joined pieces must be a JSON object."""
    for chunk in reply.chunks:
        call = chunk.toolCall
        if call is UNSET or not call.arguments:
            continue
        try:
            args = msgspec.json.decode("".join(call.arguments))
        except msgspec.DecodeError as exc:
            args = exc
        if not isinstance(args, dict):
            return (f"fake LLM: toolCall {call.id!r} arguments are not a JSON object, "
                    "which Google cannot send")
    return None


# --------------------------------------------------------------------------- serving


async def serve_fake_llm(script: ScriptSource = (), *, host: str = "127.0.0.1", port: int = 0,
                         task_status: trio.TaskStatus[FakeLLM] = trio.TASK_STATUS_IGNORED
                         ) -> None:
    """Serve ``script`` until cancelled; ``nursery.start`` returns the running ``FakeLLM``.

    The variant of ``open_fake_llm`` for callers that bring their own nursery. A bad script
    raises msgspec's error before anything listens. On cancellation the listener closes and
    every connection is dropped (an unfinished response counts as neither sent nor
    disconnected); the function then re-raises ``Cancelled``.
    """
    replies = _to_script(script)
    async with one_listener(host, port) as (listener, authority):
        fake = FakeLLM(base_url=f"http://{authority}")
        for reply in replies:
            fake.add(reply)
        task_status.started(fake)
        # A connection's task ends right after it updates ``connections``, so "connections
        # == 0" means "no task left" (omp.testing.listen.accept_forever).
        await accept_forever(listener, fake._handle_connection)


@asynccontextmanager
async def open_fake_llm(script: ScriptSource = (), *, host: str = "127.0.0.1",
                        port: int = 0) -> AsyncIterator[FakeLLM]:
    """Serve ``script`` on ``host:port`` (ephemeral by default) for an ``async with`` block.

    ``async with open_fake_llm(script) as fake:`` yields the running :class:`FakeLLM`; the
    server's tasks live in a nursery the manager owns. A bad script raises msgspec's
    ``ValidationError``/``DecodeError`` on entry; cancelled on entry, it leaves nothing
    listening. Leaving the block (normally, by an exception, or by cancellation) cancels every
    connection task and closes the listener before the block's exit completes; the block's own
    exception (a cancellation too) propagates unchanged, and an error of the server's own (a
    bug) leaves as itself, not in an exception group (``omp.groups``).
    """
    with unwrap():
        async with trio.open_nursery() as nursery:
            fake: FakeLLM = await nursery.start(functools.partial(
                serve_fake_llm, script, host=host, port=port))
            try:
                yield fake
            finally:
                nursery.cancel_scope.cancel()  # the server's tasks run until cancelled


# --------------------------------------------------------------------------- command line


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m omp.testing.fake_llm",
        description="Serve a scripted fake LLM (openai-completions, openai-responses, "
                    "anthropic-messages, google-generative-ai) until Ctrl-C or SIGTERM.")
    parser.add_argument("--script", required=True, metavar="FILE",
                        help="the JSON script (see omp.testing.script)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    return parser.parse_args(argv)


async def _serve_until_signalled(script: Script, host: str, port: int) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_fake_llm(script, host=host, port=port) as fake:
            print(f"fake LLM listening on {fake.base_url}", flush=True)
            async for _ in signals:
                break


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m omp.testing.fake_llm``: 0 after Ctrl-C/SIGTERM, 2 for bad usage or script."""
    args = _parse_args(argv)
    try:
        with open(args.script, "rb") as file:
            script = load_script(file.read())
    except OSError as exc:
        print(f"fake LLM: cannot read script {args.script}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        print(f"fake LLM: bad script {args.script}: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(_serve_until_signalled, script, args.host, args.port)
    except OSError as exc:
        print(f"fake LLM: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
