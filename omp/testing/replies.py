"""Builders of the fake LLM's script entries (``omp.testing.script``), for tests that write
their script in Python: ``fake_llm.add(text("Hello"))``.

Each returns the JSON-shaped dict a script entry is (``FakeLLM.add`` validates it).
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["dropped", "gate", "overflow", "server_error", "text", "tool_call", "tool_calls"]


def text(*pieces: str | float | dict[str, Any], thinking: str | None = None,
         usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A streamed text answer: each ``str`` is one delta, each ``float`` a pause (seconds),
    each ``dict`` a chunk as it is (``gate(name)``); ``thinking`` streams first."""
    chunks: list[dict[str, Any]] = [{"thinking": thinking}] if thinking else []
    chunks += [p if isinstance(p, dict) else {"delay": p} if isinstance(p, float)
               else {"text": p} for p in pieces]
    reply: dict[str, Any] = {"chunks": chunks}
    if usage is not None:
        reply["usage"] = usage
    return reply


def gate(name: str) -> dict[str, Any]:
    """A piece of ``text`` that holds the answer until the test calls
    ``fake_llm.open_gate(name)`` (what came before is sent; ``fake_llm.waiting`` counts the
    answers held at each gate): wait for an event of the test, not for a time."""
    return {"gate": name}


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One tool call chunk (for ``tool_calls``); its arguments JSON streams in two pieces."""
    raw = msgspec.json.encode(arguments).decode()
    cut = max(1, len(raw) // 2)
    return {"toolCall": {"id": call_id, "name": name, "arguments": [raw[:cut], raw[cut:]]}}


def tool_calls(*calls: dict[str, Any], text: str | None = None,
               delay: float = 0.0) -> dict[str, Any]:
    """An answer that calls tools (``tool_call`` chunks), after ``text`` and a pause of
    ``delay`` seconds."""
    chunks: list[dict[str, Any]] = [{"delay": delay}] if delay else []
    if text:
        chunks.append({"text": text})
    return {"chunks": [*chunks, *calls]}


def dropped(*pieces: str) -> dict[str, Any]:
    """A stream cut off after its text ``pieces``: the connection closes mid-answer (the runtime
    retries it)."""
    return {"chunks": [{"text": p} for p in pieces], "dropAfter": len(pieces)}


def server_error(status: int = 503, message: str = "The server is overloaded", *,
                 retry_after: float | None = None) -> dict[str, Any]:
    """An HTTP error answer (503 by default: the runtime retries it after a backoff)."""
    reply: dict[str, Any] = {"status": status,
                             "body": {"error": {"message": message, "type": "server_error"}}}
    if retry_after is not None:
        reply["headers"] = {"retry-after": f"{retry_after:g}"}
    return reply


def overflow() -> dict[str, Any]:
    """A context overflow (HTTP 400, ``context_length_exceeded``): the runtime compacts the
    session, then tries the turn again."""
    return {"status": 400, "body": {"error": {
        "message": "This model's maximum context length is 128000 tokens. However, your "
                   "messages resulted in 131072 tokens.",
        "type": "invalid_request_error", "param": "messages",
        "code": "context_length_exceeded"}}}
