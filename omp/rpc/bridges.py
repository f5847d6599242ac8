"""The host sub-protocols: tools and URL schemes the host serves
(docs/design/protocol.md#host-tools, docs/design/protocol.md#host-uris).

Both work the same way, so one mechanism serves them: a request frame goes out with a fresh id,
the reader hands the host's frames for that id to the ``ControlRegistry`` (control lane, never
queued), and the caller waits in its own task. This module knows nothing of the server: it gets
the registry and a callable that queues a frame. Rules:

* ``host_tool_call`` / ``host_uri_request`` is written before the work is announced to the host
  (a host tool's call precedes its ``tool_execution_start``).
* Updates (``host_tool_update``) are forwarded while the call waits; the first result settles it;
  anything later, or for an id we never issued, is ignored.
* Cancellation (abort, the run's end) writes ``host_tool_cancel`` / ``host_uri_cancel`` for the
  pending request as ``Cancelled`` goes by — queued at once, never waiting — and forgets it.
* When the host is gone (stdin EOF) the registry is disconnected: pending requests fail with the
  original's "RPC client disconnected before …" texts and later ones fail the same way at once,
  without a frame (docs/design/protocol.md#end-of-input).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import msgspec
import trio

from ..extensions.ui import NotifyType, Option, UiDisconnected, paused_handler_clock
from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol import messages as m
from ..tools.base import OnUpdate, Tool, ToolError, ToolResult, UriResource

HOST_TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
URI_SCHEME = r"^[a-z][a-z0-9+.-]*$"
# Schemes with a meaning of their own (ours, the web's, and the original's internal ones, so a
# host written for it keeps its choice of names).
RESERVED_SCHEMES = frozenset({
    "file", "http", "https", "data", "ftp", "skill", "rule", "memory", "agent", "history",
    "artifact", "local", "proc", "cfg", "ssh", "security", "vault", "issue", "pr", "mcp", "omp",
    "xd", "attachment", "conflict"})
HOST_TOOL_DISCONNECTED = "RPC client disconnected before host tool execution completed"
HOST_URI_DISCONNECTED = "RPC client disconnected before host URI request completed"
INPUT_CLOSED = "Cancelled: the host closed the input before the command finished"
"""A command in flight when the input ended is answered with this (``code: "cancelled"``)."""
UI_DISCONNECTED = "RPC client disconnected before extension UI response completed"

Emit = Callable[[msgspec.Struct], None]
"""Queues a frame for the host at once (never waits)."""


def new_request_id() -> str:
    # ``secrets.token_hex(8)`` without importing ``secrets`` (which a start would keep loaded).
    return os.urandom(8).hex()


class Disconnected(msgspec.Struct, frozen=True):
    """Delivered to a pending request when the host is gone."""


class ControlRegistry(msgspec.Struct, eq=False):
    """Requests to the host awaiting its control frames, by (answering kind, request id)."""

    _pending: dict[tuple[str, str], PendingRequest] = msgspec.field(default_factory=dict)
    disconnected: bool = False

    def dispatch(self, frame: cmd.ControlFrame) -> None:
        """A result or update for a request we made. Unknown or settled ids are ignored."""
        kind = frame.__struct_config__.tag
        if kind == "host_tool_update":
            kind = "host_tool_result"  # one registration serves a call's updates and result
        request = self._pending.get((str(kind), frame.id))
        if request is not None:
            request.deliver(frame)

    def disconnect(self) -> None:
        """The host is gone: fail every pending request, and every later one at once."""
        self.disconnected = True
        for request in list(self._pending.values()):
            request.deliver(Disconnected())

    def _add(self, request: PendingRequest) -> None:
        self._pending[(request.kind, request.id)] = request

    def _remove(self, request: PendingRequest) -> None:
        self._pending.pop((request.kind, request.id), None)


def _frame_channel() -> tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]]:
    return trio.open_memory_channel(float("inf"))


class PendingRequest(msgspec.Struct, eq=False):
    """One request to the host, awaiting its frames (filled by the reader, read by the caller).

    Raises ToolError(``disconnected``) at once when the host is already gone.
    """

    registry: ControlRegistry
    kind: str
    """The control frame kind that answers it (``host_tool_result`` / ``host_uri_result``)."""
    disconnected: str
    """The error text when the host goes away before answering."""
    id: str = msgspec.field(default_factory=new_request_id)
    settled: bool = False
    _frames: tuple[trio.MemorySendChannel[Any], trio.MemoryReceiveChannel[Any]] = (
        msgspec.field(default_factory=_frame_channel))

    def __post_init__(self) -> None:
        if self.registry.disconnected:
            raise ToolError(self.disconnected)
        self.registry._add(self)

    def deliver(self, frame: Any) -> None:
        self._frames[0].send_nowait(frame)

    async def next_frame(self) -> Any:
        """The next frame the host sent for this request. Cancellable. Raises ToolError when
        the host went away (the request stays unsettled: its owner still writes the cancel
        frame, for a host that closed its input but reads on)."""
        frame = await self._frames[1].receive()
        if isinstance(frame, Disconnected):
            raise ToolError(self.disconnected)
        return frame

    def settle(self) -> None:
        self.settled = True
        self.registry._remove(self)


def _result_text(content: list[dict[str, Any]]) -> str:
    return "\n".join(str(c.get("text", "")) for c in content
                     if isinstance(c, dict) and c.get("type") == "text").strip()


def _content(raw: list[dict[str, Any]]) -> list[m.TextContent | m.ImageContent]:
    """A host's content blocks as message content (text and images; other kinds dropped)."""
    out: list[m.TextContent | m.ImageContent] = []
    for block in raw:
        try:
            converted = msgspec.convert(block, m.TextContent | m.ImageContent)
        except msgspec.ValidationError:
            continue
        out.append(converted)
    return out


class HostTool(Tool):
    """A tool the host runs; the model sees it like any other
    (docs/design/protocol.md#host-tools)."""

    # A plain class, not attrs: this module is imported at every start, where attrs' generated
    # methods cost more than the class itself (omp/lazy.py).
    __slots__ = ("_pending", "description", "emit", "label", "name", "parameters", "registry")
    # ``shared`` (the Tool default), as in the original: the calls of one batch reach the
    # host together, and the host decides what may run at once.
    name: str
    label: str
    description: str
    parameters: dict[str, Any]

    def __init__(self, registry: ControlRegistry, emit: Emit, *, name: str, label: str,
                 description: str, parameters: dict[str, Any]) -> None:
        self.registry = registry
        self.emit = emit
        self.name = name
        self.label = label
        self.description = description
        self.parameters = parameters
        self._pending: dict[str, PendingRequest] = {}

    @property
    def abort_text(self) -> str:
        """The cancelled call's result text (the original's words)."""
        return f'Host tool "{self.name}" was aborted'

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Ask the host to run the call; waits (no timeout) for its result.

        On cancellation writes ``host_tool_cancel`` and lets ``Cancelled`` propagate.
        """
        # Opened by ``open_call`` before the loop announced the call; else opened now.
        request = self._pending.pop(call_id, None) or self._open(call_id, args)
        if request is None:
            raise ToolError(HOST_TOOL_DISCONNECTED)
        try:
            while True:
                frame = await request.next_frame()
                if isinstance(frame, cmd.HostToolUpdate):
                    await on_update(ToolResult(_content(frame.partialResult.content),
                                               _details(frame.partialResult.details)))
                    continue
                assert isinstance(frame, cmd.HostToolResult)
                request.settle()
                if frame.isError:
                    raise ToolError(_result_text(frame.result.content)
                                    or "Host tool execution failed",
                                    _details(frame.result.details))
                return ToolResult(_content(frame.result.content), _details(frame.result.details))
        finally:
            if not request.settled:
                request.settle()
                self.emit(ev.HostToolCancel(id=new_request_id(), targetId=request.id))

    def open_call(self, call_id: str, args: dict[str, Any]) -> None:
        """Write ``host_tool_call`` now (the loop calls this before ``tool_execution_start``)."""
        if (request := self._open(call_id, args)) is not None:
            self._pending[call_id] = request

    def _open(self, call_id: str, args: dict[str, Any]) -> PendingRequest | None:
        """A request with its ``host_tool_call`` written; None when the host is gone."""
        try:
            request = PendingRequest(self.registry, "host_tool_result", HOST_TOOL_DISCONNECTED)
        except ToolError:
            return None
        self.emit(ev.HostToolCall(id=request.id, toolCallId=call_id, toolName=self.name,
                                  arguments=args))
        return request


def _details(details: Any) -> Any:
    return None if details is msgspec.UNSET else details


def validate_host_tools(tools: list[cmd.HostToolDefinition], builtin: set[str]
                        ) -> str | None:
    """The first problem with a ``set_host_tools`` list, or None."""
    import jsonschema

    seen: set[str] = set()
    for i, tool in enumerate(tools):
        name = tool.name.strip()
        if not re.match(HOST_TOOL_NAME, name):
            return (f"Host tool at index {i} must have a name of 1-64 letters, digits, _ or - "
                    f"(got {tool.name!r})")
        if name in seen:
            return f'Host tool "{name}" is defined twice'
        if name in builtin:
            return (f'Host tool "{name}" clashes with the built-in tool of that name; pick '
                    "another name (or start omp without that tool: --tools / --no-tools)")
        if not tool.description.strip():
            return f'Host tool "{name}" must provide a non-empty description'
        if tool.parameters.get("type", "object") != "object":
            return f'Host tool "{name}" parameters must be a JSON Schema of type "object"'
        try:
            jsonschema.validators.validator_for(tool.parameters).check_schema(tool.parameters)
        except jsonschema.SchemaError as exc:
            return f'Host tool "{name}" parameters are not a valid JSON Schema: {exc.message}'
        seen.add(name)
    return None


class HostUris(msgspec.Struct, eq=False):
    """The URL schemes the host serves, as the ``read`` / ``write`` tools' UriHandler."""

    registry: ControlRegistry
    emit: Emit
    schemes: dict[str, cmd.HostUriSchemeDefinition] = msgspec.field(default_factory=dict)

    def use_schemes(self, schemes: dict[str, cmd.HostUriSchemeDefinition]) -> None:
        """The host serves ``schemes`` from now on, in place of the earlier ones."""
        self.schemes = schemes

    def _scheme(self, url: str) -> cmd.HostUriSchemeDefinition | None:
        return self.schemes.get(url.partition("://")[0].lower())

    def owns(self, url: str) -> bool:
        return self._scheme(url) is not None

    def writable(self, url: str) -> bool:
        scheme = self._scheme(url)
        return scheme is not None and scheme.writable

    async def read(self, url: str) -> UriResource:
        """Ask the host for ``url``. On cancellation writes ``host_uri_cancel``."""
        frame = await self._request("read", url)
        scheme = self._scheme(url)
        immutable = frame.immutable if isinstance(frame.immutable, bool) else bool(
            scheme and scheme.immutable)
        return UriResource(
            content=frame.content if isinstance(frame.content, str) else "",
            content_type=frame.contentType if isinstance(frame.contentType, str)
            else "text/plain",
            notes=tuple(frame.notes) if isinstance(frame.notes, list) else (),
            immutable=immutable)

    async def write(self, url: str, content: str) -> None:
        """Send ``content`` to the host as ``url``. On cancellation writes ``host_uri_cancel``."""
        await self._request("write", url, content)

    async def _request(self, operation: str, url: str, content: str | None = None
                       ) -> cmd.HostUriResult:
        request = PendingRequest(self.registry, "host_uri_result", HOST_URI_DISCONNECTED)
        self.emit(ev.HostUriRequest(
            id=request.id, operation=operation, url=url,  # type: ignore[arg-type]
            content=msgspec.UNSET if content is None else content))
        try:
            frame = await request.next_frame()
            request.settle()
        finally:
            if not request.settled:
                request.settle()
                self.emit(ev.HostUriCancel(id=new_request_id(), targetId=request.id))
        assert isinstance(frame, cmd.HostUriResult)
        if frame.isError:
            message = frame.error if isinstance(frame.error, str) and frame.error else (
                frame.content if isinstance(frame.content, str) and frame.content
                else f"Host URI {operation} failed for {url}")
            raise ToolError(message)
        return frame


def normalize_schemes(schemes: list[cmd.HostUriSchemeDefinition]
                      ) -> tuple[dict[str, cmd.HostUriSchemeDefinition] | None, str | None]:
    """The registration for a ``set_host_uri_schemes`` list, or the first problem."""
    out: dict[str, cmd.HostUriSchemeDefinition] = {}
    for entry in schemes:
        scheme = entry.scheme.strip().lower()
        if not scheme:
            return None, "Host URI scheme must be a non-empty string"
        if not re.match(URI_SCHEME, scheme):
            return None, f"Host URI scheme contains invalid characters: {entry.scheme}"
        if scheme in RESERVED_SCHEMES:
            return None, f"Host URI scheme is reserved: {scheme}://"
        # The last definition wins; a dict keeps the key where it first appeared.
        out[scheme] = msgspec.structs.replace(entry, scheme=scheme)
    return out, None



class HostUI(msgspec.Struct, eq=False):
    """``ctx.ui`` over RPC: ``extension_ui_request`` frames, answers in the control lane
    (docs/design/protocol.md#extension-ui).

    Dialogs wait for the host's ``extension_ui_response``; a ``timeout`` (ms) resolves to the
    default with no frame; cancellation writes a ``cancel`` request and propagates; a host that
    is gone raises ``UiDisconnected``. Without a UI (``--no-ui``) dialogs return their default
    and presentation frames are dropped. ``set_title`` is written only with
    ``PI_RPC_EMIT_TITLE``.
    """

    registry: ControlRegistry
    emit: Emit
    enabled: bool = True
    emit_title: bool = False

    @property
    def has_ui(self) -> bool:
        return self.enabled

    # ``timeout`` is the protocol's dialog field (ms), which the host shows; we honour it too.
    async def _dialog(self, method: str, timeout: int | None,  # noqa: ASYNC109
                      **fields: Any) -> Any:
        """The host's answer frame, or None (timeout, no UI)."""
        if not self.enabled:
            await trio.lowlevel.checkpoint()
            return None
        # Already cancelled (an abort read in the same write as the work that asks): no
        # request is written at all (docs/design/protocol.md#timeouts-and-aborts).
        await trio.lowlevel.checkpoint_if_cancelled()
        frame_fields = {k: v for k, v in fields.items() if v is not None}
        if self.registry.disconnected:
            # The host is gone: the request is still written (docs/design/protocol.md#end-of-input),
            # then fails.
            self.emit(ev.ExtensionUiRequest(
                id=new_request_id(), method=method,  # type: ignore[arg-type]
                timeout=msgspec.UNSET if timeout is None else timeout, **frame_fields))
            raise UiDisconnected(UI_DISCONNECTED)
        request = PendingRequest(self.registry, "extension_ui_response", UI_DISCONNECTED)
        self.emit(ev.ExtensionUiRequest(
            id=request.id, method=method,  # type: ignore[arg-type]
            timeout=msgspec.UNSET if timeout is None else timeout, **frame_fields))
        try:
            with paused_handler_clock(), trio.move_on_after(
                    math.inf if timeout is None else timeout / 1000):
                try:
                    frame = await request.next_frame()
                except ToolError as exc:
                    request.settle()
                    raise UiDisconnected(str(exc)) from None
                request.settle()
                return frame
            # Timed out: the default, and no cancel frame
            # (docs/design/protocol.md#timeouts-and-aborts)
            request.settle()
            return None
        finally:
            if not request.settled:
                request.settle()
                self.emit(ev.ExtensionUiRequest(id=new_request_id(), method="cancel",
                                                targetId=request.id))

    async def select(self, title: str, options: Sequence[Option], *,
                     timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """Ask the host to pick one of ``options`` (labels, with ``optionDetails`` when any has
        a description); the answer, or None. On cancellation while it waits a ``cancel``
        request for it is written (queued, never waiting) and ``Cancelled`` propagates;
        already cancelled, or without a UI, nothing is written."""
        labels = [o if isinstance(o, str) else str(o.get("label", "")) for o in options]
        described = [None if isinstance(o, str) else o.get("description") for o in options]
        details = ([ev.SelectOptionDetail(description=d) if isinstance(d, str)
                    else ev.SelectOptionDetail() for d in described]
                   if any(isinstance(d, str) for d in described) else None)
        frame = await self._dialog("select", timeout, title=title, options=labels,
                                   optionDetails=details)
        return _value(frame)

    async def confirm(self, title: str, message: str, *, timeout: int | None = None) -> bool:  # noqa: ASYNC109
        """Ask the host a yes-or-no question; False unless it says yes. On cancellation as
        ``select``: a ``cancel`` request for it is written and ``Cancelled`` propagates."""
        frame = await self._dialog("confirm", timeout, title=title, message=message)
        if frame is None or frame.cancelled or not isinstance(frame.confirmed, bool):
            return False
        return frame.confirmed

    async def input(self, title: str, placeholder: str | None = None, *,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """Ask the host for a text; its answer, or None. On cancellation as ``select``: a
        ``cancel`` request for it is written and ``Cancelled`` propagates."""
        frame = await self._dialog("input", timeout, title=title, placeholder=placeholder)
        return _value(frame)

    async def editor(self, title: str, prefill: str | None = None) -> str | None:
        """Ask the host to edit ``prefill`` (no timeout); the text, or None. On cancellation as
        ``select``: a ``cancel`` request for it is written and ``Cancelled`` propagates."""
        frame = await self._dialog("editor", None, title=title, prefill=prefill)
        return _value(frame)

    def _show(self, method: str, **fields: Any) -> None:
        if self.enabled:
            self.emit(ev.ExtensionUiRequest(
                id=new_request_id(), method=method,  # type: ignore[arg-type]
                **{k: v for k, v in fields.items() if v is not None}))

    def notify(self, message: str, type: NotifyType | None = None) -> None:
        self._show("notify", message=message, notifyType=type)

    def set_status(self, key: str, text: str | None = None) -> None:
        self._show("setStatus", statusKey=key, statusText=text)

    def set_widget(self, key: str, lines: Sequence[str] | None = None, *,
                   placement: Literal["aboveEditor", "belowEditor"] | None = None) -> None:
        self._show("setWidget", widgetKey=key,
                   widgetLines=None if lines is None else list(lines),
                   widgetPlacement=placement)

    def set_title(self, title: str) -> None:
        if self.emit_title:
            self._show("setTitle", title=title)

    def set_editor_text(self, text: str) -> None:
        self._show("set_editor_text", text=text)


def _value(frame: Any) -> str | None:
    """``select`` / ``input`` / ``editor``: the answer's ``value``
    (docs/design/protocol.md#answers), else None."""
    if frame is None or frame.cancelled or not isinstance(frame.value, str):
        return None
    return str(frame.value)


def emit_title_enabled(environ: Mapping[str, str]) -> bool:
    """``PI_RPC_EMIT_TITLE`` is 1/true/yes/on (trimmed, any case)."""
    return environ.get("PI_RPC_EMIT_TITLE", "").strip().lower() in ("1", "true", "yes", "on")
