"""The original's TypeScript / JavaScript extensions, run unchanged in omp's JavaScript extension
host (issue 35), through the real ``omp`` process: the task runner's tool ban (``deny.ts``), the
same extension UI frames as a Python extension, tools cancelled by ``abort``, a crash of the host
reported while the session goes on, nothing left running after the session, and an extension that
cannot load never going unnoticed.

The host runs on bun, or on node >= 22.6 (type stripping); node 20 runs ``.js`` extensions only.
Tests that need one say so when they skip: ``.ci/run`` installs bun from npm (``npm install
bun``), as users of the original have it. The tests of what happens without any runtime need
none. Fixtures: ``tests/data/ts_extensions`` (its README says what each one is).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
import trio.testing
from agent_helpers import fake_provider, process_gone, text_reply, tool_call, tools_reply
from extension_helpers import (
    FAKE_ARGS,
    OFFLINE_ARGS,
    Frame,
    RawHost,
    install,
    of_type,
    open_embedded_host,
    open_process_host,
    result_text,
    ui_requests,
)

import omp
from omp.extensions.discovery import discover

DATA = Path(__file__).parent / "data" / "ts_extensions"
LIMIT = 90
"""Seconds (real time) any one test may take."""
OMP = [sys.executable, "-m", "omp"]
TOUCH_RULES = [{"tool": "bash", "match": r"^\s*touch\b",
                "reason": "Creating files with touch is not allowed in this task"}]


def _node() -> tuple[str, tuple[int, ...]] | None:
    path = shutil.which("node")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20,
                             check=True).stdout
        return path, tuple(int(p) for p in out.strip().lstrip("v").split(".")[:3])
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


BUN = shutil.which("bun")
NODE = _node()
TYPESCRIPT = BUN is not None or (NODE is not None and NODE[1] >= (22, 6))
needs_typescript = pytest.mark.skipif(
    not TYPESCRIPT, reason="needs bun (or node >= 22.6, which strips types) on PATH to run "
    "TypeScript extensions; .ci/run installs bun from npm (`npm install bun`), as users of the "
    "original have it")
needs_node = pytest.mark.skipif(NODE is None, reason="needs node on PATH")
needs_javascript = pytest.mark.skipif(
    BUN is None and NODE is None, reason="needs bun or node on PATH to run JavaScript "
    "extensions; .ci/run installs bun from npm (`npm install bun`)")


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def bash_prompt(command: str) -> str:
    return f"run it [[tool bash {json.dumps({'command': command})}]]"


def tool_prompt(name: str, args: dict[str, Any]) -> str:
    return f"use it [[tool {name} {json.dumps(args)}]]"


async def prompt(host: RawHost, message: str, request_id: str = "p") -> list[Frame]:
    await host.send({"id": request_id, "type": "prompt", "message": message})
    return await host.until_type("prompt_result", id=request_id)


def ts_args(*paths: Path, base: tuple[str, ...] = OFFLINE_ARGS) -> list[str]:
    args = list(base)
    for path in paths:
        args += ["-e", str(path)]
    return args


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


async def run_omp(*args: str, cwd: Path, env: dict[str, str] | None = None
                  ) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(LIMIT):
        return await trio.run_process([*OMP, *args], capture_stdout=True, capture_stderr=True,
                                      check=False, cwd=cwd,
                                      env={**os.environ, **(env or {})})


# --- the task runner's tool ban ------------------------------------------------------------------


@needs_typescript
async def test_deny_blocks_touch_with_its_own_reason_and_lets_echo_through(cwd: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(DATA / "deny.ts"),
                                     env={"DENY_RULES": json.dumps(TOUCH_RULES)}) as host:
            blocked = await prompt(host, bash_prompt("touch made.txt"), "p1")
            allowed = await prompt(host, bash_prompt("echo let through"), "p2")
    (end,) = of_type(blocked, "tool_execution_end")
    assert end["isError"] is True
    assert result_text(end) == "Creating files with touch is not allowed in this task"
    assert not (cwd / "made.txt").exists()
    (end,) = of_type(allowed, "tool_execution_end")
    assert end["isError"] is False
    assert "let through" in result_text(end)
    assert not of_type([*host.startup, *blocked, *allowed], "extension_error")


@needs_typescript
async def test_the_runner_s_one_shot_launch_keeps_the_ban(cwd: Path) -> None:
    """As the task runner runs it: ``omp --mode json -e deny.ts -p ...``."""
    done = await run_omp("--model", "offline/echo", "--no-session", "--mode", "json", "-e",
                         str(DATA / "deny.ts"), "-p", bash_prompt("touch made.txt"), cwd=cwd,
                         env={"DENY_RULES": json.dumps(TOUCH_RULES)})
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    (end,) = of_type(events, "tool_execution_end")
    assert (end["isError"], result_text(end)) == (
        True, "Creating files with touch is not allowed in this task")
    assert not (cwd / "made.txt").exists()


@needs_typescript
async def test_a_whole_tool_rule_takes_bash_out_of_the_offered_tools(
        cwd: Path, isolated_agent_dir: Path) -> None:
    script = [tools_reply(tool_call("c1", "bash", {"command": "touch made.txt"})),
              text_reply("done")]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir) as fake:
            async with open_process_host(
                    cwd, args=ts_args(DATA / "deny.ts", base=FAKE_ARGS),
                    env={"DENY_RULES": json.dumps([{"tool": "Bash"}])}) as host:
                frames = await prompt(host, "make a file")
            offered = [t["function"]["name"] for t in fake.requests[0].json()["tools"]]
    assert "bash" not in offered
    assert "read" in offered  # only the banned tool went
    # A model that calls it anyway finds no such tool.
    (end,) = of_type(frames, "tool_execution_end")
    assert (end["isError"], result_text(end)) == (True, "Tool bash not found")
    assert not (cwd / "made.txt").exists()


# --- the same extension UI frames as a Python extension ------------------------------------------

UI_TS = '''\
import type { ExtensionAPI } from "@oh-my-pi/pi-coding-agent";

export default function (pi: ExtensionAPI) {
    pi.registerTool({
        name: "pick",
        label: "Pick",
        description: "Asks the user to pick a colour",
        parameters: { type: "object", properties: {} },
        async execute(_id, _params, _signal, _onUpdate, ctx) {
            const options = ["red", { label: "blue", description: "the sky" }];
            const choice = await ctx.ui.select("Pick one", options);
            ctx.ui.setStatus("pick", `picked ${choice}`);
            return { content: [{ type: "text", text: `picked ${choice}` }], details: { choice } };
        },
    });
    pi.registerCommand("ui", {
        description: "Shows every kind of extension UI",
        handler: async (_args, ctx) => {
            const sure = await ctx.ui.confirm("Sure?", "Really do it?");
            const name = await ctx.ui.input("Name?", "a name");
            const text = await ctx.ui.editor("Edit", "prefilled");
            ctx.ui.notify(`sure=${sure} name=${name} text=${text}`, "info");
            ctx.ui.setWidget("w", ["line 1", "line 2"], { placement: "belowEditor" });
            ctx.ui.setEditorText("next prompt");
            ctx.ui.setStatus("pick", undefined);
        },
    });
}
'''

UI_PY = '''\
def setup(omp):
    async def pick(call_id, params, ctx, on_update):
        choice = await ctx.ui.select("Pick one", ["red", {"label": "blue", "description": "the sky"}])
        ctx.ui.set_status("pick", f"picked {choice}")
        return {"content": [{"type": "text", "text": f"picked {choice}"}], "details": {"choice": choice}}

    omp.register_tool("pick", "Pick", "Asks the user to pick a colour",
                      {"type": "object", "properties": {}}, pick)

    async def ui(args, ctx):
        sure = await ctx.ui.confirm("Sure?", "Really do it?")
        name = await ctx.ui.input("Name?", "a name")
        text = await ctx.ui.editor("Edit", "prefilled")
        ctx.ui.notify(f"sure={str(sure).lower()} name={name} text={text}", "info")
        ctx.ui.set_widget("w", ["line 1", "line 2"], placement="belowEditor")
        ctx.ui.set_editor_text("next prompt")
        ctx.ui.set_status("pick", None)

    omp.register_command("ui", "Shows every kind of extension UI", ui)
'''  # noqa: E501 (the same lines as the TypeScript one)


async def ui_session(cwd: Path) -> list[Frame]:
    """``/ui`` and a ``pick`` call, every dialog answered; the frames an extension made, ids
    replaced by their order."""
    async with open_process_host(cwd) as host:
        await host.send({"id": "c", "type": "prompt", "message": "/ui"})
        await host.answer(await host.ui_request("confirm"), confirmed=True)
        await host.answer(await host.ui_request("input"), value="Ada")
        await host.answer(await host.ui_request("editor"), value="edited")
        await host.until_type("prompt_result", id="c")
        await host.send({"id": "t", "type": "prompt", "message": tool_prompt("pick", {})})
        await host.answer(await host.ui_request("select"), value="blue")
        await host.until_type("prompt_result", id="t")
    commands = [c for c in host.startup[-1]["commands"] if c["source"] == "extension"]
    made = [f for f in host.frames if f["type"] in ("extension_ui_request", "extension_error")
            or f["type"] == "tool_execution_end"]
    ids: dict[str, str] = {}
    normal = []
    for frame in made:
        frame = dict(frame)
        if frame["type"] == "extension_ui_request":
            frame["id"] = ids.setdefault(frame["id"], f"ui-{len(ids)}")
        normal.append(frame)
    return [{"type": "commands", "commands": commands}, *normal]


@needs_typescript
async def test_a_typescript_extension_makes_the_same_ui_frames_as_a_python_one(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        install(isolated_agent_dir, "ui_demo", UI_PY)
        python_cwd = tmp_path / "python"
        python_cwd.mkdir()
        from_python = await ui_session(python_cwd)
        (isolated_agent_dir / "extensions" / "ui_demo.py").unlink()
        write(isolated_agent_dir / "extensions" / "ui_demo.ts", UI_TS)
        ts_cwd = tmp_path / "ts"
        ts_cwd.mkdir()
        from_typescript = await ui_session(ts_cwd)
    assert from_typescript == from_python
    methods = [f["method"] for f in from_typescript if f["type"] == "extension_ui_request"]
    assert methods == ["confirm", "input", "editor", "notify", "setWidget", "set_editor_text",
                       "setStatus", "select", "setStatus"]
    (end,) = of_type(from_typescript, "tool_execution_end")
    assert result_text(end) == "picked blue"


# --- cancellation, crashes, the end of the session ----------------------------------------------

WAITER = '''\
import { writeFileSync } from "node:fs";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

export default function (pi: ExtensionAPI) {
    pi.registerTool({
        name: "wait_for_abort",
        label: "Wait",
        description: "Waits until the call is cancelled",
        parameters: { type: "object", properties: {} },
        execute: (_id, _params, signal: AbortSignal) => new Promise((resolve) => {
            signal.addEventListener("abort", () => {
                writeFileSync(process.env.ABORT_MARK!, `aborted: ${signal.aborted}\\n`);
                resolve({ content: [{ type: "text", text: "too late" }] });
            });
        }),
    });
}
'''


@needs_typescript
async def test_abort_cancels_a_typescript_tool(cwd: Path, tmp_path: Path) -> None:
    mark = tmp_path / "abort.mark"
    extension = write(tmp_path / "waiter.ts", WAITER)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(extension),
                                     env={"ABORT_MARK": str(mark)}) as host:
            await host.send({"id": "p1", "type": "prompt",
                             "message": tool_prompt("wait_for_abort", {})})
            await host.until_type("tool_execution_start")
            await host.send({"id": "a", "type": "abort"})
            frames = await host.until_type("prompt_result", id="p1")
            # The extension's AbortSignal fired. A poll: the host process writes the mark,
            # and nothing tells this test when.
            while not mark.exists():  # noqa: ASYNC110
                await trio.sleep(0.01)
            again = await prompt(host, bash_prompt("echo still here"), "p2")
    assert frames[-1]["status"] == "aborted"
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    assert result_text(end) != "too late"
    assert mark.read_text() == "aborted: true\n"
    assert "still here" in result_text(of_type(again, "tool_execution_end")[0])


CRASHER = '''\
import type { ExtensionAPI } from "@oh-my-pi/pi-coding-agent";

export default function (pi: ExtensionAPI) {
    pi.on("tool_call", async () => ({ block: true, reason: "blocked while the host runs" }));
    pi.registerCommand("crash", {
        description: "Ends the extension host",
        handler: async () => { process.exit(3); },
    });
}
'''


@needs_typescript
async def test_a_crash_of_the_host_is_reported_and_the_session_goes_on(
        cwd: Path, tmp_path: Path) -> None:
    extension = write(tmp_path / "crasher.ts", CRASHER)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(extension)) as host:
            before = await prompt(host, bash_prompt("echo first"), "p1")
            crash = await prompt(host, "/crash", "p2")
            after = await prompt(host, bash_prompt("echo still here"), "p3")
            commands = await prompt(host, "/crash", "p4")
    assert result_text(of_type(before, "tool_execution_end")[0]) == "blocked while the host runs"
    errors = {(e["extensionPath"], e["event"]): e["error"]
              for e in of_type(crash, "extension_error")}
    host_error = errors[(str(extension), "host")]
    assert re.fullmatch(r"the extension host \((bun|node) [\d.]+\) exited with code 3; this "
                        r"extension no longer runs", host_error), host_error
    assert "exited with code 3" in errors[("command:crash", "command")]
    (notice,) = [n for n in of_type(crash, "notice") if n.get("source") == "extensions"]
    assert notice["level"] == "error"
    assert str(extension) in notice["message"]
    assert crash[-1]["type"] == "prompt_result"
    # The session goes on without the extension: its ban is gone, so is its command.
    (end,) = of_type(after, "tool_execution_end")
    assert (end["isError"], "still here" in result_text(end)) == (False, True)
    assert not of_type(commands, "extension_error")


PIDS = '''\
import { spawn } from "node:child_process";
import { appendFileSync } from "node:fs";
import type { ExtensionAPI } from "@oh-my-pi/pi-coding-agent";

export default function (pi: ExtensionAPI) {
    const child = spawn("sleep", ["600"], { stdio: "ignore" });
    appendFileSync(process.env.PID_FILE!, `${process.pid} ${child.pid}\\n`);
    pi.registerCommand("pids", { description: "-", handler: async () => {} });
}
'''


def pids_in(path: Path) -> list[list[int]]:
    return [[int(x) for x in line.split()] for line in path.read_text().splitlines()]


@needs_typescript
async def test_no_process_of_the_host_outlives_the_session_and_reload_restarts_it(
        cwd: Path, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    extension = write(tmp_path / "pids.ts", PIDS)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(extension),
                                     env={"PID_FILE": str(pid_file)}) as host:
            ((first_host, first_child),) = pids_in(pid_file)
            assert procfs.alive(first_host)
            assert procfs.alive(first_child)
            reloaded = await prompt(host, "/reload-plugins", "r")
            (_, (second_host, second_child)) = pids_in(pid_file)
            # The old host and what it started are gone, a new one runs.
            assert not procfs.alive(first_host)
            assert not procfs.alive(first_child)
            assert procfs.alive(second_host)
            assert procfs.alive(second_child)
            await host.close_input()
            assert await host.wait() == 0
    assert not of_type(reloaded, "extension_error")
    assert not procfs.alive(second_host)
    assert not procfs.alive(second_child)


@needs_typescript
async def test_an_embedded_server_cancelled_from_outside_kills_its_host(
        cwd: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "pids"
    extension = write(tmp_path / "pids.ts", PIDS)
    monkeypatch.setenv("PID_FILE", str(pid_file))
    options = omp.ServeOptions(model="offline/echo", persist=False, cwd=cwd,
                               extensions=[extension])
    with trio.fail_after(LIMIT):
        with trio.CancelScope() as outside:
            async with open_embedded_host(options):
                ((host_pid, child_pid),) = pids_in(pid_file)
                assert procfs.alive(host_pid)
                assert procfs.alive(child_pid)
                outside.cancel()
                await trio.sleep_forever()
    assert process_gone(host_pid) or not procfs.alive(host_pid)
    assert not procfs.alive(child_pid)


FAILING_GATES = '''\
export default function (pi) {
    pi.on("tool_call", async (event) => {
        if (event.input.command.includes("boom")) throw new Error("the gate broke");
        if (event.input.command.includes("hang")) return new Promise(() => {});
        return undefined;
    });
}
'''


@needs_javascript
async def test_a_failing_or_hanging_tool_call_handler_blocks_as_a_python_one_does(
        cwd: Path, tmp_path: Path, mock_clock: trio.testing.MockClock) -> None:
    """The extension runtime's rules hold for both kinds: a ``tool_call`` handler that throws
    or times out (30 s, on trio's clock: it jumps once nothing happened for a few real
    seconds) blocks the call with the original's texts and writes ``extension_error``."""
    mock_clock.autojump_threshold = 3.0
    extension = write(tmp_path / "gates.js", FAILING_GATES)
    options = omp.ServeOptions(model="offline/echo", persist=False, cwd=cwd,
                               extensions=[extension])
    async with open_embedded_host(options, read_startup=False) as host:
        host.step = 600.0
        await host.read_startup()
        broke = await prompt(host, bash_prompt("echo boom"), "p1")
        hung = await prompt(host, bash_prompt("echo hang"), "p2")
        fine = await prompt(host, bash_prompt("echo fine"), "p3")
    assert [(e["extensionPath"], e["event"], e["error"]) for e in
            of_type([*broke, *hung], "extension_error")] == [
        (str(extension), "tool_call", "the gate broke"),
        (str(extension), "tool_call", "handler timed out after 30000ms")]
    assert result_text(of_type(broke, "tool_execution_end")[0]) == (
        f"Extension {extension} failed: the gate broke")
    assert result_text(of_type(hung, "tool_execution_end")[0]) == (
        f"Extension {extension} timed out after 30000ms")
    assert "fine" in result_text(of_type(fine, "tool_execution_end")[0])


HANGING_GATE = '''\
import { appendFileSync } from "node:fs";

export default function (pi) {
    appendFileSync(process.env.LOADS, "loaded\\n");
    pi.on("tool_call", (event) => {
        if (event.input.command.includes("hang")) {
            appendFileSync(process.env.LOADS, "waiting\\n");
            return new Promise(() => {});
        }
        return undefined;
    });
}
'''


@needs_javascript
async def test_reload_while_a_handler_waits_fails_that_call_and_starts_a_new_host(
        cwd: Path, tmp_path: Path) -> None:
    loads = tmp_path / "loads"
    extension = write(tmp_path / "gate.js", HANGING_GATE)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(extension),
                                     env={"LOADS": str(loads)}) as host:
            await host.send({"id": "p1", "type": "prompt", "message": bash_prompt("echo hang")})
            # A poll: the handler in the host process writes "waiting", and nothing tells
            # this test when.
            while "waiting" not in loads.read_text():  # noqa: ASYNC110
                await trio.sleep(0.01)
            await host.send({"id": "r", "type": "prompt", "message": "/reload-plugins"})
            hung = await host.until_type("prompt_result", id="p1")
            after = await prompt(host, bash_prompt("echo fine"), "p2")
    (end,) = of_type(hung, "tool_execution_end")
    assert end["isError"] is True
    assert re.fullmatch(rf"Extension {re.escape(str(extension))} failed: the extension host "
                        r"\((bun|node) [\d.]+\) was closed", result_text(end)), result_text(end)
    assert loads.read_text() == "loaded\nwaiting\nloaded\n"
    assert "fine" in result_text(of_type(after, "tool_execution_end")[0])


# --- an extension that cannot load is never silent -----------------------------------------------


@needs_typescript
@pytest.mark.parametrize("mode", ["text", "json"])
async def test_a_one_shot_launch_with_a_broken_extension_exits_non_zero(
        cwd: Path, mode: str) -> None:
    broken = DATA / "broken.ts"
    done = await run_omp("--model", "offline/echo", "--no-session", "--mode", mode, "-e",
                         str(broken), "-p", "hello", cwd=cwd)
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"Failed to load extension {broken}: deny rules could not be read\n")
    if mode == "json":
        events = [json.loads(line) for line in done.stdout.splitlines()]
        assert of_type(events, "extension_error") == [{
            "type": "extension_error", "extensionPath": str(broken), "event": "load",
            "error": "deny rules could not be read"}]
        assert not of_type(events, "agent_start")  # nothing was sent
    else:
        assert done.stdout == b""


@needs_javascript
async def test_a_plugin_dir_s_extension_that_fails_ends_a_one_shot_launch(
        cwd: Path, tmp_path: Path) -> None:
    plugin = tmp_path / "plug"
    bad = write(plugin / "extensions" / "bad.js",
                "export default function () { throw new Error('no config'); }\n")
    write(plugin / "extensions" / "good.js", "export default function () {}\n")
    done = await run_omp("--model", "offline/echo", "--no-session", "--plugin-dir", str(plugin),
                         "-p", "hello", cwd=cwd)
    assert done.returncode == 1
    assert done.stderr.decode() == f"Failed to load extension {bad}: no config\n"
    assert done.stdout == b""


def without_runtimes(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has neither bun nor node."""
    empty = tmp_path / "no-runtimes"
    empty.mkdir(exist_ok=True)
    return {"PATH": str(empty), "OMP_JS_RUNTIME": ""}


async def test_without_bun_or_node_a_one_shot_launch_names_the_file(
        cwd: Path, tmp_path: Path) -> None:
    deny = DATA / "deny.ts"
    done = await run_omp("--model", "offline/echo", "--no-session", "-e", str(deny), "-p",
                         "hello", cwd=cwd, env=without_runtimes(tmp_path))
    assert done.returncode == 1
    assert done.stderr.decode() == (
        f"Failed to load extension {deny}: it needs bun or node to run, and neither is on "
        "PATH (install bun, or node >= 22.6 for TypeScript)\n")


async def test_without_bun_or_node_rpc_says_so_before_the_first_prompt(
        cwd: Path, tmp_path: Path) -> None:
    deny = DATA / "deny.ts"
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(deny),
                                     env=without_runtimes(tmp_path)) as host:
            startup = host.startup
            frames = await prompt(host, "hello")
    (error,) = of_type(startup, "extension_error")
    assert error == {"type": "extension_error", "extensionPath": str(deny), "event": "load",
                     "error": "it needs bun or node to run, and neither is on PATH (install "
                              "bun, or node >= 22.6 for TypeScript)"}
    (notice,) = [n for n in of_type(startup, "notice") if n.get("source") == "extensions"]
    assert notice["level"] == "error"
    assert notice["message"] == f"Extension {deny} did not load: {error['error']}"
    assert startup[-1]["type"] == "available_commands_update"  # all before the first prompt
    assert frames[-1]["status"] == "completed"


async def test_a_runtime_that_cannot_start_the_host_is_a_load_error(
        cwd: Path, tmp_path: Path) -> None:
    fake = write(tmp_path / "bin" / "bun", "#!/bin/sh\necho 'bun: broken install' >&2\nexit 7\n")
    fake.chmod(0o755)
    deny = DATA / "deny.ts"
    done = await run_omp("--model", "offline/echo", "--no-session", "-e", str(deny), "-p",
                         "hello", cwd=cwd, env={"OMP_JS_RUNTIME": str(fake)})
    assert done.returncode == 1
    assert done.stderr.decode().splitlines() == [
        "bun: broken install",  # the host's own stderr is ours
        f"Failed to load extension {deny}: the extension host could not run it: the extension "
        "host (bun) exited with code 7 before it started (its stderr says why)"]


@needs_node
async def test_node_without_type_stripping_runs_javascript_and_names_typescript(
        cwd: Path, tmp_path: Path) -> None:
    """With node alone (and whatever its version), ``.js`` extensions run; ``.ts`` ones run
    when it strips types, and otherwise fail naming the version."""
    assert NODE is not None
    node, version = NODE
    env = {"OMP_JS_RUNTIME": node, "DENY_RULES": json.dumps(TOUCH_RULES)}
    with trio.fail_after(LIMIT):
        async with open_process_host(
                cwd, args=ts_args(DATA / "word_count.js", DATA / "deny.ts"), env=env) as host:
            frames = await prompt(host, tool_prompt("word_count", {"text": "one two three"}))
    (end,) = of_type(frames, "tool_execution_end")
    assert result_text(end) == "3 words (counted by JS)"
    assert end["result"]["details"] == {"words": 3, "size": "13B"}
    errors = of_type(host.startup, "extension_error")
    if version >= (22, 6):
        assert errors == []
    else:
        assert errors == [{
            "type": "extension_error", "extensionPath": str(DATA / "deny.ts"), "event": "load",
            "error": f"TypeScript needs bun or node >= 22.6 to run; bun is not on PATH and "
                     f"node {'.'.join(map(str, version))} cannot strip types"}]


# --- the ecosystem's styles, ordering across kinds, trust, secrets -------------------------------


@needs_typescript
async def test_tools_from_typebox_zod_and_json_schema_packages(
        cwd: Path, isolated_agent_dir: Path) -> None:
    script = [tools_reply(tool_call("c1", "greet", {"name": "Ada", "times": 2}),
                          tool_call("c2", "shout", {"text": "hi", "marks": 3}),
                          tool_call("c3", "word_count", {"text": "a b"}),
                          tool_call("c4", "failing", {}),
                          tool_call("c5", "greet", {})),
              text_reply("done")]
    paths = (DATA / "greet_typebox.ts", DATA / "zod_pkg", DATA / "word_count.js")
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir) as fake:
            async with open_process_host(cwd, args=ts_args(*paths, base=FAKE_ARGS)) as host:
                frames = await prompt(host, "use the tools", "p1")
                where = await prompt(host, "/where", "p2")
            tools = {t["function"]["name"]: t["function"]
                     for t in fake.requests[0].json()["tools"]}
    assert not of_type(host.startup, "extension_error")
    assert tools["greet"]["parameters"] == {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string", "description": "Who to greet"},
                       "times": {"type": "integer", "minimum": 1}}}
    assert tools["shout"]["parameters"] == {
        "type": "object", "required": ["text"],
        "properties": {"text": {"type": "string", "description": "What to say"},
                       "marks": {"type": "integer"}}}
    assert tools["word_count"]["description"] == "Counts the words of a text."
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    assert result_text(ends["c1"]) == "Hello, Ada! Hello, Ada!"
    assert ends["c1"]["result"]["details"] == {"cwd": str(cwd), "toolCallId": "c1",
                                               "aborted": False}
    assert result_text(ends["c2"]) == "HI!!!"
    assert result_text(ends["c3"]) == "2 words (counted by JS)"
    assert (ends["c4"]["isError"], result_text(ends["c4"])) == (True, "the tool broke")
    assert ends["c5"]["isError"] is True  # validated against its schema, as a built-in's
    assert [u["partialResult"]["content"][0]["text"]
            for u in of_type(frames, "tool_execution_update")] == ["greeting..."]
    assert [r["message"] for r in ui_requests(where, "notify")] == [f"cwd: {cwd}"]


ORDER_PY = '''\
def setup(omp):
    async def mark(event, ctx):
        return {"content": [{"type": "text", "text": event.content[0]["text"].strip() + " +NAME"}]}
    omp.on("tool_result", mark)
'''
ORDER_TS = '''\
export default function (pi) {
    pi.on("tool_result", async (event) => ({
        content: [{ type: "text", text: `${event.content[0].text.trim()} +NAME` }],
    }));
}
'''


@needs_typescript
async def test_handlers_of_both_kinds_run_in_one_load_order(
        cwd: Path, isolated_agent_dir: Path) -> None:
    folder = isolated_agent_dir / "extensions"
    write(folder / "a_first.py", ORDER_PY.replace("NAME", "a"))
    write(folder / "b_second.ts", ORDER_TS.replace("NAME", "b"))
    write(folder / "c_third.py", ORDER_PY.replace("NAME", "c"))
    write(folder / "d_fourth" / "index.ts", ORDER_TS.replace("NAME", "d"))
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            frames = await prompt(host, bash_prompt("echo x"))
    assert result_text(of_type(frames, "tool_execution_end")[0]) == "x +a +b +c +d"


GUARD = '''\
export default function (pi) {
    pi.registerCommand("guarded", { description: "from the repository", handler: async () => {} });
}
'''


@needs_javascript
async def test_project_javascript_extensions_need_a_trusted_project(
        cwd: Path, isolated_agent_dir: Path) -> None:
    write(cwd / ".omp" / "extensions" / "guard.js", GUARD)
    # The project's bun configuration is not the host's: its preload would run project code.
    write(cwd / "bunfig.toml", 'preload = ["./preload.ts"]\n')
    write(cwd / "preload.ts", 'require("node:fs").writeFileSync("PRELOADED", "");\n')
    write(isolated_agent_dir / "extensions" / "mine.js", "export default function () {}\n")
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as untrusted:
            pass
    assert not (cwd / "PRELOADED").exists()
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=[*OFFLINE_ARGS, "--trust-project"]) as trusted:
            pass
    names = [c["name"] for c in untrusted.startup[-1]["commands"]]
    assert "guarded" not in names
    assert any("not loaded: the project is not trusted" in n["message"]
               for n in of_type(untrusted.startup, "notice"))
    assert "guarded" in [c["name"] for c in trusted.startup[-1]["commands"]]


SNOOP = '''\
export default function (pi) {
    pi.registerCommand("env", { description: "-", handler: async (_args, ctx) => {
        ctx.ui.notify(["MY_API_KEY", "OPENAI_API_KEY", "PLAIN_SETTING", "FROM_DOTENV"]
            .map((name) => `${name}=${process.env[name] ?? "-"}`).join(" "));
    } });
}
'''


@needs_javascript
async def test_the_host_gets_the_environment_policy_of_bash(cwd: Path, tmp_path: Path) -> None:
    extension = write(tmp_path / "snoop.js", SNOOP)
    write(cwd / ".env", "FROM_DOTENV=project\n")  # bun would read it: not into the policy's env
    env = {"MY_API_KEY": "secret-1", "OPENAI_API_KEY": "secret-2", "PLAIN_SETTING": "plain"}
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(extension), env=env) as host:
            frames = await prompt(host, "/env")
    assert [r["message"] for r in ui_requests(frames, "notify")] == [
        "MY_API_KEY=- OPENAI_API_KEY=- PLAIN_SETTING=plain FROM_DOTENV=-"]


IN_VAIN = '''\
export default function (pi) {
    pi.on("message_update", () => {});
    pi.on("session_stop", () => {});
    pi.on("input", () => {});  // the original never fires it in RPC either: nothing to say
    pi.on("tool_call", () => undefined);
    pi.registerProvider("mine", { baseUrl: "http://localhost:1" });
}
'''


@needs_javascript
async def test_what_an_extension_waits_for_in_vain_is_said(cwd: Path, tmp_path: Path) -> None:
    extension = write(tmp_path / "in_vain.js", IN_VAIN)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(extension)) as host:
            pass
    said = [n["message"] for n in of_type(host.startup, "notice")
            if n.get("source") == "extensions"]
    assert said == [
        f'Extension {extension}: registerProvider("mine") is not supported; ignored',
        f"Extension {extension} listens to message_update, session_stop, which this runtime "
        "does not fire to extensions: those handlers never run"]
    assert not of_type(host.startup, "extension_error")


NOTE_JS = '''\
export default function (pi) {
    pi.registerCommand("note", { description: "-", handler: async () => {
        pi.appendEntry("js-note", { n: 1 });
        await pi.setSessionName("noted");
    } });
}
'''
NOTE_PY = '''\
def setup(omp):
    async def note(args, ctx):
        omp.append_entry("py-note", {"n": 2})
    omp.register_command("pynote", "-", note)
'''


@needs_javascript
async def test_append_entry_keeps_extension_state_in_the_session_file(
        cwd: Path, tmp_path: Path, isolated_agent_dir: Path) -> None:
    install(isolated_agent_dir, "note", NOTE_PY)
    extension = write(tmp_path / "note.js", NOTE_JS)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=["--mode", "rpc", "--model", "offline/echo",
                                                "-e", str(extension)]) as host:
            await prompt(host, "/note", "p1")
            await prompt(host, "/pynote", "p2")
            await host.send({"id": "s", "type": "get_state"})
            (state,) = of_type(await host.until_type("response", id="s"), "response")
    text = await trio.Path(state["data"]["sessionFile"]).read_text()
    entries = [json.loads(line) for line in text.splitlines()]
    assert [(e["customType"], e["data"]) for e in entries if e["type"] == "custom"] == [
        ("js-note", {"n": 1}), ("py-note", {"n": 2})]
    assert state["data"]["sessionName"] == "noted"


GO_JS = '''\
export default function (pi) {
    pi.registerCommand("go", { description: "Prompts the model", handler: async (args, ctx) => {
        const done = await pi.exec("echo", ["from", "exec"]);
        ctx.ui.notify(`${done.code}: ${done.stdout.trim()}`, "info");
        pi.sendUserMessage(`from the extension: ${args}`);
    } });
    pi.registerCommand("aside", { description: "Adds to the context", handler: async () => {
        pi.sendMessage({ customType: "note", content: "a note", display: true });
    } });
}
'''


@needs_javascript
async def test_a_command_s_send_user_message_runs_for_its_prompt(cwd: Path,
                                                                 tmp_path: Path) -> None:
    """The call is made in the command's request, so the run it starts is the command's
    (``prompt_result {agentInvoked: true}`` once it settled), as a Python command's is."""
    extension = write(tmp_path / "go.js", GO_JS)
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd, args=ts_args(extension)) as host:
            frames = await prompt(host, "/go now", "g")
            aside = await prompt(host, "/aside", "a")
            await host.send({"id": "m", "type": "get_messages"})
            (messages,) = of_type(await host.until_type("response", id="m"), "response")
    assert [r["message"] for r in ui_requests(frames, "notify")] == ["0: from exec"]
    answer = of_type(frames, "message_end")[-1]["message"]
    assert answer["content"][0]["text"] == "Echo: from the extension: now"
    assert frames[-1] == {"type": "prompt_result", "id": "g", "agentInvoked": True,
                          "status": "completed", "sessionSettled": True}
    note = messages["data"]["messages"][-1]  # idle, no triggerTurn: into the context only
    assert (note["role"], note["customType"], note["content"]) == ("custom", "note", "a note")
    assert aside[-1]["agentInvoked"] is False


# --- discovery (no runtime needed) ---------------------------------------------------------------


def test_discovery_finds_typescript_modules_folders_and_manifests(tmp_path: Path) -> None:
    folder = tmp_path / "agent" / "extensions"
    write(folder / "plain.ts", "")
    write(folder / "types.d.ts", "")
    write(folder / "module.mjs", "")
    write(folder / "py_one.py", "")
    write(folder / "with_index" / "index.ts", "")
    write(folder / "with_index" / "other.ts", "")
    write(folder / "pkg" / "package.json", json.dumps(
        {"pi": {"extensions": ["./src/a.ts", "./lib", "./missing.ts"]}}))
    write(folder / "pkg" / "src" / "a.ts", "")
    write(folder / "pkg" / "lib" / "index.js", "")
    write(folder / "pkg" / "index.ts", "")  # the manifest is authoritative
    write(folder / "node_modules" / "dep" / "index.js", "")
    write(folder / "bad_manifest" / "package.json", "{not json")
    sources, _ = discover(cwd=tmp_path, agent_dir=tmp_path / "agent")
    found = [(s.name, s.kind, Path(s.path).relative_to(folder).as_posix(), s.problem is None)
             for s in sources]
    assert found == [
        ("bad_manifest", "js", "bad_manifest/package.json", False),
        ("module", "js", "module.mjs", True),
        ("a", "js", "pkg/src/a.ts", True),
        ("lib", "js", "pkg/lib/index.js", True),
        ("missing", "js", "pkg/missing.ts", False),
        ("plain", "js", "plain.ts", True),
        ("py_one", "python", "py_one.py", True),
        ("with_index", "js", "with_index/index.ts", True),
    ]
    assert not any(s.named for s in sources)
    named, _ = discover(cwd=tmp_path, agent_dir=tmp_path / "none", discovery=False,
                        paths=[folder / "with_index", Path("x.ts")])
    assert [(s.path, s.kind, s.named) for s in named] == [
        (str(folder / "with_index" / "index.ts"), "js", True),
        (str(tmp_path / "x.ts"), "js", True)]


async def test_a_missing_manifest_entry_is_a_load_error_naming_it(cwd: Path,
                                                                  tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    write(package / "package.json", json.dumps({"omp": {"extensions": ["./gone.ts"]}}))
    done = await run_omp("--model", "offline/echo", "--no-session", "-e", str(package), "-p",
                         "hello", cwd=cwd)
    assert done.returncode == 1
    assert done.stderr.decode() == (f"Failed to load extension {package / 'gone.ts'}: "
                                    f"Extension path not found: {package / 'gone.ts'}\n")


def test_the_host_program_ships_in_the_package() -> None:
    folder = Path(omp.__file__).parent / "extensions" / "js"
    assert {p.name for p in folder.glob("*.mjs")} >= {
        "host.mjs", "node-hooks.mjs", "schema.mjs", "pi.mjs", "pi-ai.mjs", "pi-tui.mjs",
        "typebox.mjs", "zod.mjs"}


# --- omp acp -------------------------------------------------------------------------------------


@needs_typescript
async def test_acp_sessions_run_typescript_extensions_and_name_one_that_failed(
        tmp_path: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_acp import Recorder, acp, run_client

    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("DENY_RULES", json.dumps(TOUCH_RULES))
    script = [tools_reply(tool_call("c1", "bash", {"command": "touch made.txt"})),
              text_reply("done")]
    broken, deny = DATA / "broken.ts", DATA / "deny.ts"
    seen: dict[str, Any] = {}

    async def body(conn: Any, rec: Recorder) -> None:
        sid = (await conn.new_session(cwd=str(project))).session_id
        await rec.wait_for(lambda _: bool(rec.of(sid, "agent_message_chunk")))
        seen["warning"] = [c.content.text for c in rec.of(sid, "agent_message_chunk")]
        await conn.prompt(session_id=sid, prompt=[acp.text_block("make a file")])
        seen["tool"] = [u for u in rec.of(sid, "tool_call_update") if u.status == "failed"]

    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir):
            await trio.to_thread.run_sync(
                lambda: run_client(project, body, "-e", str(broken), "-e", str(deny)))
    assert seen["warning"] == [
        f"Warning: Extension {broken} did not load: deny rules could not be read"]
    assert len(seen["tool"]) == 1
    assert not (project / "made.txt").exists()
