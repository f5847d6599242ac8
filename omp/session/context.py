"""What a session file holds for the agent: the live context and settings of the current branch
(agent-core §7.6), and the listings read from the whole file (rpc-behavior §11.4, §11.13).

:func:`build_context` turns the branch path (root → leaf) into the messages the agent continues
from, as the original's ``buildSessionContext`` does; :func:`branch_settings` reads the model,
thinking level and service tier the branch recorded. Raw (unknown) entries are skipped.
:func:`entry_tree` is the whole file as a tree of entries (``get_tree``).

Everything here only reads a :class:`~omp.session.file.SessionFile` already in memory: no I/O,
no writes, no async.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import msgspec
from msgspec import UNSET

from omp.protocol.messages import (
    AgentMessage,
    AssistantMessage,
    BranchSummaryMessage,
    CompactionSummaryMessage,
    CustomMessage,
    RedactedThinkingContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)

from .entries import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomMessageEntry,
    Entry,
    MessageEntry,
    ModelChangeEntry,
    ServiceTierChangeEntry,
    ThinkingLevelChangeEntry,
    entry_type,
    iso_to_ms,
    message_text,
)
from .file import SessionFile

__all__ = [
    "BranchSettings",
    "branch_settings",
    "build_context",
    "entries_since",
    "entry_tree",
    "user_messages",
]


# --- the live context (agent-core §7.6) ------------------------------------------------------


def _entry_message(file: SessionFile, entry: Entry) -> AgentMessage | None:
    if isinstance(entry, MessageEntry):
        message = entry.message
        if isinstance(message, AssistantMessage):
            if file.message_flag(entry, "retryRecovery"):
                return None
            if message.stopReason == "error" and not message.content:
                return None
        return message
    if isinstance(entry, CustomMessageEntry):
        return CustomMessage(
            customType=entry.customType, content=entry.content, display=entry.display,
            details=entry.details, timestamp=iso_to_ms(entry.timestamp),
            attribution=entry.attribution if entry.attribution in ("user", "agent")
            else UNSET,  # type: ignore[arg-type]
        )
    if isinstance(entry, BranchSummaryEntry) and entry.summary:
        return BranchSummaryMessage(summary=entry.summary, fromId=entry.fromId,
                                    timestamp=iso_to_ms(entry.timestamp))
    return None


def build_context(file: SessionFile) -> list[AgentMessage]:
    """The live context of the current branch (root → leaf), as ``buildSessionContext`` builds it.

    Message entries in order; ``custom_message`` → ``custom``; non-empty ``branch_summary`` →
    ``branchSummary``; with a compaction on the path only the latest counts: its
    ``compactionSummary`` first, then the path from its ``firstKeptEntryId`` up to it, then
    everything after it. A ``reset_boundary`` after the latest compaction keeps only what follows
    it. Then: tool calls with no result on the path are stripped (a turn left empty is dropped),
    and ``error``/``aborted`` assistant turns are dropped with their tool results. Raw (unknown)
    entries are skipped.
    """
    path = file.branch_path()
    compaction_index = -1
    reset_index = -1
    for index, entry in enumerate(path):
        if isinstance(entry, CompactionEntry):
            compaction_index = index
        elif entry_type(entry) == "reset_boundary":
            reset_index = index

    messages: list[AgentMessage] = []

    def emit(entries: Sequence[Entry]) -> None:
        for entry in entries:
            message = _entry_message(file, entry)
            if message is not None:
                messages.append(message)

    if reset_index >= 0 and reset_index > compaction_index:
        emit(path[reset_index + 1:])
    elif compaction_index >= 0:
        compaction = path[compaction_index]
        assert isinstance(compaction, CompactionEntry)
        messages.append(CompactionSummaryMessage(
            summary=compaction.summary, tokensBefore=compaction.tokensBefore,
            timestamp=iso_to_ms(compaction.timestamp), shortSummary=compaction.shortSummary,
            tokensAfter=compaction.tokensAfter, method=compaction.method,
        ))
        kept = [e.id for e in path[:compaction_index]]
        if compaction.firstKeptEntryId in kept:
            emit(path[kept.index(compaction.firstKeptEntryId):compaction_index])
        emit(path[compaction_index + 1:])
    else:
        emit(path)

    _strip_dangling_tool_calls(messages)
    _drop_failed_turns(messages)
    return messages


def _strip_dangling_tool_calls(messages: list[AgentMessage]) -> None:
    paired = {m.toolCallId for m in messages if isinstance(m, ToolResultMessage)}
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, AssistantMessage):
            continue
        if not any(isinstance(b, ToolCall) and b.id not in paired for b in message.content):
            continue
        content = [
            msgspec.structs.replace(block, thinkingSignature=UNSET)
            if isinstance(block, ThinkingContent) and block.thinkingSignature else block
            for block in message.content
            if not (isinstance(block, ToolCall) and block.id not in paired)
            and not isinstance(block, RedactedThinkingContent)
        ]
        if content:
            messages[index] = msgspec.structs.replace(message, content=content)
        else:
            del messages[index]


def _drop_failed_turns(messages: list[AgentMessage]) -> None:
    # Deletions only happen at or after ``index``, so walking backwards stays valid.
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not (isinstance(message, AssistantMessage)
                and message.stopReason in ("error", "aborted")):
            continue
        call_ids = {b.id for b in message.content if isinstance(b, ToolCall)}
        del messages[index]
        if call_ids:
            messages[index:] = [m for m in messages[index:]
                                if not (isinstance(m, ToolResultMessage)
                                        and m.toolCallId in call_ids)]


# --- branch settings -------------------------------------------------------------------------


@attrs.frozen
class BranchSettings:
    """What the current branch records besides messages (restored on switch/branch)."""

    thinking_level: str | None
    """Latest ``thinking_level_change`` level; ``None`` when there is none (or it was null)."""
    configured_thinking_level: str | None
    models: dict[str, str]
    """Role → ``provider/modelId``; ``default`` falls back to the last assistant's model."""
    service_tier: Any
    has_thinking_entry: bool


def branch_settings(file: SessionFile) -> BranchSettings:
    """The settings recorded on the current branch path (later entries win)."""
    level: str | None = None
    configured: str | None = None
    has_level = False
    models: dict[str, str] = {}
    explicit_default = False
    tier: Any = None
    for entry in file.branch_path():
        if isinstance(entry, ThinkingLevelChangeEntry):
            has_level = True
            level = entry.thinkingLevel
            configured = entry.configured if isinstance(entry.configured, str) else level
        elif isinstance(entry, ModelChangeEntry):
            ref = entry.model_ref
            if ref is not None:
                role = entry.role if isinstance(entry.role, str) else "default"
                models[role] = ref
                explicit_default = explicit_default or role == "default"
        elif isinstance(entry, ServiceTierChangeEntry):
            tier = entry.serviceTier
        elif (isinstance(entry, MessageEntry) and isinstance(entry.message, AssistantMessage)
              and not explicit_default):
            models["default"] = f"{entry.message.provider}/{entry.message.model}"
    return BranchSettings(thinking_level=level, configured_thinking_level=configured,
                          models=models, service_tier=tier, has_thinking_entry=has_level)


# --- listings of the whole file (rpc-behavior §11.4, §11.13) ---------------------------------


def user_messages(file: SessionFile) -> list[tuple[str, str]]:
    """``(entryId, text)`` of every user message in the whole file, append order, empty skipped."""
    result: list[tuple[str, str]] = []
    for entry in file.entries:
        if isinstance(entry, MessageEntry) and isinstance(entry.message, UserMessage):
            text = message_text(entry.message)
            if text:
                result.append((entry.id, text))
    return result


def entries_since(file: SessionFile, since: str | None = None) -> list[Entry]:
    """All entries in append order, or those strictly after ``since`` (``KeyError`` if unknown)."""
    entries = file.entries
    if since is None:
        return entries
    for index, entry in enumerate(entries):
        if entry.id == since:
            return entries[index + 1:]
    raise KeyError(since)


def entry_tree(file: SessionFile) -> list[dict[str, Any]]:
    """The entry tree as JSON-ready nodes ``{"entry", "children", "label"?}``.

    ``entry`` is :meth:`SessionFile.entry_json`; entries whose parent is missing are extra roots;
    children are sorted by timestamp (stable). Built without recursion; a long session nests
    deeper than recursive JSON encoders go, so serialise it without recursion too
    (``omp.rpc.paging.encode_tree``). The entry objects are the loaded ones: do not mutate them.
    """
    labels = file.labels()
    nodes: dict[str, dict[str, Any]] = {}
    for entry in file.entries:
        node: dict[str, Any] = {"entry": file.entry_json(entry), "children": []}
        if entry.id in labels:
            node["label"] = labels[entry.id]
        nodes[entry.id] = node
    roots: list[dict[str, Any]] = []
    for entry in file.entries:
        parent = nodes.get(entry.parentId) if entry.parentId not in (None, entry.id) else None
        (parent["children"] if parent is not None else roots).append(nodes[entry.id])
    timestamps = {id(node): iso_to_ms(str(node["entry"].get("timestamp", ""))) for node in
                  nodes.values()}
    for node in nodes.values():
        node["children"].sort(key=lambda child: timestamps[id(child)])
    return roots
