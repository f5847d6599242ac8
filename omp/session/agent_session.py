"""The session a host drives.

This is the part of AgentSession that needs no agent: the queue modes that later steer the agent
loop, and the todo list. The agent loop, the run and the session file attach here in later work;
``omp.rpc`` reads and changes the session only through this class, and the session never writes
frames.
"""

from __future__ import annotations

import attrs

from ..protocol.commands import InterruptMode, QueueMode, TodoPhase


@attrs.define(eq=False)
class AgentSession:
    # Defaults of the original (rpc-protocol "Queue defaults").
    steering_mode: QueueMode = "one-at-a-time"
    follow_up_mode: QueueMode = "one-at-a-time"
    interrupt_mode: InterruptMode = "immediate"
    todo_phases: list[TodoPhase] = attrs.field(factory=list)

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

    def set_todos(self, phases: list[TodoPhase]) -> list[TodoPhase]:
        """Replace the todo list; phases and tasks keep the ids the host gave them."""
        self.todo_phases = list(phases)
        return self.todo_phases
