"""Aborts through the real ``omp --mode rpc`` process (docs/design/agent-loop.md#abort,
docs/design/protocol.md#abort, docs/design/protocol.md#abort_and_prompt,
docs/internals.md#cancellation-is-the-abort-mechanism).

Every test checks what a host sees (the aborted assistant message, tool results, ``turn_end``,
``agent_end``, the ``abort`` response, ``prompt_result``) and what was left behind: the fake
server saw the HTTP request go away, no tool subprocess survives, the server exits 0.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
from agent_helpers import (
    AgentHarness,
    BlackHole,
    Frame,
    assert_tool_calls_paired,
    check_message_ids,
    frame_types,
    index_of,
    kinds,
    of_type,
    open_agent,
    process_gone,
    text_reply,
    to_frame,
    tool_call,
    tool_result_text,
    tools_reply,
    wait_for_file,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omp
from omp.client import RpcClient
from omp.rpc.server import ServeOptions

ABORTED_BY_USER = "Interrupted by user"
TEST_TIMEOUT = 60


def ended(frames: list[Frame], role: str) -> list[dict[str, Any]]:
    return [f["message"] for f in of_type(frames, "message_end") if f["message"]["role"] == role]


def assistant_text(message: dict[str, Any]) -> str:
    return "".join(b["text"] for b in message["content"] if b["type"] == "text")


def the_prompt_result(frames: list[Frame], request_id: str) -> Frame:
    (result,) = [f for f in of_type(frames, "prompt_result") if f.get("id") == request_id]
    return result


async def abort_and_collect(agent: AgentHarness) -> list[Frame]:
    """Send ``abort``; every frame up to its response. The frames so far are kept too."""
    abort_id = await agent.send("abort")
    await agent.until_response(abort_id)
    return agent.frames


def assert_aborted_run_tail(frames: list[Frame], *, during_tools: bool = False) -> None:
    """The run ends with turn_end, agent_end, its prompt_result and session_settled, all before
    the abort response (which is written once the run has ended).

    An abort during tools ends the tools' turn, then a turn with an empty aborted assistant
    message that no model call made (docs/design/protocol.md#how-an-aborted-run-ends): either way
    the run's last message is the aborted assistant message, as hosts expect.
    """
    tail = kinds(frames[index_of(frames, lambda f: f["type"] == "turn_end"):])
    closing = ["turn_start", "message_start:assistant", "message_end:assistant",
               "turn_end"] if during_tools else []
    assert tail == ["turn_end", *closing, "agent_end", "prompt_result", "agent_settled",
                    "session_settled", "response:abort"], tail
    assert frames[-1]["success"] is True
    (agent_end,) = of_type(frames, "agent_end")
    assert agent_end["isTerminal"] is True
    last = [m for m in agent_end["messages"] if m["role"] == "assistant"][-1]
    assert (last["stopReason"], last["errorMessage"]) == ("aborted", "Interrupted by user")
    if during_tools:
        assert agent_end["messages"][-1] is last
        assert last["content"] == []


# --- while the model streams -------------------------------------------------------------------


async def test_abort_while_streaming_text(tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("Partial", 30.0, " never sent")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Talk slowly", id="p1")
            await agent.until(lambda f: f["type"] == "message_update"
                              and f["assistantMessageEvent"]["type"] == "text_delta")
            started = time.monotonic()
            frames = await abort_and_collect(agent)
            took = time.monotonic() - started
            with trio.fail_after(5):
                await agent.fake.wait_for_disconnect()
            assert await agent.quiet() == []
            state = await agent.data("get_state")

    assert took < 5  # not the 30 s the provider would have taken
    prompt_start = index_of(frames, lambda f: f["type"] == "message_start"
                            and f["message"]["role"] == "assistant")
    assert kinds(frames[prompt_start:]) == [
        "message_start:assistant", "message_update:text_start", "message_update:text_delta",
        "message_end:assistant", "turn_end", "agent_end", "prompt_result", "agent_settled",
        "session_settled", "response:abort"]
    (assistant,) = ended(frames, "assistant")
    assert assistant["stopReason"] == "aborted"
    assert assistant["errorMessage"] == ABORTED_BY_USER
    assert assistant_text(assistant) == "Partial"
    (turn_end,) = of_type(frames, "turn_end")
    assert turn_end["message"] == assistant
    assert turn_end["toolResults"] == []
    (agent_end,) = of_type(frames, "agent_end")
    assert [m["role"] for m in agent_end["messages"]] == ["user", "assistant"]
    assert the_prompt_result(frames, "p1")["status"] == "aborted"
    check_message_ids(frames)
    assert (state["isStreaming"], state["messageCount"]) == (False, 2)


async def test_abort_while_streaming_a_tool_call(tmp_path: Path,
                                                 isolated_agent_dir: Path) -> None:
    # The first call is complete (the second one started after it); the second is cut in the
    # middle of its arguments: the stream hangs there.
    script = [{"chunks": [{"text": "Running."},
                          tool_call("call_done", "bash", {"command": "touch one.txt"}),
                          tool_call("call_half", "bash", {"command": "touch two.txt"})],
               "hangAfter": 3}]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Run things", id="p1")
            await agent.until(lambda f: f["type"] == "message_update"
                              and f["assistantMessageEvent"]["type"] == "toolcall_delta"
                              and f["assistantMessageEvent"]["contentIndex"] == 2)
            frames = await abort_and_collect(agent)
            with trio.fail_after(5):
                await agent.fake.wait_for_disconnect()

    assert_aborted_run_tail(frames)
    (assistant,) = ended(frames, "assistant")
    assert (assistant["stopReason"], assistant["errorMessage"]) == ("aborted", ABORTED_BY_USER)
    # The half-streamed call is dropped from the message; the complete one is kept.
    calls = [b for b in assistant["content"] if b["type"] == "toolCall"]
    assert [(c["id"], c["arguments"]) for c in calls] == [
        ("call_done", {"command": "touch one.txt"})]
    # No tool ran: the kept call gets a synthetic error result.
    assert_tool_calls_paired(frames)
    (turn_end,) = of_type(frames, "turn_end")
    (result,) = turn_end["toolResults"]
    assert (result["toolCallId"], result["isError"]) == ("call_done", True)
    assert result["details"]["source"] == "assistant_stop_aborted"
    assert result["details"]["executed"] is False
    assert "aborted" in tool_result_text(result)
    assert not (tmp_path / "one.txt").exists()
    assert not (tmp_path / "two.txt").exists()
    assert the_prompt_result(frames, "p1")["status"] == "aborted"


# Regression: an abort while httpx connects arrives as a group of Cancelled from
# trio.open_tcp_stream's nursery; the run must still end in protocol order.
async def test_abort_while_the_model_call_connects(tmp_path: Path,
                                                   isolated_agent_dir: Path) -> None:
    hole = BlackHole()
    try:
        with trio.fail_after(TEST_TIMEOUT):
            async with open_agent(tmp_path, isolated_agent_dir, [],
                                  base_url=hole.base_url) as agent:
                await agent.send("prompt", message="Hello?", id="p1")
                await agent.until(lambda f: f["type"] == "message_end"
                                  and f["message"]["role"] == "user")
                await trio.sleep(0.3)  # the connect hangs (test_black_hole_hangs_connects)
                assert agent.frames[-1]["type"] == "message_end"
                frames = await abort_and_collect(agent)
    finally:
        hole.close()
    assert kinds(frames)[-9:] == [
        "message_end:user", "message_start:assistant", "message_end:assistant", "turn_end",
        "agent_end", "prompt_result", "agent_settled", "session_settled", "response:abort"]
    (assistant,) = ended(frames, "assistant")
    assert (assistant["stopReason"], assistant["content"]) == ("aborted", [])
    assert the_prompt_result(frames, "p1")["status"] == "aborted"


async def test_black_hole_hangs_connects() -> None:
    # The setup the test above relies on, checked apart so that its xfail cannot hide it.
    hole = BlackHole()
    try:
        port = int(hole.base_url.rsplit(":", 1)[1])
        with trio.move_on_after(0.3) as waited:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.aclose()
        assert waited.cancelled_caught
    finally:
        hole.close()


# --- while tools run ---------------------------------------------------------------------------


async def test_abort_while_a_tool_runs(tmp_path: Path, isolated_agent_dir: Path) -> None:
    # ``write`` is exclusive: it waits for the command, so the abort finds it not started.
    script = [tools_reply(tool_call("call_sleep", "bash",
                                    {"command": "echo $$ > pid.txt; exec sleep 30"}),
                          tool_call("call_later", "write",
                                    {"path": "later.txt", "content": "later"}))]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Sleep", id="p1")
            with trio.fail_after(10):
                pid = int((await wait_for_file(tmp_path / "pid.txt")).strip())
            assert not process_gone(pid)
            started = time.monotonic()
            frames = await abort_and_collect(agent)
            took = time.monotonic() - started
            # By the time the abort is answered the sleep is dead and reaped.
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
            assert procfs.children(agent.pid) == []
            assert await agent.quiet() == []
            requests = len(agent.fake.requests)

    assert took < 10
    assert_aborted_run_tail(frames, during_tools=True)
    assert_tool_calls_paired(frames)
    check_message_ids(frames)
    turn_end, _ = of_type(frames, "turn_end")
    sleep_result, later_result = turn_end["toolResults"]
    assert sleep_result["toolCallId"] == "call_sleep"
    assert sleep_result["isError"] is True
    assert "aborted" in tool_result_text(sleep_result).lower()
    # The call after it never ran: it gets its frames (start, end, result) after the first
    # one ended, and an error result.
    assert later_result["toolCallId"] == "call_later"
    assert later_result["isError"] is True
    assert tool_result_text(later_result) == (
        "Tool was not executed because the run was aborted: Interrupted by user.")
    assert not (tmp_path / "later.txt").exists()
    assert index_of(frames, lambda f: f["type"] == "tool_execution_start"
                    and f["toolCallId"] == "call_later") > index_of(
        frames, lambda f: f["type"] == "tool_execution_end" and f["toolCallId"] == "call_sleep")
    assert requests == 1  # no model call after the abort
    assert frame_types(frames).count("agent_end") == 1
    assert the_prompt_result(frames, "p1")["status"] == "aborted"


async def test_abort_while_two_shared_tools_run(tmp_path: Path,
                                                isolated_agent_dir: Path) -> None:
    # Two reads of host URLs the host never answers: shared calls that run at once and take
    # as long as the test wants. (A grep over a FIFO, the old way, is refused now; a grep over
    # a sparse terabyte fills the page cache and slows the tests after it.)
    script = [tools_reply(tool_call("call_1", "read", {"path": "db://one"}),
                          tool_call("call_2", "read", {"path": "db://two"}))]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script,
                              answer_unhandled=False) as agent:
            await agent.data("set_host_uri_schemes", schemes=[{"scheme": "db"}])
            await agent.send("prompt", message="Search", id="p1")
            asked: set[str] = set()
            while len(asked) < 2:  # both calls wait for the host at once
                frame = await agent.next_frame()
                if frame["type"] == "host_uri_request":
                    asked.add(frame["url"])
            frames = await abort_and_collect(agent)
            assert procfs.children(agent.pid) == []

    assert_aborted_run_tail(frames, during_tools=True)
    assert_tool_calls_paired(frames)
    turn_end, _ = of_type(frames, "turn_end")
    assert [r["toolCallId"] for r in turn_end["toolResults"]] == ["call_1", "call_2"]
    for result in turn_end["toolResults"]:
        assert result["isError"] is True
        assert "aborted" in tool_result_text(result).lower()


async def test_abort_between_turns(tmp_path: Path, isolated_agent_dir: Path) -> None:
    # The abort lands after the tool finished, while the second model call waits for its first
    # chunk. (The instant between turn_end and the request cannot be hit from outside; the
    # second call's long silence stands for it: nothing of that turn has been streamed yet.)
    (tmp_path / "a.txt").write_text("alpha\n")
    script = [tools_reply(tool_call("call_a", "read", {"path": "a.txt"})),
              text_reply(30.0, "too late")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Read it", id="p1")
            await agent.until_type("turn_end")
            with trio.fail_after(10):
                await agent.fake.wait_until(lambda fake: len(fake.requests) == 2)
            frames = await abort_and_collect(agent)
            with trio.fail_after(5):
                await agent.fake.wait_for_disconnect()

    assert_tool_calls_paired(frames)
    first, second = ended(frames, "assistant")
    assert first["stopReason"] == "toolUse"
    assert (second["stopReason"], second["errorMessage"], second["content"]) == (
        "aborted", ABORTED_BY_USER, [])
    second_turn = frames[index_of(frames, lambda f: f["type"] == "turn_start", 3):]
    assert kinds(second_turn)[:4] == ["turn_start", "message_start:assistant",
                                      "message_end:assistant", "turn_end"]
    assert of_type(second_turn, "turn_end")[0]["toolResults"] == []
    (agent_end,) = of_type(frames, "agent_end")
    assert [m["role"] for m in agent_end["messages"]] == [
        "user", "assistant", "toolResult", "assistant"]
    assert the_prompt_result(frames, "p1")["status"] == "aborted"
    assert kinds(frames)[-1] == "response:abort"


# --- idle, abort_and_prompt, stdin EOF ---------------------------------------------------------


async def test_abort_when_idle_is_a_plain_success(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            abort_id = await agent.send("abort")
            frames = await agent.until_response(abort_id)
            frames += await agent.quiet()
    assert frames == [{"type": "response", "id": abort_id, "command": "abort", "success": True}]


async def test_abort_and_prompt_during_a_run(tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("Old", 30.0, " never"), text_reply("Fresh", " answer.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Old task", id="p1")
            await agent.until(lambda f: f["type"] == "message_update")
            await agent.send("abort_and_prompt", message="New task", id="ap1")
            await agent.until(lambda f: f["type"] == "prompt_result" and f.get("id") == "ap1")
            await agent.until_settled()
            assert await agent.quiet() == []
            frames = agent.frames

    agent_ends = [i for i, f in enumerate(frames) if f["type"] == "agent_end"]
    agent_starts = [i for i, f in enumerate(frames) if f["type"] == "agent_start"]
    response = index_of(frames, lambda f: f.get("id") == "ap1" and f["type"] == "response")
    assert len(agent_starts) == len(agent_ends) == 2
    # The aborted run ends, then the response, then the new run.
    assert agent_ends[0] < response < agent_starts[1]
    assert frames[response]["success"] is True
    assert frames[response]["command"] == "abort_and_prompt"
    first_run, second_run = frames[:agent_ends[0] + 1], frames[agent_starts[1]:]
    (aborted,) = ended(first_run, "assistant")
    assert (aborted["stopReason"], aborted["errorMessage"]) == ("aborted", ABORTED_BY_USER)
    assert the_prompt_result(frames, "p1")["status"] == "aborted"
    assert index_of(frames, lambda f: f["type"] == "prompt_result" and f.get("id") == "p1") \
        < response
    (user,) = ended(second_run, "user")
    assert user["content"] == [{"type": "text", "text": "New task"}]
    (answer,) = ended(second_run, "assistant")
    assert (answer["stopReason"], assistant_text(answer)) == ("stop", "Fresh answer.")
    result = the_prompt_result(frames, "ap1")
    assert (result["status"], result["agentInvoked"]) == ("completed", True)
    assert index_of(frames, lambda f: f["type"] == "prompt_result" and f.get("id") == "ap1") \
        > agent_ends[1]
    check_message_ids(frames)


async def test_stdin_eof_during_a_run(tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [tools_reply(tool_call("call_sleep", "bash",
                                    {"command": "echo $$ > pid.txt; exec sleep 30"}))]
    with trio.fail_after(TEST_TIMEOUT):
        manager = open_agent(tmp_path, isolated_agent_dir, script)
        agent = await manager.__aenter__()
        try:
            await agent.send("prompt", message="Sleep", id="p1")
            with trio.fail_after(10):
                pid = int((await wait_for_file(tmp_path / "pid.txt")).strip())
        finally:
            started = time.monotonic()
            await manager.__aexit__(None, None, None)  # closes the server's stdin
            took = time.monotonic() - started
        # Frames written after EOF are still in the client's buffer.
        while True:
            try:
                agent.frames.append(to_frame(agent.client.events.receive_nowait()))
            except (trio.EndOfChannel, trio.WouldBlock):
                break

    assert agent.client.returncode == 0  # exited by itself: not the client's SIGTERM
    assert took < 5
    assert process_gone(agent.pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    frames = agent.frames
    assert_tool_calls_paired(frames)
    assert frame_types(frames).count("agent_end") == 1
    tail = kinds(frames[index_of(frames, lambda f: f["type"] == "turn_end"):])
    # The tools' turn, then the closing turn with the aborted assistant message.
    assert tail[:6] == ["turn_end", "turn_start", "message_start:assistant",
                        "message_end:assistant", "turn_end", "agent_end"], tail
    (agent_end,) = of_type(frames, "agent_end")
    last = agent_end["messages"][-1]
    assert (last["stopReason"], last["errorMessage"]) == ("aborted", "Request was aborted")
    assert "prompt_result" in tail
    (result,) = of_type(frames, "tool_execution_end")
    assert result["isError"] is True


# --- property: abort at any moment -------------------------------------------------------------

# Real time, on purpose: this is the real process, whose clock the test cannot mock (the
# in-process variant below runs on MockClock). Each example aborts after a random pause
# somewhere in (or after) a run of ~0.6 s that mixes text deltas with pauses, a tool call
# (bash) and a second model call. A warm-up prompt first leaves a keep-alive connection in the
# pool, so the run never opens a TCP connection: aborting *during* a connect is a known bug with
# its own test (test_abort_while_the_model_call_connects) and would make this one flaky.
PROPERTY_SCRIPT = [
    text_reply("Warm."),
    {"chunks": [{"text": "Let"}, {"delay": 0.1}, {"text": " me"}, {"delay": 0.1},
                {"text": " look."},
                tool_call("call_p", "bash", {"command": "sleep 0.2; echo looked"})]},
    text_reply("All", 0.1, " done."),
]


def assert_run_invariants(frames: list[Frame]) -> None:
    """One run's frames, prompt ``p1``: whatever the abort hit, the protocol held."""
    types = frame_types(frames)
    assert types.count("agent_start") == 1, types
    assert types.count("agent_end") == 1, types
    results = [f for f in of_type(frames, "prompt_result") if f.get("id") == "p1"]
    assert len(results) == 1, types
    (agent_end,) = of_type(frames, "agent_end")
    last = agent_end["messages"][-1]
    if last["role"] == "assistant" and last["stopReason"] == "stop":
        # Finished; an abort that lands between the last message and the run's end may still
        # count it as aborted.
        assert results[0]["status"] in ("completed", "aborted"), results
    else:  # cut short: an aborted message, or tool results nobody answered
        assert results[0]["status"] == "aborted", (results, last)
    assert types.index("agent_end") < types.index("prompt_result")
    if "turn_start" in types:
        assert types.count("turn_start") == types.count("turn_end"), types
    assert_tool_calls_paired(frames)
    for message in agent_end["messages"]:
        if message["role"] == "assistant":
            calls = [b["id"] for b in message["content"] if b["type"] == "toolCall"]
            answered = [m["toolCallId"] for m in agent_end["messages"]
                        if m["role"] == "toolResult" and m["toolCallId"] in calls]
            assert sorted(calls) == sorted(answered)
    check_message_ids(frames)


@pytest.mark.long
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pause=st.floats(min_value=0.0, max_value=0.9))
async def test_abort_at_any_moment_keeps_the_protocol(tmp_path: Path, isolated_agent_dir: Path,
                                                      pause: float) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, PROPERTY_SCRIPT) as agent:
            await agent.send("prompt", message="Warm up", id="warm")
            await agent.until_settled()
            agent.frames.clear()
            await agent.send("prompt", message="Look around", id="p1")
            await agent.until_response("p1")
            await trio.sleep(pause)
            abort_id = await agent.send("abort")
            await agent.until_response(abort_id)
            # Whether the abort hit the run or came after it, the run has been reported.
            assert "session_settled" in frame_types(agent.frames)
            assert procfs.children(agent.pid) == []
            frames = agent.frames
            connections = {r.connection for r in agent.fake.requests}
        assert agent.client.returncode == 0
    assert connections == {1}  # the warm-up's connection was reused (see above)
    assert_run_invariants(frames)


# In-process, the same property runs on trio's MockClock: ``omp.serve`` over memory streams
# with the offline model, whose ``[[slow S]]`` paces deltas with ``trio.sleep``, so every pause
# is virtual, costs no wall time, and picks an exact point of the run. The tool is ``todo``,
# which never waits: a subprocess or a thread would be real time, during which autojump would
# race the virtual clock to the next deadline. A sync test that calls ``trio.run`` itself, because
# pytest-trio runs each example of an async test on the real clock.
OFFLINE_PROMPT = '[[slow 0.5]] [[tool todo {"op": "view"}]]'


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pause=st.floats(min_value=0.0, max_value=10.0))
def test_abort_at_any_moment_in_process(tmp_path: Path, isolated_agent_dir: Path,
                                        pause: float) -> None:
    clock = trio.testing.MockClock(autojump_threshold=0)
    frames = trio.run(in_process_example, tmp_path, isolated_agent_dir, pause, clock=clock)
    assert_run_invariants(frames)
    assert clock.current_time() >= pause


async def in_process_example(cwd: Path, agent_dir: Path, pause: float) -> list[Frame]:
    # In memory: the session file's writer thread is real time, which autojump would race.
    options = ServeOptions(model="offline/echo", cwd=cwd, agent_dir=agent_dir,
                           announce_offline=False, persist=False)
    to_server, server_input = trio.testing.memory_stream_one_way_pair()
    server_output, from_server = trio.testing.memory_stream_one_way_pair()
    frames: list[Frame] = []
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:

            async def run_server() -> None:
                await omp.serve(server_input, server_output, options=options)
                await server_output.aclose()  # serve leaves its streams open: EOF for the client

            nursery.start_soon(run_server)
            async with RpcClient.connect(from_server, to_server,
                                         max_buffered_events=math.inf) as client:
                await client.send({"id": "p1", "type": "prompt", "message": OFFLINE_PROMPT})
                await trio.sleep(pause)
                await client.send({"id": "abort-1", "type": "abort"})
                while True:
                    frame = to_frame(await client.events.receive())
                    frames.append(frame)
                    if frame["type"] == "response" and frame.get("id") == "abort-1":
                        break
                assert "session_settled" in frame_types(frames)
                assert procfs.children(os.getpid()) == []
    return [f for f in frames if f["type"] not in ("available_commands_update", "response")
            or f.get("id") == "p1"]
