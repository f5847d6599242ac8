"""ACP methods beyond the core loop, driven by the ``agent-client-protocol`` package's client
spawning the real ``omp acp``: the busy error (-32003), ``session/resume`` and
``session/fork``, and the ``_omp/*`` extension methods (docs/guides/acp.md#sessions,
docs/guides/acp.md#prompts-and-updates, docs/guides/acp.md#errors,
docs/guides/acp.md#extension-methods)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import fake_provider, text_reply
from test_acp import Recorder, acp, run_client, schema, text_of


async def test_a_prompt_while_a_run_of_nobodys_goes_is_busy(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    # The extension starts a run of its own when the session starts: no prompt of the
    # editor owns it.
    extension = tmp_path / "ext.py"
    extension.write_text(
        "def setup(omp):\n"
        "    async def started(event, ctx):\n"
        "        omp.send_user_message('autonomous work')\n"
        "    omp.on('session_start', started)\n")
    slow = {"match": {"bodyContains": "autonomous work"},
            "chunks": [{"text": "working "}, {"delay": 60.0}, {"text": "never"}]}
    async with fake_provider([slow, text_reply("after the stop")], isolated_agent_dir):
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            await rec.wait_for(lambda _: bool(rec.of(sid, "agent_message_chunk")))
            with pytest.raises(acp.RequestError) as busy:
                await conn.prompt(session_id=sid, prompt=[acp.text_block("me too")])
            seen["busy"] = (busy.value.code, str(busy.value), busy.value.data)
            # Stopped, the session takes the editor's prompt.
            await conn.cancel(session_id=sid)
            result = await conn.prompt(session_id=sid, prompt=[acp.text_block("now")])
            seen["then"] = (result.stop_reason, text_of(rec.of(sid, "agent_message_chunk")))

        await trio.to_thread.run_sync(
            lambda: run_client(project, body, "-e", str(extension)))
    code, message, data = seen["busy"]
    assert code == -32003
    assert message.startswith("Agent is already processing.")
    assert data == {"reason": "session_busy", "hint": "steer|followUp|wait"}
    assert seen["then"] == ("end_turn", "working after the stop")


async def test_resume_fork_and_the_omp_extension_methods(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    script = [text_reply("first answer"), text_reply("forked answer"),
              text_reply("resumed answer"), text_reply("elsewhere")]
    async with fake_provider(script, isolated_agent_dir) as fake:
        seen: dict[str, Any] = {}

        async def first(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            await conn.prompt(session_id=sid, prompt=[acp.text_block("remember me")])
            # A live session forks into a new one with its conversation.
            fork = (await conn.fork_session(cwd=str(project), session_id=sid)).session_id
            assert fork != sid
            await conn.prompt(session_id=fork, prompt=[acp.text_block("in the fork")])
            seen["ids"] = (sid, fork)
            other_sid = (await conn.new_session(cwd=str(other))).session_id
            await conn.prompt(session_id=other_sid, prompt=[acp.text_block("over there")])
            seen["other"] = other_sid

        async def second(conn: Any, rec: Recorder) -> None:
            sid = seen["ids"][0]
            # A stored session forks too (its file is read, the copy written beside it).
            seen["stored fork"] = (await conn.fork_session(
                cwd=str(other), session_id=seen["other"])).session_id
            resumed = await conn.resume_session(cwd=str(project), session_id=sid)
            assert resumed.modes.current_mode_id == "default"
            # No replay: the editor kept the conversation.
            seen["replayed"] = [u for s, u in rec.updates if s == sid
                                and u.session_update.endswith("_chunk")]
            await conn.prompt(session_id=sid, prompt=[acp.text_block("resumed here")])
            # Modes: only "default" (no plan mode here); a change says so twice, as the
            # original does.
            modal = ("current_mode_update", "config_option_update")
            await conn.set_session_mode(session_id=sid, mode_id="default")
            await rec.wait_for(lambda _: len(rec.of(sid, modal[1])) == 1)
            seen["mode updates"] = [u.session_update for s, u in rec.updates
                                    if s == sid and u.session_update in modal]
            with pytest.raises(acp.RequestError) as plan:
                await conn.set_session_mode(session_id=sid, mode_id="plan")
            seen["plan"] = plan.value.data
            # The library puts the "_" of an extension method in front itself.
            seen["all"] = await conn.ext_method("omp/sessions/listAll", {"limit": 2})
            seen["projects"] = await conn.ext_method("omp/projects/list", {})
            seen["by cwd"] = await conn.ext_method("omp/chats/byCwd", {"cwd": str(other)})
            with pytest.raises(acp.RequestError) as unknown:
                await conn.ext_method("omp/nothing", {})
            seen["unknown"] = unknown.value.data
            seen["unknown code"] = unknown.value.code
            with pytest.raises(acp.RequestError) as missing:
                await conn.fork_session(cwd=str(project), session_id="no-such-session")
            seen["missing"] = missing.value.data

        await trio.to_thread.run_sync(run_client, project, first)
        await trio.to_thread.run_sync(run_client, project, second)
        calls = [r.json()["messages"] for r in fake.requests]
    sid, fork = seen["ids"]
    # The fork's model call had the source's conversation; the resumed session's had its own
    # (not the fork's).
    assert "remember me" in json.dumps(calls[1])
    assert "first answer" in json.dumps(calls[1])
    resumed = json.dumps(calls[3])
    assert "remember me" in resumed
    assert "resumed here" in resumed
    assert "in the fork" not in resumed
    assert seen["replayed"] == []
    assert seen["mode updates"] == ["current_mode_update", "config_option_update"]
    assert seen["plan"] == {"details": "Unsupported ACP mode: plan"}
    listed = seen["all"]
    everything = {sid, fork, seen["other"], seen["stored fork"]}
    assert listed["total"] == 4
    assert len(listed["sessions"]) == 2
    assert {x["sessionId"] for x in listed["sessions"]} <= everything
    projects = seen["projects"]
    assert projects["totalSessions"] == 4
    assert {(x["cwd"], x["sessionCount"]) for x in projects["projects"]} == {
        (str(project), 2), (str(other), 2)}
    assert all(isinstance(x["lastActivityAt"], int) for x in projects["projects"])
    # Newest first: the fork of the stored session, then the session itself.
    assert [x["sessionId"] for x in seen["by cwd"]["sessions"]] == [
        seen["stored fork"], seen["other"]]
    assert seen["unknown"] == {"details": "Unknown ACP ext method: _omp/nothing"}
    assert seen["unknown code"] == -32601  # JSON-RPC's Method not found
    assert seen["missing"] == {"details": "ACP session not found: no-such-session"}


class FormEditor(Recorder):
    """An editor that shows form elicitations and answers each by its schema's type."""

    def __init__(self) -> None:
        super().__init__()
        self.elicitation = True
        self.forms: list[tuple[str, str, dict[str, Any]]] = []

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        form = mode.root if hasattr(mode, "root") else mode
        requested = form.requested_schema.model_dump(by_alias=True, exclude_none=True)
        self.forms.append((form.session_id, message, requested))
        value = requested["properties"]["value"]
        answer = (value["enum"][-1] if "enum" in value else True if value["type"] == "boolean"
                  else "Ada")
        return schema.AcceptElicitationResponse(action="accept", content={"value": answer})


DIALOGS = (
    "def setup(omp):\n"
    "    async def ask(args, ctx):\n"
    "        colour = await ctx.ui.select('Pick a colour', ['red', 'blue'])\n"
    "        sure = await ctx.ui.confirm('Sure?', 'Really paint it')\n"
    "        name = await ctx.ui.input('Your name?', 'a name')\n"
    "        omp.send_user_message(f'{colour} {sure} {name}')\n"
    "    omp.register_command('ask', 'Ask the user', ask)\n")


@pytest.mark.parametrize("forms", [True, False])
async def test_extension_dialogs_become_form_elicitations(
        tmp_path: Path, isolated_agent_dir: Path, forms: bool) -> None:
    project = tmp_path / "project"
    project.mkdir()
    extension = tmp_path / "ext.py"
    extension.write_text(DIALOGS)
    async with fake_provider([text_reply("noted")], isolated_agent_dir) as fake:
        editor = FormEditor() if forms else Recorder()
        seen: dict[str, Any] = {}

        async def body(conn: Any, rec: Recorder) -> None:
            sid = (await conn.new_session(cwd=str(project))).session_id
            seen["sid"] = sid
            seen["stop"] = (await conn.prompt(session_id=sid,
                                              prompt=[acp.text_block("/ask")])).stop_reason

        await trio.to_thread.run_sync(
            lambda: run_client(project, body, "-e", str(extension), recorder=editor))
        asked = [m for m in fake.requests[0].json()["messages"] if m["role"] == "user"][-1]
    assert seen["stop"] == "end_turn"
    said = asked["content"] if isinstance(asked["content"], str) else asked["content"][0]["text"]
    if not forms:
        assert said == "None False None"  # no form elicitation: every dialog's default
        return
    assert said == "blue True Ada"
    assert isinstance(editor, FormEditor)
    sid = seen["sid"]
    assert editor.forms == [
        (sid, "Pick a colour", {"type": "object", "required": ["value"], "properties": {
            "value": {"type": "string", "enum": ["red", "blue"]}}}),
        (sid, "Sure?\n\nReally paint it", {"type": "object", "required": ["value"],
                                            "properties": {"value": {"type": "boolean"}}}),
        (sid, "Your name?", {"type": "object", "required": ["value"], "properties": {
            "value": {"type": "string", "description": "a name"}}})]
