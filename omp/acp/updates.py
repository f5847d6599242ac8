"""From session events to ACP ``session/update``\\ s, as the original maps them
(docs/guides/acp.md#prompts-and-updates). No I/O: ``UpdateMapper.updates(event)`` returns the
updates one event becomes.

* Streamed ``text_delta`` / ``thinking_delta`` become ``agent_message_chunk`` /
  ``agent_thought_chunk``, empty deltas skipped; every chunk of one assistant message shares a
  random ``messageId`` (a UUID per message). An assistant message that streamed no text (a
  provider that sends it whole) gives one chunk with its text at ``message_end``; one that
  ended in an error gives its ``errorMessage`` as a message chunk (a provider error is no
  JSON-RPC error: the turn ends ``end_turn``).
* ``tool_execution_start`` → ``tool_call`` (``pending``, title, kind, ``rawInput`` without the
  intent field ``i``, start content, locations); ``tool_execution_update`` →
  ``tool_call_update`` ``in_progress`` with the partial result as ``rawOutput``;
  ``tool_execution_end`` → ``tool_call_update`` ``completed`` / ``failed``; both with the
  start content, a ``terminal`` content when the call ran in an editor terminal (its
  ``details.terminalId``), and the result's text (capped, the start content's duplicate left
  out); after the ``todo`` tool a ``plan`` with every task of every phase.
* Everything else (turns, retries, compaction, notices) becomes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import msgspec

from ..agent.loop import AssistantUpdate
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol.commands import TodoPhase
from . import wire as w

TEXT_CAP = 4000
"""Most characters of a tool result's text shown in a ``tool_call_update`` (the original's)."""

KINDS: dict[str, w.ToolKind] = {
    "read": "read", "write": "edit", "edit": "edit", "delete": "delete", "move": "move",
    "bash": "execute", "shell": "execute", "exec": "execute", "eval": "execute",
    "grep": "search", "glob": "search", "find": "search", "ast_grep": "search",
    "web_search": "fetch", "web_fetch": "fetch", "todo": "think"}

_PLAN_STATUS: dict[str, Any] = {
    "pending": "pending", "in_progress": "in_progress", "completed": "completed",
    "abandoned": "completed", "blocked": "pending"}


def tool_kind(name: str, args: dict[str, Any]) -> w.ToolKind:
    path = args.get("path")
    if name == "write" and isinstance(path, str) and path.startswith("xd://"):
        return "execute"
    return KINDS.get(name, "other")


def tool_title(name: str, args: dict[str, Any], intent: str | None) -> str:
    """``$ <command>`` for bash, else the model's intent, else ``<tool>: <subject>``, else
    the tool's name."""
    command = args.get("command")
    if name == "bash" and isinstance(command, str):
        return f"$ {command}"
    if intent:
        return intent
    for key in ("path", "command", "pattern", "query", "url"):
        value = args.get(key)
        if isinstance(value, str) and value:
            return value if "://" in value else f"{name}: {value}"
    return name


def tool_locations(name: str, args: dict[str, Any], cwd: Path) -> list[w.Location]:
    """Absolute paths the call touches (``path``, ``oldPath``, ``newPath``); never URLs; for
    ``read`` only an existing regular file."""
    found = []
    for key in ("path", "oldPath", "newPath"):
        value = args.get(key)
        if not isinstance(value, str) or not value or "://" in value:
            continue
        path = Path(value).expanduser()
        path = path if path.is_absolute() else cwd / path
        if name == "read" and not path.is_file():
            continue
        found.append(w.Location(path=str(path)))
    return found


def tool_call(call_id: str, name: str, raw_args: dict[str, Any], intent: str | None,
              cwd: Path) -> w.ToolCall:
    """The ``tool_call`` update (``pending``) of a call, its intent field ``i`` left out of
    ``rawInput``."""
    args = {k: v for k, v in raw_args.items() if k != "i"}
    content: list[w.ToolContentItem] = []
    if name == "bash" and isinstance(args.get("command"), str):
        content.append(w.ToolCallContent(content=w.TextContent(text=f"$ {args['command']}")))
    locations = tool_locations(name, args, cwd)
    return w.ToolCall(toolCallId=call_id, title=tool_title(name, args, intent),
                      kind=tool_kind(name, args), status="pending", rawInput=args,
                      content=content or msgspec.UNSET, locations=locations or msgspec.UNSET)


def plan_of(phases: list[TodoPhase]) -> w.Plan:
    return w.Plan(entries=[
        w.PlanEntry(content=task.content, priority="medium",
                    status=_PLAN_STATUS.get(task.status, "pending"))
        for phase in phases for task in phase.tasks])


def _result_text(result: ev.ToolExecutionResult) -> str:
    text = "\n".join(c.text for c in result.content if isinstance(c, m.TextContent))
    return text if len(text) <= TEXT_CAP else text[:TEXT_CAP] + "…"


def _merged(start: list[w.ToolContentItem], result: ev.ToolExecutionResult
            ) -> list[w.ToolContentItem]:
    """The start content, then the result's: the editor terminal it ran in (``details``
    ``terminalId``: the editor shows the terminal itself), then its text unless the start
    content already says it."""
    content = list(start)
    details = result.details
    terminal = details.get("terminalId") if isinstance(details, dict) else None
    if isinstance(terminal, str):
        content.append(w.ToolCallTerminal(terminalId=terminal))
    text = _result_text(result)
    if text and not any(isinstance(c, w.ToolCallContent)
                        and isinstance(c.content, w.TextContent) and c.content.text == text
                        for c in content):
        content.append(w.ToolCallContent(content=w.TextContent(text=text)))
    return content


@attrs.define(eq=False, repr=False)
class UpdateMapper:
    """One ACP session's mapping state: the open assistant message and the tool calls."""

    cwd: Path
    todos: Callable[[], list[TodoPhase]]
    """The session's todo phases now (read after the ``todo`` tool ran)."""
    _message_id: str | None = attrs.field(default=None, init=False)
    _streamed_text: bool = attrs.field(default=False, init=False)
    _start_content: dict[str, list[w.ToolContentItem]] = attrs.field(factory=dict, init=False)

    def updates(self, event: object) -> list[w.SessionUpdate]:
        if isinstance(event, AssistantUpdate):
            return self._stream(event)
        if isinstance(event, ev.MessageEnd) and isinstance(event.message, m.AssistantMessage):
            return self._assistant_end(event.message)
        if isinstance(event, ev.ToolExecutionStart):
            return [self._tool_call(event)]
        if isinstance(event, ev.ToolExecutionUpdate):
            content = _merged(self._start_content.get(event.toolCallId, []),
                              event.partialResult)
            return [w.ToolCallUpdate(toolCallId=event.toolCallId, status="in_progress",
                                     rawOutput=msgspec.to_builtins(event.partialResult),
                                     content=content or msgspec.UNSET)]
        if isinstance(event, ev.ToolExecutionEnd):
            return self._tool_end(event)
        return []

    def _id(self) -> str:
        if self._message_id is None:
            self._message_id = str(uuid.uuid4())
        return self._message_id

    def _stream(self, update: AssistantUpdate) -> list[w.SessionUpdate]:
        event = update.event
        if event.type == "text_delta" and event.delta:
            self._streamed_text = True
            return [w.AgentMessageChunk(content=w.TextContent(text=event.delta),
                                        messageId=self._id())]
        if event.type == "thinking_delta" and event.delta:
            return [w.AgentThoughtChunk(content=w.TextContent(text=event.delta),
                                        messageId=self._id())]
        return []

    def _assistant_end(self, message: m.AssistantMessage) -> list[w.SessionUpdate]:
        out: list[w.SessionUpdate] = []
        if not self._streamed_text:
            text = "".join(b.text for b in message.content if isinstance(b, m.TextContent))
            if text:
                out.append(w.AgentMessageChunk(content=w.TextContent(text=text),
                                               messageId=self._id()))
        if message.stopReason == "error":
            out.append(w.AgentMessageChunk(
                content=w.TextContent(text=message.errorMessage or "Unknown error"),
                messageId=self._id()))
        self._message_id = None
        self._streamed_text = False
        return out

    def _tool_call(self, event: ev.ToolExecutionStart) -> w.ToolCall:
        call = tool_call(event.toolCallId, event.toolName, event.args,
                         event.intent if isinstance(event.intent, str) else None, self.cwd)
        self._start_content[event.toolCallId] = [] if isinstance(call.content, msgspec.UnsetType) \
            else list(call.content)
        return call

    def _tool_end(self, event: ev.ToolExecutionEnd) -> list[w.SessionUpdate]:
        content = _merged(self._start_content.pop(event.toolCallId, []), event.result)
        out: list[w.SessionUpdate] = [w.ToolCallUpdate(
            toolCallId=event.toolCallId, status="failed" if event.isError else "completed",
            rawOutput=msgspec.to_builtins(event.result), content=content or msgspec.UNSET)]
        if event.toolName == "todo" and not event.isError:
            out.append(plan_of(self.todos()))
        return out
