"""The cancellation property (issue 9, "The proof"): whatever a run is doing when the host
aborts it, cancels a retry or a shell command, closes its input, or the embedding program
cancels ``serve()``, the protocol holds and nothing is left running.

One hypothesis example is one session: ``omp.serve`` in process over memory streams, the
project's ``RpcClient`` as the host, and the fake LLM server (``omp.testing.fake_llm``) in the same
``trio.run`` on ``MockClock(autojump_threshold=0)``, so the scripted pauses, the retry backoff
and the host's answer delays are virtual: they cost no wall time and the disruption lands at an
exact virtual instant. Real subprocesses (the bash tool, RPC ``bash``, ``rg`` for grep) and
worker threads (read, ls, session files, settings reads) take real time, during which autojump
would move the clock on to the next timer, however far. So while one works the host steps the
clock in small ticks, one per millisecond of real time (``Host.keep_time_close``; threads are
seen by ``ThreadWatch``): a command takes about a virtual second rather than leaping to the
next timer, which may be its own 300 s timeout or a 10 s cleanup deadline. No virtual timer
bounds an example (it would be that next timer); a real-time watchdog does (``REAL_LIMIT``),
and prints where every task waits when it fires.

A scenario (``scenarios``) is an optional warm-up prompt, then prompt ``p1`` whose run makes 0-3
model calls with tool calls and a final text answer. A call streams thinking and text with pauses,
then tool calls, one batch run by the scheduling rule: ``shared`` ones that run together
(``read``, ``ls``, ``grep``, a read of ``db://`` served by the host (``set_host_uri_schemes``),
the host tool ``lookup``, the bash tool, the ``task`` tool) and ``write``, ``exclusive``, which
waits for every call before it and holds back every call after it (``check_batch_order``); the
``task`` tool runs (one child agent, inline in the parent's tool call or in the background by the
scenario's ``background``; the child's model call may fail once, then it streams for a drawn while
and calls ``yield``). Before any call the model may fail: 503 with ``retry-after`` or a dropped
stream (auto-retry with backoff), or a context overflow (compaction, then the turn again); the
final answer may report a context over the threshold (compaction after the run). The host may send
an RPC ``bash`` and a second prompt (``steer`` / ``followUp``) at drawn virtual times. The bash
tool's command and the RPC ``bash``'s are each drawn (``SHELL_COMMANDS``): a quick one, one that
outlives SIGTERM (``trap '' TERM``, then a sleep: only SIGKILL ends it, after the grace; it has a
short timeout of its own, so undisrupted it takes the kill ladder too), or one that double-forks
(a sleep whose parent is gone at once: only a signal to the whole group reaches it). Then one
disruption: ``abort``, ``abort_bash``, ``abort_retry``, stdin EOF, ``abort`` with EOF right
behind it, outside cancellation of ``serve()``, or none. Three in four are aimed at a phase of the
run the host observes (``Trigger``: a message streaming, a tool call, the bash command started or
printing, a host request, a retry backoff, a compaction, a child agent, the RPC ``bash``), at once
or a drawn while after the frame that shows it, choosing among the phases the scenario should
reach (``expected_phases``); the rest land at a drawn virtual time, which also reaches the moments
between phases (and after the run). One in four ``abort`` / ``abort_bash`` / ``abort_eof`` aimed
disruptions is written in the same write as the command it is about (``p1``, or the RPC ``bash``):
the server reads both lines at once, the race the abort registry exists for. "The host does not
answer" a host tool or URI (before the disruption; after it, at once) is only drawn with a
disruption that ends the run.

The server's abort registry is the test's own (``ServeOptions.aborts``): it must hold nothing once
the host sees the session idle, and nothing once ``serve()`` has returned. With the same-write
disruptions and the RPC ``bash`` cut while its stubborn command runs, that catches each of these
regressions of the registry (each was tried): (M1) the RPC ``bash``'s scope registered after an
await in its task; (M2) ``abort`` not cancelling the ``bash`` family; (M3) a run that makes its
own scope instead of adopting its prompt's; (M4) a run's scope never released. And (M5) a batch
whose exclusive call starts before the calls ahead of it have ended. Each is caught by a pinned
scenario that shard 0 runs first (the random draws of 400 examples caught M1 only once, M3
twice; M2, M4 and M5 in three or four shards), so how many examples are drawn is a matter of
exploration, not of these.

A process the server killed dies at the kernel's pace, which a loaded machine stretches far
beyond the few milliseconds of real time that the kill's virtual deadline lasts at the stepped
clock's speed; while one is dying (``procfs.dying``) virtual time runs at real speed.

What every example checks is listed in ``check_example``. Which combinations ran is reported by
hypothesis' statistics (``pytest --hypothesis-show-statistics``): the disruption with what the
session was doing as the host last saw it, whether an aimed one found its phase, the shell
commands, and the features the frames show were exercised.

Profiles: ``OMP_CANCELLATION_EXAMPLES`` sets the number of examples (default 500, what CI
runs), split over ``SHARDS`` tests so that a parallel run spreads them over its workers. Each
shard draws from a fixed seed of its own: CI runs the same 500 scenarios every time, so a red
run means the change broke something, not that the draw found something new, and a failure
reproduces (trio's scheduling is seeded by hypothesis; subprocess timing and the retry jitter
are what randomness is left). ``OMP_CANCELLATION_RANDOM=1`` draws fresh scenarios (and keeps
failures in hypothesis' database) for exploring locally; ``OMP_CANCELLATION_SHRINK=0`` reports
the first failing scenario as drawn, without shrinking it (a hang shrinks slowly).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import attrs
import msgspec
import procfs
import pytest
import trio
import trio.testing
from agent_helpers import Frame, to_frame, tool_call, write_models_yml
from hypothesis import HealthCheck, Phase, event, example, given, seed, settings
from hypothesis import strategies as st
from property_helpers import (
    RecordingSendStream,
    check_cut_together,
    check_registry,
    check_rpc_bash_cut,
    leftover_tasks,
    recorded_pids,
    task_tree,
)

import omp
from omp.client import HostToolUpdater, RpcClient, RpcConnectionClosed, ToolResult, UiAnswer
from omp.process import KILL_GRACE
from omp.protocol.commands import HostToolDefinition
from omp.protocol.events import ExtensionUiRequest, HostToolCall, HostUriRequest
from omp.rpc import lifecycle
from omp.rpc.server import ServeOptions
from omp.session.aborts import AbortRegistry, Family
from omp.testing.fake_llm import open_fake_llm
from omp.testing.invariants import (
    Stops,
    backgrounded,
    check_idle_after_runs,
    check_protocol,
    check_runs,
    phase,
    responses_by_id,
)
from omp.tools import shell

EXAMPLES = int(os.environ.get("OMP_CANCELLATION_EXAMPLES", "500"))
RANDOM = bool(os.environ.get("OMP_CANCELLATION_RANDOM"))
SHRINK = os.environ.get("OMP_CANCELLATION_SHRINK", "1") != "0"
settings.register_profile(
    "cancellation", max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM,
    **({} if RANDOM else {"database": None}),
    phases=tuple(Phase) if SHRINK else (Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
PROFILE = settings.get_profile("cancellation")

REAL_LIMIT = 30.0
"""Real seconds one example may take before it counts as hung (virtual time has no bound: a
real subprocess lets autojump run the clock far ahead)."""
SHUTDOWN_BOUND = (shell.CLEANUP_TIMEOUT + lifecycle.DRAIN_STALL_SECONDS
                  + lifecycle.CLEANUP_SECONDS)
"""Virtual seconds ``serve()`` may take to return after stdin EOF or its cancellation: its own
deadlines (a shell's cleanup: SIGTERM to the group, the grace, SIGKILL, the reap, the rest of
its output; then the output drain's stall limit and the HTTP client's close). Not issue 9's
2 s / 1 s: while a process group dies in real time, autojump runs the virtual clock between
the kill's polls, so a loaded machine stretches virtual time; tests/test_run_scope.py checks
those numbers in real time."""

TICK = 0.02
"""Virtual seconds per step of the clock while a subprocess of ours works in real time."""
TICK_WAIT = 0.001
"""Real seconds trio waits, all tasks blocked, before it takes such a step (the clock's
``autojump_threshold`` meanwhile): the loop sleeps instead of spinning through steps."""
Shell = Literal["quick", "stubborn", "double_fork"]
SHELL_COMMANDS: dict[Shell, str] = {
    "quick": "sleep 0.05; echo hi",
    # Outlives SIGTERM (the shell and the sleep it starts ignore it): the group kill must go on
    # to SIGKILL. The trailing echo keeps bash from exec'ing the sleep, so the sleep is a
    # member other than the leader; "armed" (output the host sees) says the trap is set.
    "stubborn": "trap '' TERM; echo armed; sleep 30; echo woke",
    # The sleep's parent exits at once: it is no child of the shell's, only a member of its
    # process group (which only a group kill reaches), and it holds the output pipe open.
    "double_fork": "(sleep 30 &); echo forked; sleep 0.05; echo hi",
}
STUBBORN_TIMEOUT = 0.5
"""The stubborn command's own timeout (virtual seconds): undisrupted, it would run 30 real
seconds; so it also takes the kill ladder when nothing disrupts it."""
SHELL_LENGTH: dict[Shell, float] = {"quick": 1.0, "stubborn": STUBBORN_TIMEOUT + KILL_GRACE,
                                    "double_fork": 1.0}
"""About how many virtual seconds each command takes (``TICK`` makes about a virtual second of
50 ms of real time)."""
KILLED_GONE_BOUND = 60.0
"""Real seconds a process of a shell command's group that the server killed may take to be gone
after serve() returned (a generous bound on the kernel's pace, not a figure of ours)."""
BASH_TOOL_PIDS = "bash-tool.pids"
RPC_BASH_PIDS = "rpc-bash.pids"
TOOLS_MATCH = {"bodyContains": '"tools":['}
"""The agent's model calls offer tools; summary calls (compaction) do not."""
SUMMARY_MATCH = {"bodyContains": "context summarization assistant"}
CHILD_ASSIGNMENT = "Peek at the notes"
CHILD_MATCH = {"bodyContains": "Complete assignment thoroughly:\\n\\n" + CHILD_ASSIGNMENT}
"""Only a child's own requests hold its assignment so (the parent's history has it as tool
arguments, JSON-escaped once more); a child's requests offer tools too, so these entries come
first."""
LOOKUP = HostToolDefinition(
    name="lookup", description="Look a key up in the host's store.",
    parameters={"type": "object", "properties": {"key": {"type": "string"}},
                "required": ["key"]})
OVERFLOW_BODY = {"error": {
    "message": "This model's maximum context length is 128000 tokens. However, your messages "
               "resulted in 131072 tokens.",
    "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
ABORT_REASON = "Interrupted by user"
"""The aborted assistant message's ``errorMessage`` after the host's ``abort``."""
SHUTDOWN_REASON = "Request was aborted"
"""... after stdin EOF (the session closes). Spelled out, not imported: hosts show these."""
BIG_USAGE = {"input": 120_000, "output": 20}
"""Over the default threshold (128000 window - 19200 reserve): compaction after the run."""

ToolKind = Literal["read", "ls", "grep", "uri", "host", "bash", "task", "write"]
Failure = Literal["unavailable", "dropped", "overflow"]
Disruption = Literal["none", "abort", "abort_bash", "abort_retry", "eof", "abort_eof", "cancel"]
"""``abort_eof``: ``abort`` and stdin EOF right behind it, before its response."""
ENDS_RUNS: frozenset[Disruption] = frozenset({"abort", "eof", "abort_eof", "cancel"})
"""Disruptions that end a run that waits for the host: only with these may the host never
answer."""
Aim = Literal["streaming", "tool", "bash", "bash_output", "host", "retry", "compaction", "child",
              "rpc_bash", "approval", "prompt"]
WRITTEN_TOGETHER: frozenset[Disruption] = frozenset({"abort", "abort_bash", "abort_eof"})
"""Disruptions that can go in the same write as the command they are aimed at
(``Trigger.together``)."""
ASKING: frozenset[ToolKind] = frozenset({"bash", "host", "task", "write"})
"""Calls of the ``write`` and ``exec`` tiers: with approval on (``always-ask``) the host is asked
first (the read-only tools, ``db://`` reads included, are not)."""


@attrs.frozen
class Trigger:
    """A phase of ``p1``'s run to aim the disruption at, as the host observes it: ``delay``
    virtual seconds after the ``nth`` frame (since ``p1``) that shows it.

    ``streaming``: the first ``message_update`` of an assistant message; ``tool`` / ``bash``:
    a ``tool_execution_start`` (of any tool / of bash); ``bash_output``: the bash tool's output
    (the stubborn command's trap is set, the double-forked sleep exists); ``host``: a
    ``host_tool_call`` or ``host_uri_request``; ``retry``: ``auto_retry_start`` (the backoff);
    ``compaction``: ``auto_compaction_start``; ``child``: a child agent started; ``rpc_bash``:
    the host sent its RPC ``bash`` (``nth`` does not apply); ``approval``: a tool approval
    dialog (``extension_ui_request`` ``select``); ``prompt``: the host sent ``p1`` (only
    ``together``).

    ``together``: the disruption goes in the same write as the command aimed at (``p1`` or the
    RPC ``bash``), so the server reads both lines at once: the race the abort registry is for
    (work is registered when its line is read, before the next line)."""

    aim: Aim
    nth: int = 1
    delay: float = 0.0
    together: bool = False

    def shown_by(self, frame: Frame, previous: Frame | None) -> bool:
        """Whether ``frame`` (after ``previous``) shows the phase."""
        t: str = frame["type"]
        aim = self.aim
        if aim == "streaming":
            return t == "message_update" and (
                previous is None or previous["type"] != "message_update"
                or previous.get("messageId") != frame.get("messageId"))
        if aim in ("tool", "bash"):
            return t == "tool_execution_start" and (aim == "tool" or frame["toolName"] == "bash")
        if aim == "bash_output":
            return t == "tool_execution_update" and frame["toolName"] == "bash"
        if aim == "host":
            return t in ("host_tool_call", "host_uri_request")
        if aim == "retry":
            return t == "auto_retry_start"
        if aim == "compaction":
            return t == "auto_compaction_start"
        if aim == "child":
            return t == "subagent_lifecycle" and frame["payload"]["status"] == "started"
        if aim == "approval":
            return t == "extension_ui_request" and frame["method"] == "select"
        return False


# --- scenarios -----------------------------------------------------------------------------------


@attrs.frozen
class Step:
    """One model call of ``p1``'s run and the failures served before it (one attempt each)."""

    failures: tuple[Failure, ...]
    thinking: bool
    pieces: tuple[tuple[float, str], ...]
    """Text deltas, each after a pause (virtual seconds)."""
    calls: tuple[ToolKind, ...]
    """Tool calls after the text; none in the final answer."""
    big_usage: bool = False


@attrs.frozen
class Scenario:
    warm_up: bool
    """A completed run before ``p1``: gives compaction something to cut on the first turn."""
    steps: tuple[Step, ...]
    retry_after: str
    summary_fails: bool
    """The first summary call fails (compaction ends with an error)."""
    host_delay: float | None
    """When the host answers ``lookup``; None: not before the disruption."""
    host_fails: bool
    host_updates: bool
    uri_delay: float | None
    """When the host answers a ``db://`` read; None: not before the disruption."""
    rpc_bash_at: float | None
    steer_at: float | None
    steer_mode: Literal["steer", "followUp"]
    disruption: Disruption
    disrupt_at: float
    background: bool = False
    """``task`` children run in the background (``async.enabled``) rather than inline."""
    child_delay: float = 0.3
    """How long each child streams before it yields."""
    child_fails: bool = False
    """The first child's first model call fails with a 503 (the child retries)."""
    bash_shell: Shell = "quick"
    """The bash tool call's command."""
    rpc_shell: Shell = "quick"
    """The RPC ``bash`` command's command."""
    approval: bool = False
    """Tool approval is on (``--approval-mode always-ask``): ``ASKING`` calls wait for the host's
    answer to a ``select`` dialog first."""
    approval_delay: float | None = 0.0
    """When the host answers a dialog; None: not before the disruption."""
    approval_denies: bool = False
    """The host answers ``Deny`` (the call is not run; the turn goes on)."""
    disrupt_on: Trigger | None = None
    """The phase the disruption is aimed at; None: at ``disrupt_at``. Aimed, ``disrupt_at`` is
    a fallback (after the run, or while it waits for a host that never answers) for a phase
    that never came."""

    def spawns(self) -> bool:
        return any("task" in step.calls for step in self.steps)

    def first_write(self) -> bool:
        """``p1`` and the ``abort`` behind it are written before the host has read ``ready``
        (no warm-up): the server's start holds its serial lane when it reads them (for a
        virtual moment: ``slow_start``), so ``p1`` waits in the lane when the abort is read (a
        prompt read while the lane is idle is handled at once, its run registered before the
        next line)."""
        aimed = self.disrupt_on
        return (aimed is not None and aimed.together and aimed.aim == "prompt"
                and self.disruption == "abort" and not self.warm_up)


def slow_start(omp: Any) -> None:
    """An extension whose ``session_start`` takes a virtual moment, so that the server's start
    (the serial lane's first job) still runs when the reader has read the host's first write:
    virtual time passes only once every task waits, the reader included."""

    async def started(event: Any, ctx: Any) -> None:
        # Virtual time: it passes only once every task waits, so the reader has read the
        # host's first write before the lane's first job ends; the length does not matter.
        await trio.sleep(0.05)

    omp.on("session_start", started)


# Strategies are built once: building them inside every draw costs more than the example.
BOOLS = st.booleans()
PAUSES = st.sampled_from([0.0, 0.0, 0.02, 0.3, 1.0, 2.5])
FAILURES = st.sampled_from([
    (), (), (), (), ("unavailable",), ("dropped",), ("overflow",), ("unavailable", "dropped"),
    ("unavailable", "overflow"), ("overflow", "unavailable"), ("dropped", "overflow")])
WORDS = st.tuples(PAUSES, st.sampled_from(["Looking", " at", " it."]))
CALLS = st.lists(st.sampled_from(["read", "ls", "grep", "uri", "uri", "host", "host", "task",
                                  "write"]), min_size=1, max_size=3).map(tuple)
"""A batch of calls: all ``shared`` but ``write`` (``exclusive``: it waits for every call before
it, and every call after it waits for it)."""
BASH_AT = st.one_of(st.none(), st.none(), st.tuples(st.integers(0, 2), st.integers(0, 3)))
"""Where the one bash tool call goes (step, position), if any: each call costs 50 ms or more
of real time, the most expensive thing an example does."""
SHELL_KINDS: list[Shell] = ["quick", "double_fork", "quick", "double_fork", "stubborn"]
SHELLS = st.sampled_from(SHELL_KINDS)
"""One in five commands is the stubborn one, the costly one: its kill ladder polls the group
through the grace period, each poll a step of the clock (about half a second of real time)."""
TOOL_STEPS = st.lists(st.builds(
    Step, failures=FAILURES, thinking=BOOLS, pieces=st.lists(WORDS, max_size=2).map(tuple),
    calls=CALLS), max_size=3).map(tuple)
FINAL_STEP = st.builds(
    Step, failures=FAILURES, thinking=BOOLS,
    pieces=st.lists(WORDS, min_size=1, max_size=3).map(tuple), calls=st.just(()),
    big_usage=BOOLS)
DISRUPTION_CHOICES: list[Disruption] = [
    "none", "abort", "abort", "abort_bash", "abort_retry", "eof", "abort_eof", "cancel"]
DISRUPTIONS = st.sampled_from(DISRUPTION_CHOICES)
STEER_MODES: list[Literal["steer", "followUp"]] = ["steer", "followUp"]
ANSWERS = st.sampled_from([0.0, 0.2, 1.0, 3.0])
NEVER_OR_ANSWERS = st.sampled_from([0.0, 0.2, 1.0, 3.0, None])
RETRY_AFTER = st.sampled_from(["0", "1", "2"])
ONE_IN_FOUR = st.integers(0, 3).map(lambda n: n == 0)
FRACTION = st.sampled_from([n / 100 for n in (*range(30, 91), *range(30))])
"""When something happens, as a fraction of the run's nominal length (an estimate; runs that
fail early end sooner, so a fair share still lands after the run). Sampled rather than
hypothesis' numbers, which favour the bounds; hypothesis favours the first element, so that one
lies inside the run rather than at 0 (before it)."""
SOMETIMES_FRACTION = st.one_of(st.none(), st.none(), FRACTION)
RARELY_FRACTION = st.one_of(st.none(), st.none(), st.none(), FRACTION)


def nominal_length(steps: tuple[Step, ...], retry_after: str, host_delay: float | None,
                   uri_delay: float | None, child_delay: float, bash_shell: Shell,
                   approval_delay: float | None = None) -> float:
    """Roughly how many virtual seconds ``p1``'s run takes undisturbed (``approval_delay``:
    approval is on and the host answers after that long)."""
    total = 0.5  # a threshold or overflow summary call streams 0.5 s
    for step in steps:
        if approval_delay is not None:
            total += (approval_delay or 0.2) * sum(c in ASKING for c in step.calls)
        total += sum(float(retry_after) if f == "unavailable" else 0.5 for f in step.failures)
        total += sum(pause for pause, _ in step.pieces)
        total += (host_delay or 1.0) * ("host" in step.calls)
        total += (uri_delay or 1.0) * ("uri" in step.calls)
        total += child_delay * ("task" in step.calls)  # inline; a background one overlaps
        total += SHELL_LENGTH[bash_shell] * step.calls.count("bash")
    return total


CHILD_DELAYS = st.sampled_from([0.3, 0.0, 1.0, 2.5])
AIM_INDEXES = st.integers(0, 63)
TIMED = st.integers(0, 3).map(lambda n: n == 3)
"""One in four disruptions at a drawn time rather than aimed (hypothesis favours 0: aimed)."""
AIM_DELAYS = st.sampled_from([0.0, 0.0, 0.01, 0.1, 0.3])
"""After the frame that shows the phase: at once (the server may be a step further than the
host saw) or a little into it (the stubborn command's trap is set; a host answer is due)."""


def expected_phases(steps: tuple[Step, ...], *, warm_up: bool, summary_fails: bool,
                    host_delay: float | None, uri_delay: float | None,
                    approval: tuple[float | None, bool] | None = None) -> list[Aim]:
    """The phases ``p1``'s run should show undisturbed, in order, one entry per occurrence
    (a streamed message, a tool call ...), as far as the run should get: an overflow it cannot
    compact away (nothing before the prompt to compact, the summary call fails, or the run
    already compacted once) ends it, and a host that never answers stops it there. An
    estimate: a phase it misses only makes the disruption fall back to ``disrupt_at``.
    ``approval``: (when the host answers a dialog, whether it denies) when approval is on."""
    found: list[Aim] = []
    compacted = False
    for index, step in enumerate(steps):
        for failure in step.failures:
            if failure == "overflow":
                found.append("compaction")
                if compacted or summary_fails or not (warm_up or index > 0):
                    return found
                compacted = True
            else:
                found += ["retry", "streaming"] if failure == "dropped" else ["retry"]
        found.append("streaming")
        for call in step.calls:
            if approval is not None and call in ASKING:
                found.append("approval")
                if approval[0] is None:
                    return found
                if approval[1]:
                    found.append("tool")  # denied: announced and ended at once
                    continue
            found.append("tool")
            if call == "bash":
                found += ["bash", "bash_output"]
            elif call == "task":
                found.append("child")
            elif call in ("host", "uri"):
                found.append("host")
                if (host_delay if call == "host" else uri_delay) is None:
                    return found
    if steps[-1].big_usage:
        found.append("compaction")  # at the threshold, after the final answer
    return found


def aims(disruption: Disruption, phases: list[Aim], rpc_bash: bool) -> list[Aim]:
    """What to aim ``disruption`` at, given the phases expected: those the disruption is about
    when there are any (``abort_retry``: a backoff; ``abort_bash``: an RPC bash), else any of
    them (an RPC bash only for the disruptions that end one)."""
    if disruption == "abort_retry" and "retry" in phases:
        return ["retry"]
    if disruption == "abort_bash" and rpc_bash:
        return ["rpc_bash"]
    found = list(dict.fromkeys(phases))
    if "bash" in found:
        # A shell command cut short is what the kill ladder is for: aimed at twice as often.
        found[:0] = ["bash_output", "bash"]
    if "approval" in found:
        # A dialog pending is what an abort must cancel (not wait for): aimed at more often.
        found[:0] = ["approval", "approval"]
    if rpc_bash and disruption in ("abort", "eof", "abort_eof", "cancel"):
        found.append("rpc_bash")
    return found


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    disruption = draw(DISRUPTIONS)
    answers = NEVER_OR_ANSWERS if disruption in ENDS_RUNS else ANSWERS
    tool_steps = list(draw(TOOL_STEPS))
    bash_at = draw(BASH_AT)
    if bash_at is not None and tool_steps:
        step = tool_steps[bash_at[0] % len(tool_steps)]
        calls = list(step.calls)
        calls.insert(bash_at[1] % (len(calls) + 1), "bash")
        tool_steps[bash_at[0] % len(tool_steps)] = attrs.evolve(step, calls=tuple(calls))
    steps = (*tool_steps, draw(FINAL_STEP))
    retry_after, host_delay, uri_delay = draw(RETRY_AFTER), draw(answers), draw(answers)
    child_delay = draw(CHILD_DELAYS)
    bash_shell, rpc_shell = draw(SHELLS), draw(SHELLS)
    approval = draw(ONE_IN_FOUR)
    approval_delay, approval_denies = draw(answers), draw(ONE_IN_FOUR)
    length = nominal_length(steps, retry_after, host_delay, uri_delay, child_delay, bash_shell,
                            approval_delay if approval else None)
    # abort_bash disrupts nothing without an RPC bash: draw one more often.
    rpc_bash_at = draw(SOMETIMES_FRACTION if disruption == "abort_bash" else RARELY_FRACTION)
    steer_at = draw(SOMETIMES_FRACTION)
    disrupt_at = draw(FRACTION) * length
    trigger = None
    warm_up, summary_fails = draw(BOOLS), draw(ONE_IN_FOUR)
    # Three in four disruptions are aimed at a phase the host observes (at drawn times alone,
    # about half of the examples disrupted nothing: they landed after the run); the rest keep
    # the drawn time, which also reaches the moments between phases.
    if disruption != "none" and not draw(TIMED):
        phases = expected_phases(steps, warm_up=warm_up, summary_fails=summary_fails,
                                 host_delay=host_delay, uri_delay=uri_delay,
                                 approval=(approval_delay, approval_denies) if approval
                                 else None)
        found = aims(disruption, phases, rpc_bash_at is not None)
        aim = found[draw(AIM_INDEXES) % len(found)]
        # The how-manieth of its occurrences (``rpc_bash`` has one): a later message, tool
        # call, retry ... as far as the run should get.
        nth = 1 + draw(AIM_INDEXES) % max(1, phases.count(aim))
        trigger = Trigger(aim, nth, draw(AIM_DELAYS))
        disrupt_at = 1.5 * length + 1.0
        if disruption in WRITTEN_TOGETHER and draw(ONE_IN_FOUR):
            # In the same write as p1 (or as the RPC bash, when that is what it is about).
            about_bash = aim == "rpc_bash" or (
                disruption == "abort_bash" and rpc_bash_at is not None)
            trigger = Trigger("rpc_bash" if about_bash else "prompt", together=True)
    return Scenario(
        warm_up=warm_up, steps=steps, retry_after=retry_after,
        summary_fails=summary_fails, host_delay=host_delay, host_fails=draw(ONE_IN_FOUR),
        host_updates=draw(BOOLS), uri_delay=uri_delay,
        rpc_bash_at=None if rpc_bash_at is None else rpc_bash_at * length,
        steer_at=None if steer_at is None else steer_at * length,
        steer_mode=draw(st.sampled_from(STEER_MODES)), disruption=disruption,
        disrupt_at=disrupt_at, background=draw(BOOLS), child_delay=child_delay,
        child_fails=draw(ONE_IN_FOUR), bash_shell=bash_shell, rpc_shell=rpc_shell,
        approval=approval, approval_delay=approval_delay, approval_denies=approval_denies,
        disrupt_on=trigger)


# --- the fake model's script ---------------------------------------------------------------------


def shell_arguments(pids: str, shell: Shell) -> dict[str, Any]:
    """A bash tool call's or RPC ``bash``'s arguments: the command, which first appends its
    shell's pid (its process group) to ``pids`` for the leftover check, and its timeout."""
    arguments: dict[str, Any] = {"command": f"echo $$ >> {pids}; {SHELL_COMMANDS[shell]}"}
    if shell == "stubborn":
        arguments["timeout"] = STUBBORN_TIMEOUT
    return arguments


def tool_call_chunk(call_id: str, kind: ToolKind, bash_shell: Shell) -> dict[str, Any]:
    if kind == "read":
        return tool_call(call_id, "read", {"path": "notes.txt"})
    if kind == "ls":
        return tool_call(call_id, "ls", {"path": "."})
    if kind == "grep":
        return tool_call(call_id, "grep", {"pattern": "alpha", "path": "notes.txt"})
    if kind == "uri":
        return tool_call(call_id, "read", {"path": "db://rows/1"})
    if kind == "host":
        return tool_call(call_id, "lookup", {"key": call_id})
    if kind == "write":
        return tool_call(call_id, "write", {"path": f"out-{call_id}.txt", "content": "x\n"})
    if kind == "task":
        # Names are job ids: unique per call, so background jobs never collide.
        return tool_call(call_id, "task", {"context": "Look around", "tasks": [
            {"name": f"Kid_{call_id}", "task": f"{CHILD_ASSIGNMENT} for {call_id}"}]})
    return tool_call(call_id, "bash", shell_arguments(BASH_TOOL_PIDS, bash_shell))


def failure_reply(failure: Failure, retry_after: str) -> dict[str, Any]:
    if failure == "unavailable":
        return {"status": 503, "headers": {"retry-after": retry_after},
                "body": {"error": {"message": "The server is overloaded",
                                   "type": "server_error"}}}
    if failure == "dropped":
        return {"chunks": [{"text": "Cut"}, {"text": " off"}], "dropAfter": 1}
    return {"status": 400, "body": OVERFLOW_BODY}


def step_reply(index: int, step: Step, bash_shell: Shell) -> dict[str, Any]:
    chunks: list[dict[str, Any]] = []
    if step.thinking:
        chunks.append({"thinking": "Let me think."})
    for pause, text in step.pieces:
        if pause:
            chunks.append({"delay": pause})
        chunks.append({"text": text})
    chunks += [tool_call_chunk(f"call_{index}_{n}", kind, bash_shell)
               for n, kind in enumerate(step.calls)]
    reply: dict[str, Any] = {"chunks": chunks}
    if step.big_usage:
        reply["usage"] = BIG_USAGE
    return reply


def build_script(scenario: Scenario) -> list[dict[str, Any]]:
    """Turn replies in order (the warm-up, then each step after its failures), then a repeating
    plain answer for any further turn (a resumed steer, a follow-up); summary replies apart."""
    turns: list[dict[str, Any]] = []
    if scenario.warm_up:
        turns.append({"chunks": [{"text": "Warm."}]})
    for index, step in enumerate(scenario.steps):
        turns += [failure_reply(f, scenario.retry_after) for f in step.failures]
        turns.append(step_reply(index, step, scenario.bash_shell))
    child: list[dict[str, Any]] = []
    if scenario.child_fails:
        child.append({"match": CHILD_MATCH, **failure_reply("unavailable", "0")})
    child.append({"match": CHILD_MATCH, "repeat": True, "chunks": [
        *([{"delay": scenario.child_delay}] if scenario.child_delay else []),
        {"text": "Peeked."}, tool_call("yield_1", "yield", {"data": {"seen": "notes"}})]})
    script = child + [{"match": TOOLS_MATCH, **reply} for reply in turns]
    script.append({"match": TOOLS_MATCH, "repeat": True, "chunks": [{"text": "Nothing more."}]})
    if scenario.summary_fails:
        script.append({"match": SUMMARY_MATCH, "status": 500,
                       "body": {"error": {"message": "summary failed", "type": "server_error"}}})
    script.append({"match": SUMMARY_MATCH, "repeat": True,
                   "chunks": [{"delay": 0.5}, {"text": "## Goal\nLook around."}]})
    return script


# --- the host ------------------------------------------------------------------------------------


@attrs.define(eq=False)
class Record:
    """What one example saw."""

    frames: list[Frame] = attrs.field(factory=list)
    """Every frame the host received, in order (responses to its own ``send``s included)."""
    sent: list[Frame] = attrs.field(factory=list)
    """Every frame the host wrote."""
    commands: list[tuple[str, str]] = attrs.field(factory=list)
    """(id, type) of the commands sent with ``Host.command``."""
    prompt_ids: list[str] = attrs.field(factory=list)
    state_ids: list[str] = attrs.field(factory=list)
    """The ``get_state`` sent on each terminal ``agent_end`` (not on a pause while background
    children work)."""
    sent_at: dict[str, int] = attrs.field(factory=dict)
    """For each command sent, how many frames had arrived when the host sent it."""
    sent_time: dict[str, float] = attrs.field(factory=dict)
    """For each command sent, when (virtual time)."""
    together: tuple[str, str] | None = None
    """The ids of the command and the disruption written in one write (``Trigger.together``)."""
    idle_in_flight: dict[Family, int] | None = None
    """What the abort registry held once the host saw the session idle (``Host.settle``); None:
    the example never got there."""
    final_in_flight: dict[Family, int] | None = None
    """What it held once ``serve()`` had returned."""
    disrupted_during: str | None = None
    aim_hit: bool | None = None
    """Whether an aimed disruption found its phase (False: it fell back to ``disrupt_at``)."""
    eof_at: float | None = None
    eof_frames: int | None = None
    """How many frames had arrived when the host closed its input."""
    cancelled_at: float | None = None
    returned_at: float | None = None
    leftover: list[str] = attrs.field(factory=list)


@attrs.define
class Seen:
    """How far the host has looked for an aimed phase, and how often it saw it."""

    upto: int
    hits: int = 0


@attrs.define(eq=False)
class Host:
    """Plays the scenario's host: sends its commands at their virtual times, answers the host
    tool and URIs, and records every frame it receives.

    Its coroutines only wait for frames or for virtual time; cancelled, they stop waiting (a
    command already sent stays sent).
    """

    scenario: Scenario
    record: Record
    pid_files: tuple[Path, ...]
    """Where the shell commands write the pid of their process group (``recorded_pids``)."""
    aborts: AbortRegistry
    """The registry of the ``serve()`` under test (``ServeOptions.aborts``)."""
    recorder: RecordingSendStream | None = None
    disrupted: trio.Event = attrs.field(factory=trio.Event)
    gone: bool = False
    """The host closed its input or cancelled serve(): it sends nothing more."""
    client: RpcClient | None = None
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _responses: dict[Any, Frame] = attrs.field(factory=dict)
    """The first response received for each request id."""
    _subprocess_tools: set[str] = attrs.field(factory=set)
    """bash and grep tool calls running (each runs a subprocess)."""
    threads_busy: bool = False
    """A ``trio.to_thread`` call runs (file tools, session files, settings reads)."""

    # -- answering the server's requests --------------------------------------------------------

    async def _answer_after(self, delay: float | None) -> None:
        # "Never" means "not before the disruption": a request of a run that starts after it
        # (a steer resumed after an abort) is answered at once, or the example could not end.
        if delay is None and not self.disrupted.is_set():
            await trio.sleep_forever()
        await trio.sleep(delay or 0.0)

    async def lookup(self, call: HostToolCall, update: HostToolUpdater) -> ToolResult:
        if self.scenario.host_updates:
            await update("looking")
        await self._answer_after(self.scenario.host_delay)
        if self.scenario.host_fails:
            raise LookupError(f"no entry for {call.toolCallId}")
        return "value"

    async def db(self, request: HostUriRequest) -> str:
        await self._answer_after(self.scenario.uri_delay)
        return "row 1"

    async def ui(self, request: ExtensionUiRequest) -> UiAnswer:
        """Tool approval's ``select`` (no other dialog is opened in these sessions)."""
        if request.method != "select":
            return None
        await self._answer_after(self.scenario.approval_delay)
        return "Deny" if self.scenario.approval_denies else "Approve"

    # -- frames ---------------------------------------------------------------------------------

    async def collect(self, client: RpcClient) -> None:
        """Receive every frame until the connection ends; ask for the state after each run."""
        async for received in client.events:
            frame = to_frame(received)
            self.record.frames.append(frame)
            if frame["type"] == "response":
                self._responses.setdefault(frame.get("id"), frame)
            elif frame["type"] == "tool_execution_start" and frame["toolName"] in ("bash", "grep"):
                self._subprocess_tools.add(frame["toolCallId"])
            elif frame["type"] in ("tool_execution_end", "agent_end"):
                self._subprocess_tools.discard(frame.get("toolCallId", ""))
            if (frame["type"] == "agent_end" and frame.get("isTerminal") is True
                    and not self.gone):
                state_id = f"state-{len(self.record.state_ids) + 1}"
                if await self.command("get_state", id=state_id):
                    self.record.state_ids.append(state_id)
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def real_work(self) -> bool:
        """Whether a subprocess of ours runs, as far as the host can tell, or a worker thread
        (``ThreadWatch``)."""
        return self.threads_busy or bool(self._subprocess_tools) or (
            ("b1", "bash") in self.record.commands and self.answered("b1") is None)

    async def keep_time_close(self) -> None:
        """While a subprocess or a worker thread works in real time, step the virtual clock
        by ``TICK`` every ``TICK_WAIT`` of real time.

        Otherwise autojump, seeing every task blocked, leaps to the next timer, which may be
        an RPC ``bash``'s own 300 s timeout: the command would always time out. With these
        steps a 50 ms command takes about a virtual second, during which the other timers
        (stream pauses, the host's actions) fire in order. Cancelled, it puts the clock back.

        A step goes no further than the next timer due within ``TICK``: each step costs
        ``TICK_WAIT`` of real time, and a step of its own between another task's timers (a
        kill ladder polls every 20 ms through its grace period) would double the cost.
        """
        clock = trio.lowlevel.current_clock()
        assert isinstance(clock, trio.testing.MockClock)
        while True:
            await self.until(self.real_work)
            clock.autojump_threshold = TICK_WAIT
            try:
                # A clock to step, not a state to wait for: nothing signals a subprocess's
                # progress.
                while self.real_work():
                    if self.shell_dying():
                        # Killed, not yet gone: the kernel ends it at its own pace, which a
                        # loaded machine stretches past the kill's virtual deadline at this
                        # clock's speed. Virtual time runs as fast as real time meanwhile.
                        clock.autojump_threshold, clock.rate = math.inf, 1.0
                        await trio.sleep(TICK_WAIT)
                        clock.autojump_threshold, clock.rate = TICK_WAIT, 0.0
                        continue
                    due = trio.lowlevel.current_statistics().seconds_to_next_deadline
                    await trio.sleep(due if 0 < due < TICK else TICK)
            finally:
                clock.autojump_threshold, clock.rate = 0, 0.0

    def shell_dying(self) -> bool:
        """Whether a process of a shell command's group has been killed and is not gone yet
        (``procfs.dying``)."""
        for path in self.pid_files:
            for pgid in recorded_pids(path):
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    continue  # nothing of the group is left, not even a zombie
                except PermissionError:
                    pass
                # The leader first: a kill of the group reaches it with the rest, and its own
                # files take microseconds to read, where finding the members scans all of
                # /proc (a millisecond or more at every step of the clock, most of an
                # example's time while a command runs). The members only once it is gone.
                leader = procfs.stat(pgid)
                if leader is not None and leader.live and leader.pgrp == pgid:
                    if procfs.dying(pgid):
                        return True
                    continue
                if any(procfs.dying(pid) for pid in procfs.group_members(pgid)):
                    return True
        return False

    async def until(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.wait()

    def answered(self, request_id: str) -> Frame | None:
        return self._responses.get(request_id)

    async def command(self, kind: str, **fields: Any) -> bool:
        """Send a command (its response arrives among the frames); False when the connection
        is closed."""
        assert self.client is not None
        # Whatever the command causes arrives after the frames received so far.
        self.record.sent_at[fields["id"]] = len(self.record.frames)
        self.record.sent_time[fields["id"]] = trio.current_time()
        try:
            await self.client.send({"type": kind, **fields})
        except RpcConnectionClosed:
            return False
        self.record.commands.append((fields["id"], kind))
        if kind == "prompt":
            self.record.prompt_ids.append(fields["id"])
        self._notify()
        return True

    # -- the scenario ---------------------------------------------------------------------------

    async def drive(self, serve_scope: trio.CancelScope) -> None:
        """Everything up to the moment the host closes its input (returning does that)."""
        client = self.client
        assert client is not None
        scenario = self.scenario
        aimed = scenario.disrupt_on
        start, since = trio.current_time(), len(self.record.frames)
        with_prompt = aimed is not None and aimed.together and aimed.aim == "prompt"
        if scenario.first_write():
            self.record.disrupted_during = "before ready"
            self.disrupted.set()
        calls = {kind for step in scenario.steps for kind in step.calls}
        if "host" in calls:
            await client.set_host_tools([LOOKUP])
        if "uri" in calls:
            await client.set_host_uri_schemes(["db"])
        if "task" in calls:
            await self.command("set_subagent_subscription", id="sub", level="progress")
        if scenario.warm_up:
            await self.command("prompt", id="w0", message="Warm up")
            await self.until(lambda: any(f["type"] == "prompt_result"
                                         for f in self.record.frames))
            start, since = trio.current_time(), len(self.record.frames)
        if scenario.first_write():
            aimed = None  # written with the abort before ready (``write_first``)
        elif with_prompt:
            # In one write with the disruption behind it.
            if not await self.prompt_with_disruption(serve_scope, since):
                return
            aimed = None
        else:
            await self.command("prompt", id="p1", message="Look around")
        actions: list[tuple[float, str]] = []
        if scenario.rpc_bash_at is not None:
            actions.append((scenario.rpc_bash_at, "bash"))
        if scenario.steer_at is not None:
            actions.append((scenario.steer_at, "steer"))
        if scenario.disruption != "none" and scenario.disrupt_on is None:
            actions.append((scenario.disrupt_at, scenario.disruption))
        actions.sort(key=lambda a: a[0])
        pending = aimed is not None and scenario.disruption != "none"
        seen = Seen(since)
        for at, action in [*actions, (math.inf, "")]:
            if pending:
                assert aimed is not None
                # Whichever comes first: the aimed phase, the next timed action, the fallback.
                with trio.move_on_at(start + min(at, scenario.disrupt_at)):
                    await self.until(functools.partial(self.shows, aimed, seen))
                hit = self.shows(aimed, seen)
                if hit or trio.current_time() >= start + scenario.disrupt_at:
                    pending = False
                    self.record.aim_hit = hit
                    # A drawn instant into the phase, not a wait for something: the disruption
                    # lands at once or a while after the host saw the phase begin.
                    await trio.sleep(aimed.delay)
                    await self.disrupt(scenario.disruption, since, serve_scope)
                    if self.gone:
                        return  # closing the input, or serve() is gone: nothing more is sent
            if not action:
                break
            await trio.sleep_until(start + at)
            if action == "bash" and pending and aimed is not None and aimed.together:
                pending = False
                async with self.written_together("b1"):
                    await self.command("bash", id="b1",
                                       **shell_arguments(RPC_BASH_PIDS, scenario.rpc_shell))
                    await self.disrupt(scenario.disruption, since, serve_scope)
                if self.gone:
                    return
            elif action == "bash":
                await self.command("bash", id="b1",
                                   **shell_arguments(RPC_BASH_PIDS, scenario.rpc_shell))
            elif action == "steer":
                await self.command("prompt", id="p2", message="Also check this",
                                   streamingBehavior=scenario.steer_mode)
            else:
                await self.disrupt(scenario.disruption, since, serve_scope)
                if self.gone:
                    return
        await self.settle()

    async def write_first(self, recorder: RecordingSendStream) -> None:
        """``first_write``: ``p1`` and ``abort`` in one write before the client reads ``ready``
        (a run that made a scope of its own instead of adopting its prompt's would escape the
        abort then)."""
        lines = [{"type": "prompt", "id": "p1", "message": "Look around"},
                 {"type": "abort", "id": "d1"}]
        for frame in lines:
            self.record.sent_at[frame["id"]] = 0
            self.record.sent_time[frame["id"]] = trio.current_time()
            self.record.commands.append((frame["id"], frame["type"]))
        self.record.prompt_ids.append("p1")
        self.record.together = ("p1", "d1")
        await recorder.send_all(b"".join(msgspec.json.encode(f) + b"\n" for f in lines))

    async def prompt_with_disruption(self, serve_scope: trio.CancelScope, since: int) -> bool:
        """``p1`` and the disruption in one write; False when that closed the host's input."""
        async with self.written_together("p1"):
            await self.command("prompt", id="p1", message="Look around")
            await self.disrupt(self.scenario.disruption, since, serve_scope)
        return not self.gone

    @contextlib.asynccontextmanager
    async def written_together(self, command_id: str) -> AsyncIterator[None]:
        """The commands sent in the block reach the server in one write, at its end."""
        assert self.recorder is not None
        async with self.recorder.together():
            yield
        self.record.together = (command_id, "d1")

    def shows(self, aimed: Trigger, seen: Seen) -> bool:
        """Whether the frames received so far show the aimed phase (``seen`` keeps count, so
        each frame is looked at once however often the host checks)."""
        if aimed.together:
            return False  # sent with its command, not on a frame
        if aimed.aim == "rpc_bash":
            return ("b1", "bash") in self.record.commands
        frames = self.record.frames
        while seen.upto < len(frames):
            previous = frames[seen.upto - 1] if seen.upto else None
            seen.hits += aimed.shown_by(frames[seen.upto], previous)
            seen.upto += 1
        return seen.hits >= aimed.nth

    async def disrupt(self, action: str, since: int, serve_scope: trio.CancelScope) -> None:
        frames = self.record.frames
        during = phase(frames, since)
        bash_calls = [f["toolCallId"] for f in frames
                      if f["type"] == "tool_execution_start" and f["toolName"] == "bash"]
        if bash_calls and not any(f["type"] == "tool_execution_end"
                                  and f["toolCallId"] == bash_calls[-1] for f in frames):
            during += ", bash tool running"
        if ("b1", "bash") in self.record.commands and self.answered("b1") is None:
            during += ", rpc bash running"
        self.record.disrupted_during = during
        if action in ("eof", "abort_eof"):
            if action == "abort_eof":
                await self.command("abort", id="d1")
            self.gone = True
        elif action == "cancel":
            self.gone = True
            self.record.cancelled_at = trio.current_time()
            serve_scope.cancel()
        else:
            await self.command(action, id="d1")
        self.disrupted.set()

    async def settle(self) -> None:
        """Wait until every command is answered and the session is idle.

        No timer is involved (a poll every virtual second would run through any number of
        virtual seconds while a real subprocess works): while the session streams, the host
        waits for the next frame that ends something and asks again.
        """
        polls = 0
        while True:
            await self.until(lambda: all(self.answered(i) for i, _ in self.record.commands))
            polls += 1
            since = len(self.record.frames)
            if (not (await self.get_state(f"poll-{polls}"))["isStreaming"]
                    and not self.awaiting_settled()):
                self.record.idle_in_flight = dict(self.aborts.in_flight())
                return
            await self.until(functools.partial(self.ended_something, since))

    def awaiting_settled(self) -> bool:
        """Whether the last run paused for background children (``isTerminal: false``) and
        nothing ended the pause since: their results are still to be delivered. (A queued
        follow-up alone also keeps ``sessionSettled`` false, for good: it waits for the next
        prompt, docs/design/protocol.md#abort.)"""
        for f in reversed(self.record.frames):
            if f["type"] in ("session_settled", "agent_start"):
                return False
            if f["type"] == "agent_end":
                return f.get("isTerminal") is False
        return False

    async def get_state(self, state_id: str) -> dict[str, Any]:
        await self.command("get_state", id=state_id)
        await self.until(lambda: self.answered(state_id) is not None)
        response = self.answered(state_id)
        assert response is not None
        data = response["data"]
        assert isinstance(data, dict)
        return data

    def ended_something(self, since: int) -> bool:
        """Whether a frame that ends a run or a prompt arrived at index ``since`` or later."""
        return any(f["type"] in ("agent_end", "prompt_result", "session_settled")
                   for f in self.record.frames[since:])


@attrs.define(eq=False)
class ThreadWatch(trio.abc.Instrument):
    """Tells the host when worker threads start and stop working: after every task step it
    looks at trio's default thread limiter (what ``trio.to_thread.run_sync`` borrows from).

    Without it a thread's real milliseconds, every task blocked, let autojump leap to the next
    timer, which during a shutdown can be a 10 s cleanup deadline: the example would measure
    the leap, not the server."""

    host: Host

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        limiter = trio.to_thread.current_default_thread_limiter()
        busy = limiter.statistics().borrowed_tokens > 0
        if busy != self.host.threads_busy:
            self.host.threads_busy = busy
            self.host._notify()


# --- one example ---------------------------------------------------------------------------------


def make_dirs(base: Path, scenario: Scenario) -> tuple[Path, Path]:
    """A fresh working directory and agent directory for one example."""
    root = Path(tempfile.mkdtemp(dir=base))
    cwd, agent_dir = root / "cwd", root / "agent"
    cwd.mkdir()
    agent_dir.mkdir()
    (cwd / "notes.txt").write_text("alpha\nbeta\n")
    # Small keepRecentTokens: even a two-message context has something to compact.
    (agent_dir / "config.yml").write_text(
        "retry: {baseDelayMs: 50}\ncompaction: {keepRecentTokens: 1}\n"
        f"async: {{enabled: {'true' if scenario.background else 'false'}}}\n")
    return cwd, agent_dir


async def run_example(scenario: Scenario, cwd: Path, agent_dir: Path) -> Record:
    """One session: the fake LLM, ``serve()`` and the host, until ``serve()`` has returned and
    the host has read everything. On cancellation (the watchdog) all of it is cancelled."""
    record = Record()
    aborts = AbortRegistry()
    host = Host(scenario, record, (cwd / BASH_TOOL_PIDS, cwd / RPC_BASH_PIDS), aborts)
    watch = ThreadWatch(host)
    trio.lowlevel.add_instrument(watch)
    async with open_fake_llm(build_script(scenario)) as fake:
        write_models_yml(agent_dir, fake.base_url)
        options = ServeOptions(model="fake/fake-model", cwd=cwd, agent_dir=agent_dir,
                               persist=False, announce_offline=False, aborts=aborts,
                               extension_objects=[slow_start] if scenario.first_write() else [],
                               approval_mode="always-ask" if scenario.approval else None)
        to_server, server_in = trio.testing.memory_stream_one_way_pair()
        server_out, from_server = trio.testing.memory_stream_one_way_pair()
        recorder = host.recorder = RecordingSendStream(to_server)
        record.sent = recorder.sent
        if scenario.first_write():
            await host.write_first(recorder)
        serve_scope = trio.CancelScope()
        returned = trio.Event()
        async with trio.open_nursery() as nursery:

            async def run_server() -> None:
                try:
                    with serve_scope:
                        await omp.serve(server_in, server_out, options=options)
                finally:
                    record.returned_at = trio.current_time()
                    returned.set()
                    server_out.close()  # serve leaves its streams open: EOF for the host

            nursery.start_soon(run_server)
            async with RpcClient.connect(
                    from_server, recorder, host_tools={"lookup": host.lookup},
                    uri_schemes={"db": host.db}, ui=host.ui, max_buffered_events=math.inf,
                    close_timeout=math.inf) as client:
                host.client = client
                nursery.start_soon(host.collect, client)
                ticking = trio.CancelScope()

                async def tick() -> None:
                    with ticking:
                        await host.keep_time_close()

                nursery.start_soon(tick)
                await host.drive(serve_scope)
                ticking.cancel()
                if record.cancelled_at is not None:
                    await returned.wait()
                else:
                    record.eof_at = trio.current_time()
                    record.eof_frames = len(record.frames)
            # Leaving the block closed the host's output (EOF) and read until the server's
            # output ended, which run_server closes once serve() has returned.
            await returned.wait()
    record.final_in_flight = dict(aborts.in_flight())
    record.leftover = leftover_tasks()
    trio.lowlevel.remove_instrument(watch)  # (an exception leaves it to die with the run)
    return record


async def watched(scenario: Scenario, cwd: Path, agent_dir: Path) -> Record:
    """``run_example`` with a real-time limit (virtual time cannot bound a hang). When the
    example does not end within ``REAL_LIMIT`` the tree of tasks is printed (where each one
    waits), then the example is cancelled."""
    token = trio.lowlevel.current_trio_token()

    def hung(scope: trio.CancelScope) -> None:
        print(f"\nthe example still runs after {REAL_LIMIT} s of real time:\n{task_tree()}",
              file=sys.__stderr__, flush=True)
        scope.cancel()

    with trio.CancelScope() as scope:
        timer = threading.Timer(REAL_LIMIT, token.run_sync_soon, args=(hung, scope))
        timer.start()
        try:
            return await run_example(scenario, cwd, agent_dir)
        finally:
            timer.cancel()
    raise AssertionError(f"the example still ran after {REAL_LIMIT} s of real time")


# --- the checks ----------------------------------------------------------------------------------


def check_example(scenario: Scenario, record: Record, cwd: Path, children: set[int]) -> None:
    """The property.

    Whatever the disruption: ``serve()`` returned within ``SHUTDOWN_BOUND`` of stdin EOF or
    of being cancelled, no task of the ``trio.run`` is left, no child process started during
    the example lives, and every process of a shell command's group still there when serve()
    returned had been killed (``procfs.dying``) and is gone soon after.

    Unless ``serve()`` was cancelled (frames may be lost by design then), in every frame the
    host received up to EOF (the rules of ``omp.testing.check_protocol``, the ones every host
    can check, then this scenario's own): each run that started wrote exactly one terminal
    ``agent_end``, turns and messages nest (``check_runs``, ``check_message_ids``);
    ``auto_retry_*`` and ``auto_compaction_*`` are closed before it (``check_sagas``); each
    tool execution and tool call is paired (``check_tool_calls``); each host tool call and URI
    request was answered or cancelled (``check_host_requests``), and so was each approval dialog
    (``check_dialogs``); each command got one response and each
    accepted prompt one ``prompt_result``; ``get_state`` after a terminal ``agent_end`` says
    ``isStreaming: false`` (``check_idle_after_runs``); ``abort`` answers after the run ended.
    And each run ended the way the host's actions explain (``check_run_outcomes``): a run cut
    short (aborted while a turn, a compaction or a retry backoff was open) was cut by the
    host's ``abort`` (its ``agent_end`` before the abort's response; reason "Interrupted by
    user") or by stdin EOF (after it; "Request was aborted"), ends with an aborted assistant
    message carrying that reason when a turn was open (also after an abort during tools), and
    its prompts' ``prompt_result`` says ``aborted``; any other run ends with its final answer
    (``completed``) or a failed message (``error``, with that message's error); no run ends
    on a tool-use message.
    """
    frames = record.frames
    assert record.leftover == [], record.leftover
    check_registry(record.idle_in_flight, record.final_in_flight)
    assert procfs.children(os.getpid()) == []
    for name in (BASH_TOOL_PIDS, RPC_BASH_PIDS):
        for pid in recorded_pids(cwd / name):
            for member in procfs.group_members(pid):
                # What the server promises is the kill, before serve() returns; how soon a
                # killed process is gone is the kernel's pace, which a busy disk stretches (a
                # process in an uninterruptible read, its exec's pages, acts on SIGKILL after).
                assert procfs.dying(member) or not procfs.alive(member), (
                    f"{name}: process {member} of group {pid} outlived serve() and was not killed")
                assert procfs.wait_gone(member, KILLED_GONE_BOUND), (
                    f"{name}: process {member} of group {pid} was killed but is not gone after "
                    f"{KILLED_GONE_BOUND:.0f} s")
    assert record.returned_at is not None
    if record.cancelled_at is not None:
        took = record.returned_at - record.cancelled_at
        assert took <= SHUTDOWN_BOUND, f"serve() returned {took:.3f} s after it was cancelled"
        return  # frames may be lost by design: only "nothing left running" applies
    assert record.eof_at is not None
    took = record.returned_at - record.eof_at
    assert took <= SHUTDOWN_BOUND, f"serve() returned {took:.3f} s after stdin EOF"

    # Background work: children run in the background, or a steer moved a running command.
    pauses = (scenario.background and scenario.spawns()) or backgrounded(frames)
    disruption, d1_sent = scenario.disruption, record.sent_at.get("d1")
    abort_window = None
    if disruption in ("abort", "abort_eof") and d1_sent is not None:
        abort_window = (d1_sent, responses_by_id(frames)["d1"][0])
    # The protocol's rules (omp.testing.check_protocol: the same for every host), then what
    # only this scenario's host knows to ask.
    check_protocol(frames, record.commands, sent=record.sent, pauses=pauses, stops=Stops(
        abort=abort_window, abort_retry=d1_sent if disruption == "abort_retry" else None,
        eof=record.eof_frames), abort_reason=ABORT_REASON, shutdown_reason=SHUTDOWN_REASON)
    check_idle_after_runs(frames, record.prompt_ids, record.state_ids)
    check_cut_together(frames, record.together, disruption)
    b1_time, d1_time = record.sent_time.get("b1"), record.sent_time.get("d1")
    check_rpc_bash_cut(
        frames, abort_id="d1" if disruption in ("abort", "abort_bash", "abort_eof") else None,
        sent_at=d1_sent, cut_before=(
            scenario.rpc_shell == "stubborn" and b1_time is not None and d1_time is not None
            and b1_time <= d1_time < b1_time + STUBBORN_TIMEOUT))
    if (scenario.disruption in ("abort", "abort_eof") and "p2" not in record.prompt_ids
            and not pauses):
        # abort answers once the run's terminal frames are out (no queued steer, no background
        # result can start the next run before the answer).
        (abort,) = responses_by_id(frames)["d1"]
        check_runs(frames[:abort + 1], complete=True, pauses=pauses)


def report_coverage(scenario: Scenario, record: Record) -> None:
    """What this example exercised, and how long ``serve()`` took to return, for hypothesis'
    statistics. (Not ``target``: steering the draw towards slow shutdowns would starve the
    other combinations.)"""
    frames = record.frames
    stopped_at = record.cancelled_at if record.cancelled_at is not None else record.eof_at
    if record.returned_at is not None and stopped_at is not None:
        took = record.returned_at - stopped_at
        bucket = next(f"<= {limit:g} s" for limit in (0.1, 0.5, 1.0, 2.0, 4.0, math.inf)
                      if took <= limit)
        how = "cancelled" if record.cancelled_at is not None else "stdin EOF"
        event(f"serve() returned after {how} in {bucket} (virtual)")
    if scenario.disruption == "none":
        event("disruption: none")
    else:
        event(f"disruption: {scenario.disruption} during {record.disrupted_during}")
    if scenario.disrupt_on is not None and record.aim_hit is not None:
        event(f"aimed at {scenario.disrupt_on.aim}: "
              f"{'found it' if record.aim_hit else 'fell back to the time'}")
    if any("bash" in step.calls for step in scenario.steps):
        event(f"bash tool command: {scenario.bash_shell}")
    if scenario.approval:
        dialogs = [f for f in frames if f["type"] == "extension_ui_request"]
        asked = sum(f["method"] == "select" for f in dialogs)
        cancelled = sum(f["method"] == "cancel" for f in dialogs)
        event(f"approval: {asked} dialog(s), {cancelled} cancelled"
              f"{', denied' if scenario.approval_denies else ''}")
    if ("b1", "bash") in record.commands:
        event(f"rpc bash command: {scenario.rpc_shell}")
    types = {f["type"] for f in frames}
    for kind in ("auto_retry_start", "host_tool_cancel", "host_uri_cancel",
                 "tool_execution_update"):
        if kind in types:
            event(f"saw: {kind}")
    if scenario.spawns():
        how = "background" if scenario.background else "inline"
        statuses = sorted({f["payload"]["status"] for f in frames
                           if f["type"] == "subagent_lifecycle"})
        event(f"saw: {how} children, lifecycle {'/'.join(statuses) or 'none'}")
        if any(f["type"] == "agent_end" and f.get("isTerminal") is False for f in frames):
            event("saw: run paused for background children")
    for f in frames:
        if f["type"] == "auto_compaction_start":
            event(f"saw: {f['reason']} compaction")
        elif f["type"] == "auto_compaction_end" and f.get("aborted"):
            event("saw: compaction aborted")
        elif f["type"] == "auto_retry_end" and f.get("finalError") == "Retry cancelled":
            event("saw: retry cancelled")
        elif f["type"] == "response" and f.get("command") == "bash":
            data = f.get("data") or {}
            event(f"saw: rpc bash {'cancelled' if data.get('cancelled') else 'completed'}")
        elif f["type"] == "tool_execution_end" and f["toolName"] == "bash":
            event("saw: bash tool ended")
        elif f["type"] == "message_end" and f["message"]["role"] == "assistant":
            names = [b["name"] for b in f["message"]["content"] if b.get("type") == "toolCall"]
            if "write" in names and len(names) > 1:
                event("saw: an exclusive call in a batch")
    if any(f["type"] == "message_end" and f["message"]["role"] == "assistant"
           and f["message"]["stopReason"] == "aborted" for f in frames):
        event("saw: aborted assistant message")
    if backgrounded(frames):
        event("saw: a running command moved to the background")


# --- the test ------------------------------------------------------------------------------------


# Pinned, always run first: a retried attempt that overflows and whose overflow compaction
# fails must still close the retry saga (auto_retry_end before agent_end). This test found it
# left open: Run._attempts returned from its overflow branch without _end_retry.
RETRY_THEN_FAILED_OVERFLOW_COMPACTION = Scenario(
    warm_up=True,
    steps=(Step(failures=("unavailable", "overflow"), thinking=False,
                pieces=((0.0, "Done."),), calls=()),),
    retry_after="1", summary_fails=True, host_delay=0.0, host_fails=False,
    host_updates=False, uri_delay=0.0, rpc_bash_at=None, steer_at=None, steer_mode="steer",
    disruption="none", disrupt_at=0.0)


# Pinned too: an abort while a tool approval dialog waits for a host that does not answer
# ends the run at once, with the dialog's cancel (the original holds the abort instead).
ABORT_WHILE_APPROVAL_PENDS = Scenario(
    warm_up=False,
    steps=(Step(failures=(), thinking=False, pieces=((0.0, "Checking"),), calls=("host",)),
           Step(failures=(), thinking=False, pieces=((0.0, "Done."),), calls=())),
    retry_after="0", summary_fails=False, host_delay=0.0, host_fails=False,
    host_updates=False, uri_delay=0.0, rpc_bash_at=None, steer_at=None, steer_mode="steer",
    disruption="abort", disrupt_at=10.0, approval=True, approval_delay=None,
    disrupt_on=Trigger("approval", 1, 0.1))


# Pinned too: an abort written in the same write as the RPC bash it is about cancels it, so
# the bash's scope is in the registry before the reader reads the next line (the random
# draws find a regression of that (M1 in the module's docstring) only about once in 400).
ABORT_IN_THE_BASHS_WRITE = Scenario(
    warm_up=False,
    steps=(Step(failures=(), thinking=False, pieces=((0.3, "Working"), (0.3, " on it")),
                calls=()),),
    retry_after="0", summary_fails=False, host_delay=0.0, host_fails=False,
    host_updates=False, uri_delay=0.0, rpc_bash_at=0.5, steer_at=None, steer_mode="steer",
    disruption="abort", disrupt_at=2.0, rpc_shell="stubborn",
    disrupt_on=Trigger("rpc_bash", 1, 0.0, together=True))


# Pinned too: an abort in the prompt's own write, read while the prompt waits in the serial
# lane behind the server's start, aborts the run the prompt starts (the run adopts the scope
# the reader registered for it: M3).
ABORT_IN_THE_PROMPTS_WRITE = Scenario(
    warm_up=False,
    steps=(Step(failures=(), thinking=False, pieces=((0.0, "Looking"),), calls=()),),
    retry_after="0", summary_fails=False, host_delay=0.0, host_fails=False,
    host_updates=False, uri_delay=0.0, rpc_bash_at=None, steer_at=None, steer_mode="steer",
    disruption="abort", disrupt_at=1.0, disrupt_on=Trigger("prompt", 1, 0.0, together=True))


# Pinned too: an exclusive call (``write``) after a shared one (``ls``) in one batch starts
# only once the shared one has ended (M5).
A_WRITE_AFTER_A_SHARED_CALL = Scenario(
    warm_up=False,
    steps=(Step(failures=(), thinking=False, pieces=((0.0, "Looking"),), calls=("ls", "write")),
           Step(failures=(), thinking=False, pieces=((0.0, "Done."),), calls=())),
    retry_after="0", summary_fails=False, host_delay=0.0, host_fails=False,
    host_updates=False, uri_delay=0.0, rpc_bash_at=None, steer_at=None, steer_mode="steer",
    disruption="none", disrupt_at=0.0)


SHARDS = 4
"""The examples are split into this many tests, each drawing its own ``EXAMPLES // SHARDS``
scenarios from a seed of its own, so that a parallel run (``pytest -n``) spreads them over
the workers instead of running one test of several minutes."""


def shard(number: int) -> Callable[..., None]:
    """One shard of the property: its own fixed seed (unless ``OMP_CANCELLATION_RANDOM``), so
    CI runs the same scenarios every time; the pinned scenarios run in shard 0."""

    def test(scenario: Scenario, tmp_path: Path) -> None:
        cwd, agent_dir = make_dirs(tmp_path, scenario)
        children = set(procfs.children(os.getpid()))  # an earlier test's are not this example's
        clock = trio.testing.MockClock(autojump_threshold=0)
        record = trio.run(watched, scenario, cwd, agent_dir, clock=clock)
        report_coverage(scenario, record)
        check_example(scenario, record, cwd, children)

    test.__name__ = test.__qualname__ = f"test_cancellation_keeps_the_protocol_{number}"
    # derandomize draws from a digest of the test's code, the same for every shard: a seed
    # per shard instead, which is as deterministic.
    wrapped = given(scenario=scenarios())(test)
    if number == 0:
        wrapped = example(scenario=ABORT_WHILE_APPROVAL_PENDS)(wrapped)
        wrapped = example(scenario=RETRY_THEN_FAILED_OVERFLOW_COMPACTION)(wrapped)
        wrapped = example(scenario=ABORT_IN_THE_BASHS_WRITE)(wrapped)
        wrapped = example(scenario=ABORT_IN_THE_PROMPTS_WRITE)(wrapped)
        wrapped = example(scenario=A_WRITE_AFTER_A_SHARED_CALL)(wrapped)
    wrapped = settings(PROFILE, max_examples=max(1, EXAMPLES // SHARDS),
                       derandomize=False)(wrapped)
    if not RANDOM:
        wrapped = seed(number)(wrapped)
    # 125 examples take about half a minute (2 shared cores; the costly ones are the shell
    # commands, the stubborn one above all); a failure's shrinking runs many more.
    marked: Callable[..., None] = pytest.mark.long(pytest.mark.timeout(600)(wrapped))
    return marked


test_cancellation_keeps_the_protocol_0 = shard(0)
test_cancellation_keeps_the_protocol_1 = shard(1)
test_cancellation_keeps_the_protocol_2 = shard(2)
test_cancellation_keeps_the_protocol_3 = shard(3)
