"""The fake LLM server's script: what to answer, provider-neutral.

A script is a list of ``Reply`` entries. Each request takes the first unused entry whose
``match`` fits it (an entry without ``match`` fits any request); ``repeat: true`` keeps an entry
in play. The server renders a reply in the streaming format of the API the request was sent to
(chosen by its path: ``/chat/completions`` → openai-completions, ``/responses`` →
openai-responses, ``/messages`` → anthropic-messages, ``:streamGenerateContent`` →
google-generative-ai), so one script serves every provider.

As JSON (``python -m omp.testing.fake_llm --script FILE``)::

    [
      {"chunks": [{"thinking": "Let me think", "signature": "sig-1"},
                  {"text": "Hello"}, {"delay": 0.05}, {"text": " world"}],
       "usage": {"input": 12, "output": 5}},
      {"match": {"bodyContains": "weather"},
       "chunks": [{"toolCall": {"id": "call_1", "name": "get_weather",
                                "arguments": ["{\\"city\\": ", "\\"Paris\\"}"]}}],
       "stop": "toolUse"},
      {"status": 429, "headers": {"retry-after": "3"},
       "body": {"error": {"message": "rate limited", "type": "rate_limit_error"}}},
      {"chunks": [{"text": "partial"}], "dropAfter": 1},
      {"chunks": [{"text": "never finishes"}], "hangAfter": 1},
      {"chunks": [{"text": "Half"}, {"gate": "go", "text": " and the rest"}]},
      {"raw": ["data: not json", ""]},
      {"flood": {"prefix": "data: \\"", "bytes": 100000000, "suffix": "\\"\\n\\n"}}
    ]
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType


class _S(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    pass


class ToolCallChunk(_S, frozen=True, kw_only=True, omit_defaults=True,
                    forbid_unknown_fields=True):
    id: str
    name: str
    arguments: list[str] = msgspec.field(default_factory=list)
    """The arguments JSON, in the pieces it is streamed in (joined, it must be valid JSON)."""


class Chunk(_S, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Exactly one of the content fields, or only ``delay`` / ``at`` / ``gate``."""

    text: str | UnsetType = UNSET
    thinking: str | UnsetType = UNSET
    signature: str | UnsetType = UNSET
    """With ``thinking``: its signature (Anthropic ``signature_delta``, Responses item data)."""
    redactedThinking: str | UnsetType = UNSET
    toolCall: ToolCallChunk | UnsetType = UNSET
    delay: float = 0.0
    """Seconds to wait before sending this chunk (a chunk with only ``delay`` just waits)."""
    at: float | UnsetType = UNSET
    """Send this chunk no earlier than ``at`` seconds after the reply began: a schedule that
    does not drift (a late write does not push the later chunks back, as ``delay`` does)."""
    gate: str | UnsetType = UNSET
    """Send this chunk only once the test opened the gate of this name
    (``FakeLLM.open_gate``): what the reply rendered before it is flushed first, and the
    response waits, open and silent, for an event of the test instead of a time. A gate is
    opened by the test's own code, so a reply that has one needs a server in the test's
    process (``open_fake_llm``), not the command-line one."""


class ScriptUsage(_S, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    input: int = 0
    output: int = 0
    cacheRead: int = 0
    cacheWrite: int = 0
    reasoning: int = 0


class Match(_S, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    path: str | UnsetType = UNSET
    """Substring of the request path."""
    model: str | UnsetType = UNSET
    """The model id the request asked for."""
    bodyContains: str | UnsetType = UNSET
    """Substring of the raw request body."""


class Flood(_S, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """A body too large to hold, sent in pieces as it is made: ``prefix``, then ``fill`` again
    and again, ``bytes`` bytes of it (without end when not given), then ``suffix``."""

    prefix: str = ""
    fill: str = "x"
    bytes: int | UnsetType = UNSET
    suffix: str = ""
    every: float = 0.0
    """Seconds between two ``fill``s, each its own write (0: as fast as the client reads, in
    writes of about 64 KiB)."""


class Reply(_S, frozen=True, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    match: Match | UnsetType = UNSET
    repeat: bool = False
    status: int = 200
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    body: Any = UNSET
    """For a non-200 status: the JSON (or string) error body, sent as-is."""
    chunks: list[Chunk] = msgspec.field(default_factory=list)
    usage: ScriptUsage = msgspec.field(default_factory=ScriptUsage)
    stop: Literal["stop", "length", "toolUse", "error"] | UnsetType = UNSET
    """Finish reason, rendered natively (default: toolUse if a tool call was sent, else stop)."""
    errorEvent: str | UnsetType = UNSET
    """After the chunks, send the provider's in-stream error event with this message."""
    dropAfter: int | UnsetType = UNSET
    """Close the connection abruptly after this many chunks (no finish, no terminator)."""
    hangAfter: int | UnsetType = UNSET
    """Stop sending after this many chunks but keep the connection open."""
    raw: list[str] | UnsetType = UNSET
    """Send these SSE lines verbatim instead of rendering ``chunks`` (escape hatch)."""
    flood: Flood | UnsetType = UNSET
    """After ``raw`` (instead of ``chunks``): a flood of bytes, e.g. one 100 MB event
    (``{"prefix": "data: \\"", "bytes": 100000000, "suffix": "\\"\\n\\n"}``) or a stream
    without end (``{"fill": ": keep-alive\\n\\n"}``)."""


Script = list[Reply]


def load_script(data: bytes | str) -> Script:
    """Parse a JSON script; errors name the entry and field."""
    return msgspec.json.decode(data, type=Script)
