"""Show what the agent is doing: a status line and a widget that follow each run.

Presentation calls (``set_status``, ``set_widget``) are plain functions that return at once; over
RPC each becomes an ``extension_ui_request`` the host displays (and never answers). Handlers run
before the event's own frame is written, so the host sees the status change before, say, the
run's ``agent_end``.

Install: copy this file into ``~/.omp/agent/extensions/``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from omp.extensions import ExtensionAPI, ExtensionContext
from omp.extensions.events import (
    AgentEndEvent,
    AgentStartEvent,
    SessionStartEvent,
    TurnEndEvent,
    TurnStartEvent,
)

KEY = "progress"
"""The status and widget key: one slot per key in the host's UI."""


@dataclass
class Run:
    """What the current run did so far (one per session: runs never overlap)."""

    started: float = 0.0
    turns: int = 0
    tools: int = 0
    failed_tools: int = 0

    def restart(self) -> None:
        self.started, self.turns, self.tools, self.failed_tools = time.monotonic(), 0, 0, 0


def setup(omp: ExtensionAPI) -> None:
    run = Run()

    async def on_session_start(event: SessionStartEvent, ctx: ExtensionContext) -> None:
        ctx.ui.set_status(KEY, "idle")

    async def on_agent_start(event: AgentStartEvent, ctx: ExtensionContext) -> None:
        run.restart()
        ctx.ui.set_status(KEY, "working")

    async def on_turn_start(event: TurnStartEvent, ctx: ExtensionContext) -> None:
        ctx.ui.set_status(KEY, f"working: turn {event.turn_index + 1}")

    async def on_turn_end(event: TurnEndEvent, ctx: ExtensionContext) -> None:
        run.turns += 1
        run.tools += len(event.tool_results)
        run.failed_tools += sum(1 for result in event.tool_results if result.isError)
        ctx.ui.set_widget(KEY, [f"turns: {run.turns}",
                                f"tool calls: {run.tools} ({run.failed_tools} failed)"],
                          placement="belowEditor")

    async def on_agent_end(event: AgentEndEvent, ctx: ExtensionContext) -> None:
        seconds = time.monotonic() - run.started
        ctx.ui.set_status(KEY, f"idle (last run: {run.turns} turns, {seconds:.1f} s)")

    omp.on("session_start", on_session_start)
    omp.on("agent_start", on_agent_start)
    omp.on("turn_start", on_turn_start)
    omp.on("turn_end", on_turn_end)
    omp.on("agent_end", on_agent_end)
