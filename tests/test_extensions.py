"""Python extensions as a host sees them (issue 11; docs/design/extending.md#extensions,
docs/design/protocol.md#extension-ui, docs/design/protocol.md#shutdown-asked-by-an-extension).

Most tests run the real ``omp --mode rpc`` on the offline model (``[[tool NAME {args}]]`` in a
prompt makes it call a tool, ``[[slow S]]`` paces it) with extensions installed as files in the
global folder ``$OMP_AGENT_DIR/extensions`` (a per-test directory, see conftest), and read every
frame raw (``extension_helpers.RawHost``). Tests that need the model's request use the fake LLM
server. What only an embedding host can give (extensions as Python objects) and what is about
handler timeouts (30 s, 2 s) runs ``omp.serve`` in this program over memory streams, the
timeouts on trio's MockClock; the command-line flags (``-e``, ``--no-extensions``,
``--trust-project``, ``--no-ui``, ``--mode rpc-ui``) are tried on the real process at the end.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trio.testing
from agent_helpers import fake_provider, text_reply
from extension_helpers import (
    FAKE_ARGS,
    GATE,
    OFFLINE_ARGS,
    Frame,
    RawHost,
    index_of,
    install,
    install_project,
    is_request_id,
    of_type,
    open_embedded_host,
    open_process_host,
    result_text,
    ui_requests,
)

import omp
from omp.extensions import ExtensionAPI, ExtensionContext
from omp.extensions.api import Extension
from omp.extensions.discovery import _group_may_be_declared, discover
from omp.extensions.loader import load

LIMIT = 90
"""Seconds (real time) any process test may take."""
ARGS = {"hint": "arguments"}
"""The ``input`` of every extension command in the command list."""
GATE_CANCELLED = "Tool execution was cancelled while an extension handler was pending"
UI_GONE = "RPC client disconnected before extension UI response completed"
VIRTUAL_STEP = 600.0
"""Seconds of virtual time one wait may take in the tests on trio's MockClock."""
TODO = 'go [[tool todo {"op": "view"}]]'
"""A prompt whose tool call never waits on a thread or process (safe on the MockClock)."""


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """The server's working directory (apart from the agent directory)."""
    path = tmp_path / "project"
    path.mkdir()
    return path


def extension_commands(update: Frame) -> list[Frame]:
    """The extension commands of an ``available_commands_update`` (built-ins come first)."""
    return [c for c in update["commands"] if c["source"] == "extension"]


def bash_prompt(command: str, text: str = "run it") -> str:
    return f"{text} [[tool bash {msgspec.json.encode({'command': command}).decode()}]]"


async def prompt(host: RawHost, message: str, request_id: str = "p") -> list[Frame]:
    """Send a prompt and read up to its ``prompt_result``."""
    await host.send({"id": request_id, "type": "prompt", "message": message})
    return await host.until_type("prompt_result", id=request_id)


# --- the gate of the issue, exactly as written ---------------------------------------------------


async def test_the_gate_blocks_a_call_the_user_refuses(cwd: Path,
                                                       isolated_agent_dir: Path) -> None:
    gate = install(isolated_agent_dir, "gate", GATE)
    (cwd / "x.txt").write_text("keep me\n")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "p", "type": "prompt", "message": bash_prompt("rm x.txt")})
            confirm = await host.ui_request("confirm")
            assert confirm == {"type": "extension_ui_request", "id": confirm["id"],
                               "method": "confirm", "title": "Allow this command?",
                               "message": "rm x.txt", "timeout": 30000}
            assert is_request_id(confirm["id"])
            # Decided before the call is announced.
            assert not of_type(host.frames, "tool_execution_start")
            await host.answer(confirm, confirmed=False)
            frames = await host.until_type("prompt_result", id="p")
    assert (cwd / "x.txt").read_text() == "keep me\n"
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    assert result_text(end) == "Blocked by user"
    (start,) = of_type(frames, "tool_execution_start")
    assert start["toolCallId"] == end["toolCallId"]
    results = [f["message"] for f in of_type(frames, "message_end")
               if f["message"]["role"] == "toolResult"]
    assert [(r["isError"], r["content"]) for r in results] == [
        (True, [{"type": "text", "text": "Blocked by user"}])]
    # The model was told: the offline model echoes the result in its next turn.
    assert "bash (error): Blocked by user" in frames[index_of(frames, "agent_end")][
        "messages"][-1]["content"][0]["text"]
    # agent_end handler: its status frame comes before the wire agent_end
    # (docs/design/extending.md#how-handlers-run).
    status = index_of(frames, "extension_ui_request", method="setStatus")
    assert frames[status] == {"type": "extension_ui_request", "id": frames[status]["id"],
                              "method": "setStatus", "statusKey": "gate", "statusText": "idle"}
    assert status < index_of(frames, "agent_end")
    assert frames[-1]["status"] == "completed"
    assert not of_type(host.frames, "extension_error"), gate


async def test_the_gate_lets_allowed_and_unmatched_calls_run(cwd: Path,
                                                            isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "gate", GATE)
    (cwd / "x.txt").write_text("delete me\n")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            # The handler returns None for a command without "rm ": no dialog, the call runs.
            frames = await prompt(host, bash_prompt("printf untouched"), "p1")
            assert not ui_requests(frames, "confirm")
            (end,) = of_type(frames, "tool_execution_end")
            assert (end["isError"], result_text(end)) == (False, "untouched")

            await host.send({"id": "p2", "type": "prompt", "message": bash_prompt("rm x.txt")})
            confirm = await host.ui_request("confirm")
            await host.answer(confirm, confirmed=True)
            frames = await host.until_type("prompt_result", id="p2")
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is False, end
    assert not (cwd / "x.txt").exists()


async def test_the_gate_hello_command_asks_and_greets(cwd: Path,
                                                     isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "gate", GATE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            assert host.startup[-1]["type"] == "available_commands_update"
            assert extension_commands(host.startup[-1]) == [
                {"name": "hello", "source": "extension", "description": "Say hello",
                 "input": {"hint": "arguments"}}]
            await host.send({"id": "h1", "type": "prompt", "message": "/hello"})
            (response,) = of_type(await host.until_type("response", id="h1"), "response")
            # An extension command: the response says only that it was handled (pi's
            # disposition; the original's carries no data) (docs/design/protocol.md#prompt_result).
            assert response == {"type": "response", "id": "h1", "command": "prompt",
                                "success": True, "data": {"disposition": "handled"}}
            ask = await host.ui_request("input")
            assert ask == {"type": "extension_ui_request", "id": ask["id"], "method": "input",
                           "title": "Your name?", "placeholder": "a name"}
            await host.answer(ask, value="Ada")
            frames = await host.until_type("prompt_result", id="h1")
            (notify,) = ui_requests(frames, "notify")
            assert notify == {"type": "extension_ui_request", "id": notify["id"],
                              "method": "notify", "message": "Hello Ada", "notifyType": "info"}
            assert frames[-1] == {"type": "prompt_result", "id": "h1", "agentInvoked": False,
                                  "status": "completed", "sessionSettled": True}

            # Cancelled: the dialog's default (None).
            await host.send({"id": "h2", "type": "prompt", "message": "/hello"})
            await host.answer(await host.ui_request("input"), cancelled=True)
            frames = await host.until_type("prompt_result", id="h2")
            assert [f["message"] for f in ui_requests(frames, "notify")] == ["Hello nobody"]
            # No agent ran for either command.
            assert not of_type(host.frames, "agent_start")

            await host.send({"id": "c", "type": "get_available_commands"})
            (answer,) = of_type(await host.until_type("response", id="c"), "response")
            assert extension_commands(answer["data"]) == [
                {"name": "hello", "source": "extension", "description": "Say hello",
                 "input": ARGS}]


async def test_steer_and_follow_up_refuse_an_extension_command(cwd: Path,
                                                               isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "gate", GATE)
    refused = ('Extension command "/hello" cannot be queued. Use prompt() or execute the '
               "command when not streaming.")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            # Even when idle (docs/design/protocol.md#command-table).
            await host.send({"id": "s0", "type": "steer", "message": "/hello"})
            (idle,) = of_type(await host.until_type("response", id="s0"), "response")
            assert idle == {"type": "response", "id": "s0", "command": "steer",
                            "success": False, "error": refused}

            await host.send({"id": "p", "type": "prompt",
                             "message": "[[slow 0.2]] one two three four five"})
            await host.until_type("message_update")
            await host.send({"id": "s1", "type": "steer", "message": "/hello"},
                            {"id": "f1", "type": "follow_up", "message": "/hello you"})
            frames = await host.until_type("response", id="f1")
            responses = {f["id"]: f for f in of_type(frames, "response")}
            assert responses["s1"] == {"type": "response", "id": "s1", "command": "steer",
                                       "success": False, "error": refused}
            assert responses["f1"] == {"type": "response", "id": "f1",
                                       "command": "follow_up", "success": False,
                                       "error": refused}
            await host.send({"id": "a", "type": "abort"})
            frames = await host.until_type("prompt_result", id="p")
    # The command never ran: no dialog was opened.
    assert not ui_requests(host.frames, "input")


# --- every UI method: its frame, and each kind of answer -----------------------------------------

PROBE = '''
from omp.extensions import ExtensionAPI, ExtensionContext

OPTIONS = {
    "plain": ["red", "green"],
    "details": ["red", {"label": "green", "description": "the colour of grass"},
                {"label": "blue"}],
}


def setup(omp: ExtensionAPI) -> None:
    async def select(args: str, ctx: ExtensionContext) -> None:
        ctx.ui.notify(f"select -> {await ctx.ui.select('Pick a colour', OPTIONS[args])!r}")

    async def confirm(args: str, ctx: ExtensionContext) -> None:
        ctx.ui.notify(f"confirm -> {await ctx.ui.confirm('Sure?', 'Really do it?')!r}")

    async def ask(args: str, ctx: ExtensionContext) -> None:
        timeout = int(args) if args else None
        answer = await ctx.ui.input("Your name?", "a name", timeout=timeout)
        ctx.ui.notify(f"input -> {answer!r}")

    async def edit(args: str, ctx: ExtensionContext) -> None:
        answer = await ctx.ui.editor("Edit the plan", "step one\\nstep two")
        ctx.ui.notify(f"editor -> {answer!r}")

    async def present(args: str, ctx: ExtensionContext) -> None:
        ctx.ui.notify("plain note")
        ctx.ui.notify("careful", "warning")
        ctx.ui.set_status("probe", "busy")
        ctx.ui.set_status("probe")
        ctx.ui.set_widget("probe", ["line 1", "line 2"], placement="belowEditor")
        ctx.ui.set_widget("probe", ["only"])
        ctx.ui.set_widget("probe")
        ctx.ui.set_title("omp: probe")
        ctx.ui.set_editor_text("draft text")
        ctx.ui.notify(f"has_ui={ctx.has_ui}")

    omp.register_command("select", "select", select)
    omp.register_command("confirm", "confirm", confirm)
    omp.register_command("input", "input", ask)
    omp.register_command("editor", "editor", edit)
    omp.register_command("present", "presentation calls", present)
'''


async def dialog_round(host: RawHost, command: str, method: str,
                       **answer: Any) -> tuple[Frame, str]:
    """Run ``/command``, answer its ``method`` dialog with ``answer``; the request frame and
    the text the extension reported the result with."""
    request_id = f"r{len(host.frames)}"
    await host.send({"id": request_id, "type": "prompt", "message": f"/{command}"})
    request = await host.ui_request(method)
    await host.answer(request, **answer)
    frames = await host.until_type("prompt_result", id=request_id)
    (notify,) = ui_requests(frames, "notify")
    return request, notify["message"]


async def test_select_frames_and_answers(cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            request, said = await dialog_round(host, "select details", "select", value="green")
            assert request == {"type": "extension_ui_request", "id": request["id"],
                               "method": "select", "title": "Pick a colour",
                               "options": ["red", "green", "blue"],
                               "optionDetails": [{}, {"description": "the colour of grass"},
                                                 {}]}
            assert said == "select -> 'green'"
            # No option has a description: no optionDetails.
            request, said = await dialog_round(host, "select plain", "select", value="red")
            assert request == {"type": "extension_ui_request", "id": request["id"],
                               "method": "select", "title": "Pick a colour",
                               "options": ["red", "green"]}
            assert said == "select -> 'red'"
            # A value is not checked against the options (docs/design/protocol.md#answers).
            assert (await dialog_round(host, "select plain", "select", value="mauve"))[1] == \
                "select -> 'mauve'"
            assert (await dialog_round(host, "select plain", "select", cancelled=True))[1] == \
                "select -> None"
            assert (await dialog_round(host, "select plain", "select", cancelled=True,
                                       timedOut=True))[1] == "select -> None"
            assert (await dialog_round(host, "select plain", "select", confirmed=True))[1] == \
                "select -> None"


async def test_confirm_frames_and_answers(cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            request, said = await dialog_round(host, "confirm", "confirm", confirmed=True)
            assert request == {"type": "extension_ui_request", "id": request["id"],
                               "method": "confirm", "title": "Sure?",
                               "message": "Really do it?"}
            assert said == "confirm -> True"
            answers: list[dict[str, Any]] = [{"confirmed": False}, {"cancelled": True},
                       {"cancelled": True, "timedOut": True}, {"value": "yes"}, {}]
            for answer in answers:
                assert (await dialog_round(host, "confirm", "confirm", **answer))[1] == \
                    "confirm -> False", answer


async def test_input_and_editor_frames_and_answers(cwd: Path,
                                                   isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            request, said = await dialog_round(host, "input", "input", value="Grace")
            assert request == {"type": "extension_ui_request", "id": request["id"],
                               "method": "input", "title": "Your name?",
                               "placeholder": "a name"}
            assert said == "input -> 'Grace'"
            assert (await dialog_round(host, "input", "input", value=""))[1] == "input -> ''"
            assert (await dialog_round(host, "input", "input", cancelled=True))[1] == \
                "input -> None"
            assert (await dialog_round(host, "input", "input", confirmed=True))[1] == \
                "input -> None"

            request, said = await dialog_round(host, "editor", "editor",
                                               value="step one\nstep 2")
            assert request == {"type": "extension_ui_request", "id": request["id"],
                               "method": "editor", "title": "Edit the plan",
                               "prefill": "step one\nstep two"}
            assert said == "editor -> 'step one\\nstep 2'"
            assert (await dialog_round(host, "editor", "editor", cancelled=True))[1] == \
                "editor -> None"


async def test_two_open_dialogs_are_answered_by_id(cwd: Path,
                                                  isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "one", "type": "prompt", "message": "/input"})
            first = await host.ui_request("input")
            await host.send({"id": "two", "type": "prompt", "message": "/input"})
            second = await host.ui_request("input")
            assert first["id"] != second["id"]
            await host.answer(second, value="second answer")
            frames = await host.until_type("prompt_result", id="two")
            await host.answer(first, value="first answer")
            frames += await host.until_type("prompt_result", id="one")
    assert [r["message"] for r in ui_requests(frames, "notify")] == [
        "input -> 'second answer'", "input -> 'first answer'"]


async def test_presentation_frames(cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, env={"PI_RPC_EMIT_TITLE": None}) as host:
            frames = await prompt(host, "/present")
    requests = ui_requests(frames)
    for request in requests:
        assert is_request_id(request["id"]), request
    assert len({r["id"] for r in requests}) == len(requests)  # each has its own id
    assert [{k: v for k, v in r.items() if k not in ("type", "id")} for r in requests] == [
        {"method": "notify", "message": "plain note"},
        {"method": "notify", "message": "careful", "notifyType": "warning"},
        {"method": "setStatus", "statusKey": "probe", "statusText": "busy"},
        {"method": "setStatus", "statusKey": "probe"},
        {"method": "setWidget", "widgetKey": "probe", "widgetLines": ["line 1", "line 2"],
         "widgetPlacement": "belowEditor"},
        {"method": "setWidget", "widgetKey": "probe", "widgetLines": ["only"]},
        {"method": "setWidget", "widgetKey": "probe"},
        # setTitle: dropped without PI_RPC_EMIT_TITLE.
        {"method": "set_editor_text", "text": "draft text"},
        {"method": "notify", "message": "has_ui=True"},
    ]
    assert frames[-1]["agentInvoked"] is False


@pytest.mark.parametrize("value", ["1", " TRUE ", "yes", "On"])
async def test_set_title_only_with_pi_rpc_emit_title(cwd: Path, isolated_agent_dir: Path,
                                                    value: str) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, env={"PI_RPC_EMIT_TITLE": value}) as host:
            frames = await prompt(host, "/present")
    (title,) = ui_requests(frames, "setTitle")
    assert title == {"type": "extension_ui_request", "id": title["id"], "method": "setTitle",
                     "title": "omp: probe"}
    # In call order: after the widgets, before the editor text.
    methods = [r["method"] for r in ui_requests(frames)]
    assert methods.index("setTitle") == methods.index("set_editor_text") - 1


async def test_set_title_dropped_for_other_values(cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, env={"PI_RPC_EMIT_TITLE": "0"}) as host:
            frames = await prompt(host, "/present")
    assert not ui_requests(frames, "setTitle")
    assert ui_requests(frames, "set_editor_text")


async def test_a_dialog_timeout_resolves_the_default_without_a_frame(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "probe", PROBE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "t", "type": "prompt", "message": "/input 400"})
            request = await host.ui_request("input")
            asked = time.monotonic()
            assert request["timeout"] == 400
            frames = await host.until_type("prompt_result", id="t")
            waited = time.monotonic() - asked
            assert [f["message"] for f in ui_requests(frames, "notify")] == ["input -> None"]
            # docs/design/protocol.md#timeouts-and-aborts: no cancel on timeout
            assert not ui_requests(host.frames, "cancel")
            assert waited >= 0.3, waited
            # A late answer, and one for an id never issued, are ignored without a frame.
            await host.answer(request, value="too late")
            await host.send({"type": "extension_ui_response", "id": "0123456789abcdef",
                             "value": "nobody asked"})
            assert await host.quiet(0.5) == []
            # The server still works.
            _, said = await dialog_round(host, "input", "input", value="on time")
            assert said == "input -> 'on time'"


async def test_the_gate_confirm_times_out_to_a_block_without_a_cancel(
        cwd: Path, isolated_agent_dir: Path, tmp_path: Path,
        autojump_clock: trio.testing.MockClock) -> None:
    """The gate's ``timeout=30_000`` in virtual time: the call is blocked at 30 s, and the
    handler's own 30 s limit (paused while the dialog is open) does not fire first."""
    gate = tmp_path / "gate.py"
    gate.write_text(GATE)
    options = offline_options(cwd, isolated_agent_dir, discover_extensions=False,
                              extensions=[gate])
    with trio.fail_after(VIRTUAL_STEP * 2):
        async with open_embedded_host(options) as host:
            host.step = VIRTUAL_STEP
            await host.send({"id": "p", "type": "prompt",
                             "message": 'go [[tool bash {"command": "rm -r nothing"}]]'})
            confirm = await host.ui_request("confirm")
            asked = trio.current_time()
            frames = await host.until_type("tool_execution_end")
            ended = trio.current_time()
            frames += await host.until_type("prompt_result", id="p")
    assert ended - asked == pytest.approx(30.0, abs=0.5)
    assert result_text(of_type(frames, "tool_execution_end")[0]) == "Blocked by user"
    assert not ui_requests(frames, "cancel")
    assert not of_type(frames, "extension_error")
    assert confirm["timeout"] == 30000


async def test_abort_does_not_cancel_a_command_dialog(cwd: Path,
                                                      isolated_agent_dir: Path) -> None:
    """Only dialogs of event handlers are bound to the run (docs/design/extending.md#ctxui)."""
    install(isolated_agent_dir, "gate", GATE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "h", "type": "prompt", "message": "/hello"})
            ask = await host.ui_request("input")
            await host.send({"id": "a", "type": "abort"})
            await host.until_type("response", id="a")
            await host.answer(ask, value="Ada")
            frames = await host.until_type("prompt_result", id="h")
    assert not ui_requests(host.frames, "cancel")
    assert [r["message"] for r in ui_requests(frames, "notify")] == ["Hello Ada"]


# --- abort and EOF while a dialog is open --------------------------------------------------------


async def test_abort_while_the_gate_confirm_is_open(cwd: Path,
                                                    isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "gate", GATE)
    (cwd / "x.txt").write_text("keep me\n")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "p", "type": "prompt", "message": bash_prompt("rm x.txt")})
            confirm = await host.ui_request("confirm")
            await host.send({"id": "a", "type": "abort"})
            frames = await host.until_type("prompt_result", id="p")
            frames += await host.quiet(0.5)
            # An answer for the cancelled dialog is ignored.
            await host.answer(confirm, confirmed=True)
            frames += await host.quiet(0.5)
    assert (cwd / "x.txt").read_text() == "keep me\n"
    (cancel,) = ui_requests(frames, "cancel")
    assert cancel == {"type": "extension_ui_request", "id": cancel["id"], "method": "cancel",
                      "targetId": confirm["id"]}
    assert is_request_id(cancel["id"])
    assert cancel["id"] != confirm["id"]
    (start,) = of_type(frames, "tool_execution_start")
    (end,) = of_type(frames, "tool_execution_end")
    assert start["toolCallId"] == end["toolCallId"]
    assert end["isError"] is True
    assert result_text(end) == GATE_CANCELLED
    assert index_of(frames, "extension_ui_request", method="cancel") < index_of(
        frames, "tool_execution_end")
    assert len(of_type(frames, "agent_end")) == 1
    assert frames[index_of(frames, "prompt_result")]["status"] == "aborted"
    (abort,) = of_type(frames, "response", id="a")
    assert abort["success"] is True
    assert not of_type(frames, "extension_error")


async def test_stdin_eof_while_a_command_dialog_is_open(cwd: Path,
                                                       isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "patient", '''
        from omp.extensions import UiDisconnected

        def setup(omp):
            async def wait(args, ctx):
                try:
                    await ctx.ui.confirm("Still there?", "Answer me")
                except UiDisconnected as exc:
                    ctx.ui.notify(f"{type(exc).__name__}: {exc}", "error")
                    # A later dialog fails at once too.
                    try:
                        await ctx.ui.input("And now?")
                    except UiDisconnected as again:
                        ctx.ui.notify(f"again: {again}", "error")

            omp.register_command("wait", "Waits for an answer", wait)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "w", "type": "prompt", "message": "/wait"})
            await host.ui_request("confirm")
            await host.close_input()
            frames = await host.rest()
            code = await host.wait()
    assert code == 0
    assert [f["message"] for f in ui_requests(frames, "notify")] == [
        f"UiDisconnected: {UI_GONE}", f"again: {UI_GONE}"]
    assert of_type(frames, "prompt_result", id="w")
    assert "Traceback" not in host.stderr


async def test_stdin_eof_while_the_gate_confirm_is_open(cwd: Path,
                                                       isolated_agent_dir: Path) -> None:
    gate = install(isolated_agent_dir, "gate", GATE)
    (cwd / "x.txt").write_text("keep me\n")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "p", "type": "prompt", "message": bash_prompt("rm x.txt")})
            await host.ui_request("confirm")
            await host.close_input()
            frames = await host.rest()
            code = await host.wait()
    assert code == 0
    assert (cwd / "x.txt").read_text() == "keep me\n"
    # The confirm raised in the handler (a failing tool_call handler blocks the call), unless
    # the session's close cancelled the run first.
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    assert result_text(end) in (f"Extension {gate} failed: {UI_GONE}", GATE_CANCELLED)
    if result_text(end) != GATE_CANCELLED:
        assert of_type(frames, "extension_error") == [{
            "type": "extension_error", "extensionPath": str(gate), "event": "tool_call",
            "error": UI_GONE}]
    assert "Traceback" not in host.stderr


# --- --no-ui, explicit paths, objects (embedded until the flags exist) ---------------------------


def offline_options(cwd: Path, agent_dir: Path, **fields: Any) -> omp.ServeOptions:
    return omp.ServeOptions(model="offline/echo", cwd=cwd, agent_dir=agent_dir, persist=False,
                            announce_offline=False, **fields)


def dialog_recorder(seen: list[object]) -> Any:
    """An extension object: its ``/dialogs`` records ``has_ui`` and every dialog's result;
    its ``tool_call`` handler asks before ``todo`` calls."""

    def setup(api: ExtensionAPI) -> None:
        async def dialogs(args: str, ctx: ExtensionContext) -> None:
            seen.append(ctx.has_ui)
            seen.append(await ctx.ui.select("Pick", ["a", "b"], timeout=60_000))
            seen.append(await ctx.ui.confirm("Sure?", "Really?"))
            seen.append(await ctx.ui.input("Name?"))
            seen.append(await ctx.ui.editor("Edit", "text"))
            ctx.ui.notify("hidden")
            ctx.ui.set_status("k", "v")
            ctx.ui.set_widget("k", ["x"])
            ctx.ui.set_title("title")
            ctx.ui.set_editor_text("text")

        async def ask_first(event: Any, ctx: ExtensionContext) -> Any:
            if event.tool_name == "todo" and not await ctx.ui.confirm("Run todo?", "todo"):
                return {"block": True, "reason": "Blocked by user"}
            return None

        api.register_command("dialogs", "every dialog", dialogs)
        api.on("tool_call", ask_first)

    return setup


async def test_no_ui_dialogs_return_defaults_without_frames(
        cwd: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PI_RPC_EMIT_TITLE", "1")
    seen: list[object] = []
    options = offline_options(cwd, isolated_agent_dir, ui=False,
                              extension_objects=[dialog_recorder(seen)])
    with trio.fail_after(LIMIT):
        async with open_embedded_host(options) as host:
            frames = await prompt(host, "/dialogs", "d")
            assert frames[-1]["status"] == "completed"
            frames = await prompt(host, 'go [[tool todo {"op": "view"}]]', "t")
    assert seen == [False, None, False, None, None]
    (end,) = of_type(frames, "tool_execution_end")
    assert (end["isError"], result_text(end)) == (True, "Blocked by user")
    assert not ui_requests(host.frames)


async def test_with_ui_the_same_extension_asks_the_host(
        cwd: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PI_RPC_EMIT_TITLE", raising=False)
    seen: list[object] = []
    options = offline_options(cwd, isolated_agent_dir, extension_objects=[dialog_recorder(seen)])
    with trio.fail_after(LIMIT):
        async with open_embedded_host(options) as host:
            await host.send({"id": "d", "type": "prompt", "message": "/dialogs"})
            await host.answer(await host.ui_request("select"), value="b")
            await host.answer(await host.ui_request("confirm"), confirmed=True)
            await host.answer(await host.ui_request("input"), value="Ada")
            await host.answer(await host.ui_request("editor"), value="edited")
            frames = await host.until_type("prompt_result", id="d")
    assert seen == [True, "b", True, "Ada", "edited"]
    # setTitle is not written: PI_RPC_EMIT_TITLE is not set.
    assert [r["method"] for r in ui_requests(frames)] == [
        "notify", "setStatus", "setWidget", "set_editor_text"]


async def test_an_explicit_extension_path_loads_without_discovery(
        cwd: Path, isolated_agent_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gate.py").write_text(GATE)
    install(isolated_agent_dir, "ignored", '''
        def setup(omp):
            omp.register_command("ignored", "must not load", lambda args, ctx: None)
    ''')
    options = offline_options(cwd, isolated_agent_dir, discover_extensions=False,
                              extensions=[elsewhere / "gate.py"])
    with trio.fail_after(LIMIT):
        async with open_embedded_host(options) as host:
            assert extension_commands(host.startup[-1]) == [
                {"name": "hello", "source": "extension", "description": "Say hello", "input": ARGS}]
            await host.send({"id": "p", "type": "prompt", "message": bash_prompt("rm nothing")})
            await host.answer(await host.ui_request("confirm"), confirmed=False)
            frames = await host.until_type("prompt_result", id="p")
    (end,) = of_type(frames, "tool_execution_end")
    assert result_text(end) == "Blocked by user"


# --- handler failures ----------------------------------------------------------------------------

FAILING = '''
def setup(omp):
    async def explode(event, ctx):
        raise RuntimeError("boom in tool_call")

    async def bad_turn(event, ctx):
        raise ValueError(f"bad turn {event.turn_index}")

    omp.on("turn_start", bad_turn)
    omp.on("tool_call", explode)

    async def bad_start(event, ctx):
        raise OSError("no start")

    omp.on("session_start", bad_start)
'''


async def test_a_failing_handler_reports_and_a_failing_tool_call_handler_blocks(
        cwd: Path, isolated_agent_dir: Path) -> None:
    path = install(isolated_agent_dir, "failing", FAILING)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, bash_prompt("touch ran.txt"))
    assert not (cwd / "ran.txt").exists()
    # session_start runs before the commands list goes out.
    assert [f["type"] for f in host.startup] == [
        "ready", "extension_error", "available_commands_update"]
    assert host.startup[1] == {"type": "extension_error", "extensionPath": str(path),
                               "event": "session_start", "error": "no start"}
    errors = of_type(frames, "extension_error")
    assert errors == [
        {"type": "extension_error", "extensionPath": str(path), "event": "turn_start",
         "error": "bad turn 0"},
        {"type": "extension_error", "extensionPath": str(path), "event": "tool_call",
         "error": "boom in tool_call"},
        {"type": "extension_error", "extensionPath": str(path), "event": "turn_start",
         "error": "bad turn 1"},
    ]
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    assert result_text(end) == f"Extension {path} failed: boom in tool_call"
    # The run itself goes on: both turns, one agent_end, completed.
    assert len(of_type(frames, "turn_end")) == 2
    assert len(of_type(frames, "agent_end")) == 1
    assert frames[-1]["status"] == "completed"


async def test_a_failing_command_reports_and_its_prompt_completes(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "oops", '''
        def setup(omp):
            async def oops(args, ctx):
                raise KeyError("missing thing")
            omp.register_command("oops", "fails", oops)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "/oops now")
    (error,) = of_type(frames, "extension_error")
    assert error == {"type": "extension_error", "extensionPath": "command:oops",
                     "event": "command", "error": "'missing thing'"}
    assert index_of(frames, "extension_error") < index_of(frames, "prompt_result")
    assert frames[-1]["agentInvoked"] is False


# Handler timeouts run in this program on trio's MockClock (autojump): the 30 s and 2 s limits
# pass in virtual time. The tool is ``todo``, which never waits on a thread or a process (real
# time, during which autojump would race to the next deadline).


def handler_object(event: str, handler: Any) -> Any:
    def setup(api: ExtensionAPI) -> None:
        api.on(event, handler)
    return setup


async def test_a_tool_call_handler_that_times_out_blocks_the_call(
        cwd: Path, isolated_agent_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    started: list[float] = []

    async def stuck(event: Any, ctx: ExtensionContext) -> None:
        started.append(trio.current_time())
        await trio.sleep(3600)

    options = offline_options(cwd, isolated_agent_dir,
                              extension_objects=[handler_object("tool_call", stuck)])
    with trio.fail_after(VIRTUAL_STEP * 2):
        async with open_embedded_host(options) as host:
            host.step = VIRTUAL_STEP
            frames = await prompt(host, TODO)
            (error,) = of_type(frames, "extension_error")
            reported = trio.current_time()
    assert error == {"type": "extension_error", "extensionPath": "<inline-0>",
                     "event": "tool_call", "error": "handler timed out after 30000ms"}
    assert reported - started[0] == pytest.approx(30.0, abs=0.5)
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    assert result_text(end) == "Extension <inline-0> timed out after 30000ms"
    assert frames[-1]["status"] == "completed"


async def test_time_in_a_dialog_does_not_count_against_a_tool_call_handler(
        cwd: Path, isolated_agent_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async def slow_but_asking(event: Any, ctx: ExtensionContext) -> None:
        # 25 s of its own time: under the 30 s limit only if the dialog's 100 s do not count.
        await trio.sleep(20)
        if not await ctx.ui.confirm("Go on?", "the user takes a while"):
            raise AssertionError("the host said yes")
        await trio.sleep(5)

    options = offline_options(cwd, isolated_agent_dir,
                              extension_objects=[handler_object("tool_call", slow_but_asking)])
    with trio.fail_after(VIRTUAL_STEP * 2):
        async with open_embedded_host(options) as host:
            host.step = VIRTUAL_STEP
            await host.send({"id": "p", "type": "prompt", "message": TODO})
            confirm = await host.ui_request("confirm")
            await trio.sleep(100)  # the user thinks for 100 s
            await host.answer(confirm, confirmed=True)
            frames = await host.until_type("prompt_result", id="p")
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is False, end
    assert not of_type(host.frames, "extension_error")


async def test_a_context_handler_that_times_out_is_reported_and_the_run_goes_on(
        cwd: Path, isolated_agent_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async def stuck(event: Any, ctx: ExtensionContext) -> None:
        await trio.sleep(3600)

    options = offline_options(cwd, isolated_agent_dir,
                              extension_objects=[handler_object("context", stuck)])
    with trio.fail_after(VIRTUAL_STEP * 2):
        async with open_embedded_host(options) as host:
            host.step = VIRTUAL_STEP
            started = trio.current_time()
            frames = await prompt(host, "hello there")
    assert of_type(frames, "extension_error") == [
        {"type": "extension_error", "extensionPath": "<inline-0>", "event": "context",
         "error": "handler timed out after 30000ms"}]
    assert trio.current_time() - started == pytest.approx(30.0, abs=0.5)
    final = of_type(frames, "message_end")[-1]["message"]
    assert final["content"][0]["text"] == "Echo: hello there"
    assert frames[-1]["status"] == "completed"


async def test_session_shutdown_handlers_run_at_once_each_capped_at_two_seconds(
        cwd: Path, isolated_agent_dir: Path, autojump_clock: trio.testing.MockClock) -> None:
    async def stuck(event: Any, ctx: ExtensionContext) -> None:
        ctx.ui.notify("stuck starts")
        await trio.sleep(3600)

    async def quick(event: Any, ctx: ExtensionContext) -> None:
        ctx.ui.notify("quick starts")
        await trio.sleep(1)
        ctx.ui.notify("quick done")

    def setup(api: ExtensionAPI) -> None:
        api.on("session_shutdown", stuck)
        api.on("session_shutdown", quick)

    options = offline_options(cwd, isolated_agent_dir, extension_objects=[setup])
    with trio.fail_after(VIRTUAL_STEP * 2):
        async with open_embedded_host(options) as host:
            host.step = VIRTUAL_STEP
            closed = trio.current_time()
            await host.close_input()
            frames = await host.rest()
            await host.returned.wait()
    # Started together (in either order); the quick one finished while the other hung.
    notes = [r["message"] for r in ui_requests(frames, "notify")]
    assert sorted(notes[:2]) == ["quick starts", "stuck starts"]
    assert notes[2:] == ["quick done"]
    assert of_type(frames, "extension_error") == [
        {"type": "extension_error", "extensionPath": "<inline-0>", "event": "session_shutdown",
         "error": "handler timed out after 2000ms"}]
    assert host.returned_at is not None
    assert host.returned_at - closed == pytest.approx(2.0, abs=0.5)


# --- loading -------------------------------------------------------------------------------------


async def test_load_errors_are_reported_and_the_others_still_load(
        cwd: Path, isolated_agent_dir: Path) -> None:
    good = install(isolated_agent_dir, "a_good", '''
        def setup(omp):
            async def good(args, ctx):
                ctx.ui.notify("good ran")
            omp.register_command("good", "works", good)
    ''')
    broken = {
        install(isolated_agent_dir, "b_import", "import omp_no_such_module_xyz\n"):
            "No module named 'omp_no_such_module_xyz'",
        install(isolated_agent_dir, "c_no_setup", "SETUP = None\n"): None,
        install(isolated_agent_dir, "d_setup_raises", '''
            def setup(omp):
                omp.register_command("partial", "registered before the failure", None)
                raise RuntimeError("setup failed on purpose")
        '''): "setup failed on purpose",
        install(isolated_agent_dir, "e_syntax", "def setup(omp:\n"): "was never closed",
    }
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            startup = host.startup
            frames = await prompt(host, "/good")
    assert startup[0]["type"] == "ready"
    errors = {e["extensionPath"]: e for e in of_type(startup, "extension_error")}
    assert sorted(errors) == sorted(str(p) for p in broken)
    for path, text in broken.items():
        error = errors[str(path)]
        assert set(error) == {"type", "extensionPath", "event", "error"}
        assert error["event"] == "load"
        if text is not None:
            assert text in error["error"]
        assert f"Failed to load extension {path}: {error['error']}" in host.stderr
    assert errors[str(next(p for p in broken if p.stem == "c_no_setup"))]["error"] == (
        f"Extension does not define setup(omp): "
        f"{next(p for p in broken if p.stem == 'c_no_setup')}")
    # Only the good extension's command: the failed setup's registration was dropped.
    assert extension_commands(startup[-1]) == [{"name": "good", "source": "extension",
                                                "description": "works", "input": ARGS}]
    assert [r["message"] for r in ui_requests(frames, "notify")] == ["good ran"]
    assert str(good) not in errors


PROJECT = '''
def setup(omp):
    async def proj(args, ctx):
        ctx.ui.notify("project code ran")
    omp.register_command("proj", "from the repository", proj)
'''


async def test_project_extensions_are_skipped_until_trusted(cwd: Path,
                                                            isolated_agent_dir: Path) -> None:
    install_project(cwd, "proj", PROJECT)
    install(isolated_agent_dir, "gate", GATE)
    # A repository cannot trust itself through its own settings.
    (cwd / ".omp" / "config.yml").write_text(f"trustedProjects:\n  - {cwd}\n")
    folder = cwd / ".omp" / "extensions"
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "/proj")
    (notice,) = of_type(host.startup, "notice")
    assert notice["level"] == "warning"
    assert str(folder) in notice["message"]
    assert set(notice) <= {"type", "level", "message", "source"}
    # The global extension loaded; the project's command does not exist, so "/proj" is text.
    assert extension_commands(host.startup[-1]) == [
        {"name": "hello", "source": "extension", "description": "Say hello", "input": ARGS}]
    assert not ui_requests(frames, "notify")
    assert frames[-1]["agentInvoked"] is True


async def test_project_extensions_load_when_trusted_in_the_global_config(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install_project(cwd, "proj", PROJECT)
    (isolated_agent_dir / "config.yml").write_text(f"trustedProjects:\n  - {cwd}\n")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "/proj")
    assert not of_type(host.startup, "notice")
    assert extension_commands(host.startup[-1]) == [
        {"name": "proj", "source": "extension", "description": "from the repository",
         "input": ARGS}]
    assert [r["message"] for r in ui_requests(frames, "notify")] == ["project code ran"]


async def test_session_start_frames_come_before_the_commands_list(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "starter", '''
        def setup(omp):
            async def started(event, ctx):
                ctx.ui.set_widget("starter", ["ready to go"])
            omp.on("session_start", started)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            pass
    assert [f["type"] for f in host.startup] == [
        "ready", "extension_ui_request", "available_commands_update"]
    assert host.startup[1]["widgetLines"] == ["ready to go"]


# --- ctx.shutdown() ------------------------------------------------------------------------------

BYE = '''
def setup(omp):
    async def bye(args, ctx):
        ctx.ui.notify("bye")
        ctx.shutdown()

    async def closing(event, ctx):
        ctx.ui.notify("session_shutdown")

    omp.register_command("bye", "Leave", bye)
    omp.on("session_shutdown", closing)
'''


async def test_shutdown_answers_the_command_then_exits_and_drops_what_follows(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "bye", BYE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            # One write: the command and one queued behind it
            # (docs/design/protocol.md#shutdown-asked-by-an-extension).
            await host.send({"id": "b", "type": "prompt", "message": "/bye"},
                            {"id": "s", "type": "get_state"})
            frames = await host.rest()  # the output ends while our input is still open
            code = await host.wait()
    assert code == 0
    assert [f.get("id") for f in of_type(frames, "response")] == ["b"]
    (result,) = of_type(frames, "prompt_result")
    assert (result["id"], result["agentInvoked"]) == ("b", False)
    notes = [r["message"] for r in ui_requests(frames, "notify")]
    assert notes == ["bye", "session_shutdown"]
    assert index_of(frames, "prompt_result") < index_of(frames, "extension_ui_request",
                                                        message="session_shutdown")


async def test_shutdown_waits_for_the_command_then_exits(cwd: Path,
                                                         isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "bye", BYE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "b", "type": "prompt", "message": "/bye"})
            await host.until_type("prompt_result", id="b")
            rest = await host.rest()  # the output ends while our input is still open
            assert await host.wait() == 0
    # Only what session_shutdown said comes after the command's prompt_result.
    assert [(f["type"], f.get("message")) for f in rest] == [
        ("extension_ui_request", "session_shutdown")]


STOP_AT_THE_END = '''
def setup(omp):
    def stop(event, ctx):
        ctx.shutdown()

    omp.on("agent_end", stop)
'''


async def test_shutdown_while_an_abort_waits_for_the_run_still_answers_the_abort(
        cwd: Path, isolated_agent_dir: Path) -> None:
    """The reader answers ``abort`` itself, once the run has ended; the run's ``agent_end``
    handler asks for the shutdown meanwhile: the abort is the command running now, so it is
    answered, then the server ends."""
    install(isolated_agent_dir, "stop", STOP_AT_THE_END)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "p", "type": "prompt",
                             "message": "[[slow 0.5]] one two three four five six"})
            await host.until_type("message_update")
            await host.send({"id": "a", "type": "abort"})
            frames = await host.rest()  # the output ends while our input is still open
            code = await host.wait()
    assert code == 0
    (answer,) = [f for f in frames if f["type"] == "response" and f.get("id") == "a"]
    assert answer["success"] is True
    assert [f["status"] for f in of_type(frames, "prompt_result")] == ["aborted"]


# --- extension tools and the tool hooks ----------------------------------------------------------

TOOLS = '''
from omp.extensions import ExtensionAPI, ExtensionContext


def setup(omp: ExtensionAPI) -> None:
    async def count(call_id, params, ctx: ExtensionContext, on_update):
        words = params["text"].split()
        return {"content": [{"type": "text", "text": f"{len(words)} words"}],
                "details": {"words": len(words), "cwd": str(ctx.cwd)}}

    async def fail(call_id, params, ctx, on_update):
        raise RuntimeError("the tool broke")

    omp.register_tool(
        "word_count", "Word count", "Counts the words of a text.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        count)
    omp.register_tool("failing", "Failing", "Always fails.", {"type": "object"}, fail)
'''


async def test_the_model_calls_extension_tools(cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "tools", TOOLS)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, 'count [[tool word_count {"text": "one two three"}]] '
                                        'and [[tool failing {}]] and [[tool word_count {}]]')
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    # In call order (the calls are shared: they start and end in whatever order they run).
    (assistant, *_) = [f["message"] for f in of_type(frames, "message_end")
                       if f["message"]["role"] == "assistant"]
    first, second, third = (ends[b["id"]] for b in assistant["content"]
                            if b["type"] == "toolCall")
    assert (first["toolName"], first["isError"], result_text(first)) == (
        "word_count", False, "3 words")
    assert first["result"]["details"] == {"words": 3, "cwd": str(cwd)}
    assert (second["toolName"], second["isError"], result_text(second)) == (
        "failing", True, "the tool broke")
    # Its arguments are validated against its schema, like a built-in's.
    assert third["isError"] is True
    assert "text" in result_text(third)
    assert frames[-1]["status"] == "completed"


MODES = '''
import trio

pair = []


def setup(omp):
    async def step(call_id, params, ctx, on_update):
        if params.get("pair"):
            # Calls that must run together each wait for the other to have started: a
            # scheduler that ran them one after the other would hang here (the test's limit).
            if not pair:
                pair.append(trio.Event())
                await pair[0].wait()
            else:
                pair[0].set()
        else:
            # The point, not a wait for something: a sibling started too early would show up
            # between this call's start and end. A correct scheduler never starts it, so the
            # sleep cannot fail a correct run; it can only let a wrong one pass unseen.
            await trio.sleep(0.05)
        return "stepped"

    schema = {"type": "object", "properties": {"alone": {"type": "boolean"},
                                               "pair": {"type": "boolean"}}}
    omp.register_tool("step", "Step", "One step.", schema, step, concurrency="exclusive")
    omp.register_tool("hop", "Hop", "One hop.", schema, step,
                      concurrency=lambda args: "exclusive" if args.get("alone") else "shared")
'''


async def test_an_extension_tool_declares_how_its_calls_run(cwd: Path,
                                                          isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "modes", MODES)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            exclusive = await prompt(host, "[[tool step {}]] [[tool step {}]]", "p1")
            shared = await prompt(host, '[[tool hop {"pair": true}]] [[tool hop {"pair": true}]]',
                                  "p2")
            alone = await prompt(host, '[[tool hop {"alone": true}]] [[tool hop {}]]', "p3")

    def order(frames: list[dict[str, Any]]) -> list[str]:
        return [f["type"].removeprefix("tool_execution_") for f in frames
                if f["type"] in ("tool_execution_start", "tool_execution_end")]

    assert order(exclusive) == ["start", "end", "start", "end"]
    assert order(shared) == ["start", "start", "end", "end"]
    assert order(alone) == ["start", "end", "start", "end"]
    for frames in (exclusive, shared, alone):
        assert [result_text(f) for f in of_type(frames, "tool_execution_end")] == [
            "stepped", "stepped"]


def test_a_tool_concurrency_is_shared_exclusive_or_a_function() -> None:
    api = ExtensionAPI(Extension("x.py", "x"))
    with pytest.raises(ValueError, match='concurrency must be "shared", "exclusive"'):
        api.register_tool("t", "T", "d", {"type": "object"}, _never,
                          concurrency="parallel")  # type: ignore[arg-type]


async def _never(call_id: str, params: dict[str, Any], ctx: Any, on_update: Any) -> str:
    raise AssertionError("not called")


async def test_tool_result_handlers_chain_and_tool_call_may_replace_input(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "a_first", '''
        async def rewrite(event, ctx):
            if event.tool_name == "bash" and "original" in event.input["command"]:
                return {"input": {"command": "printf replaced"}}

        async def tag(event, ctx):
            return {"content": [{"type": "text", "text": event.content[0]["text"] + " +a"}]}

        def setup(omp):
            omp.on("tool_call", rewrite)
            omp.on("tool_result", tag)
    ''')
    install(isolated_agent_dir, "b_second", '''
        from omp.extensions import ToolResultChange

        async def tag(event, ctx):
            # Sees the first extension's change.
            text = event.content[0]["text"]
            return ToolResultChange(content=[{"type": "text", "text": text + " +b"}],
                                    is_error=text.endswith("+a"))

        def setup(omp):
            omp.on("tool_result", tag)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, bash_prompt("printf original"))
    (start,) = of_type(frames, "tool_execution_start")
    assert start["args"] == {"command": "printf replaced"}
    (end,) = of_type(frames, "tool_execution_end")
    assert (result_text(end), end["isError"]) == ("replaced +a +b", True)
    (message,) = [f["message"] for f in of_type(frames, "message_end")
                  if f["message"]["role"] == "toolResult"]
    assert message["content"] == [{"type": "text", "text": "replaced +a +b"}]
    assert message["isError"] is True


async def test_tool_call_runs_for_host_tools_before_the_host_is_asked(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "guard", '''
        async def guard(event, ctx):
            if event.tool_name == "lookup":
                return {"block": True}

        def setup(omp):
            omp.on("tool_call", guard)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "h", "type": "set_host_tools", "tools": [
                {"name": "lookup", "description": "Looks things up",
                 "parameters": {"type": "object"}}]})
            await host.until_type("response", id="h")
            frames = await prompt(host, "find [[tool lookup {}]]")
    assert not of_type(frames, "host_tool_call")
    (end,) = of_type(frames, "tool_execution_end")
    # A block without a reason: the original's default text.
    assert (end["isError"], result_text(end)) == (
        True, "Tool execution was blocked by an extension")


async def test_an_extension_tool_replaces_the_built_in_of_its_name(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "fake_bash", '''
        async def pretend(call_id, params, ctx, on_update):
            return f"pretended to run: {params['command']}"

        def setup(omp):
            omp.register_tool("bash", "Bash", "Runs nothing.",
                              {"type": "object", "properties": {"command": {"type": "string"}}},
                              pretend)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, bash_prompt("touch ran.txt"))
    (end,) = of_type(frames, "tool_execution_end")
    assert (end["isError"], result_text(end)) == (False, "pretended to run: touch ran.txt")
    assert not (cwd / "ran.txt").exists()


async def test_an_extension_printing_never_reaches_the_host(cwd: Path,
                                                            isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "chatty", '''
        import sys

        print("printed at import")

        def setup(omp):
            print("printed in setup")

            async def loud(event, ctx):
                print("printed in a handler")
                sys.stdout.flush()

            omp.on("tool_call", loud)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, bash_prompt("printf fine"))
    # RawHost decodes every line as JSON: a stray line would have failed the read.
    assert result_text(of_type(frames, "tool_execution_end")[0]) == "fine"
    assert all("printed" not in str(f) for f in host.frames)
    for text in ("printed at import", "printed in setup", "printed in a handler"):
        assert text in host.stderr


# --- hooks that change what the model gets (fake LLM: its recorded requests) ---------------------


def chat(request_body: dict[str, Any]) -> list[tuple[str, str]]:
    """(role, text) of a chat-completions request's messages."""
    out = []
    for message in request_body["messages"]:
        content = message.get("content")
        text = content if isinstance(content, str) else "".join(
            part.get("text", "") for part in content or [])
        out.append((message["role"], text))
    return out


async def test_context_replaces_what_one_call_sends(cwd: Path,
                                                    isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "squash", '''
        from omp.protocol.messages import UserMessage

        async def squash(event, ctx):
            last = event.messages[-1]
            assert isinstance(last, UserMessage)
            return {"messages": [{"role": "user", "timestamp": last.timestamp,
                                  "content": [{"type": "text", "text": "REWRITTEN"}]}]}

        def setup(omp):
            omp.on("context", squash)
    ''')
    with trio.fail_after(LIMIT):
        async with fake_provider([text_reply("one"), text_reply("two")],
                                 isolated_agent_dir) as fake:
            async with open_process_host(cwd, args=FAKE_ARGS) as host:
                await prompt(host, "first question", "p1")
                await prompt(host, "second question", "p2")
                await host.send({"id": "m", "type": "get_messages"})
                (messages,) = of_type(await host.until_type("response", id="m"), "response")
            requests = [chat(r.json()) for r in fake.requests]
    for sent in requests:
        assert [m for m in sent if m[0] != "system"] == [("user", "REWRITTEN")], sent
    # The history itself is unchanged.
    history = [(m["role"], m["content"][0]["text"]) for m in messages["data"]["messages"]]
    assert history == [("user", "first question"), ("assistant", "one"),
                       ("user", "second question"), ("assistant", "two")]


async def test_before_agent_start_adds_a_message_and_changes_the_system_prompt(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "primer", '''
        async def prime(event, ctx):
            if "[note]" not in event.prompt:
                return None
            return {"message": {"customType": "primer", "content": f"NOTE for {event.prompt}",
                                "display": True},
                    "system_prompt": [*event.system_prompt, "EXTRA SYSTEM RULE"]}

        def setup(omp):
            omp.on("before_agent_start", prime)
    ''')
    with trio.fail_after(LIMIT):
        async with fake_provider([text_reply("ok"), text_reply("plain")],
                                 isolated_agent_dir) as fake:
            async with open_process_host(cwd, args=FAKE_ARGS) as host:
                frames = await prompt(host, "hello [note]", "p1")
                await prompt(host, "no note", "p2")
            first, second = (chat(r.json()) for r in fake.requests)
    system = [text for role, text in first if role in ("system", "developer")]
    assert any("EXTRA SYSTEM RULE" in text for text in system), system
    assert [m for m in first if m[0] not in ("system", "developer")] == [
        ("user", "hello [note]"), ("user", "NOTE for hello [note]")]
    # For that run only.
    assert not any("EXTRA SYSTEM RULE" in text for role, text in second)
    # The host sees the added message after the prompt, before the model's answer.
    roles = [f["message"]["role"] for f in of_type(frames, "message_start")]
    assert roles == ["user", "custom", "assistant"]
    custom = of_type(frames, "message_end")[1]["message"]
    assert (custom["customType"], custom["content"], custom["display"]) == (
        "primer", "NOTE for hello [note]", True)


# --- commands that start runs --------------------------------------------------------------------


async def test_send_user_message_from_a_command_starts_a_run(cwd: Path,
                                                             isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "go", '''
        def setup(omp):
            async def go(args, ctx):
                omp.send_user_message(f"from the extension: {args}")
            omp.register_command("go", "Prompts the model", go)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "/go now", "g")
    (response,) = of_type(frames, "response", id="g")
    assert response["data"] == {"disposition": "handled"}
    user = of_type(frames, "message_end")[0]["message"]
    assert (user["role"], user["content"][0]["text"]) == ("user", "from the extension: now")
    answer = of_type(frames, "message_end")[-1]["message"]
    assert answer["content"][0]["text"] == "Echo: from the extension: now"
    assert frames[-1] == {"type": "prompt_result", "id": "g", "agentInvoked": True,
                          "status": "completed", "sessionSettled": True}
    assert index_of(frames, "agent_end") < len(frames) - 1
    assert len(of_type(frames, "agent_end")) == 1


async def test_the_later_extension_wins_a_command_name(
        cwd: Path, isolated_agent_dir: Path) -> None:
    """Two extensions registering the same command: the later one wins, and the list has it
    once (docs/design/extending.md#the-omp-object)."""
    for name, said in (("a_one", "first"), ("b_two", "second")):
        install(isolated_agent_dir, name, f'''
            def setup(omp):
                async def same(args, ctx):
                    ctx.ui.notify("{said}")
                omp.register_command("same", "{said}", same)
        ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, "/same")
    assert extension_commands(host.startup[-1]) == [
        {"name": "same", "source": "extension", "description": "second", "input": ARGS}]
    assert [r["message"] for r in ui_requests(frames, "notify")] == ["second"]


async def test_send_message_adds_to_the_context_or_starts_a_run(
        cwd: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "memo", '''
        def setup(omp):
            async def memo(args, ctx):
                omp.send_message({"customType": "memo", "content": args, "display": True})

            async def nudge(args, ctx):
                omp.send_message(args, trigger_turn=True)

            omp.register_command("memo", "remember", memo)
            omp.register_command("nudge", "remember and go on", nudge)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            quiet = await prompt(host, "/memo remember the milk", "m")
            busy = await prompt(host, "/nudge carry on", "n")
            await host.send({"id": "g", "type": "get_messages"})
            (messages,) = of_type(await host.until_type("response", id="g"), "response")
    # Idle, without trigger_turn: into the context, no run.
    assert quiet[-1]["agentInvoked"] is False
    assert not of_type(quiet, "agent_start")
    # trigger_turn: a run answers it (a string is a displayed "custom-message").
    assert busy[-1]["agentInvoked"] is True
    assert busy[-1]["status"] == "completed"
    history = messages["data"]["messages"]
    assert [(m["role"], m.get("customType"), m["content"] if isinstance(m["content"], str)
             else m["content"][0]["text"]) for m in history] == [
        ("custom", "memo", "remember the milk"),
        ("custom", "custom-message", "carry on"),
        ("assistant", None, history[2]["content"][0]["text"]),
    ]


async def test_ctx_abort_from_a_command_aborts_the_run(cwd: Path,
                                                       isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "stop", '''
        def setup(omp):
            async def stop(args, ctx):
                ctx.abort()
            omp.register_command("stop", "stop the agent", stop)
    ''')
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            await host.send({"id": "p", "type": "prompt",
                             "message": "[[slow 0.3]] a long answer of many words"})
            await host.until_type("message_update")
            # Extension commands run while the agent streams.
            await host.send({"id": "s", "type": "prompt", "message": "/stop"})
            await host.until(lambda f: len(of_type(host.frames, "prompt_result")) == 2)
    results = {f["id"]: f for f in of_type(host.frames, "prompt_result")}
    assert results["p"]["status"] == "aborted"
    assert results["s"]["agentInvoked"] is False
    assert len(of_type(host.frames, "agent_end")) == 1


# --- embedded: what an extension object sees -----------------------------------------------------


async def test_ctx_reads_the_session_and_the_api_changes_tools(
        cwd: Path, isolated_agent_dir: Path) -> None:
    seen: dict[str, Any] = {}

    def setup(api: ExtensionAPI) -> None:
        with pytest.raises(RuntimeError, match="Action methods cannot be called"):
            api.get_active_tools()

        async def look(args: str, ctx: ExtensionContext) -> None:
            seen["cwd"] = ctx.cwd
            seen["idle"] = ctx.is_idle()
            seen["messages"] = [type(m).__name__ for m in ctx.session.messages]
            seen["model"] = (ctx.model.provider, ctx.model.id)
            seen["tools"] = api.get_active_tools()
            api.set_active_tools(["read", "todo"])
            seen["after"] = api.get_active_tools()

        api.register_command("look", "look around", look)

    options = offline_options(cwd, isolated_agent_dir, extension_objects=[setup])
    with trio.fail_after(LIMIT):
        async with open_embedded_host(options) as host:
            await prompt(host, "hello", "p1")
            await prompt(host, "/look", "p2")
            frames = await prompt(host, 'go [[tool bash {"command": "true"}]]', "p3")
    assert seen["cwd"] == cwd
    assert seen["idle"] is True
    assert seen["messages"] == ["UserMessage", "AssistantMessage"]
    assert seen["model"] == ("offline", "echo")
    assert {"bash", "todo"} <= set(seen["tools"])
    assert seen["after"] == ["read", "todo"]
    # bash is no longer offered: the model's call to it fails as an unknown tool.
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True


# --- the examples users copy --------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "extensions"
EXAMPLE_REGISTRATIONS: dict[str, tuple[set[str], set[str], set[str]]] = {
    "permission_gate": ({"tool_call"}, set(), set()),
    "status_widget": ({"session_start", "agent_start", "turn_start", "turn_end", "agent_end"},
                      set(), set()),
    "word_count_tool": (set(), {"word_count"}, set()),
}
"""Per example file: the events it handles, its tools, its commands. A new example goes here."""


def test_every_example_loads_through_the_loader(tmp_path: Path) -> None:
    sources, skipped = discover(cwd=tmp_path, agent_dir=tmp_path, paths=[EXAMPLES],
                                discovery=False)
    assert skipped is None
    assert sorted(s.name for s in sources) == sorted(
        p.stem for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
    report = load(sources)
    assert report.errors == []
    found = {e.name: (set(e.handlers), set(e.tools), set(e.commands))
             for e in report.extensions.extensions}
    assert found == EXAMPLE_REGISTRATIONS


async def test_the_examples_work_in_a_session(cwd: Path, isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "extensions").mkdir()
    for example in EXAMPLES.glob("*.py"):
        shutil.copy(example, isolated_agent_dir / "extensions" / example.name)
    (cwd / "build").mkdir()
    (cwd / "notes.txt").write_text("one two\nthree\n")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            # status_widget: its session_start status precedes the commands list.
            assert [r["method"] for r in ui_requests(host.startup)] == ["setStatus"]
            await host.send({"id": "p", "type": "prompt", "message": (
                'tidy [[tool bash {"command": "rm -rf build"}]] '
                '[[tool bash {"command": "printf safe"}]] '
                '[[tool word_count {"path": "notes.txt"}]] [[tool word_count {}]]')})
            confirm = await host.ui_request("confirm")
            assert (confirm["message"], confirm["timeout"]) == ("rm -rf build", 120_000)
            await host.answer(confirm, confirmed=False)
            await host.until_type("prompt_result", id="p")
    frames = host.frames[len(host.startup):]
    assert (cwd / "build").is_dir()
    ends = of_type(frames, "tool_execution_end")
    texts = {f["toolCallId"]: (f["isError"], result_text(f)) for f in ends}
    assert sorted(texts.values()) == sorted([
        (True, "The user did not allow this command: rm -rf build"),
        (False, "safe"),
        (False, "3 words, 2 lines, 14 characters"),
        (True, "word_count needs either text or path"),
    ])
    # status_widget: a status per turn, a widget after each turn, idle again at the end.
    statuses = [r.get("statusText", "") for r in ui_requests(frames, "setStatus")]
    assert statuses[:-1] == ["working", "working: turn 1", "working: turn 2"]
    assert statuses[-1].startswith("idle (last run: 2 turns, ")
    assert index_of(frames, "extension_ui_request", statusText=statuses[-1]) < index_of(
        frames, "agent_end")
    widgets = [r["widgetLines"] for r in ui_requests(frames, "setWidget")]
    assert widgets == [["turns: 1", "tool calls: 4 (2 failed)"],
                       ["turns: 2", "tool calls: 4 (2 failed)"]]


def test_on_rejects_unknown_events() -> None:
    from omp.extensions.api import Extension

    api = ExtensionAPI(Extension(path="<test>", name="test"))
    with pytest.raises(ValueError, match="Unknown extension event: 'tool_calls'"):
        api.on("tool_calls", lambda event, ctx: None)



# --- the command line ----------------------------------------------------------------------------

RECORDER = '''
from pathlib import Path

def setup(omp):
    async def dialogs(args, ctx):
        ctx.ui.notify("dropped without a UI")
        answer = await ctx.ui.confirm("Sure?", "really", timeout=60_000)
        Path("seen.txt").write_text(f"{ctx.has_ui} {answer}")
    omp.register_command("dialogs", "every dialog", dialogs)
'''


async def test_no_ui_flag_answers_dialogs_with_defaults(cwd: Path,
                                                       isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "recorder", RECORDER)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=[*OFFLINE_ARGS, "--no-ui"]) as host:
            frames = await prompt(host, "/dialogs")
    assert (frames[-1]["status"], frames[-1]["agentInvoked"]) == ("completed", False)
    assert (cwd / "seen.txt").read_text() == "False False"
    assert not ui_requests(host.frames)


async def test_extension_flag_loads_a_path_and_no_extensions_skips_discovery(
        cwd: Path, isolated_agent_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "gate.py").write_text(GATE)
    install(isolated_agent_dir, "recorder", RECORDER)
    args = [*OFFLINE_ARGS, "--no-extensions", "-e", str(elsewhere / "gate.py")]
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=args) as host:
            await host.send({"id": "p", "type": "prompt", "message": bash_prompt("rm nothing")})
            await host.answer(await host.ui_request("confirm"), confirmed=False)
            frames = await host.until_type("prompt_result", id="p")
        async with open_process_host(cwd, args=[*OFFLINE_ARGS, "--no-extensions"]) as bare:
            pass
    assert extension_commands(host.startup[-1]) == [
        {"name": "hello", "source": "extension", "description": "Say hello", "input": ARGS}]
    (end,) = of_type(frames, "tool_execution_end")
    assert result_text(end) == "Blocked by user"
    assert extension_commands(bare.startup[-1]) == []


async def test_trust_project_flag_loads_project_extensions(cwd: Path,
                                                          isolated_agent_dir: Path) -> None:
    install_project(cwd, "proj", PROJECT)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=[*OFFLINE_ARGS, "--trust-project"]) as host:
            frames = await prompt(host, "/proj")
    assert not of_type(host.startup, "notice")
    assert [r["message"] for r in ui_requests(frames, "notify")] == ["project code ran"]


ASK = ('choose [[tool ask {"questions": [{"question": "Colour?", "options": ["red", "blue"]}, '
       '{"question": "Name?"}]}]]')


async def test_rpc_ui_mode_gives_the_model_an_ask_tool(cwd: Path,
                                                       isolated_agent_dir: Path) -> None:
    args = ["--mode", "rpc-ui", "--model", "offline/echo", "--no-session"]
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=args) as host:
            await host.send({"id": "p", "type": "prompt", "message": ASK})
            select = await host.ui_request("select")
            assert (select["title"], select["options"]) == ("Colour?", ["red", "blue"])
            await host.answer(select, value="blue")
            await host.answer(await host.ui_request("input"), cancelled=True)
            frames = await host.until_type("prompt_result", id="p")
        async with open_process_host(cwd) as plain:
            plain_frames = await prompt(plain, ASK)
    (end,) = of_type(frames, "tool_execution_end")
    assert (end["isError"], result_text(end)) == (False, "Colour?: blue\nName?: (no answer)")
    # Plain rpc has no ask tool: the call fails as an unknown tool.
    (plain_end,) = of_type(plain_frames, "tool_execution_end")
    assert plain_end["isError"] is True
    assert not ui_requests(plain_frames)


# --- /reload-plugins ------------------------------------------------------------------------------

VERSIONED = '''
VERSION = {version}


def setup(omp):
    async def shutdown(event, ctx):
        with open("shutdowns.txt", "a") as log:
            log.write(f"v{{VERSION}}\\n")

    omp.on("session_shutdown", shutdown)
    async def execute(call_id, params, ctx, on_update):
        return f"version {{VERSION}}"

    omp.register_command(f"v{{VERSION}}", f"Version {{VERSION}}", lambda args, ctx: None)
    omp.register_tool(
        name="version", label="Version", description="Which version is loaded",
        parameters={{"type": "object", "properties": {{}}}}, execute=execute)
'''


async def test_reload_plugins_imports_the_extensions_again(
        cwd: Path, isolated_agent_dir: Path) -> None:
    """The old extension hears ``session_shutdown``, the file runs again: the new command is
    listed, the old one gone, and the new tool answers; the new one hears ``session_shutdown``
    when the server ends."""
    path = install(isolated_agent_dir, "versioned", VERSIONED.format(version=1))
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            assert [c["name"] for c in extension_commands(host.startup[-1])] == ["v1"]
            path.write_text(VERSIONED.format(version=2))
            await host.send({"id": "r", "type": "prompt", "message": "/reload-plugins"})
            reloaded = await host.until_type("response", id="r")
            after_reload = (cwd / "shutdowns.txt").read_text()
            used = await prompt(host, "which? [[tool version {}]]")
    assert reloaded[-1]["data"] == {"agentInvoked": False, "disposition": "handled"}
    assert [f["text"] for f in of_type(reloaded, "command_output")] == [
        "Reloaded extensions, skills, prompt templates and file commands."]
    (update,) = of_type(reloaded, "available_commands_update")
    assert [c["name"] for c in extension_commands(update)] == ["v2"]
    assert after_reload == "v1\n"
    (end,) = of_type(used, "tool_execution_end")
    assert result_text(end) == "version 2"
    assert (cwd / "shutdowns.txt").read_text() == "v1\nv2\n"


async def test_commands_written_at_spawn_wait_for_the_extensions(
        cwd: Path, isolated_agent_dir: Path) -> None:
    """Extensions load after ``ready``, in the serial lane: a prompt and a ``get_commands``
    written before the host has read anything still see them."""
    install(isolated_agent_dir, "versioned", VERSIONED.format(version=7))
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, read_startup=False) as host:
            await host.send({"id": "c", "type": "get_available_commands"})
            await host.send({"id": "p", "type": "prompt", "message": "/v7"})
            frames = await host.until_type("prompt_result", id="p")
    types = [f["type"] for f in frames]
    assert types[0] == "ready"
    assert types.index("available_commands_update") < types.index("response")
    (listed,) = [f for f in frames if f["type"] == "response" and f["id"] == "c"]
    assert "v7" in [c["name"] for c in listed["data"]["commands"]]
    # The extension's command ran: its response says it was handled, then its prompt_result.
    assert [f for f in frames if f["type"] == "response" and f["id"] == "p"] == [
        {"type": "response", "id": "p", "command": "prompt", "success": True,
         "data": {"disposition": "handled"}}]
    assert frames[-1] == {"type": "prompt_result", "id": "p", "agentInvoked": False,
                          "status": "completed", "sessionSettled": True}
    assert "message_start" not in types  # nothing reached the model


# --- entry-point discovery -----------------------------------------------------------------------


def test_entry_points_are_looked_up_only_when_a_distribution_may_declare_the_group(
        tmp_path: Path) -> None:
    """The cheap scan before ``importlib.metadata``: a ``*.dist-info`` or ``*.egg-info`` with
    the ``[omp.extensions]`` section, or a path entry that is not a folder (a zip)."""
    plain = tmp_path / "plain"
    (plain / "other-1.0.dist-info").mkdir(parents=True)
    (plain / "other-1.0.dist-info" / "entry_points.txt").write_text(
        "[console_scripts]\nother = other:main\n# [omp.extensions] in a comment\n")
    (plain / "nometa-1.0.dist-info").mkdir()
    declaring = tmp_path / "declaring"
    (declaring / "ext-1.0.egg-info").mkdir(parents=True)
    (declaring / "ext-1.0.egg-info" / "entry_points.txt").write_text(
        "[console_scripts]\next = ext:main\n\n  [ omp.extensions ]\next = ext\n")
    archive = tmp_path / "packages.zip"
    archive.write_bytes(b"PK\x05\x06" + bytes(18))
    assert not _group_may_be_declared([str(plain), str(tmp_path / "missing")])
    assert _group_may_be_declared([str(plain), str(declaring)])
    assert _group_may_be_declared([str(archive)])
