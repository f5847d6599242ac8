"""Requests of ours to the editor: ``session/request_permission``, ``fs/*``, ``terminal/*``.

``ClientChannel`` numbers them from 0 (the original's ids), sends them through the server's
output and wakes the waiting task when the reader hands it the response (``arrived``); a
response whose id is unknown (never sent, or given up on) is ignored, except the late answer
to a request whose asker left a handler for it (``ask``'s ``if_late``: a terminal created after
its ``bash`` was cancelled is released). A request the editor answers with an error raises
``ClientError``.

``EditorFiles`` and ``EditorTerminals`` are one session's view of the editor for the tools
(``omp.tools.base.EditorFiles`` / ``EditorTerminals``): ``read`` / ``write`` through
``fs/read_text_file`` / ``fs/write_text_file``, ``bash`` through ``terminal/*``
(docs/guides/acp.md#what-the-editor-offers). Their failures are ``ToolError``\\ s naming the
request, so the model reads what went wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import msgspec
import trio

from ..tools.base import TerminalExit, TerminalOutput, ToolError
from . import wire as w


class ClientError(Exception):
    """A request of ours that the client answered with an error."""


@attrs.define(eq=False, repr=False)
class ClientChannel:
    """The requests of ours in flight."""

    send: Callable[[w.Outbound], None]
    _next_id: int = attrs.field(default=0, init=False)
    _waits: dict[int, tuple[trio.Event, list[w.Envelope]]] = attrs.field(factory=dict,
                                                                         init=False)
    _late: dict[int, Callable[[msgspec.Raw], None]] = attrs.field(factory=dict, init=False)
    """Requests given up on whose successful answer still has something to undo."""

    async def ask(self, method: str, params: msgspec.Struct, *,
                  if_late: Callable[[msgspec.Raw], None] | None = None) -> msgspec.Raw:
        """Send a request of ours to the client and wait for its result. Raises ClientError
        when the client answers with an error. On cancellation the wait ends and ``Cancelled``
        propagates; a late answer is ignored, or, if it is a success and ``if_late`` is given,
        handed to it (from the reader: it must not block)."""
        request_id = self.tell(method, params)
        arrived = trio.Event()
        box: list[w.Envelope] = []
        self._waits[request_id] = (arrived, box)
        try:
            await arrived.wait()
        finally:
            self._waits.pop(request_id, None)
            if not box and if_late is not None:
                self._late[request_id] = if_late
        reply = box[0]
        if isinstance(reply.error, w.ErrorObject):
            raise ClientError(f"{method} failed: {reply.error.message}")
        return reply.result if isinstance(reply.result, msgspec.Raw) else msgspec.Raw(b"null")

    def tell(self, method: str, params: msgspec.Struct) -> int:
        """Send a request of ours without waiting for it; its id (its answer is ignored)."""
        request_id = self._next_id
        self._next_id += 1
        self.send(w.Request(id=request_id, method=method, params=params))
        return request_id

    def arrived(self, envelope: w.Envelope) -> None:
        """A response from the client: wakes the request's waiter, or hands a late success to
        the handler its asker left (none: ignored,
        docs/guides/acp.md#what-differs-from-the-original-and-why)."""
        if not isinstance(envelope.id, int):
            return
        wait = self._waits.get(envelope.id)
        if wait is not None:
            wait[1].append(envelope)
            wait[0].set()
        elif (late := self._late.pop(envelope.id, None)) is not None and (
                not isinstance(envelope.error, w.ErrorObject)
                and isinstance(envelope.result, msgspec.Raw)):
            late(envelope.result)

    async def request_permission(self, session_id: str, tool_call: w.ToolCallUpdate,
                                 options: list[w.PermissionOption]) -> str | None:
        """Ask the editor whether a tool call may run (``session/request_permission``); the
        chosen ``optionId``, or None when the client cancelled the question. Raises
        ClientError when the client answers with an error. On cancellation the question is
        abandoned."""
        raw = await self.ask("session/request_permission", w.RequestPermissionParams(
            sessionId=session_id, toolCall=tool_call, options=options))
        answer = msgspec.json.decode(raw, type=w.RequestPermissionResponse)
        if answer.outcome.outcome == "selected" and isinstance(answer.outcome.optionId, str):
            return answer.outcome.optionId
        return None


async def _ask_tool(channel: ClientChannel, method: str, params: msgspec.Struct,
                    kind: type[Any], *,
                    if_late: Callable[[msgspec.Raw], None] | None = None) -> Any:
    """A request for a tool: its decoded result, or ToolError naming what failed. On
    cancellation as ``ClientChannel.ask``."""
    try:
        raw = await channel.ask(method, params, if_late=if_late)
        return msgspec.json.decode(raw, type=kind)
    except ClientError as exc:
        raise ToolError(str(exc)) from None
    except msgspec.ValidationError as exc:
        raise ToolError(f"{method}: the editor's answer does not fit: {exc}") from None


@attrs.define(eq=False, repr=False)
class EditorFiles:
    """The editor's files for one session: ``read`` and ``write`` of text files go through
    ``fs/read_text_file`` / ``fs/write_text_file``, so the model sees unsaved buffers and the
    editor sees the change (docs/guides/acp.md#what-the-editor-offers)."""

    channel: ClientChannel
    session_id: str

    async def read_text(self, path: Path) -> str:
        """On cancellation the question is abandoned (a late answer is ignored)."""
        try:
            raw = await self.channel.ask("fs/read_text_file", w.ReadTextFileParams(
                sessionId=self.session_id, path=str(path)))
            return msgspec.json.decode(raw, type=w.ReadTextFileResponse).content
        except (ClientError, msgspec.ValidationError) as exc:
            raise ToolError(f"Cannot read {path}: {exc}") from None

    async def write_text(self, path: Path, content: str) -> None:
        """On cancellation the question is abandoned (the editor may still write)."""
        try:
            await self.channel.ask("fs/write_text_file", w.WriteTextFileParams(
                sessionId=self.session_id, path=str(path), content=content))
        except ClientError as exc:
            raise ToolError(f"Cannot write {path}: {exc}") from None


@attrs.define(eq=False, repr=False)
class EditorTerminals:
    """The editor's terminals for one session (``terminal/*``): ``bash`` runs its commands
    there (``omp.tools.bash_terminal``). Each method: on cancellation the question is
    abandoned (a late answer is ignored; but a terminal created late is released)."""

    channel: ClientChannel
    session_id: str

    async def create(self, command: str, args: list[str], cwd: Path,
                     output_byte_limit: int) -> str:
        """Start ``command args`` in ``cwd`` in a new editor terminal (``terminal/create``);
        the terminal's id. On cancellation the question is abandoned and ``Cancelled``
        propagates; a terminal the editor creates anyway is released (its command killed) as
        soon as its id arrives."""
        created = await _ask_tool(self.channel, "terminal/create", w.CreateTerminalParams(
            sessionId=self.session_id, command=command, args=args, cwd=str(cwd),
            outputByteLimit=output_byte_limit), w.CreateTerminalResponse,
            if_late=self._release_late)
        terminal_id: str = created.terminalId
        return terminal_id

    def _release_late(self, raw: msgspec.Raw) -> None:
        """A terminal created for a ``bash`` call that was cancelled meanwhile: nobody will run
        or release it, so it is released now (which kills its command)."""
        try:
            terminal_id = msgspec.json.decode(raw, type=w.CreateTerminalResponse).terminalId
        except msgspec.DecodeError:
            return  # not an answer we could have used either
        self.channel.tell("terminal/release", self._params(terminal_id))

    async def output(self, terminal_id: str) -> TerminalOutput:
        """The terminal's output so far (``terminal/output``). On cancellation the question is
        abandoned (a late answer is ignored) and ``Cancelled`` propagates."""
        got = await _ask_tool(self.channel, "terminal/output", self._params(terminal_id),
                              w.TerminalOutputResponse)
        return TerminalOutput(output=got.output, truncated=got.truncated)

    async def wait_for_exit(self, terminal_id: str) -> TerminalExit:
        """Until the terminal's command exits (``terminal/wait_for_exit``); its exit status.
        On cancellation the wait is abandoned (the command keeps running; a late answer is
        ignored) and ``Cancelled`` propagates."""
        status = await _ask_tool(self.channel, "terminal/wait_for_exit",
                                 self._params(terminal_id), w.TerminalExitStatus)
        return TerminalExit(exit_code=status.exitCode, signal=status.signal)

    async def kill(self, terminal_id: str) -> None:
        """End the terminal's command (``terminal/kill``); the terminal stays until
        ``release``. On cancellation the question is abandoned (the editor may still kill it)
        and ``Cancelled`` propagates."""
        await _ask_tool(self.channel, "terminal/kill", self._params(terminal_id), Any)

    async def release(self, terminal_id: str) -> None:
        """Kill the command if it still runs and free the terminal (``terminal/release``). On
        cancellation the question is abandoned (the editor may still release it) and
        ``Cancelled`` propagates."""
        await _ask_tool(self.channel, "terminal/release", self._params(terminal_id), Any)

    def _params(self, terminal_id: str) -> w.TerminalParams:
        return w.TerminalParams(sessionId=self.session_id, terminalId=terminal_id)
