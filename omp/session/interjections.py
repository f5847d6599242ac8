"""What a run changes in the live context between two attempts (``omp.session.run``): a failed
attempt's last turn taken out, TTSR rules put in after a cut (``omp.session.rules``), a todo
reminder put in after an attempt that left tasks open (``omp.session.reminders``).

The messages put in are hidden: they go into the context and the session file, with no message
frames (the host hears ``ttsr_triggered`` / ``todo_reminder`` instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from ..agent.loop import Agent, RunResult
from ..protocol import messages as m
from .reminders import TodoReminders
from .sink import Published

if TYPE_CHECKING:
    # The rules machinery loads with the first rules folder (omp.lazy).
    from .rules import RuleWatch


class Interjections(msgspec.Struct, eq=False):
    agent: Agent
    publish: Callable[[Published], None]
    record: Callable[[m.AgentMessage], None]
    """Append a message to the live context and the session file (no frames)."""
    reminders: TodoReminders
    rules: RuleWatch | None = None
    """The TTSR rules watching the model calls (``use_rules``); None: none."""

    def use_rules(self, watch: RuleWatch | None) -> None:
        """TTSR rules watch every later model call (None: none)."""
        self.rules = watch
        self.agent.use_watch(watch)

    def drop_failed_turn(self, failed: m.AssistantMessage) -> None:
        """Remove a failed attempt's last turn from the live context (the file keeps it)."""
        messages = self.agent.messages
        if any(msg is failed for msg in messages):
            index = max(i for i, msg in enumerate(messages) if msg is failed)
            del messages[index:]  # its synthetic "not executed" tool results go with it

    def inject_rules(self, result: RunResult) -> bool:
        """After an attempt: whether TTSR rules were injected (the attempt was cut by one), so
        that another attempt follows. (A rule that matched without cutting came in as a
        follow-up of the same attempt.)"""
        watch = self.rules
        if watch is None or result.cut is None:
            return False
        from .rules import Interrupt  # loaded already: ``watch`` is one of its objects

        interrupt = result.cut
        assert isinstance(interrupt, Interrupt)
        if watch.settings.contextMode == "discard" and result.last is not None:
            self.drop_failed_turn(result.last)  # the cut message leaves the context
        self.record(watch.injection(interrupt))
        return True

    def remind_todos(self, last: m.AssistantMessage | None) -> bool:
        """After a completed attempt: whether a todo reminder was written (its event
        published, its hidden message in the context), so that another attempt follows."""
        if self.agent.stop_requested:
            return False
        due = self.reminders.due(last)
        if due is None:
            return False
        event, message = due
        self.publish(event)
        self.record(message)
        return True
