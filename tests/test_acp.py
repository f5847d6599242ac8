"""ACP mode (``omp acp``) driven as an editor drives it, through the real process.

The client is someone else's implementation: the ``agent-client-protocol`` package's
``ClientSideConnection`` (asyncio, so it runs in a worker thread with its own event loop while
the fake LLM serves from the test's trio loop). It parses every message we send with its
pydantic models generated from the protocol's JSON Schema, so a field of ours that does not
fit the schema fails the test. The malformed-input tests speak raw JSON lines.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
from agent_helpers import fake_provider, text_reply, tool_call, write_models_yml

from omp.testing.fake_llm import FakeLLM, open_fake_llm

acp = pytest.importorskip("acp")
schema = pytest.importorskip("acp.schema")

OMP = [sys.executable, "-m", "omp"]


class Recorder:
    """The editor's side: records every ``session/update``, answers permission questions."""

    def __init__(self, answers: list[str] | None = None) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.changed = asyncio.Event()
        self.answers = list(answers or [])
        """What permission questions are answered, in order (default: the first option)."""
        self.asked: list[Any] = []
        self.buffers: dict[str, str] = {}
        """The editor's unsaved buffers by absolute path (``fs/read_text_file``)."""
        self.written: list[tuple[str, str]] = []
        self.terminal = False
        """Whether the editor offers ``terminal/*`` (a subclass serves them)."""
        self.elicitation = False
        """Whether the editor shows form elicitations (a subclass answers them)."""

    async def read_text_file(self, session_id: str, path: str, line: int | None = None,
                             limit: int | None = None, **kwargs: Any) -> Any:
        return schema.ReadTextFileResponse(content=self.buffers[path])

    async def write_text_file(self, session_id: str, path: str, content: str,
                              **kwargs: Any) -> Any:
        self.written.append((path, content))
        return schema.WriteTextFileResponse()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self.changed.set()

    async def request_permission(self, session_id: str, tool_call: Any, options: Any,
                                 **kwargs: Any) -> Any:
        self.asked.append((tool_call, [o.option_id for o in options]))
        chosen = self.answers.pop(0) if self.answers else options[0].option_id
        return schema.RequestPermissionResponse(outcome=schema.AllowedOutcome(
            outcome="selected", option_id=chosen))

    async def wait_for(self, predicate: Callable[[list[tuple[str, Any]]], bool]) -> None:
        while not predicate(self.updates):
            self.changed.clear()
            await self.changed.wait()

    def of(self, session_id: str, kind: str) -> list[Any]:
        return [u for s, u in self.updates if s == session_id and u.session_update == kind]


def run_client(cwd: Path, body: Callable[[Any, Recorder], Awaitable[None]],
               *flags: str, recorder: Recorder | None = None) -> None:
    """Spawn ``omp acp`` and run ``body(connection, recorder)`` with the acp library's client;
    the process must then exit 0 once its stdin is closed."""

    async def main() -> None:
        nonlocal recorder
        recorder = recorder or Recorder()
        # The whole environment: the library passes only a few variables by default, and the
        # test's agent directory (OMP_AGENT_DIR) must reach the process.
        async with acp.spawn_agent_process(recorder, OMP[0], *OMP[1:], "acp", *flags,
                                           cwd=str(cwd), env=dict(os.environ),
                                           # elicitation/create is "unstable" in the library
                                           use_unstable_protocol=recorder.elicitation,
                                           ) as (conn, process):
            capabilities = schema.ClientCapabilities(fs=schema.FileSystemCapabilities(
                read_text_file=bool(recorder.buffers), write_text_file=bool(recorder.buffers)),
                terminal=recorder.terminal,
                elicitation=schema.ElicitationCapabilities(
                    form=schema.ElicitationFormCapabilities()) if recorder.elicitation else None)
            init = await asyncio.wait_for(conn.initialize(
                protocol_version=1, client_capabilities=capabilities), 30)
            assert init.protocol_version == 1
            assert init.agent_capabilities.load_session is True
            await asyncio.wait_for(body(conn, recorder), 60)
            assert process.stdin is not None
            process.stdin.close()
            assert await asyncio.wait_for(process.wait(), 30) == 0

    asyncio.run(main())


def user_text(fake: FakeLLM) -> Any:
    """The content of the last user message of the first model call."""
    messages = fake.requests[0].json()["messages"]
    return [x for x in messages if x["role"] == "user"][-1]["content"]


def text_of(chunks: list[Any]) -> str:
    return "".join(c.content.text for c in chunks)


async def test_prompt_streams_thinking_text_and_a_tool_call(tmp_path: Path,
                                                            isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    first = {"chunks": [{"thinking": "Let me think.", "signature": "s1"}, {"text": "Hello "},
                        {"text": "there. "}, tool_call("call_b1", "bash", {"command": "echo hi"})],
             "stop": "toolUse", "usage": {"input": 100, "output": 5}}
    script = [first, text_reply("All done.", usage={"input": 200, "output": 6})]
    async with open_fake_llm(script) as fake:
        write_models_yml(isolated_agent_dir, fake.base_url, model_fields={"reasoning": True})
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            new = await conn.new_session(cwd=str(project))
            sid = new.session_id
            assert [m.id for m in new.modes.available_modes] == ["default"]
            assert [o.id for o in new.config_options] == ["mode", "model", "thinking"]
            await rec.wait_for(lambda _: bool(rec.of(sid, "session_info_update")))
            assert rec.of(sid, "available_commands_update")[0].available_commands
            result = await conn.prompt(session_id=sid,
                                       prompt=[acp.text_block("do it")])
            seen["result"] = result
            seen["updates"] = [u for s, u in rec.updates if s == sid]
            # A built-in slash command answers with its output, without the model.
            before = len(rec.updates)
            tools = await conn.prompt(session_id=sid, prompt=[acp.text_block("/tools")])
            seen["tools"] = (tools.stop_reason, text_of(
                [u for s, u in rec.updates[before:] if u.session_update == "agent_message_chunk"]))
            options = await conn.set_config_option(config_id="thinking", session_id=sid,
                                                   value="lo")
            seen["thinking"] = next(o.current_value for o in options.config_options
                                    if o.id == "thinking")
            with pytest.raises(acp.RequestError) as bad:
                await conn.set_config_option(config_id="model", session_id=sid, value="x/y")
            seen["bad model"] = bad.value.data

        await trio.to_thread.run_sync(run_client, project, body)
    result, updates = seen["result"], seen["updates"]
    assert result.stop_reason == "end_turn"
    assert result.usage is not None
    # The delta of this prompt's two model calls (estimated: the fake sends no usage here).
    assert result.usage.total_tokens == result.usage.input_tokens + result.usage.output_tokens
    assert result.usage.input_tokens > 0
    kinds = [u.session_update for u in updates]
    thoughts = [u for u in updates if u.session_update == "agent_thought_chunk"]
    messages = [u for u in updates if u.session_update == "agent_message_chunk"]
    assert text_of(thoughts) == "Let me think.", kinds
    assert text_of(messages) == "Hello there. All done."
    # The chunks of one assistant message share an id; the next message has a new one.
    assert thoughts[0].message_id == messages[0].message_id == messages[1].message_id
    assert messages[-1].message_id != messages[0].message_id
    call = next(u for u in updates if u.session_update == "tool_call")
    assert (call.tool_call_id, call.title, call.kind, call.status) == (
        "call_b1", "$ echo hi", "execute", "pending")
    assert call.raw_input == {"command": "echo hi"}
    done = [u for u in updates if u.session_update == "tool_call_update"
            and u.status == "completed"]
    assert len(done) == 1
    assert "hi" in "".join(c.content.text for c in done[0].content)
    assert kinds.index("tool_call") < kinds.index("tool_call_update")
    assert kinds[-2:] == ["usage_update", "session_info_update"]
    usage = next(u for u in updates if u.session_update == "usage_update")
    assert usage.size == 128000
    stop, listed = seen["tools"]
    assert stop == "end_turn"
    assert "bash" in listed
    assert len(fake.requests) == 2  # /tools never reached the model
    assert seen["thinking"] == "low"
    assert seen["bad model"] == {"details": "Unknown ACP model: x/y"}


async def test_cancel_mid_stream_answers_cancelled_at_once_and_two_sessions_run(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    slow = {"match": {"bodyContains": "slow please"},
            "chunks": [{"text": "slow "}, {"delay": 60.0}, {"text": "never"}]}
    script = [slow, text_reply("quick answer")]
    async with fake_provider(script, isolated_agent_dir) as fake:
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            one = (await conn.new_session(cwd=str(project))).session_id
            two = (await conn.new_session(cwd=str(project))).session_id
            assert one != two
            slow_prompt = asyncio.ensure_future(conn.prompt(
                session_id=one, prompt=[acp.text_block("slow please")]))
            await rec.wait_for(lambda _: bool(rec.of(one, "agent_message_chunk")))
            # The other session answers while the first one streams.
            quick = await conn.prompt(session_id=two, prompt=[acp.text_block("hi")])
            seen["quick"] = (quick.stop_reason, text_of(rec.of(two, "agent_message_chunk")))
            loop = asyncio.get_running_loop()
            started = loop.time()
            await conn.cancel(session_id=one)
            result = await slow_prompt
            seen["cancel"] = (result.stop_reason, loop.time() - started)
            seen["after"] = text_of(rec.of(one, "agent_message_chunk"))

        await trio.to_thread.run_sync(run_client, project, body)
        # The model call was dropped: the fake saw its client go away.
        await fake.wait_for_disconnect()
    assert seen["quick"] == ("end_turn", "quick answer")
    reason, elapsed = seen["cancel"]
    assert reason == "cancelled"
    assert elapsed < 2.0
    assert seen["after"] == "slow "


async def test_a_prompt_during_a_turn_cancels_that_turn_first(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    slow = {"match": {"bodyContains": "slow please"},
            "chunks": [{"text": "slow "}, {"delay": 60.0}, {"text": "never"}]}
    async with fake_provider([slow, text_reply("second answer")], isolated_agent_dir):
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            first = asyncio.ensure_future(conn.prompt(
                session_id=sid, prompt=[acp.text_block("slow please")]))
            await rec.wait_for(lambda _: bool(rec.of(sid, "agent_message_chunk")))
            second = await conn.prompt(session_id=sid, prompt=[acp.text_block("next")])
            seen["results"] = ((await first).stop_reason, second.stop_reason)
            seen["said"] = text_of(rec.of(sid, "agent_message_chunk"))

        await trio.to_thread.run_sync(run_client, project, body)
    assert seen["results"] == ("cancelled", "end_turn")
    assert seen["said"] == "slow second answer"


async def test_cancel_during_a_tool_leaves_nothing_running(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    pid_file = tmp_path / "sleep.pid"
    # The sleep's pid is written before "started" is printed.
    command = f"sleep 60 & echo $! > {pid_file}; echo started; wait"
    script = [{"chunks": [tool_call("call_s", "bash", {"command": command})], "stop": "toolUse"},
              text_reply("never")]
    async with fake_provider(script, isolated_agent_dir):
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            prompt = asyncio.ensure_future(conn.prompt(session_id=sid,
                                                       prompt=[acp.text_block("go")]))
            # The command printed: it runs now.
            await rec.wait_for(lambda _: any(
                u.status == "in_progress" and "started" in json.dumps(u.raw_output)
                for u in rec.of(sid, "tool_call_update")))
            seen["before"] = procfs.alive(int(pid_file.read_text()))
            await conn.cancel(session_id=sid)
            seen["stop"] = (await prompt).stop_reason
            # The next prompt runs after the cancelled turn's cleanup: nothing of it is left.
            seen["next"] = (await conn.prompt(session_id=sid,
                                              prompt=[acp.text_block("again")])).stop_reason
            seen["after"] = procfs.alive(int(pid_file.read_text()))

        await trio.to_thread.run_sync(run_client, project, body)
    assert seen["before"] is True
    assert seen["stop"] == "cancelled"
    assert seen["next"] == "end_turn"
    assert seen["after"] is False


async def test_load_replays_a_saved_session_then_continues(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    script = [text_reply("first answer"), text_reply("second answer")]
    async with fake_provider(script, isolated_agent_dir) as fake:
        saved: dict[str, Any] = {}

        async def first(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("remember me")])
            saved["id"] = sid

        async def second(conn: Any, rec: Recorder) -> None:
            sid = saved["id"]
            listed = await conn.list_sessions(cwd=str(project))
            saved["listed"] = [(x.session_id, x.cwd) for x in listed.sessions]
            saved["everywhere"] = [x.session_id for x in (await conn.list_sessions()).sessions]
            with pytest.raises(acp.RequestError) as cursor:
                await conn.list_sessions(cursor="soon")
            saved["cursor"] = cursor.value.data
            loaded = await conn.load_session(cwd=str(project), session_id=sid)
            assert loaded.modes.current_mode_id == "default"
            saved["replay"] = [(u.session_update, u.content.text) for s, u in rec.updates
                               if s == sid and u.session_update.endswith("_chunk")]
            result = await conn.prompt(session_id=sid, prompt=[acp.text_block("and now?")])
            saved["stop"] = result.stop_reason
            with pytest.raises(acp.RequestError) as missing:
                await conn.load_session(cwd=str(project), session_id="no-such-session")
            saved["missing"] = missing.value

        await trio.to_thread.run_sync(run_client, project, first)
        await trio.to_thread.run_sync(run_client, project, second)
        # The continued session sent the saved history to the model.
        last = fake.requests[-1].json()["messages"]
    assert saved["replay"] == [("user_message_chunk", "remember me"),
                               ("agent_message_chunk", "first answer")]
    assert saved["stop"] == "end_turn"
    assert saved["listed"] == [(saved["id"], str(project))]
    assert saved["id"] in saved["everywhere"]
    assert saved["cursor"] == {"details": "Invalid ACP session cursor: soon"}
    assert [x["content"] for x in last if x["role"] == "user"][-2:] != []
    assert "remember me" in json.dumps(last)
    assert "ACP session not found: no-such-session" in str(saved["missing"].data)


async def test_tool_approval_asks_the_editor_and_remembers_always(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    script = [{"chunks": [tool_call(f"call_{n}", "bash", {"command": f"echo {n}"})],
               "stop": "toolUse"} for n in ("one", "two", "three")]
    script.append(text_reply("done"))
    recorder = Recorder(answers=["reject_once", "allow_always"])
    async with fake_provider(script, isolated_agent_dir):
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            result = await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
            seen["stop"] = result.stop_reason
            seen["ends"] = {u.tool_call_id: (u.status, "".join(
                c.content.text for c in u.content or []))
                for u in rec.of(sid, "tool_call_update") if u.status in ("completed", "failed")}

        # always-ask: bash (tier exec) needs an answer; the editor is asked, not a dialog.
        await trio.to_thread.run_sync(
            lambda: run_client(project, body, "--approval-mode", "always-ask",
                               recorder=recorder))
    assert seen["stop"] == "end_turn"
    asked = recorder.asked
    assert [(c.tool_call_id, c.title, c.kind) for c, _ in asked] == [
        ("call_one", "$ echo one", "execute"), ("call_two", "$ echo two", "execute")]
    assert asked[0][1] == ["allow_once", "allow_always", "reject_once", "reject_always"]
    ends = seen["ends"]
    assert ends["call_one"][0] == "failed"
    assert "denied" in ends["call_one"][1]
    # Allowed always: the third call ran without a question.
    assert ends["call_two"][0] == ends["call_three"][0] == "completed"
    assert "three" in ends["call_three"][1]


async def test_read_and_write_go_through_the_editor_when_it_offers_fs(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("what the disk has\n")
    script = [{"chunks": [tool_call("call_r", "read", {"path": "notes.txt"})], "stop": "toolUse"},
              {"chunks": [tool_call("call_w", "write", {"path": "out.txt", "content": "new"})],
               "stop": "toolUse"},
              text_reply("done")]
    recorder = Recorder()
    recorder.buffers[str(project / "notes.txt")] = "unsaved buffer line\n"
    async with fake_provider(script, isolated_agent_dir):
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("go")])
            seen["read"] = next(
                "".join(c.content.text for c in u.content or [])
                for u in rec.of(sid, "tool_call_update") if u.tool_call_id == "call_r")
            seen["location"] = [x.path for x in next(
                u for u in rec.of(sid, "tool_call") if u.tool_call_id == "call_r").locations]

        await trio.to_thread.run_sync(lambda: run_client(project, body, recorder=recorder))
    assert "unsaved buffer line" in seen["read"]
    assert "what the disk has" not in seen["read"]
    assert seen["location"] == [str(project / "notes.txt")]
    assert recorder.written == [(str(project / "out.txt"), "new")]
    assert not (project / "out.txt").exists()  # the editor decides; this one kept it unsaved


async def test_extensions_load_per_session_and_hear_its_end(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    marks = tmp_path / "marks.txt"
    extension = tmp_path / "ext.py"
    extension.write_text(
        "def setup(omp):\n"
        "    async def shout(args, ctx):\n"
        "        omp.send_user_message(args.upper())\n"
        "    async def started(event, ctx):\n"
        f"        open({str(marks)!r}, 'a').write('start\\n')\n"
        "    async def ended(event, ctx):\n"
        f"        open({str(marks)!r}, 'a').write('end\\n')\n"
        "    omp.register_command('shout', 'Say it loud', shout)\n"
        "    omp.on('session_start', started)\n"
        "    omp.on('session_shutdown', ended)\n")
    async with fake_provider([text_reply("heard")], isolated_agent_dir) as fake:
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            await rec.wait_for(lambda _: bool(rec.of(sid, "available_commands_update")))
            seen["commands"] = [c.name for c in rec.of(sid, "available_commands_update")[0]
                                .available_commands]
            result = await conn.prompt(session_id=sid, prompt=[acp.text_block("/shout hey")])
            seen["stop"] = result.stop_reason
            seen["said"] = text_of(rec.of(sid, "agent_message_chunk"))
            await conn.close_session(session_id=sid)
            seen["marks"] = marks.read_text()

        await trio.to_thread.run_sync(
            lambda: run_client(project, body, "-e", str(extension)))
        asked = user_text(fake)
    assert "shout" in seen["commands"]
    assert asked == "HEY"
    assert (seen["stop"], seen["said"]) == ("end_turn", "heard")
    assert seen["marks"] == "start\nend\n"


PROBE = Path(__file__).parent / "data" / "mcp_probe_server.py"


async def test_the_editors_mcp_servers_give_the_session_their_tools(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    pytest.importorskip("mcp")
    project = tmp_path / "project"
    project.mkdir()
    mark = tmp_path / "probe.pids"
    script = [{"chunks": [tool_call("c1", "mcp__probe_echo", {"text": "hi there"})],
               "stop": "toolUse"}, text_reply("done")]
    async with fake_provider(script, isolated_agent_dir) as fake:
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            server = schema.McpServerStdio(
                name="probe", command=sys.executable, args=[str(PROBE)],
                env=[schema.EnvVariable(name="MCP_PROBE_MARK", value=str(mark))])
            sid = (await conn.new_session(cwd=str(project), mcp_servers=[server])).session_id
            result = await conn.prompt(session_id=sid, prompt=[acp.text_block("echo")])
            seen["stop"] = result.stop_reason
            seen["end"] = next((u.status, "".join(c.content.text for c in u.content or []))
                               for u in rec.of(sid, "tool_call_update")
                               if u.status in ("completed", "failed"))

        await trio.to_thread.run_sync(run_client, project, body)
        offered = [t["function"]["name"] for t in fake.requests[0].json()["tools"]]
        system = fake.requests[0].json()["messages"][0]["content"]
    # Mounted as an xd:// device (tools.xdev, the default; docs/guides/mcp.md#xd-devices), called by
    # name.
    assert "mcp__probe_echo" not in offered
    assert "- xd://mcp__probe_echo — Echo the text back." in system
    assert seen["stop"] == "end_turn"
    status, text = seen["end"]
    assert status == "completed"
    assert text.startswith("hi there")
    # The process exited (run_client waited for it) and took its server with it.
    assert [procfs.alive(int(pid)) for pid in mark.read_text().split()] == [False]


async def test_a_request_that_fails_unexpectedly_is_answered_and_the_next_one_works(
        tmp_path: Path) -> None:
    """A handler's unforeseen exception is that request's -32603 naming it, and the process
    goes on answering. The cwd of the bad ``session/new`` cannot be examined: its stat fails
    with ENAMETOOLONG (a name over the file system's 255 bytes). That fails for root as well
    (these tests may run as root), where a directory under a mode-000 one would not: root
    reads it anyway."""
    project = tmp_path / "project"
    project.mkdir()
    too_long = str(tmp_path / ("x" * 300))
    seen: dict[str, Any] = {}

    async def body(conn: Any, rec: Recorder) -> None:
        with pytest.raises(acp.RequestError) as bad:
            await conn.new_session(cwd=too_long)
        seen["code"], seen["data"] = bad.value.code, bad.value.data
        new = await conn.new_session(cwd=str(project))  # the connection is still up
        await rec.wait_for(lambda _: bool(rec.of(new.session_id, "session_info_update")))
        seen["opened"] = new.session_id

    await trio.to_thread.run_sync(run_client, project, body, "--model", "offline/echo")
    assert seen["code"] == -32603
    assert seen["data"] == {"details": f"OSError: [Errno 36] File name too long: {too_long!r}"}
    assert seen["opened"]  # and run_client saw the process exit 0 at EOF


# -- raw JSON-RPC ------------------------------------------------------------------------------


async def test_malformed_json_rpc_is_answered_and_the_connection_stays(
        tmp_path: Path) -> None:
    lines = [
        b"not json",
        b"[1,2]",
        b'{"id":1,"method":"initialize","params":{"protocolVersion":1}}',
        b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":3}}',
        b'{"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd":"rel"}}',
        b'{"jsonrpc":"2.0","id":4,"method":"foo/bar","params":{}}',
        b'{"jsonrpc":"2.0","id":5,"method":"session/prompt","params":'
        b'{"sessionId":"nope","prompt":[]}}',
        b'{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"nope"}}',
        b'{"jsonrpc":"2.0","id":6,"method":"initialize","params":{"protocolVersion":1}}',
    ]
    with trio.fail_after(60):
        done = await trio.run_process([*OMP, "acp", "--model", "offline/echo"],
                                      stdin=b"\n".join(lines) + b"\n", capture_stdout=True,
                                      capture_stderr=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = [json.loads(x) for x in done.stdout.splitlines()]
    by_id = {x.get("id"): x for x in out if x.get("id") is not None}
    anonymous = [x["error"] for x in out if x.get("id") is None]
    assert [(e["code"], e["message"]) for e in anonymous] == [
        (-32700, "Parse error"), (-32600, "Invalid Request")]
    assert by_id[1]["error"]["code"] == -32600  # no "jsonrpc": "2.0"
    assert by_id[2]["error"] == {"code": -32602, "message": "Invalid params", "data": {
        "details": "session/new: Expected `str`, got `int` - at `$.cwd`"}}
    assert by_id[3]["error"]["data"]["details"] == "ACP cwd must be absolute: rel"
    # An unknown request method is an extension method of nobody's
    # (docs/guides/acp.md#extension-methods), and answered as JSON-RPC says, -32601 (the original:
    # -32603, docs/guides/acp.md#errors).
    assert by_id[4]["error"] == {"code": -32601, "message": "Method not found",
                                 "data": {"details": "Unknown ACP ext method: foo/bar"}}
    assert by_id[5]["error"]["data"]["details"] == "Unsupported ACP session: nope"
    assert by_id[6]["result"]["protocolVersion"] == 1
    assert len(out) == 8  # one answer per request and per bad line; none for the notification


async def test_stdin_closing_and_a_cancel_before_the_prompt_started(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [text_reply("slow ", 60.0, "never")]
    async with fake_provider(script, isolated_agent_dir) as fake:
        process = await trio.lowlevel.open_process(
            [*OMP, "acp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path)
        assert process.stdin is not None
        assert process.stdout is not None
        received = b""

        async def until(predicate: Callable[[list[dict[str, Any]]], bool]) -> None:
            nonlocal received
            assert process.stdout is not None
            while not predicate([json.loads(x) for x in received.splitlines()]):
                received += await process.stdout.receive_some()

        with trio.fail_after(60):
            await process.stdin.send_all(
                b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
                + json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                              "params": {"cwd": str(tmp_path)}}).encode() + b"\n")
            await until(lambda out: any(x.get("id") == 2 for x in out))
            sid = next(x for x in map(json.loads, received.splitlines())
                       if x.get("id") == 2)["result"]["sessionId"]
            # A prompt and its cancel in one write: the cancel finds the prompt although its
            # task has not started; it answers cancelled without calling the model.
            await process.stdin.send_all(json.dumps({
                "jsonrpc": "2.0", "id": 3, "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "never"}]}
            }).encode() + b"\n" + json.dumps({
                "jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": sid}
            }).encode() + b"\n")
            await until(lambda out: any(x.get("id") == 3 for x in out))
            # Then one that streams when stdin closes: answered, and the process exits 0.
            await process.stdin.send_all(json.dumps({
                "jsonrpc": "2.0", "id": 4, "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
            }).encode() + b"\n")
            await until(lambda out: any(
                x.get("params", {}).get("update", {}).get("sessionUpdate")
                == "agent_message_chunk" for x in out))
            await process.stdin.aclose()
            await until(lambda out: any(x.get("id") == 4 for x in out))
            assert await process.wait() == 0
    answers = {x["id"]: x for x in map(json.loads, received.splitlines()) if "id" in x}
    assert answers[3]["result"]["stopReason"] == "cancelled"
    assert answers[4]["result"]["stopReason"] == "cancelled"
    assert len(fake.requests) == 1
