"""Helpers for the session-file tests: messages, a two-turn conversation, the recorded samples.

The samples are session files the original wrote, carried in ``tests/data/samples/sessions``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omp.protocol.messages import (
    AgentMessage,
    AssistantMessage,
    BranchSummaryMessage,
    CompactionSummaryMessage,
    CustomMessage,
    TextContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from omp.session.file import SessionFile

SAMPLES = Path(__file__).resolve().parent / "data" / "samples" / "sessions"
SAMPLE_1 = SAMPLES / "omp-session-1.jsonl"
SAMPLE_2 = SAMPLES / "omp-session-2.jsonl"
SAMPLE_3 = SAMPLES / "omp-session-3.jsonl"


def user(text: str, ts: int = 1) -> UserMessage:
    return UserMessage(content=[TextContent(text=text)], timestamp=ts, attribution="user")


def assistant(text: str = "", *, calls: tuple[ToolCall, ...] = (), stop: Any = "stop",
              ts: int = 2) -> AssistantMessage:
    content: list[Any] = [TextContent(text=text)] if text else []
    content.extend(calls)
    return AssistantMessage(content=content, api="openai-completions", provider="fake",
                            model="fake-model", usage=Usage.zero(), stopReason=stop, timestamp=ts)


def tool_result(call_id: str, text: str = "ok") -> ToolResultMessage:
    return ToolResultMessage(toolCallId=call_id, toolName="bash",
                             content=[TextContent(text=text)], isError=False, timestamp=3)


def texts(messages: list[AgentMessage]) -> list[tuple[str, str]]:
    """``(role, text)`` per message: what a reader of the context would see."""
    result = []
    for message in messages:
        role = message.__struct_config__.tag
        if isinstance(message, UserMessage | CustomMessage):
            content = message.content
            text = content if isinstance(content, str) else "".join(
                b.text for b in content if isinstance(b, TextContent))
        elif isinstance(message, AssistantMessage | ToolResultMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextContent))
        elif isinstance(message, CompactionSummaryMessage | BranchSummaryMessage):
            text = message.summary
        else:
            text = ""
        result.append((str(role), text))
    return result


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def conversation(directory: Path) -> SessionFile:
    """Two turns on a fresh file: q1/a1/q2/a2 after model and thinking entries."""
    file = SessionFile.create(directory, cwd="/work/project")
    file.append_model_change("fake", "fake-model")
    file.append_thinking_level("high")
    for n in (1, 2):
        file.append_message(user(f"q{n}"))
        file.append_message(assistant(f"a{n}"))
    return file
