"""What extension handlers receive, and what they may return (docs/design/extending.md#events).

Handlers get ``(event, ctx)``. Events are frozen objects named like the original's, in Python
style (``event.tool_name``, ``event.tool_call_id``, ``event.input``). Messages in events are the
protocol's own frozen message objects, so a handler cannot change history by mutating them.

A handler's return value is read by the event it answers: ``None`` means "no change". Results may
be the typed classes below or plain dicts with the original's keys (``{"block": True, "reason":
"..."}``), so a handler written from the original's documentation works as it is.
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

from ..protocol import messages as m


@attrs.frozen(kw_only=True)
class SessionStartEvent:
    type: ClassVar[str] = "session_start"


@attrs.frozen(kw_only=True)
class SessionShutdownEvent:
    type: ClassVar[str] = "session_shutdown"


@attrs.frozen(kw_only=True)
class AgentStartEvent:
    type: ClassVar[str] = "agent_start"


@attrs.frozen(kw_only=True)
class AgentEndEvent:
    type: ClassVar[str] = "agent_end"
    messages: list[m.AgentMessage]
    """The messages the run added (what the wire ``agent_end`` carries)."""


@attrs.frozen(kw_only=True)
class BeforeAgentStartEvent:
    """Before a prompt (or a dequeued batch of them) reaches the model.

    Return ``{"message": {...}}`` to add a custom message after the prompt, and/or
    ``{"system_prompt": [...]}`` to replace the system prompt for the rest of the run.
    """

    type: ClassVar[str] = "before_agent_start"
    prompt: str
    """The prompt text (several prompts of one batch joined by a blank line)."""
    images: list[m.ImageContent]
    system_prompt: list[str]


@attrs.frozen(kw_only=True)
class ContextEvent:
    """Before every model call. Return ``{"messages": [...]}`` to send other messages on this
    call only (the history is unchanged). Handlers chain: each sees the previous one's output."""

    type: ClassVar[str] = "context"
    messages: list[m.AgentMessage]


@attrs.frozen(kw_only=True)
class TurnStartEvent:
    type: ClassVar[str] = "turn_start"
    turn_index: int
    timestamp: int


@attrs.frozen(kw_only=True)
class TurnEndEvent:
    type: ClassVar[str] = "turn_end"
    turn_index: int
    message: m.AssistantMessage
    tool_results: list[m.ToolResultMessage]


@attrs.frozen(kw_only=True)
class MessageEndEvent:
    type: ClassVar[str] = "message_end"
    message: m.AgentMessage


@attrs.frozen(kw_only=True)
class ToolCallEvent:
    """Before every tool call (built-in, extension and host tools), before it is announced.

    Return ``{"block": True, "reason": "..."}`` to refuse it (its result is an error with that
    text), or ``{"input": {...}}`` to run it with other arguments. The first block wins; every
    handler sees the original input. A handler that fails or times out blocks the call.
    """

    type: ClassVar[str] = "tool_call"
    tool_call_id: str
    tool_name: str
    input: dict[str, Any]


@attrs.frozen(kw_only=True)
class ToolResultEvent:
    """After every tool call. Return ``{"content": [...], "details": ..., "is_error": bool}``
    (any of them) to change the result; handlers chain."""

    type: ClassVar[str] = "tool_result"
    tool_call_id: str
    tool_name: str
    input: dict[str, Any]
    content: list[dict[str, Any]]
    """Content blocks as JSON objects (``{"type": "text", "text": ...}``)."""
    details: Any
    is_error: bool


@attrs.frozen(kw_only=True)
class ToolApprovalRequestedEvent:
    """A tool call needs approval: written before the host (or the embedding program's policy
    function) is asked, only for calls that ask (docs/guides/approval.md#extensions-and-approval).
    Observation only: the return value is ignored, as in the original (a handler that wants to
    refuse a call does so in ``tool_call``)."""

    type: ClassVar[str] = "tool_approval_requested"
    session_id: str
    """The session whose call it is (a subagent's own id for a subagent's call)."""
    tool_call_id: str
    tool_name: str
    approval_mode: str
    """``always-ask``, ``write`` or ``yolo`` (``--auto-approve``: ``yolo``)."""
    reason: str | None = None
    """Why it asks beyond the tier (``Critical pattern detected``, a bash ``prompt`` pattern)."""


@attrs.frozen(kw_only=True)
class ToolApprovalResolvedEvent:
    """The answer to a ``tool_approval_requested``: ``approved``, and when not, ``reason``
    (``denied by user``, ``no interactive UI available``, or the error that ended the wait,
    such as the host closing its input). Not written when an ``abort`` ended the wait. The
    return value is ignored."""

    type: ClassVar[str] = "tool_approval_resolved"
    session_id: str
    tool_call_id: str
    tool_name: str
    approval_mode: str
    approved: bool
    reason: str | None = None


Event = (SessionStartEvent | SessionShutdownEvent | AgentStartEvent | AgentEndEvent
         | BeforeAgentStartEvent | ContextEvent | TurnStartEvent | TurnEndEvent
         | MessageEndEvent | ToolCallEvent | ToolResultEvent | ToolApprovalRequestedEvent
         | ToolApprovalResolvedEvent)

EVENT_TYPES: frozenset[str] = frozenset(cls.type for cls in (
    SessionStartEvent, SessionShutdownEvent, AgentStartEvent, AgentEndEvent,
    BeforeAgentStartEvent, ContextEvent, TurnStartEvent, TurnEndEvent, MessageEndEvent,
    ToolCallEvent, ToolResultEvent, ToolApprovalRequestedEvent, ToolApprovalResolvedEvent))
"""The names ``on()`` accepts."""


@attrs.frozen(kw_only=True)
class ToolCallResult:
    """A typed answer to ``tool_call`` (a dict with the same keys works too)."""

    block: bool = False
    reason: str | None = None
    input: dict[str, Any] | None = None


@attrs.frozen(kw_only=True)
class ToolResultChange:
    """A typed answer to ``tool_result``; fields left None are kept."""

    content: list[dict[str, Any]] | None = None
    details: Any = None
    is_error: bool | None = None


def field(result: object, name: str, *aliases: str) -> Any:
    """A result's field, from a dict (original's keys, or Python-style aliases) or an object."""
    if result is None:
        return None
    for key in (name, *aliases):
        if isinstance(result, dict):
            if key in result:
                return result[key]
        elif hasattr(result, key):
            return getattr(result, key)
    return None
