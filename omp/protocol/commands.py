"""Inbound frames: every command a host may send, and the control frames.

Each command is a tagged Struct (``tag_field="type"``). The codec decodes the envelope first and
then the body with the Struct named by ``COMMANDS[type]``, so a bad field is reported against the
right command. Unknown keys are ignored (hosts may send extra keys for their own bookkeeping).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from .messages import ImageContent
from .tagged import Tagged

RequestId = str | int
"""Hosts send string ids; integers are accepted too and echoed as they came."""

StreamingBehavior = Literal["steer", "followUp"]
QueueMode = Literal["all", "one-at-a-time"]
InterruptMode = Literal["immediate", "wait"]
ThinkingLevel = Literal["off", "minimal", "low", "medium", "high", "xhigh", "max"]
"""Lowest first: ``omp.llm.types.THINKING_LEVELS`` is this order
(docs/design/agent-loop.md#thinking-levels)."""
TodoStatus = Literal["pending", "in_progress", "completed", "abandoned", "blocked"]
SubagentLevel = Literal["off", "progress", "events"]


class _Frame(Tagged, msgspec.Struct, tag_field="type", frozen=True, kw_only=True,
             omit_defaults=True):
    id: RequestId | None = None


class TodoItem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    content: str
    status: TodoStatus
    id: str | UnsetType = UNSET
    blocker: str | UnsetType = UNSET


class TodoPhase(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    tasks: list[TodoItem]
    id: str | UnsetType = UNSET


class HostToolDefinition(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    description: str
    parameters: dict[str, Any]
    label: str | UnsetType = UNSET
    hidden: bool = False
    loadMode: Literal["essential", "discoverable"] | UnsetType = UNSET
    readsSkillUris: bool = False


class HostUriSchemeDefinition(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    scheme: str
    description: str | UnsetType = UNSET
    writable: bool = False
    immutable: bool = False


# --- prompting -------------------------------------------------------------------------------


class Prompt(_Frame, tag="prompt", frozen=True):
    message: str
    images: list[ImageContent] | UnsetType = UNSET
    streamingBehavior: StreamingBehavior | UnsetType = UNSET


class Steer(_Frame, tag="steer", frozen=True):
    message: str
    images: list[ImageContent] | UnsetType = UNSET


class FollowUp(_Frame, tag="follow_up", frozen=True):
    message: str
    images: list[ImageContent] | UnsetType = UNSET


class Abort(_Frame, tag="abort", frozen=True):
    pass


class AbortAndPrompt(_Frame, tag="abort_and_prompt", frozen=True):
    message: str
    images: list[ImageContent] | UnsetType = UNSET


class NewSession(_Frame, tag="new_session", frozen=True):
    parentSession: str | UnsetType = UNSET


# --- state -----------------------------------------------------------------------------------


class GetState(_Frame, tag="get_state", frozen=True):
    pass


class GetAvailableCommands(_Frame, tag="get_available_commands", frozen=True):
    pass


class SetTodos(_Frame, tag="set_todos", frozen=True):
    phases: list[TodoPhase]


class SetHostTools(_Frame, tag="set_host_tools", frozen=True):
    tools: list[HostToolDefinition]


class SetHostUriSchemes(_Frame, tag="set_host_uri_schemes", frozen=True):
    schemes: list[HostUriSchemeDefinition]


class SetSubagentSubscription(_Frame, tag="set_subagent_subscription", frozen=True):
    level: SubagentLevel


class GetSubagents(_Frame, tag="get_subagents", frozen=True):
    pass


class GetSubagentMessages(_Frame, tag="get_subagent_messages", frozen=True):
    subagentId: str | UnsetType = UNSET
    sessionFile: str | UnsetType = UNSET
    fromByte: int | UnsetType = UNSET


class NegotiateProtocol(_Frame, tag="negotiate_protocol", frozen=True):
    # Any JSON value: the error for an unsupported one must echo it
    # (docs/design/protocol.md#protocol-v2-chunks).
    protocolVersion: Any


class SetEventFilter(_Frame, tag="set_event_filter", frozen=True):
    # Left out: unchanged. ``null``: every session event.
    events: list[str] | UnsetType | None = UNSET
    # Ours: "delta" sends message_update frames with the delta only (no message snapshots),
    # so a long answer costs linear bytes instead of quadratic.
    messageUpdates: Literal["snapshot", "delta"] | UnsetType = UNSET


# --- model and thinking ----------------------------------------------------------------------


class SetModel(_Frame, tag="set_model", frozen=True):
    provider: str
    modelId: str


class CycleModel(_Frame, tag="cycle_model", frozen=True):
    pass


class GetAvailableModels(_Frame, tag="get_available_models", frozen=True):
    all: bool = False
    """Ours: also the catalog's models whose provider has no credential yet (each with
    ``credential: "missing"``), after the available ones."""
    refresh: bool = False
    """First ask each provider with credentials for its live list (``{baseUrl}/models``, each
    within 10 s and 8 MB); the ids the catalog lacks are added and cached in the agent
    directory, as ``omp models --refresh`` does."""


class SetThinkingLevel(_Frame, tag="set_thinking_level", frozen=True):
    level: ThinkingLevel


class CycleThinkingLevel(_Frame, tag="cycle_thinking_level", frozen=True):
    pass


class GetAvailableThinkingLevels(_Frame, tag="get_available_thinking_levels", frozen=True):
    pass


# --- queue modes -----------------------------------------------------------------------------


class SetSteeringMode(_Frame, tag="set_steering_mode", frozen=True):
    mode: QueueMode


class SetFollowUpMode(_Frame, tag="set_follow_up_mode", frozen=True):
    mode: QueueMode


class SetInterruptMode(_Frame, tag="set_interrupt_mode", frozen=True):
    mode: InterruptMode


# --- compaction, retry, bash -----------------------------------------------------------------


class Compact(_Frame, tag="compact", frozen=True):
    customInstructions: str | UnsetType = UNSET


class SetAutoCompaction(_Frame, tag="set_auto_compaction", frozen=True):
    enabled: bool


class SetAutoRetry(_Frame, tag="set_auto_retry", frozen=True):
    enabled: bool


class SetFastMode(_Frame, tag="set_fast_mode", frozen=True):
    """Ask for the model's priority service tier (docs/design/protocol.md#command-table)."""

    enabled: bool


class AbortRetry(_Frame, tag="abort_retry", frozen=True):
    pass


class Bash(_Frame, tag="bash", frozen=True):
    command: str
    timeout: float | UnsetType = UNSET
    excludeFromContext: bool = False
    """pi's: the output is kept in the session but never sent to the model."""


class AbortBash(_Frame, tag="abort_bash", frozen=True):
    pass


# --- sessions --------------------------------------------------------------------------------


class GetSessionStats(_Frame, tag="get_session_stats", frozen=True):
    pass


class ExportHtml(_Frame, tag="export_html", frozen=True):
    outputPath: str | UnsetType = UNSET


class SwitchSession(_Frame, tag="switch_session", frozen=True):
    sessionPath: str


class OpenSession(_Frame, tag="open_session", frozen=True):
    sessionDir: str


class Branch(_Frame, tag="branch", frozen=True):
    entryId: str


class GetBranchMessages(_Frame, tag="get_branch_messages", frozen=True):
    pass


class GetLastAssistantText(_Frame, tag="get_last_assistant_text", frozen=True):
    pass


class SetSessionName(_Frame, tag="set_session_name", frozen=True):
    name: str


class Handoff(_Frame, tag="handoff", frozen=True):
    customInstructions: str | UnsetType = UNSET


class GetMessages(_Frame, tag="get_messages", frozen=True):
    pass


class GetMessagesPage(_Frame, tag="get_messages_page", frozen=True):
    cursor: str | UnsetType = UNSET
    limit: int | UnsetType = UNSET


class GetEntries(_Frame, tag="get_entries", frozen=True):
    since: str | UnsetType = UNSET


class GetTree(_Frame, tag="get_tree", frozen=True):
    pass


class GetLoginProviders(_Frame, tag="get_login_providers", frozen=True):
    pass


class Login(_Frame, tag="login", frozen=True):
    providerId: str


# --- pi's names and commands (``@earendil-works/pi-coding-agent``), beside the original's --------


class GetCommands(_Frame, tag="get_commands", frozen=True):
    """pi's name for ``get_available_commands``, answered in pi's form."""


class ClearQueue(_Frame, tag="clear_queue", frozen=True):
    pass


class Fork(_Frame, tag="fork", frozen=True):
    """pi's name for ``branch``."""

    entryId: str


class Clone(_Frame, tag="clone", frozen=True):
    pass


class GetForkMessages(_Frame, tag="get_fork_messages", frozen=True):
    """pi's name for ``get_branch_messages``."""


class ListSessions(_Frame, tag="list_sessions", frozen=True):
    cwd: str | UnsetType = UNSET
    all: bool = False
    limit: int | UnsetType = UNSET
    query: str | UnsetType = UNSET


Command = (
    Prompt | Steer | FollowUp | Abort | AbortAndPrompt | NewSession | GetState
    | GetAvailableCommands | SetTodos | SetHostTools | SetHostUriSchemes
    | SetSubagentSubscription | GetSubagents | GetSubagentMessages | NegotiateProtocol
    | SetEventFilter | SetModel | CycleModel | GetAvailableModels | SetThinkingLevel
    | CycleThinkingLevel | GetAvailableThinkingLevels | SetSteeringMode | SetFollowUpMode
    | SetInterruptMode | Compact | SetAutoCompaction | SetAutoRetry | SetFastMode | AbortRetry
    | Bash | AbortBash | GetSessionStats | ExportHtml | SwitchSession | OpenSession | Branch
    | GetBranchMessages | GetLastAssistantText | SetSessionName | Handoff | GetMessages
    | GetMessagesPage | GetEntries | GetTree | GetLoginProviders | Login | GetCommands
    | ClearQueue | Fork | Clone | GetForkMessages | ListSessions
)


# --- control frames (answered only when malformed) -------------------------------------------


class ToolResultPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    # Content blocks stay raw JSON objects here: the host tool bridge hands them to the agent,
    # which validates them as message content.
    content: list[dict[str, Any]]
    details: Any = UNSET


class HostToolUpdate(Tagged, msgspec.Struct, tag_field="type", tag="host_tool_update", frozen=True,
                     kw_only=True, omit_defaults=True):
    id: str
    partialResult: ToolResultPayload


class HostToolResult(Tagged, msgspec.Struct, tag_field="type", tag="host_tool_result", frozen=True,
                     kw_only=True, omit_defaults=True):
    id: str
    result: ToolResultPayload
    isError: bool = False


class HostUriResult(Tagged, msgspec.Struct, tag_field="type", tag="host_uri_result", frozen=True,
                    kw_only=True, omit_defaults=True):
    id: str
    content: str | UnsetType = UNSET
    contentType: str | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    immutable: bool | UnsetType = UNSET
    isError: bool = False
    error: str | UnsetType = UNSET


class ExtensionUiResponse(Tagged, msgspec.Struct, tag_field="type", tag="extension_ui_response",
                          frozen=True, kw_only=True, omit_defaults=True):
    id: str
    value: str | UnsetType = UNSET
    confirmed: bool | UnsetType = UNSET
    cancelled: bool = False
    timedOut: bool = False


ControlFrame = HostToolUpdate | HostToolResult | HostUriResult | ExtensionUiResponse
Inbound = Command | ControlFrame


def _tag(cls: type[msgspec.Struct]) -> str:
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


COMMANDS: dict[str, type[msgspec.Struct]] = {
    _tag(cls): cls for cls in Command.__args__
}
CONTROL_FRAMES: dict[str, type[msgspec.Struct]] = {
    _tag(cls): cls for cls in ControlFrame.__args__
}
