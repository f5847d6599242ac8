"""A session's background jobs: background subagents and commands moved to the background.

Rules, in one place (docs/design/subagents.md#inline-or-background,
docs/design/subagents.md#background-results, docs/design/subagents.md#abort;
docs/internals.md#who-owns-what, the job nursery):

* A job is a task in the session nursery (``RunCoordinator.start_job``), in a cancel scope of
  its own: a plain ``abort`` leaves it running; a session change (``new_session``, a switch, a
  branch) and the session's ``aclose`` cancel it (``RunCoordinator.cancel_jobs``), and whatever it
  was doing is dropped: a cancelled job delivers nothing, and a command's process group is
  killed on the way out.
* Work becomes a job in one of two ways. ``start``: at once (a background subagent, a command
  with ``async: true``). ``hand_off``: work started under a tool call, inside the call's cancel
  scope, and moved into the session nursery (trio's ``nursery.start``: the task is reparented
  when it says so) once it chooses to leave the call (a command past
  ``bash.autoBackground.thresholdMs``, or when the user steers). Until then it is the call's:
  an ``abort`` of the run ends it like any other part of the call, and it is no job.
* Each job has a row (``Job``) while it runs: ``/jobs`` lists the rows; ``async.maxJobs`` caps
  how many there are at once. Commands are named ``bg_1``, ``bg_2``... in the order they became
  jobs (never reused in a session's life); subagents by their agent id.
* A job that ends (completed or failed) is delivered once: its text waits ``FLUSH_DELAY`` (so
  jobs ending together arrive together) and goes to the model as one ``async-result`` message
  (``RunCoordinator.deliver_async_result``: at the next turn boundary of a run, or a run of its
  own when idle). A text too long for a message is cut to a preview; a job whose whole output
  is kept in a file (a command's) names that file.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

import msgspec
import trio

from ..agent.loop import now_ms
from ..protocol import messages as m
from ..tools.base import HandOff, JobRefused, Settled
from .coordinator import ASYNC_RESULT, RunCoordinator
from .errors import SessionError

if TYPE_CHECKING:
    from .settings import Settings

FLUSH_DELAY = 0.001
"""Seconds between a job settling and its delivery: results settling together are batched."""
DELIVERY_MAX_CHARS = 12_000
"""A job's text longer than this is delivered as a preview."""
DELIVERY_HEAD_CHARS = 4_000
"""The preview of a long text: its first characters..."""
DELIVERY_TAIL_CHARS = 1_000
"""... and, when the whole text is kept in a file, its last ones too (a command's exit code
and notices come last), out of ``DELIVERY_HEAD_CHARS``."""
NO_JOBS = "No background jobs."

T = TypeVar("T")


class Job(msgspec.Struct, eq=False):
    """One background job as ``/jobs`` lists it."""

    id: str
    type: str
    """``task`` (a subagent) or ``bash`` (a command)."""
    label: str
    """What it runs: a subagent's id, a command (cut to 120 characters)."""
    note: str = ""
    """More for ``/jobs`` (``agent scout``)."""
    status: Literal["queued", "running"] = "queued"
    started: float = msgspec.field(default_factory=time.monotonic)


class _Moving(msgspec.Struct, Generic[T], eq=False):
    """The ``HandOff`` of one work: the ``task_status`` of its start in the session nursery."""

    jobs: Jobs
    task_status: trio.TaskStatus[T]
    promote: Callable[[], None]
    """Makes the task a job of the coordinator (cancelled by a session change)."""
    job: Job | None = None
    epoch: int = 0
    """The session's ``job_epoch`` when it became a job."""

    def finish(self, value: T) -> None:
        self.task_status.started(value)

    def background(self, type: str, label: str, value: Callable[[str], T]) -> bool:
        try:
            job = self.job = self.jobs.register(type, label)
        except JobRefused:
            return False
        job.status = "running"
        self.epoch = self.jobs.runs.job_epoch
        self.promote()
        self.task_status.started(value(job.id))
        return True


class Jobs(msgspec.Struct, eq=False):
    """The background jobs of one (main) session."""

    runs: RunCoordinator
    settings: Settings
    """The session's settings, read live (``async.maxJobs``)."""
    rows: dict[str, Job] = msgspec.field(default_factory=dict)
    _next_command: int = 1
    _pending: list[tuple[Job, Settled]] = msgspec.field(default_factory=list)
    _pending_epoch: int = 0
    _flush_epoch: int | None = None

    # -- rows ---------------------------------------------------------------------------------

    @property
    def limit(self) -> int:
        return min(100, max(1, self.settings.async_.maxJobs))

    @property
    def at_capacity(self) -> bool:
        return len(self.rows) >= self.limit

    @property
    def async_enabled(self) -> bool:
        return self.settings.async_.enabled

    def auto_background_after(self) -> float | None:
        auto = self.settings.bash.autoBackground
        return auto.thresholdMs / 1000 if auto.enabled else None

    def register(self, type: str, label: str, *, id: str | None = None,
                 note: str = "") -> Job:
        """A row for a new job (a command's id is ``bg_N``). Raises JobRefused when
        ``async.maxJobs`` jobs are running or the session is closing."""
        if not self.runs.accepting_jobs:
            raise JobRefused("The session is closed")
        if self.at_capacity:
            raise JobRefused(f"Background job limit reached ({self.limit}). Wait for running "
                             "jobs to finish or cancel one.")
        if id is None:
            id = f"bg_{self._next_command}"
            self._next_command += 1
        job = self.rows[id] = Job(id, type, label, note)
        return job

    def report(self) -> str:
        """``/jobs``: one line per job, or ``NO_JOBS``."""
        if not self.rows:
            return NO_JOBS
        now = time.monotonic()
        lines = [f"Background jobs ({len(self.rows)}):"]
        for job in self.rows.values():
            note = f", {job.note}" if job.note else ""
            lines.append(f"- {job.id} [{job.type}] {job.status}{note}, "
                         f"{now - job.started:.1f}s: {job.label}")
        return "\n".join(lines)

    # -- running ------------------------------------------------------------------------------

    def start(self, job: Job, work: Callable[[], Awaitable[Settled | None]]) -> None:
        """Run ``work`` as ``job`` (``register``) now, in the session nursery; its ``Settled``
        is delivered (None: nothing to deliver). ``work`` must not raise (it reports its own
        failures). Raises JobRefused when the session is closed (the row is dropped)."""
        epoch = self.runs.job_epoch
        try:
            self.runs.start_job(functools.partial(self._run, job, work, epoch))
        except SessionError as exc:
            self.rows.pop(job.id, None)
            raise JobRefused(str(exc)) from None

    def launch(self, type: str, label: str,
               work: Callable[[], Awaitable[Settled | None]]) -> str:
        """``register`` and ``start`` a job; returns its id. Raises JobRefused."""
        job = self.register(type, label)
        self.start(job, work)
        return job.id

    async def _run(self, job: Job, work: Callable[[], Awaitable[Settled | None]],
                   epoch: int) -> None:
        job.status = "running"
        try:
            settled = await work()
        finally:
            self._forget(job)
        if settled is not None:
            self._settled(job, settled, epoch)

    async def hand_off(self, work: Callable[[HandOff[T]], Awaitable[Settled | None]]) -> T:
        """Start ``work`` under the caller; returns the value it gives ``finish`` or
        ``background``. After ``background`` it is a job: its ``Settled`` is delivered.
        ``work`` must not raise after ``background`` (it reports its own failures); before,
        its exception is raised here.

        On cancellation before ``background`` the work is cancelled with the caller (it
        cleans up; ``Cancelled`` propagates); after it, the caller's cancellation does not
        reach it. Raises JobRefused when the session is closed."""

        async def run(task_status: trio.TaskStatus[T], promote: Callable[[], None]) -> None:
            moving = _Moving(self, task_status, promote)
            try:
                settled = await work(moving)
            finally:
                if moving.job is not None:
                    self._forget(moving.job)
            if moving.job is not None and settled is not None:
                self._settled(moving.job, settled, moving.epoch)

        if not self.runs.accepting_jobs:
            raise JobRefused("The session is closed")
        return await self.runs.hand_off(run)

    def _forget(self, job: Job) -> None:
        if self.rows.get(job.id) is job:
            del self.rows[job.id]

    # -- delivery -----------------------------------------------------------------------------

    def _settled(self, job: Job, settled: Settled, epoch: int) -> None:
        """Queue a job's end for delivery (dropped when the session changed since it began)."""
        if self.runs.job_epoch != epoch:
            return
        if self._pending_epoch != epoch:
            self._pending, self._pending_epoch = [], epoch
        self._pending.append((job, settled))
        if self._flush_epoch != epoch:
            self._flush_epoch = epoch
            try:
                self.runs.start_job(functools.partial(self._flush, epoch))
            except SessionError:
                self._flush_epoch = None  # closing: nothing more is delivered

    async def _flush(self, epoch: int) -> None:
        """Deliver every result settled by now as one message (cancelled: dropped)."""
        await trio.sleep(FLUSH_DELAY)
        self._flush_epoch = None
        batch, self._pending = self._pending, []
        if batch and self.runs.job_epoch == epoch:
            self.runs.deliver_async_result(async_result_message(batch))


def delivered_text(settled: Settled) -> str:
    """A job's text as the model gets it: whole, or a preview of a long one; a job whose
    output is kept in a file names it."""
    text, kept = settled.text, settled.output_file
    if len(text) > DELIVERY_MAX_CHARS:
        if kept is None:
            return (text[:DELIVERY_HEAD_CHARS] + "\n[Output truncated. Showing first "
                    f"{DELIVERY_HEAD_CHARS:,} characters.]")
        head = DELIVERY_HEAD_CHARS - DELIVERY_TAIL_CHARS
        return (f"{text[:head]}\n[…]\n{text[-DELIVERY_TAIL_CHARS:]}\n\n[Output truncated. "
                f"Showing the first {head:,} and the last {DELIVERY_TAIL_CHARS:,} characters. "
                f"Full output: {kept}]")
    if kept is not None and str(kept) not in text:
        text = f"{text}\n\nFull output: {kept}"
    return text


def async_result_message(jobs: Sequence[tuple[Job, Settled]]) -> m.CustomMessage:
    """One ``async-result`` message delivering every job in ``jobs``
    (docs/design/subagents.md#background-results)."""
    if len(jobs) == 1:
        job, settled = jobs[0]
        verb = {"completed": "has completed", "failed": "has failed",
                "cancelled": "was cancelled"}[settled.status]
        body = (f"Background job {job.id} {verb}. Resume your work using the result below."
                f"\n{delivered_text(settled)}")
    else:
        parts = [f"{len(jobs)} background jobs have completed. Resume your work using the "
                 "results below."]
        for job, settled in jobs:
            parts.append(f"── Job {job.id} ({job.label}) ──\n{delivered_text(settled)}")
        body = "\n".join(parts)
    return m.CustomMessage(
        customType=ASYNC_RESULT, content=f"<system-notice>\n{body}\n</system-notice>",
        display=True, attribution="agent", timestamp=now_ms(),
        details={"meta": {"source": {"type": "report", "value": "background job delivery"}},
                 "jobs": [{"jobId": job.id, "type": job.type, "label": job.label,
                           "durationMs": round(settled.duration_ms)}
                          for job, settled in jobs]})
