"""ACP session lifecycle details, driven by the ``agent-client-protocol`` package's client
spawning the real ``omp acp``: a live session loaded again with other MCP servers (they replace
its editor-given ones, docs/guides/acp.md#sessions), ``session/list``'s ``_meta``, and the ``ask``
tool's questions as form elicitations (docs/guides/acp.md#what-the-editor-offers)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
from agent_helpers import fake_provider, text_reply, tool_call, write_models_yml
from test_acp import PROBE, Recorder, acp, run_client, schema
from test_acp_methods import FormEditor

from omp.testing.fake_llm import open_fake_llm


def probe(name: str, mark: Path) -> Any:
    return schema.McpServerStdio(
        name=name, command=sys.executable, args=[str(PROBE)],
        env=[schema.EnvVariable(name="MCP_PROBE_MARK", value=str(mark))])


def pids(mark: Path) -> list[int]:
    return [int(x) for x in mark.read_text().split()] if mark.exists() else []


@pytest.mark.parametrize("method", ["load", "resume"])
async def test_loading_a_live_session_replaces_its_editor_mcp_servers(
        tmp_path: Path, isolated_agent_dir: Path, method: str) -> None:
    pytest.importorskip("mcp")
    project = tmp_path / "project"
    project.mkdir()
    one, two = tmp_path / "one.pids", tmp_path / "two.pids"
    async with open_fake_llm([text_reply("first"), text_reply("second"),
                              text_reply("third")]) as fake:
        write_models_yml(isolated_agent_dir, fake.base_url)
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project),
                                          mcp_servers=[probe("one", one)])).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("a")])
            seen["one before"] = [procfs.alive(p) for p in pids(one)]
            reopen = conn.load_session if method == "load" else conn.resume_session
            await reopen(cwd=str(project), session_id=sid, mcp_servers=[probe("two", two)])
            # Answered once the old server's process is gone and the new one connected.
            seen["one after"] = [procfs.alive(p) for p in pids(one)]
            seen["two after"] = [procfs.alive(p) for p in pids(two)]
            await conn.prompt(session_id=sid, prompt=[acp.text_block("b")])
            await reopen(cwd=str(project), session_id=sid, mcp_servers=[])
            seen["two at the end"] = [procfs.alive(p) for p in pids(two)]
            await conn.prompt(session_id=sid, prompt=[acp.text_block("c")])

        await trio.to_thread.run_sync(run_client, project, body)
        systems = [r.json()["messages"][0]["content"] for r in fake.requests]
    assert seen["one before"] == [True]
    assert seen["one after"] == [False]
    assert seen["two after"] == [True]
    assert seen["two at the end"] == [False]
    assert "xd://mcp__one_echo" in systems[0]
    assert "xd://mcp__two_echo" not in systems[0]
    assert "xd://mcp__two_echo" in systems[1]
    assert "xd://mcp__one_echo" not in systems[1]
    assert "mcp__" not in systems[2]


async def test_a_live_session_without_servers_gets_the_editors_on_load(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    pytest.importorskip("mcp")
    project = tmp_path / "project"
    project.mkdir()
    mark = tmp_path / "late.pids"
    async with fake_provider([text_reply("first"), text_reply("second")],
                             isolated_agent_dir) as fake:

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("a")])
            await conn.resume_session(cwd=str(project), session_id=sid,
                                      mcp_servers=[probe("late", mark)])
            await conn.prompt(session_id=sid, prompt=[acp.text_block("b")])

        await trio.to_thread.run_sync(run_client, project, body)
        systems = [r.json()["messages"][0]["content"] for r in fake.requests]
    assert "mcp__" not in systems[0]
    assert "xd://mcp__late_echo" in systems[1]
    # The process exited (run_client waited for it) and took the server with it.
    assert [procfs.alive(p) for p in pids(mark)] == [False]


async def test_session_list_entries_carry_message_count_and_size(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    async with fake_provider([text_reply("one"), text_reply("two")], isolated_agent_dir):
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("a")])
            seen["after one"] = (await conn.list_sessions(cwd=str(project))).sessions
            await conn.prompt(session_id=sid, prompt=[acp.text_block("b")])
            seen["after two"] = (await conn.list_sessions(cwd=str(project))).sessions
            seen["sid"] = sid

        await trio.to_thread.run_sync(run_client, project, body)
    files = list((isolated_agent_dir / "sessions").rglob(f"*{seen['sid']}*.jsonl"))
    assert len(files) == 1
    [first], [second] = seen["after one"], seen["after two"]
    assert first.field_meta["messageCount"] == 2  # the prompt and the answer
    assert second.field_meta["messageCount"] == 4
    assert 0 < first.field_meta["size"] < second.field_meta["size"]
    # The size is the file's (nothing is written after the second answer but the end).
    assert second.field_meta["size"] == files[0].stat().st_size


@pytest.mark.parametrize("forms", [True, False])
async def test_the_ask_tool_asks_through_form_elicitations(
        tmp_path: Path, isolated_agent_dir: Path, forms: bool) -> None:
    project = tmp_path / "project"
    project.mkdir()
    questions = [{"question": "Which colour?", "options": ["red", "blue"]},
                 {"question": "Your name?"}]
    script = [{"match": {"bodyContains": "ask me"},
               "chunks": [tool_call("q1", "ask", {"questions": questions})], "stop": "toolUse"},
              text_reply("thanks")]
    async with fake_provider(script if forms else [text_reply("no tool")],
                             isolated_agent_dir) as fake:
        editor = FormEditor() if forms else Recorder()
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            seen["sid"] = sid
            seen["stop"] = (await conn.prompt(session_id=sid,
                                              prompt=[acp.text_block("ask me")])).stop_reason
            seen["ends"] = [u for u in rec.of(sid, "tool_call_update")
                            if u.status in ("completed", "failed")]

        await trio.to_thread.run_sync(
            lambda: run_client(project, body, recorder=editor))
        offered = [t["function"]["name"] for t in fake.requests[0].json()["tools"]]
        last = fake.requests[-1].json()["messages"]
    assert seen["stop"] == "end_turn"
    if not forms:
        assert "ask" not in offered  # nobody could answer it
        assert seen["ends"] == []
        return
    assert "ask" in offered
    assert isinstance(editor, FormEditor)
    sid = seen["sid"]
    assert editor.forms == [
        (sid, "Which colour?", {"type": "object", "required": ["value"], "properties": {
            "value": {"type": "string", "enum": ["red", "blue"]}}}),
        (sid, "Your name?", {"type": "object", "required": ["value"], "properties": {
            "value": {"type": "string"}}})]
    [end] = seen["ends"]
    assert end.status == "completed"
    result = [m for m in last if m["role"] == "tool"][-1]["content"]
    text = result if isinstance(result, str) else result[0]["text"]
    assert text == "Which colour?: blue\nYour name?: Ada"
