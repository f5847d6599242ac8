"""``transformMessages`` (docs/design/agent-loop.md#history-normalisation): the history as a given
model may see it.

Every adapter applies it before building its request body.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import msgspec

from ..protocol import messages as m
from ..protocol.payloads import Model
from .types import LlmMessage

NO_RESULT = "No result provided"


def same_model(message: m.AssistantMessage, model: Model) -> bool:
    """Whether ``message`` was written by ``model`` (its signatures are valid for it)."""
    return (message.provider == model.provider and message.api == model.api
            and message.model == model.id)


def transform_messages(messages: Sequence[LlmMessage], model: Model, *,
                       normalize_id: Callable[[str, bool], str] | None = None,
                       max_id_length: int = 64) -> list[LlmMessage]:
    """Normalise a history for ``model`` before it is sent.

    * error turns are dropped; aborted turns are kept only when they hold text, and their
      signatures are not trusted (the stream was cut: they are treated as another model's);
    * another model's thinking becomes text (empty thinking, redacted thinking, text and
      thought signatures are dropped); the same model's is kept verbatim;
    * tool-call ids go through ``normalize_id(id, same_model)``, kept unique within
      ``max_id_length``, and their results follow;
    * a tool call without a result before the next user/assistant message (or the end) gets a
      synthetic error result, and a result without its call is dropped (providers reject both).
    """
    out: list[LlmMessage] = []
    pending: dict[str, str] = {}  # tool call id -> name, awaiting a result
    renamed: dict[str, str] = {}
    taken: set[str] = set()

    def new_id(old: str, same: bool) -> str:
        if normalize_id is None:
            return old
        if old not in renamed:
            candidate = base = normalize_id(old, same)
            n = 1
            while candidate in taken:
                n += 1
                suffix = f"_{n}"
                candidate = base[: max_id_length - len(suffix)] + suffix
            renamed[old] = candidate
            taken.add(candidate)
        return renamed[old]

    def repair() -> None:
        for call_id, name in pending.items():
            out.append(m.ToolResultMessage(
                toolCallId=call_id, toolName=name, content=[m.TextContent(text=NO_RESULT)],
                isError=True, timestamp=int(time.time() * 1000)))
        pending.clear()

    for message in messages:
        if isinstance(message, m.ToolResultMessage):
            call_id = renamed.get(message.toolCallId, message.toolCallId)
            if pending.pop(call_id, None) is None:
                continue  # its call is not in the history we send
            if call_id != message.toolCallId:
                message = msgspec.structs.replace(message, toolCallId=call_id)
            out.append(message)
            continue
        repair()
        if isinstance(message, m.UserMessage):
            out.append(message)
            continue
        if message.stopReason == "error":
            continue
        if message.stopReason == "aborted" and not any(
                isinstance(b, m.TextContent) and b.text.strip() for b in message.content):
            continue
        same = same_model(message, model) and message.stopReason != "aborted"
        content: list[m.AssistantContent] = []
        for block in message.content:
            if isinstance(block, m.ThinkingContent) and not same:
                if block.thinking.strip():
                    content.append(m.TextContent(text=block.thinking))
            elif isinstance(block, m.RedactedThinkingContent):
                if same:
                    content.append(block)
            elif isinstance(block, m.TextContent) and not same:
                content.append(m.TextContent(text=block.text))
            elif isinstance(block, m.ToolCall):
                call_id = new_id(block.id, same)
                pending[call_id] = block.name
                if call_id != block.id or not same:
                    block = msgspec.structs.replace(
                        block, id=call_id,
                        thoughtSignature=block.thoughtSignature if same else msgspec.UNSET)
                content.append(block)
            else:
                content.append(block)
        out.append(msgspec.structs.replace(message, content=content))
    repair()
    return out
