"""Slash commands as a host sees them (issue 12; docs/design/extending.md#slash-commands,
docs/design/extending.md#file-commands-and-templates, docs/design/extending.md#skills,
docs/design/protocol.md#prompt_result).

Every test runs the real ``omp --mode rpc`` (``extension_helpers.open_process_host``) with a
temporary agent directory, cwd and ``HOME`` (so no skill or command of the machine's user can
show up), on the offline model (it echoes what it was sent) or on the fake LLM server where the
request itself is what is checked. Extension commands (``steer "/ext"`` refused, a ``confirm``
answered while the command holds no lane) are in ``test_extensions.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from agent_helpers import fake_provider, text_reply, tool_call, tools_reply
from extension_helpers import (
    FAKE_ARGS,
    OFFLINE_ARGS,
    Frame,
    RawHost,
    install,
    of_type,
    open_process_host,
)

from omp.rpc.slash import BUILTINS

LIMIT = 90
"""Seconds (real time) any test may take."""
PERSISTED = ("--mode", "rpc", "--model", "offline/echo")

SKILL = """---
name: pdf-tools
description: Extract text from PDFs
---
Run `pdftotext FILE -` and read the output.
"""
REVIEW = """---
description: Review files
argument-hint: <files>
---
Review $1 first, then the rest: $@[2]. Everything: $ARGUMENTS. All args: $@. Second: $2.
Window: $@[2:1].
"""
PLAIN = "Summarise the change in one paragraph.\n"
TEMPLATE = "---\ndescription: not listed\n---\nExplain $1 to a newcomer ($@[2:1]).\n"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def populate(agent_dir: Path, cwd: Path) -> None:
    """A user skill, two project file commands and a project prompt template."""
    write(agent_dir / "skills" / "pdf-tools" / "SKILL.md", SKILL)
    write(cwd / ".omp" / "commands" / "review.md", REVIEW)
    write(cwd / ".omp" / "commands" / "summarise.md", PLAIN)
    write(cwd / ".omp" / "prompts" / "explain.md", TEMPLATE)


def host_for(cwd: Path, home: Path, args: tuple[str, ...] = OFFLINE_ARGS) -> open_process_host:
    return open_process_host(cwd, args=args, env={"HOME": str(home)})


async def prompt(host: RawHost, message: str, request_id: str = "p", **fields: Any
                 ) -> list[Frame]:
    """Send a prompt and read up to its response. A command handled locally ends with its
    ``prompt_result`` right behind its response (every accepted prompt has one): that frame is
    checked and taken here, so the frames returned end with the response."""
    await host.send({"id": request_id, "type": "prompt", "message": message, **fields})
    frames = await host.until_type("response", id=request_id)
    if local(frames):
        result = await host.next()
        assert result == {"type": "prompt_result", "id": request_id, "agentInvoked": False,
                          "status": "completed", "sessionSettled": result["sessionSettled"]}
    return frames


async def run(host: RawHost, message: str, request_id: str = "p") -> list[Frame]:
    """Send a prompt that reaches the model; read up to its ``prompt_result``."""
    await host.send({"id": request_id, "type": "prompt", "message": message})
    return await host.until_type("prompt_result", id=request_id)


def outputs(frames: list[Frame]) -> list[str]:
    return [f["text"] for f in of_type(frames, "command_output")]


def user_texts(frames: list[Frame]) -> list[str]:
    return [b["text"] for f in of_type(frames, "message_end") if f["message"]["role"] == "user"
            for b in f["message"]["content"] if b["type"] == "text"]


def take_file(name: str) -> tuple[Any, int]:
    """A JSON file's content and mode; the file is removed."""
    path = Path(name)
    try:
        return msgspec.json.decode(path.read_bytes()), path.stat().st_mode
    finally:
        path.unlink()


def local(frames: list[Frame]) -> bool:
    """The response of a command handled without the model."""
    return frames[-1]["success"] is True and frames[-1].get("data") == {
        "agentInvoked": False, "disposition": "handled"}


# --- the list ------------------------------------------------------------------------------------


async def test_the_list_at_startup_and_after_new_session(cwd: Path, home: Path,
                                                         isolated_agent_dir: Path) -> None:
    populate(isolated_agent_dir, cwd)
    install(isolated_agent_dir, "ext", '''
        def setup(omp):
            omp.register_command("deploy", "Deploy it", lambda args, ctx: None)
            omp.register_command("model", "shadowed by the built-in", lambda args, ctx: None)
    ''')
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            await host.send({"id": "n", "type": "new_session"})
            after_new = await host.until_type("available_commands_update")
            await host.send({"id": "g", "type": "get_available_commands"})
            got = (await host.until_type("response", id="g"))[-1]
    commands = host.startup[-1]["commands"]
    names = [c["name"] for c in commands]
    builtins = [b.name for b in BUILTINS]
    # The original's bundled file command `init` comes with the file commands.
    assert names == [*builtins, "skill:pdf-tools", "deploy", "review", "summarise", "init"]
    by_name = {c["name"]: c for c in commands}
    assert by_name["model"] == {"name": "model", "source": "builtin", "aliases": ["models"],
                                "description": "Show current model selection",
                                "input": {"hint": "[provider/model[:thinking]]"}}
    assert by_name["fast"]["subcommands"] == [
        {"name": "on", "description": "Enable fast mode"},
        {"name": "off", "description": "Disable fast mode"},
        {"name": "status", "description": "Show fast mode status"}]
    assert by_name["skill:pdf-tools"] == {"name": "skill:pdf-tools", "source": "skill",
                                          "description": "Extract text from PDFs",
                                          "input": {"hint": "arguments"}}
    assert by_name["deploy"] == {"name": "deploy", "source": "extension",
                                 "description": "Deploy it", "input": {"hint": "arguments"}}
    assert by_name["review"] == {"name": "review", "source": "file",
                                 "description": "Review files", "input": {"hint": "<files>"}}
    assert by_name["summarise"]["source"] == "file"
    assert "explain" not in names  # templates are not listed
    assert after_new[-1]["commands"] == commands
    assert got["data"]["commands"] == commands


async def test_reload_plugins_picks_up_a_new_skill(cwd: Path, home: Path,
                                                   isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            assert not [c for c in host.startup[-1]["commands"] if c["source"] == "skill"]
            write(cwd / ".omp" / "skills" / "lint" / "SKILL.md",
                  "---\nname: lint\ndescription: Lint the code\n---\nRun ruff.\n")
            frames = await prompt(host, "/reload-plugins")
            # The skills section of config.yml is read again too.
            write(isolated_agent_dir / "config.yml", "skills:\n  ignoredSkills: [li*]\n")
            ignored = await prompt(host, "/reload-plugins", "r2")
    assert local(frames)
    (update,) = of_type(frames, "available_commands_update")
    assert [c["name"] for c in update["commands"] if c["source"] == "skill"] == ["skill:lint"]
    (update,) = of_type(ignored, "available_commands_update")
    assert [c["name"] for c in update["commands"] if c["source"] == "skill"] == []


# --- built-ins -----------------------------------------------------------------------------------

TWO_MODELS = """providers:
  fake:
    baseUrl: http://127.0.0.1:9/v1
    api: openai-completions
    auth: none
    models:
      - {id: fake-model, contextWindow: 100000}
      - {id: other, name: Other, reasoning: true, contextWindow: 100000}
"""


async def test_model_shows_and_sets_with_a_thinking_level(cwd: Path, home: Path,
                                                          isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "models.yml").write_text(TWO_MODELS)
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home, FAKE_ARGS) as host:
            shown = await prompt(host, "/model", "a")
            changed = await prompt(host, "/model fake/other:high", "b")
            alias = await prompt(host, "/models nothing/such", "c")
            await host.send({"id": "s", "type": "get_state"})
            state = (await host.until_type("response", id="s"))[-1]["data"]
    assert [f["type"] for f in shown] == ["command_output", "response"]
    assert outputs(shown) == ["Current model: fake/fake-model"]
    assert local(shown)
    kinds = [f["type"] for f in changed if f["type"] != "model_changed"
             and f["type"] != "thinking_level_changed"]
    assert kinds == ["session_info_update", "config_update", "command_output", "response"]
    (info,) = of_type(changed, "session_info_update")
    assert info == {"type": "session_info_update", "sessionId": state["sessionId"]}
    (config,) = of_type(changed, "config_update")
    assert (config["model"]["provider"], config["model"]["id"]) == ("fake", "other")
    assert config["thinkingLevel"] == "high"
    assert outputs(changed) == ["Model set to fake/other."]
    assert local(changed)
    assert outputs(alias) == ["Unknown model: nothing/such"]
    assert (state["model"]["id"], state["thinkingLevel"]) == ("other", "high")


async def test_rename_inline_and_generated(cwd: Path, home: Path,
                                           isolated_agent_dir: Path) -> None:
    title = text_reply("Parser refactor plan")
    title["match"] = {"bodyContains": "You name conversations"}
    async with fake_provider([text_reply("Sure."), title], isolated_agent_dir):
        with trio.fail_after(LIMIT):
            async with host_for(cwd, home, FAKE_ARGS) as host:
                named = await prompt(host, "/rename My title", "a")
                await run(host, "Let us refactor the parser", "b")
                generated = await prompt(host, "/rename", "c")
                later = await host.until_type("command_output")
                await host.send({"id": "s", "type": "get_state"})
                state = (await host.until_type("response", id="s"))[-1]["data"]
    assert [f["type"] for f in named] == ["session_info_update", "command_output", "response"]
    assert named[0]["title"] == "My title"
    assert outputs(named) == ["Session renamed to My title."]
    # Without a title the answer comes first; the model's title follows.
    assert local(generated)
    assert not outputs(generated)
    (info,) = of_type(later, "session_info_update")
    assert info["title"] == "Parser refactor plan"
    assert outputs(later) == ["Session renamed to Parser refactor plan."]
    assert state["sessionName"] == "Parser refactor plan"


async def test_todo_session_tools_and_export(cwd: Path, home: Path, tmp_path: Path,
                                             isolated_agent_dir: Path) -> None:
    page = tmp_path / "page.html"
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home, PERSISTED) as host:
            empty = await prompt(host, "/todo", "t0")
            added = await prompt(host, "/todo append write the tests", "t1")
            done = await prompt(host, "/todo done write the tests", "t2")
            info = await prompt(host, "/session info", "s")
            tools = await prompt(host, "/tools", "l")
            await run(host, "hello there", "h")
            exported = await prompt(host, f"/export {page}", "e")
            await host.send({"id": "g", "type": "get_state"})
            state = (await host.until_type("response", id="g"))[-1]["data"]
    assert outputs(empty) == ["No todos. Use /todo append <task> to start one."]
    assert "[ ] write the tests" in outputs(added)[0]
    assert "[x] write the tests" in outputs(done)[0]
    assert all(local(f) for f in (empty, added, done, info, tools, exported))
    (text,) = outputs(info)
    assert text.splitlines()[:3] == [f"Session: {state['sessionId']}", "Title: (unnamed)",
                                     f"CWD: {cwd}"]
    (listing,) = outputs(tools)
    assert listing.splitlines()[:8] == ["* read", "* bash", "* edit", "* write", "* grep",
                                        "* glob", "* ls", "* todo"]
    assert all(line.startswith("* ") for line in listing.splitlines())  # all active
    assert outputs(exported) == [f"Session exported to: {page}"]
    assert "hello there" in page.read_text()


async def test_compact_runs_in_the_background(cwd: Path, home: Path,
                                              isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            frames = await prompt(host, "/compact the parser", "c")
            later = await host.until_type("command_output")
    assert local(frames)
    assert not outputs(frames)
    assert outputs(later) == ["Compaction failed: Nothing to compact (session too small)"]


async def test_retry_runs_the_failed_turn_again(cwd: Path, home: Path,
                                                isolated_agent_dir: Path) -> None:
    failure = {"status": 400, "body": {"error": {"message": "bad request", "type": "invalid"}}}
    async with fake_provider([failure, text_reply("second time lucky")],
                             isolated_agent_dir) as fake:
        with trio.fail_after(LIMIT):
            async with host_for(cwd, home, FAKE_ARGS) as host:
                nothing = await prompt(host, "/retry", "r0")
                failed = await run(host, "do it", "p")
                retried = await prompt(host, "/retry", "r1")
                result = await host.until_type("prompt_result", id="r1")
                await host.send({"id": "m", "type": "get_messages"})
                messages = (await host.until_type("response", id="m"))[-1]["data"]["messages"]
    assert outputs(nothing) == ["Nothing to retry."]
    assert local(nothing)
    assert failed[-1]["status"] == "error"
    assert outputs(retried) == ["Retrying the last failed turn."]
    assert retried[-1]["data"] == {"agentInvoked": True, "disposition": "started"}
    assert (result[-1]["status"], result[-1]["agentInvoked"]) == ("completed", True)
    assert [(msg["role"], msg.get("stopReason")) for msg in messages] == [
        ("user", None), ("assistant", "stop")]
    assert len(fake.requests) == 2


async def test_force_makes_the_next_model_call_use_a_tool(cwd: Path, home: Path,
                                                          isolated_agent_dir: Path) -> None:
    (cwd / "notes.txt").write_text("forced read\n")
    call = tools_reply(tool_call("c1", "read", {"path": "notes.txt"}))
    async with fake_provider([call, text_reply("done")], isolated_agent_dir) as fake:
        with trio.fail_after(LIMIT):
            async with host_for(cwd, home, FAKE_ARGS) as host:
                unknown = await prompt(host, "/force nope hi", "u")
                frames = await prompt(host, "/force read look at notes.txt", "f")
                result = await host.until_type("prompt_result", id="f")
            first, second = (msgspec.json.decode(r.body) for r in fake.requests)
    assert unknown[-1]["success"] is False
    assert unknown[-1]["error"].startswith("Unknown tool: nope")
    assert outputs(frames) == ["Next turn forced to use read."]
    assert frames[-1]["success"] is True
    assert frames[-1]["data"] == {"agentInvoked": True, "disposition": "started"}
    assert result[-1]["status"] == "completed"
    assert first["tool_choice"] == {"type": "function", "function": {"name": "read"}}
    assert "tool_choice" not in second  # one turn only
    assert user_texts(result) == ["look at notes.txt"]


# --- file commands and templates -----------------------------------------------------------------


async def test_file_commands_and_templates_expand_their_arguments(
        cwd: Path, home: Path, isolated_agent_dir: Path) -> None:
    populate(isolated_agent_dir, cwd)
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            review = await run(host, '/review a.py "b c.py" d.py', "r")
            plain = await run(host, "/summarise the diff", "s")
            template = await run(host, "/explain trio nurseries scopes", "t")
            # An idle steer starts a run (no prompt_result: it is not a prompt).
            await host.send({"id": "st", "type": "steer", "message": "/explain x y z"})
            steered = await host.until_type("agent_end")
    assert user_texts(review) == [
        "Review a.py first, then the rest: b c.py d.py. Everything: a.py b c.py d.py. "
        "All args: a.py b c.py d.py. Second: b c.py.\nWindow: b c.py."]
    # No placeholder: the arguments are appended.
    assert user_texts(plain) == ["Summarise the change in one paragraph.\n\nthe diff"]
    assert user_texts(template) == ["Explain trio to a newcomer (nurseries)."]
    # steer expands templates too (and only templates).
    assert user_texts(steered) == ["Explain x to a newcomer (y)."]


# --- skills --------------------------------------------------------------------------------------


async def test_a_skill_idle_and_while_streaming(cwd: Path, home: Path,
                                                isolated_agent_dir: Path) -> None:
    populate(isolated_agent_dir, cwd)
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            await host.send({"id": "s", "type": "get_state"})
            state = (await host.until_type("response", id="s"))[-1]["data"]
            idle = await run(host, "/skill:pdf-tools report.pdf", "i")
            await host.send({"id": "busy", "type": "prompt", "message": "[[slow 1]] working"})
            await host.until_type("message_start")
            busy = await prompt(host, "please use /skill:pdf-tools on it", "b")
            served = await host.until_type("prompt_result", id="b")
            unknown = await run(host, "/skill:nope x", "u")
    system = "\n".join(state["systemPrompt"])
    assert "<skills>\n- pdf-tools: Extract text from PDFs\n</skills>" in system
    assert idle[-1]["status"] == "completed"
    (skill,) = [f["message"] for f in of_type(idle, "message_end")
                if f["message"]["role"] == "custom"]
    assert skill["customType"] == "skill-prompt"
    assert "Run `pdftotext FILE -`" in skill["content"]
    assert skill["content"].endswith("User: report.pdf")
    assert skill["details"]["args"] == "report.pdf"
    # While a run streams the skill steers it: accepted at once, served by that run.
    assert busy[-1]["data"] == {"agentInvoked": True, "disposition": "queued"}
    customs = [f["message"] for f in of_type(served, "message_end")
               if f["message"]["role"] == "custom"]
    assert customs
    assert customs[0]["details"]["args"] == "please use on it"
    assert user_texts(unknown) == ["/skill:nope x"]


async def test_skill_commands_can_be_turned_off(cwd: Path, home: Path,
                                                isolated_agent_dir: Path) -> None:
    """``skills.enableSkillCommands: false``: no ``skill:`` entry in the list, and
    ``/skill:pdf-tools`` is text for the model; the model is still offered the skill."""
    populate(isolated_agent_dir, cwd)
    write(isolated_agent_dir / "config.yml", "skills:\n  enableSkillCommands: false\n")
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            await host.send({"id": "s", "type": "get_state"})
            state = (await host.until_type("response", id="s"))[-1]["data"]
            sent = await run(host, "/skill:pdf-tools report.pdf", "i")
    assert [c for c in host.startup[-1]["commands"] if c["source"] == "skill"] == []
    assert "- pdf-tools: Extract text from PDFs" in "\n".join(state["systemPrompt"])
    assert user_texts(sent) == ["/skill:pdf-tools report.pdf"]
    assert not [f for f in of_type(sent, "message_end") if f["message"]["role"] == "custom"]


async def test_the_read_tool_serves_skill_uris(cwd: Path, home: Path,
                                               isolated_agent_dir: Path) -> None:
    populate(isolated_agent_dir, cwd)
    write(isolated_agent_dir / "skills" / "pdf-tools" / "ref.md", "reference text\n")
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            main = await run(host, 'r [[tool read {"path": "skill://pdf-tools"}]]', "a")
            ref = await run(host, 'r [[tool read {"path": "skill://pdf-tools/ref.md"}]]', "b")
            out = await run(host, 'r [[tool read {"path": "skill://pdf-tools/../../x"}]]', "c")
    texts = [f["result"]["content"][0]["text"]
             for frames in (main, ref, out) for f in of_type(frames, "tool_execution_end")]
    assert "Run `pdftotext FILE -`" in texts[0]
    assert "reference text" in texts[1]
    assert "leaves the directory of skill 'pdf-tools'" in texts[2]


async def test_unknown_commands_reach_the_model_as_typed(cwd: Path, home: Path,
                                                         isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            frames = await run(host, "/frobnicate now", "m")
    assert user_texts(frames) == ["/frobnicate now"]
    assert not outputs(frames)


async def test_the_originals_other_built_ins_never_reach_the_model(
        cwd: Path, home: Path, isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            frames = []
            for i, command in enumerate(("/usage", "/stats", "/ssh list", "/settings")):
                await host.send({"id": f"c{i}", "type": "prompt", "message": command})
                frames += await host.until_type("prompt_result", id=f"c{i}")
    assert user_texts(frames) == []
    assert not of_type(frames, "agent_start")
    assert outputs(frames) == [f"/{name} is not available in this version."
                               for name in ("usage", "stats", "ssh", "settings")]
    responses = of_type(frames, "response")
    assert all(r["data"] == {"agentInvoked": False, "disposition": "handled"}
               for r in responses)


async def test_the_other_reporting_built_ins(cwd: Path, home: Path,
                                             isolated_agent_dir: Path) -> None:
    with trio.fail_after(LIMIT):
        async with host_for(cwd, home) as host:
            await run(host, "a first question", "q")
            fast = await prompt(host, "/fast status", "f")
            fast_on = await prompt(host, "/fast on", "f2")
            context = await prompt(host, "/context", "c")
            dump = await prompt(host, "/dump", "d")
            changelog = await prompt(host, "/changelog", "l")
            jobs = await prompt(host, "/jobs", "j")
            switch = await prompt(host, "/switch offline/echo", "s")
            handoff = await prompt(host, "/handoff", "h")
            handed = await host.until_type("command_output")
    for frames in (fast, fast_on, context, dump, changelog, jobs, switch, handoff):
        assert local(frames)
    assert outputs(fast) == ["Fast mode is off."]
    assert outputs(fast_on) == ["Fast mode is unavailable for the current model."]
    (report,) = outputs(context)
    assert report.splitlines()[:2] == ["Context usage", "Model: offline/echo"]
    assert "user messages" in report
    (transcript,) = outputs(dump)
    assert "## user\n\na first question" in transcript
    request, mode = take_file(transcript.rpartition("LLM request JSON: ")[2])
    assert mode & 0o077 == 0  # private, like the session
    assert request["messages"][0]["content"][0]["text"] == "a first question"
    assert outputs(changelog)[0].startswith("# Changelog")
    assert outputs(jobs) == ["No background jobs."]
    assert outputs(switch) == ["Session-only model: offline/echo."]
    # In the background: its word follows the response (the offline model's handoff text is
    # taken for a summary already there, which the session refuses to hand off again).
    (said,) = outputs(handed)
    assert said == "Context handed off and compacted in place." or said.startswith(
        "Handoff failed: ")
