"""OpenAI Responses (``POST {baseUrl}/responses``), docs/design/agent-loop.md#provider-adapters.

Stateless (``store: false``): every request carries the whole history, the model's own
reasoning items included (replayed from ``thinkingSignature``, which holds the item as JSON with
its ``encrypted_content``). A tool call's id is ``"{call_id}|{item_id}"``; results answer the
``call_id`` half.

Cancellation: the HTTP response is closed on the way out and ``Cancelled`` propagates;
``ModelCall`` records the aborted message.
"""

from __future__ import annotations

import contextlib
from typing import Any

import attrs
import httpx
import msgspec

from ...protocol import messages as m
from .. import errors
from ..builder import MessageBuilder
from ..errors import ProviderError
from ..http import drain, post_stream
from ..sse import iter_sse
from ..thinking import openai_effort
from ..transform import transform_messages
from ..types import ModelRequest
from . import output_limit
from .openai_completions import (
    SEE_IMAGE,
    TOOL_IMAGES_NOTE,
    Json,
    compat,
    data_url,
    decode_chunk,
    early_end,
    endpoint,
    joined_text,
    request_headers,
    safe_call_id,
)

_STATUS: dict[str, m.StopReason] = {
    "completed": "stop", "incomplete": "length", "failed": "error", "cancelled": "error",
    "in_progress": "stop", "queued": "stop"}
_TERMINAL = ("response.completed", "response.incomplete", "response.done")


# --- request ----------------------------------------------------------------------------------


def _normalize_id(call_id: str, same: bool) -> str:
    # The item half only means something to the model that made it (and without its
    # reasoning item the API rejects it); other providers' ids may hold any character.
    if same and "|" in call_id:
        return call_id
    return safe_call_id(call_id, 64)


def build_request(call: ModelRequest) -> Json:
    model, opts = call.model, call.options
    images = "image" in model.input
    items: list[Json] = []
    tool_images: list[m.ImageContent] = []

    def flush_tool_images() -> None:
        if tool_images:
            items.append({"role": "user", "content": [
                {"type": "input_text", "text": TOOL_IMAGES_NOTE},
                *map(_image_part, tool_images)]})
            tool_images.clear()

    for message in transform_messages(call.context.messages, model, normalize_id=_normalize_id):
        if isinstance(message, m.ToolResultMessage):
            shown = [b for b in message.content if isinstance(b, m.ImageContent)] if images else []
            text = joined_text(message.content)
            items.append({"type": "function_call_output",
                          "call_id": message.toolCallId.partition("|")[0],
                          "output": text or (SEE_IMAGE if shown else "")})
            tool_images.extend(shown)
            continue
        flush_tool_images()
        if isinstance(message, m.UserMessage):
            content = _user_content(message.content, images)
            if content:
                items.append({"role": "user", "content": content})
        else:
            items.extend(_assistant_items(message))
    flush_tool_images()

    body: Json = {"model": model.id, "input": items, "stream": True, "store": False}
    if call.context.system_prompt:
        body["instructions"] = "\n\n".join(call.context.system_prompt)
    if (limit := output_limit(model, opts)) is not None:
        body["max_output_tokens"] = limit
    if opts.temperature is not None:
        body["temperature"] = opts.temperature
    if opts.session_id:
        body["prompt_cache_key"] = opts.session_id
    if opts.service_tier:
        body["service_tier"] = opts.service_tier
    effort = openai_effort(model, opts.thinking)
    # A model that always reasons and refuses the field (xAI's grok-4) is sent none.
    if effort is not None and compat(model, "supportsReasoningEffort", True):
        body["reasoning"] = {"effort": effort, "summary": "auto"}
        body["include"] = ["reasoning.encrypted_content"]
    if call.context.tools:
        body["tools"] = [{"type": "function", "name": t.name, "description": t.description,
                          "parameters": t.parameters} for t in call.context.tools]
        if call.options.tool_choice:
            body["tool_choice"] = {"type": "function", "name": call.options.tool_choice}
    return body


def _image_part(image: m.ImageContent) -> Json:
    detail = image.detail if image.detail in ("auto", "low", "high") else "auto"
    return {"type": "input_image", "detail": detail, "image_url": data_url(image)}


def _user_content(content: str | list[m.UserContent], images: bool) -> list[Json]:
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}] if content else []
    parts: list[Json] = []
    for block in content:
        if isinstance(block, m.TextContent):
            parts.append({"type": "input_text", "text": block.text})
        elif images:
            parts.append(_image_part(block))
    return parts


def _assistant_items(message: m.AssistantMessage) -> list[Json]:
    items: list[Json] = []
    for block in message.content:
        if isinstance(block, m.ThinkingContent):
            # transform_messages left only this model's thinking; without its item there is
            # nothing the API accepts as a reasoning input.
            if isinstance(block.thinkingSignature, str):
                with contextlib.suppress(msgspec.DecodeError):
                    reasoning = msgspec.json.decode(block.thinkingSignature)
                    if isinstance(reasoning, dict) and reasoning.get("type") == "reasoning":
                        items.append(reasoning)
        elif isinstance(block, m.TextContent):
            if not block.text:
                continue
            part = {"type": "output_text", "text": block.text, "annotations": []}
            item_id, phase = _text_signature(block.textSignature)
            if item_id is None:
                items.append({"role": "assistant", "content": [part]})
            else:
                item: Json = {"type": "message", "role": "assistant", "content": [part],
                              "status": "completed", "id": item_id}
                if phase is not None:
                    item["phase"] = phase
                items.append(item)
        elif isinstance(block, m.ToolCall):
            call_id, _, item_id = block.id.partition("|")
            call: Json = {"type": "function_call", "call_id": call_id, "name": block.name,
                          "arguments": msgspec.json.encode(block.arguments).decode()}
            if item_id:
                call["id"] = item_id
            items.append(call)
    return items


def _text_signature(signature: Any) -> tuple[str | None, str | None]:
    """``(item id, phase)`` from ``{"v":1,"id":…,"phase"?}`` or a legacy bare id."""
    if not isinstance(signature, str) or not signature:
        return None, None
    if signature.startswith("{"):
        try:
            data = msgspec.json.decode(signature)
        except msgspec.DecodeError:
            return None, None
        if isinstance(data, dict) and isinstance(data.get("id"), str):
            phase = data.get("phase")
            return data["id"], phase if isinstance(phase, str) else None
        return None, None
    return signature, None


# --- response ---------------------------------------------------------------------------------


@attrs.define
class _Items:
    """Output items by id; the Responses stream sends them one after another."""

    out: MessageBuilder
    current: str | None = None
    kinds: dict[str, str] = attrs.field(factory=dict)
    streamed: set[str] = attrs.field(factory=set)
    """Items that received deltas (the others get their text from ``output_item.done``)."""
    parts: dict[str, int] = attrs.field(factory=dict)
    count: int = 0

    def key_of(self, event: Json) -> str | None:
        item_id = event.get("item_id")
        return item_id if isinstance(item_id, str) and item_id in self.kinds else self.current

    def add(self, item: Json) -> None:
        kind = item.get("type")
        if kind not in ("reasoning", "message", "function_call"):
            return  # built-in tool items (web search...) carry nothing we keep
        if self.current is not None:
            self.end(self.current)
        self.count += 1
        key = item["id"] if isinstance(item.get("id"), str) else f"item-{self.count}"
        self.kinds[key] = kind
        self.current = key
        if kind == "reasoning":
            self.out.open(key, "thinking")
        elif kind == "message":
            self.out.open(key, "text")
        else:
            call_id = _str(item.get("call_id")) or key
            tool_id = f"{call_id}|{key}" if isinstance(item.get("id"), str) else call_id
            name = _str(item.get("name"))
            self.out.open(key, "toolCall", tool_id=tool_id, tool_name=name)
            if isinstance(args := item.get("arguments"), str) and args:
                self.delta(key, args)

    def delta(self, key: str | None, text: str, *, kind: str = "") -> None:
        if key is None or not self.out.is_open(key):
            if not kind:
                return
            # A delta without its output_item.added: open an anonymous block for it.
            self.count += 1
            key = f"item-{self.count}"
            self.add({"type": kind, "id": key})
        if text:
            self.streamed.add(key)
            self.out.append(key, text)

    def summary_part(self, key: str | None) -> None:
        # Summary parts are joined by a blank line, sent when the next part begins.
        if key is None or not self.out.is_open(key):
            return
        self.parts[key] = self.parts.get(key, 0) + 1
        if self.parts[key] > 1 and key in self.streamed:
            self.out.append(key, "\n\n")

    def done(self, item: Json) -> None:
        key = item.get("id") if isinstance(item.get("id"), str) else self.current
        if key not in self.kinds:
            return
        kind = self.kinds[key]
        if kind == "reasoning":
            if key not in self.streamed:
                summary = "\n\n".join(
                    s["text"] for s in item.get("summary") or ()
                    if isinstance(s, dict) and isinstance(s.get("text"), str))
                self.delta(key, summary)
            self.out.set_signature(key, msgspec.json.encode(item).decode())
        elif kind == "message":
            if key not in self.streamed:
                text = "".join(
                    c.get("text") or c.get("refusal") or "" for c in item.get("content") or ()
                    if isinstance(c, dict))
                self.delta(key, text)
            if isinstance(item.get("id"), str):  # replayed as this message item
                signature: Json = {"v": 1, "id": item["id"]}
                if isinstance(item.get("phase"), str):
                    signature["phase"] = item["phase"]
                self.out.set_signature(key, msgspec.json.encode(signature).decode())
        elif isinstance(args := item.get("arguments"), str):
            self.out.set_tool(key, arguments_json=args)
        self.end(key)

    def end(self, key: str) -> None:
        if self.out.is_open(key):
            self.out.close(key)
        if self.current == key:
            self.current = None


async def stream_openai_responses(call: ModelRequest, out: MessageBuilder,
                                  http: httpx.AsyncClient) -> None:
    """Stream one Responses call into ``out``.

    Raises ProviderError for an error status, an ``error`` / ``response.failed`` event, a
    failed or cancelled response, and a stream that ends before the response does. On
    cancellation the HTTP response is closed and ``Cancelled`` propagates.
    """
    model, opts = call.model, call.options
    body = build_request(call)
    items = _Items(out)
    finished = False
    async with post_stream(call, http, endpoint(model, "/responses"),
                           msgspec.json.encode(body), request_headers(call)) as response:
        out.start()
        async with contextlib.aclosing(iter_sse(
                response, first_timeout=opts.first_event_timeout,
                idle_timeout=opts.idle_timeout, provider=model.provider,
                model=model.id, pace=out.pace, max_event_bytes=opts.max_event_bytes,
                max_response_bytes=opts.max_response_bytes)) as events:
            async for sse in events:
                if sse.data.strip() == "[DONE]":  # some compatible servers add it
                    await drain(events)
                    break
                event = decode_chunk(sse.data, call)
                if not isinstance(event, dict):
                    continue
                kind = event.get("type") or sse.event
                if kind == "response.created":
                    _response_id(out, event)
                elif kind == "response.output_item.added":
                    if isinstance(item := event.get("item"), dict):
                        items.add(item)
                elif kind == "response.reasoning_summary_part.added":
                    items.summary_part(items.key_of(event))
                elif kind == "response.reasoning_summary_text.delta":
                    items.delta(items.key_of(event), _str(event.get("delta")),
                                kind="reasoning")
                elif kind in ("response.output_text.delta", "response.refusal.delta"):
                    items.delta(items.key_of(event), _str(event.get("delta")),
                                kind="message")
                elif kind == "response.function_call_arguments.delta":
                    items.delta(items.key_of(event), _str(event.get("delta")))
                elif kind == "response.function_call_arguments.done":
                    key = items.key_of(event)
                    if key is not None and isinstance(event.get("arguments"), str):
                        out.set_tool(key, arguments_json=event["arguments"])
                elif kind == "response.output_item.done":
                    if isinstance(item := event.get("item"), dict):
                        items.done(item)
                elif kind in _TERMINAL:
                    finished = True
                    _completed(out, event.get("response"))
                    if out.stop_reason == "error":  # a failed or cancelled status
                        raise _failed(event.get("response"), call)
                elif kind == "response.failed":
                    raise _failed(event.get("response"), call)
                elif kind == "error":
                    raise _error_event(event, call)
    if not finished:
        raise early_end(call)  # like any failure: the open block stays as it was cut
    if items.current is not None:
        items.end(items.current)


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _response_id(out: MessageBuilder, response: Any) -> None:
    response = response.get("response", response) if isinstance(response, dict) else None
    if isinstance(response, dict) and isinstance(response.get("id"), str):
        out.set_response_id(response["id"])


def _completed(out: MessageBuilder, response: Any) -> None:
    if not isinstance(response, dict):
        return
    _response_id(out, response)
    usage = response.get("usage")
    if isinstance(usage, dict):
        cached = _count(_dict(usage.get("input_tokens_details")).get("cached_tokens"))
        reasoning = _dict(usage.get("output_tokens_details")).get("reasoning_tokens")
        total = usage.get("total_tokens")
        out.set_usage(input=max(0, _count(usage.get("input_tokens")) - cached),
                      output=_count(usage.get("output_tokens")), cache_read=cached,
                      total=total if isinstance(total, int) and total > 0 else None,
                      reasoning=reasoning if isinstance(reasoning, int) else None)
    status = response.get("status")
    if isinstance(status, str):
        out.set_stop(_STATUS.get(status, "stop"))


def _failed(response: Any, call: ModelRequest) -> ProviderError:
    # The Responses API's own texts: ``<code>: <message>`` for a failed response.
    response = _dict(response)
    error = _dict(response.get("error"))
    if error:
        code = error.get("code") or error.get("type")
        text = _str(error.get("message")) or "The response failed"
        return _stream_error(f"{code}: {text}" if code else text, code, call)
    reason = _dict(response.get("incomplete_details")).get("reason")
    if reason:
        return _stream_error(f"incomplete: {reason}", None, call)
    status = _str(response.get("status")) or "failed"
    return _stream_error(f"The response {status}", None, call)


def _error_event(event: Json, call: ModelRequest) -> ProviderError:
    # ``{"type":"error","code","message"}``, or the same nested under ``error``; the text is
    # the Responses API's ``Error Code <code>: <message>``.
    error = _dict(event.get("error")) or event
    code = error.get("code") or (error.get("type") if error.get("type") != "error" else None)
    text = _str(error.get("message")) or "Unknown error"
    return _stream_error(f"Error Code {code}: {text}" if code else text, code, call)


def _stream_error(message: str, code: Any, call: ModelRequest) -> ProviderError:
    return errors.from_stream_error(message, call.model.provider, call.model.id,
                                    error_type=str(code) if code else None)


def _dict(value: Any) -> Json:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
