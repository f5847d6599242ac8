"""``bash`` through the editor's terminals (ACP ``terminal/*``,
docs/guides/acp.md#the-editors-terminals), driven by the ``agent-client-protocol`` package's client
spawning the real ``omp acp``. The editor's side runs each terminal as a real subprocess (its own
process group), as an editor does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
from agent_helpers import fake_provider, text_reply, tool_call
from test_acp import Recorder, acp, run_client, schema

from omp.tools.base import TerminalExit, ToolError
from omp.tools.bash_terminal import exit_status


class Terminal:
    """One editor terminal: a subprocess and the output it printed."""

    def __init__(self, process: asyncio.subprocess.Process, limit: int | None) -> None:
        self.process = process
        self.limit = limit
        self.output = bytearray()
        self.truncated = False
        self.pump = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        assert self.process.stdout is not None
        while chunk := await self.process.stdout.read(65536):
            self.output += chunk
            if self.limit is not None and len(self.output) > self.limit:
                del self.output[:len(self.output) - self.limit]
                self.truncated = True

    def status(self) -> Any:
        code = self.process.returncode
        if code is None:
            return None
        if code < 0:
            return schema.TerminalExitStatus(signal=signal.Signals(-code).name)
        return schema.TerminalExitStatus(exit_code=code)


class TerminalEditor(Recorder):
    """An editor that offers terminals and records what was asked of them."""

    def __init__(self, answers: list[str] | None = None) -> None:
        super().__init__(answers)
        self.terminal = True
        self.terminals: dict[str, Terminal] = {}
        self.calls: list[tuple[str, str]] = []
        self.created: list[dict[str, Any]] = []
        self.released = asyncio.Event()
        self.refuse_wait = False
        """``terminal/wait_for_exit`` answers with an error."""
        self.create_asked = asyncio.Event()
        self.hold_create: asyncio.Event | None = None
        """When set to an event: ``terminal/create`` is answered only once it is set."""

    async def create_terminal(self, session_id: str, command: str,
                              args: list[str] | None = None, env: Any = None,
                              cwd: str | None = None, output_byte_limit: int | None = None,
                              **kwargs: Any) -> Any:
        self.create_asked.set()
        if self.hold_create is not None:
            await self.hold_create.wait()
        self.created.append({"command": command, "args": args, "cwd": cwd,
                             "limit": output_byte_limit})
        process = await asyncio.create_subprocess_exec(
            command, *(args or []), cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True)
        terminal_id = f"term-{len(self.terminals) + 1}"
        self.terminals[terminal_id] = Terminal(process, output_byte_limit)
        self.calls.append(("create", terminal_id))
        return schema.CreateTerminalResponse(terminal_id=terminal_id)

    async def terminal_output(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        terminal = self.terminals[terminal_id]
        return schema.TerminalOutputResponse(output=terminal.output.decode(errors="replace"),
                                             truncated=terminal.truncated,
                                             exit_status=terminal.status())

    async def wait_for_terminal_exit(self, session_id: str, terminal_id: str,
                                     **kwargs: Any) -> Any:
        if self.refuse_wait:
            raise acp.RequestError(-32603, "Internal error", {"details": "no waiting here"})
        terminal = self.terminals[terminal_id]
        await terminal.process.wait()
        await terminal.pump
        status = terminal.status()
        return schema.WaitForTerminalExitResponse(exit_code=status.exit_code,
                                                  signal=status.signal)

    async def kill_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.calls.append(("kill", terminal_id))
        self._kill(self.terminals[terminal_id])
        return schema.KillTerminalResponse()

    async def release_terminal(self, session_id: str, terminal_id: str, **kwargs: Any) -> Any:
        self.calls.append(("release", terminal_id))
        terminal = self.terminals[terminal_id]
        self._kill(terminal)
        await terminal.process.wait()
        self.released.set()
        return schema.ReleaseTerminalResponse()

    @staticmethod
    def _kill(terminal: Terminal) -> None:
        if terminal.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(terminal.process.pid, signal.SIGKILL)


def contents(update: Any) -> list[Any]:
    return [c for c in (update.content or [])]


async def test_bash_runs_in_the_editors_terminal(tmp_path: Path,
                                                 isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    script = [
        {"chunks": [tool_call("call_ok", "bash", {"command": "echo hi; echo there"})],
         "stop": "toolUse"},
        {"chunks": [tool_call("call_bad", "bash", {"command": "echo oops; exit 3"})],
         "stop": "toolUse"},
        {"chunks": [tool_call("call_slow", "bash", {"command": "echo waiting; sleep 30",
                                                    "timeout": 1})],
         "stop": "toolUse"},
        text_reply("done"),
    ]
    async with fake_provider(script, isolated_agent_dir) as fake:
        editor = TerminalEditor()
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            result = await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
            seen["stop"] = result.stop_reason
            seen["updates"] = rec.of(sid, "tool_call_update")
            seen["alive"] = [t.process.returncode is None for t in editor.terminals.values()]

        await trio.to_thread.run_sync(lambda: run_client(project, body, recorder=editor))
        # The last model call has every tool result in its context.
        tool_results = [m for m in fake.requests[-1].json()["messages"] if m["role"] == "tool"]
    assert seen["stop"] == "end_turn"
    # Each command ran in a terminal of its own: <shell> -c <command> in the session cwd,
    # at most 50 KB of output kept by the editor; each terminal released at the end, the
    # one that timed out killed first.
    assert [(c["args"], c["cwd"], c["limit"]) for c in editor.created] == [
        (["-c", "echo hi; echo there"], str(project), 50 * 1024),
        (["-c", "echo oops; exit 3"], str(project), 50 * 1024),
        (["-c", "echo waiting; sleep 30"], str(project), 50 * 1024)]
    assert os.path.basename(editor.created[0]["command"]) in ("bash", "sh")
    assert editor.calls == [("create", "term-1"), ("release", "term-1"),
                            ("create", "term-2"), ("release", "term-2"),
                            ("create", "term-3"), ("kill", "term-3"), ("release", "term-3")]
    assert seen["alive"] == [False, False, False]
    # The model read the outputs as from a local bash.
    texts = [r["content"] if isinstance(r["content"], str)
             else "".join(c["text"] for c in r["content"]) for r in tool_results]
    assert texts[0] == "hi\nthere\n"
    assert texts[1] == "oops\n\n\nCommand exited with code 3"
    assert texts[2] == "waiting\n\n\nCommand timed out after 1 seconds"
    # The editor was shown its terminal in the tool call's content, from the first update on.
    by_call: dict[str, list[Any]] = {}
    for update in seen["updates"]:
        by_call.setdefault(update.tool_call_id, []).append(update)
    for call_id, terminal_id, status in [("call_ok", "term-1", "completed"),
                                         ("call_bad", "term-2", "failed"),
                                         ("call_slow", "term-3", "failed")]:
        updates = by_call[call_id]
        assert updates[0].status == "in_progress"
        assert updates[-1].status == status
        for update in updates:
            terminals = [c.terminal_id for c in contents(update) if c.type == "terminal"]
            assert terminals == [terminal_id], update
    final = by_call["call_ok"][-1]
    assert [c.content.text for c in contents(final) if c.type == "content"] == [
        "$ echo hi; echo there", "hi\nthere\n"]


async def test_cancel_kills_and_releases_the_terminal_at_once(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    script = [{"chunks": [tool_call("call_s", "bash", {"command": "echo started; sleep 60"})],
               "stop": "toolUse"},
              text_reply("next answer")]
    async with fake_provider(script, isolated_agent_dir):
        editor = TerminalEditor()
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid,
                                                       prompt=[acp.text_block("go")]))
            # The command printed (the agent read it from the terminal): it runs now.
            await rec.wait_for(lambda _: any(
                c.type == "content" and c.content.text == "started\n"
                for u in rec.of(sid, "tool_call_update") for c in contents(u)))
            terminal = editor.terminals["term-1"]
            seen["before"] = procfs.alive(terminal.process.pid)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await conn.cancel(session_id=sid)
            seen["stop"] = (await prompt).stop_reason
            await editor.released.wait()
            seen["elapsed"] = loop.time() - started
            seen["after"] = procfs.alive(terminal.process.pid)
            # The session goes on after the cancelled turn.
            seen["next"] = (await conn.prompt(session_id=sid,
                                              prompt=[acp.text_block("again")])).stop_reason

        await trio.to_thread.run_sync(lambda: run_client(project, body, recorder=editor))
    assert seen["before"] is True
    assert seen["stop"] == "cancelled"
    assert editor.calls == [("create", "term-1"), ("kill", "term-1"), ("release", "term-1")]
    assert seen["elapsed"] < 5.0
    assert seen["after"] is False
    assert seen["next"] == "end_turn"


async def test_a_terminal_created_after_the_cancel_is_released(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """The turn is cancelled while the editor is still creating the terminal: the terminal
    it creates afterwards has no ``bash`` call left to run or release it, so omp releases it
    (killing its command) when its id arrives."""
    project = tmp_path / "project"
    project.mkdir()
    script = [{"chunks": [tool_call("call_l", "bash", {"command": "echo late; sleep 60"})],
               "stop": "toolUse"},
              text_reply("next answer")]
    async with fake_provider(script, isolated_agent_dir):
        editor = TerminalEditor()
        editor.hold_create = asyncio.Event()
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid,
                                                       prompt=[acp.text_block("go")]))
            await editor.create_asked.wait()
            await conn.cancel(session_id=sid)
            seen["stop"] = (await prompt).stop_reason
            assert editor.hold_create is not None
            editor.hold_create.set()  # the editor creates the terminal only now
            await editor.released.wait()
            seen["after"] = procfs.alive(editor.terminals["term-1"].process.pid)
            seen["next"] = (await conn.prompt(session_id=sid,
                                              prompt=[acp.text_block("again")])).stop_reason

        await trio.to_thread.run_sync(lambda: run_client(project, body, recorder=editor))
    assert seen["stop"] == "cancelled"
    assert editor.calls == [("create", "term-1"), ("release", "term-1")]
    assert seen["after"] is False
    assert seen["next"] == "end_turn"


async def test_an_editor_refusal_is_the_tools_error_and_the_terminal_is_released(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    script = [{"chunks": [tool_call("call_r", "bash", {"command": "sleep 60"})],
               "stop": "toolUse"},
              text_reply("understood")]
    async with fake_provider(script, isolated_agent_dir) as fake:
        editor = TerminalEditor()
        editor.refuse_wait = True
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            seen["stop"] = (await conn.prompt(session_id=sid,
                                              prompt=[acp.text_block("go")])).stop_reason
            seen["alive"] = editor.terminals["term-1"].process.returncode is None

        await trio.to_thread.run_sync(lambda: run_client(project, body, recorder=editor))
        result = next(m for m in fake.requests[-1].json()["messages"] if m["role"] == "tool")
    assert seen["stop"] == "end_turn"
    text = result["content"] if isinstance(result["content"], str) \
        else "".join(c["text"] for c in result["content"])
    assert text == "terminal/wait_for_exit failed: Internal error"
    # The command may still run: killed, then released.
    assert editor.calls == [("create", "term-1"), ("kill", "term-1"), ("release", "term-1")]
    assert seen["alive"] is False


def test_a_signal_is_an_exit_status_of_128_plus_its_number() -> None:
    assert exit_status(TerminalExit(exit_code=0, signal=None)) == 0
    assert exit_status(TerminalExit(exit_code=None, signal="SIGKILL")) == 128 + 9
    assert exit_status(TerminalExit(exit_code=None, signal=None)) is None
    with pytest.raises(ToolError, match='signal "SIGNOPE", which is not a signal'):
        exit_status(TerminalExit(exit_code=None, signal="SIGNOPE"))
