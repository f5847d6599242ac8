"""``RpcClient``: the host side of the protocol, for trio programs.

Two ways to get one, both async context managers that own the client's nursery::

    async with RpcClient.spawn() as client:                  # runs `python -m omp --mode rpc`
        state = await client.call(GetState(), type=SessionState)

    async with RpcClient.connect(recv_stream, send_stream) as client:   # any trio streams
        ...

On enter the client waits for the server's ``ready`` frame, then negotiates protocol v2 (chunked
lossless framing for frames over 1 MiB) unless told to stay on v1. On exit it closes the server's
input (EOF), waits for the server to finish, and for a spawned process escalates to SIGTERM and
SIGKILL of its whole process group if it does not; it always waits for the process, so none is
left behind, also when the ``async with`` body is cancelled.

Who owns what: the client's nursery owns the reader task (server output: responses, events,
sub-protocol requests), the writer task (one queue of lines to the server's input, so a frame is
never torn by a cancelled sender) and one task per host tool call, host URI request and extension
UI request, each in its own cancel scope.

Errors: ``RpcCommandError`` is a command that answered ``success: false`` (``call`` only);
``RpcConnectionClosed`` a response that can no longer come; ``RpcProtocolError`` a server that
broke the wire protocol (the connection is unusable afterwards); ``RpcStartupError`` a server that
never became ready. Errors of background tasks leave the ``async with`` as themselves, never
wrapped in an ``ExceptionGroup`` when there is one of them.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, suppress
from typing import IO, Any, Final, TypeVar, overload

import attrs
import msgspec
import trio
from msgspec import UNSET, UnsetType

from .groups import unwrap
from .process import REAP_TIMEOUT, kill_process_group, open_process_group, signal_group
from .protocol import commands as cmd
from .protocol.codec import ChunkAssembler, ChunkError
from .protocol.events import (
    ExtensionUiRequest,
    HostToolCall,
    HostToolCancel,
    HostUriCancel,
    HostUriRequest,
    SessionEvent,
    SideFrame,
)
from .protocol.frames import (
    MAX_FRAME_BYTES,
    MAX_REASSEMBLED_FRAME_BYTES,
    PROTOCOL_VERSION,
    Ready,
    Response,
    RpcChunk,
    RpcFrameError,
)
from .protocol.framing import LineFramer, LineTooLong
from .protocol.payloads import HostToolNames, HostUriSchemes, ProtocolVersionPayload

__all__ = [
    "DEFAULT_MAX_BUFFERED_EVENTS",
    "Event",
    "HostToolHandler",
    "HostToolUpdater",
    "HostUriHandler",
    "HostUriReply",
    "RawFrame",
    "RpcClient",
    "RpcCommandError",
    "RpcConnectionClosed",
    "RpcError",
    "RpcProtocolError",
    "RpcStartupError",
    "ToolResult",
    "UiAnswer",
    "UiHandler",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")



class RawFrame(dict[str, Any]):
    """A frame this client has no Struct for (a newer server's frame type, a ``message_update``
    in delta mode, a shape it does not know): the JSON object as it came, plus ``type``."""

    __slots__ = ()

    @property
    def type(self) -> str:
        """The frame's ``type`` (``""`` if it had none, or not a string)."""
        value = self.get("type")
        return value if isinstance(value, str) else ""


Event = SessionEvent | SideFrame | RpcFrameError | Response | RawFrame
"""What ``RpcClient.events`` carries: a frame decoded into its Struct when it matches one, else
a ``RawFrame`` (the JSON object: a frame type or shape this client does not know), so newer
servers work. Every one has ``type``, the frame's type on the wire, so a reader can match on
``event.type == "session_settled"`` whatever the event is."""

ToolResult = cmd.ToolResultPayload | str
"""A host tool's (partial) result; a ``str`` is shorthand for one text content block."""
HostToolUpdater = Callable[[ToolResult], Awaitable[None]]
HostToolHandler = Callable[[HostToolCall, HostToolUpdater], Awaitable[ToolResult]]
"""Serves one ``host_tool_call``: gets the call and an ``update`` function that sends
``host_tool_update``; returns the result, or raises to report an error (``isError: true`` with the
exception text). Cancelled when the server sends ``host_tool_cancel`` for the call."""

UiAnswer = str | bool | None
"""A dialog's answer: ``str`` → ``value``, ``bool`` → ``confirmed``, ``None`` → ``cancelled``."""
UiHandler = Callable[[ExtensionUiRequest], Awaitable[UiAnswer]]
"""Serves ``extension_ui_request``s. Dialogs (``select``, ``confirm``, ``input``, ``editor``) are
answered with its return value; after the request's ``timeout`` it is cancelled and answered
``cancelled``/``timedOut``; a ``cancel`` request for the dialog cancels it without an answer.
Fire-and-forget methods (``notify``, ``setStatus``, ...) are passed to it too; its return value is
ignored and nothing is answered."""

DEFAULT_MAX_BUFFERED_EVENTS: Final = 1024
DEFAULT_READY_TIMEOUT: Final = 30.0
DEFAULT_CLOSE_TIMEOUT: Final = 5.0
DEFAULT_TERMINATE_GRACE: Final = 2.0
DIALOG_METHODS: Final = frozenset({"select", "confirm", "input", "editor"})

_READ_CHUNK = 64 * 1024
# After the process is gone, how long its stdout may stay open (a grandchild holding it) before
# the rest of its process group is killed.
_ORPHAN_GRACE = 1.0


# --- errors ------------------------------------------------------------------------------------


class RpcError(Exception):
    """Base class of the errors ``RpcClient`` raises."""


class RpcStartupError(RpcError):
    """The server never became ready: it exited or closed its output first, sent another frame
    first, did not send ``ready`` in time, or refused the protocol negotiation."""


class RpcConnectionClosed(RpcError):
    """The connection ended (or the client closed) before the awaited response arrived, or
    before a frame could be sent."""


class RpcProtocolError(RpcError):
    """The server broke the wire protocol (a bad ``rpc_chunk`` sequence, a line that is not a
    JSON object, ...). Frames may have been lost, so the connection is unusable afterwards."""


class RpcCommandError(RpcError):
    """A command answered ``success: false``."""

    def __init__(self, response: Response) -> None:
        self.response = response
        self.command: str | None = response.command if isinstance(response.command, str) else None
        self.error: str = response.error if isinstance(response.error, str) else ""
        self.code: str | None = response.code if isinstance(response.code, str) else None
        text = f"{self.command or 'command'} failed: {self.error or '(no error message)'}"
        super().__init__(text + (f" [{self.code}]" if self.code else ""))


# --- sub-protocol values -------------------------------------------------------------------------


class HostUriReply(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a ``HostUriHandler`` returns for a read with metadata (a bare ``str`` is the content
    alone; ``None`` is a successful write)."""

    content: str | UnsetType = UNSET
    contentType: str | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    immutable: bool | UnsetType = UNSET


HostUriHandler = Callable[[HostUriRequest], Awaitable[HostUriReply | str | None]]
"""Serves ``host_uri_request``s of one scheme (reads and writes); raises to report an error
(``isError: true`` with the exception text). Cancelled on ``host_uri_cancel``."""


# --- wire decoding (server → host) ---------------------------------------------------------------


class _Envelope(msgspec.Struct):
    type: Any = UNSET


class _ReadyWire(msgspec.Struct):
    # Older servers send a bare {"type": "ready"}: they speak v1 only.
    type: str
    protocolVersion: int = PROTOCOL_VERSION
    supportedProtocolVersions: list[int] | UnsetType = UNSET
    maxFrameBytes: int = MAX_FRAME_BYTES
    maxReassembledFrameBytes: int = MAX_REASSEMBLED_FRAME_BYTES


_envelope_decoder = msgspec.json.Decoder(_Envelope)
_ready_decoder = msgspec.json.Decoder(_ReadyWire)
_response_decoder = msgspec.json.Decoder(Response)
_chunk_decoder = msgspec.json.Decoder(RpcChunk)
_event_decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
    SessionEvent | SideFrame | RpcFrameError)
_raw_decoder = msgspec.json.Decoder(dict[str, Any])


def _text_result(text: str) -> cmd.ToolResultPayload:
    return cmd.ToolResultPayload(content=[{"type": "text", "text": text}])


def _tool_payload(value: object) -> cmd.ToolResultPayload:
    if isinstance(value, cmd.ToolResultPayload):
        return value
    if isinstance(value, str):
        return _text_result(value)
    return msgspec.convert(value, cmd.ToolResultPayload)


def _exception_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _kind(frame_type: object) -> str:
    return f"`{frame_type}`" if isinstance(frame_type, str) else "an untyped"


# --- the client ----------------------------------------------------------------------------------


@attrs.frozen
class _Options:
    host_tools: Mapping[str, HostToolHandler]
    uri_schemes: Mapping[str, HostUriHandler]
    ui: UiHandler | None
    answer_unhandled: bool
    protocol_version: int
    ready_timeout: float
    close_timeout: float
    terminate_grace: float
    max_buffered_events: int | float


@attrs.define(eq=False, repr=False)
class _Pending:
    done: trio.Event = attrs.field(factory=trio.Event)
    response: Response | None = None


@attrs.define(eq=False, repr=False)
class _Requests:
    """The requests waiting for their responses, by id.

    Rules: an id is registered before its line is queued, so its response can never arrive
    unclaimed. A response whose id is pending resolves that request and removes it; one whose
    request was cancelled (abandoned) is discarded once; any other response is an event. When
    the connection ends or fails, every pending request is woken without a response and raises;
    later requests raise at once."""

    encoder: msgspec.json.Encoder
    _pending: dict[cmd.RequestId, _Pending] = attrs.field(factory=dict, init=False)
    _abandoned: set[cmd.RequestId] = attrs.field(factory=set, init=False)
    _next_id: int = attrs.field(default=0, init=False)

    def encode(self, command: cmd.Command | Mapping[str, Any]
               ) -> tuple[cmd.RequestId, str, bytes]:
        """(id, command type, line) of a request; a new ``req_<n>`` id when it has none."""
        if isinstance(command, Mapping):
            body = dict(command)
            request_id = body.get("id")
            if request_id is None:
                request_id = self._new_id()
                body = {"id": request_id, **body}
            elif not isinstance(request_id, str | int) or isinstance(request_id, bool):
                raise TypeError(f"a request id must be a str or an int, not {request_id!r}")
            kind = body.get("type")
            return request_id, kind if isinstance(kind, str) else "command", self.encoder.encode(
                body)
        if command.id is None:
            command = msgspec.structs.replace(command, id=self._new_id())
        assert command.id is not None
        tag = command.__struct_config__.tag
        return command.id, tag if isinstance(tag, str) else "command", self.encoder.encode(
            command)

    def _new_id(self) -> str:
        self._next_id += 1
        return f"req_{self._next_id}"

    def open(self, request_id: cmd.RequestId) -> _Pending:
        if request_id in self._pending:
            raise ValueError(f"a request with id {request_id!r} is already waiting")
        pending = self._pending[request_id] = _Pending()
        return pending

    def withdraw(self, request_id: cmd.RequestId, *, sent: bool) -> None:
        """The caller stopped waiting; a response that was ``sent`` for is discarded when it
        comes."""
        if self._pending.pop(request_id, None) is not None and sent:
            self._abandoned.add(request_id)

    def resolve(self, response: Response) -> bool:
        """Hand ``response`` to its request; False when none claims it (it is an event)."""
        request_id = response.id
        if request_id is None:
            return False
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.response = response
            pending.done.set()
            return True
        if request_id in self._abandoned:
            self._abandoned.discard(request_id)
            return True
        return False

    def wake_all(self) -> None:
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            waiter.done.set()


@attrs.define(eq=False, repr=False)
class RpcClient:
    """A connection to one RPC server. Get one from ``RpcClient.spawn`` or ``RpcClient.connect``.

    Requests are matched to responses by ``id`` (``req_<n>`` unless the command carries its own),
    never by order, so any number of tasks may have requests in flight at once.

    ``events`` receives every frame that is not the response to a request: session events,
    ``prompt_result``, side frames (including the sub-protocol requests the client answers
    itself), and responses no request waits for (no ``id``, a second response with the same
    ``id``). It is bounded (``max_buffered_events``, default 1024): while it is full the reader
    waits, and responses wait with it. Read it, close it (``await client.events.aclose()``) to
    discard events, or pass ``max_buffered_events=math.inf``. It ends (``EndOfChannel``) when the
    connection does; events that do not fit while the client is closing are dropped.
    """

    _recv: trio.abc.ReceiveStream
    _send: trio.abc.SendStream
    _process: trio.Process | None
    _options: _Options
    _nursery: trio.Nursery
    events: trio.MemoryReceiveChannel[Event] = attrs.field(init=False)
    _events_send: trio.MemorySendChannel[Event] = attrs.field(init=False)
    _outgoing_send: trio.MemorySendChannel[bytes] = attrs.field(init=False)
    _outgoing_recv: trio.MemoryReceiveChannel[bytes] = attrs.field(init=False)
    _services: _HostServices = attrs.field(init=False)
    _encoder: msgspec.json.Encoder = attrs.field(factory=msgspec.json.Encoder, init=False)
    _assembler: ChunkAssembler = attrs.field(factory=ChunkAssembler, init=False)
    _ready: Ready | None = attrs.field(default=None, init=False)
    _protocol_version: int = attrs.field(default=PROTOCOL_VERSION, init=False)
    _requests: _Requests = attrs.field(init=False)
    _started: trio.Event = attrs.field(factory=trio.Event, init=False)
    _reader_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _writer_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _ended: bool = attrs.field(default=False, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _failure: RpcProtocolError | None = attrs.field(default=None, init=False)
    _failure_reported: bool = attrs.field(default=False, init=False)
    _event_wait: trio.CancelScope | None = attrs.field(default=None, init=False)
    dropped_events: int = attrs.field(default=0, init=False)
    """Events dropped because ``events`` was full while the client was closing."""

    def __attrs_post_init__(self) -> None:
        self._events_send, self.events = trio.open_memory_channel[Event](
            self._options.max_buffered_events)
        # Unbounded: the server reads its input without ever waiting on its own work, and a
        # sender must never block halfway through a line.
        self._outgoing_send, self._outgoing_recv = trio.open_memory_channel[bytes](math.inf)
        self._assembler = ChunkAssembler()
        self._requests = _Requests(self._encoder)
        self._services = _HostServices(self._options, self._nursery, self._send_quietly)

    # -- construction -----------------------------------------------------------------------------

    @classmethod
    def spawn(
        cls,
        args: Sequence[str] = ("--mode", "rpc"),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stderr: int | IO[Any] | None = None,
        command: Sequence[str] | None = None,
        host_tools: Mapping[str, HostToolHandler] | None = None,
        uri_schemes: Mapping[str, HostUriHandler] | None = None,
        ui: UiHandler | None = None,
        answer_unhandled: bool = True,
        protocol_version: int = 2,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        terminate_grace: float = DEFAULT_TERMINATE_GRACE,
        max_buffered_events: int | float = DEFAULT_MAX_BUFFERED_EVENTS,
    ) -> AbstractAsyncContextManager[RpcClient]:
        """Run ``sys.executable -P -m omp *args`` as a subprocess and connect to it.

        ``-P``: the working directory is not put on the import path (``python -m`` would put
        it first), so ``cwd`` may be a repository nobody trusts: its ``trio.py`` or ``omp/``
        is never imported in place of ours. The process gets pipes for stdin and stdout and its
        own session (so its own process group); ``stderr`` is inherited unless given (anything
        ``subprocess`` accepts, e.g. ``subprocess.DEVNULL``). ``env`` replaces the environment,
        as in ``subprocess``. ``command`` replaces the whole argv (``args`` is then ignored),
        e.g. to run an installed ``omp`` or a wrapper.

        Handlers: ``host_tools`` by tool name, ``uri_schemes`` by scheme (case-insensitive),
        ``ui`` for extension UI requests. With ``answer_unhandled`` (the default) a request no
        handler serves is answered at once (an error result, or ``cancelled`` for a dialog) so
        the agent never waits for nothing; pass ``False`` to answer such requests yourself from
        ``events`` with ``send``.

        ``protocol_version=1`` skips the v2 negotiation. ``ready_timeout`` bounds the wait for
        ``ready`` and the negotiation. On exit: stdin is closed, the process has
        ``close_timeout`` seconds to exit, then its process group gets SIGTERM, then after
        ``terminate_grace`` seconds SIGKILL (``omp.process.kill_process_group``); the process
        is always waited for, and its exit code is ``returncode``. The exit takes at most about
        ``close_timeout + terminate_grace`` seconds, plus one to reap the process after a
        SIGKILL and one more if something the server started still holds its stdout (then the
        rest of its process group is killed too), also when the body was cancelled.
        """
        argv = (list(command) if command is not None
                else [sys.executable, "-P", "-m", "omp", *args])
        options = _make_options(host_tools, uri_schemes, ui, answer_unhandled, protocol_version,
                                ready_timeout, close_timeout, terminate_grace, max_buffered_events)

        async def open_streams() -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream,
                                          trio.Process | None]:
            process = await open_process_group(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, env=env,
                cwd=cwd)
            assert process.stdout is not None
            assert process.stdin is not None
            return process.stdout, process.stdin, process

        return _client_context(open_streams, options)

    @classmethod
    def connect(
        cls,
        recv_stream: trio.abc.ReceiveStream,
        send_stream: trio.abc.SendStream,
        *,
        host_tools: Mapping[str, HostToolHandler] | None = None,
        uri_schemes: Mapping[str, HostUriHandler] | None = None,
        ui: UiHandler | None = None,
        answer_unhandled: bool = True,
        protocol_version: int = 2,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        close_timeout: float = DEFAULT_CLOSE_TIMEOUT,
        max_buffered_events: int | float = DEFAULT_MAX_BUFFERED_EVENTS,
    ) -> AbstractAsyncContextManager[RpcClient]:
        """Connect to a server over a pair of trio streams (its output, its input), for example
        to ``omp.serve`` running in the same program.

        The client takes both streams and closes them on exit: closing ``send_stream`` is the
        EOF that ends the server; then ``recv_stream`` is read until EOF or for at most
        ``close_timeout`` seconds. (``serve`` does not close the streams it was given; close its
        output after it returns so the client sees EOF at once.) Other options as in ``spawn``.
        """
        options = _make_options(host_tools, uri_schemes, ui, answer_unhandled, protocol_version,
                                ready_timeout, close_timeout, 0.0, max_buffered_events)

        async def open_streams() -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream,
                                          trio.Process | None]:
            return recv_stream, send_stream, None

        return _client_context(open_streams, options)

    # -- state ------------------------------------------------------------------------------------

    @property
    def ready(self) -> Ready:
        """The server's ``ready`` frame (a bare ``{"type":"ready"}`` reads as v1-only)."""
        assert self._ready is not None, "the client is not started"
        return self._ready

    @property
    def protocol_version(self) -> int:
        """The framing in use: 2 after a successful negotiation, else 1."""
        return self._protocol_version

    @property
    def pid(self) -> int | None:
        """The server process's id (``spawn`` only)."""
        return None if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        """The server process's exit code once it has exited (negative: killed by that signal);
        ``None`` while it runs, and always for ``connect``."""
        return None if self._process is None else self._process.returncode

    # -- requests ---------------------------------------------------------------------------------

    async def request(self, command: cmd.Command | Mapping[str, Any]) -> Response:
        """Send a command and return its response, whether it succeeded or not.

        ``command`` is a command Struct or a raw JSON object; without an ``id`` it gets the next
        ``req_<n>``. Raises ``RpcConnectionClosed`` if the connection ends first,
        ``RpcProtocolError`` if the server broke the protocol, ``ValueError`` if a request with
        the same ``id`` is still waiting.

        On cancellation the command is not withdrawn (it was sent, the server runs it) and its
        response is discarded when it comes.
        """
        request_id, kind, line = self._requests.encode(command)
        pending = self._requests.open(request_id)
        try:
            self._raise_if_unusable(kind, request_id)
            self._enqueue(line)
        except BaseException:
            self._requests.withdraw(request_id, sent=False)
            raise
        try:
            await pending.done.wait()
        except BaseException:
            self._requests.withdraw(request_id, sent=True)
            raise
        if pending.response is None:
            self._raise_if_unusable(kind, request_id)
            raise RpcConnectionClosed(self._closed_message(kind, request_id))
        return pending.response

    @overload
    async def call(self, command: cmd.Command | Mapping[str, Any], type: type[T]) -> T: ...

    @overload
    async def call(self, command: cmd.Command | Mapping[str, Any], type: None = None) -> Any: ...

    async def call(self, command: cmd.Command | Mapping[str, Any],
                   type: type[T] | None = None) -> T | Any:
        """Send a command and return its ``data``, converted to ``type`` when one is given.

        Raises ``RpcCommandError`` when it answers ``success: false``; ``RpcProtocolError`` when
        the data does not fit ``type``; otherwise as ``request``. Returns ``None`` for a response
        without data and no ``type``. On cancellation: as ``request``.
        """
        response = await self.request(command)
        if not response.success:
            raise RpcCommandError(response)
        data = None if response.data is UNSET else response.data
        if type is None:
            return data
        try:
            return msgspec.convert(data, type)
        except msgspec.ValidationError as exc:
            name = response.command if isinstance(response.command, str) else "the"
            wanted = getattr(type, "__name__", repr(type))
            raise RpcProtocolError(f"{name} response data does not fit {wanted}: {exc}") from exc

    async def send(self, frame: msgspec.Struct | Mapping[str, Any]) -> None:
        """Send a frame without waiting for anything (a control frame, or a command whose
        response you will take from ``events``). It is queued whole, so cancellation never
        tears a line; once this returns, it will be written unless the connection ends.

        On cancellation (at its one checkpoint, before queuing) nothing is sent."""
        await trio.lowlevel.checkpoint()
        self._raise_if_unusable(None, None)
        body = dict(frame) if isinstance(frame, Mapping) else frame
        self._enqueue(self._encoder.encode(body))

    async def set_host_tools(self, tools: Sequence[cmd.HostToolDefinition]) -> list[str]:
        """Register host tool definitions with the server (``set_host_tools``, replacing the
        previous set); returns the server's ``toolNames``. Calls are served by the
        ``host_tools`` handlers given at construction. On cancellation: as ``request``."""
        result = await self.call(cmd.SetHostTools(tools=list(tools)), type=HostToolNames)
        return result.toolNames

    async def set_host_uri_schemes(
            self, schemes: Sequence[cmd.HostUriSchemeDefinition | str]) -> list[str]:
        """Register host URI schemes with the server (``set_host_uri_schemes``, replacing the
        previous set; a ``str`` is a read-only scheme); returns the normalized ``schemes``.
        Requests are served by the ``uri_schemes`` handlers. On cancellation: as ``request``."""
        definitions = [cmd.HostUriSchemeDefinition(scheme=s) if isinstance(s, str) else s
                       for s in schemes]
        result = await self.call(cmd.SetHostUriSchemes(schemes=definitions), type=HostUriSchemes)
        return result.schemes

    def _raise_if_unusable(self, kind: str | None, request_id: cmd.RequestId | None) -> None:
        if self._failure is not None:
            self._failure_reported = True
            raise RpcProtocolError(*self._failure.args) from self._failure.__cause__
        if self._ended or self._closing:
            raise RpcConnectionClosed(self._closed_message(kind, request_id))

    def _closed_message(self, kind: str | None, request_id: cmd.RequestId | None) -> str:
        what = "the client is closed" if self._closing else "the server closed the connection"
        code = self.returncode
        if code is not None:
            what += f" (exit code {code})"
        if kind is None:
            return what
        return f"{what} before the response to {kind} (id {request_id!r}) arrived"

    def _enqueue(self, line: bytes) -> None:
        try:
            self._outgoing_send.send_nowait(line + b"\n")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise RpcConnectionClosed("the server's input is closed") from None

    def _send_quietly(self, frame: msgspec.Struct) -> None:
        """Answer a sub-protocol request; if the server is gone there is no one to answer."""
        if self._closing or self._ended or self._failure is not None:
            return
        with suppress(RpcConnectionClosed):
            self._enqueue(self._encoder.encode(frame))

    # -- lifecycle --------------------------------------------------------------------------------

    async def _start(self) -> None:
        self._nursery.start_soon(self._read, name="omp client reader")
        self._nursery.start_soon(self._write, name="omp client writer")
        timeout = self._options.ready_timeout
        with trio.move_on_after(timeout) as timer:
            await self._started.wait()
            if self._ready is None:
                raise await self._startup_failure()
            if (self._options.protocol_version >= 2
                    and 2 in self._ready.supportedProtocolVersions):
                try:
                    agreed = await self.call(cmd.NegotiateProtocol(protocolVersion=2),
                                             type=ProtocolVersionPayload)
                except RpcError as exc:
                    self._failure_reported = True
                    raise RpcStartupError(f"protocol v2 negotiation failed: {exc}") from exc
                self._protocol_version = agreed.protocolVersion
        if timer.cancelled_caught:
            what = "no ready frame" if self._ready is None else "no negotiate_protocol response"
            raise RpcStartupError(f"{what} from the server within {timeout:g} s")

    async def _startup_failure(self) -> RpcStartupError:
        if self._failure is not None:
            self._failure_reported = True
            error = RpcStartupError(f"the server did not start: {self._failure}")
            error.__cause__ = self._failure
            return error
        if self._process is not None:
            with trio.move_on_after(1.0):
                await self._process.wait()
            if self._process.returncode is not None:
                return RpcStartupError(
                    f"the server exited with code {self._process.returncode} before its ready "
                    "frame (see its stderr)")
        return RpcStartupError("the server closed its output before its ready frame")

    @property
    def _shutdown_bound(self) -> float:
        """The longest ``_shutdown`` can take: its bounded waits added up, plus a second of
        margin. The deadline of the shield it runs in."""
        options = self._options
        return (options.close_timeout + options.terminate_grace + REAP_TIMEOUT
                + _ORPHAN_GRACE + 1.0)

    async def _shutdown(self) -> None:
        """EOF to the server, wait for it, escalate to signals (spawned process). Runs shielded
        (``_shutdown_bound``); bounded by its own deadlines."""
        self._closing = True
        if self._event_wait is not None:
            self._event_wait.cancel()  # events the host no longer reads must not stall draining
        self._outgoing_send.close()  # the writer sends what is queued, then closes: EOF
        process = self._process
        with trio.move_on_after(self._options.close_timeout):
            await self._writer_done.wait()
            if process is not None:
                await process.wait()
            await self._reader_done.wait()
        if process is None:
            return
        if process.returncode is None:
            await kill_process_group(process, self._options.terminate_grace)
        with trio.move_on_after(_ORPHAN_GRACE):
            await self._reader_done.wait()
        if not self._reader_done.is_set():
            # Something the server started in its process group still holds its stdout.
            signal_group(process.pid, signal.SIGKILL)

    # -- the writer -------------------------------------------------------------------------------

    async def _write(self) -> None:
        try:
            async with self._outgoing_recv:
                async for line in self._outgoing_recv:
                    batch = [line]
                    while True:
                        try:
                            batch.append(self._outgoing_recv.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    await self._send.send_all(b"".join(batch))
            await self._send.aclose()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            logger.debug("the server's input is closed: %r", exc)
        finally:
            self._writer_done.set()
            await trio.aclose_forcefully(self._send)

    # -- the reader -------------------------------------------------------------------------------

    async def _read(self) -> None:
        framer = LineFramer(max_line_bytes=MAX_REASSEMBLED_FRAME_BYTES)
        try:
            while True:
                try:
                    data = await self._recv.receive_some(_READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    data = b""
                lines = framer.feed(data) if data else framer.close()
                for line in lines:
                    if self._failure is not None:
                        continue  # keep draining so the server is not blocked on its output
                    try:
                        await self._on_line(line)
                    except RpcProtocolError as exc:
                        self._fail(exc)
                if not data:
                    return
        finally:
            self._ended = True
            self._assembler.reset()
            self._requests.wake_all()
            self._events_send.close()
            self._reader_done.set()
            self._started.set()
            await trio.aclose_forcefully(self._recv)

    def _fail(self, error: RpcProtocolError) -> None:
        logger.debug("protocol error: %s", error)
        self._failure = error
        self._requests.wake_all()
        self._events_send.close()
        self._started.set()

    async def _on_line(self, line: bytes | LineTooLong) -> None:
        if isinstance(line, LineTooLong):
            raise RpcProtocolError(f"the server wrote a line of over {line.limit} bytes")
        frame_type = self._frame_type(line)
        if self._ready is None and frame_type != "ready":
            raise RpcProtocolError(f"expected the ready frame first, got {_kind(frame_type)} "
                                   f"frame: {line[:200]!r}")
        if frame_type == "rpc_chunk":
            try:
                chunk = _chunk_decoder.decode(line)
            except msgspec.ValidationError as exc:
                raise RpcProtocolError(f"malformed rpc_chunk frame: {exc}") from exc
            try:
                whole = self._assembler.feed(chunk)
            except ChunkError as exc:
                raise RpcProtocolError(f"bad rpc_chunk sequence: {exc}") from exc
            if whole is None:
                return
            line = whole
            frame_type = self._frame_type(line)
            if frame_type == "rpc_chunk":
                raise RpcProtocolError("a reassembled rpc_chunk frame is itself an rpc_chunk")
        elif self._assembler.in_progress:
            raise RpcProtocolError(f"{_kind(frame_type)} frame interrupted an rpc_chunk sequence")
        await self._on_frame(frame_type, line)

    @staticmethod
    def _frame_type(line: bytes) -> object:
        try:
            return _envelope_decoder.decode(line).type
        except msgspec.ValidationError:
            raise RpcProtocolError(
                f"the server wrote a line that is not a JSON object: {line[:80]!r}") from None
        except msgspec.DecodeError as exc:
            raise RpcProtocolError(
                f"the server wrote a line that is not JSON ({exc}): {line[:80]!r}") from None

    async def _on_frame(self, frame_type: object, line: bytes) -> None:
        if self._ready is None:
            try:
                wire = _ready_decoder.decode(line)
            except msgspec.ValidationError as exc:
                raise RpcProtocolError(f"malformed ready frame: {exc}") from exc
            supported = wire.supportedProtocolVersions
            self._ready = Ready(
                protocolVersion=wire.protocolVersion,
                supportedProtocolVersions=(
                    [wire.protocolVersion] if isinstance(supported, UnsetType) else supported),
                maxFrameBytes=wire.maxFrameBytes,
                maxReassembledFrameBytes=wire.maxReassembledFrameBytes)
            self._assembler = ChunkAssembler(
                max_reassembled_bytes=max(wire.maxReassembledFrameBytes, MAX_FRAME_BYTES))
            self._started.set()
            return
        event: Event
        if frame_type == "response":
            try:
                response = _response_decoder.decode(line)
            except msgspec.ValidationError:
                event = RawFrame(_raw_decoder.decode(line))
            else:
                if self._requests.resolve(response):
                    return
                event = response
        else:
            try:
                event = _event_decoder.decode(line)
            except msgspec.ValidationError:
                event = RawFrame(_raw_decoder.decode(line))
            else:
                if not self._closing:
                    self._services.dispatch(event)
        await self._deliver(event)

    async def _deliver(self, event: Event) -> None:
        if not self._closing:
            with trio.CancelScope() as self._event_wait:  # _shutdown cancels a blocked send
                # BrokenResourceError: the host closed ``events``, it wants none.
                with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self._events_send.send(event)
                return
        try:
            self._events_send.send_nowait(event)
        except trio.WouldBlock:
            self.dropped_events += 1
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


@attrs.define(eq=False, repr=False)
class _HostServices:
    """The sub-protocol requests a client serves: host tool calls, host URI requests, extension
    UI dialogs, each answered through the client's own handlers.

    Each request runs as a task in the client's nursery inside its own cancel scope, registered
    in ``_tasks`` under (kind, request id) before the task starts and until it finishes; the
    server's cancel frame for that id cancels the scope. A cancelled task sends nothing: the
    server has already settled the request."""

    _options: _Options
    _nursery: trio.Nursery
    _send_quietly: Callable[[msgspec.Struct], None]
    _uri_handlers: dict[str, HostUriHandler] = attrs.field(init=False)
    _tasks: dict[tuple[str, str], trio.CancelScope] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        self._uri_handlers = {k.lower(): v for k, v in self._options.uri_schemes.items()}

    def dispatch(self, frame: Any) -> None:
        if isinstance(frame, HostToolCall):
            self._start_host_tool(frame)
        elif isinstance(frame, HostToolCancel):
            self._cancel_task("tool", frame.targetId)
        elif isinstance(frame, HostUriRequest):
            self._start_uri(frame)
        elif isinstance(frame, HostUriCancel):
            self._cancel_task("uri", frame.targetId)
        elif isinstance(frame, ExtensionUiRequest):
            if frame.method == "cancel":
                assert isinstance(frame.targetId, str)
                self._cancel_task("ui", frame.targetId)
            else:
                self._start_ui(frame)

    def _cancel_task(self, kind: str, request_id: str) -> None:
        scope = self._tasks.get((kind, request_id))
        if scope is not None:
            scope.cancel()

    def _start_task(self, kind: str, request_id: str,
                    serve: Callable[[trio.CancelScope], Awaitable[None]]) -> None:
        scope = trio.CancelScope()
        key = (kind, request_id)
        self._tasks[key] = scope

        async def task() -> None:
            try:
                with scope:
                    await serve(scope)
            finally:
                if self._tasks.get(key) is scope:
                    del self._tasks[key]

        self._nursery.start_soon(task, name=f"omp client {kind} {request_id}")

    def _start_host_tool(self, call: HostToolCall) -> None:
        handler = self._options.host_tools.get(call.toolName)
        if handler is None:
            if self._options.answer_unhandled:
                self._send_quietly(cmd.HostToolResult(id=call.id, isError=True, result=_text_result(
                    f'Host tool "{call.toolName}" has no handler in this client')))
            return

        async def update(partial: ToolResult) -> None:
            await trio.lowlevel.checkpoint()
            self._send_quietly(cmd.HostToolUpdate(id=call.id, partialResult=_tool_payload(partial)))

        async def serve(scope: trio.CancelScope) -> None:
            try:
                result = _tool_payload(await handler(call, update))
            except Exception as exc:
                frame = cmd.HostToolResult(id=call.id, isError=True,
                                           result=_text_result(_exception_text(exc)))
            else:
                frame = cmd.HostToolResult(id=call.id, result=result)
            if not scope.cancel_called:
                self._send_quietly(frame)

        self._start_task("tool", call.id, serve)

    def _start_uri(self, request: HostUriRequest) -> None:
        scheme = request.url.partition(":")[0].lower()
        handler = self._uri_handlers.get(scheme)
        if handler is None:
            if self._options.answer_unhandled:
                self._send_quietly(cmd.HostUriResult(
                    id=request.id, isError=True,
                    error=f"Host URI scheme {scheme}:// has no handler in this client"))
            return

        async def serve(scope: trio.CancelScope) -> None:
            frame: cmd.HostUriResult
            try:
                reply = await handler(request)
            except Exception as exc:
                frame = cmd.HostUriResult(id=request.id, isError=True,
                                          error=_exception_text(exc))
            else:
                frame = _uri_result(request.id, reply)
            if not scope.cancel_called:
                self._send_quietly(frame)

        self._start_task("uri", request.id, serve)

    def _start_ui(self, request: ExtensionUiRequest) -> None:
        handler = self._options.ui
        dialog = request.method in DIALOG_METHODS
        if handler is None:
            if dialog and self._options.answer_unhandled:
                self._send_quietly(cmd.ExtensionUiResponse(id=request.id, cancelled=True))
            return

        async def serve(scope: trio.CancelScope) -> None:
            timeout = request.timeout
            limit = timeout / 1000 if dialog and isinstance(timeout, int) else math.inf
            answer: UiAnswer = None
            with trio.move_on_after(limit) as timer:
                try:
                    answer = await handler(request)
                except Exception:
                    logger.exception("extension UI handler failed on %s %s",
                                     request.method, request.id)
            if not dialog or scope.cancel_called:
                return
            if timer.cancelled_caught:
                frame = cmd.ExtensionUiResponse(id=request.id, cancelled=True, timedOut=True)
            else:
                frame = _ui_response(request.id, answer)
            self._send_quietly(frame)

        if dialog:
            self._start_task("ui", request.id, serve)
        else:
            # Not cancellable by id; it still runs in the client's nursery.
            self._nursery.start_soon(serve, trio.CancelScope(),
                                     name=f"omp client ui {request.method}")


def _uri_result(request_id: str, reply: object) -> cmd.HostUriResult:
    if reply is None:
        return cmd.HostUriResult(id=request_id)
    if isinstance(reply, str):
        return cmd.HostUriResult(id=request_id, content=reply)
    if isinstance(reply, HostUriReply):
        return cmd.HostUriResult(id=request_id, content=reply.content,
                                 contentType=reply.contentType, notes=reply.notes,
                                 immutable=reply.immutable)
    return cmd.HostUriResult(id=request_id, isError=True,
                             error=f"host URI handler returned {type(reply).__name__}, not "
                                   "str, HostUriReply or None")


def _ui_response(request_id: str, answer: object) -> cmd.ExtensionUiResponse:
    if isinstance(answer, bool):
        return cmd.ExtensionUiResponse(id=request_id, confirmed=answer)
    if isinstance(answer, str):
        return cmd.ExtensionUiResponse(id=request_id, value=answer)
    return cmd.ExtensionUiResponse(id=request_id, cancelled=True)


def _make_options(host_tools: Mapping[str, HostToolHandler] | None,
                  uri_schemes: Mapping[str, HostUriHandler] | None, ui: UiHandler | None,
                  answer_unhandled: bool, protocol_version: int, ready_timeout: float,
                  close_timeout: float, terminate_grace: float,
                  max_buffered_events: int | float) -> _Options:
    if protocol_version not in (1, 2):
        raise ValueError(f"protocol_version must be 1 or 2, not {protocol_version!r}")
    return _Options(host_tools=dict(host_tools or {}), uri_schemes=dict(uri_schemes or {}),
                    ui=ui, answer_unhandled=answer_unhandled, protocol_version=protocol_version,
                    ready_timeout=ready_timeout, close_timeout=close_timeout,
                    terminate_grace=terminate_grace, max_buffered_events=max_buffered_events)


OpenStreams = Callable[[], Awaitable[tuple[trio.abc.ReceiveStream, trio.abc.SendStream,
                                          trio.Process | None]]]


@asynccontextmanager
async def _client_context(open_streams: OpenStreams, options: _Options
                          ) -> AsyncIterator[RpcClient]:
    """What ``spawn`` and ``connect`` return: owns the client's nursery from enter to exit.

    An ``@asynccontextmanager`` may own a nursery (trio's own ``as_safe_channel`` does): the
    body runs in the task that entered it, inside the nursery's cancel scope, so a background
    task that fails cancels the body, and the body's exception is thrown in at the ``yield``
    and leaves the nursery like any other. (What must not yield inside a nursery or cancel
    scope is an async generator that is iterated: its consumer's code would run in scopes that
    are not its own.)

    Enter: start the connection, wait for ``ready`` and negotiate; on cancellation or failure
    everything started is shut down (the process stopped and waited for) before the exception
    leaves. Exit: close the connection (EOF, wait, signals for a process) and the nursery,
    shielded and bounded by the close timeouts, also when the body was cancelled; the
    cancellation then propagates. A protocol error nobody has seen yet is raised on exit if the
    body finished without an exception.

    Exceptions leave as ``omp.groups`` says: background tasks handle their expected errors, so
    the nursery's group normally holds one exception (the body's, or one bug), which leaves as
    itself; several real errors leave as the group.
    """
    client: RpcClient | None = None
    finished = False  # the body ended without an exception
    with unwrap():
        async with trio.open_nursery() as nursery:
            try:
                recv, send, process = await open_streams()
                client = RpcClient(recv, send, process, options, nursery)
                await client._start()
                yield client
                finished = True
            finally:
                if client is not None:
                    with trio.move_on_after(client._shutdown_bound, shield=True):
                        await client._shutdown()
                nursery.cancel_scope.cancel()  # handler tasks: the server is gone
    if finished and client is not None and client._failure is not None and (
            not client._failure_reported):
        client._failure_reported = True
        raise RpcProtocolError(*client._failure.args) from client._failure.__cause__
