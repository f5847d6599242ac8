"""Helpers for the subagent tests: scripts that tell parent and children apart by request
content, settings files, and frame filters.

A child's first request carries ``Complete assignment thoroughly`` and its assignment; the
parent's carry its own prompt. So a script entry matching a child's assignment (a word only that
child's task holds) serves that child, whatever the order in which the requests arrive.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent_helpers import Frame, of_type, text_reply, tool_call, tools_reply


def write_config(agent_dir: Path, text: str) -> None:
    (agent_dir / "config.yml").write_text(text)


def inline_config(agent_dir: Path, extra: str = "") -> None:
    """``async.enabled: false``: every child runs inline in the parent's tool call."""
    write_config(agent_dir, "async:\n  enabled: false\n" + extra)


def task_call(call_id: str, *items: dict[str, Any], context: str = "Shared goal") -> dict[str, Any]:
    return tools_reply(tool_call(call_id, "task", {"context": context, "tasks": list(items)}))


def match(word: str, reply: dict[str, Any]) -> dict[str, Any]:
    return {"match": {"bodyContains": word}, **reply}


def child_match(assignment_start: str) -> str:
    """What only the request of the child whose assignment starts so contains: its first
    message as the JSON body holds it (the parent's history has the assignment too)."""
    return "Complete assignment thoroughly:\\n\\n" + assignment_start


def child_yields(word: str, data: dict[str, Any], *, call_id: str = "y1",
                 delay: float | None = None) -> dict[str, Any]:
    """The reply to the child whose assignment starts with ``word``: ``yield {data}``."""
    chunks: list[dict[str, Any]] = [{"delay": delay}] if delay is not None else []
    chunks.append(tool_call(call_id, "yield", {"data": data}))
    return match(child_match(word), {"chunks": chunks})


def parent_final(text: str = "All done") -> dict[str, Any]:
    """The parent's answer once a task result is in its context."""
    return match("task-result", text_reply(text))


def lifecycle(frames: Iterable[Frame], status: str | None = None) -> list[dict[str, Any]]:
    return [f["payload"] for f in of_type(frames, "subagent_lifecycle")
            if status is None or f["payload"]["status"] == status]


def tool_end_text(frames: Iterable[Frame], name: str = "task") -> str:
    ends = [f for f in of_type(frames, "tool_execution_end") if f["toolName"] == name]
    assert ends, "no tool_execution_end"
    return "".join(b["text"] for b in ends[-1]["result"]["content"] if b["type"] == "text")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every line of a session file, decoded (a torn line fails the test)."""
    data = Path(path).read_bytes()
    assert data.endswith(b"\n"), "the file does not end with a complete line"
    return [json.loads(line) for line in data.splitlines()]
