"""The run saga: one prompt's run, from acceptance to its one terminal ``agent_end``.

Rules, in one place (docs/design/protocol.md#one-terminal-agent_end,
docs/design/protocol.md#session-events, docs/design/protocol.md#abort;
docs/design/agent-loop.md#retry, docs/design/sessions.md#when-compaction-runs;
docs/internals.md#the-run-saga):

* A run owns one ``trio.CancelScope`` (``Run.scope``), registered in the session's
  ``AbortRegistry`` (family ``run``) by whoever accepted the work, before the run starts.
  ``abort`` cancels it, whatever the run is doing: streaming, running tools, waiting out a
  retry backoff, compacting. Nothing else in the run decides about abort; cancellation unwinds
  everything and the run translates it into protocol terms at its scope boundary (the agent's
  ``close_open``, then the ``auto_*_end`` frames of whatever was open).
* A run is one or more attempts (``Agent.run``), each starting with ``agent_start``. No
  ``agent_end`` is written between attempts; the session writes exactly one, terminal, when the
  saga is over, with the last attempt's messages.
* An attempt that failed with a transient error is retried (``auto_retry_start``, a backoff in
  trio time, the failed turn dropped from the live context, a new attempt). The backoff is a
  nested scope, registered (family ``retry``) while it lasts: ``abort_retry`` cancels only it,
  which ends the saga with ``auto_retry_end {success: false, finalError: "Retry cancelled"}``.
  ``auto_retry_end`` comes right before the run's ``agent_end``
  (docs/design/protocol.md#session-events).
* An attempt that overflowed the model's window is compacted and run again, once
  (``auto_compaction_start {reason: "overflow"}``, a warning ``notice``, ``auto_compaction_end
  {willRetry: true}``); with nothing to compact the pair is still written (``skipped: true``,
  ``Nothing to compact``) and the overflow ends the run. After a successful run past the
  threshold the context is compacted before ``agent_end`` (``reason: "threshold"``). Both
  compactions run inside the run's scope.
* An attempt cut by a TTSR rule (``omp.session.rules``) is followed by another one with the
  rule injected, inside the same scope (no ``agent_end`` in between).
* An attempt that completed while todos are unfinished may be followed by another one, after
  a ``todo_reminder`` (``omp.session.reminders``), inside the same scope.
* An abort before the run started writes nothing: the saga reports that it never ran.
* A bug (an exception out of the loop) closes what is open like an abort and ends the run with
  an ``error`` outcome naming it; the session goes on.

The saga never writes ``agent_end``, ``prompt_result`` or ``session_settled``: the session does,
from the ``RunReport``, after the scope has closed.
"""

from __future__ import annotations

import random
import sys
from typing import Literal, Protocol

import attrs
import msgspec
import trio

from ..agent.loop import ABORT_REASON, Agent, Input, Outcome, RunResult
from ..llm.errors import ProviderError
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol.payloads import CompactionResult
from .aborts import AbortRegistry
from .errors import SessionError
from .interjections import Interjections
from .retry import RetryWaitTooLong, backoff_delay, should_retry
from .settings import Settings
from .sink import Published

OVERFLOW_NOTICE = ("The conversation no longer fits the model's context window: compacting it "
                   "and running the turn again.")
RETRY_CANCELLED = "Retry cancelled"
NOTHING_TO_COMPACT = "Nothing to compact (session too small)"
COMPACTION_CANCELLED = "Compaction cancelled"


class RunHost(Protocol):
    """What a run needs from its session."""

    agent: Agent
    settings: Settings
    auto_retry: bool
    auto_compaction: bool
    between: Interjections
    """What the run changes in the context between attempts."""

    def publish(self, event: Published) -> None: ...

    def can_compact(self) -> bool: ...

    def needs_compaction(self) -> bool: ...

    async def summarize(self) -> CompactionResult | None:
        """Compact the live context now; None when there is nothing to compact. Raises
        SessionError when the model call fails. On cancellation nothing was changed."""
        ...


class RunReport(msgspec.Struct, eq=False):
    """How a run ended: what ``agent_end`` and ``prompt_result`` say."""

    outcome: Outcome
    messages: list[m.AgentMessage]
    """The last attempt's messages (``agent_end.messages``)."""
    taken: list[m.AgentMessage]
    """Every message any attempt took in (which accepted prompts this run served)."""
    last: m.AssistantMessage | None
    error: ProviderError | None
    failure: str | None = None
    """An internal error's description (outcome ``error`` without a provider error)."""


@attrs.define(eq=False, repr=False)
class Run:
    host: RunHost
    prompts: list[Input]
    rng: random.Random
    aborts: AbortRegistry
    """Where the retry backoff is registered (``abort_retry`` cancels it there)."""
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)
    """Set by the session once the run's terminal frames are written."""
    tail: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    """Where the session tells extensions the run ended, after ``scope``; abort cancels it
    too (an extension's dialog there must not hold an abort up)."""
    reason: str = ABORT_REASON
    """The aborted assistant message's ``errorMessage`` when the run is aborted."""
    _retries: int = 0
    """Retries of this saga so far (``auto_retry_*.attempt``)."""
    _retry_open: bool = False
    _compacting: Literal["threshold", "overflow"] | None = None

    @property
    def compacting(self) -> bool:
        return self._compacting is not None

    def abort(self, reason: str = ABORT_REASON) -> None:
        """Cancel the run, whatever it is doing (also before it started)."""
        if not self.scope.cancel_called:
            self.reason = reason
        self.scope.cancel()
        self.tail.cancel()

    async def execute(self) -> RunReport | None:
        """Run the saga; None when it was aborted before it started (nothing was written).

        Abort is the cancellation of ``scope``, caught here. Cancelled from outside (the
        session's nursery torn down), ``Cancelled`` propagates and nothing more is written.
        """
        if self.scope.cancel_called:
            return None
        agent = self.host.agent
        taken: list[m.AgentMessage] = []
        result: RunResult | None = None
        failure: str | None = None
        with self.scope:
            try:
                result = await self._attempts(taken)
            except Exception as exc:  # a bug in the loop: report it, keep the session alive
                failure = f"Internal error: {type(exc).__name__}: {exc}"
                print(f"omp: {failure}", file=sys.stderr)
                result = agent.close_open(failure)
                taken += result.messages
        if self.scope.cancelled_caught:
            result = agent.close_open(self.reason)
            taken += result.messages
            self._close_open_saga()
        assert result is not None
        if failure is not None:
            self._close_open_saga()
            return RunReport("error", result.messages, _dedupe(taken), result.last, None,
                             failure)
        outcome: Outcome = "error" if result.outcome == "overflow" else result.outcome
        return RunReport(outcome, result.messages, _dedupe(taken), result.last, result.error)

    async def _attempts(self, taken: list[m.AgentMessage]) -> RunResult:
        host = self.host
        prompts = self.prompts
        recovered = False
        while True:
            result = await host.agent.run(prompts)
            taken += result.messages
            prompts = []
            if host.between.inject_rules(result):
                # A rule cut the stream (or matched): the turn runs again with the rule.
                if self._retry_open:
                    self._end_retry(True, None)
                continue
            if (result.outcome == "overflow" and not recovered and host.auto_compaction
                    and host.can_compact()):
                # The prompt did not fit: compact, then run the turn again
                # (docs/design/sessions.md#when-compaction-runs), once.
                recovered = True
                assert result.last is not None
                host.between.drop_failed_turn(result.last)
                if await self._compact("overflow"):
                    continue
                break  # not compacted: the saga ends with the overflow (retry closed below)
            if result.outcome == "overflow" and not recovered and host.auto_compaction:
                # Nothing to compact: the host still sees the recovery tried and skipped,
                # one start/end pair, before the overflow error ends the run.
                host.publish(ev.AutoCompactionStart(reason="overflow", action="context-full"))
                host.publish(ev.AutoCompactionEnd(
                    action="context-full", aborted=False, willRetry=False, skipped=True,
                    errorMessage=NOTHING_TO_COMPACT))
                break
            delay = self._retry_delay(result)
            if delay is None:
                if result.outcome == "completed" and host.between.remind_todos(result.last):
                    if self._retry_open:
                        self._end_retry(True, None)
                    continue  # unfinished todos: the agent goes on (omp.session.reminders)
                break
            self._retries += 1
            self._retry_open = True
            assert result.last is not None
            host.publish(ev.AutoRetryStart(
                attempt=self._retries, maxAttempts=host.settings.retry.maxRetries,
                delayMs=round(delay * 1000, 1),
                errorMessage=result.last.errorMessage or "unknown error"))
            # Caught here only when abort_retry cancelled it: while the run's own scope is
            # cancelled too (abort), trio lets the cancellation through to that scope.
            with self.aborts.holding("retry") as backoff:
                await trio.sleep(delay)  # trio time: MockClock tests run it instantly
            if backoff.cancelled_caught:
                self._end_retry(False, RETRY_CANCELLED)
                return result
            # The failed attempt leaves the live context (docs/design/agent-loop.md#the-retry-saga);
            # the file keeps it.
            host.between.drop_failed_turn(result.last)
        if self._retry_open:
            ok = result.outcome == "completed"
            self._end_retry(ok, None if ok or result.last is None
                            else result.last.errorMessage or "unknown error")
        if (result.outcome == "completed" and host.auto_compaction
                and host.needs_compaction()):
            await self._compact("threshold")
        return result

    def _retry_delay(self, result: RunResult) -> float | None:
        """Seconds before the next attempt, or None when the saga does not retry."""
        last = result.last
        if result.outcome != "error" or last is None or not self.host.auto_retry:
            return None
        settings = self.host.settings.retry
        if not should_retry(result.error, last, settings, self._retries + 1):
            return None
        try:
            return backoff_delay(self._retries + 1, settings,
                                 result.error.retry_after if result.error else None, self.rng)
        except RetryWaitTooLong as exc:
            if self._retry_open:
                self._end_retry(False, exc.final_error(last.errorMessage or ""))
            return None

    def _end_retry(self, success: bool, final_error: str | None) -> None:
        self._retry_open = False
        self.host.publish(ev.AutoRetryEnd(
            success=success, attempt=self._retries,
            finalError=msgspec.UNSET if final_error is None else final_error))

    async def _compact(self, reason: Literal["threshold", "overflow"]) -> bool:
        """Automatic compaction inside the run's scope; True when the context was compacted."""
        host = self.host
        self._compacting = reason
        host.publish(ev.AutoCompactionStart(reason=reason, action="context-full"))
        if reason == "overflow":
            host.publish(ev.Notice(level="warning", message=OVERFLOW_NOTICE,
                                   source="auto-compaction"))
        try:
            result = await host.summarize()
        except SessionError as exc:
            self._compacting = None
            host.publish(ev.AutoCompactionEnd(action="context-full", aborted=False,
                                              willRetry=False, errorMessage=str(exc)))
            return False
        self._compacting = None
        compacted = result is not None
        host.publish(ev.AutoCompactionEnd(
            action="context-full", aborted=False, willRetry=reason == "overflow" and compacted,
            result=result if result is not None else msgspec.UNSET,
            skipped=True if result is None else msgspec.UNSET))
        return compacted

    def _close_open_saga(self) -> None:
        """After an abort or a bug: end the compaction or retry saga that was open."""
        if self._compacting is not None:
            self._compacting = None
            self.host.publish(ev.AutoCompactionEnd(action="context-full", aborted=True,
                                                   willRetry=False,
                                                   errorMessage=COMPACTION_CANCELLED))
        if self._retry_open:
            self._end_retry(False, RETRY_CANCELLED)


def _dedupe(messages: list[m.AgentMessage]) -> list[m.AgentMessage]:
    seen: set[int] = set()
    out = []
    for message in messages:
        if id(message) not in seen:
            seen.add(id(message))
            out.append(message)
    return out
