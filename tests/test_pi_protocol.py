"""pi's RPC surface beside the original's, through the real ``omp --mode rpc`` process: pi's
launch flags, the prompt's ``disposition``, ``agent_settled``, and pi's commands; and the one
rule for how a prompt ends (docs/protocol/index.md#how-a-prompt-ends), one test per kind of
prompt: a run, a queued prompt, a built-in answered locally, an extension command.
"""

from __future__ import annotations

from pathlib import Path

import trio
from agent_helpers import (
    FAKE_ARGS,
    Frame,
    frame_types,
    of_type,
    open_agent,
    request_messages,
    text_reply,
    tool_call,
    tools_reply,
)
from extension_helpers import install

TEST_TIMEOUT = 60

WAIT_FOR_GO = "while [ ! -e go ]; do sleep 0.02; done; echo went"
"""A bash command that holds its run until the test creates ``go`` (no timing involved)."""

NO_RUN_COMMAND = """\
def setup(omp):
    async def note(args, ctx):
        ctx.ui.notify("noted " + args, "info")

    omp.register_command("note", "Take a note", note)
"""


def response_of(frames: list[Frame], request_id: str) -> Frame:
    return next(f for f in frames if f["type"] == "response" and f.get("id") == request_id)


def tail(frames: list[Frame]) -> list[str]:
    """The frame types from the run's ``agent_end`` on."""
    types = frame_types(frames)
    return types[types.index("agent_end") :]


async def test_pi_hosts_launch_flags_are_accepted(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """pi-acp starts ``--mode rpc --no-themes``; pi's other terminal-only flags change nothing
    either."""
    args = (
        *FAKE_ARGS,
        "--no-themes",
        "--theme",
        "a.json",
        "--theme",
        "b.json",
        "--use-theme",
        "dark",
        "--tui-mode",
        "regular",
        "--verbose",
    )
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, [text_reply("hi")], args=args) as agent:
            state = await agent.data("get_state")
            assert state["model"]["id"] == "fake-model"


async def test_a_run_started_ends_with_prompt_result_then_agent_settled(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, [text_reply("Hello")]) as agent:
            await agent.send("prompt", message="Say hello", id="p1")
            frames = await agent.until_settled()
            assert await agent.quiet() == []
    assert response_of(frames, "p1")["data"] == {"agentInvoked": True, "disposition": "started"}
    assert tail(frames) == ["agent_end", "prompt_result", "agent_settled", "session_settled"]
    assert of_type(frames, "agent_settled") == [{"type": "agent_settled", "aborted": False}]


async def test_a_queued_prompt_ends_in_the_run_that_takes_it_with_one_agent_settled(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    script = [
        tools_reply(tool_call("c1", "bash", {"command": WAIT_FOR_GO})),
        text_reply("first done"),
        text_reply("second done"),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="first", id="p1")
            await agent.until_type("tool_execution_start")
            await agent.send("prompt", message="second", streamingBehavior="followUp", id="p2")
            queued = await agent.until_response("p2")
            (tmp_path / "go").touch()
            frames = queued + await agent.until_settled()
            assert await agent.quiet() == []
    assert response_of(frames, "p2")["data"] == {"agentInvoked": True, "disposition": "queued"}
    results = of_type(frames, "prompt_result")
    assert [(r["id"], r["status"]) for r in results] == [("p1", "completed"), ("p2", "completed")]
    assert tail(frames) == [
        "agent_end",
        "prompt_result",
        "prompt_result",
        "agent_settled",
        "session_settled",
    ]


async def test_a_local_command_is_handled_and_ends_with_its_prompt_result_alone(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            await agent.send("prompt", message="/tools", id="t1")
            frames = await agent.until_type("prompt_result")
            frames += await agent.quiet()
    assert response_of(frames, "t1")["data"] == {"agentInvoked": False, "disposition": "handled"}
    result = of_type(frames, "prompt_result")[0]
    assert (result["id"], result["agentInvoked"], result["status"]) == ("t1", False, "completed")
    assert not of_type(frames, "agent_settled", "session_settled", "agent_start")


async def test_an_extension_command_is_handled_and_ends_with_its_prompt_result_alone(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    install(isolated_agent_dir, "note", NO_RUN_COMMAND)
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            await agent.send("prompt", message="/note milk", id="x1")
            frames = await agent.until_type("prompt_result")
            frames += await agent.quiet()
    assert response_of(frames, "x1")["data"] == {"disposition": "handled"}
    result = of_type(frames, "prompt_result")[0]
    assert (result["id"], result["agentInvoked"], result["status"]) == ("x1", False, "completed")
    assert not of_type(frames, "agent_settled", "session_settled", "agent_start")


async def test_an_aborted_run_settles_aborted(tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [tools_reply(tool_call("c1", "bash", {"command": WAIT_FOR_GO}))]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="wait", id="p1")
            await agent.until_type("tool_execution_start")
            await agent.send("abort", id="a1")
            frames = await agent.until_settled()
    assert of_type(frames, "agent_settled") == [{"type": "agent_settled", "aborted": True}]
    assert of_type(frames, "prompt_result")[0]["status"] == "aborted"


async def test_agent_settled_is_under_the_event_filter(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(
            tmp_path, isolated_agent_dir, [text_reply("one"), text_reply("two")]
        ) as agent:
            await agent.data("set_event_filter", events=["agent_end"])
            await agent.send("prompt", message="one", id="p1")
            hidden = await agent.until_settled()
            await agent.data("set_event_filter", events=["agent_settled"])
            await agent.send("prompt", message="two", id="p2")
            shown = await agent.until_settled()
    assert "agent_settled" not in frame_types(hidden)
    assert frame_types(shown) == ["response", "prompt_result", "agent_settled", "session_settled"]


async def test_steer_and_follow_up_say_their_disposition(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    script = [
        tools_reply(tool_call("c1", "bash", {"command": WAIT_FOR_GO})),
        text_reply("done"),
        text_reply("after"),
        text_reply("last"),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            # A steer would move the running bash to the background (interrupt mode
            # ``immediate``); in ``wait`` mode it waits for the call like a follow-up.
            await agent.data("set_interrupt_mode", mode="wait")
            await agent.send("prompt", message="first", id="p1")
            await agent.until_type("tool_execution_start")
            steer = await agent.call("steer", message="also this")
            follow = await agent.call("follow_up", message="then that")
            (tmp_path / "go").touch()
            await agent.until_settled()
    assert steer.data is not None
    assert follow.data is not None
    assert (steer.data, follow.data) == ({"disposition": "queued"}, {"disposition": "queued"})


async def test_clear_queue_returns_the_queued_text_and_ends_their_prompts(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    script = [tools_reply(tool_call("c1", "bash", {"command": WAIT_FOR_GO})), text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.data("set_interrupt_mode", mode="wait")  # the steer waits for bash
            await agent.send("prompt", message="first", id="p1")
            await agent.until_type("tool_execution_start")
            await agent.send("prompt", message="later", streamingBehavior="followUp", id="p2")
            await agent.send("steer", message="sooner", id="s1")
            await agent.until_response("s1")
            queued = await agent.call("get_state")
            await agent.send("clear_queue", id="c1")
            frames = await agent.until_response("c1")
            (tmp_path / "go").touch()
            frames += await agent.until_settled()
    assert response_of(frames, "c1")["data"] == {"steering": ["sooner"], "followUp": ["later"]}
    assert queued.data["pendingMessageCount"] == queued.data["queuedMessageCount"] == 2
    results = {r["id"]: r["status"] for r in of_type(frames, "prompt_result")}
    assert results == {"p2": "aborted", "p1": "completed"}
    # The cleared messages never reached the model: one model call after the tool's result.
    assert len(agent.fake.requests) == 2


async def test_get_commands_lists_what_a_prompt_can_run_in_pis_form(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    install(isolated_agent_dir, "note", NO_RUN_COMMAND)
    (isolated_agent_dir / "commands").mkdir()
    (isolated_agent_dir / "commands" / "fix.md").write_text(
        "---\ndescription: Fix it\n---\nFix $ARGUMENTS\n"
    )
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
            commands = (await agent.data("get_commands"))["commands"]
    by_name = {c["name"]: c for c in commands}
    assert by_name["note"] == {"name": "note", "source": "extension", "description": "Take a note"}
    assert by_name["fix"]["source"] == "prompt"
    assert "tools" not in by_name  # built-ins are left out, as pi leaves out its own
    assert {c["source"] for c in commands} <= {"extension", "prompt", "skill"}


async def test_fork_clone_and_fork_messages(tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("one"), text_reply("two")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            for text in ("first", "second"):
                await agent.send("prompt", message=text)
                await agent.until_settled()
            forkable = (await agent.data("get_fork_messages"))["messages"]
            assert [m["text"] for m in forkable] == ["first", "second"]
            before = (await agent.data("get_state"))["sessionFile"]
            assert await agent.data("clone") == {"cancelled": False}
            cloned = await agent.data("get_state")
            assert cloned["sessionFile"] != before
            assert cloned["messageCount"] == 4
            forked = await agent.data("fork", entryId=forkable[1]["entryId"])
            assert forked == {"text": "second", "cancelled": False}
            state = await agent.data("get_state")
            assert state["messageCount"] == 2
            bad = await agent.call("fork", entryId="nope")
            assert not bad.success
            assert bad.error


async def test_bash_streams_its_output_and_can_stay_out_of_the_context(
    tmp_path: Path, isolated_agent_dir: Path
) -> None:
    """pi's ``bash``: every piece of output as ``bash_execution_update`` with the command's id
    before the response; ``excludeFromContext`` keeps the record in the session but not in
    the next request, while a plain one is sent."""
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, [text_reply("ok")]) as agent:
            await agent.send("bash", command="echo kept; echo out", id="b1")
            streamed = await agent.until_response("b1")
            await agent.send("bash", command="echo secret-listing", id="b2",
                             excludeFromContext=True)
            await agent.until_response("b2")
            messages = (await agent.data("get_messages"))["messages"]
            await agent.send("prompt", message="go", id="p1")
            await agent.until_settled()
            sent = request_messages(agent.fake, 0)
    updates = of_type(streamed, "bash_execution_update")
    assert updates
    assert all(u["id"] == "b1" for u in updates)
    assert "".join(u["delta"] for u in updates) == "kept\nout\n"
    assert frame_types(streamed)[-1] == "response"
    records = [m for m in messages if m["role"] == "bashExecution"]
    assert [(r["command"], r.get("excludeFromContext", False)) for r in records] == [
        ("echo kept; echo out", False), ("echo secret-listing", True)]
    text = str(sent)
    assert "kept" in text
    assert "secret-listing" not in text
