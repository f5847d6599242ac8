"""The session a host drives.

The part of AgentSession that needs no agent loop yet: the model and thinking level a run will
use, the queue modes that later steer the loop, and the todo list. The run and the session file
attach here in later work. ``omp.rpc`` reads and changes the session only through this class; the
session never writes frames: it publishes events to its listeners.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import msgspec

from ..llm import thinking
from ..llm.models import ModelRegistry
from ..llm.types import ThinkingLevel
from ..protocol.commands import InterruptMode, QueueMode, TodoPhase
from ..protocol.events import SessionEvent, ThinkingLevelChanged
from ..protocol.payloads import Model

Listener = Callable[[msgspec.Struct], None]


class SessionError(Exception):
    """A request the session refuses; the message is meant for the host as it is."""


@attrs.define(eq=False)
class AgentSession:
    registry: ModelRegistry
    model: Model
    configured_thinking: ThinkingLevel = "off"
    """What the host asked for; the model may support less (see ``thinking_level``)."""
    # Defaults of the original (rpc-protocol "Queue defaults").
    steering_mode: QueueMode = "one-at-a-time"
    follow_up_mode: QueueMode = "one-at-a-time"
    interrupt_mode: InterruptMode = "immediate"
    todo_phases: list[TodoPhase] = attrs.field(factory=list)
    _listeners: list[Listener] = attrs.field(factory=list)

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` with every session event, in order (it must not block)."""
        self._listeners.append(listener)

    def _publish(self, event: SessionEvent) -> None:
        for listener in self._listeners:
            listener(event)

    # -- run state (the agent loop fills these in) -------------------------------------------

    @property
    def is_streaming(self) -> bool:
        """True while a run is going on; no run can start before the agent loop exists."""
        return False

    @property
    def is_compacting(self) -> bool:
        return False

    @property
    def message_count(self) -> int:
        return 0

    @property
    def queued_message_count(self) -> int:
        return 0

    # -- todos -------------------------------------------------------------------------------

    def set_todos(self, phases: list[TodoPhase]) -> list[TodoPhase]:
        """Replace the todo list; phases and tasks keep the ids the host gave them."""
        self.todo_phases = list(phases)
        return self.todo_phases

    # -- model and thinking ------------------------------------------------------------------

    @property
    def thinking_level(self) -> ThinkingLevel:
        """The effective level: the configured one clamped to what the model supports."""
        return thinking.clamp(self.model, self.configured_thinking)

    def set_model(self, provider: str, model_id: str) -> Model:
        """Switch models (the next model call uses it); the thinking level is re-clamped."""
        model = self.registry.find(provider, model_id)
        if model is None:
            raise SessionError(f"Model not found: {provider}/{model_id}")
        if not self.registry.has_credentials(provider):
            raise SessionError(f"No API key for {provider}/{model_id}: "
                               f"{self.registry.missing_key_hint(provider)}")
        self._switch(model)
        return model

    def cycle_model(self) -> Model | None:
        """The next available model (wrapping); ``None`` when there is no other one."""
        candidates = self.registry.available()
        if len(candidates) < 2:
            return None
        keys = [(m.provider, m.id) for m in candidates]
        current = (self.model.provider, self.model.id)
        index = keys.index(current) + 1 if current in keys else 0
        model = candidates[index % len(candidates)]
        self._switch(model)
        return model

    def _switch(self, model: Model) -> None:
        before = self.thinking_level
        self.model = model
        if self.thinking_level != before:
            self._announce_thinking()

    def set_thinking_level(self, level: ThinkingLevel) -> ThinkingLevel:
        """Ask for ``level``; returns the effective (clamped) level."""
        before = self.thinking_level
        self.configured_thinking = level
        if self.thinking_level != before:
            self._announce_thinking()
        return self.thinking_level

    def cycle_thinking_level(self) -> ThinkingLevel | None:
        """The next level the model supports; ``None`` for a model without reasoning."""
        level = thinking.cycle(self.model, self.thinking_level)
        if level is not None:
            self.set_thinking_level(level)
        return level

    def available_thinking_levels(self) -> list[ThinkingLevel]:
        return thinking.available_levels(self.model)

    def _announce_thinking(self) -> None:
        level = self.thinking_level
        self._publish(ThinkingLevelChanged(
            thinkingLevel=level if self.model.reasoning else msgspec.UNSET,
            configured=self.configured_thinking, resolved=level))
