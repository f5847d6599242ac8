"""The session's todo list: one state the ``todo`` tool and the RPC ``set_todos`` share.

Apart from the tool so a session can hold it without importing the tool's implementation.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..protocol.commands import TodoItem, TodoPhase, TodoStatus

OPEN_STATUSES: tuple[TodoStatus, ...] = ("pending", "in_progress", "blocked")


class TodoState(msgspec.Struct, eq=False):
    """The session's todo phases. ``phases`` is replaced, never mutated in place, so a reader
    holding the old list keeps a consistent snapshot."""

    phases: list[TodoPhase] = msgspec.field(default_factory=list)
    version: int = 0
    """Bumped by every ``replace``: whether the list was touched since (todo reminders)."""

    def replace(self, phases: Sequence[TodoPhase]) -> None:
        self.phases = list(phases)
        self.version += 1

    def incomplete(self) -> list[TodoItem]:
        """Tasks still pending, in progress or blocked, in list order."""
        return [task for phase in self.phases for task in phase.tasks
                if task.status in OPEN_STATUSES]
