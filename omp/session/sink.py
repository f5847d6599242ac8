"""The event path from a session to its host: what a session publishes, and to what.

A session publishes two kinds of things, each typed: ``Published`` (the protocol's session
events, plus ``prompt_result`` and ``session_settled``) and ``Update`` (streaming updates, one
per token or output chunk). The host (the RPC server's outbox, a one-shot front end, a
subagent's parent) implements ``EventSink``; nothing it is given waits.
"""

from __future__ import annotations

from typing import Protocol

from ..agent.loop import AssistantUpdate
from ..llm.builder import NO_PACE, Pace
from ..protocol import events as ev

Published = ev.SessionEvent | ev.PromptResult | ev.SessionSettled
"""Everything but the streaming updates a session publishes."""
Update = AssistantUpdate | ev.ToolExecutionUpdate
"""A streaming update: becomes ``message_update`` / ``tool_execution_update``."""


class EventSink(Protocol):
    """Where the session's events go."""

    def publish(self, event: Published) -> None:
        """Deliver at once; never blocks."""

    def publish_update(self, event: Update) -> None:
        """Deliver a streaming update at once; never blocks. Called once per streamed token."""

    @property
    def pace(self) -> Pace:
        """The consumer's backpressure: the streaming producers wait on it while the consumer
        is far behind (``behind`` is checked after every streamed token)."""


class NullSink:
    """Nobody listens (a session built without a host, as some tests do)."""

    pace: Pace = NO_PACE

    def publish(self, event: Published) -> None:
        pass

    def publish_update(self, event: Update) -> None:
        pass
