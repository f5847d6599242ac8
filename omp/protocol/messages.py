"""The message model on the wire: content blocks, messages, usage, streaming events.

Shapes follow the original's (docs/design/agent-loop.md#messages,
docs/design/agent-loop.md#streaming) so that frames carrying messages match the protocol.
``omp.llm`` builds these; ``omp.protocol`` owns them because frames embed them and this package
may import nothing else of ``omp``.

Content blocks and streaming events are tagged by ``type``; messages by ``role``. Fields the
original fills only in some situations default to ``UNSET`` (omitted); boolean flags the original
writes only when true default to ``False``, which ``omit_defaults`` leaves out the same way.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "AgentMessage",
    "AssistantContent",
    "AssistantDoneEvent",
    "AssistantErrorEvent",
    "AssistantMessage",
    "AssistantMessageEvent",
    "AssistantStartEvent",
    "AssistantUpdateEvent",
    "Attribution",
    "BashExecutionMessage",
    "BranchSummaryMessage",
    "CompactionSummaryMessage",
    "ContentBlock",
    "CustomMessage",
    "DeveloperMessage",
    "ImageContent",
    "ImageEndEvent",
    "RedactedThinkingContent",
    "StopReason",
    "TextContent",
    "TextDeltaEvent",
    "TextEndEvent",
    "TextStartEvent",
    "ThinkingContent",
    "ThinkingDeltaEvent",
    "ThinkingEndEvent",
    "ThinkingStartEvent",
    "ToolCall",
    "ToolCallDeltaEvent",
    "ToolCallEndEvent",
    "ToolCallStartEvent",
    "ToolResultMessage",
    "Usage",
    "UsageCost",
    "UserContent",
    "UserMessage",
]

StopReason = Literal["stop", "length", "toolUse", "error", "aborted"]
Attribution = Literal["user", "agent"]


class _Block(msgspec.Struct, tag_field="type", frozen=True, kw_only=True, omit_defaults=True):
    pass


class _Message(msgspec.Struct, tag_field="role", frozen=True, kw_only=True, omit_defaults=True):
    @property
    def role(self) -> str:
        """The message's ``role`` on the wire (``user``, ``assistant``, ``toolResult``...)."""
        return str(self.__struct_config__.tag)


# --- content blocks (docs/design/agent-loop.md#content-blocks) -------------------------------


class TextContent(_Block, tag="text", frozen=True, kw_only=True, omit_defaults=True):
    text: str
    # Opaque provider replay metadata (Responses item id, Gemini signature); never shown.
    textSignature: str | UnsetType = UNSET


class ThinkingContent(_Block, tag="thinking", frozen=True, kw_only=True, omit_defaults=True):
    thinking: str
    thinkingSignature: str | UnsetType = UNSET
    itemId: str | UnsetType = UNSET
    redacted: bool = False


class RedactedThinkingContent(_Block, tag="redactedThinking",
                              frozen=True, kw_only=True, omit_defaults=True):
    """Anthropic ``redacted_thinking`` payload, replayed verbatim to the same model only."""

    data: str


class ToolCall(_Block, tag="toolCall", frozen=True, kw_only=True, omit_defaults=True):
    id: str
    name: str
    # Always an object: the parsed JSON arguments, ``{}`` when they did not parse.
    arguments: dict[str, Any]
    thoughtSignature: str | UnsetType = UNSET
    intent: str | UnsetType = UNSET
    customWireName: str | UnsetType = UNSET


class ImageContent(_Block, tag="image", frozen=True, kw_only=True, omit_defaults=True):
    """An image block: base64 ``data`` without a ``data:`` prefix."""

    data: str
    mimeType: str
    detail: Literal["auto", "low", "high", "original"] | UnsetType = UNSET
    url: str | UnsetType = UNSET


UserContent = TextContent | ImageContent
"""What user, developer, custom and tool-result messages may hold."""
AssistantContent = TextContent | ThinkingContent | RedactedThinkingContent | ToolCall | ImageContent
ContentBlock = AssistantContent


# --- usage (docs/design/agent-loop.md#usage) -------------------------------------------------


class UsageCost(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """USD, computed from the model's per-million prices."""

    # No defaults: the original writes every key, zeros included (omit_defaults drops defaults).
    input: float
    output: float
    cacheRead: float
    cacheWrite: float
    total: float


class Usage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    # Written in full even when zero, like the original's zero usage object.
    input: int
    output: int
    cacheRead: int
    cacheWrite: int
    totalTokens: int
    cost: UsageCost
    reasoningTokens: int | UnsetType = UNSET
    contextTokens: int | UnsetType = UNSET
    premiumRequests: float | UnsetType = UNSET

    @classmethod
    def zero(cls) -> Usage:
        cost = UsageCost(input=0.0, output=0.0, cacheRead=0.0, cacheWrite=0.0, total=0.0)
        return cls(input=0, output=0, cacheRead=0, cacheWrite=0, totalTokens=0, cost=cost)


# --- LLM-level messages (docs/design/agent-loop.md#messages-a-model-reads) -------------------


class UserMessage(_Message, tag="user", frozen=True, kw_only=True, omit_defaults=True):
    content: str | list[UserContent]
    timestamp: int
    """Unix milliseconds, like every message timestamp."""
    attribution: Attribution | UnsetType = UNSET
    synthetic: bool = False
    steering: bool = False


class DeveloperMessage(_Message, tag="developer", frozen=True, kw_only=True, omit_defaults=True):
    """Harness-authored instruction (e.g. the compaction-resume prompt, ``synthetic: true``)."""

    content: str | list[UserContent]
    timestamp: int
    attribution: Attribution | UnsetType = UNSET
    synthetic: bool = False
    userInitiated: bool = False


class AssistantMessage(_Message, tag="assistant", frozen=True, kw_only=True, omit_defaults=True):
    content: list[AssistantContent]
    api: str
    provider: str
    model: str
    usage: Usage
    stopReason: StopReason
    timestamp: int
    errorMessage: str | UnsetType = UNSET
    responseId: str | UnsetType = UNSET
    duration: float | UnsetType = UNSET
    """Milliseconds from request to the end of the stream."""
    ttft: float | UnsetType = UNSET
    """Milliseconds to the first streamed token."""
    completedAt: int | UnsetType = UNSET
    errorStatus: int | UnsetType = UNSET
    """HTTP status of a failed request."""
    errorId: int | UnsetType = UNSET
    upstreamProvider: str | UnsetType = UNSET
    upstreamModel: str | UnsetType = UNSET


class ToolResultMessage(_Message, tag="toolResult", frozen=True, kw_only=True, omit_defaults=True):
    toolCallId: str
    toolName: str
    content: list[UserContent]
    isError: bool
    timestamp: int
    # UI/tool metadata, never sent to the model; any JSON value.
    details: Any = UNSET
    attribution: Attribution | UnsetType = UNSET


# --- agent-level messages (docs/design/agent-loop.md#the-agents-own-messages) ----------------


class CustomMessage(_Message, tag="custom", frozen=True, kw_only=True, omit_defaults=True):
    customType: str
    content: str | list[UserContent]
    display: bool
    timestamp: int
    details: Any = UNSET
    attribution: Attribution | UnsetType = UNSET


class BashExecutionMessage(_Message, tag="bashExecution",
                           frozen=True, kw_only=True, omit_defaults=True):
    """A user-run shell command (RPC ``bash``), recorded into the context."""

    command: str
    output: str
    cancelled: bool
    truncated: bool
    timestamp: int
    # The original omits it for cancelled/timed-out commands; ``None`` is written as ``null``.
    exitCode: int | UnsetType | None = UNSET
    excludeFromContext: bool = False
    images: list[ImageContent] | UnsetType = UNSET
    meta: Any = UNSET


class CompactionSummaryMessage(_Message, tag="compactionSummary",
                               frozen=True, kw_only=True, omit_defaults=True):
    summary: str
    tokensBefore: int
    timestamp: int
    shortSummary: str | UnsetType = UNSET
    tokensAfter: int | UnsetType = UNSET
    method: str | UnsetType = UNSET


class BranchSummaryMessage(_Message, tag="branchSummary",
                           frozen=True, kw_only=True, omit_defaults=True):
    summary: str
    fromId: str
    timestamp: int


# The original also has pythonExecution, fileMention and hookMessage roles; this port never
# produces them, so they are left out (decoding one fails loudly instead of losing data).
AgentMessage = (
    UserMessage
    | DeveloperMessage
    | AssistantMessage
    | ToolResultMessage
    | CustomMessage
    | BashExecutionMessage
    | CompactionSummaryMessage
    | BranchSummaryMessage
)


# --- streaming events ------------------------------------------------------------------------
# docs/design/agent-loop.md#stream-events, docs/design/protocol.md#message_update


class _StreamEvent(msgspec.Struct, tag_field="type", frozen=True, kw_only=True,
                   omit_defaults=True):
    pass


class AssistantStartEvent(_StreamEvent, tag="start", frozen=True, kw_only=True, omit_defaults=True):
    partial: AssistantMessage


class TextStartEvent(_StreamEvent, tag="text_start", frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    partial: AssistantMessage


class TextDeltaEvent(_StreamEvent, tag="text_delta", frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    delta: str
    partial: AssistantMessage


class TextEndEvent(_StreamEvent, tag="text_end", frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    content: str
    """The whole text of the block."""
    partial: AssistantMessage


class ThinkingStartEvent(_StreamEvent, tag="thinking_start",
                         frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    partial: AssistantMessage


class ThinkingDeltaEvent(_StreamEvent, tag="thinking_delta",
                         frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    delta: str
    partial: AssistantMessage


class ThinkingEndEvent(_StreamEvent, tag="thinking_end",
                       frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    content: str
    partial: AssistantMessage


class ToolCallStartEvent(_StreamEvent, tag="toolcall_start",
                         frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    partial: AssistantMessage


class ToolCallDeltaEvent(_StreamEvent, tag="toolcall_delta",
                         frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    delta: str
    """A raw JSON fragment of the arguments; the first one may be empty."""
    partial: AssistantMessage


class ToolCallEndEvent(_StreamEvent, tag="toolcall_end",
                       frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    toolCall: ToolCall
    partial: AssistantMessage


class ImageEndEvent(_StreamEvent, tag="image_end", frozen=True, kw_only=True, omit_defaults=True):
    contentIndex: int
    content: ImageContent
    partial: AssistantMessage


class AssistantDoneEvent(_StreamEvent, tag="done", frozen=True, kw_only=True, omit_defaults=True):
    reason: Literal["stop", "length", "toolUse"]
    message: AssistantMessage


class AssistantErrorEvent(_StreamEvent, tag="error", frozen=True, kw_only=True, omit_defaults=True):
    reason: Literal["error", "aborted"]
    error: AssistantMessage
    """The failed message: its ``stopReason`` equals ``reason`` and ``errorMessage`` is set."""


AssistantUpdateEvent = (
    AssistantStartEvent
    | TextStartEvent
    | TextDeltaEvent
    | TextEndEvent
    | ThinkingStartEvent
    | ThinkingDeltaEvent
    | ThinkingEndEvent
    | ToolCallStartEvent
    | ToolCallDeltaEvent
    | ToolCallEndEvent
    | ImageEndEvent
)
"""The provider events forwarded in ``message_update`` (``start`` only on a stream restart)."""

AssistantMessageEvent = AssistantUpdateEvent | AssistantDoneEvent | AssistantErrorEvent
"""Everything a provider stream yields: block events, then exactly one ``done`` or ``error``."""
