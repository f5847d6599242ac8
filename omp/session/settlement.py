"""Settlement: how every input a host can wait on ends, decided in one place.

The rules (docs/design/protocol.md#prompt_result, docs/design/protocol.md#one-terminal-agent_end,
docs/design/protocol.md#session_settled; docs/protocol/index.md states them for hosts):

* Every accepted ``prompt`` and ``abort_and_prompt`` holds a ``Ticket`` and gets exactly one
  ``prompt_result``; ``steer`` and ``follow_up`` never do (as in the original): their
  response is their answer. A prompt that reached the agent is served
  by the run that took its message in (or by the run bound to it: ``/retry``, the run an
  extension command started); one handled without the model (a built-in slash command, an
  extension command that started no run) reports ``agentInvoked: false`` when it is done. A
  command that failed (its response said ``success: false``) has no ticket: that response is
  its end.
* An extension command's ticket is bound to the first run started on its behalf (the command
  says so when it starts one; a background result or a resumed steer starting meanwhile is not
  its run). It reports once the command has returned *and* that run has ended.
* A stretch of activity begins when a run or a background job starts. When a run ends the
  session writes, in this order: the one terminal ``agent_end`` (``isTerminal: false`` while
  background work is pending, which resumes the session later), the ``prompt_result`` of every
  ticket it served, pi's ``agent_settled`` unless the next run starts at once (the resume
  rule), then ``session_settled`` once nothing is left: no run, nothing queued, no background
  job. A stretch that is over is announced once.
* ``clear_queue`` answers the tickets of the prompts it took out of the queue ``aborted``.
* The resume rule: after a run that was aborted (or never started), a queued steer starts the
  next run at once (docs/design/protocol.md#abort); a background result that arrived after the run's
  last step boundary starts the next run too.
* A session change (``new_session``, ``switch_session``, ``open_session``, ``branch``) and the
  session's close answer every open ticket ``aborted``.

``Settlement`` does no I/O and never waits: each method takes the facts it needs, updates the
state and returns the frames to publish, in order (the way httpcore's connection pool
recomputes its state in one method and returns the I/O to do). Its owner
(``omp.session.coordinator.RunCoordinator``) publishes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..agent.loop import Input
from ..protocol import messages as m
from ..protocol.commands import RequestId
from ..protocol.events import AgentEnd, AgentSettled, PromptError, PromptResult, SessionSettled
from .sink import Published

if TYPE_CHECKING:
    from .run import RunReport

Status = Literal["completed", "aborted", "error"]
Frames = list[Published]


class Ticket(msgspec.Struct, eq=False):
    """An accepted input awaiting its one ``prompt_result``."""

    request_id: RequestId | None
    message: Input | None = None
    """The message it queued or started with: the run that takes it in serves the ticket."""
    run: object | None = None
    """The run bound to it (``/retry``, an extension command's first run)."""
    command_running: bool = False
    """An extension command still running: the ticket reports once it has returned."""
    ended: tuple[Status, Any, bool] | None = None
    """Its run's outcome (status, error, settled), once that run ended while the command
    still ran."""


class Activity(msgspec.Struct, frozen=True):
    """What the session is doing, as far as settling goes (given by the owner; a record, so
    a Struct: cheap to define at startup)."""

    running: bool
    """A run is scheduled or going."""
    queued: int
    """Steering and follow-up messages waiting."""
    jobs: int
    """Background jobs running."""

    @property
    def settled(self) -> bool:
        return not self.running and not self.queued and not self.jobs


class Settlement(msgspec.Struct, eq=False):
    """The open tickets and the stretch of activity of one session."""

    tickets: list[Ticket] = msgspec.field(default_factory=list)
    active: bool = False
    """A stretch of activity has begun and its ``session_settled`` is not written yet."""

    def accept(self, ticket: Ticket) -> None:
        self.tickets.append(ticket)

    def begin(self) -> None:
        """A run or a background job starts."""
        self.active = True

    def bind(self, ticket: Ticket, run: object) -> None:
        """``run`` was started on behalf of ``ticket`` (its first run only)."""
        if ticket.run is None and ticket in self.tickets:
            ticket.run = run

    def resumes(self, report: RunReport | None, *, steering: bool, undelivered: bool,
                closing: bool) -> bool:
        """Whether the next run starts right after this one (the resume rule)."""
        if closing:
            return False
        aborted = report is None or report.outcome == "aborted"
        return (aborted and steering) or undelivered

    def run_ended(self, run: object, prompts: list[Input], report: RunReport | None, *,
                  after: Activity, resume: bool, awaiting: bool) -> Frames:
        """A run's terminal frames: ``agent_end`` (none when it never started), the
        ``prompt_result`` of each ticket it served, ``session_settled`` when settled.
        ``after`` is the activity once the run is over (not counting a resume); ``awaiting``:
        background work will resume the session."""
        frames: Frames = []
        if report is not None:
            # isStreaming is already false when a host sees the terminal agent_end
            # (docs/design/protocol.md#one-terminal-agent_end).
            frames.append(AgentEnd(messages=report.messages, isTerminal=not awaiting,
                                   awaitingAsyncWork=True if awaiting else msgspec.UNSET))
        taken = {id(msg) for msg in (report.taken if report is not None else prompts)}
        served = [t for t in self.tickets if id(t.message) in taken or t.run is run]
        settled = after.settled and not resume
        status, error = outcome(report)
        for ticket in served:
            if ticket.command_running:
                ticket.ended = (status, error, settled)  # reported when the command returns
                continue
            self.tickets.remove(ticket)
            frames.append(PromptResult(id=ticket.request_id, agentInvoked=True, status=status,
                                       sessionSettled=settled, error=error))
        if not resume:
            # pi's end of the work: no run follows by itself (background jobs may start one
            # later; it ends with its own agent_settled).
            frames.append(AgentSettled(aborted=status == "aborted"))
        frames += self.settle(after, resume=resume)
        return frames

    def command_ended(self, ticket: Ticket, succeeded: bool, *, now: Activity,
                      name: str) -> Frames:
        """An extension command returned: its ``prompt_result`` now, unless the run it
        started is still going (then that run's end reports it)."""
        ticket.command_running = False
        if ticket not in self.tickets:
            return []
        if ticket.run is None:
            self.tickets.remove(ticket)
            return [PromptResult(
                id=ticket.request_id, agentInvoked=False,
                status="completed" if succeeded else "error", sessionSettled=now.settled,
                error=msgspec.UNSET if succeeded else PromptError(
                    message=f"Extension command /{name} failed", retryable=False))]
        if ticket.ended is None:
            return []  # its run goes on: run_ended reports the ticket
        self.tickets.remove(ticket)
        status, error, settled = ticket.ended
        return [PromptResult(id=ticket.request_id, agentInvoked=True, status=status,
                             sessionSettled=settled, error=error)]

    def local(self, request_id: RequestId | None, now: Activity) -> Frames:
        """An input handled without the model (a built-in slash command): its one
        ``prompt_result`` at once."""
        return [PromptResult(id=request_id, agentInvoked=False, status="completed",
                             sessionSettled=now.settled)]

    def dropped(self, messages: list[Input]) -> Frames:
        """Queued messages taken out of the queue (``clear_queue``): the tickets they held are
        answered ``aborted`` (no run will take them in; the run going on settles the stretch)."""
        gone = {id(x) for x in messages}
        frames: Frames = []
        for ticket in [t for t in self.tickets if t.message is not None
                       and id(t.message) in gone]:
            self.tickets.remove(ticket)
            frames.append(PromptResult(id=ticket.request_id, agentInvoked=False,
                                       status="aborted", sessionSettled=False))
        return frames

    def abort_all(self, now: Activity, *, closing: bool = False) -> Frames:
        """A session change or the close: every open ticket is answered ``aborted`` (tickets
        of an extension command still running included), then the stretch settles if it can;
        at the close it is over whatever is left queued (nothing will run it)."""
        frames: Frames = [PromptResult(id=t.request_id, agentInvoked=True, status="aborted",
                                       sessionSettled=True) for t in self.tickets]
        self.tickets.clear()
        if closing and self.active:
            self.active = False
            return [*frames, SessionSettled()]
        return frames + self.settle(now)

    def settle(self, now: Activity, *, resume: bool = False) -> Frames:
        """``session_settled`` when a stretch of activity is over."""
        if self.active and now.settled and not resume:
            self.active = False
            return [SessionSettled()]
        return []


def outcome(report: RunReport | None) -> tuple[Status, Any]:
    """``prompt_result``'s status and error for a run's report (None: never started)."""
    if report is None or report.outcome == "aborted":
        return "aborted", msgspec.UNSET
    if report.outcome == "completed":
        return "completed", msgspec.UNSET
    if report.failure is not None:
        return "error", PromptError(message=report.failure, retryable=False)
    last, problem = report.last, report.error
    return "error", PromptError(
        message=(last.errorMessage if last is not None and last.errorMessage
                 else "The model call failed"),
        retryable=problem.retryable if problem else False,
        provider=last.provider if last is not None else msgspec.UNSET,
        model=last.model if last is not None else msgspec.UNSET,
        httpStatus=problem.http_status if problem and problem.http_status else msgspec.UNSET)


def is_async_result(message: m.AgentMessage, custom_type: str) -> bool:
    return isinstance(message, m.CustomMessage) and message.customType == custom_type
