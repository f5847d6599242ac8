"""Spawning and running subagents for one session: the ``task`` tool's ``Spawner``.

Who owns what (docs/internals.md#who-owns-what; docs/design/subagents.md#a-child-session,
docs/design/subagents.md#driving-a-child-to-its-yield,
docs/design/subagents.md#inline-or-background, docs/design/subagents.md#background-results,
docs/design/subagents.md#abort):

* A child is an ``AgentSession`` in this process with its own session file next to its
  parent's (``<parent file without .jsonl>/<id>.jsonl``), its own tools (plus ``yield``) and
  system prompt, built by ``omp.subagents.child.build_child``. It runs in a nursery owned by
  whoever runs it (``_run_child``): its session nursery sits in a shielded scope there, so that
  the owner's cancellation is turned into an abort of the child's run (its terminal entries are
  written, with a ``CLEANUP_SECONDS`` deadline) rather than cutting the run off mid-file.
  Nothing of a child outlives its owner.
* Inline children (``async.enabled: false``, ``blocking`` agents, and every spawn made by a
  child) run in a nursery owned by the parent's ``task`` call: the parent's ``abort`` cancels
  them (envelope ``status="cancelled"``) and the call returns only once they have ended.
* Background children are jobs of the parent session (``omp.session.jobs``: the rows ``/jobs``
  lists, ``async.maxJobs``, delivery as ``async-result`` messages): a plain ``abort`` leaves
  them running; a session change and shutdown cancel them, and a cancelled job delivers
  nothing.
* ``task.maxConcurrency`` is one ``trio.CapacityLimiter`` per session, resized from the
  settings before every acquire; settings and agent files are read again at every spawn.
* Progress, lifecycle and events go to the ``SubagentRegistry`` of the ``serve()`` (one per
  tree of sessions, passed down), and inline progress to the parent call's
  ``tool_execution_update``.

Children never run their own spawns in the background (they run them inline): a port is
allowed to, and it keeps a child's result from depending on jobs that outlive its ``yield``.
"""

from __future__ import annotations

import functools
import math
import random
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import trio

from ..agent.loop import AssistantUpdate
from ..config import ConfigError
from ..llm.builder import NO_PACE, Pace
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol.events import SESSION_EVENT_TYPES
from ..session.agent_session import AgentSession
from ..session.errors import SessionError
from ..session.settings import load_settings
from ..tools.base import JobRefused, OnUpdate, Settled, Tool, ToolResult
from ..tools.task import EMPTY_DETAILS, TaskItem, TaskTool
from ..tools.yield_tool import YieldState
from .agents import AgentDef, discover_agents
from .envelope import (
    CANCELLED_BY_CALLER,
    ChildOutcome,
    assemble,
    envelope,
    job_text,
    spawned_text,
    truncate_tail,
)
from .registry import SubagentRegistry

if TYPE_CHECKING:
    # A child's machinery loads with the first spawn (omp.lazy).
    from .child import Child
    from .progress import ProgressPump, ProgressTracker

CLEANUP_SECONDS = 10.0
"""How long an aborted child may take to write its terminal entries (the cleanup grace;
docs/design/subagents.md#driving-a-child-to-its-yield)."""
MAX_REMINDERS = 3
MAX_YIELD_FAILURES = 6
RUNTIME_LIMIT = "Subagent runtime limit exceeded (task.maxRuntimeMs={limit})"
FIRST_MESSAGE = "Complete assignment thoroughly:\n\n{assignment}"
REMINDER = ("<system-reminder>\nYour last turn had no tool call (reminder {n} of {total}). "
            "Resume work, or yield a section, or yield the result, or yield an error for a real "
            "blocker. Never end with text only.\n</system-reminder>")
_ADJECTIVES = ("Swift", "Quiet", "Bright", "Bold", "Calm", "Clever", "Eager", "Keen", "Lucky",
               "Nimble", "Brave", "Sharp", "Steady", "Vivid", "Witty", "Gentle")
_NOUNS = ("Falcon", "Otter", "Badger", "Heron", "Lynx", "Marten", "Osprey", "Raven", "Wren",
          "Fox", "Hare", "Kestrel", "Panda", "Seal", "Tiger", "Wolf")
_ID_CHARS = r"[^A-Za-z0-9_-]"


class SubagentHost(msgspec.Struct, eq=False):
    """The ``task`` tool's spawner for one session (the main one or a child)."""

    session: AgentSession
    registry: SubagentRegistry
    agent_directory: Path
    trusted: bool
    """Project agents (``<cwd>/.omp/agents``) are read only for a trusted project."""
    prefix: str = ""
    """Ids of this session's children start with it (``Parent.``)."""
    spawns: str = "*"
    """Which agents this session may spawn: ``*``, a comma-separated list, or none."""
    limiter: trio.CapacityLimiter = msgspec.field(default_factory=lambda: trio.CapacityLimiter(32))
    agents: list[AgentDef] = msgspec.field(default_factory=list)
    """The agent definitions as last read (``refresh_agents``); a child's host starts with its
    parent's."""
    _used_ids: set[str] = msgspec.field(default_factory=set)
    _cancelled: str | None = None
    _rng: random.Random = msgspec.field(default_factory=random.Random)

    def nested_tool(self, session: AgentSession, prefix: str, spawns: str) -> Tool:
        """The ``task`` tool of a child session that may spawn children of its own."""
        return SubagentHost(session, self.registry, self.agent_directory, self.trusted,
                            prefix=prefix, spawns=spawns, agents=self.agents).tool()

    # -- installing ---------------------------------------------------------------------------

    def tool(self) -> TaskTool:
        return TaskTool(self)

    def can_spawn(self) -> bool:
        depth = self.session.settings.task.maxRecursionDepth
        return bool(self.spawns) and (depth < 0 or self.session.task_depth < depth)

    def refresh_agents(self) -> list[AgentDef]:
        """Read the agent files again (blocking: a few small files)."""
        self.agents = discover_agents(self.agent_directory, self.session.cwd,
                                       trusted=self.trusted)
        return self.agents

    # -- the Spawner protocol -----------------------------------------------------------------

    def batch_enabled(self) -> bool:
        return self.session.settings.task.batch

    def default_agent(self) -> str:
        if self.spawns == "*" or not self.spawns:
            return "task"
        return self.spawns.split(",")[0].strip()

    def cancelled_text(self) -> str | None:
        return self._cancelled

    def describe(self) -> str:
        settings = self.session.settings
        background = settings.async_.enabled and self.session.task_depth == 0
        batch = settings.task.batch
        agents = self._visible_agents()
        if background:
            mode = ("Delegate work to background subagents via one `tasks[]` batch. The call "
                    "does not block: you get agent ids at once and each result is delivered to "
                    "you as a message when that agent yields." if batch else
                    "Delegate work to one background subagent per call. The call does not "
                    "block; the result is delivered to you as a message when it yields.")
            if any(a.blocking for a in agents):
                mode += (" BLOCKING agents run inline (the call waits for them) while the "
                         "others still go to the background.")
        else:
            mode = ("Delegate work to subagents via one `tasks[]` batch; the call blocks until "
                    "every agent has finished and returns their results." if batch else
                    "Delegate work to one subagent per call; the call blocks until it finishes.")
        lines = [mode, "", "## Task Design",
                 "- Pick the most specific agent type (read-only research goes to `scout`).",
                 "- Tell agents to skip formatters, linters and project-wide tests: validation "
                 "is your job.",
                 "- Prefer investigating and editing in one pass; parallelize only work with "
                 "disjoint file ownership; settle cross-task contracts up front in `context`.",
                 "", "## Inputs"]
        if batch:
            lines += ["- `context`: shared background for every agent of the batch (# Goal, "
                      "# Constraints, # Contract).",
                      "- `tasks[]`: one agent per item: `task` (the assignment: # Target, "
                      "# Change, # Acceptance), optional `name` (its id, CamelCase, unique in "
                      f"the call), optional `agent` (default `{self.default_agent()}`; never "
                      "pass the default explicitly)."]
        else:
            lines += ["- `task`: the assignment; optional `name` (its id) and `agent` (default "
                      f"`{self.default_agent()}`; never pass the default explicitly)."]
        lines += ["", "## Communication",
                  "Subagents start blank: they see none of your conversation. Put everything "
                  "they need in `context` and `task`.", "", "## Available Agents"]
        if not self.can_spawn():
            lines.append("Agent spawning is currently disabled.")
        for agent in agents:
            badge = " (READ-ONLY)" if agent.read_only else ""
            badge += " (BLOCKING: inline result)" if agent.blocking else ""
            lines += [f"### {agent.name}{badge}", agent.description
                      + (" Use only for investigation." if agent.read_only else "")]
        return "\n".join(lines)

    def _visible_agents(self) -> list[AgentDef]:
        disabled = set(self.session.settings.task.disabledAgents)
        allowed = None if self.spawns == "*" else {
            s.strip() for s in self.spawns.split(",") if s.strip()}
        return [a for a in self.agents if a.name not in disabled
                and (allowed is None or a.name in allowed)]

    async def spawn(self, call_id: str, context: str | None, items: list[TaskItem], *,
                    flat: bool, on_update: OnUpdate) -> ToolResult:
        """Preflight every item, then run the inline ones here and start the rest as jobs.

        On cancellation (the parent's abort) the inline children are aborted and have ended
        before ``Cancelled`` propagates (``cancelled_text`` then holds their envelopes);
        background children are not affected."""
        from .child import Child  # lazy: omp.lazy says why
        from .progress import ProgressTracker

        started = trio.current_time()
        await self._reload()
        settings = self.session.settings
        problems: list[str] = []
        children: list[Child] = []
        taken: set[str] = set()
        for index, item in enumerate(items):
            label = item.name or f"#{index + 1}"
            agent, problem = self._preflight(item)
            if problem is not None or agent is None:
                problems.append(f"Task execution failed: {problem}" if flat
                                else f"Task {label} failed preflight: {problem}")
                continue
            child_id = self._allocate_id(item.name, taken)
            assignment = item.task.strip()
            detached = (settings.async_.enabled and not agent.blocking
                        and self.session.task_depth == 0)
            tracker = ProgressTracker(index=index, id=child_id, agent=agent.name,
                                      agent_source=agent.source,
                                      task=FIRST_MESSAGE.format(assignment=assignment),
                                      assignment=assignment)
            children.append(Child(index, child_id, agent, assignment, tracker, detached,
                                   call_id))
        if problems:
            for child in children:
                self._used_ids.discard(child.id)
            return ToolResult.text("\n".join(problems), dict(EMPTY_DETAILS))
        project_dir = (str(self.session.cwd / ".omp" / "agents")
                       if self.trusted and (self.session.cwd / ".omp" / "agents").is_dir()
                       else None)
        inline = [c for c in children if not c.detached]
        background = [c for c in children if c.detached]
        texts: list[str] = []
        job_ids: list[str] = []
        failures: list[str] = []
        for child in background:
            problem = self._start_job(child, context)
            if problem is None:
                job_ids.append(child.id)
            else:
                failures.append(f"{child.id}: {problem}")
        if inline:
            texts += await self._run_inline(inline, context, on_update)
        if background:
            if job_ids:
                texts.append(spawned_text(job_ids, [c.agent.name for c in background
                                                    if c.id in job_ids]))
            if failures:
                texts.append("Failed to start background task job(s): " + "; ".join(failures))
            if job_ids:
                await on_update(ToolResult.text(
                    f"Spawned agent `{job_ids[0]}`..." if len(job_ids) == 1
                    else f"Spawned {len(job_ids)} agents...",
                    self._details(project_dir, inline, started, children, job_ids)))
        return ToolResult.text("\n\n".join(texts),
                               self._details(project_dir, inline, started, children, job_ids))

    def _details(self, project_dir: str | None, inline: list[Child], started: float,
                 children: list[Child], job_ids: list[str]) -> dict[str, Any]:
        details: dict[str, Any] = {
            "projectAgentsDir": project_dir,
            "results": [c.outcome.single_result() for c in inline if c.outcome is not None],
            "totalDurationMs": round((trio.current_time() - started) * 1000)}
        if job_ids:
            details["progress"] = [msgspec.to_builtins(c.tracker.snapshot()) for c in children]
            details["async"] = {"state": "running", "jobId": job_ids[0], "type": "task"}
        return details

    async def _reload(self) -> None:
        """Settings and agent files are read again at every spawn
        (docs/design/subagents.md#settings)."""
        session = self.session
        cwd = session.cwd
        directory = self.agent_directory

        def read() -> None:
            try:
                fresh = load_settings(directory, cwd)
            except ConfigError:
                pass  # keep what the session started with; startup reported the file
            else:
                session.settings.use_task_sections(fresh.task, fresh.async_)
            self.refresh_agents()

        await trio.to_thread.run_sync(read)
        limit = session.settings.task.maxConcurrency
        self.limiter.total_tokens = limit if limit > 0 else math.inf

    def _preflight(self, item: TaskItem) -> tuple[AgentDef | None, str | None]:
        session = self.session
        settings = session.settings.task
        depth, limit = session.task_depth, settings.maxRecursionDepth
        if not (limit < 0 or depth < limit):
            return None, (f"Cannot spawn another agent at task depth {depth}; maximum depth is "
                          f"{limit}.")
        name = item.agent or self.default_agent()
        by_name = {a.name: a for a in self.agents}
        available = ", ".join(a.name for a in self._visible_agents())
        if self.spawns != "*":
            allowed = [s.strip() for s in self.spawns.split(",") if s.strip()]
            if name not in allowed:
                shown = ", ".join(allowed) or "none (spawns disabled for this agent)"
                return None, f"Cannot spawn '{name}'. Allowed: {shown}"
        agent = by_name.get(name)
        if agent is None:
            return None, f'Unknown agent "{name}". Available: {available}'
        if name in settings.disabledAgents:
            return None, (f'Agent "{name}" is disabled in settings. Enable it via /agents, or '
                          f"use a different agent type. Available: {available}")
        return agent, None

    def _allocate_id(self, requested: str | None, taken: set[str]) -> str:
        base = re.sub(_ID_CHARS, "", requested or "")[:48] or (
            self._rng.choice(_ADJECTIVES) + self._rng.choice(_NOUNS))
        directory = self.artifacts_dir()
        candidate, n = self.prefix + base, 1
        while (candidate in self._used_ids or candidate.lower() in taken
               or (directory is not None and ((directory / f"{candidate}.jsonl").exists()
                                              or (directory / f"{candidate}.md").exists()))):
            n += 1
            candidate = f"{self.prefix}{base}-{n}"
        self._used_ids.add(candidate)
        taken.add(candidate.lower())
        return candidate

    def artifacts_dir(self) -> Path | None:
        path = self.session.session_file
        return None if path is None else Path(path).with_suffix("")

    # -- inline ---------------------------------------------------------------------------------

    async def _run_inline(self, children: list[Child], context: str | None,
                          on_update: OnUpdate) -> list[str]:
        """Run ``children`` at once (each bounded by the limiter); their envelopes in order."""

        async def report() -> None:
            text = (f"Running agent {children[0].id}..." if len(children) == 1
                    else f"Running {len(children)} agents...")
            await on_update(ToolResult.text(text, {
                "projectAgentsDir": None, "results": [], "totalDurationMs": 0,
                "progress": [msgspec.to_builtins(c.tracker.snapshot()) for c in children]}))

        finished = False
        self._cancelled = None
        try:
            async with trio.open_nursery() as nursery:
                for child in children:
                    nursery.start_soon(self._run_child, child, context, report)
            finished = True
        finally:
            if not finished:
                # The loop reads this as the aborted call's result (TaskTool.abort_text).
                self._cancelled = "\n\n".join(self._inline_text(c) for c in children)
        return [self._inline_text(c) for c in children]

    @staticmethod
    def _inline_text(child: Child) -> str:
        if child.outcome is None:
            return f"Task {child.id}: cancelled before start."
        return envelope(child.outcome)

    # -- background -----------------------------------------------------------------------------

    def _start_job(self, child: Child, context: str | None) -> str | None:
        jobs = self.session.jobs
        try:
            job = jobs.register("task", child.id, id=child.id, note=f"agent {child.agent.name}")
            jobs.start(job, functools.partial(self._job, child, context))
        except JobRefused as exc:
            return str(exc)
        return None

    async def _job(self, child: Child, context: str | None) -> Settled | None:
        """One background child. Cancelled (a session change, shutdown): it delivers nothing."""
        await self._run_child(child, context, None)
        outcome = child.outcome
        if outcome is None:
            return None
        return Settled(job_text(outcome), outcome.status, outcome.duration_ms)

    # -- one child ------------------------------------------------------------------------------

    async def _run_child(self, child: Child, context: str | None,
                         report: Callable[[], Awaitable[None]] | None) -> None:
        """Run one child to its outcome (``child.outcome``), bounded by the limiter.

        On cancellation while it waits for the limiter nothing was started; once started, its
        run is aborted, its terminal entries are written (``CLEANUP_SECONDS`` at most), its
        outcome is ``cancelled`` and ``Cancelled`` propagates."""
        limit = self.session.settings.task.maxConcurrency
        self.limiter.total_tokens = limit if limit > 0 else math.inf  # resized live
        async with self.limiter:
            await self._run_started(child, context, report)

    async def _run_started(self, child: Child, context: str | None,
                           report: Callable[[], Awaitable[None]] | None) -> None:
        # A job cancelled before its first step (shutdown's cancel_jobs) must not register its
        # child afterwards: nothing would wait for it, and it would write to a closed output.
        await trio.lowlevel.checkpoint_if_cancelled()
        from .child import build_child  # lazy: omp.lazy says why
        from .progress import ProgressPump

        parent = self.session
        tracker = child.tracker
        state = YieldState()

        async def emit() -> None:
            self._progress(child)
            if report is not None:
                await report()

        pump = ProgressPump(emit)
        try:
            session = await build_child(self, child, context, state,
                                        _ChildEvents(child.id, tracker, pump, self.registry))
        except (OSError, SessionError) as exc:
            self._finish(child, ChildOutcome(
                id=child.id, agent=child.agent.name, agent_source=child.agent.source,
                index=child.index, task=tracker.task, assignment=child.assignment,
                status="failed", exit_code=1, output="", stderr=f"{exc}"))
            return
        tracker.set_status("running")
        self.registry.lifecycle(ev.SubagentLifecyclePayload(
            id=child.id, agent=child.agent.name, agentSource=child.agent.source,
            status="started", index=child.index, sessionFile=_opt(child.session_file),
            parentToolCallId=child.call_id, detached=child.detached))

        # Shielded once it runs (below), so that a cancelled owner still lets the child's
        # run end with its terminal entries; not while it starts: trio leaves a task whose
        # starter was cancelled in the starter's nursery, and a shielded one would never end.
        host_scope = trio.CancelScope()
        runtime = parent.settings.task.maxRuntimeMs
        failure: str | None = None
        cancelled = True

        async def host(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                       ) -> None:
            with host_scope:
                await session.run_nursery(task_status=task_status)

        try:
            async with trio.open_nursery() as nursery:
                try:
                    await nursery.start(host)
                    host_scope.shield = True
                    nursery.start_soon(pump.run)
                    with trio.move_on_after(runtime / 1000 if runtime > 0 else math.inf
                                            ) as cap:
                        try:
                            failure = await self._drive(session, state, tracker)
                        except SessionError as exc:  # the child's model cannot take the prompt
                            failure = str(exc)
                        except Exception as exc:  # a bug: this child fails, the parent goes on
                            failure = f"Internal error: {type(exc).__name__}: {exc}"
                    if cap.cancelled_caught:
                        failure = RUNTIME_LIMIT.format(limit=runtime)
                        await session.runs.abort(failure)
                    cancelled = False
                finally:
                    # The host's shield gets its deadline first: whatever the cleanup does,
                    # the child's nursery ends within CLEANUP_SECONDS.
                    host_scope.deadline = trio.current_time() + CLEANUP_SECONDS
                    try:
                        # Shielded, with a deadline: the child's run is aborted and its file
                        # ends with its terminal entries even when the owner was cancelled.
                        with trio.move_on_after(CLEANUP_SECONDS, shield=True):
                            await session.aclose()
                    finally:
                        host_scope.cancel()
                        nursery.cancel_scope.cancel()  # the pump
        finally:
            self._conclude(child, state, session, cancelled=cancelled, failure=failure)

    async def _drive(self, session: AgentSession, state: YieldState,
                     tracker: ProgressTracker) -> str | None:
        """Prompt the child, then remind it (up to three times) until it yields; a failure
        text, or None. On cancellation the child's run goes on until the caller aborts it."""
        session.prompt(tracker.task)
        await session.wait_for_idle()
        for n in range(1, MAX_REMINDERS + 1):
            if state.result is not None:
                return None
            if state.failures >= MAX_YIELD_FAILURES:
                return ("Subagent submitted invalid yield results "
                        f"{state.failures} times; stopping to avoid an infinite submit loop.")
            last = _last_assistant(session)
            if last is not None and last.stopReason in ("error", "aborted"):
                return last.errorMessage or None
            session.prompt(REMINDER.format(n=n, total=MAX_REMINDERS))
            await session.wait_for_idle()
        return None

    def _conclude(self, child: Child, state: YieldState, session: AgentSession, *,
                  cancelled: bool, failure: str | None) -> None:
        from .child import last_text  # lazy: omp.lazy says why

        tracker = child.tracker
        status, code, output, stderr, data = assemble(
            state.result, last_text(session), cancelled=cancelled, requests=tracker.requests,
            tokens=tracker.tokens)
        if failure is not None and state.result is None and not cancelled:
            status, code, stderr = "failed", 1, failure
        if failure is not None and failure.startswith("Subagent runtime limit"):
            status, code, stderr = "failed", 1, failure
        output, truncated = truncate_tail(output)
        outcome = ChildOutcome(
            id=child.id, agent=child.agent.name, agent_source=child.agent.source,
            index=child.index, task=tracker.task, assignment=child.assignment, status=status,
            exit_code=code, output=output, stderr=stderr,
            duration_ms=(trio.current_time() - tracker.started) * 1000,
            requests=tracker.requests, tokens=tracker.tokens,
            abort_reason=(CANCELLED_BY_CALLER if cancelled and state.result is None
                          else state.result.error if state.result is not None
                          and state.result.status == "aborted" else None),
            truncated=truncated, session_file=child.session_file, data=data)
        self._finish(child, outcome)

    def _finish(self, child: Child, outcome: ChildOutcome) -> None:
        """Record the outcome; final progress, then the terminal lifecycle (never waits)."""
        child.outcome = outcome
        final: Literal["completed", "failed", "aborted"] = (
            "aborted" if outcome.status == "cancelled" else
            "completed" if outcome.exit_code == 0 else "failed")
        child.tracker.set_status(final)
        self._progress(child)
        self.registry.lifecycle(ev.SubagentLifecyclePayload(
            id=child.id, agent=child.agent.name, agentSource=child.agent.source,
            status=final, index=child.index, sessionFile=_opt(child.session_file),
            parentToolCallId=child.call_id, detached=child.detached))

    def _progress(self, child: Child) -> None:
        self.registry.progress(child.id, ev.SubagentProgressPayload(
            index=child.index, agent=child.agent.name, agentSource=child.agent.source,
            task=child.tracker.task, parentToolCallId=child.call_id,
            assignment=child.assignment, progress=child.tracker.snapshot(),
            sessionFile=_opt(child.session_file), detached=child.detached))

class _ChildEvents(msgspec.Struct, eq=False):
    """A child's sink: its progress tracker, and its own events on the bus (``events``)."""

    id: str
    tracker: ProgressTracker
    pump: ProgressPump
    registry: SubagentRegistry

    def publish(self, event: Any) -> None:
        self.pump.changed(self.tracker.observe(event))
        if self.registry.level == "events" and isinstance(event, msgspec.Struct) and (
                event.__struct_config__.tag in SESSION_EVENT_TYPES):
            self.registry.event(self.id, event)

    def publish_update(self, event: Any) -> None:
        self.pump.changed(self.tracker.observe(event))
        if self.registry.level == "events":
            if isinstance(event, AssistantUpdate):
                stream_event = event.event
                event = ev.MessageUpdate(
                    assistantMessageEvent=stream_event.to_wire(),  # type: ignore[arg-type]
                    message=stream_event.partial)
            self.registry.event(self.id, event)

    @property
    def pace(self) -> Pace:
        # The bus never pushes back (its frames go through the parent's queue without waiting).
        return NO_PACE


def _last_assistant(session: AgentSession) -> m.AssistantMessage | None:
    for message in reversed(session.messages):
        if isinstance(message, m.AssistantMessage):
            return message
    return None


def _opt(value: str | None) -> Any:
    return msgspec.UNSET if value is None else value
