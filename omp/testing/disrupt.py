"""Disrupting a run where it hurts: at a phase the host observes, do what a host may do.

``run_disrupted(harness, script, disruption)`` adds ``script`` to the fake LLM, sends a prompt,
waits for the frame that shows the disruption's phase (its ``nth`` occurrence), waits ``delay``
seconds into it, does the disruption's action, then waits until everything is over: every
command answered, every accepted prompt's ``prompt_result`` in, the session idle (or, when the
host closed the server's input, the connection ended). It returns every frame the server wrote
on the connection (``harness.transcript.received``), ready for ``check_protocol`` together with
``harness.transcript.sent`` (``harness.transcript.check()`` does both, knowing when the host
aborted and closed the input).

Phases (``PHASES``): ``streaming`` (an assistant message streams), ``tool`` (a tool call runs),
``host_tool`` (a host tool call waits for the host), ``approval`` (a tool approval dialog is
open: approval must be on, ``ServeOptions.approval_mode``), ``compaction``, ``retry`` (the
backoff before a retried model call). A phase the run never shows (the script does not reach
it) is replaced by the end of the run: the action then lands on an idle session, which must
hold too. ``Disrupted.hit`` says which happened.

Actions (``ACTIONS``): ``abort``; ``abort_and_prompt`` (``abort`` and a new prompt right behind
it, one write); ``steer`` / ``follow_up`` (a prompt with that ``streamingBehavior``);
``abort_bash``; ``withhold_result`` (from now on the host answers no host tool call, URI request
or dialog, then, once one waits for it, closes the server's input: the server must cancel what
waits and end); ``close_input`` (EOF while the host goes on reading); ``stop_reading`` (the host
stops reading the server's output, sends ``abort``, and reads again a moment later).

Everything is bounded by ``RUN_LIMIT`` seconds of trio's clock: a run that does not end
raises ``AssertionError`` with where every task waits. Cancellation stops everything but
what was sent.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import Any, Literal

import attrs
import trio

from .harness import OmpHarness
from .invariants import Frame
from .leaks import task_tree

__all__ = ["ACTIONS", "PHASES", "Action", "Disrupted", "Disruption", "Phase", "run_disrupted"]

Phase = Literal["streaming", "tool", "host_tool", "approval", "compaction", "retry"]
Action = Literal["abort", "abort_and_prompt", "steer", "follow_up", "abort_bash",
                 "withhold_result", "close_input", "stop_reading"]
PHASES: tuple[Phase, ...] = ("streaming", "tool", "host_tool", "approval", "compaction",
                             "retry")
ACTIONS: tuple[Action, ...] = ("abort", "abort_and_prompt", "steer", "follow_up", "abort_bash",
                               "withhold_result", "close_input", "stop_reading")
SUMMARY_REPLY = {"match": {"bodyContains": "context summarization assistant"}, "repeat": True,
                 "chunks": [{"text": "## Goal\nWhat the user asked."}]}
"""Answers every compaction's summary call (and nothing else), so a script's replies are left
for the turns."""
LAST_REPLY = {"repeat": True, "chunks": [{"text": "Noted."}]}
"""After the script: for every further turn (a prompt the disruption sent, the delivery of a
command moved to the background). It stays in play, so it answers all that comes after the
script, and nothing added after it is ever reached."""
STOP_READING_SECONDS = 0.05
RUN_LIMIT = 60.0
"""Seconds (trio's clock) a disrupted run may take before it counts as hung."""


@attrs.frozen
class Disruption:
    """Where and what: the ``nth`` time the run shows ``phase``, ``delay`` seconds into it,
    the host does ``action``."""

    phase: Phase
    action: Action
    nth: int = 1
    delay: float = 0.0


@attrs.define
class Disrupted:
    """How a disruption went: the frames, and whether the phase was found."""

    frames: list[Frame]
    hit: bool
    """The phase showed and the action landed in it (False: after the run)."""


def shows(phase: Phase, frame: Frame, previous: Frame | None) -> bool:
    """Whether ``frame`` (received after ``previous``) shows ``phase`` beginning."""
    t = frame.get("type")
    if phase == "streaming":
        return t == "message_update" and (
            previous is None or previous.get("type") != "message_update"
            or previous.get("messageId") != frame.get("messageId"))
    if phase == "tool":
        return t == "tool_execution_start"
    if phase == "host_tool":
        return t == "host_tool_call"
    if phase == "approval":
        return t == "extension_ui_request" and frame.get("method") == "select"
    if phase == "compaction":
        return t == "auto_compaction_start"
    return t == "auto_retry_start"


REQUESTS = {"host_tool_call": ("host_tool_result", "host_tool_cancel"),
            "host_uri_request": ("host_uri_result", "host_uri_cancel")}


def _waiting_requests(harness: OmpHarness) -> bool:
    """Whether a host tool call, URI request or dialog waits for the host (neither answered
    nor cancelled)."""
    transcript = harness.transcript
    answered = {f.get("id") for f in transcript.sent}
    cancelled: set[Any] = set()
    opened: list[Any] = []
    for f in transcript.received:
        t = f.get("type")
        if t in REQUESTS or (t == "extension_ui_request" and f.get("method") == "select"):
            opened.append(f.get("id"))
        elif t in ("host_tool_cancel", "host_uri_cancel") or (
                t == "extension_ui_request" and f.get("method") == "cancel"):
            cancelled.add(f.get("targetId"))
    return any(i not in answered and i not in cancelled for i in opened)


async def run_disrupted(harness: OmpHarness, script: Iterable[dict[str, Any]],
                        disruption: Disruption, *, message: str = "Go ahead.") -> list[Frame]:
    """Run ``script`` under ``disruption`` (see the module docstring) and return every frame
    the server wrote on the connection. On cancellation the waiting stops; what was sent stays
    sent. One call per harness: what the script leaves unused
    would answer the next call's first requests, and the plain answer the script is followed by
    (for the turns a disruption adds) answers all the requests that come after it."""
    return (await disrupt(harness, script, disruption, message=message)).frames


async def disrupt(harness: OmpHarness, script: Iterable[dict[str, Any]],
                  disruption: Disruption, *, message: str = "Go ahead.") -> Disrupted:
    """``run_disrupted``, also saying whether the phase was found.

    On cancellation the waiting stops and ``Cancelled`` propagates: what was sent stays sent,
    the replies added to ``harness.fake`` stay queued, and the server goes on (its harness
    ends it). Cancelled inside a ``stop_reading`` or ``withhold_result`` action, the host stays
    not reading, or withholding, from then on."""
    fake = harness.fake
    fake.add(SUMMARY_REPLY)
    for reply in script:
        fake.add(reply)
    fake.add(LAST_REPLY)
    with trio.move_on_after(RUN_LIMIT) as timer:
        hit = await _drive(harness, disruption, message)
    if timer.cancelled_caught:
        raise AssertionError(f"{disruption} did not end within {RUN_LIMIT:g} s:\n{task_tree()}")
    _note(disruption, hit)
    return Disrupted(harness.transcript.received, hit)


def _note(disruption: Disruption, hit: bool) -> None:
    """Tell Hypothesis' statistics what was exercised, inside a Hypothesis test (Hypothesis
    is loaded then; it is never imported here: it is optional)."""
    hypothesis = sys.modules.get("hypothesis")
    if hypothesis is None:
        return
    with contextlib.suppress(Exception):  # not inside a Hypothesis test
        hypothesis.event(f"{disruption.action} "
                         f"{'during ' + disruption.phase if hit else 'after the run'}")


async def _drive(harness: OmpHarness, disruption: Disruption, message: str) -> bool:
    prompts = [await harness.send("prompt", message=message)]
    seen = 0
    previous: Frame | None = None
    hit = False
    while True:
        frame = await harness.next_frame()
        if shows(disruption.phase, frame, previous):
            seen += 1
            if seen >= disruption.nth:
                hit = True
                break
        previous = frame
        if _done(harness, prompts):
            break
    if disruption.delay:
        # A drawn moment into the phase, not a wait for something: the action lands at once
        # or a little after the host saw the phase begin.
        await trio.sleep(disruption.delay)
    ended = await _act(harness, disruption.action, prompts)
    if ended:
        await harness.drain()
    else:
        await _settle(harness, prompts)
    return hit


async def _act(harness: OmpHarness, action: Action, prompts: list[str]) -> bool:
    """Do ``action``; True when the host closed the server's input."""
    if action == "abort":
        await harness.send("abort")
    elif action == "abort_and_prompt":
        # Both lines before the client's writer runs: it sends what is queued in one write.
        abort_id, prompt_id = harness.new_id("abort"), harness.new_id("prompt")
        await harness.client.send({"type": "abort", "id": abort_id})
        await harness.client.send({"type": "prompt", "id": prompt_id, "message": "Instead."})
        prompts.append(prompt_id)
    elif action in ("steer", "follow_up"):
        behaviour = "steer" if action == "steer" else "followUp"
        prompts.append(await harness.send("prompt", message="Also this.",
                                          streamingBehavior=behaviour))
    elif action == "abort_bash":
        await harness.send("abort_bash")
    elif action == "withhold_result":
        harness.withhold.update(("host_tool", "host_uri", "dialog"))
        while not _done(harness, prompts):
            if _waiting_requests(harness):
                await harness.transcript.close_input()
                return True
            await harness.next_frame()
    elif action == "close_input":
        await harness.transcript.close_input()
        return True
    else:
        harness.transcript.stop_reading()
        await harness.send("abort")
        # How long the host is away is the point: the server writes on meanwhile.
        await trio.sleep(STOP_READING_SECONDS)
        harness.transcript.resume_reading()
    return False


def _done(harness: OmpHarness, prompts: list[str]) -> bool:
    """Whether every command the host wrote has its response and every accepted prompt its
    ``prompt_result``, as far as the frames the host has read show."""
    transcript = harness.transcript
    responses = {f.get("id"): f for f in transcript.received if f.get("type") == "response"}
    if any(f.get("id") not in responses for f in transcript.commands()):
        return False
    results = {f.get("id") for f in transcript.received if f.get("type") == "prompt_result"}
    return all(p in responses and (not responses[p].get("success") or p in results)
               for p in prompts)


def _paused(harness: OmpHarness) -> bool:
    """Whether the last run paused for background work (``agent_end`` ``isTerminal: false``: a
    steer moved a running command to the background, say) and its results are still to come:
    no run and no ``session_settled`` since."""
    for f in reversed(harness.transcript.received):
        if f.get("type") in ("session_settled", "agent_start"):
            return False
        if f.get("type") == "agent_end":
            return f.get("isTerminal") is False
    return False


async def _settle(harness: OmpHarness, prompts: list[str]) -> None:
    """Wait until every prompt is over, background results are delivered, and the session is
    idle (``get_state``)."""
    while True:
        while not _done(harness, prompts) or _paused(harness):
            await harness.next_frame()
        state = await harness.client.request({"type": "get_state"})
        data = state.data if isinstance(state.data, dict) else {}
        if not data.get("isStreaming") and not _paused(harness):
            return
        await harness.next_frame()  # something is still running: wait for what comes
