"""``get_session_stats``: counts and usage totals over the live context
(docs/design/sessions.md#session-statistics).

Everything is computed from the **live** context (``Agent.state.messages``), so after a
compaction the turns it summarised no longer count, exactly as the original reports it:

* ``userMessages`` / ``assistantMessages`` / ``toolResults`` count messages of that role,
  ``totalMessages`` counts every message (custom kinds, summaries and bash executions included);
* ``toolCalls`` counts the ``toolCall`` blocks of the assistant messages;
* ``tokens`` sums ``usage.input/output/cacheRead/cacheWrite/totalTokens`` and
  ``usage.reasoningTokens`` (0 when a provider did not report it) of the assistant messages;
* ``cost`` sums ``usage.cost.total`` (USD), ``premiumRequests`` sums ``usage.premiumRequests``;
* ``routedModels`` (``{upstreamModel: turns}``) appears only when some assistant message recorded
  the model a router sent it to;
* ``contextUsage`` is ``{tokens, contextWindow, percent}`` from the caller's estimate.

Usage that does not sit on an assistant message of the context (side calls recorded as omp
``model_usage`` entries, sub-agent usage reported by ``task`` results) is passed in as
``extra_usage`` and added to the token, cost and premium-request totals (not to the counts).
``credits`` is never reported: this port's ``Usage`` has no credits field.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from msgspec import UNSET

from omp.protocol.messages import (
    AgentMessage,
    AssistantMessage,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from omp.protocol.payloads import ContextUsage, SessionStats, SessionTokens

__all__ = ["context_usage_payload", "session_stats"]

PERCENT_DIGITS = 6
"""Decimal places kept in ``contextUsage.percent``: enough for the exact values the original
reports (``100 / 128000 * 100 = 0.078125``), without float noise like ``33.33333333333333``."""


def _number(value: float) -> float:
    """An integral float as an ``int``, so it is written ``0`` like the original, not ``0.0``."""
    return int(value) if value.is_integer() else value


def context_usage_payload(tokens: int, context_window: int) -> ContextUsage:
    """``{tokens, contextWindow, percent}``; ``percent`` is on a 0-100 scale, 0 when the window is
    unknown (``<= 0``). It is not capped: a context over the window reports more than 100."""
    percent = 0.0
    if context_window > 0:
        percent = round(tokens / context_window * 100, PERCENT_DIGITS)
    return ContextUsage(tokens=tokens, contextWindow=context_window, percent=_number(percent))


def session_stats(messages: Sequence[AgentMessage], *, session_file: str | None,
                  session_id: str, context_usage: tuple[int, int] | None,
                  extra_usage: Iterable[Usage] = ()) -> SessionStats:
    """The ``get_session_stats`` payload for the live context ``messages``.

    ``session_file`` is ``None`` for an in-memory session (``--no-session``): the key is then
    omitted. ``context_usage`` is ``(tokens, context window)`` or ``None`` when unknown (then the
    key is omitted). ``extra_usage``: usage reported outside the context's assistant messages.
    """
    users = assistants = tool_results = tool_calls = 0
    routed: dict[str, int] = {}
    usages: list[Usage] = []
    for message in messages:
        if isinstance(message, UserMessage):
            users += 1
        elif isinstance(message, ToolResultMessage):
            tool_results += 1
        elif isinstance(message, AssistantMessage):
            assistants += 1
            tool_calls += sum(1 for block in message.content if isinstance(block, ToolCall))
            usages.append(message.usage)
            if message.upstreamModel:
                routed[message.upstreamModel] = routed.get(message.upstreamModel, 0) + 1
    usages.extend(extra_usage)

    input_tokens = output = reasoning = cache_read = cache_write = total = 0
    cost = premium = 0.0
    for usage in usages:
        input_tokens += usage.input
        output += usage.output
        cache_read += usage.cacheRead
        cache_write += usage.cacheWrite
        total += usage.totalTokens
        if usage.reasoningTokens is not UNSET:
            reasoning += usage.reasoningTokens
        if usage.premiumRequests is not UNSET:
            premium += usage.premiumRequests
        cost += usage.cost.total

    return SessionStats(
        sessionFile=UNSET if session_file is None else session_file,
        sessionId=session_id,
        userMessages=users,
        assistantMessages=assistants,
        toolCalls=tool_calls,
        toolResults=tool_results,
        totalMessages=len(messages),
        tokens=SessionTokens(input=input_tokens, output=output, reasoning=reasoning,
                             cacheRead=cache_read, cacheWrite=cache_write, total=total),
        cost=_number(cost),
        premiumRequests=_number(premium),
        routedModels=routed if routed else UNSET,
        contextUsage=UNSET if context_usage is None else context_usage_payload(*context_usage),
    )


def tokens_per_second(messages: Sequence[AgentMessage]) -> float | None:
    """``get_state.tokensPerSecond``: the output tokens of the last model response over the
    time it streamed them (from its first token when known, else from the request); None when
    unknown (no response yet, no timing, no output)."""
    last = next((x for x in reversed(messages) if isinstance(x, AssistantMessage)), None)
    if last is None or last.usage.output <= 0 or not isinstance(last.duration, float | int):
        return None
    ttft = last.ttft if isinstance(last.ttft, float | int) else 0.0
    streaming = (last.duration - ttft if last.duration > ttft else last.duration) / 1000
    return round(last.usage.output / streaming, 1) if streaming > 0 else None
