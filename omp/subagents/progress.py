"""``AgentProgress``: what one child is doing, built from its own events
(docs/design/subagents.md#frames).

A ``ProgressTracker`` is fed every event of its child (synchronously, from the child's sink)
and answers a full snapshot on demand. Emission is coalesced by ``ProgressPump`` to at most one
per ``PROGRESS_INTERVAL`` seconds, flushed at once on the events the spec names (a tool's end,
the end of a run) and at finalisation. The pump is a task of the child's nursery: it ends with
the child.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import attrs
import trio
from msgspec import UNSET

from ..agent.loop import AssistantUpdate
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol.payloads import AgentProgress, RecentTool
from .agents import AgentSource

PROGRESS_INTERVAL = 0.15
"""Seconds between two progress emissions of one child (docs/design/subagents.md#frames: 150 ms)."""
_ARG_KEYS = ("command", "file_path", "path", "pattern", "query", "url", "task", "prompt")
_OUTPUT_TAIL_BYTES = 8 * 1024
Status = Literal["pending", "running", "completed", "failed", "aborted"]


def opt(value: Any) -> Any:
    """``UNSET`` for None (an optional field left out of the frame)."""
    return UNSET if value is None else value


def args_preview(args: dict[str, Any]) -> str | None:
    """The first string among the usual argument names, at most 60 characters."""
    for key in _ARG_KEYS:
        value = args.get(key)
        if isinstance(value, str):
            return value if len(value) <= 60 else value[:59] + "…"
    return None


@attrs.define(eq=False, repr=False)
class ProgressTracker:
    index: int
    id: str
    agent: str
    agent_source: AgentSource
    task: str
    assignment: str
    context_window: int | None = None
    resolved_model: str | None = None
    status: Status = "pending"
    started: float = attrs.field(factory=trio.current_time)
    tool_count: int = 0
    requests: int = 0
    tokens: int = 0
    cost: float = 0.0
    context_tokens: int | None = None
    last_intent: str | None = None
    current_tool: str | None = None
    current_args: str | None = None
    current_start_ms: float | None = None
    recent_tools: list[RecentTool] = attrs.field(factory=list)
    _text: str = ""
    last_text: str = ""
    """The newest non-empty assistant text (``last activity`` of a cancelled child)."""

    def use_model(self, resolved: str, context_window: int | None) -> None:
        """The model the child runs on (``provider/id``) and its context window, once chosen."""
        self.resolved_model = resolved
        self.context_window = context_window

    def set_status(self, status: Status) -> None:
        """The child's state from now on (the next progress frame says it)."""
        self.status = status

    def observe(self, event: Any) -> bool:
        """Take in one event; True when progress must be emitted now (a flush point;
        docs/design/subagents.md#frames)."""
        if isinstance(event, AssistantUpdate):
            if event.event.type == "text_delta" and event.event.delta:
                self._text = (self._text + event.event.delta)[-_OUTPUT_TAIL_BYTES:]
            return False
        if isinstance(event, ev.MessageStart) and isinstance(event.message, m.AssistantMessage):
            self._text = ""
        elif isinstance(event, ev.MessageEnd) and isinstance(event.message, m.AssistantMessage):
            message = event.message
            self.requests += 1
            usage = message.usage
            self.tokens += usage.input + usage.output + usage.cacheWrite or usage.totalTokens
            self.cost += usage.cost.total
            if usage.totalTokens:
                self.context_tokens = usage.totalTokens
            text = "".join(b.text for b in message.content if isinstance(b, m.TextContent))
            self._text = text[-_OUTPUT_TAIL_BYTES:]
            if text.strip():
                self.last_text = text.strip()
        elif isinstance(event, ev.ToolExecutionStart):
            self.tool_count += 1
            self.current_tool = event.toolName
            self.current_args = args_preview(event.args)
            self.current_start_ms = time.time() * 1000
            if isinstance(event.intent, str) and event.intent:
                self.last_intent = event.intent
        elif isinstance(event, ev.ToolExecutionEnd):
            self.recent_tools.insert(0, RecentTool(
                tool=event.toolName, args=self.current_args if event.toolName
                == self.current_tool else None, endMs=time.time() * 1000))
            del self.recent_tools[5:]
            self.current_tool = self.current_args = self.current_start_ms = None
            return True
        elif isinstance(event, ev.AgentEnd | ev.AutoRetryStart | ev.AutoRetryEnd):
            return True
        return False

    def snapshot(self) -> AgentProgress:
        lines = [line for line in self._text.splitlines() if line.strip()]
        return AgentProgress(
            index=self.index, id=self.id, agent=self.agent, agentSource=self.agent_source,
            status=self.status, task=self.task, assignment=self.assignment,
            recentTools=list(self.recent_tools), recentOutput=lines[-8:][::-1],
            toolCount=self.tool_count, requests=self.requests, tokens=self.tokens,
            cost=self.cost, durationMs=round((trio.current_time() - self.started) * 1000, 1),
            lastIntent=opt(self.last_intent), currentTool=opt(self.current_tool),
            currentToolArgs=opt(self.current_args),
            currentToolStartMs=opt(self.current_start_ms),
            contextTokens=opt(self.context_tokens), contextWindow=opt(self.context_window),
            resolvedModel=opt(self.resolved_model))


@attrs.define(eq=False, repr=False)
class ProgressPump:
    """Coalesces one child's progress emissions (at most one per ``PROGRESS_INTERVAL``)."""

    emit: Callable[[], Awaitable[None]]
    _wake: trio.Event = attrs.field(factory=trio.Event)
    _urgent: trio.Event = attrs.field(factory=trio.Event)

    def changed(self, urgent: bool = False) -> None:
        self._wake.set()
        if urgent:
            self._urgent.set()

    async def run(self) -> None:
        """Emit while the child lives; on cancellation it stops (the finaliser emits the
        last snapshot itself)."""
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            self._urgent = trio.Event()
            await self.emit()
            with trio.move_on_after(PROGRESS_INTERVAL):
                await self._urgent.wait()
