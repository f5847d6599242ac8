"""``session_stats``: the ``get_session_stats`` payload
(docs/design/sessions.md#session-statistics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from omp.protocol.messages import (
    AgentMessage,
    AssistantContent,
    AssistantMessage,
    BashExecutionMessage,
    CompactionSummaryMessage,
    CustomMessage,
    DeveloperMessage,
    ImageContent,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UsageCost,
    UserMessage,
)
from omp.protocol.payloads import ContextUsage, SessionStats, SessionTokens
from omp.session.context import build_context
from omp.session.file import SessionFile
from omp.session.stats import context_usage_payload, session_stats

SID = "01a22928-0000-7000-8000-000000000000"


def usage(input_: int, output: int, *, cache_read: int = 0, cache_write: int = 0,
          total: int | None = None, cost: float = 0.0, reasoning: int | None = None,
          premium: float | None = None) -> Usage:
    return Usage(
        input=input_, output=output, cacheRead=cache_read, cacheWrite=cache_write,
        totalTokens=input_ + output + cache_read + cache_write if total is None else total,
        cost=UsageCost(input=0.0, output=0.0, cacheRead=0.0, cacheWrite=0.0, total=cost),
        reasoningTokens=msgspec.UNSET if reasoning is None else reasoning,
        premiumRequests=msgspec.UNSET if premium is None else premium,
    )


def assistant(content: list[AssistantContent], use: Usage, **extra: Any) -> AssistantMessage:
    stop: StopReason = "toolUse" if any(isinstance(b, ToolCall) for b in content) else "stop"
    return AssistantMessage(content=content, api="openai-completions", provider="fake",
                            model="fake-model", usage=use, stopReason=stop, timestamp=2, **extra)


def user(text: str) -> UserMessage:
    return UserMessage(content=[TextContent(text=text)], timestamp=1)


def result(call_id: str, text: str, *, error: bool = False) -> ToolResultMessage:
    return ToolResultMessage(toolCallId=call_id, toolName="bash", isError=error, timestamp=3,
                             content=[TextContent(text=text)])


def encode(stats: SessionStats) -> dict[str, Any]:
    decoded = msgspec.json.decode(msgspec.json.encode(stats))
    assert isinstance(decoded, dict)
    return decoded


def full_context() -> list[AgentMessage]:
    return [
        CompactionSummaryMessage(summary="earlier work", tokensBefore=5000, timestamp=0),
        user("list the files"),
        assistant(
            [ThinkingContent(thinking="let me look"), TextContent(text="Listing."),
             ToolCall(id="c1", name="bash", arguments={"command": "ls"}),
             ToolCall(id="c2", name="read", arguments={"path": "a.txt"})],
            usage(1000, 200, cache_read=300, cache_write=50, cost=0.0125, reasoning=120,
                  premium=1)),
        result("c1", "a.txt\nb.txt"),
        result("c2", "no such file", error=True),
        assistant([ToolCall(id="c3", name="bash", arguments={"command": "pwd"})],
                  usage(1500, 40, cache_read=1000, cost=0.0075, reasoning=30, premium=0.5),
                  upstreamModel="vendor/big-model"),
        result("c3", "/work"),
        assistant([TextContent(text="Done.")],
                  usage(1600, 10, total=1700, cost=0.005),  # provider total, not the sum
                  upstreamModel="vendor/big-model"),
        BashExecutionMessage(command="git status", output="clean", exitCode=0,
                             cancelled=False, truncated=False, timestamp=4),
        BashExecutionMessage(command="sleep 9", output="", cancelled=True, truncated=False,
                             timestamp=5, excludeFromContext=True),
        CustomMessage(customType="notice", content="hello", display=True, timestamp=6),
        DeveloperMessage(content="be brief", timestamp=7),
        UserMessage(content=[TextContent(text="and this image"),
                             ImageContent(data="iVBORw0KGgo=", mimeType="image/png")],
                    timestamp=8),
        assistant([TextContent(text="A pixel.")], usage(2000, 5, cost=0.0025, reasoning=0)),
    ]


def test_full_context_exact_stats() -> None:
    messages = full_context()
    stats = session_stats(messages, session_file="/s/x.jsonl", session_id=SID,
                          context_usage=(2005, 128_000))
    assert stats.cost == pytest.approx(0.0275)
    assert msgspec.structs.replace(stats, cost=0.0275) == SessionStats(
        sessionFile="/s/x.jsonl",
        sessionId=SID,
        userMessages=2,            # developer / custom / bash / summary are not users
        assistantMessages=4,
        toolCalls=3,
        toolResults=3,
        totalMessages=14,
        tokens=SessionTokens(input=6100, output=255, reasoning=150, cacheRead=1300,
                             cacheWrite=50, total=1550 + 2540 + 1700 + 2005),
        cost=0.0275,
        premiumRequests=1.5,
        routedModels={"vendor/big-model": 2},
        contextUsage=ContextUsage(tokens=2005, contextWindow=128_000, percent=1.566406),
    )
    data = encode(stats)
    assert data["tokens"] == {"input": 6100, "output": 255, "reasoning": 150,
                              "cacheRead": 1300, "cacheWrite": 50, "total": 7795}
    assert set(data) == {"sessionFile", "sessionId", "userMessages", "assistantMessages",
                         "toolCalls", "toolResults", "totalMessages", "tokens", "cost",
                         "premiumRequests", "routedModels", "contextUsage"}


def test_matches_the_observed_example() -> None:
    """2 prompts answered by the fake provider (100 prompt + 10 completion tokens each, no
    prices), context usage 100 of 128000 (docs/design/sessions.md#session-statistics)."""
    messages: list[AgentMessage] = [
        user("one"), assistant([TextContent(text="1")], usage(100, 10)),
        user("two"), assistant([TextContent(text="2")], usage(100, 10)),
    ]
    stats = session_stats(messages, session_file="/tmp/s.jsonl", session_id=SID,
                          context_usage=(100, 128_000))
    raw = msgspec.json.encode(stats)
    assert msgspec.json.decode(raw) == {
        "sessionFile": "/tmp/s.jsonl", "sessionId": SID, "userMessages": 2,
        "assistantMessages": 2, "toolCalls": 0, "toolResults": 0, "totalMessages": 4,
        "tokens": {"input": 200, "output": 20, "reasoning": 0, "cacheRead": 0,
                   "cacheWrite": 0, "total": 220},
        "cost": 0, "premiumRequests": 0,
        "contextUsage": {"tokens": 100, "contextWindow": 128000, "percent": 0.078125},
    }
    # Written like the original (a JS number): 0, not 0.0.
    assert b'"cost":0,' in raw
    assert b'"premiumRequests":0,' in raw


def test_in_memory_session_and_unknown_context_usage_are_omitted() -> None:
    data = encode(session_stats([], session_file=None, session_id=SID, context_usage=None))
    assert data == {
        "sessionId": SID, "userMessages": 0, "assistantMessages": 0, "toolCalls": 0,
        "toolResults": 0, "totalMessages": 0,
        "tokens": {"input": 0, "output": 0, "reasoning": 0, "cacheRead": 0, "cacheWrite": 0,
                   "total": 0},
        "cost": 0, "premiumRequests": 0,
    }


@pytest.mark.parametrize(("tokens", "window", "percent"), [
    (100, 128_000, 0.078125),
    (1, 3, 33.333333),
    (64_000, 128_000, 50),
    (0, 200_000, 0),
    (150, 100, 150),       # over the window: reported as is, not capped
    (500, 0, 0),           # unknown window
])
def test_context_usage_percent(tokens: int, window: int, percent: float) -> None:
    assert context_usage_payload(tokens, window) == ContextUsage(
        tokens=tokens, contextWindow=window, percent=percent)


def test_extra_usage_adds_to_the_totals_not_the_counts() -> None:
    side = usage(300, 30, cost=0.01, reasoning=7, premium=2)
    stats = session_stats([user("x"), assistant([TextContent(text="y")], usage(10, 1))],
                          session_file=None, session_id=SID, context_usage=None,
                          extra_usage=[side])
    assert stats.assistantMessages == 1
    assert stats.tokens == SessionTokens(input=310, output=31, reasoning=7, cacheRead=0,
                                         cacheWrite=0, total=341)
    assert stats.cost == 0.01
    assert stats.premiumRequests == 2


def test_compaction_drops_the_summarised_turns(tmp_path: Path) -> None:
    """Over the live context rebuilt from a file: only what the compaction kept counts."""
    file = SessionFile.create(tmp_path, cwd=str(tmp_path))
    file.append_message(user("old"))
    file.append_message(assistant([ToolCall(id="o1", name="bash", arguments={})],
                                  usage(5000, 500, cost=1.0)))
    file.append_message(result("o1", "old output"))
    file.append_message(assistant([TextContent(text="old answer")], usage(6000, 50, cost=1.0)))
    kept = file.append_message(user("new"))
    file.append_message(assistant([TextContent(text="new answer")], usage(700, 7, cost=0.5)))
    file.append_compaction("summary of old work", kept.id, 11_000)
    messages = build_context(file)
    stats = session_stats(messages, session_file=str(file.path), session_id=file.session_id,
                          context_usage=None)
    assert stats.totalMessages == 3  # summary, user, assistant
    assert (stats.userMessages, stats.assistantMessages, stats.toolCalls,
            stats.toolResults) == (1, 1, 0, 0)
    assert stats.tokens.total == 707
    assert stats.cost == 0.5
    assert stats.sessionFile == str(file.path)
