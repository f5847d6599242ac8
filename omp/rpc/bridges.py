"""The host sub-protocols: tools and URL schemes the host serves (rpc-behavior §6, §7).

Both work the same way, so one mechanism serves them: a request frame goes out with a fresh id,
the reader routes the host's frames for that id here (control lane, never queued), and the
caller waits in its own task. Rules:

* ``host_tool_call`` / ``host_uri_request`` is written before the work is announced to the host
  (a host tool's call precedes its ``tool_execution_start``).
* Updates (``host_tool_update``) are forwarded while the call waits; the first result settles it;
  anything later, or for an id we never issued, is ignored.
* Cancellation (abort, the run's end, stdin EOF) writes ``host_tool_cancel`` / ``host_uri_cancel``
  for the pending request from a ``finally`` — before ``Cancelled`` goes on — and forgets it.
"""

from __future__ import annotations

import re
import secrets
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio

from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol import messages as m
from ..tools.base import OnUpdate, ToolError, ToolResult, UriResource

if TYPE_CHECKING:
    from .commands import CommandRouter

HOST_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
URI_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*$")
# Schemes with a meaning of their own (ours, the web's, and the original's internal ones, so a
# host written for it keeps its choice of names).
RESERVED_SCHEMES = frozenset({
    "file", "http", "https", "data", "ftp", "skill", "rule", "memory", "agent", "history",
    "artifact", "local", "proc", "cfg", "ssh", "security", "vault", "issue", "pr", "mcp", "omp",
    "xd", "attachment", "conflict"})


def new_request_id() -> str:
    return secrets.token_hex(8)


@attrs.define(eq=False)
class PendingRequest:
    """One request to the host, awaiting its frames (filled by the reader, read by the caller)."""

    router: CommandRouter
    kind: str
    """The control frame kind that answers it (``host_tool_result`` / ``host_uri_result``)."""
    id: str = attrs.field(factory=new_request_id)
    _send: trio.MemorySendChannel[Any] = attrs.field(init=False)
    _recv: trio.MemoryReceiveChannel[Any] = attrs.field(init=False)
    settled: bool = False

    def __attrs_post_init__(self) -> None:
        self._send, self._recv = trio.open_memory_channel(float("inf"))
        self.router.expect_control(self.kind, self.id, self._send.send_nowait)

    async def next_frame(self) -> Any:
        """The next frame the host sent for this request. Cancellable."""
        return await self._recv.receive()

    def settle(self) -> None:
        self.settled = True
        self.router.release_control(self.kind, self.id)


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


@attrs.define(eq=False)
class HostTool:
    """A tool the host runs; the model sees it like any other (DESIGN.md §4.4)."""

    router: CommandRouter
    name: str
    label: str
    description: str
    parameters: dict[str, Any]
    # A host tool may do anything; treated like the built-in tools that change things: run
    # alone, in call order.
    read_only: bool = False
    _pending: dict[str, PendingRequest] = attrs.field(factory=dict)

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate) -> ToolResult:
        """Ask the host to run the call; waits (no timeout) for its result.

        On cancellation writes ``host_tool_cancel`` and lets ``Cancelled`` propagate.
        """
        # Opened by ``open_call`` before the loop announced the call; else opened now.
        request = self._pending.pop(call_id, None) or self._open(call_id, args)
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
                self.router.server.emit(ev.HostToolCancel(id=new_request_id(),
                                                          targetId=request.id))

    def open_call(self, call_id: str, args: dict[str, Any]) -> None:
        """Write ``host_tool_call`` now (the loop calls this before ``tool_execution_start``)."""
        self._pending[call_id] = self._open(call_id, args)

    def _open(self, call_id: str, args: dict[str, Any]) -> PendingRequest:
        request = PendingRequest(self.router, "host_tool_result")
        self.router.server.emit(ev.HostToolCall(id=request.id, toolCallId=call_id,
                                                toolName=self.name, arguments=args))
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
        if not HOST_TOOL_NAME.match(name):
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


@attrs.define(eq=False)
class HostUris:
    """The URL schemes the host serves, as the ``read`` / ``write`` tools' UriHandler."""

    router: CommandRouter
    schemes: dict[str, cmd.HostUriSchemeDefinition] = attrs.field(factory=dict)

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
        request = PendingRequest(self.router, "host_uri_result")
        self.router.server.emit(ev.HostUriRequest(
            id=request.id, operation=operation, url=url,  # type: ignore[arg-type]
            content=msgspec.UNSET if content is None else content))
        try:
            frame = await request.next_frame()
            request.settle()
        finally:
            if not request.settled:
                request.settle()
                self.router.server.emit(ev.HostUriCancel(id=new_request_id(),
                                                         targetId=request.id))
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
        if not URI_SCHEME.match(scheme):
            return None, f"Host URI scheme contains invalid characters: {entry.scheme}"
        if scheme in RESERVED_SCHEMES:
            return None, f"Host URI scheme is reserved: {scheme}://"
        # The last definition wins; a dict keeps the key where it first appeared.
        out[scheme] = msgspec.structs.replace(entry, scheme=scheme)
    return out, None

