"""A batch of tool calls through the real ``omp --mode rpc`` process (issue 33, ``omp.agent.loop``).

The calls of one assistant message run by the original's rule: ``shared`` calls together, an
``exclusive`` one after every call before it and before every call after it; their frames come
in the order they start and end; an abort ends each once and leaves no process; a steer moves a
running command to the background at once. Commands wait for files the test creates, so what a
test asserts is an order of events, never a duration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import procfs
import trio
from agent_helpers import (
    Frame,
    assert_tool_calls_paired,
    check_message_ids,
    index_of,
    kinds,
    of_type,
    open_agent,
    pid_in,
    request_messages,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
)

TEST_TIMEOUT = 60
BACKGROUNDED_EARLY = ("Backgrounded early to handle an incoming message; the command keeps "
                      "running.")


def gated(name: str, then: str = "") -> str:
    """A command that records its pid in ``<name>.pid`` and waits for the file ``<name>.go``
    (which the test creates) before it prints ``<name> done`` (and runs ``then``)."""
    return (f"echo $$ > {name}.pid; while [ ! -e {name}.go ]; do sleep 0.02; done; "
            f"{then}echo {name} done")


def at(frames: list[Frame], kind: str, call_id: str) -> int:
    return index_of(frames, lambda f: f["type"] == kind and f.get("toolCallId") == call_id)


def results_by_id(frames: list[Frame]) -> dict[str, dict[str, Any]]:
    return {f["message"]["toolCallId"]: f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "toolResult"}


async def test_shared_calls_run_together(tmp_path: Path, isolated_agent_dir: Path) -> None:
    # Each command waits until the other one has started: run one after the other, neither
    # could end (the test would time out).
    script = [tools_reply(
        tool_call("a", "bash", {"command": "touch a.on; while [ ! -e b.on ]; do sleep 0.02; "
                                           "done; sleep 0.2; echo A"}),
        tool_call("b", "bash", {"command": "touch b.on; while [ ! -e a.on ]; do sleep 0.02; "
                                           "done; sleep 0.2; echo B"})),
        text_reply("Both ran.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Run both", id="p1")
            frames = await agent.until_settled()
            second_request = request_messages(agent.fake, 1)

    assert_tool_calls_paired(frames)
    check_message_ids(frames)
    # Both starts before either end (docs/design/agent-loop.md#tool-calls-run-together).
    assert max(at(frames, "tool_execution_start", c) for c in "ab") < min(
        at(frames, "tool_execution_end", c) for c in "ab")
    results = results_by_id(frames)
    assert (tool_result_text(results["a"]), tool_result_text(results["b"])) == ("A\n", "B\n")
    # The results enter the context in the order the calls ended; the next request has both.
    ended = [f["toolCallId"] for f in of_type(frames, "tool_execution_end")]
    (turn_end, _) = of_type(frames, "turn_end")
    assert [r["toolCallId"] for r in turn_end["toolResults"]] == ended
    assert [m["tool_call_id"] for m in second_request if m["role"] == "tool"] == ended


async def test_an_exclusive_call_waits_for_the_calls_before_it_and_holds_back_the_rest(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [tools_reply(
        tool_call("a", "bash", {"command": gated("a")}),
        tool_call("b", "bash", {"command": gated("b")}),
        tool_call("w", "write", {"path": "w.txt", "content": "written\n"}),
        tool_call("c", "bash", {"command": "cat w.txt"})),
        text_reply("Done.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Go", id="p1")
            await pid_in(tmp_path / "a.pid")
            await pid_in(tmp_path / "b.pid")
            # Both shared commands run; the write has not started (it would be written now).
            started = [f["toolCallId"] for f in agent.frames
                       if f["type"] == "tool_execution_start"]
            assert "w" not in started
            assert not (tmp_path / "w.txt").exists()
            (tmp_path / "b.go").touch()
            await agent.until(lambda f: f["type"] == "tool_execution_end"
                              and f["toolCallId"] == "b")
            (tmp_path / "a.go").touch()
            frames = await agent.until_settled()
            frames = agent.frames

    assert_tool_calls_paired(frames)
    check_message_ids(frames)
    start = {c: at(frames, "tool_execution_start", c) for c in "abwc"}
    end = {c: at(frames, "tool_execution_end", c) for c in "abwc"}
    assert max(start["a"], start["b"]) < min(end["a"], end["b"])
    assert max(end["a"], end["b"]) < start["w"] < end["w"] < start["c"]
    results = results_by_id(frames)
    assert tool_result_text(results["c"]) == "written\n"
    assert [f["toolCallId"] for f in of_type(frames, "tool_execution_end")] == [
        "b", "a", "w", "c"]


async def test_host_tools_of_one_batch_reach_the_host_together(tmp_path: Path,
                                                              isolated_agent_dir: Path) -> None:
    tool = {"name": "lookup", "description": "Look a key up on the host.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                           "required": ["key"]}}
    script = [tools_reply(*(tool_call(f"h{n}", "lookup", {"key": f"k{n}"}) for n in range(3))),
              text_reply("Looked up.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script,
                              answer_unhandled=False) as agent:
            await agent.data("set_host_tools", tools=[tool])
            await agent.send("prompt", message="Look up three keys", id="p1")
            calls: dict[str, Frame] = {}
            while len(calls) < 3:  # all three are asked before any is answered
                frame = await agent.next_frame()
                if frame["type"] == "host_tool_call":
                    calls[frame["toolCallId"]] = frame
                assert frame["type"] != "tool_execution_end"
            for call in calls.values():
                await agent.client.send({
                    "type": "host_tool_result", "id": call["id"],
                    "result": {"content": [{"type": "text",
                                            "text": f"value of {call['arguments']['key']}"}]}})
            frames = await agent.until_settled()
            frames = agent.frames

    assert_tool_calls_paired(frames)
    assert sorted(calls) == ["h0", "h1", "h2"]
    results = results_by_id(frames)
    assert {c: tool_result_text(r) for c, r in results.items()} == {
        "h0": "value of k0", "h1": "value of k1", "h2": "value of k2"}


async def test_abort_during_a_batch_ends_every_call_once_and_leaves_no_process(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # Three commands, each with a child of its own in its process group, and an exclusive call
    # behind them that has not started when the abort comes.
    def command(n: int) -> str:
        return f"sleep 60 & echo $! > kid{n}.pid; echo $$ > sh{n}.pid; wait"

    script = [tools_reply(*(tool_call(f"c{n}", "bash", {"command": command(n)})
                            for n in range(3)),
                          tool_call("w", "write", {"path": "w.txt", "content": "never"}))]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Go", id="p1")
            pids = [await pid_in(tmp_path / f"{kind}{n}.pid")
                    for n in range(3) for kind in ("sh", "kid")]
            assert all(procfs.alive(pid) for pid in pids)
            abort_id = await agent.send("abort")
            await agent.until_response(abort_id)  # written once the run has ended
            # Every process of every group is dead by the time the abort is answered.
            assert all(not procfs.alive(pid) for pid in pids)
            assert procfs.children(agent.pid) == []
            frames = agent.frames

    assert_tool_calls_paired(frames)  # one start and one end per call, no more
    check_message_ids(frames)
    turn_end = of_type(frames, "turn_end")[0]
    results = {r["toolCallId"]: r for r in turn_end["toolResults"]}
    assert sorted(results) == ["c0", "c1", "c2", "w"]
    for n in range(3):
        assert results[f"c{n}"]["isError"] is True
        assert "aborted" in tool_result_text(results[f"c{n}"]).lower()
    assert tool_result_text(results["w"]) == (
        "Tool was not executed because the run was aborted: Interrupted by user.")
    assert not (tmp_path / "w.txt").exists()
    (result,) = [f for f in of_type(frames, "prompt_result") if f.get("id") == "p1"]
    assert result["status"] == "aborted"


async def test_a_steer_moves_a_running_command_to_the_background(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # interruptMode immediate (the default). The call answers at once, with the original's
    # texts, while its command still runs; the steer reaches the model; the command's output
    # comes later, delivered on its own.
    script = [
        tools_reply(tool_call("slow", "bash", {"command": "echo early output; " + gated("s")}),
                    tool_call("sib", "bash", {"command": "echo sibling"})),
        text_reply("Changed course."),
        {"match": {"bodyContains": "Background job bg_1"}, **text_reply("Saw the output.")},
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Run it", id="p1")
            pid = await pid_in(tmp_path / "s.pid")
            # The sibling has ended (else it would move to the background too, as bg_1).
            await agent.until(lambda f: f["type"] == "tool_execution_end"
                              and f["toolCallId"] == "sib")
            if not any(f["type"] == "tool_execution_update"
                       and "early output" in tool_result_text(f["partialResult"])
                       for f in agent.frames):
                await agent.until(lambda f: f["type"] == "tool_execution_update"
                                  and "early output" in tool_result_text(f["partialResult"]))
            await agent.send("steer", message="Stop, do something else")
            await agent.until(lambda f: f["type"] == "tool_execution_end"
                              and f["toolCallId"] == "slow")
            # The answer came while the command still runs (it waits for s.go).
            assert procfs.alive(pid)
            first_end = await agent.until(lambda f: f["type"] == "agent_end")
            assert first_end[-1]["isTerminal"] is False  # the job will wake the session
            assert procfs.alive(pid)
            (tmp_path / "s.go").touch()
            await agent.until_settled()
            frames = agent.frames
            third_request = request_messages(agent.fake, 2)
            assert procfs.children(agent.pid) == []

    assert_tool_calls_paired(frames)
    check_message_ids(frames)
    results = results_by_id(frames)
    answer = tool_result_text(results["slow"])
    assert answer == ("early output\n\n" + BACKGROUNDED_EARLY + "\n\n"
                      "Backgrounded as job bg_1; result will be delivered automatically.")
    assert results["slow"]["isError"] is False
    assert results["slow"]["details"]["async"] == {"state": "running", "jobId": "bg_1",
                                                   "type": "bash"}
    assert tool_result_text(results["sib"]) == "sibling\n"  # not skipped
    # The steer enters right after the batch, before the next assistant message.
    first_turn_end = index_of(frames, lambda f: f["type"] == "turn_end")
    assert kinds(frames[first_turn_end + 1:first_turn_end + 4]) == [
        "turn_start", "message_start:user", "message_end:user"]
    # The job's output arrives later, as its own delivery, once.
    deliveries = [f["message"] for f in of_type(frames, "message_end")
                  if f["message"]["role"] == "custom"
                  and f["message"]["customType"] == "async-result"]
    (delivery,) = deliveries
    assert delivery["content"].startswith(
        "<system-notice>\nBackground job bg_1 has completed. Resume your work using the "
        "result below.\nearly output\ns done\n")
    output_file = results["slow"]["details"]["fullOutputPath"]
    assert f"Full output: {output_file}" in delivery["content"]
    assert await trio.Path(output_file).read_text() == "early output\ns done\n"
    assert delivery["details"]["jobs"][0]["jobId"] == "bg_1"
    assert delivery["details"]["jobs"][0]["type"] == "bash"
    assert index_of(frames, lambda f: f is first_end[-1]) < index_of(
        frames, lambda f: f["type"] == "message_end" and f["message"] is delivery)
    assert "s done" in str(third_request[-1]["content"])


async def test_a_command_past_the_threshold_becomes_a_job(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text(
        "bash:\n  autoBackground:\n    thresholdMs: 200\n")
    script = [tools_reply(tool_call("slow", "bash", {"command": gated("s")})),
              text_reply("It runs in the background."),
              {"match": {"bodyContains": "Background job bg_1"}, **text_reply("Done now.")}]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Run it", id="p1")
            pid = await pid_in(tmp_path / "s.pid")
            await agent.until(lambda f: f["type"] == "tool_execution_end")
            assert procfs.alive(pid)  # it answered while the command runs
            await agent.until(lambda f: f["type"] == "agent_end")
            (tmp_path / "s.go").touch()
            await agent.until_settled()
            frames = agent.frames

    results = results_by_id(frames)
    assert tool_result_text(results["slow"]) == (
        "Backgrounded as job bg_1; result will be delivered automatically.")
    (delivery,) = [f["message"] for f in of_type(frames, "message_end")
                   if f["message"]["role"] == "custom"]
    assert "s done" in delivery["content"]
