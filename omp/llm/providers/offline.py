"""The built-in offline model: deterministic, no network, no account.

It answers from the conversation itself, so hosts can be developed and tested without a key:

* a plain prompt is echoed back: ``Echo: <prompt>``, streamed word by word;
* ``[[tool NAME {"json": "arguments"}]]`` anywhere in the prompt makes it call tool ``NAME`` with
  those arguments (several directives, several calls in one message);
* after tool results it answers ``Tool results:`` and a line per result;
* ``[[slow SECONDS]]`` waits that long before each delta (to try aborts and steering);
* with a thinking level above ``off`` (model ``echo-thinking``) a short thinking block comes first.

Usage counts are estimates (four characters a token); the cost is zero.
"""

from __future__ import annotations

import re

import httpx
import msgspec
import trio

from ...protocol import messages as m
from ..builder import MessageBuilder
from ..thinking import clamp
from ..types import ModelRequest

_TOOL = re.compile(r"\[\[tool\s+([A-Za-z0-9_.:-]+)\s*(\{.*?\})?\s*\]\]", re.DOTALL)
_SLOW = re.compile(r"\[\[slow\s+(\d+(?:\.\d+)?)\s*\]\]")


def _text_of(content: str | list[m.UserContent]) -> str:
    if isinstance(content, str):
        return content
    return "".join(block.text for block in content if isinstance(block, m.TextContent))


def _pieces(text: str, at_least: int = 3) -> list[str]:
    """Word-sized deltas (at least ``at_least`` when the text allows), joining back to ``text``."""
    words = re.findall(r"\S+\s*|\s+", text)
    if len(words) >= at_least or len(text) < at_least:
        return words or [text]
    step = max(1, len(text) // at_least)
    return [text[i:i + step] for i in range(0, len(text), step)]


async def stream_offline(call: ModelRequest, out: MessageBuilder, http: httpx.AsyncClient) -> None:
    """The offline model's reply, computed from ``call.context``; no I/O.

    On cancellation (at the checkpoint before each delta, or in a ``[[slow]]`` wait) it stops
    and ``Cancelled`` propagates; ``out`` keeps what was appended, which ``ModelCall`` ends as
    the aborted message."""
    messages = call.context.messages
    last = messages[-1] if messages else None
    prompt = ""
    for message in reversed(messages):
        if isinstance(message, m.UserMessage):
            prompt = _text_of(message.content)
            break
    slow = _SLOW.search(prompt)
    delay = float(slow.group(1)) if slow else 0.0

    async def pace() -> None:
        # A checkpoint per delta, so cancellation (abort) lands between deltas; and the
        # consumer's backpressure, as a provider waits for it before each network read.
        if delay:
            await trio.sleep(delay)
        else:
            await trio.lowlevel.checkpoint()
        await out.pace.wait_if_behind()

    out.start()
    level = clamp(call.model, call.options.thinking)
    if level != "off" and isinstance(last, m.UserMessage):
        out.open("thinking", "thinking")
        for piece in _pieces(f"Considering the request ({level} effort): {prompt[:80]}"):
            await pace()
            out.append("thinking", piece)
        out.close("thinking")

    calls = _TOOL.findall(prompt) if isinstance(last, m.UserMessage) else []
    if isinstance(last, m.ToolResultMessage):
        results = []
        for message in reversed(messages):
            if not isinstance(message, m.ToolResultMessage):
                break
            text = _text_of(message.content).strip().replace("\n", " ")
            status = "error" if message.isError else "ok"
            results.append(f"- {message.toolName} ({status}): {text[:200]}")
        reply = "Tool results:\n" + "\n".join(reversed(results))
    elif calls:
        reply = "Calling " + ", ".join(name for name, _ in calls) + "."
    else:
        reply = "Echo: " + (_SLOW.sub("", prompt).strip() or "(empty prompt)")

    out.open("text", "text")
    for piece in _pieces(reply):
        await pace()
        out.append("text", piece)
    out.close("text")

    for i, (name, raw_args) in enumerate(calls):
        key = ("tool", i)
        out.open(key, "toolCall", tool_id=f"offline_call_{len(messages)}_{i}", tool_name=name)
        # Sent as given, even when not valid JSON: the agent then reports the bad arguments to
        # the model, as it would for a real model's malformed call.
        args = raw_args or "{}"
        for piece in _pieces(args, at_least=2):
            await pace()
            out.append(key, piece)
        out.close(key)

    context_chars = sum(len(p) for p in call.context.system_prompt) + sum(
        len(_text_of(msg.content)) if isinstance(msg, m.UserMessage | m.ToolResultMessage)
        else len(msgspec.json.encode(msg.content)) for msg in messages)
    out.set_usage(input=max(1, context_chars // 4), output=max(1, len(reply) // 4))
    out.set_stop("toolUse" if calls else "stop")
