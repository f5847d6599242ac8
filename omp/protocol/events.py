"""Outbound frames other than the transport's own (``ready``, ``response``, ``rpc_chunk``,
``rpc_frame_error`` live in ``frames``).

Two families, because they are treated differently
(docs/design/protocol.md#message-ids-and-the-event-filter):

* ``SessionEvent``: what the session publishes about a run (docs/design/protocol.md#run-events,
  docs/design/protocol.md#session-events). ``set_event_filter`` may filter these by ``type``; the
  message frames get a ``messageId``.
* ``SideFrame``: everything else the server writes: prompt completion, sub-protocol requests
  (host tools, host URIs, extension UI), subagent and builtin side channels. Never filtered.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import msgspec
from msgspec import UNSET, UnsetType

from .commands import RequestId, ThinkingLevel, TodoItem
from .messages import (
    AgentMessage,
    AssistantMessage,
    AssistantUpdateEvent,
    ImageContent,
    TextContent,
    ToolCall,
    ToolResultMessage,
)
from .payloads import (
    AgentProgress,
    AgentSource,
    AvailableCommand,
    CompactionResult,
    Model,
)
from .tagged import Tagged

__all__ = [
    "SESSION_EVENT_TYPES",
    "AgentEnd",
    "AgentSettled",
    "AgentStart",
    "AutoCompactionEnd",
    "AutoCompactionStart",
    "AutoRetryEnd",
    "AutoRetryStart",
    "AvailableCommand",
    "AvailableCommandsUpdate",
    "BashExecutionUpdate",
    "CommandOutput",
    "ConfigUpdate",
    "ExtensionError",
    "ExtensionUiRequest",
    "HostToolCall",
    "HostToolCancel",
    "HostUriCancel",
    "HostUriRequest",
    "MessageEnd",
    "MessageStart",
    "MessageUpdate",
    "ModelChanged",
    "Notice",
    "PromptError",
    "PromptResult",
    "RetryErrorRecord",
    "RetryFallbackApplied",
    "RetryFallbackSucceeded",
    "SelectOptionDetail",
    "SessionEvent",
    "SessionInfoUpdate",
    "SessionSettled",
    "SideFrame",
    "SubagentEvent",
    "SubagentEventPayload",
    "SubagentLifecycle",
    "SubagentLifecyclePayload",
    "SubagentProgress",
    "SubagentProgressPayload",
    "ThinkingLevelChanged",
    "TodoAutoClear",
    "TodoReminder",
    "ToolExecutionEnd",
    "ToolExecutionResult",
    "ToolExecutionStart",
    "ToolExecutionUpdate",
    "ToolStreamUpdate",
    "TtsrTriggered",
    "TurnEnd",
    "TurnStart",
]


class _Frame(Tagged, msgspec.Struct, tag_field="type", frozen=True, kw_only=True,
             omit_defaults=True):
    pass


# --- agent / turn / message / tool events (docs/design/protocol.md#run-events) ---------------


class AgentStart(_Frame, tag="agent_start", frozen=True, kw_only=True, omit_defaults=True):
    pass


class AgentEnd(_Frame, tag="agent_end", frozen=True, kw_only=True, omit_defaults=True):
    messages: list[AgentMessage]
    """The messages this run added (prompt included), not the whole history."""
    # ``False`` means more work is already scheduled; hosts treat "not false" as finished.
    isTerminal: bool | UnsetType = UNSET
    yielded: bool | UnsetType = UNSET
    awaitingAsyncWork: bool | UnsetType = UNSET


class AgentSettled(_Frame, tag="agent_settled", frozen=True, kw_only=True, omit_defaults=True):
    """pi's end of a prompt's work (docs/protocol/index.md#how-a-prompt-ends): written once no
    run goes on and none follows by itself (after the run's retries, overflow recovery,
    compaction and the queued messages it took in); never for a prompt whose disposition is
    ``handled``."""

    aborted: bool
    """The last run ended because it was aborted (or never started)."""


class TurnStart(_Frame, tag="turn_start", frozen=True, kw_only=True, omit_defaults=True):
    pass


class TurnEnd(_Frame, tag="turn_end", frozen=True, kw_only=True, omit_defaults=True):
    message: AgentMessage
    """The turn's assistant message."""
    toolResults: list[ToolResultMessage]


# messageId (18.3.4) is stamped by the RPC writer, last; absent until then.


class MessageStart(_Frame, tag="message_start", frozen=True, kw_only=True, omit_defaults=True):
    message: AgentMessage
    messageId: str | UnsetType = UNSET


class MessageUpdate(_Frame, tag="message_update", frozen=True, kw_only=True, omit_defaults=True):
    assistantMessageEvent: AssistantUpdateEvent
    message: AssistantMessage
    """Snapshot of the message so far; may run ahead of the deltas."""
    messageId: str | UnsetType = UNSET


DeltaKind = Literal["start", "text_start", "text_delta", "text_end", "thinking_start",
                    "thinking_delta", "thinking_end", "toolcall_start", "toolcall_delta",
                    "toolcall_end", "image_end"]
"""The ``type`` of a delta: the tag of one of the events ``MessageUpdate`` forwards
(``AssistantUpdateEvent``), so the schema names them as it does for the snapshot form."""


class DeltaEvent(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An ``assistantMessageEvent`` without its ``partial`` snapshot (delta mode)."""

    type: DeltaKind
    contentIndex: int
    delta: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    toolCall: ToolCall | UnsetType = UNSET


class MessageUpdateDelta(_Frame, tag="message_update", frozen=True, kw_only=True,
                         omit_defaults=True):
    """``message_update`` in delta mode (``set_event_filter {messageUpdates: "delta"}``): the
    delta only, no snapshot, so an answer costs bytes linear in its length. Not part of the
    ``SessionEvent`` union (same tag as ``MessageUpdate``); only ever encoded."""

    assistantMessageEvent: DeltaEvent
    messageId: str | UnsetType = UNSET


class MessageEnd(_Frame, tag="message_end", frozen=True, kw_only=True, omit_defaults=True):
    message: AgentMessage
    messageId: str | UnsetType = UNSET


class ToolExecutionResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A tool's (partial or final) result as tool execution events carry it."""

    content: list[TextContent | ImageContent]
    # Required: the protocol normalises missing details to ``{}``, so it is always written.
    details: Any


class ToolExecutionStart(_Frame, tag="tool_execution_start",
                         frozen=True, kw_only=True, omit_defaults=True):
    toolCallId: str
    toolName: str
    args: dict[str, Any]
    """The arguments after preparation, which may differ from the raw call."""
    intent: str | UnsetType = UNSET


class ToolExecutionUpdate(_Frame, tag="tool_execution_update",
                          frozen=True, kw_only=True, omit_defaults=True):
    toolCallId: str
    toolName: str
    args: dict[str, Any]
    partialResult: ToolExecutionResult


class BashExecutionUpdate(_Frame, tag="bash_execution_update",
                          frozen=True, kw_only=True, omit_defaults=True):
    """pi's stream of an RPC ``bash`` command's output: one frame per piece read, all of it
    (the response may hold only the elided output); ``id`` is the command's when it had one."""

    delta: str
    id: str | int | UnsetType = UNSET


class ToolExecutionEnd(_Frame, tag="tool_execution_end",
                       frozen=True, kw_only=True, omit_defaults=True):
    toolCallId: str
    toolName: str
    result: ToolExecutionResult
    isError: bool


class ToolStreamUpdate(_Frame, tag="tool_stream_update",
                       frozen=True, kw_only=True, omit_defaults=True):
    """A tool-defined preview while a call's arguments stream (beyond the seed)."""

    toolCallId: str
    toolName: str
    update: Any


# --- session-level events (docs/design/protocol.md#session-events) ---------------------------

CompactionAction = Literal["context-full", "remote", "handoff", "shake", "snapcompact"]


class AutoCompactionStart(_Frame, tag="auto_compaction_start",
                          frozen=True, kw_only=True, omit_defaults=True):
    reason: Literal["threshold", "overflow", "idle", "incomplete"]
    action: CompactionAction


class AutoCompactionEnd(_Frame, tag="auto_compaction_end",
                        frozen=True, kw_only=True, omit_defaults=True):
    action: CompactionAction
    aborted: bool
    willRetry: bool
    result: CompactionResult | UnsetType = UNSET
    errorMessage: str | UnsetType = UNSET
    skipped: bool | UnsetType = UNSET


class AutoRetryStart(_Frame, tag="auto_retry_start", frozen=True, kw_only=True, omit_defaults=True):
    attempt: int
    maxAttempts: int
    delayMs: float
    errorMessage: str
    errorId: int | UnsetType = UNSET


class RetryErrorRecord(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    entryId: str
    note: str
    retryRecovery: Any
    persistenceKey: str | UnsetType = UNSET


class AutoRetryEnd(_Frame, tag="auto_retry_end", frozen=True, kw_only=True, omit_defaults=True):
    success: bool
    attempt: int
    finalError: str | UnsetType = UNSET
    retryErrors: list[RetryErrorRecord] | UnsetType = UNSET


class RetryFallbackApplied(_Frame, tag="retry_fallback_applied",
                           frozen=True, kw_only=True, omit_defaults=True):
    # ``from`` is a Python keyword: the attribute is ``from_``, the key stays ``from``.
    from_: str = msgspec.field(name="from")
    to: str
    role: str
    reason: str | UnsetType = UNSET


class RetryFallbackSucceeded(_Frame, tag="retry_fallback_succeeded",
                             frozen=True, kw_only=True, omit_defaults=True):
    model: str
    role: str


class ModelChanged(_Frame, tag="model_changed", frozen=True, kw_only=True, omit_defaults=True):
    pass


class TtsrTriggered(_Frame, tag="ttsr_triggered", frozen=True, kw_only=True, omit_defaults=True):
    # The rules a delta of the stream matched (``omp.session.rules``), each as the original
    # writes it: ``name``, ``path``, ``content`` and the rule's other fields
    # (docs/guides/approval.md#what-a-host-sees-of-a-rule).
    rules: list[dict[str, Any]]


class TodoReminder(_Frame, tag="todo_reminder", frozen=True, kw_only=True, omit_defaults=True):
    todos: list[TodoItem]
    """The incomplete items."""
    attempt: int
    maxAttempts: int


class TodoAutoClear(_Frame, tag="todo_auto_clear", frozen=True, kw_only=True, omit_defaults=True):
    """Declared by the protocol, never emitted by the original; kept so hosts' filters match."""


class Notice(_Frame, tag="notice", frozen=True, kw_only=True, omit_defaults=True):
    level: Literal["info", "warning", "error"]
    message: str
    source: str | UnsetType = UNSET


class ThinkingLevelChanged(_Frame, tag="thinking_level_changed",
                           frozen=True, kw_only=True, omit_defaults=True):
    # Omitted when the model has no reasoning (the effective level is undefined).
    thinkingLevel: ThinkingLevel | UnsetType = UNSET
    configured: str | UnsetType | None = UNSET
    resolved: str | UnsetType | None = UNSET


# irc_message, goal_updated and the advisor/config-warning UI hints belong to features this port
# does not have; they are left out rather than typed loosely.
SessionEvent = (
    AgentStart
    | AgentEnd
    | AgentSettled
    | TurnStart
    | TurnEnd
    | MessageStart
    | MessageUpdate
    | MessageEnd
    | ToolExecutionStart
    | ToolExecutionUpdate
    | ToolExecutionEnd
    | ToolStreamUpdate
    | BashExecutionUpdate
    | AutoCompactionStart
    | AutoCompactionEnd
    | AutoRetryStart
    | AutoRetryEnd
    | RetryFallbackApplied
    | RetryFallbackSucceeded
    | ModelChanged
    | TtsrTriggered
    | TodoReminder
    | TodoAutoClear
    | Notice
    | ThinkingLevelChanged
)


def _tags(union: Any) -> frozenset[str]:
    tags: set[str] = set()
    for cls in get_args(union):
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str)
        tags.add(tag)
    return frozenset(tags)


SESSION_EVENT_TYPES: frozenset[str] = _tags(SessionEvent)
"""The ``type``s ``set_event_filter`` may filter
(docs/design/protocol.md#message-ids-and-the-event-filter). Which *instances* are exempt
(persistence ``notice``s) is the writer's decision, not the type's."""


# --- prompt completion -----------------------------------------------------------------------
# docs/design/protocol.md#prompt_result, docs/design/protocol.md#session_settled


class PromptError(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    message: str
    retryable: bool
    provider: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    httpStatus: int | UnsetType = UNSET


class PromptResult(_Frame, tag="prompt_result", frozen=True, kw_only=True, omit_defaults=True):
    """Exactly one per accepted ``prompt``/``abort_and_prompt`` that did not finish at once."""

    id: RequestId | None = None
    """The prompt's id; omitted when it had none."""
    agentInvoked: bool
    status: Literal["completed", "aborted", "error"]
    sessionSettled: bool
    error: PromptError | UnsetType = UNSET
    """Only with ``status: "error"``."""


class SessionSettled(_Frame, tag="session_settled", frozen=True, kw_only=True, omit_defaults=True):
    pass


# --- extension UI (docs/design/protocol.md#requests) -----------------------------------------


class SelectOptionDetail(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    # Entries without a description encode as ``{}``, keeping positions aligned with ``options``.
    description: str | UnsetType = UNSET


UiMethod = Literal["select", "confirm", "input", "editor", "cancel", "notify", "setStatus",
                   "setWidget", "setTitle", "set_editor_text", "open_url"]

_UI_REQUIRED: dict[str, tuple[str, ...]] = {
    "select": ("title", "options"),
    "confirm": ("title", "message"),
    "input": ("title",),
    "editor": ("title",),
    "cancel": ("targetId",),
    "notify": ("message",),
    "setStatus": ("statusKey",),
    "setWidget": ("widgetKey",),
    "setTitle": ("title",),
    "set_editor_text": ("text",),
    "open_url": ("url",),
}


class ExtensionUiRequest(_Frame, tag="extension_ui_request",
                         frozen=True, kw_only=True, omit_defaults=True):
    """One Struct for every ``method``, with the union of their optional fields.

    Per-method Structs cannot be told apart inside the frame union: msgspec discriminates on one
    tag field, and ``type`` is the same for all of them. ``__post_init__`` enforces each method's
    required fields instead, so a malformed request is a bug at construction, not a bad frame.
    """

    id: str
    method: UiMethod
    title: str | UnsetType = UNSET
    message: str | UnsetType = UNSET
    options: list[str] | UnsetType = UNSET
    optionDetails: list[SelectOptionDetail] | UnsetType = UNSET
    timeout: int | UnsetType = UNSET
    """Milliseconds; the server resolves the default itself when it elapses."""
    placeholder: str | UnsetType = UNSET
    prefill: str | UnsetType = UNSET
    promptStyle: bool | UnsetType = UNSET
    targetId: str | UnsetType = UNSET
    notifyType: Literal["info", "warning", "error"] | UnsetType = UNSET
    statusKey: str | UnsetType = UNSET
    statusText: str | UnsetType = UNSET
    """Omitted = clear the status."""
    widgetKey: str | UnsetType = UNSET
    widgetLines: list[str] | UnsetType = UNSET
    """Omitted = clear the widget."""
    widgetPlacement: Literal["aboveEditor", "belowEditor"] | UnsetType = UNSET
    text: str | UnsetType = UNSET
    url: str | UnsetType = UNSET
    launchUrl: str | UnsetType = UNSET
    instructions: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        missing = [f for f in _UI_REQUIRED[self.method] if getattr(self, f) is UNSET]
        if missing:
            raise ValueError(f"extension_ui_request method {self.method!r} requires "
                             f"{', '.join(missing)}")


# --- host tools and host URIs ----------------------------------------------------------------
# docs/design/protocol.md#host_tool_call, docs/design/protocol.md#cancelling-a-host-tool,
# docs/design/protocol.md#host_uri_request-and-host_uri_cancel


class HostToolCall(_Frame, tag="host_tool_call", frozen=True, kw_only=True, omit_defaults=True):
    id: str
    toolCallId: str
    toolName: str
    arguments: dict[str, Any]


class HostToolCancel(_Frame, tag="host_tool_cancel", frozen=True, kw_only=True, omit_defaults=True):
    id: str
    targetId: str
    """The ``id`` of the ``host_tool_call`` being cancelled."""


class HostUriRequest(_Frame, tag="host_uri_request", frozen=True, kw_only=True, omit_defaults=True):
    id: str
    operation: Literal["read", "write"]
    url: str
    content: str | UnsetType = UNSET
    """Only for writes: the full replacement text (``""`` when empty)."""


class HostUriCancel(_Frame, tag="host_uri_cancel", frozen=True, kw_only=True, omit_defaults=True):
    id: str
    targetId: str


# --- other side channels (docs/design/protocol.md#frame-families) ----------------------------


class ExtensionError(_Frame, tag="extension_error", frozen=True, kw_only=True, omit_defaults=True):
    extensionPath: str
    event: str
    error: str


class AvailableCommandsUpdate(_Frame, tag="available_commands_update",
                              frozen=True, kw_only=True, omit_defaults=True):
    commands: list[AvailableCommand]


class CommandOutput(_Frame, tag="command_output", frozen=True, kw_only=True, omit_defaults=True):
    text: str


class SessionInfoUpdate(_Frame, tag="session_info_update",
                        frozen=True, kw_only=True, omit_defaults=True):
    sessionId: str
    title: str | UnsetType = UNSET


class ConfigUpdate(_Frame, tag="config_update", frozen=True, kw_only=True, omit_defaults=True):
    model: Model | UnsetType = UNSET
    thinkingLevel: ThinkingLevel | UnsetType = UNSET


# --- subagents (docs/design/subagents.md#frames) ---------------------------------------------


class SubagentLifecyclePayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    agent: str
    agentSource: AgentSource
    status: Literal["started", "completed", "failed", "aborted"]
    index: int
    description: str | UnsetType = UNSET
    sessionFile: str | UnsetType = UNSET
    parentToolCallId: str | UnsetType = UNSET
    detached: bool | UnsetType = UNSET


class SubagentProgressPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    index: int
    agent: str
    agentSource: AgentSource
    task: str
    progress: AgentProgress
    parentToolCallId: str | UnsetType = UNSET
    assignment: str | UnsetType = UNSET
    sessionFile: str | UnsetType = UNSET
    detached: bool | UnsetType = UNSET


class SubagentEventPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    event: SessionEvent
    """The subagent's own session event, without a ``messageId``."""


class SubagentLifecycle(_Frame, tag="subagent_lifecycle",
                        frozen=True, kw_only=True, omit_defaults=True):
    payload: SubagentLifecyclePayload


class SubagentProgress(_Frame, tag="subagent_progress",
                       frozen=True, kw_only=True, omit_defaults=True):
    payload: SubagentProgressPayload


class SubagentEvent(_Frame, tag="subagent_event", frozen=True, kw_only=True, omit_defaults=True):
    payload: SubagentEventPayload


SideFrame = (
    PromptResult
    | SessionSettled
    | ExtensionUiRequest
    | HostToolCall
    | HostToolCancel
    | HostUriRequest
    | HostUriCancel
    | ExtensionError
    | AvailableCommandsUpdate
    | CommandOutput
    | SessionInfoUpdate
    | ConfigUpdate
    | SubagentLifecycle
    | SubagentProgress
    | SubagentEvent
)
