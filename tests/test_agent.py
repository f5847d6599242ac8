"""The agent loop through the real ``omp --mode rpc`` process, against the fake LLM server.

What a host sees of a run (docs/design/agent-loop.md#the-loop,
docs/design/protocol.md#order-of-a-run): frame order, messageIds, tool results paired with their
calls, steering and follow-up queues, ``prompt_result`` and ``session_settled``, the state commands,
provider errors, event filters. Aborts are in ``test_agent_abort.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import (
    CONTEXT_WINDOW,
    AgentHarness,
    Frame,
    assert_tool_calls_paired,
    check_message_ids,
    frame_types,
    index_of,
    kinds,
    of_type,
    open_agent,
    request_messages,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
)

from omp.tools.eval_settings import missing_dependencies

BUSY = ("Agent is already processing. Use steer() or followUp() to queue messages, or wait for "
        "completion.")
# eval is offered where its extra is installed (`nox -s tests_lowest` runs without it).
BUILTIN_TOOLS = {"read", "bash", "edit", "write", "grep", "glob", "ls", "todo", "task"} | (
    set() if missing_dependencies() else {"eval"})
TEST_TIMEOUT = 60


def assistant_text(message: dict[str, Any]) -> str:
    return "".join(b["text"] for b in message["content"] if b["type"] == "text")


def ended(frames: list[Frame], role: str) -> list[dict[str, Any]]:
    """The final messages of ``role``, in order."""
    return [f["message"] for f in of_type(frames, "message_end") if f["message"]["role"] == role]


def user_text(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(b["text"] for b in content if b["type"] == "text")


def results_for(frames: list[Frame]) -> dict[str, dict[str, Any]]:
    """toolResult messages by toolCallId."""
    return {m["toolCallId"]: m for m in ended(frames, "toolResult")}


def prompt_results(frames: list[Frame], request_id: str) -> list[Frame]:
    return [f for f in of_type(frames, "prompt_result") if f.get("id") == request_id]


def responses(frames: list[Frame], request_id: str) -> list[Frame]:
    return [f for f in of_type(frames, "response") if f.get("id") == request_id]


async def wait_for_text_delta(agent: AgentHarness) -> None:
    await agent.until(lambda f: f["type"] == "message_update"
                      and f["assistantMessageEvent"]["type"] == "text_delta")


# --- scenario 1: text only ---------------------------------------------------------------------


async def test_text_only_prompt_frames_in_protocol_order(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("Hello", ", ", "world.", usage={"input": 30, "output": 4})]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Say hello", id="p1")
            frames = await agent.until_settled()
            assert await agent.quiet() == []  # nothing after session_settled

    assert kinds(frames) == [
        "response:prompt", "agent_start", "turn_start",
        "message_start:user", "message_end:user",
        "message_start:assistant",
        "message_update:text_start",
        "message_update:text_delta", "message_update:text_delta", "message_update:text_delta",
        "message_update:text_end",
        "message_end:assistant", "turn_end", "agent_end", "prompt_result", "agent_settled",
        "session_settled",
    ]
    response = frames[0]
    assert (response["id"], response["success"]) == ("p1", True)

    user, assistant = ended(frames, "user")[0], ended(frames, "assistant")[0]
    # Content blocks, as the original writes a user message (and hosts iterate them).
    assert user["content"] == [{"type": "text", "text": "Say hello"}]
    assert assistant_text(assistant) == "Hello, world."
    assert (assistant["stopReason"], assistant["provider"], assistant["model"]) == (
        "stop", "fake", "fake-model")
    assert assistant["usage"]["input"] == 30
    assert assistant["usage"]["output"] == 4
    deltas = [f["assistantMessageEvent"]["delta"] for f in frames
              if f["type"] == "message_update"
              and f["assistantMessageEvent"]["type"] == "text_delta"]
    assert deltas == ["Hello", ", ", "world."]

    (turn_end,) = of_type(frames, "turn_end")
    assert turn_end["message"] == assistant
    assert turn_end["toolResults"] == []
    (agent_end,) = of_type(frames, "agent_end")
    assert agent_end == {"type": "agent_end", "messages": [user, assistant], "isTerminal": True}
    (result,) = of_type(frames, "prompt_result")
    assert result == {"type": "prompt_result", "id": "p1", "agentInvoked": True,
                      "status": "completed", "sessionSettled": True}

    ids = check_message_ids(frames)
    assert ids == ["msg-1", "msg-2"]  # user, assistant: a process-wide counter from 1
    updates = of_type(frames, "message_update")
    assert {f["messageId"] for f in updates} == {"msg-2"}
    assert [f["messageId"] for f in of_type(frames, "message_end")] == ["msg-1", "msg-2"]


# --- scenario 2: two tool calls ----------------------------------------------------------------


async def test_two_tool_calls_are_paired_and_answered_in_a_second_turn(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    (tmp_path / "a.txt").write_text("alpha contents\n")
    (tmp_path / "b.txt").write_text("beta contents\n")
    script = [
        tools_reply(tool_call("call_a", "read", {"path": "a.txt"}),
                    tool_call("call_b", "read", {"path": "b.txt"}), text="Reading both."),
        text_reply("Both files", " read."),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Read a and b", id="p1")
            frames = await agent.until_settled()
            last = await agent.data("get_last_assistant_text")
            second_request = request_messages(agent.fake, 1)
            requests = len(agent.fake.requests)

    assert_tool_calls_paired(frames)
    check_message_ids(frames)
    assert frame_types(frames).count("turn_start") == 2
    assert frame_types(frames).count("agent_end") == 1
    first, second = ended(frames, "assistant")
    assert first["stopReason"] == "toolUse"
    assert [b["id"] for b in first["content"] if b["type"] == "toolCall"] == ["call_a", "call_b"]
    assert second["stopReason"] == "stop"
    assert assistant_text(second) == "Both files read."

    # The results come in the order the calls ended (they run together): turn_end, the run's
    # messages and the next request all have that order.
    ended_order = [f["toolCallId"] for f in of_type(frames, "tool_execution_end")]
    assert sorted(ended_order) == ["call_a", "call_b"]
    turn_end = of_type(frames, "turn_end")[0]
    assert [r["toolCallId"] for r in turn_end["toolResults"]] == ended_order
    assert turn_end["message"] == first
    by_id = results_for(frames)
    assert "alpha contents" in tool_result_text(by_id["call_a"])
    assert "beta contents" in tool_result_text(by_id["call_b"])
    assert not by_id["call_a"]["isError"]
    assert not by_id["call_b"]["isError"]
    # read is shared: both calls start before either ends
    # (docs/design/agent-loop.md#tool-calls-run-together, omp).
    starts = [i for i, f in enumerate(frames) if f["type"] == "tool_execution_start"]
    ends = [i for i, f in enumerate(frames) if f["type"] == "tool_execution_end"]
    assert max(starts) < min(ends)
    # Each result's message frames follow its tool_execution_end at once.
    for i in ends:
        assert kinds(frames[i + 1:i + 3]) == ["message_start:toolResult", "message_end:toolResult"]
        assert frames[i + 1]["message"]["toolCallId"] == frames[i]["toolCallId"]

    (agent_end,) = of_type(frames, "agent_end")
    assert [m["role"] for m in agent_end["messages"]] == [
        "user", "assistant", "toolResult", "toolResult", "assistant"]
    assert [m["toolCallId"] for m in agent_end["messages"][2:4]] == ended_order

    # The second model call carries both results, paired with the calls by id.
    assert requests == 2
    tool_messages = {m["tool_call_id"]: m for m in second_request if m["role"] == "tool"}
    assert list(tool_messages) == ended_order
    assert "alpha contents" in str(tool_messages["call_a"]["content"])
    assert "beta contents" in str(tool_messages["call_b"]["content"])
    assistant_calls = next(m for m in second_request if m["role"] == "assistant")["tool_calls"]
    assert [c["id"] for c in assistant_calls] == ["call_a", "call_b"]
    assert last == {"text": "Both files read."}
    (result,) = of_type(frames, "prompt_result")
    assert result["status"] == "completed"


async def test_shared_calls_end_and_enter_the_context_in_completion_order(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # ``read`` of a host URL waits for the host's answer, so the test decides which of two
    # concurrent shared calls finishes first (the host answers the second one first).
    script = [
        tools_reply(tool_call("call_1", "read", {"path": "db://first"}),
                    tool_call("call_2", "read", {"path": "db://second"})),
        text_reply("Found them."),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script,
                              answer_unhandled=False) as agent:
            await agent.data("set_host_uri_schemes", schemes=[{"scheme": "db"}])
            await agent.send("prompt", message="Search", id="p1")
            requests: dict[str, str] = {}
            while len(requests) < 2:  # both run at once: neither waits for the other
                frame = await agent.next_frame()
                if frame["type"] == "host_uri_request":
                    requests[frame["url"]] = frame["id"]
                assert frame["type"] != "tool_execution_end"
            await agent.client.send({"type": "host_uri_result", "id": requests["db://second"],
                                     "content": "needle two\n"})
            await agent.until(lambda f: f["type"] == "message_end"
                              and f["message"]["role"] == "toolResult")
            await agent.client.send({"type": "host_uri_result", "id": requests["db://first"],
                                     "content": "needle one\n"})
            await agent.until_settled()
            frames = agent.frames
            second_request = request_messages(agent.fake, 1)

    assert_tool_calls_paired(frames)
    assert [f["toolCallId"] for f in of_type(frames, "tool_execution_end")] == [
        "call_2", "call_1"]
    # As the original writes them: results in the order the calls ended, in the frames, in
    # turn_end and in the context the next request carries.
    turn_end = of_type(frames, "turn_end")[0]
    assert [r["toolCallId"] for r in turn_end["toolResults"]] == ["call_2", "call_1"]
    assert "needle two" in tool_result_text(turn_end["toolResults"][0])
    assert "needle one" in tool_result_text(turn_end["toolResults"][1])
    assert [m["tool_call_id"] for m in second_request if m["role"] == "tool"] == [
        "call_2", "call_1"]


# --- scenario 3: steering during a slow tool ---------------------------------------------------


async def test_steer_during_a_slow_tool_in_wait_mode(tmp_path: Path,
                                                    isolated_agent_dir: Path) -> None:
    # ``interruptMode: wait``: the calls run to their ends and the steer waits for the batch.
    # (``immediate``, where a running command moves to the background: test_tool_batches.py.)
    script = [
        tools_reply(tool_call("call_slow", "bash", {"command": "sleep 1; echo slow done"}),
                    tool_call("call_next", "bash", {"command": "echo ran > next.txt"})),
        text_reply("Changed course."),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.data("set_interrupt_mode", mode="wait")
            await agent.send("prompt", message="Run both", id="p1")
            await agent.until(lambda f: f["type"] == "tool_execution_start"
                              and f["toolCallId"] == "call_slow")
            steer_id = await agent.send("steer", message="Stop, do something else")
            await agent.until_settled()
            frames = agent.frames
            second_request = request_messages(agent.fake, 1)

    assert_tool_calls_paired(frames)
    check_message_ids(frames)
    (steer_response,) = responses(frames, steer_id)
    assert steer_response["success"] is True
    assert prompt_results(frames, steer_id) == []  # steer never gets a prompt_result
    results = results_for(frames)
    assert tool_result_text(results["call_slow"]).strip() == "slow done"
    assert results["call_next"]["isError"] is False
    assert (tmp_path / "next.txt").read_text() == "ran\n"

    # The steer enters the next turn: after turn_end, before the next assistant message.
    first_turn_end = index_of(frames, lambda f: f["type"] == "turn_end")
    assert kinds(frames[first_turn_end + 1:first_turn_end + 5]) == [
        "turn_start", "message_start:user", "message_end:user", "message_start:assistant"]
    steering = frames[first_turn_end + 2]["message"]
    assert steering["steering"] is True
    assert user_text(steering) == "Stop, do something else"
    assert frame_types(frames).count("agent_start") == 1
    assert frame_types(frames).count("agent_end") == 1
    # The model sees both tool results before the steering message, never between call and result.
    roles = [m["role"] for m in second_request]
    assert roles[-4:] == ["assistant", "tool", "tool", "user"]
    assert "Stop, do something else" in str(second_request[-1]["content"])
    (result,) = prompt_results(frames, "p1")
    assert result["status"] == "completed"


# --- scenario 4: follow-ups --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["one-at-a-time", "all"])
async def test_two_follow_ups(tmp_path: Path, isolated_agent_dir: Path, mode: str) -> None:
    script = [text_reply("First", 0.8, " answer."), text_reply("Second answer."),
              text_reply("Third answer.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.data("set_follow_up_mode", mode=mode)
            await agent.send("prompt", message="Start", id="p1")
            await wait_for_text_delta(agent)
            f1 = await agent.send("follow_up", message="Follow one")
            f2 = await agent.send("follow_up", message="Follow two")
            await agent.until_response(f2)
            state = await agent.data("get_state")
            assert state["queuedMessageCount"] == 2
            assert state["isStreaming"] is True
            await agent.until_settled()
            frames = agent.frames
            requests = len(agent.fake.requests)

    check_message_ids(frames)
    assert [r["success"] for r in responses(frames, f1) + responses(frames, f2)] == [True, True]
    types = frame_types(frames)
    assert types.count("agent_start") == 1
    assert types.count("agent_end") == 1
    turns: list[list[str]] = []  # the user messages each turn starts with
    for f in frames:
        if f["type"] == "turn_start":
            turns.append([])
        elif f["type"] == "message_end" and f["message"]["role"] == "user":
            turns[-1].append(user_text(f["message"]))
    if mode == "one-at-a-time":
        assert turns == [["Start"], ["Follow one"], ["Follow two"]]
        assert requests == 3
    else:
        assert turns == [["Start"], ["Follow one", "Follow two"]]
        assert requests == 2
    (agent_end,) = of_type(frames, "agent_end")
    assert [m["role"] for m in agent_end["messages"]] == (
        ["user", "assistant", "user", "assistant", "user", "assistant"] if mode == "one-at-a-time"
        else ["user", "assistant", "user", "user", "assistant"])
    assert all(not m.get("steering") for m in ended(frames, "user"))
    (result,) = of_type(frames, "prompt_result")
    assert (result["id"], result["status"]) == ("p1", "completed")


# --- scenario 5: prompts while busy, queues and state ------------------------------------------


async def test_prompt_while_busy(tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("Working", 0.8, " on it."), text_reply("Steered."),
              text_reply("Followed up.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="First", id="p1")
            await wait_for_text_delta(agent)
            await agent.send("prompt", message="Busy", id="p2")
            await agent.send("prompt", message="As steer", id="p3", streamingBehavior="steer")
            await agent.send("prompt", message="As follow-up", id="p4",
                             streamingBehavior="followUp")
            await agent.until_response("p4")
            state = await agent.data("get_state")
            assert (state["isStreaming"], state["queuedMessageCount"]) == (True, 2)
            await agent.until(lambda f: f["type"] == "prompt_result" and f.get("id") == "p1")
            await agent.until_settled()
            assert await agent.quiet() == []
            frames = agent.frames
            after = await agent.data("get_state")

    # A prompt without streamingBehavior during a run fails once, at once, and is not run.
    (busy,) = responses(frames, "p2")
    assert busy == {"type": "response", "id": "p2", "command": "prompt", "success": False,
                    "error": BUSY}
    assert prompt_results(frames, "p2") == []
    assert index_of(frames, lambda f: f.get("id") == "p2") < index_of(
        frames, lambda f: f["type"] == "agent_end")
    # Queued prompts are acknowledged and then completed by the run that took them in.
    agent_end = index_of(frames, lambda f: f["type"] == "agent_end")
    for request_id in ("p1", "p3", "p4"):
        (response,) = responses(frames, request_id)
        assert response["success"] is True
        (result,) = prompt_results(frames, request_id)
        assert (result["status"], result["agentInvoked"]) == ("completed", True)
        assert frames.index(result) > agent_end
    users = ended(frames, "user")
    assert [user_text(m) for m in users] == ["First", "As steer", "As follow-up"]
    assert [bool(m.get("steering")) for m in users] == [False, True, False]
    assert "Busy" not in str(frames)
    assert frame_types(frames).count("agent_end") == 1
    assert (after["isStreaming"], after["queuedMessageCount"], after["messageCount"]) == (
        False, 0, 6)


async def test_steer_and_follow_up_on_an_idle_session_start_runs(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("Steered answer."), text_reply("Follow-up answer.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            assert await agent.data("get_last_assistant_text") == {}
            assert await agent.data("get_messages") == {"messages": []}
            steer_id = await agent.send("steer", message="Steer while idle")
            steer_frames = await agent.until_settled()
            follow_id = await agent.send("follow_up", message="Follow while idle")
            follow_frames = await agent.until_settled()
            assert await agent.quiet() == []
            messages = (await agent.data("get_messages"))["messages"]
            last = await agent.data("get_last_assistant_text")

    for frames, request_id, steering in ((steer_frames, steer_id, True),
                                         (follow_frames, follow_id, False)):
        assert kinds(frames)[:3] == [f"response:{request_id.rsplit('-', 1)[0]}",
                                     "agent_start", "turn_start"]
        assert frames[0]["success"] is True
        assert of_type(frames, "prompt_result") == []  # only prompts get one
        assert frame_types(frames)[-3:] == ["agent_end", "agent_settled", "session_settled"]
        (user,) = ended(frames, "user")
        assert bool(user.get("steering")) is steering
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert [user_text(messages[0]), user_text(messages[2])] == [
        "Steer while idle", "Follow while idle"]
    assert messages[1] == ended(steer_frames, "assistant")[0]
    assert last == {"text": "Follow-up answer."}


async def test_get_state_during_and_after_a_run(tmp_path: Path,
                                                isolated_agent_dir: Path) -> None:
    script = [text_reply("Thinking", 0.5, " done.", usage={"input": 100, "output": 20})]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            before = await agent.data("get_state")
            await agent.send("prompt", message="Go", id="p1")
            await wait_for_text_delta(agent)
            during = await agent.data("get_state")
            await agent.until_type("agent_end")
            # A host that sees the terminal agent_end may prompt again
            # (docs/design/protocol.md#one-terminal-agent_end).
            after_end = await agent.data("get_state")
            await agent.until_settled()
            after = await agent.data("get_state")

    assert (before["isStreaming"], before["messageCount"], before["queuedMessageCount"]) == (
        False, 0, 0)
    assert (during["isStreaming"], during["messageCount"]) == (True, 1)
    assert after_end["isStreaming"] is False
    assert (after["isStreaming"], after["messageCount"]) == (False, 2)
    assert (after["steeringMode"], after["followUpMode"], after["interruptMode"]) == (
        "one-at-a-time", "one-at-a-time", "immediate")
    assert after["model"]["provider"] == "fake"
    assert after["model"]["id"] == "fake-model"
    prompt = after["systemPrompt"]
    assert isinstance(prompt, list)
    assert prompt
    assert all(isinstance(p, str) and p for p in prompt)
    assert {t["name"] for t in after["dumpTools"]} == BUILTIN_TOOLS
    assert all(t["parameters"]["type"] == "object" for t in after["dumpTools"])
    usage = after["contextUsage"]
    assert usage["contextWindow"] == CONTEXT_WINDOW
    assert 100 <= usage["tokens"] < 1000  # anchored on the reported usage, not re-estimated
    assert usage["percent"] == round(usage["tokens"] / CONTEXT_WINDOW * 100, 6)


# --- provider errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "retryable"), [(429, True), (400, False)])
async def test_provider_error_ends_the_run_with_an_error_result(
        tmp_path: Path, isolated_agent_dir: Path, status: int, retryable: bool) -> None:
    script = [{"status": status, "body": {"error": {"message": "rate limited right now",
                                                    "type": "rate_limit_error"}}}]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.data("set_auto_retry", enabled=False)  # the error itself is the point
            await agent.send("prompt", message="Hello?", id="p1")
            frames = await agent.until_settled()
            last = await agent.data("get_last_assistant_text")

    assert kinds(frames) == [
        "response:prompt", "agent_start", "turn_start", "message_start:user", "message_end:user",
        "message_start:assistant", "message_end:assistant", "turn_end", "agent_end",
        "prompt_result", "agent_settled", "session_settled"]
    (assistant,) = ended(frames, "assistant")
    assert assistant["stopReason"] == "error"
    assert "rate limited right now" in assistant["errorMessage"]
    assert assistant["errorStatus"] == status
    (result,) = of_type(frames, "prompt_result")
    assert (result["id"], result["status"], result["agentInvoked"]) == ("p1", "error", True)
    assert result["error"] == {"message": assistant["errorMessage"], "provider": "fake",
                               "model": "fake-model", "httpStatus": status,
                               "retryable": retryable}
    assert last == {}  # an error turn has no text


# --- event filter ------------------------------------------------------------------------------


async def test_event_filter_delta_updates_and_type_filter(tmp_path: Path,
                                                          isolated_agent_dir: Path) -> None:
    script = [text_reply("Delta", " mode", " works."), text_reply("Filtered."),
              text_reply("All back.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            shown = await agent.data("set_event_filter", messageUpdates="delta")
            assert shown == {"events": None, "messageUpdates": "delta"}
            await agent.send("prompt", message="one", id="p1")
            delta_frames = await agent.until_settled()

            shown = await agent.data("set_event_filter", events=["agent_end"])
            assert shown["events"] == ["agent_end"]
            await agent.send("prompt", message="two", id="p2")
            filtered = await agent.until_settled()

            await agent.data("set_event_filter", events=None, messageUpdates="snapshot")
            await agent.send("prompt", message="three", id="p3")
            restored = await agent.until_settled()

    updates = of_type(delta_frames, "message_update")
    assert updates
    for f in updates:
        assert "message" not in f
        assert "partial" not in f["assistantMessageEvent"]
        assert f["messageId"] == "msg-2"
    deltas = "".join(f["assistantMessageEvent"].get("delta", "") for f in updates
                     if f["assistantMessageEvent"]["type"] == "text_delta")
    (assistant,) = ended(delta_frames, "assistant")
    assert deltas == assistant_text(assistant) == "Delta mode works."
    text_end = [f for f in updates if f["assistantMessageEvent"]["type"] == "text_end"]
    assert text_end[0]["assistantMessageEvent"]["content"] == "Delta mode works."
    check_message_ids(delta_frames)

    # Only session events are filtered: responses, prompt_result, session_settled still come.
    assert kinds(filtered) == ["response:prompt", "agent_end", "prompt_result",
                               "session_settled"]
    assert [m["role"] for m in filtered[1]["messages"]] == ["user", "assistant"]
    assert filtered[2]["status"] == "completed"

    # Ids were assigned to the dropped frames too (msg-3, msg-4).
    assert check_message_ids(restored) == ["msg-5", "msg-6"]
    assert all("message" in f for f in of_type(restored, "message_update"))


# --- images ------------------------------------------------------------------------------------


async def test_images_on_a_text_only_model_are_refused(tmp_path: Path,
                                                       isolated_agent_dir: Path) -> None:
    image = {"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            await agent.send("prompt", message="What is this?", images=[image], id="p1")
            await agent.send("steer", message="And this?", images=[image], id="s1")
            frames = await agent.until_response("s1")
            frames += await agent.quiet()
            state = await agent.data("get_state")
            requests = len(agent.fake.requests)

    assert kinds(frames) == ["response:prompt", "response:steer"]
    for frame in frames:
        assert frame["success"] is False
        assert "does not accept images" in frame["error"]
    assert (state["isStreaming"], state["messageCount"]) == (False, 0)
    assert requests == 0


# --- bad tool calls ----------------------------------------------------------------------------


async def test_unknown_tool_and_invalid_arguments_become_error_results(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [
        tools_reply(tool_call("call_x", "nope", {"anything": 1}),
                    tool_call("call_v", "read", {"pth": "a.txt"})),
        text_reply("Recovered."),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Try tools", id="p1")
            frames = await agent.until_settled()
            second_request = request_messages(agent.fake, 1)

    assert_tool_calls_paired(frames)
    results = results_for(frames)
    assert results["call_x"]["isError"] is True
    assert tool_result_text(results["call_x"]).startswith("Tool nope not found")
    invalid = tool_result_text(results["call_v"])
    assert results["call_v"]["isError"] is True
    assert invalid.startswith('Validation failed for tool "read":\n')
    assert "path" in invalid
    assert "Received arguments:" in invalid
    assert '"pth": "a.txt"' in invalid
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    assert ends["call_x"]["isError"] is True
    assert ends["call_v"]["isError"] is True
    # The loop went on: the model read both errors and answered.
    tool_messages = {m["tool_call_id"]: str(m["content"]) for m in second_request
                     if m["role"] == "tool"}
    assert "Tool nope not found" in tool_messages["call_x"]
    assert 'Validation failed for tool "read"' in tool_messages["call_v"]
    assert assistant_text(ended(frames, "assistant")[-1]) == "Recovered."
    (result,) = of_type(frames, "prompt_result")
    assert result["status"] == "completed"


# --- auto-retry ----------------------------------------------------------------------------------


async def test_retryable_error_is_retried_then_succeeds(tmp_path: Path,
                                                        isolated_agent_dir: Path) -> None:
    script: list[dict[str, Any]] = [
        {"status": 503, "headers": {"retry-after": "0.2"},
         "body": {"error": {"message": "overloaded, try again"}}},
        text_reply("Second time lucky.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Hello?", id="p1")
            frames = await agent.until_settled()
            messages = (await agent.data("get_messages"))["messages"]
    (start,) = of_type(frames, "auto_retry_start")
    assert (start["attempt"], start["maxAttempts"]) == (1, 10)
    assert start["delayMs"] >= 200  # retry-after is a minimum
    assert "overloaded, try again" in start["errorMessage"]
    (end,) = of_type(frames, "auto_retry_end")
    assert (end["success"], end["attempt"]) == (True, 1)
    # One run, one agent_end: no agent_end between the failed attempt and its retry
    # (docs/design/protocol.md#one-terminal-agent_end); auto_retry_end comes right before the run's
    # end.
    assert [k for k in kinds(frames) if k in (
        "agent_start", "message_end:assistant", "turn_end", "auto_retry_start",
        "auto_retry_end", "agent_end", "prompt_result")] == [
        "agent_start", "message_end:assistant", "turn_end", "auto_retry_start",
        "agent_start", "message_end:assistant", "turn_end", "auto_retry_end", "agent_end",
        "prompt_result"]
    (agent_end,) = of_type(frames, "agent_end")
    assert agent_end["isTerminal"] is True
    assert [m["role"] for m in agent_end["messages"]] == ["assistant"]  # the last attempt's
    (result,) = of_type(frames, "prompt_result")
    assert result["status"] == "completed"
    # The failed attempt left the live context; the answer is there.
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[1]["stopReason"] == "stop"


async def test_abort_retry_stops_the_backoff(tmp_path: Path, isolated_agent_dir: Path) -> None:
    script: list[dict[str, Any]] = [
        {"status": 429, "headers": {"retry-after": "30"},
         "body": {"error": {"message": "slow down"}}}]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Hello?", id="p1")
            await agent.until_type("auto_retry_start")
            started = trio.current_time()
            await agent.send("abort_retry", id="ar")
            frames = await agent.until_settled()
            assert trio.current_time() - started < 5  # not the 30 s the provider asked for
    (end,) = of_type(frames, "auto_retry_end")
    assert (end["success"], end["finalError"]) == (False, "Retry cancelled")
    (result,) = of_type(frames, "prompt_result")
    assert result["status"] == "error"
    assert result["error"]["retryable"] is True
