"""Subagents through the real ``omp --mode rpc`` process and the fake LLM (issue 13).

Scripts tell parent and children apart by request content (``subagent_helpers``). Every test
asserts what a host sees (frames, responses) and what is left behind (child session files that
end with complete lines, no child running).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import STEP_TIMEOUT, Frame, frame_types, of_type, open_agent, text_reply
from subagent_helpers import (
    child_match,
    child_yields,
    inline_config,
    lifecycle,
    match,
    parent_final,
    read_jsonl,
    task_call,
    tool_end_text,
)

from omp.testing import replies

pytestmark = pytest.mark.trio


async def test_one_inline_child_returns_its_envelope(tmp_path: Path,
                                                     isolated_agent_dir: Path) -> None:
    inline_config(isolated_agent_dir)
    script = [child_yields("Say hi", {"greeting": "hi"}), parent_final(),
              task_call("T1", {"name": "SubOne", "task": "Say hi"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        await agent.data("set_subagent_subscription", level="progress")
        await agent.send("prompt", message="Delegate the greeting")
        frames = await agent.until_settled()
        text = tool_end_text(frames)
        assert text.startswith('<task-result id="SubOne" agent="task" status="completed"'), text
        assert '"greeting": "hi"' in text
        started = lifecycle(frames, "started")
        assert [p["id"] for p in started] == ["SubOne"]
        assert started[0]["detached"] is False
        assert started[0]["parentToolCallId"] == "T1"
        state = await agent.data("get_state")
        session_file = Path(state["sessionFile"])
        child_file = session_file.with_suffix("") / "SubOne.jsonl"
        assert started[0]["sessionFile"] == str(child_file)
        assert lifecycle(frames, "completed")[0]["id"] == "SubOne"
        assert of_type(frames, "subagent_progress")
        entries = read_jsonl(child_file)
        assert entries[0]["type"] == "session"
        assert entries[0]["parentSession"] == str(session_file)
        assert any(e["type"] == "session_init" for e in entries)
        # The child's run ends with its yield's result: no extra empty aborted message.
        messages = [e["message"] for e in entries if e["type"] == "message"]
        assert [m["role"] for m in messages] == ["user", "assistant", "toolResult"]
        assert all(m.get("stopReason") != "aborted" for m in messages)
        ends = [f for f in of_type(frames, "agent_end")]
        assert ends[-1].get("isTerminal", True) is True
        assert (await agent.data("get_subagents"))["subagents"] == []


async def test_three_children_run_at_most_two_at_a_time(tmp_path: Path,
                                                        isolated_agent_dir: Path) -> None:
    inline_config(isolated_agent_dir, "task:\n  maxConcurrency: 2\n")
    # Words no tool description holds ("alpha" is in "alphabetical").
    words = ("QQalpha", "QQbeta", "QQgamma")
    script = [child_yields(word, {"word": word}, delay=0.3) for word in words]
    script += [parent_final(), task_call("T1", *({"task": w} for w in words))]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        peak = 0

        def watch(fake: Any) -> bool:
            nonlocal peak
            peak = max(peak, fake.active)
            return False

        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.fake.wait_until, watch)
            await agent.send("prompt", message="Three things")
            frames = await agent.until_settled()
            nursery.cancel_scope.cancel()
        text = tool_end_text(frames)
        assert text.count('status="completed"') == 3, text
        for word in words:
            assert f'"word": "{word}"' in text
        assert peak == 2  # two children at once; the parent waits in its tool call meanwhile
        assert len(lifecycle(frames, "started")) == 0  # subscription off: no frames


async def test_background_child_is_delivered_when_the_parent_is_idle(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [child_yields("Say hi", {"greeting": "hi"}, delay=0.5),
              match("Background job", text_reply("Thanks for the result")),
              match("Spawned agent", text_reply("Waiting for it")),
              task_call("T1", {"name": "SubOne", "task": "Say hi"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        await agent.data("set_subagent_subscription", level="progress")
        await agent.send("prompt", message="Delegate in the background")
        frames = await agent.until_settled()
        assert tool_end_text(frames).startswith("Spawned agent `SubOne` (job `SubOne`).")
        ends = of_type(frames, "agent_end")
        assert [e.get("isTerminal") for e in ends] == [False, True]
        results = of_type(frames, "prompt_result")
        assert len(results) == 1
        assert results[0]["sessionSettled"] is False
        first_end = frames.index(ends[0])
        completed = frames.index(lifecycle_frame(frames, "completed"))
        assert first_end < completed  # the parent paused before the child finished
        custom = [f["message"] for f in of_type(frames, "message_start")
                  if f["message"]["role"] == "custom"]
        assert len(custom) == 1
        assert custom[0]["customType"] == "async-result"
        assert custom[0]["content"].startswith(
            "<system-notice>\nBackground job SubOne has completed.")
        assert custom[0]["details"]["jobs"][0]["jobId"] == "SubOne"
        assert lifecycle(frames, "started")[0]["detached"] is True
        assert frame_types(frames)[-1] == "session_settled"
        assert frame_types(frames).count("session_settled") == 1


async def test_background_child_joins_a_running_parent_at_a_step_boundary(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [child_yields("Say hi", {"greeting": "hi"}),
              match("Background job", text_reply("Got the result")),
              match("Spawned agent", replies.text("Still", replies.gate("joined"), " working")),
              task_call("T1", {"name": "SubOne", "task": "Say hi"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        await agent.send("prompt", message="Delegate in the background")
        # The parent is held in its second answer until the child's result waits to join it
        # (queued: get_state counts it), so the result meets a running parent, however slow
        # the machine.
        with trio.fail_after(STEP_TIMEOUT):
            await agent.fake.wait_until(lambda fake: "joined" in fake.waiting)
            while not (await agent.data("get_state"))["pendingMessageCount"]:
                pass
        agent.fake.open_gate("joined")
        frames = await agent.until_settled()
        ends = of_type(frames, "agent_end")
        assert [e.get("isTerminal") for e in ends] == [True]
        assert frame_types(frames).count("agent_start") == 1
        texts = [m["role"] for m in ends[0]["messages"]]
        assert texts.count("custom") == 1
        assert agent.fake.remaining == 0


def lifecycle_frame(frames: list[Frame], status: str) -> Frame:
    return next(f for f in of_type(frames, "subagent_lifecycle")
                if f["payload"]["status"] == status)


def hangs(word: str) -> dict[str, Any]:
    """The child whose assignment starts with ``word`` gets a reply that never finishes."""
    return match(child_match(word), {"chunks": [{"text": "thinking..."}], "hangAfter": 1})


async def test_abort_cancels_inline_children_and_their_files_end_cleanly(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    inline_config(isolated_agent_dir)
    script = [hangs("QQone"), hangs("QQtwo"),
              task_call("T1", {"name": "One", "task": "QQone"}, {"name": "Two", "task": "QQtwo"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        await agent.data("set_subagent_subscription", level="progress")
        await agent.send("prompt", message="Two children")
        frames = await agent.until(lambda f: len(lifecycle(agent.frames, "started")) == 2)
        await agent.fake.wait_until(lambda fake: fake.active == 2)
        await agent.data("abort")
        await agent.until_settled()
        frames = agent.frames
        assert sorted(p["id"] for p in lifecycle(frames, "aborted")) == ["One", "Two"]
        end = next(f for f in of_type(frames, "tool_execution_end") if f["toolName"] == "task")
        assert end["isError"] is True
        text = tool_end_text(frames)
        assert text.count('status="cancelled"') == 2, text
        assert "<abort-reason>Cancelled by caller</abort-reason>" in text
        assert of_type(frames, "agent_end")[-1].get("isTerminal", True) is True
        await agent.fake.wait_for_disconnect(2)  # both children's model calls were cut off
        assert agent.fake.active == 0
        state = await agent.data("get_state")
        directory = Path(state["sessionFile"]).with_suffix("")
        for name in ("One", "Two"):
            entries = read_jsonl(directory / f"{name}.jsonl")
            last = entries[-1]
            assert last["type"] == "message"
            assert last["message"]["stopReason"] == "aborted"
        assert (await agent.data("get_subagents"))["subagents"] == []


async def test_abort_leaves_background_children_running(tmp_path: Path,
                                                        isolated_agent_dir: Path) -> None:
    script = [child_yields("Say hi", {"greeting": "hi"}, delay=0.5),
              match("Background job", text_reply("Thanks")),
              match("Spawned agent", {"chunks": [{"text": "Waiting"}], "hangAfter": 1}),
              task_call("T1", {"name": "SubOne", "task": "Say hi"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        await agent.data("set_subagent_subscription", level="progress")
        await agent.send("prompt", message="Delegate")
        # The parent's reply after the spawn streams its text, then hangs.
        await agent.until(lambda f: f["type"] == "message_update"
                          and f["assistantMessageEvent"]["type"] == "text_delta")
        await agent.data("abort")
        frames = await agent.until_settled()
        ends = of_type(frames, "agent_end")
        assert [e.get("isTerminal") for e in ends] == [False, True]
        assert lifecycle(frames, "completed")[0]["id"] == "SubOne"
        assert any(f["message"]["role"] == "custom" for f in of_type(frames, "message_end"))


async def test_new_session_cancels_background_children(tmp_path: Path,
                                                       isolated_agent_dir: Path) -> None:
    script = [hangs("Say hi"), match("Spawned agent", text_reply("Waiting")),
              task_call("T1", {"name": "SubOne", "task": "Say hi"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        await agent.data("set_subagent_subscription", level="progress")
        await agent.send("prompt", message="Delegate")
        await agent.until(lambda f: f["type"] == "prompt_result")
        await agent.fake.wait_until(lambda fake: fake.active == 1)
        assert [s["id"] for s in (await agent.data("get_subagents"))["subagents"]] == ["SubOne"]
        old = (await agent.data("get_state"))["sessionFile"]
        request = await agent.send("new_session")
        frames = await agent.until_settled()
        assert any(f["type"] == "response" and f["id"] == request and f["success"]
                   for f in frames + await agent.quiet(0.5))
        await agent.fake.wait_for_disconnect(1)
        assert (await agent.data("get_subagents"))["subagents"] == []
        # The child that was live at the change still ends in a frame (the original drops it:
        # the id is stale by then); nothing else of it is said or kept.
        while not lifecycle(agent.frames, "aborted"):
            await agent.next_frame()
        frames = agent.frames
        assert not [f for f in of_type(frames, "message_start")
                    if f["message"]["role"] == "custom"]  # nothing was delivered
        assert [(p["id"], p["parentToolCallId"]) for p in lifecycle(frames, "aborted")] == [
            ("SubOne", "T1")]
        assert lifecycle(frames, "completed") == lifecycle(frames, "failed") == []
        assert (await agent.data("get_subagents"))["subagents"] == []
        child = read_jsonl(Path(old).with_suffix("") / "SubOne.jsonl")
        assert child[-1]["message"]["stopReason"] == "aborted"


async def test_recursion_limit_takes_the_task_tool_away(tmp_path: Path,
                                                        isolated_agent_dir: Path) -> None:
    inline_config(isolated_agent_dir, "task:\n  maxRecursionDepth: 1\n")
    script = [child_yields("Say hi", {"ok": True}), parent_final(),
              task_call("T1", {"name": "SubOne", "task": "Say hi"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        tools = [t["name"] for t in (await agent.data("get_state"))["dumpTools"]]
        assert "task" in tools
        assert "yield" not in tools
        await agent.send("prompt", message="Delegate")
        await agent.until_settled()
        bodies = [r.json() for r in agent.fake.requests]
        child = next(b for b in bodies if "Complete assignment" in str(b["messages"]))
        names = [t["function"]["name"] for t in child["tools"]]
        assert "yield" in names
        assert "task" not in names
        assert "todo" not in names


async def test_depth_zero_means_no_task_tool(tmp_path: Path, isolated_agent_dir: Path) -> None:
    inline_config(isolated_agent_dir, "task:\n  maxRecursionDepth: 0\n")
    async with open_agent(tmp_path, isolated_agent_dir, []) as agent:
        tools = [t["name"] for t in (await agent.data("get_state"))["dumpTools"]]
        assert "task" not in tools


async def test_get_subagent_messages_pages_by_byte_offsets(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    inline_config(isolated_agent_dir)
    script = [child_yields("Say hi", {"ok": True}), parent_final(),
              task_call("T1", {"name": "SubOne", "task": "Say hi"})]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        await agent.send("prompt", message="Delegate")
        await agent.until_settled()
        page = await agent.data("get_subagent_messages", subagentId="SubOne")
        path = Path(page["sessionFile"])
        size = (await trio.Path(path).stat()).st_size
        assert (page["fromByte"], page["nextByte"], page["reset"]) == (0, size, False)
        assert [m["role"] for m in page["messages"]][:2] == ["user", "assistant"]
        assert page["entries"][0]["type"] != "session"
        # A partial last line is left for the next call.
        line = b'{"type":"message","id":"x1","parentId":null,"timestamp":"t","message":' \
               b'{"role":"user","content":"late","timestamp":1}}\n'
        await append(path, line[:20])
        again = await agent.data("get_subagent_messages", subagentId="SubOne", fromByte=size)
        assert (again["fromByte"], again["nextByte"], again["entries"]) == (size, size, [])
        await append(path, line[20:])
        rest = await agent.data("get_subagent_messages", sessionFile=str(path), fromByte=size)
        assert rest["nextByte"] == size + len(line)
        assert rest["messages"] == [{"role": "user", "content": "late", "timestamp": 1}]
        beyond = await agent.data("get_subagent_messages", subagentId="SubOne",
                                  fromByte=10 * size)
        assert beyond["reset"] is True
        assert beyond["fromByte"] == 0
        unknown = await agent.call("get_subagent_messages", subagentId="Nobody")
        assert not unknown.success
        assert unknown.error == "Unknown subagent or session file unavailable: Nobody"
        foreign = await agent.call("get_subagent_messages", sessionFile="/etc/passwd")
        assert foreign.error == "Unknown subagent session file"
        neither = await agent.call("get_subagent_messages")
        assert neither.error == "get_subagent_messages requires subagentId or sessionFile"


async def test_subscription_levels_choose_the_frames(tmp_path: Path,
                                                     isolated_agent_dir: Path) -> None:
    inline_config(isolated_agent_dir)
    levels = ("off", "progress", "events")
    # Children, then each round's task call, then the answers (a later round's request holds
    # the earlier rounds' words and task results: those entries are used up by then).
    script = [child_yields(f"QQchild{n}", {"n": n}) for n in range(3)]
    script += [match(f"QQparent{n}", task_call(f"T{n}", {"task": f"QQchild{n}"}))
               for n in range(3)]
    script += [parent_final(f"done {n}") for n in range(3)]
    async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
        seen: dict[str, list[str]] = {}
        for n, level in enumerate(levels):
            assert await agent.data("set_subagent_subscription", level=level) == {"level": level}
            await agent.send("prompt", message=f"QQparent{n}")
            frames = await agent.until_settled()
            seen[level] = sorted({f["type"] for f in frames if f["type"].startswith("subagent_")})
            events = [f["payload"]["event"] for f in of_type(frames, "subagent_event")]
            assert all("messageId" not in e for e in events)
            if level == "events":
                types = [e["type"] for e in events]
                assert types, " ".join(f["type"] for f in frames)
                assert types[0] == "agent_start"
                assert "message_end" in types
                assert {f["payload"]["id"] for f in of_type(frames, "subagent_event")} == {
                    lifecycle(frames, "started")[0]["id"]}
        assert seen == {"off": [], "progress": ["subagent_lifecycle", "subagent_progress"],
                        "events": ["subagent_event", "subagent_lifecycle", "subagent_progress"]}


async def append(path: Path, data: bytes) -> None:
    async with await trio.open_file(path, "ab") as file:
        await file.write(data)
