"""The run coordinator: a session's runs, their tickets and settlement, its background jobs.

Who owns what:

* ``RunCoordinator.serve`` owns the session nursery. Each run (``omp.session.run.Run``: the
  saga and its cancel scope) is driven by one task in it, and at most one run exists at a time;
  background jobs (``omp.session.jobs``: detached subagents, commands moved to the background,
  their delivery) are tasks in it too, each in a scope of its own that a session change or the
  close cancels (a plain ``abort`` does not), and both wait for them to return. A job starts
  there (``start_job``), or is handed over by a tool call (``hand_off``: started under the call
  with ``nursery.start``, it becomes a job when it reports ``started``).
* A run's scope is registered in the ``AbortRegistry`` synchronously, by the call that accepts
  the work (a host's prompt brings the scope the RPC reader registered for it when it read the
  line), so an ``abort`` read right after the prompt finds it. A run whose scope was cancelled
  before it started writes nothing but its ``prompt_result`` (``aborted``).
* ``Settlement`` decides what ends: after a run the coordinator publishes the frames it returns
  (``agent_end``, ``prompt_result``\\ s, ``session_settled``), and resumes with a new run when
  the resume rule says so. Nothing else publishes those frames.

Cancellation: ``abort`` cancels the run and waits until its terminal frames are out; ``aclose``
aborts with the shutdown reason, answers every open ticket and stops ``run_nursery``. Cancelled
from outside, ``run_nursery`` takes its tasks down with it (no terminal frames).
"""

from __future__ import annotations

import contextlib
import contextvars
import random
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

import msgspec
import trio

from ..agent.loop import ABORT_REASON, Agent, Input, now_ms
from ..protocol import messages as m
from ..protocol.commands import RequestId
from .aborts import AbortRegistry
from .errors import SessionError
from .settlement import Activity, Settlement, Ticket

if TYPE_CHECKING:
    from ..tools.shell import ShellResult  # annotation only: omp.lazy says why
    from .run import Run, RunHost  # Run: loaded with the first run (omp.lazy)
from .sink import Published

ASYNC_RESULT = "async-result"
"""``customType`` of the message that delivers background job results (``omp.session.jobs``)."""
SHUTDOWN_REASON = "Request was aborted"
"""The aborted message's ``errorMessage`` when the session closes
(docs/design/protocol.md#end-of-input)."""
BUSY = ("Agent is already processing. Use steer() or followUp() to queue messages, or wait for "
        "completion.")

_COMMAND: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar(
    "omp_command_ticket", default=None)
"""The ticket of the extension command the current task runs (``command``): the first run it
starts is bound to it. A context variable because the command reaches the session through the
extension API, which knows nothing of tickets; trio gives each task its own context, so a run
started meanwhile by another task (a background result, a resumed steer) is never taken for
the command's."""

T = TypeVar("T")
Publish = Callable[[Published], None]
AgentEndHook = Callable[[list[m.AgentMessage]], Awaitable[None]]


JOBS_EXIT_SECONDS = 5.0
"""How long ``close`` and a session change wait for the background jobs they cancelled to
return (a child ends its session, a command its process group: each step has a deadline of
its own)."""


class RunCoordinator(msgspec.Struct, eq=False):
    agent: Agent
    host: RunHost
    """What a run needs from its session (compaction, settings, the publish path)."""
    publish: Publish
    aborts: AbortRegistry
    record: Callable[[m.AgentMessage], None]
    """Adds a message to the live context and the session file (idle only)."""
    agent_end_hook: Callable[[], AgentEndHook | None]
    """The extensions' ``agent_end`` handler when one listens (looked up per run)."""
    written: Callable[[], Awaitable[None]]
    """Waits until the session file has every line appended so far (``SessionStore``)."""
    rng: random.Random = msgspec.field(default_factory=random.Random)
    settlement: Settlement = msgspec.field(default_factory=Settlement)
    job_epoch: int = 0
    """Bumped whenever the background jobs are cancelled (a session change, ``close``): what
    belonged to an older epoch is dropped."""
    _nursery: trio.Nursery | None = None
    _run: Run | None = None
    """The run scheduled or going; None when idle."""
    _jobs: dict[int, trio.CancelScope] = msgspec.field(default_factory=dict)
    _job_counter: int = 0
    _job_tasks: int = 0
    """Job tasks not yet returned, cancelled ones included (``close`` waits for them)."""
    _no_job_tasks: trio.Event = msgspec.field(default_factory=trio.Event)
    _deferred: list[m.AgentMessage] = msgspec.field(default_factory=list)
    _closing: bool = False
    expired: str | None = None
    """Why no run may go on any more (``--max-time``: ``Deadline exceeded``); None until then."""

    # -- state -------------------------------------------------------------------------------

    @property
    def run(self) -> Run | None:
        return self._run

    @property
    def activity(self) -> Activity:
        return Activity(running=self._run is not None, queued=self.agent.queued_count,
                        jobs=len(self._jobs))

    @property
    def settled(self) -> bool:
        return self.activity.settled

    def _publish_all(self, frames: list[Published]) -> None:
        for frame in frames:
            self.publish(frame)

    # -- the session nursery -----------------------------------------------------------------

    async def run_nursery(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Own the session nursery (runs and jobs live in it) until ``aclose()``.

        On cancellation the current run is cancelled with the nursery (no terminal frames)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def aclose(self) -> None:
        """Abort the run (its terminal events are still published), wait for the background
        jobs it cancelled to return (at most ``JOBS_EXIT_SECONDS``), answer every open ticket,
        wait for the session file's last lines, and stop ``run_nursery``. On cancellation the
        nursery is torn down without waiting (the file's writer thread still writes what it
        holds)."""
        self._closing = True
        self.cancel_jobs()
        await self.abort(SHUTDOWN_REASON)
        # The cancelled jobs still write their ends (a child's terminal lifecycle frame):
        # before the output closes behind this, not into it after.
        await self._jobs_ended()
        self._publish_all(self.settlement.abort_all(self.activity, closing=True))
        await self.written()  # its last lines, before the exit status is known
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # -- accepting work ----------------------------------------------------------------------

    def prompt(self, message: Input, *, streaming_behavior: str | None = None,
               request_id: RequestId | None = None,
               scope: trio.CancelScope | None = None) -> None:
        """Accept a host's prompt: start a run, or queue it while one is going (steering or
        follow-up as ``streaming_behavior`` says). Raises SessionError (nothing accepted) when
        busy without ``streaming_behavior``. Exactly one ``prompt_result`` follows. ``scope``
        is the cancel scope registered for it when it was read (family ``run``)."""
        if self._run is not None:
            if streaming_behavior is None:
                raise SessionError(BUSY)
            queue = (self.agent.queue_steering if streaming_behavior == "steer"
                     else self.agent.queue_follow_up)
            queue(message)
        else:
            self.start_run([message], scope=scope)
        self.settlement.accept(Ticket(request_id, message))

    def queue(self, message: Input, *, steer: bool) -> None:
        """``steer`` / ``follow_up``: queued during a run; idle, it starts one. No ticket (as
        in the original, docs/design/protocol.md#prompt_result): the response is their answer, and a
        run they start ends with ``session_settled`` like any other."""
        if self._run is not None:
            (self.agent.queue_steering if steer else self.agent.queue_follow_up)(message)
        else:
            self.start_run([message])

    def clear_queue(self) -> tuple[list[Input], list[Input]]:
        """``clear_queue``: take the queued steering and follow-up messages out; a prompt that
        queued one gets its ``prompt_result`` (``aborted``) now. Returns them."""
        steering, follow_ups = self.agent.take_queued()
        self._publish_all(self.settlement.dropped([*steering, *follow_ups]))
        return steering, follow_ups

    def deliver(self, message: Input, *, trigger_turn: bool, follow_up: bool) -> None:
        """A message from an extension: queued during a run; idle, it starts a run
        (``trigger_turn``) or is just added to the context. No ticket: no host asked."""
        if self._run is not None:
            (self.agent.queue_follow_up if follow_up else self.agent.queue_steering)(message)
        elif trigger_turn:
            self.start_run([message])
        else:
            self.record(message)

    def deliver_async_result(self, message: m.CustomMessage) -> None:
        """A background job's result for the model (docs/design/subagents.md#background-results):
        during a run it joins at the next step boundary without interrupting tool calls in flight;
        idle, it starts a run (no ticket: no host asked)."""
        if self._closing:
            return
        if self._run is not None:
            self.agent.queue_aside(message)  # joins at the next boundary, interrupts nothing
        elif self._nursery is not None:
            self.start_run([message])

    def record_bash(self, result: ShellResult, *, exclude_from_context: bool = False) -> None:
        """An RPC ``bash`` command's record: into the context now when idle, before the next
        run while one streams (a run's context must not change under it). Excluded, it is
        kept in the session and never sent to the model."""
        cancelled = result.cancelled or result.timed_out
        message = m.BashExecutionMessage(
            command=result.command, output=result.output,
            exitCode=msgspec.UNSET if cancelled or result.exit_code is None
            else result.exit_code,
            cancelled=cancelled, truncated=result.truncation.truncated, timestamp=now_ms(),
            excludeFromContext=exclude_from_context)
        if self._run is not None:
            self._deferred.append(message)
        else:
            self.record(message)

    def retry(self, request_id: RequestId | None) -> bool:
        """``/retry``: run the last turn again when it failed (an error, not an abort); False
        when there is nothing to retry. Its ticket is bound to the run."""
        messages = self.agent.messages
        last = messages[-1] if messages else None
        if self._run is not None or not (isinstance(last, m.AssistantMessage)
                                         and last.stopReason == "error"):
            return False
        self.host.between.drop_failed_turn(last)
        run = self.start_run([])
        self.settlement.accept(Ticket(request_id, None, run))
        return True

    def local(self, request_id: RequestId | None) -> None:
        """A prompt handled without the model: its ``prompt_result`` now."""
        self._publish_all(self.settlement.local(request_id, self.activity))

    def open_command(self, request_id: RequestId | None) -> Ticket:
        """The ticket of an extension command, opened when the command is accepted."""
        ticket = Ticket(request_id, command_running=True)
        self.settlement.accept(ticket)
        return ticket

    @contextlib.contextmanager
    def running_command(self, ticket: Ticket) -> Iterator[None]:
        """For the ``with`` block in which the command's handler runs (in its own task): the
        first run it starts is bound to ``ticket``. Then ``command_ended``."""
        token = _COMMAND.set(ticket)
        try:
            yield
        finally:
            _COMMAND.reset(token)

    def command_ended(self, ticket: Ticket, succeeded: bool, name: str) -> None:
        self._publish_all(self.settlement.command_ended(ticket, succeeded, now=self.activity,
                                                        name=name))

    # -- runs --------------------------------------------------------------------------------

    def start_run(self, prompts: list[Input], *, scope: trio.CancelScope | None = None) -> Run:
        """Start a run now (the caller checked that none is going). Its scope (``scope``, or a
        new one) is registered before this returns."""
        if self._nursery is None or self._closing:
            raise SessionError("The session is closed")
        # RPC bash records made while the last run streamed enter the context now.
        for message in self._deferred:
            self.record(message)
        self._deferred.clear()
        from .run import Run  # lazy: omp.lazy says why

        run = Run(self.host, prompts, self.rng, aborts=self.aborts,
                  scope=scope if scope is not None else trio.CancelScope())
        if self.expired is not None:
            run.abort(self.expired)  # it never starts: its prompts end ``aborted``
        self.aborts.hold("run", run.scope, done=run.done)
        self.aborts.hold("run", run.tail)
        self._run = run
        self.settlement.begin()
        if (ticket := _COMMAND.get()) is not None:
            self.settlement.bind(ticket, run)
        self._nursery.start_soon(self._drive, run)
        return run

    async def _drive(self, run: Run) -> None:
        """The run's task: the saga, then its terminal frames (none when it never started)."""
        try:
            report = await run.execute()
            hook = self.agent_end_hook()
            with run.tail:
                # The run's frames do not wait for the session file: its writer thread writes
                # behind them (docs/design/sessions.md#safe-on-disk).
                if report is not None and hook is not None:
                    # Extensions hear of the run's end before the host does
                    # (docs/design/extending.md#how-handlers-run).
                    await hook(report.messages)
        finally:
            self.aborts.release(run.scope)
            self.aborts.release(run.tail)
        self._run = None
        # A background result that arrived after the run's last step boundary is still queued:
        # it starts the next run (docs/design/subagents.md#background-results).
        undelivered = not self._closing and any(
            isinstance(x, m.CustomMessage) and x.customType == ASYNC_RESULT
            for x in self.agent.steering)
        resume = self.settlement.resumes(report, steering=bool(self.agent.steering),
                                         undelivered=undelivered, closing=self._closing)
        self._publish_all(self.settlement.run_ended(
            run, run.prompts, report, after=self.activity, resume=resume,
            awaiting=undelivered or bool(self._jobs)))
        run.done.set()
        if resume:
            self.start_run([])

    async def abort(self, reason: str = ABORT_REASON) -> None:
        """Abort the run and wait until its terminal frames are out. Returns at once when
        idle. On cancellation, stops waiting (the abort still happens)."""
        run = self._run
        if run is None:
            return
        run.abort(reason)
        await run.done.wait()

    def abort_nowait(self) -> None:
        """Abort the run without waiting for it (``ctx.abort()``)."""
        if self._run is not None:
            self._run.abort(ABORT_REASON)

    def abort_for_good(self, reason: str) -> None:
        """No run may go on any more (``--max-time``): the one going is aborted with ``reason``
        (without waiting), any later one ends before it starts."""
        self.expired = reason
        if self._run is not None:
            self._run.abort(reason)

    def end_after_turn(self) -> None:
        """End the run once the current turn's tool calls are done (a subagent's terminal
        ``yield``): no further model call, nothing aborted (``Agent.stop_requested``)."""
        if self._run is not None:
            self.agent.request_stop()

    async def wait_for_idle(self) -> None:
        """Wait until no run is going. On cancellation, stops waiting."""
        while (run := self._run) is not None:
            await run.done.wait()

    async def abort_all(self) -> None:
        """Stop whatever runs and empty the queues (before a session change): prompts still
        waiting for their result are answered ``aborted``; background jobs are cancelled, their
        results dropped, and waited for (at most ``JOBS_EXIT_SECONDS``). On cancellation,
        stops waiting."""
        self.cancel_jobs()
        await self.abort()
        # Their processes are gone before the new session starts (docs/internals.md#who-owns-what).
        await self._jobs_ended()
        self.agent.clear_queues()
        self._deferred.clear()
        self._publish_all(self.settlement.abort_all(self.activity))

    def settle(self) -> None:
        """After a change that may end a stretch of activity (a branch)."""
        if not self._closing:
            self._publish_all(self.settlement.settle(self.activity))

    # -- background jobs (omp.session.jobs) -------------------------------------------------

    @property
    def accepting_jobs(self) -> bool:
        """Whether work can still become a job (not once the session closes)."""
        return self._nursery is not None and not self._closing

    def start_job(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as a background job in the session nursery. A plain ``abort`` does not
        stop it; a session change and ``aclose`` cancel it (``cancel_jobs``). While any job runs
        the session is not settled. ``work`` must not raise (it reports its own failures).
        Raises SessionError when the session is closed."""
        if self._nursery is None or self._closing:
            raise SessionError("The session is closed")
        self._job_counter += 1
        key = self._job_counter
        scope = self._jobs[key] = trio.CancelScope()
        self.settlement.begin()
        self._nursery.start_soon(self._run_job, key, scope, work)

    async def _run_job(self, key: int, scope: trio.CancelScope,
                       work: Callable[[], Awaitable[None]]) -> None:
        with self._job_task(key, scope), scope:
            await work()

    async def hand_off(self, work: Callable[[trio.TaskStatus[T], Callable[[], None]],
                                            Awaitable[None]]) -> T:
        """Run ``work`` in the session nursery, but under the caller until it calls
        ``task_status.started(value)``; returns ``value``. Before that, ``work`` may call the
        second argument, ``promote()``: from then on it is a background job as ``start_job``
        makes them (trio reparents the task at ``started``). ``work`` must not raise once
        promoted. Raises SessionError when the session is closed.

        On cancellation before ``started``, ``work`` is cancelled with the caller and
        ``Cancelled`` propagates; afterwards the caller's cancellation does not reach it."""
        if self._nursery is None or self._closing:
            raise SessionError("The session is closed")
        self._job_counter += 1
        result: T = await self._nursery.start(self._run_handed, self._job_counter,
                                              trio.CancelScope(), work)
        return result

    async def _run_handed(self, key: int, scope: trio.CancelScope,
                          work: Callable[[trio.TaskStatus[T], Callable[[], None]],
                                         Awaitable[None]],
                          *, task_status: trio.TaskStatus[T]) -> None:
        def promote() -> None:
            self._jobs[key] = scope
            self.settlement.begin()

        with self._job_task(key, scope), scope:
            await work(task_status, promote)

    @contextlib.contextmanager
    def _job_task(self, key: int, scope: trio.CancelScope) -> Iterator[None]:
        """Counts a job task while it runs (``close`` waits for them); at its end a job the
        session still knows (not cancelled by ``cancel_jobs``) is forgotten."""
        if self._job_tasks == 0:
            self._no_job_tasks = trio.Event()
        self._job_tasks += 1
        try:
            yield
        finally:
            self._job_tasks -= 1
            if self._job_tasks == 0:
                self._no_job_tasks.set()
            # Cancelled by ``cancel_jobs``, the job is already forgotten; otherwise it ends
            # here (also a handed-off one whose caller was cancelled as it became a job).
            ended = self._jobs.get(key) is scope
            if ended:
                del self._jobs[key]
        if ended:
            self.settle()

    async def _jobs_ended(self) -> None:
        """Wait (at most ``JOBS_EXIT_SECONDS``) until every job task has returned: after
        ``cancel_jobs`` and an abort, until the cancelled ones have cleaned up. On
        cancellation, stops waiting."""
        if self._job_tasks:
            with trio.move_on_after(JOBS_EXIT_SECONDS):
                await self._no_job_tasks.wait()

    def cancel_jobs(self) -> None:
        """Cancel every background job now (a session change, ``close``): whatever they
        would have delivered is dropped."""
        self.job_epoch += 1
        for scope in self._jobs.values():
            scope.cancel()
        self._jobs.clear()
