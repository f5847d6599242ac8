"""OpenAI chat completions (``POST {baseUrl}/chat/completions``),
docs/design/agent-loop.md#provider-adapters.

Also every OpenAI-compatible server (vLLM, Ollama, llama.cpp, OpenRouter, Groq...): the request
uses only the common subset, and ``model.compat`` flags adapt it where a provider would refuse
it (the catalog sets them per provider, ``catalog.json``):

* ``maxTokensField`` (``max_tokens`` where ``max_completion_tokens`` is unknown);
* ``supportsDeveloperRole``, ``supportsReasoningEffort`` (xAI's grok-4 refuses the field),
  ``supportsUsageInStreaming`` (no ``stream_options``: Mistral rejects unknown fields);
* ``thinkingFormat``: ``openrouter`` sends ``reasoning: {effort}``, ``zai`` sends
  ``thinking: {type: enabled|disabled}``, instead of ``reasoning_effort``;
* ``toolCallIdFormat: alnum9``: tool-call ids as 9 letters and digits (Mistral refuses others);
* ``requiresToolResultName``: a tool message names its tool (Mistral).

What compatible servers send differently is read whatever the flags: thinking in
``reasoning_content`` / ``reasoning`` / ``reasoning_text``; a tool call's arguments whole in one
chunk, or as a JSON object instead of a string (Ollama), several calls all at index 0; usage in
the last chunk, in the finish chunk, in Groq's ``x_groq``, or not at all (then it stays zero);
``finish_reason: stop`` after tool calls (counted as ``toolUse``).

The history normalisation every adapter applies (``transform_messages``,
docs/design/agent-loop.md#history-normalisation) and the request opening shared with the Responses
adapter live here too.

Cancellation: the HTTP response is closed on the way out (``http.stream``) and ``Cancelled``
propagates; ``ModelCall`` records the aborted message.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from typing import Any

import attrs
import httpx
import msgspec

from ...protocol import messages as m
from ...protocol.payloads import Model
from .. import errors
from ..builder import MessageBuilder
from ..errors import ProviderError
from ..http import drain, post_stream
from ..http import request_headers as http_headers
from ..sse import iter_sse
from ..thinking import openai_effort
from ..transform import transform_messages
from ..types import ModelRequest
from . import output_limit

Json = dict[str, Any]

# The delta fields OpenAI-compatible servers stream reasoning in; the one seen is remembered
# as the block's ``thinkingSignature`` and used again when the thinking is replayed.
REASONING_FIELDS = ("reasoning_content", "reasoning", "reasoning_text")
TOOL_IMAGES_NOTE = "Attached image(s) from tool result:"
SEE_IMAGE = "(see attached image)"
"""Seconds to wait for the end of a body after its end marker."""
_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def safe_call_id(call_id: str, limit: int) -> str:
    """A Responses-style ``call|item`` id as a plain call id other APIs accept."""
    return _ID_UNSAFE.sub("_", call_id.partition("|")[0])[:limit] or "call"


_ALNUM9 = re.compile(r"^[a-zA-Z0-9]{9}$")


def alnum9_call_id(call_id: str) -> str:
    """A call id as Mistral accepts them: 9 letters and digits (an id that is one already is
    kept; any other becomes the first 9 hex digits of its SHA-256, the same every time)."""
    if _ALNUM9.match(call_id):
        return call_id
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


# --- shared request helpers -------------------------------------------------------------------


def request_headers(call: ModelRequest) -> dict[str, str]:
    key = call.options.api_key
    return http_headers(call, {"authorization": f"Bearer {key}"} if key else {})


def endpoint(model: Model, path: str) -> str:
    return model.baseUrl.rstrip("/") + path


def compat(model: Model, key: str, default: Any) -> Any:
    flags = model.compat if isinstance(model.compat, dict) else {}
    return flags.get(key, default)


def data_url(image: m.ImageContent) -> str:
    if image.data:
        return f"data:{image.mimeType};base64,{image.data}"
    return image.url if isinstance(image.url, str) else ""


def joined_text(content: list[m.UserContent]) -> str:
    return "\n".join(b.text for b in content if isinstance(b, m.TextContent))


def decode_chunk(data: str, call: ModelRequest) -> Any:
    """An event's JSON. Raises the ``bad_response`` ProviderError of a stream that does not
    parse, quoting the event (never retried: ``errors.malformed_stream``)."""
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise errors.malformed_stream(f"an event is not JSON ({exc})", data,
                                      call.model.provider, call.model.id) from None


class ChunkDelta(msgspec.Struct):
    """The fields of a chunk's ``delta`` the stream reads (the others are skipped while
    decoding). Loosely typed: compatible servers differ, and the reader checks each value."""

    content: Any = None
    reasoning_content: Any = None
    reasoning: Any = None
    reasoning_text: Any = None
    tool_calls: Any = None


class ChunkChoice(msgspec.Struct):
    delta: ChunkDelta | None = None
    finish_reason: Any = None
    usage: Any = None


class Chunk(msgspec.Struct):
    """One ``chat.completion.chunk``, as much of it as the stream reads."""

    id: Any = None
    choices: list[ChunkChoice] | None = None
    usage: Any = None
    error: Any = None
    x_groq: Any = None
    """Groq's extension object: its last chunk carries the usage here."""


_decode_chunk_struct = msgspec.json.Decoder(Chunk).decode


def read_chunk(data: str, call: ModelRequest) -> Chunk | None:
    """A stream event's chunk; None for JSON that is not an object (skipped, as before).

    Decoded straight into ``Chunk`` (one event per token: this is the hot path). A server
    whose chunk has another shape (``choices`` an object, ``delta`` a string...) is read
    leniently instead, taking what fits and ignoring the rest; malformed JSON is a
    ProviderError (``decode_chunk``).
    """
    try:
        return _decode_chunk_struct(data)
    except msgspec.DecodeError:  # ValidationError too: another shape, or no JSON at all
        value = decode_chunk(data, call)  # raises the ProviderError naming malformed JSON
    if not isinstance(value, dict):
        return None
    choices = value.get("choices")
    first = _obj(choices[0]) if isinstance(choices, list) and choices else None
    choice = None
    if first is not None:
        delta = _obj(first.get("delta"))
        choice = ChunkChoice(
            delta=ChunkDelta(**{name: delta.get(name) for name in ChunkDelta.__struct_fields__}),
            finish_reason=first.get("finish_reason"), usage=first.get("usage"))
    return Chunk(id=value.get("id"), choices=[choice] if choice is not None else None,
                 usage=value.get("usage"), error=value.get("error"), x_groq=value.get("x_groq"))


def stream_error(error: Any, call: ModelRequest, *, fallback: str) -> ProviderError:
    """An in-stream error object (``{"message", "type", "code"}``) or a bare string, as the text
    ``<message> (type=… code=…)`` (``errors.describe_error``)."""
    if isinstance(error, dict):
        kind = error.get("type") or error.get("code")
        return errors.from_stream_error(
            errors.describe_error(error) or fallback, call.model.provider, call.model.id,
            error_type=str(kind) if kind else None)
    text = error if isinstance(error, str) and error else fallback
    return errors.from_stream_error(text, call.model.provider, call.model.id)


def early_end(call: ModelRequest) -> ProviderError:
    return ProviderError(
        kind="network", provider=call.model.provider, model=call.model.id,
        message="The stream ended early: the connection closed before the response was complete")


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _obj(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


# --- request ----------------------------------------------------------------------------------


def build_request(call: ModelRequest) -> Json:
    model, opts = call.model, call.options
    images = "image" in model.input
    messages: list[Json] = []
    if call.context.system_prompt:
        role = ("developer" if model.reasoning and compat(model, "supportsDeveloperRole", False)
                else "system")
        messages.append({"role": role, "content": "\n\n".join(call.context.system_prompt)})
    tool_images: list[m.ImageContent] = []

    def flush_tool_images() -> None:
        # Tool messages must follow their assistant message back to back, so the images of a
        # run of results go in one user message after it (docs/design/agent-loop.md#images).
        if tool_images:
            messages.append({"role": "user", "content": [
                {"type": "text", "text": TOOL_IMAGES_NOTE}, *map(_image_part, tool_images)]})
            tool_images.clear()

    alnum9 = compat(model, "toolCallIdFormat", None) == "alnum9"
    history = transform_messages(
        call.context.messages, model, max_id_length=9 if alnum9 else 40,
        normalize_id=(lambda i, _same: alnum9_call_id(i)) if alnum9
        else (lambda i, _same: safe_call_id(i, 40)))
    tool_names = bool(compat(model, "requiresToolResultName", False))
    for message in history:
        if isinstance(message, m.ToolResultMessage):
            shown = [b for b in message.content if isinstance(b, m.ImageContent)] if images else []
            text = joined_text(message.content)
            tool_message = {"role": "tool", "tool_call_id": message.toolCallId,
                            "content": text or (SEE_IMAGE if shown else "")}
            if tool_names:
                tool_message["name"] = message.toolName
            messages.append(tool_message)
            tool_images.extend(shown)
            continue
        flush_tool_images()
        if isinstance(message, m.UserMessage):
            if (content := _user_content(message.content, images)) is not None:
                messages.append({"role": "user", "content": content})
        elif (assistant := _assistant_message(message)) is not None:
            messages.append(assistant)
    flush_tool_images()

    body: Json = {"model": model.id, "messages": messages, "stream": True}
    if compat(model, "supportsUsageInStreaming", True):
        body["stream_options"] = {"include_usage": True}
    if (limit := output_limit(model, opts)) is not None:
        body[str(compat(model, "maxTokensField", "max_completion_tokens"))] = limit
    if opts.temperature is not None:
        body["temperature"] = opts.temperature
    if opts.service_tier:
        body["service_tier"] = opts.service_tier
    effort = openai_effort(model, opts.thinking)
    thinking_format = compat(model, "thinkingFormat", None)
    if thinking_format == "openrouter":
        if effort is not None:
            body["reasoning"] = {"effort": effort}
    elif thinking_format == "zai":
        if model.reasoning:
            body["thinking"] = {"type": "enabled" if effort is not None else "disabled"}
    elif effort is not None and compat(model, "supportsReasoningEffort", True):
        body["reasoning_effort"] = effort
    if call.context.tools:
        body["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}}
            for t in call.context.tools]
        if opts.tool_choice:
            body["tool_choice"] = {"type": "function", "function": {"name": opts.tool_choice}}
    return body


def _image_part(image: m.ImageContent) -> Json:
    url: Json = {"url": data_url(image)}
    if image.detail in ("auto", "low", "high"):
        url["detail"] = image.detail
    return {"type": "image_url", "image_url": url}


def _user_content(content: str | list[m.UserContent], images: bool) -> str | list[Json] | None:
    if isinstance(content, str):
        return content
    parts: list[Json] = []
    for block in content:
        if isinstance(block, m.TextContent):
            parts.append({"type": "text", "text": block.text})
        elif images:
            parts.append(_image_part(block))
    if not parts:
        return None  # only images, for a text-only model
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)  # the form every compatible server takes
    return parts


def _assistant_message(message: m.AssistantMessage) -> Json | None:
    text = "".join(b.text for b in message.content if isinstance(b, m.TextContent))
    calls = [{"id": b.id, "type": "function",
              "function": {"name": b.name, "arguments": msgspec.json.encode(b.arguments).decode()}}
             for b in message.content if isinstance(b, m.ToolCall)]
    if not text.strip() and not calls:
        return None
    out: Json = {"role": "assistant", "content": text or None}
    # After transform_messages only this model's thinking is left: replay it in its field.
    thinking = [b for b in message.content
                if isinstance(b, m.ThinkingContent) and b.thinking.strip()]
    field = thinking[0].thinkingSignature if thinking else None
    if isinstance(field, str) and field in REASONING_FIELDS:
        out[field] = "\n".join(b.thinking for b in thinking)
    if calls:
        out["tool_calls"] = calls
    return out


# --- response ---------------------------------------------------------------------------------

_FINISH: dict[str, m.StopReason] = {
    "stop": "stop", "end": "stop", "length": "length", "tool_calls": "toolUse",
    "function_call": "toolUse", "content_filter": "error", "error": "error"}


@attrs.define
class _Blocks:
    """Which block is open: chat completions streams them strictly one after another."""

    out: MessageBuilder
    key: Any = None
    kind: str = ""
    tool_index: Any = None
    tool_id: str = ""
    count: int = 0
    tool_calls: int = 0
    tool_args: list[str] = attrs.field(factory=list)
    """The open call's arguments so far, in pieces (joined only in the rare case below)."""

    def switch(self, kind: str) -> tuple[str, int]:
        self.end()
        self.count += 1
        key = (kind, self.count)
        self.key, self.kind = key, kind
        return key

    def end(self) -> None:
        if self.key is None:
            return
        if self.kind == "toolCall" and not self.tool_id:
            # Some compatible servers send no ids; the agent needs one to pair the result.
            self.out.set_tool(self.key, tool_id=f"call_{uuid.uuid4().hex[:24]}")
        self.out.close(self.key)
        self.key, self.kind, self.tool_index, self.tool_id = None, "", None, ""
        self.tool_args = []

    def text(self, kind: str, delta: str, signature: str | None = None) -> None:
        if self.kind != kind:
            self.out.open(self.switch(kind), "text" if kind == "text" else "thinking",
                          signature=signature)
        self.out.append(self.key, delta)

    def tool(self, delta: Json) -> None:
        index = delta.get("index", 0)
        call_id = delta.get("id") if isinstance(delta.get("id"), str) else ""
        fn = _obj(delta.get("function"))
        name = fn.get("name") if isinstance(fn.get("name"), str) else ""
        # A new call: another index, or (servers that reuse index 0) another id, or (servers
        # that send each call whole, without ids) a name after complete arguments.
        if (self.kind != "toolCall" or index != self.tool_index
                or (call_id and self.tool_id and call_id != self.tool_id)
                or (name and not call_id and _complete_json("".join(self.tool_args)))):
            self.out.open(self.switch("toolCall"), "toolCall",
                          tool_id=call_id or "", tool_name=name or "")
            self.tool_index = index
            self.tool_calls += 1
        elif call_id or name:
            self.out.set_tool(self.key, tool_id=call_id, name=name)
        self.tool_id = self.tool_id or call_id or ""
        args = fn.get("arguments")
        if isinstance(args, dict):  # Ollama: the arguments as an object, not JSON text
            args = msgspec.json.encode(args).decode()
        if isinstance(args, str) and args:
            self.tool_args.append(args)
            self.out.append(self.key, args)


def _complete_json(text: str) -> bool:
    """``text`` is a whole JSON object already (so more arguments cannot belong to it)."""
    if not text.rstrip().endswith("}"):
        return False
    try:
        return isinstance(msgspec.json.decode(text), dict)
    except msgspec.DecodeError:
        return False


async def stream_openai_completions(call: ModelRequest, out: MessageBuilder,
                                    http: httpx.AsyncClient) -> None:
    """Stream one chat-completions call into ``out``.

    Raises ProviderError for an error status, an in-stream error, a refused or failed finish,
    and a stream that ends before its finish. On cancellation the HTTP response is closed and
    ``Cancelled`` propagates.
    """
    model, opts = call.model, call.options
    body = build_request(call)
    blocks = _Blocks(out)
    finished = done = False
    async with post_stream(call, http, endpoint(model, "/chat/completions"),
                           msgspec.json.encode(body), request_headers(call)) as response:
        out.start()
        async with contextlib.aclosing(iter_sse(
                response, first_timeout=opts.first_event_timeout,
                idle_timeout=opts.idle_timeout, provider=model.provider,
                model=model.id, pace=out.pace, max_event_bytes=opts.max_event_bytes,
                max_response_bytes=opts.max_response_bytes)) as events:
            async for event in events:
                if event.data.strip() == "[DONE]":
                    done = True
                    await drain(events)
                    break
                chunk = read_chunk(event.data, call)
                if chunk is None:
                    continue
                if chunk.error is not None:
                    raise stream_error(chunk.error, call, fallback="Provider stream error")
                if isinstance(chunk.id, str) and out.response_id is None:
                    out.set_response_id(chunk.id)
                choice = chunk.choices[0] if chunk.choices else None
                usage = (chunk.usage or (choice.usage if choice is not None else None)
                         or _obj(chunk.x_groq).get("usage"))
                if isinstance(usage, dict):
                    _set_usage(out, usage)
                if choice is None:
                    continue
                if (delta := choice.delta) is not None:
                    if isinstance(content := delta.content, str) and content:
                        blocks.text("text", content)
                    if delta.reasoning_content or delta.reasoning or delta.reasoning_text:
                        for field in REASONING_FIELDS:
                            if isinstance(thought := getattr(delta, field), str) and thought:
                                blocks.text("thinking", thought, signature=field)
                                break
                    if isinstance(delta.tool_calls, list):
                        for tool_delta in delta.tool_calls:
                            if isinstance(tool_delta, dict):
                                blocks.tool(tool_delta)
                if isinstance(reason := choice.finish_reason, str) and reason:
                    finished = True
                    reason = reason.lower()
                    stop = _FINISH.get(reason, "stop")
                    if stop == "stop" and blocks.tool_calls:
                        stop = "toolUse"  # servers that say "stop" after calls
                    out.set_stop(stop, "Provider finish_reason: content_filter"
                                 if reason == "content_filter" else
                                 "Provider returned error finish_reason" if reason == "error"
                                 else None)
    if not (done or finished):
        raise early_end(call)  # like any failure: the open block stays as it was cut
    blocks.end()
    if out.stop_reason == "error":
        # Raised here rather than left to ModelCall, which would call every such end a
        # (retryable) server error: a content filter answers the same way on a retry.
        raise ProviderError(
            kind="bad_request" if "content_filter" in (out.error_message or "") else "server",
            message=out.error_message or "Provider returned an error",
            provider=model.provider, model=model.id)


def _set_usage(out: MessageBuilder, usage: Json) -> None:
    prompt = _int(usage.get("prompt_tokens"))
    cached = (_int(_obj(usage.get("prompt_tokens_details")).get("cached_tokens"))
              or _int(usage.get("prompt_cache_hit_tokens")))
    reasoning = _obj(usage.get("completion_tokens_details")).get("reasoning_tokens")
    out.set_usage(input=max(0, prompt - cached), output=_int(usage.get("completion_tokens")),
                  cache_read=cached,
                  reasoning=reasoning if isinstance(reasoning, int) else None)
