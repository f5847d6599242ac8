"""The partial assistant message of one model call, and the events that describe its growth.

Providers (``omp.llm.providers.*``) only speak their wire format: they turn SSE into calls on a
``MessageBuilder`` (open a block, append a delta, close it, set usage and stop reason). The
builder keeps the partial message and emits ``StreamEvent``s
(docs/design/agent-loop.md#stream-events).

The partial message is mutable inside the builder and snapshotted lazily: an event's ``partial``
is built (and cached) only when someone asks for it, so a consumer that only needs deltas pays
nothing per delta for the growing message.

The message has a bound (``max_chars``, ``stream.maxMessageChars``): a delta that would take it
past raises the ``bad_response`` ProviderError and is not kept.

Emitting is synchronous: an event is handed to ``emit`` and nothing waits per event (a provider
streams one per token). A consumer that must slow the stream down (a host reading slowly) does
so through its ``Pace``: the provider's reader (``iter_sse``) awaits ``pace.wait_if_behind()``
before each network read, and between events only while ``pace.behind()`` says the consumer is far
behind (a read can hold hundreds of events, and in snapshot mode each becomes a frame with the
whole message so far).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

import msgspec
import trio

from ..protocol import messages as m
from ..protocol.payloads import Model
from .errors import stream_over_limit

EventType = Literal[
    "start", "text_start", "text_delta", "text_end", "thinking_start", "thinking_delta",
    "thinking_end", "toolcall_start", "toolcall_delta", "toolcall_end", "done", "error",
]
Emit = Callable[["StreamEvent"], None]
"""Takes one event; must not wait (backpressure belongs to ``Pace``)."""


def discard(event: StreamEvent) -> None:
    """The ``Emit`` of a caller that wants only the final message (summaries, titles)."""


class Pace(Protocol):
    """The consumer's backpressure (a host reading slowly)."""

    def behind(self) -> bool:
        """Whether the consumer is far behind now; checked after every event, so it is cheap."""

    async def wait_if_behind(self) -> None:
        """Wait while the consumer is far behind, and only then. Not a checkpoint, unlike
        trio's own async calls (the name says so): when there is nothing to wait for it raises
        ``Cancelled`` if cancelled but does not yield, since the producer's next await (its
        network read) yields anyway. A yield here too measurably cost latency: bench_many at
        30,000 deltas/s, p99 104-146 ms instead of 24-30 (four interleaved pairs). On
        cancellation it stops waiting."""


class NoPace:
    """The ``Pace`` of a consumer that never pushes back. ``wait_if_behind`` is a cancellation
    point that does not yield: the stream's own reads do."""

    __slots__ = ()

    def behind(self) -> bool:
        return False

    async def wait_if_behind(self) -> None:
        """Never waits. On cancellation (already requested when it is called) it raises
        ``Cancelled`` without yielding; otherwise it returns at once."""
        await trio.lowlevel.checkpoint_if_cancelled()


NO_PACE = NoPace()
"""Stateless, so one serves every consumer that never pushes back."""


class StreamEvent:
    """One event of a model call; ``partial`` is the message so far, snapshotted on demand."""

    __slots__ = ("_builder", "_partial", "content", "content_index", "delta", "message",
                 "reason", "tool_call", "type")

    def __init__(self, type: EventType, builder: MessageBuilder, *, content_index: int = -1,
                 delta: str = "", content: str = "", tool_call: m.ToolCall | None = None,
                 message: m.AssistantMessage | None = None, reason: str = "") -> None:
        self.type = type
        self._builder = builder
        self._partial: m.AssistantMessage | None = None
        self.content_index = content_index
        self.delta = delta
        self.content = content
        self.tool_call = tool_call
        self.message = message
        self.reason = reason

    @property
    def partial(self) -> m.AssistantMessage:
        """The message as it was when this event was emitted (built on first access)."""
        if self._partial is None:
            self._partial = self.message or self._builder.snapshot()
        return self._partial

    def freeze(self) -> None:
        """Take the snapshot now (call before the builder moves on if it will be needed)."""
        _ = self.partial

    @property
    def tool_name(self) -> str:
        """The name of the tool call this ``toolcall_*`` event belongs to, as known so far
        (no snapshot taken)."""
        return self._builder.tool_identity(self.content_index)[1]

    @property
    def tool_call_id(self) -> str:
        """The id of the tool call this ``toolcall_*`` event belongs to, as known so far."""
        return self._builder.tool_identity(self.content_index)[0]

    def to_wire(self) -> m.AssistantMessageEvent:
        """The protocol's ``AssistantMessageEvent`` (with its ``partial`` snapshot)."""
        i, p = self.content_index, self.partial
        t = self.type
        if t == "start":
            return m.AssistantStartEvent(partial=p)
        if t == "text_start":
            return m.TextStartEvent(contentIndex=i, partial=p)
        if t == "text_delta":
            return m.TextDeltaEvent(contentIndex=i, delta=self.delta, partial=p)
        if t == "text_end":
            return m.TextEndEvent(contentIndex=i, content=self.content, partial=p)
        if t == "thinking_start":
            return m.ThinkingStartEvent(contentIndex=i, partial=p)
        if t == "thinking_delta":
            return m.ThinkingDeltaEvent(contentIndex=i, delta=self.delta, partial=p)
        if t == "thinking_end":
            return m.ThinkingEndEvent(contentIndex=i, content=self.content, partial=p)
        if t == "toolcall_start":
            return m.ToolCallStartEvent(contentIndex=i, partial=p)
        if t == "toolcall_delta":
            return m.ToolCallDeltaEvent(contentIndex=i, delta=self.delta, partial=p)
        if t == "toolcall_end":
            assert self.tool_call is not None
            return m.ToolCallEndEvent(contentIndex=i, toolCall=self.tool_call, partial=p)
        assert self.message is not None
        if t == "done":
            return m.AssistantDoneEvent(reason=self.reason, message=self.message)  # type: ignore[arg-type]
        return m.AssistantErrorEvent(reason=self.reason, error=self.message)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"StreamEvent({self.type!r}, index={self.content_index}, delta={self.delta!r})"


class _Block(msgspec.Struct, eq=False):
    kind: Literal["text", "thinking", "redactedThinking", "toolCall"]
    parts: list[str] = msgspec.field(default_factory=list)
    signature: str | None = None
    """text: textSignature; thinking: thinkingSignature (appended in pieces for Anthropic)."""
    tool_id: str = ""
    tool_name: str = ""
    thought_signature: str | None = None
    closed: bool = False
    final: m.AssistantContent | None = None

    def text(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def build(self) -> m.AssistantContent:
        if self.final is not None:
            return self.final
        if self.kind == "text":
            return m.TextContent(text=self.text(), textSignature=_or_unset(self.signature))
        if self.kind == "thinking":
            return m.ThinkingContent(thinking=self.text(),
                                     thinkingSignature=_or_unset(self.signature))
        if self.kind == "redactedThinking":
            return m.RedactedThinkingContent(data=self.text())
        return m.ToolCall(id=self.tool_id, name=self.tool_name,
                          arguments=parse_partial_json(self.text()),
                          thoughtSignature=_or_unset(self.thought_signature))


_DELTA_EVENT: dict[str, EventType | None] = {
    "text": "text_delta", "thinking": "thinking_delta", "toolCall": "toolcall_delta",
    "redactedThinking": None}
"""A block's kind → the event its deltas emit (none for redacted thinking)."""


def _or_unset(value: str | float | None) -> Any:
    return msgspec.UNSET if value is None else value


class MessageBuilder(msgspec.Struct, eq=False):
    """The partial assistant message, and the events that describe its growth.

    Blocks are addressed by a provider-chosen ``key`` (Anthropic's ``index``, a tool call's
    index...), mapped to positions in ``content``.
    """

    model: Model
    emit: Emit
    pace: Pace = NO_PACE
    """The consumer's backpressure; providers pass it to ``iter_sse``."""
    max_chars: int = sys.maxsize
    """The most characters of text, thinking, tool arguments and signatures the message may
    hold (``stream.maxMessageChars``); a delta past it raises the ``bad_response``
    ProviderError and is not kept."""
    usage: m.Usage = msgspec.field(default_factory=m.Usage.zero)
    stop_reason: m.StopReason = "stop"
    error_message: str | None = None
    response_id: str | None = None
    timestamp: int = msgspec.field(default_factory=lambda: int(time.time() * 1000))
    started: bool = False
    _blocks: list[_Block] = msgspec.field(default_factory=list)
    _keys: dict[Any, int] = msgspec.field(default_factory=dict)
    _snapshot: m.AssistantMessage | None = None
    _t0: float = msgspec.field(default_factory=time.monotonic)
    _chars: int = 0
    _ttft: float | None = None
    _duration: float | None = None
    _completed_at: int | None = None
    """Epoch milliseconds when the stream ended (the original's ``completedAt``)."""

    # -- blocks ------------------------------------------------------------------------------

    def start(self) -> None:
        """The request was accepted (response headers arrived)."""
        if not self.started:
            self.started = True
            self.emit(StreamEvent("start", self))

    def index_of(self, key: Any) -> int | None:
        return self._keys.get(key)

    def tool_identity(self, index: int) -> tuple[str, str]:
        """(id, name) of the tool call block at ``index`` (empty when unknown or not one)."""
        if not 0 <= index < len(self._blocks):
            return "", ""
        block = self._blocks[index]
        return block.tool_id, block.tool_name

    def is_open(self, key: Any) -> bool:
        i = self._keys.get(key)
        return i is not None and not self._blocks[i].closed

    def open(self, key: Any, kind: Literal["text", "thinking", "redactedThinking", "toolCall"],
             *, tool_id: str = "", tool_name: str = "", signature: str | None = None) -> int:
        """Append a new block under ``key`` and emit its ``*_start``."""
        self.start()
        if self._ttft is None:
            self._ttft = time.monotonic() - self._t0
        self._keys[key] = index = len(self._blocks)
        self._blocks.append(_Block(kind, tool_id=tool_id, tool_name=tool_name,
                                   signature=signature))
        self._snapshot = None
        if kind == "toolCall":
            self.emit(StreamEvent("toolcall_start", self, content_index=index))
        elif kind == "redactedThinking":
            pass  # redacted thinking has no events of its own; it ends up in the message
        else:
            self.emit(StreamEvent(f"{kind}_start", self, content_index=index))  # type: ignore[arg-type]
        return index

    def append(self, key: Any, delta: str) -> None:
        """Add text / thinking / tool-argument JSON to the block under ``key``."""
        index = self._keys[key]
        block = self._blocks[index]
        if block.closed:
            raise RuntimeError(f"provider bug: delta for block {index} after it was closed")
        self._grow(len(delta))
        block.parts.append(delta)
        self._snapshot = None
        if (event := _DELTA_EVENT[block.kind]) is not None:
            self.emit(StreamEvent(event, self, content_index=index, delta=delta))

    def set_signature(self, key: Any, signature: str, *, append: bool = False) -> None:
        block = self._blocks[self._keys[key]]
        self._grow(len(signature) - (0 if append else len(block.signature or "")))
        block.signature = (block.signature or "") + signature if append else signature
        self._snapshot = None

    def set_tool(self, key: Any, *, tool_id: str | None = None, name: str | None = None,
                 arguments_json: str | None = None, thought_signature: str | None = None
                 ) -> None:
        """Fill in what a tool call's later deltas carry (ids, names, the final arguments)."""
        block = self._blocks[self._keys[key]]
        if tool_id:
            block.tool_id = tool_id
        if name:
            block.tool_name = name
        if arguments_json is not None:
            self._grow(len(arguments_json) - sum(map(len, block.parts)))
            block.parts[:] = [arguments_json]
        if thought_signature is not None:
            block.thought_signature = thought_signature
        self._snapshot = None

    def _grow(self, chars: int) -> None:
        """Count ``chars`` more characters; raises the ProviderError of a message over
        ``max_chars`` (nothing is counted then)."""
        if self._chars + chars > self.max_chars:
            raise stream_over_limit(f"a message of more than {self.max_chars} characters",
                                    "maxMessageChars", self.model.provider, self.model.id)
        self._chars += chars

    def close(self, key: Any) -> None:
        """End the block under ``key`` (emits ``*_end`` with the block's final content)."""
        index = self._keys[key]
        block = self._blocks[index]
        if block.closed:
            return
        block.closed = True
        self._snapshot = None
        if block.kind == "toolCall":
            call = block.build()
            block.final = call
            assert isinstance(call, m.ToolCall)
            self.emit(StreamEvent("toolcall_end", self, content_index=index, tool_call=call))
        elif block.kind in ("text", "thinking"):
            self.emit(StreamEvent(f"{block.kind}_end", self,  # type: ignore[arg-type]
                                  content_index=index, content=block.text()))

    def close_all(self) -> None:
        for key, index in list(self._keys.items()):
            if not self._blocks[index].closed:
                self.close(key)

    @property
    def has_tool_calls(self) -> bool:
        return any(b.kind == "toolCall" for b in self._blocks)

    # -- usage and result --------------------------------------------------------------------

    def set_usage(self, *, input: int | None = None, output: int | None = None,
                  cache_read: int | None = None, cache_write: int | None = None,
                  total: int | None = None, reasoning: int | None = None) -> None:
        """Update the counts given (others keep their value) and recompute the cost."""
        u = self.usage
        inp = u.input if input is None else input
        out = u.output if output is None else output
        cr = u.cacheRead if cache_read is None else cache_read
        cw = u.cacheWrite if cache_write is None else cache_write
        c = self.model.cost
        cost = m.UsageCost(input=c.input * inp / 1e6, output=c.output * out / 1e6,
                           cacheRead=c.cacheRead * cr / 1e6, cacheWrite=c.cacheWrite * cw / 1e6,
                           total=(c.input * inp + c.output * out + c.cacheRead * cr
                                  + c.cacheWrite * cw) / 1e6)
        self.usage = m.Usage(
            input=inp, output=out, cacheRead=cr, cacheWrite=cw,
            totalTokens=total if total is not None else inp + out + cr + cw, cost=cost,
            reasoningTokens=reasoning if reasoning is not None else u.reasoningTokens)
        self._snapshot = None

    def set_stop(self, reason: m.StopReason, error: str | None = None) -> None:
        """How the answer ended, as the provider said (``error``: its words when the reason is
        a failure); ``finish`` may still override it (an abort, a failed stream)."""
        self.stop_reason = reason
        if error is not None:
            self.error_message = error
        self._snapshot = None

    def set_response_id(self, response_id: str) -> None:
        """The provider's id of this answer."""
        self.response_id = response_id
        self._snapshot = None

    def snapshot(self) -> m.AssistantMessage:
        if self._snapshot is None:
            self._snapshot = m.AssistantMessage(
                content=[b.build() for b in self._blocks],
                api=self.model.api, provider=self.model.provider, model=self.model.id,
                usage=self.usage, stopReason=self.stop_reason, timestamp=self.timestamp,
                errorMessage=_or_unset(self.error_message),
                responseId=_or_unset(self.response_id),
                duration=_or_unset(self._duration),
                ttft=round(self._ttft * 1000, 1) if self._ttft is not None else msgspec.UNSET,
                completedAt=_or_unset(self._completed_at),
            )
        return self._snapshot

    def finish(self, stop_reason: m.StopReason, error: str | None = None,
               status: int | None = None) -> m.AssistantMessage:
        """The final message: the stream is over (done, failed or aborted)."""
        self._duration = round((time.monotonic() - self._t0) * 1000, 1)
        self._completed_at = int(time.time() * 1000)
        self.stop_reason = stop_reason
        self.error_message = error
        self._snapshot = None
        message = self.snapshot()
        if status is not None:
            message = msgspec.structs.replace(message, errorStatus=status)
        return message


def parse_partial_json(text: str) -> dict[str, Any]:
    """Best-effort arguments from a JSON prefix: closes open strings and brackets; ``{}`` if no
    object can be made of it (docs/design/agent-loop.md#stream-events)."""
    if not text:
        return {}
    try:
        value = msgspec.json.decode(text)
    except msgspec.DecodeError:
        try:
            value = _close_json(text)
        except RecursionError:
            return {}
    except RecursionError:
        # Nested deeper than a decoder goes: no tool takes such arguments (validation says so).
        return {}
    return value if isinstance(value, dict) else {}


def _close_json(text: str) -> Any:
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    candidate = text
    if in_string:
        candidate += "\\" if escaped else ""
        candidate = candidate[:-1] if escaped else candidate
        candidate += '"'
    # Drop a dangling key or separator the closers cannot complete.
    for attempt in (candidate, candidate.rstrip().rstrip(",:").rstrip()):
        for trim in (attempt, _drop_last_key(attempt)):
            try:
                return msgspec.json.decode(trim + "".join(reversed(stack)))
            except msgspec.DecodeError:
                continue
    return {}


def _drop_last_key(text: str) -> str:
    body = text.rstrip()
    if body.endswith('"'):
        cut = body.rfind(",")
        brace = body.rfind("{")
        pos = max(cut, brace)
        if pos >= 0:
            return body[: pos + (1 if body[pos] == "{" else 0)]
    return body
