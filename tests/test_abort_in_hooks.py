"""An ``abort`` that lands while an extension's handler runs still closes the run in protocol
order (docs/design/protocol.md#how-an-aborted-run-ends: the shape does not depend on where the
cancellation hit), through the real process: a handler holds until the abort cancels it, at
each of the hooks the loop awaits between frames it has already written and frames it has not.

Each test holds one hook once (the handler says so with a ``notify`` and then waits), aborts,
and checks the frames: turns and runs paired (``omp.testing.invariants.check_runs``), every
``message_start`` ended by its ``message_end``, every tool call started and ended once, and the
run's last assistant message ``aborted``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import FAKE_ARGS, assert_tool_calls_paired, fake_provider, tool_call
from extension_helpers import Frame, RawHost, install, of_type, open_process_host

from omp.testing.invariants import check_runs

LIMIT = 60

HOLD = '''
import trio

HOLD = {hold!r}
held = []


async def hold(name, ctx):
    if held:
        return
    held.append(name)
    ctx.ui.notify(f"holding {{name}}")
    await trio.sleep_forever()


def setup(omp):
    async def on_agent_start(event, ctx):
        if HOLD == "agent_start":
            await hold("agent_start", ctx)

    async def on_turn_start(event, ctx):
        if HOLD == "turn_start":
            await hold("turn_start", ctx)

    async def on_message_end(event, ctx):
        if HOLD == f"message_end:{{event.message.role}}":
            await hold(HOLD, ctx)

    async def on_turn_end(event, ctx):
        if HOLD == "turn_end":
            await hold("turn_end", ctx)

    async def on_tool_call(event, ctx):
        if HOLD == "message_end:toolResult":
            return {{"block": True, "reason": "Blocked by the test"}}
        return None

    omp.on("agent_start", on_agent_start)
    omp.on("turn_start", on_turn_start)
    omp.on("message_end", on_message_end)
    omp.on("turn_end", on_turn_end)
    omp.on("tool_call", on_tool_call)
'''


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def assert_messages_closed(frames: list[Frame]) -> None:
    """Every ``message_start`` is followed by the ``message_end`` of a message of its role
    before another message starts (the loop's messages never nest)."""
    open_role: str | None = None
    for frame in frames:
        if frame["type"] == "message_start":
            assert open_role is None, f"message_start while a {open_role} message is open"
            open_role = frame["message"]["role"]
        elif frame["type"] == "message_end":
            assert open_role == frame["message"]["role"], (open_role, frame["message"]["role"])
            open_role = None
    assert open_role is None, f"a {open_role} message never ended"


async def abort_while_held(host: RawHost, hook: str) -> list[Frame]:
    """Prompt, wait until the handler holds ``hook``, abort; the frames up to the prompt's
    result."""
    await host.send({"id": "p", "type": "prompt", "message": "go"})
    await host.until_type("extension_ui_request", method="notify", message=f"holding {hook}")
    await host.send({"id": "a", "type": "abort"})
    await host.until_type("prompt_result", id="p")
    start = next(i for i, f in enumerate(host.frames) if f["type"] == "agent_start")
    return host.frames[start:]


def check(frames: list[Frame]) -> dict[str, Any]:
    """The checks every case shares; the run's last assistant message."""
    assert check_runs(frames, complete=True) == 1
    assert_messages_closed(frames)
    assert_tool_calls_paired(frames)
    assistants = [f["message"] for f in of_type(frames, "message_end")
                  if f["message"]["role"] == "assistant"]
    assert assistants[-1]["stopReason"] == "aborted"
    assert assistants[-1]["errorMessage"] == "Interrupted by user"
    (result,) = of_type(frames, "prompt_result")
    assert result["status"] == "aborted"
    last: dict[str, Any] = assistants[-1]
    return last


async def abort_after_a_call(cwd: Path, agent_dir: Path, hook: str,
                             stop: str) -> tuple[list[Frame], Frame]:
    """One ``read`` call answered with ``stop``, aborted while ``hook`` is held: the frames
    (checked) and the call's ``tool_execution_end``."""
    install(agent_dir, "hold", HOLD.format(hold=hook))
    script = [{"chunks": [tool_call("call_1", "read", {"path": "x.txt"})], "stop": stop}]
    async with fake_provider(script, agent_dir):
        with trio.fail_after(LIMIT):
            async with open_process_host(cwd, args=FAKE_ARGS) as host:
                frames = await abort_while_held(host, hook)
    check(frames)
    (end,) = of_type(frames, "tool_execution_end")
    return frames, end


TAKEN_IN_AND_ABORTED = [("turn_start", None), ("message_start", "user"), ("message_end", "user"),
                        ("message_start", "assistant"), ("message_end", "assistant"),
                        ("turn_end", None)]


def turn_shape(frames: list[Frame]) -> list[tuple[str, str | None]]:
    return [(f["type"], f["message"]["role"] if f["type"].startswith("message_") else None)
            for f in frames if f["type"] in ("turn_start", "message_start", "message_end",
                                             "turn_end")]


@pytest.mark.parametrize("hook", ["agent_start", "turn_start"])
async def test_an_abort_before_the_prompt_is_taken_in_takes_it_in_and_ends_the_turn(
        hook: str, cwd: Path, isolated_agent_dir: Path) -> None:
    """Aborted in the ``agent_start`` or ``turn_start`` hook, before anything of the attempt
    or its turn was written: the run is written whole (``agent_start`` first), the prompt
    taken in, and the prompt gets its ``prompt_result`` (a host waiting for it would hang)."""
    install(isolated_agent_dir, "hold", HOLD.format(hold=hook))
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await abort_while_held(host, hook)
            await host.send({"id": "m", "type": "get_messages"})
            messages = (await host.until_type("response", id="m"))[-1]
    check(frames)
    assert turn_shape(frames) == TAKEN_IN_AND_ABORTED
    assert [x["role"] for x in messages["data"]["messages"]] == ["user", "assistant"]


async def test_an_abort_in_an_input_messages_hook_ends_that_message(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "hold", HOLD.format(hold="message_end:user"))
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await abort_while_held(host, "message_end:user")
    check(frames)
    roles = [(f["type"], f["message"]["role"]) for f in frames
             if f["type"] in ("message_start", "message_end")]
    assert roles == [("message_start", "user"), ("message_end", "user"),
                     ("message_start", "assistant"), ("message_end", "assistant")]


async def test_an_abort_in_the_turn_end_hook_after_a_cut_answer_ends_each_call_once(
        cwd: Path, isolated_agent_dir: Path) -> None:
    """The answer stopped at its length limit with a tool call: the call ends "not executed"
    at once; the abort in the ``turn_end`` hook that follows must not end it again."""
    frames, end = await abort_after_a_call(cwd, isolated_agent_dir, "turn_end", "length")
    assert "output token limit" in end["result"]["content"][0]["text"]
    first_turn_end = of_type(frames, "turn_end")[0]
    assert [r["toolCallId"] for r in first_turn_end["toolResults"]] == ["call_1"]
    assert first_turn_end["toolResults"][0]["details"]["source"] == "assistant_stop_length"


async def test_an_abort_while_a_refusal_is_seen_ends_the_call_refused(
        cwd: Path, isolated_agent_dir: Path) -> None:
    """A call the ``tool_call`` hook blocked is announced; the abort comes while the
    ``message_end`` hook sees its result: it ends with its refusal, not as a call that ran."""
    _, end = await abort_after_a_call(cwd, isolated_agent_dir, "message_end:toolResult",
                                      "toolUse")
    assert end["isError"] is True
    assert end["result"]["content"][0]["text"] == "Blocked by the test"
    assert end["result"]["details"].get("executed") is not True
