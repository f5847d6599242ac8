"""Todo reminders as a host sees them (issue 23; docs/guides/approval.md#todo-reminders): the real
``omp --mode rpc`` against the fake LLM server, every frame read raw; what the model is told comes
from the fake's recorded requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import text_reply, tool_call, tools_reply, write_models_yml
from extension_helpers import FAKE_ARGS, Frame, of_type, open_process_host

from omp.testing.fake_llm import FakeLLM, open_fake_llm

LIMIT = 90
INIT = {"op": "init", "list": [{"phase": "Work", "items": ["Task A", "Task B"]},
                               {"phase": "Later", "items": ["Task C"]}]}
REMINDER_1 = ("<system-reminder>\n"
              "You stopped with 3 incomplete todo item(s):\n"
              "- Work\n  - Task A\n  - Task B\n- Later\n  - Task C\n\n"
              "Please continue working on these tasks or mark them complete if finished.\n"
              "(Reminder 1/3)\n"
              "</system-reminder>")


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def user_texts(fake: FakeLLM, index: int) -> list[str]:
    messages = fake.requests[index].json()["messages"]
    return [str(m["content"]) for m in messages if m["role"] == "user"]


async def run_prompt(cwd: Path, agent_dir: Path, script: list[dict[str, Any]],
                     *extra: str) -> tuple[list[Frame], FakeLLM]:
    with trio.fail_after(LIMIT):
        async with open_fake_llm(script) as fake:
            write_models_yml(agent_dir, fake.base_url)
            async with open_process_host(cwd, args=[*FAKE_ARGS, *extra]) as host:
                await host.send({"id": "p", "type": "prompt", "message": "plan it"})
                await host.until_type("prompt_result", id="p")
                await host.send({"id": "m", "type": "get_messages"})
                await host.until_type("response", id="m")
    return host.frames, fake


async def test_one_reminder_when_the_model_ignores_it(cwd: Path,
                                                      isolated_agent_dir: Path) -> None:
    script = [tools_reply(tool_call("t1", "todo", INIT)), text_reply("All set."),
              text_reply("Still resting."), text_reply("never asked")]
    frames, fake = await run_prompt(cwd, isolated_agent_dir, script)
    (reminder,) = of_type(frames, "todo_reminder")
    assert reminder == {"type": "todo_reminder", "attempt": 1, "maxAttempts": 3, "todos": [
        {"content": "Task A", "status": "pending"}, {"content": "Task B", "status": "pending"},
        {"content": "Task C", "status": "pending"}]}
    # One run: a second agent_start after the reminder, one terminal agent_end, and the hidden
    # message has no frames of its own.
    run = frames[:next(i for i, f in enumerate(frames) if f["type"] == "prompt_result")]
    kinds = [f["type"] for f in run]
    assert kinds.count("agent_start") == 2
    assert kinds.count("agent_end") == 1
    second_start = [i for i, k in enumerate(kinds) if k == "agent_start"][1]
    reminded = kinds.index("todo_reminder")
    assert kinds[reminded - 1] == "turn_end"  # after the first attempt's last turn
    assert reminded < second_start
    assert not [f for f in run if f["type"] == "message_start"
                and f["message"]["role"] == "developer"]
    # The model reads it as a user message; ignored (list untouched): no second reminder.
    assert len(fake.requests) == 3
    assert user_texts(fake, 2)[-1] == REMINDER_1
    (messages,) = [f for f in frames if f["type"] == "response" and f.get("id") == "m"]
    roles = [m["role"] for m in messages["data"]["messages"]]
    assert roles == ["user", "assistant", "toolResult", "assistant", "developer", "assistant"]


async def test_progress_earns_another_reminder_up_to_the_maximum(
        cwd: Path, isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text("todo:\n  remindersMax: 2\n")
    start = tool_call("t2", "todo", {"op": "start", "task": "Task A"})
    done = tool_call("t3", "todo", {"op": "done", "task": "Task A"})
    script = [tools_reply(tool_call("t1", "todo", INIT)), text_reply("Pause."),
              tools_reply(start), text_reply("Pause again."),
              tools_reply(done), text_reply("Pause once more."), text_reply("never asked")]
    frames, fake = await run_prompt(cwd, isolated_agent_dir, script)
    reminders = of_type(frames, "todo_reminder")
    assert [(r["attempt"], r["maxAttempts"]) for r in reminders] == [(1, 2), (2, 2)]
    assert reminders[1]["todos"][0] == {"content": "Task A", "status": "in_progress"}
    assert len(fake.requests) == 6
    assert "(Reminder 2/2)" in user_texts(fake, 4)[-1]
    assert len(of_type(frames, "agent_end")) == 1


async def test_reminders_turned_off(cwd: Path, isolated_agent_dir: Path, tmp_path: Path) -> None:
    overlay = tmp_path / "quiet.yml"
    overlay.write_text("todo:\n  reminders: false\n")
    script = [tools_reply(tool_call("t1", "todo", INIT)), text_reply("All set."),
              text_reply("never asked")]
    frames, fake = await run_prompt(cwd, isolated_agent_dir, script, "--config", str(overlay))
    assert not of_type(frames, "todo_reminder")
    assert len(fake.requests) == 2


async def test_no_reminder_when_everything_is_done_or_blocked(
        cwd: Path, isolated_agent_dir: Path) -> None:
    block = tool_call("t2", "todo", {"op": "block", "task": "Task A", "reason": "waiting"})
    drop = tool_call("t3", "todo", {"op": "drop", "phase": "Later"})
    finish = tool_call("t4", "todo", {"op": "done", "task": "Task B"})
    script = [tools_reply(tool_call("t1", "todo", INIT), block, drop, finish),
              text_reply("Blocked on A."), text_reply("never asked")]
    frames, fake = await run_prompt(cwd, isolated_agent_dir, script)
    ends = of_type(frames, "tool_execution_end")
    assert [e["isError"] for e in ends] == [False] * 4, ends
    assert not of_type(frames, "todo_reminder")
    assert len(fake.requests) == 2
