"""What a model call needs: the context (system prompt, messages, tools) and the options."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol, get_args

import msgspec

from ..protocol.commands import ThinkingLevel as ThinkingLevel
from ..protocol.messages import AssistantMessage, ToolResultMessage, UserMessage
from ..protocol.payloads import Model

CONNECT_SECONDS = 30.0
"""httpx's bound on opening a connection; every other wait of a call is one of our watchdogs
(``first_event_timeout`` and ``idle_timeout`` below)."""

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""The largest SSE event a provider may send (``stream.maxEventBytes``). A real one is a token,
or at most a whole answer repeated at its end (the Responses API's ``response.completed``)."""
MAX_MESSAGE_CHARS = 4 * 1024 * 1024
"""The largest assistant message, in characters of text, thinking, tool arguments and
signatures (``stream.maxMessageChars``): eight times what the models with the longest answers
(128k output tokens) can write."""
MAX_MESSAGE_CHARS_LIMIT = 10_000_000
"""The most ``stream.maxMessageChars`` may be: a message of that many characters is at most 60 MB
of JSON (six bytes a character, ``\\u0001``), so its session-file line stays within the
largest frame the output path allows (``MAX_REASSEMBLED_FRAME_BYTES``, 64 MiB)."""
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
"""Everything one response may send (``stream.maxResponseBytes``): about five times what the
longest real answer streams (128k tokens of chat-completions chunks, some 300 bytes each)."""

THINKING_LEVELS: tuple[ThinkingLevel, ...] = get_args(ThinkingLevel)
"""Every level, lowest first; clamping and cycling rank levels by this order."""

# What providers receive: LLM-level messages only. The agent converts its own kinds
# (bashExecution, custom, compactionSummary, ...) to these before a call
# (docs/design/agent-loop.md#what-the-model-is-sent).
LlmMessage = UserMessage | AssistantMessage | ToolResultMessage


class ToolDefinition(msgspec.Struct, frozen=True):
    """A tool as the model sees it: name, description and JSON-schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]


class Context(msgspec.Struct, frozen=True, kw_only=True):
    system_prompt: tuple[str, ...] = ()
    """System prompt blocks, in order (Anthropic sends one text block per entry)."""
    messages: tuple[LlmMessage, ...] = ()
    tools: tuple[ToolDefinition, ...] = ()


class StreamOptions(msgspec.Struct, frozen=True):
    """How one model call is made (a record: a msgspec Struct, cheap to define at startup)."""

    api_key: str | None = None
    """Resolved key; providers put it in their auth header and nowhere else."""
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    """Extra request headers (models.yml ``headers``)."""
    thinking: ThinkingLevel = "off"
    max_tokens: int | None = None
    """The output limit asked for; None: the model's own (``omp.llm.providers.output_limit``)."""
    send_max_tokens: bool = True
    """Without ``max_tokens``, send the model's output limit (``stream.sendMaxTokens``)."""
    temperature: float | None = None
    session_id: str | None = None
    service_tier: str | None = None
    """``"priority"`` in fast mode (OpenAI's ``service_tier``); None: the account's default."""
    tool_choice: str | None = None
    """The name of a tool the model must call in this turn (``/force``); None: its choice."""
    prepare: Callable[[], Awaitable[dict[str, str]]] | None = None
    """Awaited right before the request: the request headers to use instead of ``headers``
    (an OAuth login renewed when it is about to expire). A ProviderError it raises ends the
    call like a failed request."""
    first_event_timeout: float = 100.0
    """Seconds to wait for the response headers and the first event
    (docs/design/agent-loop.md#provider-adapters)."""
    idle_timeout: float = 120.0
    """Seconds allowed without progress (no event: no byte, or keep-alive comments only)
    before the stream counts as stalled (``stream.idleTimeoutMs``)."""
    max_event_bytes: int = MAX_EVENT_BYTES
    max_message_chars: int = MAX_MESSAGE_CHARS
    max_response_bytes: int = MAX_RESPONSE_BYTES


Api = Literal["openai-completions", "openai-responses", "anthropic-messages",
              "google-generative-ai", "offline"]


class ModelRequest(Protocol):
    """What a provider reads of a call (``omp.llm.stream.ModelCall`` is one)."""

    @property
    def model(self) -> Model: ...

    @property
    def context(self) -> Context: ...

    @property
    def options(self) -> StreamOptions: ...
