"""What a session file holds for the agent: the live context and settings of the current branch
(docs/design/sessions.md#the-live-context), and the listings read from the whole file
(docs/design/sessions.md#listings, docs/design/sessions.md#entries-and-the-tree).

:func:`build_context` turns the branch path (root → leaf) into the messages the agent continues
from, as the original's ``buildSessionContext`` does; :func:`branch_settings` reads the model,
thinking level and service tier the branch recorded. Raw (unknown) entries are skipped.
:func:`entry_tree` is the whole file as a tree of entries (``get_tree``), its depth bounded by
the branch points rather than the session's length.

Everything here only reads a :class:`~omp.session.file.SessionFile` already in memory: no I/O,
no writes, no async.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec
from msgspec import UNSET

from omp.protocol.messages import (
    AgentMessage,
    AssistantMessage,
    BranchSummaryMessage,
    CompactionSummaryMessage,
    CustomMessage,
    RedactedThinkingContent,
    TextContent,
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
    "TREE_NESTED_LEVELS",
    "BranchSettings",
    "branch_settings",
    "build_context",
    "entries_since",
    "entry_tree",
    "user_messages",
]


# --- the live context (docs/design/sessions.md#the-live-context) -----------------------------


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


class BranchSettings(msgspec.Struct, frozen=True):
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


# --- listings of the whole file --------------------------------------------------------------
# docs/design/sessions.md#listings, docs/design/sessions.md#entries-and-the-tree


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


TREE_NESTED_LEVELS: Final = 16
"""How many levels of ``get_tree`` nest one entry per level, as the original's tree does; below
that, single-child chains are flattened (see :func:`entry_tree`)."""


def entry_tree(file: SessionFile) -> list[dict[str, Any]]:
    """The entry tree as JSON-ready nodes ``{"entry", "children", "label"?}`` (``get_tree``).

    ``entry`` is :meth:`SessionFile.entry_json`; entries whose parent is missing are extra roots
    (as are entries caught in a ``parentId`` cycle, cut at the first in file order); children
    are sorted by timestamp (stable). ``label`` is the entry's current label.

    **Depth is bounded by branch points, not by the session's length.** The original nests
    every entry one level below its parent, so a long session is thousands of JSON levels
    deep, past what ``json``, msgspec and most hosts' decoders accept. Here the first
    ``TREE_NESTED_LEVELS`` levels nest exactly like the original (a short session's tree is
    the original's); a node below that whose entry has exactly one child holds, in its
    ``children``, the chain that follows instead: that child, its only child, and so on, as
    siblings, up to the first entry with no child or several, whose ``children`` are then its
    branches (each heading a chain of its own the same way). A ``children`` list is therefore
    either the entry's children or such a chain; ``entry.parentId`` always names the real
    parent. JSON depth: about ``2 * TREE_NESTED_LEVELS`` plus 4 per branch point below that.

    Built and (``omp.rpc.paging.encode_tree``) encoded without recursion. The entry objects
    are the loaded ones: do not mutate them.
    """
    entries = file.entries
    labels = file.labels()
    children: dict[str, list[str]] = {entry.id: [] for entry in entries}
    roots: list[str] = []
    for entry in entries:
        parent = entry.parentId
        (children[parent] if parent is not None and parent != entry.id and parent in children
         else roots).append(entry.id)
    order = {entry.id: iso_to_ms(entry.timestamp) for entry in entries}
    for kids in children.values():
        kids.sort(key=order.__getitem__)
    by_id = {entry.id: entry for entry in entries}
    placed: set[str] = set()

    def node(entry_id: str, into: list[dict[str, Any]]) -> dict[str, Any]:
        placed.add(entry_id)
        made: dict[str, Any] = {"entry": file.entry_json(by_id[entry_id]), "children": []}
        if entry_id in labels:
            made["label"] = labels[entry_id]
        into.append(made)
        return made

    tree: list[dict[str, Any]] = []
    # Depth first with an explicit stack: (entry id, the list it goes in, its level).
    stack: list[tuple[str, list[dict[str, Any]], int]] = []
    for start in [*roots, *(e.id for e in entries)]:  # then whatever a cycle kept unreachable
        if start in placed:
            continue
        stack.append((start, tree, 1))
        while stack:
            entry_id, into, level = stack.pop()
            if entry_id in placed:
                continue
            made = node(entry_id, into)
            kids = [k for k in children[entry_id] if k not in placed]
            if level >= TREE_NESTED_LEVELS and len(kids) == 1:
                # Below the nested levels a chain goes flat into this node's children.
                chain = made["children"]
                while len(kids) == 1:
                    made = node(kids[0], chain)
                    kids = [k for k in children[kids[0]] if k not in placed]
                level += 1
            stack.extend((kid, made["children"], level + 1) for kid in reversed(kids))
    return tree


def last_assistant_text(messages: Sequence[AgentMessage]) -> str | None:
    """The text of the last assistant message, skipping aborted ones with no content
    (``get_last_assistant_text``, ``omp -p``'s answer)."""
    for message in reversed(messages):
        if isinstance(message, AssistantMessage):
            if message.stopReason == "aborted" and not message.content:
                continue
            text = "".join(b.text for b in message.content
                           if isinstance(b, TextContent)).strip()
            return text or None
    return None
