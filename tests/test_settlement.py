"""Settlement (omp.session.settlement): how every input a host can wait on ends, as pure state
changes that return the frames to publish. No I/O, no trio."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from omp.agent.loop import user_message
from omp.protocol import events as ev
from omp.protocol import messages as m
from omp.session.run import RunReport
from omp.session.settlement import Activity, Settlement, Ticket

IDLE = Activity(running=False, queued=0, jobs=0)
BUSY = Activity(running=True, queued=0, jobs=0)


def report(outcome: str, *taken: m.AgentMessage) -> RunReport:
    return RunReport(outcome, list(taken), list(taken), None, None)  # type: ignore[arg-type]


def types(frames: Sequence[msgspec.Struct]) -> list[str]:
    return [str(f.__struct_config__.tag) for f in frames]


def test_a_prompt_is_served_by_the_run_that_took_it_in() -> None:
    settlement = Settlement()
    first, second = user_message("one"), user_message("two")
    settlement.accept(Ticket("p1", first))
    settlement.accept(Ticket("p2", second))
    settlement.begin()
    run = object()
    frames = settlement.run_ended(run, [first], report("completed", first), after=IDLE,
                                  resume=False, awaiting=False)
    # p2 was not taken in: it stays open, and the stretch is not over while it waits.
    assert types(frames) == ["agent_end", "prompt_result", "agent_settled", "session_settled"]
    assert frames[1] == ev.PromptResult(id="p1", agentInvoked=True, status="completed",
                                        sessionSettled=True)
    assert [t.request_id for t in settlement.tickets] == ["p2"]


def test_background_work_makes_the_end_not_terminal_and_not_settled() -> None:
    settlement = Settlement()
    message = user_message("go")
    settlement.accept(Ticket("p", message))
    settlement.begin()
    frames = settlement.run_ended(object(), [message], report("completed", message),
                                  after=Activity(running=False, queued=0, jobs=1),
                                  resume=False, awaiting=True)
    # The run's work is over (agent_settled); the session's is not (a job runs).
    assert types(frames) == ["agent_end", "prompt_result", "agent_settled"]
    end, result, _ = frames
    assert isinstance(end, ev.AgentEnd)
    assert end.isTerminal is False
    assert end.awaitingAsyncWork is True
    assert isinstance(result, ev.PromptResult)
    assert result.sessionSettled is False
    # The job ends: the stretch settles once.
    assert types(settlement.settle(IDLE)) == ["session_settled"]
    assert settlement.settle(IDLE) == []


def test_a_run_aborted_before_it_started_reports_its_prompt_aborted_without_agent_end() -> None:
    settlement = Settlement()
    message = user_message("never")
    settlement.accept(Ticket("p", message))
    settlement.begin()
    frames = settlement.run_ended(object(), [message], None, after=IDLE, resume=False,
                                  awaiting=False)
    assert frames == [ev.PromptResult(id="p", agentInvoked=True, status="aborted",
                                      sessionSettled=True), ev.AgentSettled(aborted=True),
                      ev.SessionSettled()]


def test_the_resume_rule() -> None:
    settlement = Settlement()
    aborted, completed = report("aborted"), report("completed")
    assert settlement.resumes(aborted, steering=True, undelivered=False, closing=False)
    assert settlement.resumes(None, steering=True, undelivered=False, closing=False)
    assert not settlement.resumes(completed, steering=True, undelivered=False, closing=False)
    assert settlement.resumes(completed, steering=False, undelivered=True, closing=False)
    assert not settlement.resumes(aborted, steering=True, undelivered=True, closing=True)


def test_an_extension_command_reports_after_it_returned_and_its_run_ended() -> None:
    settlement = Settlement()
    ticket = Ticket("c", command_running=True)
    settlement.accept(ticket)
    settlement.begin()
    run, other = object(), object()
    settlement.bind(ticket, run)
    settlement.bind(ticket, other)  # only its first run is its own
    assert ticket.run is run
    # Another run ending (a background result's) serves nothing of it.
    assert types(settlement.run_ended(other, [], report("completed"), after=BUSY,
                                      resume=False, awaiting=False)) == ["agent_end",
                                                                         "agent_settled"]
    # Its run ends while the command still runs: held until the command returns.
    held = settlement.run_ended(run, [], report("error"), after=IDLE, resume=False,
                                awaiting=False)
    assert types(held) == ["agent_end", "agent_settled", "session_settled"]
    frames = settlement.command_ended(ticket, True, now=IDLE, name="deploy")
    assert len(frames) == 1
    assert isinstance(frames[0], ev.PromptResult)
    assert (frames[0].id, frames[0].agentInvoked, frames[0].status) == ("c", True, "error")
    assert settlement.tickets == []


def test_an_extension_command_without_a_run_is_local() -> None:
    settlement = Settlement()
    ticket = Ticket("c", command_running=True)
    settlement.accept(ticket)
    assert settlement.command_ended(ticket, False, now=IDLE, name="deploy") == [
        ev.PromptResult(id="c", agentInvoked=False, status="error", sessionSettled=True,
                        error=ev.PromptError(message="Extension command /deploy failed",
                                             retryable=False))]


def test_a_command_whose_run_goes_on_is_reported_by_that_run() -> None:
    settlement = Settlement()
    ticket = Ticket("c", command_running=True)
    settlement.accept(ticket)
    settlement.begin()
    run = object()
    settlement.bind(ticket, run)
    assert settlement.command_ended(ticket, True, now=BUSY, name="x") == []
    frames = settlement.run_ended(run, [], report("completed"), after=IDLE, resume=False,
                                  awaiting=False)
    assert types(frames) == ["agent_end", "prompt_result", "agent_settled", "session_settled"]


def test_a_local_command_has_its_prompt_result_at_once() -> None:
    assert Settlement().local("t", BUSY) == [ev.PromptResult(
        id="t", agentInvoked=False, status="completed", sessionSettled=False)]


def test_a_session_change_answers_every_open_ticket_aborted() -> None:
    settlement = Settlement()
    settlement.accept(Ticket("a", user_message("a")))
    settlement.accept(Ticket("b", command_running=True))
    settlement.begin()
    frames = settlement.abort_all(IDLE)
    assert types(frames) == ["prompt_result", "prompt_result", "session_settled"]
    assert {f.status for f in frames if isinstance(f, ev.PromptResult)} == {"aborted"}
    assert settlement.tickets == []


def test_the_close_ends_the_stretch_even_with_messages_left_queued() -> None:
    settlement = Settlement()
    settlement.begin()
    queued = Activity(running=False, queued=2, jobs=0)
    assert settlement.abort_all(queued) == []
    settlement.begin()
    assert settlement.abort_all(queued, closing=True) == [ev.SessionSettled()]


def test_a_run_that_resumes_writes_no_agent_settled_until_the_last_one_ends() -> None:
    """pi's agent_settled: once no run follows by itself (the resume rule), with the last
    run's outcome."""
    settlement = Settlement()
    message = user_message("go")
    settlement.accept(Ticket("p", message))
    settlement.begin()
    first = settlement.run_ended(object(), [message], report("aborted", message), after=IDLE,
                                 resume=True, awaiting=False)
    assert types(first) == ["agent_end", "prompt_result"]
    last = settlement.run_ended(object(), [], report("completed"), after=IDLE, resume=False,
                                awaiting=False)
    assert last[-2:] == [ev.AgentSettled(aborted=False), ev.SessionSettled()]


def test_clear_queue_answers_the_prompts_it_took_out() -> None:
    settlement = Settlement()
    running, queued = user_message("now"), user_message("later")
    settlement.accept(Ticket("p1", running))
    settlement.accept(Ticket("p2", queued))
    assert settlement.dropped([queued]) == [ev.PromptResult(
        id="p2", agentInvoked=False, status="aborted", sessionSettled=False)]
    assert [t.request_id for t in settlement.tickets] == ["p1"]
    assert settlement.dropped([queued]) == []
