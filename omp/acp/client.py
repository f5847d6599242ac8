"""Requests of ours to the editor: ``session/request_permission``, ``fs/*``, ``terminal/*``.

``ClientChannel`` numbers them from 0 (the original's ids), sends them through the server's
output and wakes the waiting task when the reader hands it the response (``arrived``); a
response whose id is unknown (never sent, or given up on) is ignored. A request the editor
answers with an error raises ``ClientError``.

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

    async def ask(self, method: str, params: msgspec.Struct) -> msgspec.Raw:
        """Send a request of ours to the client and wait for its result. Raises ClientError
        when the client answers with an error. On cancellation the wait ends (a late answer
        is ignored)."""
        request_id = self._next_id
        self._next_id += 1
        arrived = trio.Event()
        box: list[w.Envelope] = []
        self._waits[request_id] = (arrived, box)
        try:
            self.send(w.Request(id=request_id, method=method, params=params))
            await arrived.wait()
        finally:
            self._waits.pop(request_id, None)
        reply = box[0]
        if isinstance(reply.error, w.ErrorObject):
            raise ClientError(f"{method} failed: {reply.error.message}")
        return reply.result if isinstance(reply.result, msgspec.Raw) else msgspec.Raw(b"null")

    def arrived(self, envelope: w.Envelope) -> None:
        """A response from the client: wakes the request's waiter (none: ignored,
        docs/guides/acp.md#what-differs-from-the-original-and-why)."""
        wait = self._waits.get(envelope.id) if isinstance(envelope.id, int) else None
        if wait is not None:
            wait[1].append(envelope)
            wait[0].set()

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
                    kind: type[Any]) -> Any:
    """A request for a tool: its decoded result, or ToolError naming what failed."""
    try:
        raw = await channel.ask(method, params)
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
    abandoned (a late answer is ignored)."""

    channel: ClientChannel
    session_id: str

    async def create(self, command: str, args: list[str], cwd: Path,
                     output_byte_limit: int) -> str:
        created = await _ask_tool(self.channel, "terminal/create", w.CreateTerminalParams(
            sessionId=self.session_id, command=command, args=args, cwd=str(cwd),
            outputByteLimit=output_byte_limit), w.CreateTerminalResponse)
        terminal_id: str = created.terminalId
        return terminal_id

    async def output(self, terminal_id: str) -> TerminalOutput:
        got = await _ask_tool(self.channel, "terminal/output", self._params(terminal_id),
                              w.TerminalOutputResponse)
        return TerminalOutput(output=got.output, truncated=got.truncated)

    async def wait_for_exit(self, terminal_id: str) -> TerminalExit:
        status = await _ask_tool(self.channel, "terminal/wait_for_exit",
                                 self._params(terminal_id), w.TerminalExitStatus)
        return TerminalExit(exit_code=status.exitCode, signal=status.signal)

    async def kill(self, terminal_id: str) -> None:
        await _ask_tool(self.channel, "terminal/kill", self._params(terminal_id), Any)

    async def release(self, terminal_id: str) -> None:
        await _ask_tool(self.channel, "terminal/release", self._params(terminal_id), Any)

    def _params(self, terminal_id: str) -> w.TerminalParams:
        return w.TerminalParams(sessionId=self.session_id, terminalId=terminal_id)
