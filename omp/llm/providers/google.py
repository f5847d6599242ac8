"""Google Generative AI (Gemini API: ``POST {baseUrl}/models/{id}:streamGenerateContent?alt=sse``).

Request: ``systemInstruction``, ``contents`` with roles ``user`` / ``model`` (tool results as
``functionResponse`` parts, one user turn per run of results), function declarations, and
``generationConfig`` with the thinking config of docs/design/agent-loop.md#thinking-levels.

Stream: every SSE event is a whole ``GenerateContentResponse``. Text parts switch between a text
and a thinking block as ``thought`` changes; a function call arrives whole and becomes a tool
call block with a single delta. Gemini's ``thoughtSignature``s are kept where they came from so
they can be replayed to the same model (Gemini 3 rejects function calls without them).

Cancellation: the HTTP stream is opened with ``async with``, so cancelling the caller closes
the connection at once; nothing is left running.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from contextlib import aclosing
from typing import Any, Literal

import httpx
import msgspec

from ...protocol import messages as m
from ...protocol.payloads import Model
from .. import errors
from ..builder import MessageBuilder
from ..errors import ErrorKind, ProviderError
from ..http import post_stream, request_headers
from ..sse import iter_sse
from ..thinking import google_thinking_config
from ..transform import same_model, transform_messages
from ..types import LlmMessage, ModelRequest
from . import output_limit

# Documented escape hatch for Gemini 3: a function call from history that carries no signature
# of this model's (it came from another model) is replayed with this value instead.
SKIP_SIGNATURE = "skip_thought_signature_validator"

# --- request body ------------------------------------------------------------------------------


class _Wire(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    pass


class _InlineData(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    mimeType: str
    data: str


class _FunctionCall(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    args: dict[str, Any]


class _FunctionResponse(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    response: dict[str, Any]


class _Part(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    text: str | None = None
    thought: bool = False
    thoughtSignature: str | None = None
    inlineData: _InlineData | None = None
    functionCall: _FunctionCall | None = None
    functionResponse: _FunctionResponse | None = None


class _Content(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    role: Literal["user", "model"]
    parts: list[_Part]


class _SystemInstruction(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    parts: list[_Part]


class _FunctionDeclaration(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    description: str
    # Full JSON Schema (``parameters`` only takes Google's OpenAPI subset).
    parametersJsonSchema: dict[str, Any]


class _Tools(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    functionDeclarations: list[_FunctionDeclaration]


class _GenerationConfig(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    maxOutputTokens: int | None = None
    temperature: float | None = None
    thinkingConfig: dict[str, Any] | None = None


class _Request(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    contents: list[_Content]
    generationConfig: _GenerationConfig
    systemInstruction: _SystemInstruction | None = None
    tools: list[_Tools] | None = None
    toolConfig: dict[str, Any] | None = None


def _user_parts(content: str | Sequence[m.UserContent], images: bool) -> list[_Part]:
    if isinstance(content, str):
        return [_Part(text=content)] if content.strip() else []
    parts: list[_Part] = []
    for block in content:
        if isinstance(block, m.TextContent):
            if block.text.strip():
                parts.append(_Part(text=block.text))
        elif images:
            parts.append(_Part(inlineData=_InlineData(mimeType=block.mimeType, data=block.data)))
    return parts


def _signature(value: str | msgspec.UnsetType) -> str | None:
    return value if isinstance(value, str) and value else None


def _model_parts(message: m.AssistantMessage, model: Model) -> list[_Part]:
    same = same_model(message, model)
    parts: list[_Part] = []
    for block in message.content:
        if isinstance(block, m.TextContent):
            if block.text.strip():
                parts.append(_Part(text=block.text, thoughtSignature=_signature(
                    block.textSignature) if same else None))
        elif isinstance(block, m.ThinkingContent):
            if not block.thinking.strip():
                continue
            if same:
                parts.append(_Part(text=block.thinking, thought=True,
                                   thoughtSignature=_signature(block.thinkingSignature)))
            else:
                parts.append(_Part(text=block.thinking))
        elif isinstance(block, m.ToolCall):
            signature = _signature(block.thoughtSignature) if same else None
            if signature is None and "gemini-3" in model.id:
                signature = SKIP_SIGNATURE
            parts.append(_Part(functionCall=_FunctionCall(name=block.name, args=block.arguments),
                               thoughtSignature=signature))
    return parts


def _tool_result_parts(message: m.ToolResultMessage, images: bool) -> list[_Part]:
    text = "\n".join(b.text for b in message.content if isinstance(b, m.TextContent))
    pictures = [b for b in message.content if isinstance(b, m.ImageContent)] if images else []
    if not text and pictures:
        text = "(see attached image)"
    response = {"error": text} if message.isError else {"output": text}
    parts = [_Part(functionResponse=_FunctionResponse(name=message.toolName, response=response))]
    parts.extend(_Part(inlineData=_InlineData(mimeType=p.mimeType, data=p.data))
                 for p in pictures)
    return parts


def _convert_messages(messages: Sequence[LlmMessage], model: Model) -> list[_Content]:
    images = "image" in model.input
    out: list[_Content] = []
    results: list[_Part] = []
    for message in messages:
        if isinstance(message, m.ToolResultMessage):
            results.extend(_tool_result_parts(message, images))
            continue
        if results:
            out.append(_Content(role="user", parts=results))
            results = []
        if isinstance(message, m.UserMessage):
            if parts := _user_parts(message.content, images):
                out.append(_Content(role="user", parts=parts))
        elif parts := _model_parts(message, model):
            out.append(_Content(role="model", parts=parts))
    if results:
        out.append(_Content(role="user", parts=results))
    return out


def build_request(call: ModelRequest) -> _Request:
    model, context, options = call.model, call.context, call.options
    messages = transform_messages(context.messages, model)
    system = [_Part(text=text) for text in context.system_prompt if text.strip()]
    tools = [_FunctionDeclaration(name=t.name, description=t.description,
                                  parametersJsonSchema=t.parameters) for t in context.tools]
    config = _GenerationConfig(
        maxOutputTokens=output_limit(model, options, cap=None), temperature=options.temperature,
        thinkingConfig=google_thinking_config(model, options.thinking))
    return _Request(
        contents=_convert_messages(messages, model), generationConfig=config,
        systemInstruction=_SystemInstruction(parts=system) if system else None,
        tools=[_Tools(functionDeclarations=tools)] if tools else None,
        toolConfig={"functionCallingConfig": {
            "mode": "ANY", "allowedFunctionNames": [options.tool_choice]}}
        if tools and options.tool_choice else None)


def _headers(call: ModelRequest) -> dict[str, str]:
    key = call.options.api_key
    return request_headers(call, {"x-goog-api-key": key} if key else {})


# --- stream chunks -----------------------------------------------------------------------------


class _StreamFunctionCall(msgspec.Struct, frozen=True):
    name: str = ""
    args: dict[str, Any] | None = None
    id: str | None = None


class _StreamPart(msgspec.Struct, frozen=True):
    text: str | None = None
    thought: bool = False
    thoughtSignature: str | None = None
    functionCall: _StreamFunctionCall | None = None


class _StreamContent(msgspec.Struct, frozen=True):
    parts: list[_StreamPart] = msgspec.field(default_factory=list)


class _Candidate(msgspec.Struct, frozen=True):
    content: _StreamContent | None = None
    finishReason: str | None = None
    finishMessage: str | None = None


class _UsageMetadata(msgspec.Struct, frozen=True):
    promptTokenCount: int = 0
    candidatesTokenCount: int = 0
    thoughtsTokenCount: int = 0
    cachedContentTokenCount: int = 0
    totalTokenCount: int | None = None


class _PromptFeedback(msgspec.Struct, frozen=True):
    blockReason: str | None = None


class _Error(msgspec.Struct, frozen=True):
    code: int | None = None
    message: str = ""
    status: str = ""


class _Chunk(msgspec.Struct, frozen=True):
    candidates: list[_Candidate] = msgspec.field(default_factory=list)
    usageMetadata: _UsageMetadata | None = None
    promptFeedback: _PromptFeedback | None = None
    responseId: str | None = None
    error: _Error | None = None


_DECODER = msgspec.json.Decoder(_Chunk)

# ``from_stream_error`` reads Anthropic-style error types; these are Google's status codes.
_STATUS_TYPES = {
    "RESOURCE_EXHAUSTED": "rate_limit_error", "UNAVAILABLE": "overloaded_error",
    "INVALID_ARGUMENT": "invalid_request_error", "FAILED_PRECONDITION": "invalid_request_error",
    "NOT_FOUND": "invalid_request_error", "UNAUTHENTICATED": "authentication_error",
    "PERMISSION_DENIED": "permission_error",
}
# Finish reasons other than STOP / MAX_TOKENS: a retry can help these; the rest are blocks.
_RETRYABLE_FINISH = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "OTHER",
                               "FINISH_REASON_UNSPECIFIED", "TOO_MANY_TOOL_CALLS"})


async def stream_google(call: ModelRequest, out: MessageBuilder, http: httpx.AsyncClient) -> None:
    """Send ``call`` to ``streamGenerateContent`` and feed ``out`` until the stream ends.

    Raises ProviderError for an HTTP error, an error chunk, a finish reason other than STOP /
    MAX_TOKENS, or a stream that ends without a finish reason. On cancellation the connection is
    closed and Cancelled propagates.
    """
    model = call.model
    url = f"{model.baseUrl.rstrip('/')}/models/{model.id}:streamGenerateContent?alt=sse"
    body = msgspec.json.encode(build_request(call))
    async with post_stream(call, http, url, body, _headers(call)) as response:
        out.start()
        await _read_chunks(call, out, response)


async def _read_chunks(call: ModelRequest, out: MessageBuilder, response: httpx.Response) -> None:
    model, options = call.model, call.options
    keys = itertools.count()
    key: int | None = None  # the open text / thinking block
    kind: Literal["text", "thinking"] = "text"
    tool_ids: set[str] = set()
    finish: str | None = None
    async with aclosing(iter_sse(response, first_timeout=options.first_event_timeout,
                                 idle_timeout=options.idle_timeout, provider=model.provider,
                                 model=model.id, pace=out.pace,
                                 max_event_bytes=options.max_event_bytes,
                                 max_response_bytes=options.max_response_bytes)) as events:
        async for sse in events:
            if not sse.data.strip() or sse.data.strip() == "[DONE]":
                continue
            try:
                chunk = _DECODER.decode(sse.data)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise errors.malformed_stream(f"a chunk does not parse ({exc})", sse.data,
                                              model.provider, model.id) from None
            if chunk.error is not None:
                err = chunk.error
                text = errors.describe_error({"message": err.message, "status": err.status})
                raise errors.from_stream_error(
                    text or err.status or "Gemini stream error", model.provider,
                    model.id, error_type=_STATUS_TYPES.get(err.status, err.status))
            if chunk.responseId:
                out.set_response_id(chunk.responseId)
            candidate = chunk.candidates[0] if chunk.candidates else None
            for part in candidate.content.parts if candidate and candidate.content else ():
                if part.functionCall is not None:
                    if key is not None:
                        out.close(key)
                        key = None
                    _tool_call(out, next(keys), part, tool_ids)
                elif part.text is not None:
                    part_kind: Literal["text", "thinking"] = (
                        "thinking" if part.thought else "text")
                    if key is not None and part_kind != kind and part.text:
                        out.close(key)
                        key = None
                    if key is None:
                        if not part.text and not part.thoughtSignature:
                            continue
                        key, kind = next(keys), part_kind
                        out.open(key, kind)
                    if part.text:
                        out.append(key, part.text)
                    if part.thoughtSignature:
                        out.set_signature(key, part.thoughtSignature)
            if (usage := chunk.usageMetadata) is not None:
                cached = usage.cachedContentTokenCount
                out.set_usage(input=max(0, usage.promptTokenCount - cached),
                              output=usage.candidatesTokenCount + usage.thoughtsTokenCount,
                              cache_read=cached, total=usage.totalTokenCount,
                              reasoning=usage.thoughtsTokenCount or None)
            if candidate is not None and candidate.finishReason:
                finish = candidate.finishReason
            elif not chunk.candidates and chunk.promptFeedback and (
                    reason := chunk.promptFeedback.blockReason):
                raise ProviderError(kind="bad_request", provider=model.provider, model=model.id,
                                    message=f"Gemini blocked the prompt (blockReason: {reason})")
    if key is not None:
        out.close(key)
    if finish is None:
        raise ProviderError(kind="network", provider=model.provider, model=model.id,
                            message="Gemini stream ended early (no finishReason): the "
                                    "connection closed before the response was complete")
    if finish == "STOP":
        out.set_stop("stop")
    elif finish == "MAX_TOKENS":
        out.set_stop("length")
    else:
        kind_: ErrorKind = "server" if finish in _RETRYABLE_FINISH else "bad_request"
        raise ProviderError(kind=kind_, provider=model.provider, model=model.id,
                            message=f"Gemini stopped the response: finishReason {finish}")


_counter = itertools.count(1)


def _tool_call(out: MessageBuilder, key: int, part: _StreamPart, seen: set[str]) -> None:
    call = part.functionCall
    assert call is not None
    tool_id = call.id
    if not tool_id or tool_id in seen:
        tool_id = f"{call.name}_{int(time.time() * 1000)}_{next(_counter)}"
    seen.add(tool_id)
    out.open(key, "toolCall", tool_id=tool_id, tool_name=call.name)
    if part.thoughtSignature:
        out.set_tool(key, thought_signature=part.thoughtSignature)
    out.append(key, msgspec.json.encode(call.args or {}).decode())
    out.close(key)
