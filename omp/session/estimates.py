"""How large the live context is and when it is compacted (docs/design/sessions.md#token-estimates,
docs/design/sessions.md#context-usage, docs/design/sessions.md#settings-and-threshold,
docs/design/sessions.md#what-is-kept): pure functions over the messages.

Apart from ``omp.session.compaction`` (the summary call and its prompts), which loads with the
first compaction or handoff (``omp.lazy``): ``get_state`` and the context usage need only these.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..protocol import messages as m
from ..tools.base import Tool
from .settings import CompactionSettings

IMAGE_TOKENS = 1200
"""Estimated tokens of one image (docs/design/agent-loop.md#images,
docs/design/sessions.md#token-estimates)."""
DEFAULT_RESERVE_TOKENS = 16384
RESERVE_FRACTION_PERCENT = 15
CUT_ROLES = (m.UserMessage, m.DeveloperMessage, m.AssistantMessage, m.BashExecutionMessage,
             m.CustomMessage, m.BranchSummaryMessage, m.CompactionSummaryMessage)
"""Messages a kept suffix may start with (docs/design/sessions.md#what-is-kept): anything but a tool
result."""


# --- token estimation --------------------------------------------------------------------------
# docs/design/sessions.md#token-estimates, docs/design/sessions.md#context-usage


def _tokens(utf8_bytes: int) -> int:
    return (utf8_bytes + 3) // 4


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def _content_size(content: str | Sequence[m.UserContent]) -> tuple[int, int]:
    """(utf-8 bytes of text, number of images)."""
    if isinstance(content, str):
        return _size(content), 0
    text = images = 0
    for block in content:
        if isinstance(block, m.TextContent):
            text += _size(block.text)
        else:
            images += 1
    return text, images


def estimate_tokens(message: m.AgentMessage) -> int:
    """Estimated tokens of one message: ``ceil(utf8 bytes / 4)`` of what the model reads of it,
    plus 1200 per image (docs/design/sessions.md#token-estimates)."""
    size = images = 0
    if isinstance(message, m.AssistantMessage):
        for block in message.content:
            if isinstance(block, m.TextContent):
                size += _size(block.text)
            elif isinstance(block, m.ThinkingContent):
                size += _size(block.thinking)
            elif isinstance(block, m.ToolCall):
                size += _size(block.name) + len(msgspec.json.encode(block.arguments))
            elif isinstance(block, m.ImageContent):
                images += 1
    elif isinstance(message, m.UserMessage | m.DeveloperMessage | m.CustomMessage
                    | m.ToolResultMessage):
        size, images = _content_size(message.content)
    elif isinstance(message, m.BashExecutionMessage):
        if message.excludeFromContext:
            return 0  # `!!` commands never reach the model
        size = _size(message.command) + _size(message.output)
        images = len(message.images) if isinstance(message.images, list) else 0
    elif isinstance(message, m.CompactionSummaryMessage | m.BranchSummaryMessage):
        size = _size(message.summary)
    return _tokens(size) + images * IMAGE_TOKENS


def estimate_context_tokens(messages: Sequence[m.AgentMessage], overhead: int = 0) -> int:
    """The context's size in tokens (docs/design/sessions.md#context-usage): anchor + tail
    (``anchored_context_tokens``); without an anchor, every message is estimated, plus
    ``overhead`` (the system prompt and the tool definitions, which a provider's count holds:
    docs/design/sessions.md#context-usage, the estimate of the request that would be sent now).
    """
    anchored = anchored_context_tokens(messages)
    if anchored is not None:
        return anchored
    return overhead + sum(estimate_tokens(msg) for msg in messages)


def anchored_context_tokens(messages: Sequence[m.AgentMessage]) -> int | None:
    """The provider's last count plus an estimate of what came after it; None before any.

    The anchor is the newest assistant message that ended normally and has usage, newer than
    the latest compaction (an older one measured a context that no longer exists): its
    ``contextTokens``, else ``totalTokens``, else the sum of its counts
    (docs/design/sessions.md#settings-and-threshold: the reply is part of the next prompt). Every
    message after it is estimated.
    """
    compacted_at = max((msg.timestamp for msg in messages
                        if isinstance(msg, m.CompactionSummaryMessage)), default=-1)
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if (isinstance(msg, m.AssistantMessage) and msg.stopReason not in ("error", "aborted")
                and msg.timestamp >= compacted_at and (anchor := _usage_tokens(msg.usage))):
            return anchor + sum(estimate_tokens(after) for after in messages[i + 1:])
    return None


def request_overhead_tokens(system_prompt: Sequence[str], tools: Sequence[Tool]) -> int:
    """Estimated tokens of what every request sends besides the messages: the system prompt
    and the tool definitions (name, description, parameter schema), ``ceil(utf8 bytes / 4)``."""
    size = sum(_size(block) for block in system_prompt)
    for tool in tools:
        size += _size(tool.name) + _size(tool.description) + len(
            msgspec.json.encode(tool.parameters))
    return _tokens(size)


def _usage_tokens(usage: m.Usage) -> int:
    if isinstance(usage.contextTokens, int) and usage.contextTokens > 0:
        return usage.contextTokens
    if usage.totalTokens > 0:
        return usage.totalTokens
    return usage.input + usage.output + usage.cacheRead + usage.cacheWrite


# --- when --------------------------------------------------------------------------------------
# docs/design/sessions.md#settings-and-threshold, docs/design/sessions.md#when-compaction-runs


def effective_reserve_tokens(context_window: int, settings: CompactionSettings) -> int:
    """Tokens kept free below the window: ``reserveTokens``, or when unset (omp's default)
    ``max(15% of the window, 16384)``; a reserve that would leave less than 15% of the window
    for the conversation falls back to 15% of the window (at least 1)."""
    fifteen = context_window * RESERVE_FRACTION_PERCENT // 100
    reserve = settings.reserveTokens
    if reserve is None:
        reserve = max(fifteen, DEFAULT_RESERVE_TOKENS)
    if reserve >= context_window or reserve * 100 >= context_window * (
            100 - RESERVE_FRACTION_PERCENT):
        reserve = max(1, fifteen)
    return reserve


def compaction_threshold(context_window: int, settings: CompactionSettings) -> int:
    """Context tokens above which auto-compaction runs, the threshold
    (docs/design/sessions.md#settings-and-threshold)."""
    if settings.thresholdTokens > 0:
        return min(max(settings.thresholdTokens, 1), context_window - 1)
    if settings.thresholdPercent > 0:
        percent = min(max(settings.thresholdPercent, 1.0), 99.0)
        return int(context_window * percent // 100)
    return min(context_window - effective_reserve_tokens(context_window, settings),
               context_window - 1)


def should_compact(context_tokens: int, context_window: int | None,
                   settings: CompactionSettings) -> bool:
    """Whether auto-compaction runs for a context of ``context_tokens`` (the case ``threshold``
    of docs/design/sessions.md#when-compaction-runs).

    Never when disabled or when the model's window is unknown.
    """
    if not settings.enabled or not context_window or context_window <= 1:
        return False
    return context_tokens > compaction_threshold(context_window, settings)


# --- what is kept (docs/design/sessions.md#what-is-kept) ---------------------------------------


def find_cut_point(messages: Sequence[m.AgentMessage], keep_recent_tokens: int) -> int | None:
    """Index of the first message kept verbatim, or None when there is nothing to compact.

    Walks back from the newest message summing estimates; the cut moves to every valid cut
    point passed while the sum is within ``keep_recent_tokens`` and the walk stops once it is
    over. The newest valid cut point is kept even if it alone is over. A valid cut point is
    any message but a tool result, and not between a tool call and one of its results.
    """
    inside_call: set[int] = set()
    call_at: dict[str, int] = {}
    for j, msg in enumerate(messages):
        if isinstance(msg, m.AssistantMessage):
            for block in msg.content:
                if isinstance(block, m.ToolCall):
                    call_at[block.id] = j
        elif (isinstance(msg, m.ToolResultMessage)
              and (a := call_at.get(msg.toolCallId)) is not None):
            inside_call.update(range(a + 1, j + 1))

    cut: int | None = None
    total = 0
    for i in range(len(messages) - 1, -1, -1):
        total += estimate_tokens(messages[i])
        valid = isinstance(messages[i], CUT_ROLES) and i not in inside_call
        if total > keep_recent_tokens and cut is not None:
            break
        if valid:
            cut = i
            if total > keep_recent_tokens:
                break
    return cut if cut else None  # 0: everything fits, nothing to summarise
