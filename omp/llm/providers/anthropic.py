"""Anthropic Messages API (``POST {baseUrl}/v1/messages``, streamed;
docs/design/agent-loop.md#provider-adapters).

Request: the system prompt as text blocks (one per entry, the last one cached), the history
after ``transform_messages`` (docs/design/agent-loop.md#history-normalisation), prompt caching on
the last user block, thinking replayed with its signature to the model that wrote it, tool results
grouped into one user message.

Stream: content blocks arrive keyed by Anthropic's ``index`` and may interleave; the builder
keeps that mapping, so every block still gets its own ``*_start`` / ``*_end``.

Cancellation: the HTTP stream is opened with ``async with``, so cancelling the caller closes
the connection at once; nothing is left running.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any, Literal

import httpx
import msgspec

from ...protocol import messages as m
from ...protocol.payloads import Model
from .. import errors
from ..builder import MessageBuilder
from ..errors import ProviderError
from ..http import drain, post_stream, request_headers
from ..sse import iter_sse
from ..thinking import anthropic_thinking
from ..transform import same_model, transform_messages
from ..types import LlmMessage, ModelRequest

API_VERSION = "2023-06-01"
BETA_TOOL_STREAMING = "fine-grained-tool-streaming-2025-05-14"
BETA_INTERLEAVED_THINKING = "interleaved-thinking-2025-05-14"
DEFAULT_MAX_TOKENS = 8192
MAX_TOKENS_CAP = 32000

_UNSAFE_ID = re.compile(r"[^a-zA-Z0-9_-]")


def sanitize_tool_id(tool_id: str) -> str:
    """Anthropic accepts tool ids matching ``[a-zA-Z0-9_-]{1,64}``."""
    return _UNSAFE_ID.sub("_", tool_id)[:64] or "tool"


# --- request body ------------------------------------------------------------------------------


class _Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class _CacheControl(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    type: Literal["ephemeral"]


_EPHEMERAL = _CacheControl(type="ephemeral")


class _TextBlock(_Wire, tag="text", frozen=True, kw_only=True, omit_defaults=True):
    text: str
    cache_control: _CacheControl | None = None


class _ImageSource(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    type: Literal["base64"]
    media_type: str
    data: str


class _ImageBlock(_Wire, tag="image", frozen=True, kw_only=True, omit_defaults=True):
    source: _ImageSource
    cache_control: _CacheControl | None = None


class _ThinkingBlock(_Wire, tag="thinking", frozen=True, kw_only=True, omit_defaults=True):
    thinking: str
    signature: str


class _RedactedThinkingBlock(_Wire, tag="redacted_thinking",
                             frozen=True, kw_only=True, omit_defaults=True):
    data: str


class _ToolUseBlock(_Wire, tag="tool_use", frozen=True, kw_only=True, omit_defaults=True):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: _CacheControl | None = None


class _ToolResultBlock(_Wire, tag="tool_result", frozen=True, kw_only=True, omit_defaults=True):
    tool_use_id: str
    content: str | list[_TextBlock | _ImageBlock]
    is_error: bool = False
    cache_control: _CacheControl | None = None


_Block = (_TextBlock | _ImageBlock | _ThinkingBlock | _RedactedThinkingBlock | _ToolUseBlock
          | _ToolResultBlock)


class _Message(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    role: Literal["user", "assistant"]
    content: list[_Block]


class _Tool(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    description: str
    input_schema: dict[str, Any]


class _Request(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    model: str
    messages: list[_Message]
    max_tokens: int
    stream: bool
    system: list[_TextBlock] | None = None
    tools: list[_Tool] | None = None
    tool_choice: dict[str, str] | None = None
    thinking: dict[str, Any] | None = None
    temperature: float | None = None


def _user_blocks(content: str | Sequence[m.UserContent], images: bool
                 ) -> list[_TextBlock | _ImageBlock]:
    if isinstance(content, str):
        return [_TextBlock(text=content)] if content.strip() else []
    blocks: list[_TextBlock | _ImageBlock] = []
    for block in content:
        if isinstance(block, m.TextContent):
            if block.text.strip():
                blocks.append(_TextBlock(text=block.text))
        elif images:
            blocks.append(_ImageBlock(source=_ImageSource(
                type="base64", media_type=block.mimeType, data=block.data)))
    return blocks


def _assistant_blocks(message: m.AssistantMessage, model: Model) -> list[_Block]:
    same = same_model(message, model)
    blocks: list[_Block] = []
    for block in message.content:
        if isinstance(block, m.TextContent):
            if block.text.strip():
                blocks.append(_TextBlock(text=block.text))
        elif isinstance(block, m.ThinkingContent):
            signature = block.thinkingSignature
            if same and isinstance(signature, str) and signature:
                blocks.append(_ThinkingBlock(thinking=block.thinking, signature=signature))
            elif block.thinking.strip():
                blocks.append(_TextBlock(text=block.thinking))  # unsigned: the API rejects it
        elif isinstance(block, m.RedactedThinkingContent):
            if same:
                blocks.append(_RedactedThinkingBlock(data=block.data))
        elif isinstance(block, m.ToolCall):
            blocks.append(_ToolUseBlock(id=block.id, name=block.name, input=block.arguments))
    return blocks


def _tool_result_block(message: m.ToolResultMessage, images: bool) -> _ToolResultBlock:
    parts = _user_blocks(message.content, images)
    content: str | list[_TextBlock | _ImageBlock]
    if any(isinstance(p, _ImageBlock) for p in parts):
        if not any(isinstance(p, _TextBlock) for p in parts):
            parts.insert(0, _TextBlock(text="(see attached image)"))
        content = parts
    else:
        content = "\n".join(p.text for p in parts if isinstance(p, _TextBlock))
    return _ToolResultBlock(tool_use_id=message.toolCallId, content=content,
                            is_error=message.isError)


def _convert_messages(messages: Sequence[LlmMessage], model: Model) -> list[_Message]:
    images = "image" in model.input
    out: list[_Message] = []
    results: list[_Block] = []
    for message in messages:
        if isinstance(message, m.ToolResultMessage):
            results.append(_tool_result_block(message, images))
            continue
        if results:
            out.append(_Message(role="user", content=results))
            results = []
        if isinstance(message, m.UserMessage):
            user_blocks: list[_Block] = list(_user_blocks(message.content, images))
            if user_blocks:
                out.append(_Message(role="user", content=user_blocks))
        elif blocks := _assistant_blocks(message, model):
            out.append(_Message(role="assistant", content=blocks))
    if results:
        out.append(_Message(role="user", content=results))
    # Prompt caching: everything up to the newest user block is a cache breakpoint.
    for i in range(len(out) - 1, -1, -1):
        if out[i].role == "user":
            *head, last = out[i].content
            if isinstance(last, _TextBlock | _ImageBlock | _ToolResultBlock):
                last = msgspec.structs.replace(last, cache_control=_EPHEMERAL)
            out[i] = _Message(role="user", content=[*head, last])
            break
    return out


def build_request(call: ModelRequest) -> tuple[_Request, bool]:
    """The request body, and whether it asks for thinking."""
    model, context, options = call.model, call.context, call.options
    messages = transform_messages(context.messages, model,
                                  normalize_id=lambda i, _same: sanitize_tool_id(i))
    max_tokens = options.max_tokens or min(model.maxTokens or DEFAULT_MAX_TOKENS, MAX_TOKENS_CAP)
    thinking: dict[str, Any] | None = None
    forced = options.tool_choice if context.tools else None
    # Anthropic refuses a forced tool together with extended thinking: a forced turn thinks not.
    if model.reasoning and options.thinking != "off" and forced is None:
        thinking, max_tokens = anthropic_thinking(model, options.thinking, max_tokens)
    system = [_TextBlock(text=text) for text in context.system_prompt if text.strip()]
    if system:
        system[-1] = msgspec.structs.replace(system[-1], cache_control=_EPHEMERAL)
    tools = [_Tool(name=t.name, description=t.description, input_schema=t.parameters)
             for t in context.tools]
    request = _Request(
        model=model.id, messages=_convert_messages(messages, model), max_tokens=max_tokens,
        stream=True, system=system or None, tools=tools or None, thinking=thinking,
        tool_choice={"type": "tool", "name": forced} if forced else None,
        temperature=options.temperature if thinking is None else None)
    return request, thinking is not None


def _headers(call: ModelRequest, thinking: bool) -> dict[str, str]:
    betas = [BETA_TOOL_STREAMING, *([BETA_INTERLEAVED_THINKING] if thinking else [])]
    auth = {"anthropic-version": API_VERSION, "anthropic-beta": ",".join(betas)}
    if call.options.api_key:
        auth["x-api-key"] = call.options.api_key
    return request_headers(call, auth)


# --- stream events -----------------------------------------------------------------------------


class _Usage(msgspec.Struct, frozen=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None


class _MessageInfo(msgspec.Struct, frozen=True):
    id: str = ""
    usage: _Usage | None = None


class _MessageStart(msgspec.Struct, frozen=True):
    message: _MessageInfo


class _ContentBlock(msgspec.Struct, frozen=True):
    type: str
    text: str = ""
    thinking: str = ""
    signature: str = ""
    data: str = ""
    id: str = ""
    name: str = ""
    input: Any = None


class _BlockStart(msgspec.Struct, frozen=True):
    index: int
    content_block: _ContentBlock


class _Delta(msgspec.Struct, frozen=True):
    type: str
    text: str = ""
    thinking: str = ""
    partial_json: str = ""
    signature: str = ""


class _BlockDelta(msgspec.Struct, frozen=True):
    index: int
    delta: _Delta


class _BlockStop(msgspec.Struct, frozen=True):
    index: int


class _StopInfo(msgspec.Struct, frozen=True):
    stop_reason: str | None = None


class _MessageDelta(msgspec.Struct, frozen=True):
    delta: _StopInfo | None = None
    usage: _Usage | None = None


class _ErrorInfo(msgspec.Struct, frozen=True):
    type: str = ""
    message: str = ""


class _ErrorEvent(msgspec.Struct, frozen=True):
    error: _ErrorInfo


class _Envelope(msgspec.Struct, frozen=True):
    type: str = ""


_DECODERS: dict[str, msgspec.json.Decoder[Any]] = {
    "message_start": msgspec.json.Decoder(_MessageStart),
    "content_block_start": msgspec.json.Decoder(_BlockStart),
    "content_block_delta": msgspec.json.Decoder(_BlockDelta),
    "content_block_stop": msgspec.json.Decoder(_BlockStop),
    "message_delta": msgspec.json.Decoder(_MessageDelta),
    "error": msgspec.json.Decoder(_ErrorEvent),
}
_ENVELOPE = msgspec.json.Decoder(_Envelope)

_STOP_REASONS: dict[str, m.StopReason] = {
    "end_turn": "stop", "pause_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
    "model_context_window_exceeded": "length", "tool_use": "toolUse",
}


def _set_usage(out: MessageBuilder, usage: _Usage | None) -> None:
    if usage is not None:
        out.set_usage(input=usage.input_tokens, output=usage.output_tokens,
                      cache_read=usage.cache_read_input_tokens,
                      cache_write=usage.cache_creation_input_tokens)


async def stream_anthropic(call: ModelRequest, out: MessageBuilder, http: httpx.AsyncClient
                           ) -> None:
    """Send ``call`` to the Messages API and feed ``out`` until ``message_stop``.

    Raises ProviderError for an HTTP error, an ``error`` event, a refusal, or a stream that ends
    before ``message_stop``. On cancellation the connection is closed and Cancelled propagates.
    """
    model = call.model
    request, thinking = build_request(call)
    url = model.baseUrl.rstrip("/") + "/v1/messages"
    async with post_stream(call, http, url, msgspec.json.encode(request),
                           _headers(call, thinking)) as response:
        out.start()
        await _read_events(call, out, response)


async def _read_events(call: ModelRequest, out: MessageBuilder, response: httpx.Response) -> None:
    model, options = call.model, call.options
    refusal: str | None = None
    initial_input: dict[int, Any] = {}  # tool_use blocks that came with their input up front
    async with aclosing(iter_sse(response, first_timeout=options.first_event_timeout,
                                 idle_timeout=options.idle_timeout, provider=model.provider,
                                 model=model.id, pace=out.pace,
                                 max_event_bytes=options.max_event_bytes,
                                 max_response_bytes=options.max_response_bytes)) as events:
        async for sse in events:
            try:
                name = sse.event or _ENVELOPE.decode(sse.data).type
                if name == "message_stop":
                    break
                decoder = _DECODERS.get(name)
                if decoder is None:
                    continue  # ping, and event types this adapter does not know
                event = decoder.decode(sse.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise errors.malformed_stream(f"an event does not parse ({exc})", sse.data,
                                              model.provider, model.id) from None
            if isinstance(event, _BlockDelta):
                delta, key = event.delta, event.index
                if not out.is_open(key):
                    continue
                if delta.type == "text_delta":
                    out.append(key, delta.text)
                elif delta.type == "thinking_delta":
                    out.append(key, delta.thinking)
                elif delta.type == "input_json_delta":
                    initial_input.pop(key, None)
                    if delta.partial_json:
                        out.append(key, delta.partial_json)
                elif delta.type == "signature_delta":
                    out.set_signature(key, delta.signature, append=True)
            elif isinstance(event, _BlockStart):
                _open_block(out, event, initial_input)
            elif isinstance(event, _BlockStop):
                if out.is_open(event.index):
                    if (args := initial_input.pop(event.index, None)) is not None:
                        out.set_tool(event.index,
                                     arguments_json=msgspec.json.encode(args).decode())
                    out.close(event.index)
            elif isinstance(event, _MessageStart):
                if event.message.id:
                    out.set_response_id(event.message.id)
                _set_usage(out, event.message.usage)
            elif isinstance(event, _MessageDelta):
                _set_usage(out, event.usage)
                reason = event.delta.stop_reason if event.delta else None
                if reason is not None:
                    if reason in _STOP_REASONS:
                        out.set_stop(_STOP_REASONS[reason])
                    else:  # refusal, sensitive, and whatever comes next
                        refusal = reason
            elif isinstance(event, _ErrorEvent):
                text = errors.describe_error(
                    {"message": event.error.message, "type": event.error.type})
                raise errors.from_stream_error(
                    text or event.error.type or "Anthropic stream error",
                    model.provider, model.id, error_type=event.error.type)
        else:
            raise ProviderError(kind="network", provider=model.provider, model=model.id,
                                message="Anthropic stream ended early (no message_stop): "
                                        "the connection closed before the response was complete")
        await drain(events)
    if refusal is not None:
        # Not retryable: the same request would be refused again.
        raise ProviderError(kind="bad_request", provider=model.provider, model=model.id,
                            message=f"The model declined to continue (stop_reason: {refusal})")


def _open_block(out: MessageBuilder, event: _BlockStart,
                initial_input: dict[int, Any]) -> None:
    block, key = event.content_block, event.index
    if block.type == "text":
        out.open(key, "text")
        if block.text:
            out.append(key, block.text)
    elif block.type == "thinking":
        out.open(key, "thinking", signature=block.signature or None)
        if block.thinking:
            out.append(key, block.thinking)
    elif block.type == "redacted_thinking":
        out.open(key, "redactedThinking")
        out.append(key, block.data)
    elif block.type == "tool_use":
        out.open(key, "toolCall", tool_id=block.id, tool_name=block.name)
        if isinstance(block.input, dict) and block.input:
            initial_input[key] = block.input
    # server_tool_use, web_search_tool_result, ...: not ours to replay; their deltas are skipped
