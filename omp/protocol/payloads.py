"""The ``data`` of successful command responses (docs/design/protocol.md#commands-and-responses).

One Struct per payload shape; ``frames.Response.data`` carries them. Payloads the original answers
with a bare ``null`` (``cycle_model``, ``cycle_thinking_level``, ``handoff``) are ``data=None`` on
the response, not a Struct here.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from .commands import InterruptMode, QueueMode, SubagentLevel, ThinkingLevel, TodoPhase
from .messages import AgentMessage, ImageContent

__all__ = [
    "AgentProgress",
    "AgentSource",
    "AvailableCommand",
    "AvailableCommandsPayload",
    "BashResult",
    "BranchMessage",
    "BranchMessages",
    "BranchResult",
    "CommandInput",
    "CommandSource",
    "CompactionDetails",
    "CompactionResult",
    "ContextUsage",
    "Credits",
    "CycleModelResult",
    "DumpTool",
    "EventFilterPayload",
    "ExportHtmlResult",
    "FastModePayload",
    "HandoffResult",
    "HostToolNames",
    "HostUriSchemes",
    "LastAssistantText",
    "LoginProvider",
    "LoginProviders",
    "LoginResult",
    "MessagesPage",
    "MessagesPayload",
    "Model",
    "ModelCost",
    "ModelThinking",
    "ModelsPayload",
    "OpenSessionResult",
    "PromptAck",
    "ProtocolVersionPayload",
    "RecentTool",
    "SessionChangeResult",
    "SessionState",
    "SessionStats",
    "SessionTokens",
    "SubagentMessagesResult",
    "SubagentSnapshot",
    "SubagentSubscriptionPayload",
    "SubagentsPayload",
    "Subcommand",
    "ThinkingLevelPayload",
    "ThinkingLevelsPayload",
    "TodoPhasesPayload",
]


# --- models (docs/design/agent-loop.md#model) ------------------------------------------------


class ModelCost(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """USD per million tokens; every key is always written."""

    input: float
    output: float
    cacheRead: float
    cacheWrite: float


class ModelThinking(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    mode: Literal["effort", "budget", "google-level", "anthropic-adaptive",
                  "anthropic-budget-effort"]
    efforts: list[str]
    defaultLevel: str | UnsetType = UNSET
    effortMap: dict[str, str] | UnsetType = UNSET


class Model(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A catalog model (``get_state.model``, ``set_model``, ``get_available_models``)."""

    id: str
    name: str
    api: str
    provider: str
    baseUrl: str
    reasoning: bool
    input: list[Literal["text", "image"]]
    cost: ModelCost
    # ``null`` = unknown; the original writes the key either way.
    contextWindow: int | None
    maxTokens: int | None
    headers: dict[str, str] | UnsetType = UNSET
    # Per-API quirk flags: an open set the provider adapters read, forwarded as-is.
    compat: dict[str, Any] | UnsetType = UNSET
    identity: dict[str, Any] | UnsetType = UNSET
    thinking: ModelThinking | UnsetType = UNSET


class ModelsPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    models: list[Model]


class AvailableModel(Model, frozen=True, kw_only=True, omit_defaults=True):
    """A model of ``get_available_models``: the model, and where its provider's credential
    comes from (never the credential): ``cli`` (``--api-key``), ``login`` (OAuth),
    ``stored`` (``auth.json``), ``env``, ``config`` (models.yml ``apiKey``), ``notNeeded``
    (a local server, ``auth: none``)."""

    credential: str


class AvailableModels(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    models: list[AvailableModel]


class CycleModelResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    model: Model
    thinkingLevel: ThinkingLevel | UnsetType = UNSET
    """``off`` for a model without reasoning, as in ``get_state``."""
    isScoped: bool


class ThinkingLevelPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``cycle_thinking_level``: the new level."""

    level: ThinkingLevel


class ThinkingLevelsPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    levels: list[ThinkingLevel]


# --- get_state (docs/design/protocol.md#get_state) -------------------------------------------


class ContextUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    tokens: int
    contextWindow: int
    percent: float
    """0-100; 0 when the window is unknown."""


class DumpTool(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A tool as sent to the model; ``parameters`` is its JSON Schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    examples: list[Any] | UnsetType = UNSET


class SessionState(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``get_state``.

    Only the counters and flags every session has are required; the rest default to UNSET (left
    out) so each can be filled in as the feature behind it lands (the original writes all of
    them). Keys the original omits in some
    states (``model`` with no model, ``sessionFile`` with ``--no-session``, ``sessionName`` when
    unnamed, ``contextUsage`` when unknown) stay UNSET in those states. ``thinkingLevel`` is
    always there: ``off`` for a model without reasoning (the one level it offers; the original
    leaves it out when ``--model`` names such a model, which ACP adapters refuse).
    """

    isStreaming: bool
    isCompacting: bool
    messageCount: int
    queuedMessageCount: int
    pendingMessageCount: int | UnsetType = UNSET
    """pi's name for ``queuedMessageCount`` (the same number)."""
    model: Model | UnsetType = UNSET
    thinkingLevel: ThinkingLevel | UnsetType = UNSET
    steeringMode: QueueMode | UnsetType = UNSET
    followUpMode: QueueMode | UnsetType = UNSET
    interruptMode: InterruptMode | UnsetType = UNSET
    sessionFile: str | UnsetType = UNSET
    sessionId: str | UnsetType = UNSET
    sessionName: str | UnsetType = UNSET
    autoCompactionEnabled: bool | UnsetType = UNSET
    hasPendingAsyncWork: bool | UnsetType = UNSET
    isSettled: bool | UnsetType = UNSET
    todoPhases: list[TodoPhase] | UnsetType = UNSET
    fastModeEnabled: bool | UnsetType = UNSET
    fastModeActive: bool | UnsetType = UNSET
    # The original writes ``null`` when the throughput of the last response is unknown.
    tokensPerSecond: float | UnsetType | None = UNSET
    systemPrompt: list[str] | UnsetType = UNSET
    dumpTools: list[DumpTool] | UnsetType = UNSET
    contextUsage: ContextUsage | UnsetType = UNSET


# --- session statistics (docs/design/sessions.md#session-statistics) -------------------------


class SessionTokens(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    input: int
    output: int
    reasoning: int
    cacheRead: int
    cacheWrite: int
    total: int


class Credits(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    cost: float
    committedCost: float
    acuCost: float


class SessionStats(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    sessionId: str
    userMessages: int
    assistantMessages: int
    toolCalls: int
    toolResults: int
    totalMessages: int
    tokens: SessionTokens
    cost: float
    """USD."""
    sessionFile: str | UnsetType = UNSET
    premiumRequests: float | UnsetType = UNSET
    credits: Credits | UnsetType = UNSET
    routedModels: dict[str, int] | UnsetType = UNSET
    contextUsage: ContextUsage | UnsetType = UNSET


# --- compaction (docs/design/sessions.md#the-compaction-entry) -------------------------------


class CompactionDetails(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    readFiles: list[str]
    modifiedFiles: list[str]


class CompactionResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    summary: str
    firstKeptEntryId: str
    tokensBefore: int
    details: CompactionDetails | UnsetType = UNSET
    shortSummary: str | UnsetType = UNSET
    preserveData: Any = UNSET


class HandoffResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``handoff``: ``{}`` for the RPC command unless a document was saved to disk."""

    savedPath: str | UnsetType = UNSET


# --- bash (docs/design/protocol.md#bashresult) -----------------------------------------------


class BashResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    output: str
    """Possibly middle-elided; prefixed with a notice line when cancelled or timed out."""
    cancelled: bool
    truncated: bool
    totalLines: int
    """Of everything the command wrote: newlines + 1, or 0 when it wrote nothing."""
    totalBytes: int
    outputLines: int
    """Of ``output`` without its notice line, counted as ``totalLines``: equal to it unless the
    output was elided."""
    outputBytes: int
    """Of ``output`` without its notice line (UTF-8)."""
    # Omitted when cancelled or timed out (never ``null``).
    exitCode: int | UnsetType = UNSET
    # Only on normal completion.
    workingDir: str | UnsetType = UNSET
    timedOut: bool = False
    # Ours (issue: the bash sub-protocol): the 0600 temp file holding the whole output when
    # ``output`` had to be cut; the host may read it, then should delete it.
    fullOutputPath: str | UnsetType = UNSET
    elidedBytes: int | UnsetType = UNSET
    elidedLines: int | UnsetType = UNSET
    columnDroppedBytes: int | UnsetType = UNSET
    columnTruncatedLines: int | UnsetType = UNSET
    columnMax: int | UnsetType = UNSET
    artifactId: str | UnsetType = UNSET
    artifactError: str | UnsetType = UNSET
    images: list[ImageContent] | UnsetType = UNSET


# --- session commands (docs/design/sessions.md#session-commands) -----------------------------


Disposition = Literal["started", "queued", "handled"]
"""pi's word for what became of a prompt (docs/protocol/index.md#how-a-prompt-ends): a run
started for it, it waits in the queue of the run going on, or it was handled without a run of
its own (a built-in slash command, an extension command)."""


class PromptAck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``prompt`` data (docs/design/protocol.md#prompt_result): ``disposition`` always,
    ``agentInvoked`` when it is known at once whether the agent was invoked (not for an
    extension command, which may start a run later)."""

    agentInvoked: bool | UnsetType = UNSET
    disposition: Disposition


class QueueAck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``steer`` / ``follow_up`` data: ``queued`` during a run, ``started`` when it started
    one."""

    disposition: Disposition


class SessionChangeResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``new_session`` / ``switch_session``."""

    cancelled: bool


class OpenSessionResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    cancelled: bool
    resumed: bool
    sessionId: str
    sessionFile: str | UnsetType = UNSET


class BranchResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    text: str
    """The selected user message, for the host's editor."""
    cancelled: bool


class BranchMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    entryId: str
    text: str


class BranchMessages(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    messages: list[BranchMessage]


class LastAssistantText(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    # No text is ``{}``, not ``{"text": null}`` (observed).
    text: str | UnsetType = UNSET


class MessagesPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    messages: list[AgentMessage]


class MessagesPage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    messages: list[AgentMessage]
    totalMessages: int
    nextCursor: str | UnsetType = UNSET
    """Omitted on the last page."""


class ExportHtmlResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    path: str


# --- login (docs/design/protocol.md#login) ---------------------------------------------------


class LoginProvider(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    name: str
    available: bool
    authenticated: bool


class LoginProviders(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    providers: list[LoginProvider]


class LoginResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    providerId: str


# --- state setters ---------------------------------------------------------------------------


class HostToolNames(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    toolNames: list[str]


class HostUriSchemes(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    schemes: list[str]


class TodoPhasesPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    todoPhases: list[TodoPhase]


class ProtocolVersionPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    protocolVersion: int


class EventFilterPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    # No default, so ``None`` ("all events") is written as ``null`` as the protocol requires.
    events: list[str] | None
    messageUpdates: Literal["snapshot", "delta"] = "snapshot"


class FastModePayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    enabled: bool
    active: bool


# --- available commands (docs/design/protocol.md#the-command-list) ---------------------------

CommandSource = Literal["builtin", "skill", "extension", "custom", "mcp_prompt", "file"]


class CommandInput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    hint: str | UnsetType = UNSET


class Subcommand(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    description: str | UnsetType = UNSET
    usage: str | UnsetType = UNSET


class AvailableCommand(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A slash command (``get_available_commands``, ``available_commands_update``)."""

    name: str
    source: CommandSource
    aliases: list[str] | UnsetType = UNSET
    description: str | UnsetType = UNSET
    input: CommandInput | UnsetType = UNSET
    subcommands: list[Subcommand] | UnsetType = UNSET


class AvailableCommandsPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    commands: list[AvailableCommand]


# --- subagents (docs/design/subagents.md#subagent-frames) ------------------------------------

AgentSource = Literal["bundled", "user", "project"]


class RecentTool(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    tool: str
    args: Any
    endMs: float


class AgentProgress(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A subagent's progress, as its ``task`` tool reports it (the subset a port fills in)."""

    index: int
    id: str
    agent: str
    agentSource: AgentSource
    status: Literal["pending", "running", "completed", "failed", "aborted"]
    task: str
    recentTools: list[RecentTool]
    recentOutput: list[str]
    toolCount: int
    requests: int
    tokens: int
    cost: float
    durationMs: float
    assignment: str | UnsetType = UNSET
    description: str | UnsetType = UNSET
    lastIntent: str | UnsetType = UNSET
    currentTool: str | UnsetType = UNSET
    currentToolArgs: Any = UNSET
    currentToolStartMs: float | UnsetType = UNSET
    contextTokens: int | UnsetType = UNSET
    contextWindow: int | UnsetType = UNSET
    modelOverride: str | UnsetType = UNSET
    resolvedModel: str | UnsetType = UNSET
    resolvedThinkingLevel: str | UnsetType = UNSET


class SubagentSnapshot(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    id: str
    index: int
    agent: str
    agentSource: AgentSource
    # A lifecycle status until the first progress report, then the progress status.
    status: Literal["started", "pending", "running", "completed", "failed", "aborted"]
    lastUpdate: int
    """Unix milliseconds."""
    description: str | UnsetType = UNSET
    task: str | UnsetType = UNSET
    assignment: str | UnsetType = UNSET
    sessionFile: str | UnsetType = UNSET
    progress: AgentProgress | UnsetType = UNSET
    parentToolCallId: str | UnsetType = UNSET


class SubagentsPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    subagents: list[SubagentSnapshot]


class SubagentSubscriptionPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    level: SubagentLevel


class SubagentMessagesResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    sessionFile: str
    fromByte: int
    nextByte: int
    reset: bool
    # Session-file entries, raw: their types belong to the session layer, which this package
    # may not import.
    entries: list[dict[str, Any]]
    messages: list[AgentMessage]


# --- pi's commands (``@earendil-works/pi-coding-agent``) ------------------------------------


PiCommandSource = Literal["extension", "prompt", "skill"]


class PiCommand(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A command in pi's ``get_commands`` form: one a host may run through ``prompt``."""

    name: str
    source: PiCommandSource
    description: str | UnsetType = UNSET


class PiCommandsPayload(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    commands: list[PiCommand]


class ClearedQueue(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``clear_queue``: the text of the messages taken out of the queue, oldest first."""

    steering: list[str]
    followUp: list[str]


class ForkResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """``fork`` (pi's ``branch``): the forked-from message's text, for the host's editor."""

    text: str
    cancelled: bool


class StoredSession(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One stored session of ``list_sessions``: read from the file's header and first
    message only."""

    path: str
    id: str
    cwd: str
    created: str
    """The header's timestamp (ISO 8601)."""
    modified: str
    """The file's modification time (ISO 8601, UTC)."""
    messageCount: int
    """Message entries in the file (counted from the line types, not decoded)."""
    firstMessage: str
    """The text of the first user message ("" when there is none)."""
    name: str | UnsetType = UNSET


class StoredSessions(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    sessions: list[StoredSession]
