"""The outbox: how a session's events and every other frame become output frames.

One ``Outbox`` per ``serve()``: it stamps ``messageId``\\ s
(docs/design/protocol.md#message-ids-and-the-event-filter: a stack of open message ids, one counter
per server), applies the host's ``set_event_filter`` (which session event types, and
``message_update`` as the message snapshot or the delta only) and queues the frame on the
server's ``Output`` (the queue to the writer) without waiting. It is the session's
``EventSink``: its ``pace`` is the queue, on which the streaming producers wait while the host
is far behind. Frames that end something never wait.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..agent.loop import AssistantUpdate
from ..llm.builder import Pace
from ..protocol import events as ev
from ..protocol.events import SESSION_EVENT_TYPES
from ..session.sink import Published, Update
from .output import Output


class EventView(msgspec.Struct, eq=False):
    """How the host wants session events (``set_event_filter``)."""

    types: frozenset[str] | None = None
    """Session event types to send; None: all."""
    message_updates: str = "snapshot"


class Outbox(msgspec.Struct, eq=False):
    output: Output
    view: EventView = msgspec.field(default_factory=EventView)
    message_ids: bool = True
    """Stamp ``messageId`` on message frames (rpc; ``--mode json`` writes them as the original)."""
    discard: bool = False
    """Nobody reads the frames (``omp -p``): drop them instead of queueing them."""
    aside: Callable[[msgspec.Struct], None] | None = None
    """Sees every frame emitted here, also when they are discarded (``omp -p`` prints the
    ``command_output`` of a slash command this way)."""
    _open_ids: list[str] = msgspec.field(default_factory=list)
    _counter: int = 0

    def use_view(self, view: EventView) -> None:
        """Session events emitted from now on go through ``view`` (``set_event_filter``)."""
        self.view = view

    def emit(self, frame: msgspec.Struct) -> None:
        """Queue a frame the host did not ask for (side frames, session events); never waits.

        Session events go through the host's ``set_event_filter``; other frames never do.
        """
        if self.aside is not None:
            self.aside(frame)
        if not self.discard and (out := self._frame(frame)) is not None:
            self.output.put_nowait(out)

    def publish(self, event: Published) -> None:
        self.emit(event)

    def publish_update(self, event: Update) -> None:
        """A streaming update is queued like any frame (never waiting) ..."""
        self.emit(event)

    @property
    def pace(self) -> Pace:
        """... and its producer waits on the output queue while the host is far behind."""
        return self.output

    def _frame(self, event: Any) -> msgspec.Struct | None:
        """The frame for an event: messageId stamped, filter and update mode applied.

        Ids are assigned even to frames the filter drops, so they do not depend on it.
        """
        view = self.view
        if isinstance(event, AssistantUpdate):
            mid: str | msgspec.UnsetType = msgspec.UNSET
            if self.message_ids:
                mid = self._open_ids[-1] if self._open_ids else self._new_id(push=True)
            if view.types is not None and "message_update" not in view.types:
                return None
            return message_update_frame(event, view.message_updates, mid)
        tag = event.__struct_config__.tag
        if self.message_ids:
            event = self._stamp(event, tag)
        allowed = view.types
        if allowed is not None and tag in SESSION_EVENT_TYPES and tag not in allowed:
            return None
        return event  # type: ignore[no-any-return]

    def _stamp(self, event: Any, tag: object) -> Any:
        if tag == "message_start":
            return msgspec.structs.replace(event, messageId=self._new_id(push=True))
        if tag == "message_end":
            mid = self._open_ids.pop() if self._open_ids else self._new_id()
            return msgspec.structs.replace(event, messageId=mid)
        if tag == "agent_end":
            self._open_ids.clear()
        return event

    def _new_id(self, *, push: bool = False) -> str:
        self._counter += 1
        mid = f"msg-{self._counter}"
        if push:
            self._open_ids.append(mid)
        return mid


def message_update_frame(update: AssistantUpdate, mode: str,
                         message_id: str | msgspec.UnsetType = msgspec.UNSET
                         ) -> ev.MessageUpdate | ev.MessageUpdateDelta:
    """The ``message_update`` frame of a streaming update: with the message snapshot
    (``mode`` ``"snapshot"``, the protocol's default) or the delta only (``"delta"``, which keeps
    an answer's frames linear in its length). The one conversion for rpc and ``--mode json``."""
    stream_event = update.event
    if mode == "delta":
        kind = stream_event.type
        # ``done`` and ``error`` end a stream with ``message_end``; no update carries them.
        assert kind != "done", kind
        assert kind != "error", kind
        return ev.MessageUpdateDelta(messageId=message_id, assistantMessageEvent=ev.DeltaEvent(
            type=kind, contentIndex=stream_event.content_index,
            delta=stream_event.delta if stream_event.type.endswith("_delta") else msgspec.UNSET,
            content=stream_event.content if stream_event.type in ("text_end", "thinking_end")
            else msgspec.UNSET,
            toolCall=stream_event.tool_call or msgspec.UNSET))
    wire = stream_event.to_wire()
    return ev.MessageUpdate(assistantMessageEvent=wire,  # type: ignore[arg-type]
                            message=stream_event.partial, messageId=message_id)
