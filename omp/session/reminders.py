"""Todo reminders (docs/guides/approval.md#todo-reminders): a run that stops with unfinished todos
goes on.

Rules, in one place:

* When an attempt ends with a normal assistant stop (``stopReason: "stop"``) and the todo list
  has tasks ``pending`` or ``in_progress`` (``blocked``, ``abandoned``, ``completed`` do not
  count), the run saga writes ``todo_reminder {todos, attempt, maxAttempts}``, adds a hidden
  ``developer`` message with the reminder (no ``message_start`` / ``message_end``; persisted;
  the model reads it as a user message) and starts another attempt (a new ``agent_start``, no
  ``agent_end`` in between: one run, one terminal ``agent_end``).
* Not when: ``todo.reminders`` is false, the todo tool is off (``todo.enabled: false``), a
  subagent asked to stop (``yield``), ``todo.remindersMax`` reminders were sent, or the last
  reminder is still "awaiting progress": the list was not touched since (a model that ignores
  a reminder gets exactly one).
* The count starts again when the list has nothing left to do.
* ``todo_auto_clear`` is never written (the original declares it and never writes it either).
"""

from __future__ import annotations

import msgspec

from ..agent.loop import now_ms
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol.commands import TodoItem
from ..tools.todo_state import TodoState
from .settings import TodoReminderSettings

REMINDED: tuple[str, ...] = ("pending", "in_progress")


def reminder_text(todos: TodoState, attempt: int, maximum: int) -> str:
    """The reminder as the original words it: phase headings, then their unfinished tasks."""
    count = 0
    lines: list[str] = []
    for phase in todos.phases:
        tasks = [t for t in phase.tasks if t.status in REMINDED]
        if not tasks:
            continue
        lines.append(f"- {phase.name}")
        lines += [f"  - {t.content}" for t in tasks]
        count += len(tasks)
    body = "\n".join(lines)
    return ("<system-reminder>\n"
            f"You stopped with {count} incomplete todo item(s):\n{body}\n\n"
            "Please continue working on these tasks or mark them complete if finished.\n"
            f"(Reminder {attempt}/{maximum})\n"
            "</system-reminder>")


class TodoReminders(msgspec.Struct, eq=False):
    """One session's reminder count; ``due`` decides, the saga acts on what it returns."""

    todos: TodoState
    settings: TodoReminderSettings
    enabled: bool = True
    """False when the todo tool is off."""
    sent: int = 0
    _touched_at: int | None = None
    """The list's version when the last reminder went out (None: none awaits progress)."""

    def due(self, last: m.AssistantMessage | None
            ) -> tuple[ev.TodoReminder, m.DeveloperMessage] | None:
        """The event and the hidden message of a reminder after an attempt that ended with
        ``last``; None when none is due."""
        open_tasks = [TodoItem(content=t.content, status=t.status)
                      for phase in self.todos.phases for t in phase.tasks
                      if t.status in REMINDED]
        if not open_tasks:
            self.sent, self._touched_at = 0, None
            return None
        if (not (self.enabled and self.settings.enabled) or last is None
                or last.stopReason != "stop" or self.sent >= self.settings.max
                or self._touched_at == self.todos.version):
            return None
        self.sent += 1
        self._touched_at = self.todos.version
        text = reminder_text(self.todos, self.sent, self.settings.max)
        return (ev.TodoReminder(todos=open_tasks, attempt=self.sent,
                                maxAttempts=self.settings.max),
                m.DeveloperMessage(content=text, timestamp=now_ms(), attribution="agent"))
