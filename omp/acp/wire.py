"""The Agent Client Protocol on the wire: JSON-RPC 2.0 envelopes and the ACP messages we speak.

Hand-written msgspec Structs, field for field from the protocol's published JSON Schema
(``schema.json`` of ``agent-client-protocol``, protocol version 1), limited to the methods and
updates this runtime sends or accepts. Why not the ``acp`` package's pydantic models: pydantic
is a heavy import and a second validation library beside msgspec (docs/internals.md#libraries), and
the package's connection layer is asyncio, not trio. The tests check what we send against those
models: the package's own client parses every message (``tests/test_acp.py``).

Inbound params decode with ``forbid_unknown_fields=False`` (the schema lets clients add
``_meta`` and future fields); a missing or mistyped field is a ``ValidationError`` whose
message names it (``Expected `str`, got `int` - at `$.cwd```), answered as ``-32602``.
No I/O here.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

PROTOCOL_VERSION = 1

# JSON-RPC error codes (JSON-RPC 2.0 §5.1; ACP adds -32000 auth required, -32002 not found).
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800


class _In(msgspec.Struct, frozen=True, kw_only=True, rename=None):
    """An inbound params object: unknown keys (``_meta``, newer fields) are ignored."""


class _Out(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """An outbound object: optional fields left out when unset."""


# -- envelopes -------------------------------------------------------------------------------


class Envelope(msgspec.Struct, frozen=True, kw_only=True):
    """Any inbound JSON-RPC message, its params kept raw until the method is known."""

    jsonrpc: str | UnsetType = UNSET
    id: int | str | UnsetType | None = UNSET
    method: str | UnsetType = UNSET
    params: msgspec.Raw | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: ErrorObject | UnsetType = UNSET


class ErrorObject(_Out, frozen=True, kw_only=True):
    code: int
    message: str
    data: Any = UNSET


class Result(msgspec.Struct, frozen=True, kw_only=True):
    id: int | str
    result: Any
    jsonrpc: str = "2.0"


class ErrorReply(msgspec.Struct, frozen=True, kw_only=True):
    id: int | str | None
    error: ErrorObject
    jsonrpc: str = "2.0"


class Notification(msgspec.Struct, frozen=True, kw_only=True):
    method: str
    params: Any
    jsonrpc: str = "2.0"


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """A request of ours to the client (``session/request_permission``, ``fs/*``)."""

    id: int
    method: str
    params: Any
    jsonrpc: str = "2.0"


Outbound = Result | ErrorReply | Notification | Request


# -- initialize / authenticate ---------------------------------------------------------------


class FsCapabilities(_In, frozen=True, kw_only=True):
    readTextFile: bool = False
    writeTextFile: bool = False


class ElicitationCapabilities(_In, frozen=True, kw_only=True):
    form: dict[str, Any] | None = None
    """Present (``{}``): the client shows form elicitations."""


class AuthCapabilities(_In, frozen=True, kw_only=True):
    terminal: bool = False
    """The editor can run the agent's command in a terminal to log in (``terminal`` auth)."""


class ClientCapabilities(_In, frozen=True, kw_only=True):
    fs: FsCapabilities = msgspec.field(default_factory=FsCapabilities)
    terminal: bool = False
    elicitation: ElicitationCapabilities | None = None
    auth: AuthCapabilities = msgspec.field(default_factory=AuthCapabilities)


class InitializeParams(_In, frozen=True, kw_only=True):
    protocolVersion: int
    clientCapabilities: ClientCapabilities = msgspec.field(default_factory=ClientCapabilities)


class AuthenticateParams(_In, frozen=True, kw_only=True):
    methodId: str


# -- sessions --------------------------------------------------------------------------------


class EnvVariable(_In, frozen=True, kw_only=True):
    name: str
    value: str


class McpServer(_In, frozen=True, kw_only=True):
    """A client-supplied MCP server (stdio when ``type`` is absent; ``http`` / ``sse``)."""

    name: str
    type: str | UnsetType = UNSET
    command: str | UnsetType = UNSET
    args: list[str] = msgspec.field(default_factory=list)
    env: list[EnvVariable] = msgspec.field(default_factory=list)
    url: str | UnsetType = UNSET
    headers: list[EnvVariable] = msgspec.field(default_factory=list)


class NewSessionParams(_In, frozen=True, kw_only=True):
    cwd: str
    mcpServers: list[McpServer] = msgspec.field(default_factory=list)


class LoadSessionParams(_In, frozen=True, kw_only=True):
    """``session/load``, ``session/resume``, ``session/fork``."""

    sessionId: str
    cwd: str
    mcpServers: list[McpServer] = msgspec.field(default_factory=list)


class SessionIdParams(_In, frozen=True, kw_only=True):
    """``session/cancel``, ``session/close``."""

    sessionId: str


class SetModeParams(_In, frozen=True, kw_only=True):
    sessionId: str
    modeId: str


class SetConfigOptionParams(_In, frozen=True, kw_only=True):
    sessionId: str
    configId: str
    value: str | bool


class ListSessionsParams(_In, frozen=True, kw_only=True):
    cwd: str | UnsetType = UNSET
    cursor: str | UnsetType = UNSET


# -- prompt content blocks (ContentBlock, tagged by ``type``) ----------------------------------


class TextBlock(_In, tag="text", tag_field="type", frozen=True, kw_only=True):
    text: str


class ImageBlock(_In, tag="image", tag_field="type", frozen=True, kw_only=True):
    data: str
    mimeType: str
    uri: str | UnsetType = UNSET


class AudioBlock(_In, tag="audio", tag_field="type", frozen=True, kw_only=True):
    data: str
    mimeType: str


class ResourceLinkBlock(_In, tag="resource_link", tag_field="type", frozen=True, kw_only=True):
    uri: str
    name: str
    title: str | UnsetType = UNSET


class EmbeddedResource(_In, frozen=True, kw_only=True):
    uri: str
    text: str | UnsetType = UNSET
    blob: str | UnsetType = UNSET
    mimeType: str | UnsetType = UNSET


class ResourceBlock(_In, tag="resource", tag_field="type", frozen=True, kw_only=True):
    resource: EmbeddedResource


ContentBlock = TextBlock | ImageBlock | AudioBlock | ResourceLinkBlock | ResourceBlock


class PromptParams(_In, frozen=True, kw_only=True):
    sessionId: str
    prompt: list[ContentBlock]


# -- what we send: results -------------------------------------------------------------------


class Implementation(_Out, frozen=True, kw_only=True):
    name: str
    title: str
    version: str


class AuthMethod(_Out, frozen=True, kw_only=True):
    id: str
    name: str
    description: str
    type: Literal["terminal"] | UnsetType = UNSET
    """Unset: an agent method (the agent authenticates by itself)."""
    args: list[str] | UnsetType = UNSET
    """``terminal``: what the editor adds to the agent's command to run the login."""


# Capabilities have no defaults: ``omit_defaults`` would leave out what we offer.


class McpCapabilities(_Out, frozen=True, kw_only=True):
    http: bool
    sse: bool


class PromptCapabilitiesOut(_Out, frozen=True, kw_only=True):
    embeddedContext: bool
    image: bool


class Empty(_Out, frozen=True, kw_only=True):
    pass


class SessionCapabilitiesOut(_Out, frozen=True, kw_only=True):
    close: Empty
    fork: Empty
    list: Empty
    resume: Empty


class AgentCapabilities(_Out, frozen=True, kw_only=True):
    loadSession: bool
    mcpCapabilities: McpCapabilities
    promptCapabilities: PromptCapabilitiesOut
    sessionCapabilities: SessionCapabilitiesOut


class InitializeResult(_Out, frozen=True, kw_only=True):
    protocolVersion: int
    agentInfo: Implementation
    authMethods: list[AuthMethod]
    agentCapabilities: AgentCapabilities


class SessionMode(_Out, frozen=True, kw_only=True):
    id: str
    name: str
    description: str


class SessionModeState(_Out, frozen=True, kw_only=True):
    availableModes: list[SessionMode]
    currentModeId: str


class SelectOption(_Out, frozen=True, kw_only=True):
    value: str
    name: str
    description: str | UnsetType = UNSET


class ConfigOption(_Out, frozen=True, kw_only=True):
    type: Literal["select"]
    id: str
    name: str
    category: str
    currentValue: str
    options: list[SelectOption]


class NewSessionResult(_Out, frozen=True, kw_only=True):
    sessionId: str
    modes: SessionModeState
    configOptions: list[ConfigOption]


class LoadSessionResult(_Out, frozen=True, kw_only=True):
    modes: SessionModeState
    configOptions: list[ConfigOption]


class SetConfigOptionResult(_Out, frozen=True, kw_only=True):
    configOptions: list[ConfigOption]


class SessionInfoMeta(_Out, frozen=True, kw_only=True):
    """``session/list``'s ``_meta`` of an entry (the original's): the session file's
    ``message`` entries and its size in bytes."""

    messageCount: int
    size: int


class SessionInfo(_Out, frozen=True, kw_only=True):
    sessionId: str
    cwd: str
    title: str | UnsetType = UNSET
    updatedAt: str | UnsetType = UNSET
    meta: SessionInfoMeta | UnsetType = msgspec.field(default=UNSET, name="_meta")


class ListSessionsResult(_Out, frozen=True, kw_only=True):
    sessions: list[SessionInfo]
    nextCursor: str | UnsetType = UNSET


class TokenUsage(_Out, frozen=True, kw_only=True):
    inputTokens: int
    outputTokens: int
    totalTokens: int
    cachedReadTokens: int | UnsetType = UNSET
    cachedWriteTokens: int | UnsetType = UNSET


StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


class PromptResult(_Out, frozen=True, kw_only=True):
    stopReason: StopReason
    usage: TokenUsage | UnsetType = UNSET


# -- what we send: session/update (SessionUpdate, tagged by ``sessionUpdate``) ------------------


class TextContent(_Out, tag="text", tag_field="type", frozen=True, kw_only=True):
    text: str


class ImageContent(_Out, tag="image", tag_field="type", frozen=True, kw_only=True):
    data: str
    mimeType: str


OutContent = TextContent | ImageContent


class _Update(_Out, frozen=True, kw_only=True, tag_field="sessionUpdate"):
    pass


class AgentMessageChunk(_Update, tag="agent_message_chunk", frozen=True, kw_only=True):
    content: OutContent
    messageId: str | UnsetType = UNSET


class AgentThoughtChunk(_Update, tag="agent_thought_chunk", frozen=True, kw_only=True):
    content: OutContent
    messageId: str | UnsetType = UNSET


class UserMessageChunk(_Update, tag="user_message_chunk", frozen=True, kw_only=True):
    content: OutContent
    messageId: str | UnsetType = UNSET


class ToolCallContent(_Out, tag="content", tag_field="type", frozen=True, kw_only=True):
    """ToolCallContent ``content``: a content block."""

    content: OutContent


class ToolCallDiff(_Out, tag="diff", tag_field="type", frozen=True, kw_only=True):
    """ToolCallContent ``diff``: a file edit."""

    path: str
    newText: str
    oldText: str | None = None


class ToolCallTerminal(_Out, tag="terminal", tag_field="type", frozen=True, kw_only=True):
    """ToolCallContent ``terminal``: an editor terminal of ours (``terminal/create``), shown
    live by the editor."""

    terminalId: str


ToolContentItem = ToolCallContent | ToolCallDiff | ToolCallTerminal


class Location(_Out, frozen=True, kw_only=True):
    path: str
    line: int | UnsetType = UNSET


ToolKind = Literal["read", "edit", "delete", "move", "search", "execute", "think", "fetch",
                   "other"]
ToolStatus = Literal["pending", "in_progress", "completed", "failed"]


class ToolCall(_Update, tag="tool_call", frozen=True, kw_only=True):
    toolCallId: str
    title: str
    kind: ToolKind
    status: ToolStatus
    rawInput: Any = UNSET
    content: list[ToolContentItem] | UnsetType = UNSET
    locations: list[Location] | UnsetType = UNSET


class ToolCallUpdate(_Update, tag="tool_call_update", frozen=True, kw_only=True):
    toolCallId: str
    status: ToolStatus | UnsetType = UNSET
    title: str | UnsetType = UNSET
    kind: ToolKind | UnsetType = UNSET
    rawInput: Any = UNSET
    rawOutput: Any = UNSET
    content: list[ToolContentItem] | UnsetType = UNSET
    locations: list[Location] | UnsetType = UNSET


class PlanEntry(_Out, frozen=True, kw_only=True):
    content: str
    priority: Literal["high", "medium", "low"]
    status: Literal["pending", "in_progress", "completed"]


class Plan(_Update, tag="plan", frozen=True, kw_only=True):
    entries: list[PlanEntry]


class CommandInput(_Out, frozen=True, kw_only=True):
    hint: str


class AvailableCommand(_Out, frozen=True, kw_only=True):
    name: str
    description: str
    input: CommandInput | UnsetType = UNSET


class AvailableCommandsUpdate(_Update, tag="available_commands_update", frozen=True,
                              kw_only=True):
    availableCommands: list[AvailableCommand]


class CurrentModeUpdate(_Update, tag="current_mode_update", frozen=True, kw_only=True):
    currentModeId: str


class ConfigOptionUpdate(_Update, tag="config_option_update", frozen=True, kw_only=True):
    configOptions: list[ConfigOption]


class Cost(_Out, frozen=True, kw_only=True):
    amount: float
    currency: str


class UsageUpdate(_Update, tag="usage_update", frozen=True, kw_only=True):
    size: int
    used: int
    cost: Cost | UnsetType = UNSET


class SessionInfoUpdate(_Update, tag="session_info_update", frozen=True, kw_only=True):
    updatedAt: str
    title: str | UnsetType = UNSET


SessionUpdate = (AgentMessageChunk | AgentThoughtChunk | UserMessageChunk | ToolCall
                 | ToolCallUpdate | Plan | AvailableCommandsUpdate | CurrentModeUpdate
                 | ConfigOptionUpdate | UsageUpdate | SessionInfoUpdate)


class SessionNotification(_Out, frozen=True, kw_only=True):
    sessionId: str
    update: SessionUpdate


# -- what we ask the client ------------------------------------------------------------------


class PermissionOption(_Out, frozen=True, kw_only=True):
    optionId: str
    name: str
    kind: Literal["allow_once", "allow_always", "reject_once", "reject_always"]


class RequestPermissionParams(_Out, frozen=True, kw_only=True):
    sessionId: str
    toolCall: ToolCallUpdate
    options: list[PermissionOption]


class ReadTextFileParams(_Out, frozen=True, kw_only=True):
    sessionId: str
    path: str


class ReadTextFileResponse(_In, frozen=True, kw_only=True):
    content: str


class WriteTextFileParams(_Out, frozen=True, kw_only=True):
    sessionId: str
    path: str
    content: str


class PermissionOutcome(_In, frozen=True, kw_only=True):
    outcome: Literal["selected", "cancelled"]
    optionId: str | UnsetType = UNSET


class RequestPermissionResponse(_In, frozen=True, kw_only=True):
    outcome: PermissionOutcome


class CreateTerminalParams(_Out, frozen=True, kw_only=True):
    sessionId: str
    command: str
    args: list[str]
    cwd: str
    outputByteLimit: int


class CreateTerminalResponse(_In, frozen=True, kw_only=True):
    terminalId: str


class TerminalParams(_Out, frozen=True, kw_only=True):
    """``terminal/output``, ``terminal/wait_for_exit``, ``terminal/kill``,
    ``terminal/release``."""

    sessionId: str
    terminalId: str


class TerminalExitStatus(_In, frozen=True, kw_only=True):
    """``terminal/wait_for_exit``'s result, ``terminal/output``'s ``exitStatus``."""

    exitCode: int | None = None
    signal: str | None = None


class TerminalOutputResponse(_In, frozen=True, kw_only=True):
    output: str
    truncated: bool
    exitStatus: TerminalExitStatus | None = None


class CreateElicitationParams(_Out, frozen=True, kw_only=True):
    """``elicitation/create`` in form mode, tied to a session."""

    mode: Literal["form"]
    """Required on the wire (so no default: defaults are left out)."""
    sessionId: str
    message: str
    requestedSchema: dict[str, Any]


class ElicitationResponse(_In, frozen=True, kw_only=True):
    action: str
    """``accept``, ``decline`` or ``cancel``."""
    content: dict[str, Any] | None = None
