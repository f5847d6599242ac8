"""The original's command line, as the programs that launch omp use it (issue 21): its flags,
subcommands, ``@file``, piped stdin, ``-r``, ``--mode json``, through the real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio
from agent_helpers import fake_provider, text_reply, write_models_yml

from omp.testing.fake_llm import FakeLLM, open_fake_llm

OMP = [sys.executable, "-m", "omp"]
OFFLINE = ["--model", "offline/echo"]


async def omp(*args: str, cwd: Path, stdin: bytes = b"",
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(60):
        return await trio.run_process([*OMP, *args], stdin=stdin, capture_stdout=True,
                                      capture_stderr=True, check=False, cwd=cwd,
                                      env=env)


def lines(output: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines()]


def one_line(result: subprocess.CompletedProcess[bytes]) -> str:
    text = result.stderr.decode()
    assert text.count("\n") == 1, text
    return text.strip()


def user_text(fake: FakeLLM, index: int = 0) -> Any:
    """The content of the last user message of the ``index``-th request."""
    messages = fake.requests[index].json()["messages"]
    return [m for m in messages if m["role"] == "user"][-1]["content"]


# --- flags ---------------------------------------------------------------------------------------


async def test_the_flags_runners_pass_are_accepted(tmp_path: Path) -> None:
    result = await omp(*OFFLINE, "--no-session", "--no-title", "--no-lsp", "--no-pty",
                       "--allow-home", "--hide-thinking", "--no-rules", "--auto-approve",
                       "--yolo", "--approval-mode", "yolo", "--approval-mode=yolo", "-p", "hi",
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"Echo: hi\n"


async def test_what_cannot_apply_is_one_line_exit_2(tmp_path: Path) -> None:
    approval = await omp(*OFFLINE, "--approval-mode", "sometimes", "-p", "hi", cwd=tmp_path)
    assert approval.returncode == 2
    assert b"--approval-mode: invalid choice: 'sometimes'" in approval.stderr
    for flag in (["--plan-yolo"], ["--smol", "x"], ["--add-dir", "/tmp"], ["--from-claude"]):
        refused = await omp(*OFFLINE, *flag, "-p", "hi", cwd=tmp_path)
        assert refused.returncode == 2
        assert one_line(refused).startswith(f"omp: error: {flag[0]} is not available")
    acp = await omp("--mode", "acp", "hi", cwd=tmp_path)
    assert acp.returncode == 2
    assert one_line(acp) == "omp: error: --mode acp takes its prompts on stdin, not on the " \
        "command line"
    unknown = await omp("--bogus-flag", "-p", "hi", cwd=tmp_path)
    assert unknown.returncode == 2
    assert b"unrecognized arguments: --bogus-flag" in unknown.stderr


async def test_version_and_thinking_prefixes(tmp_path: Path) -> None:
    for flag in ("--version", "-v"):
        version = await omp(flag, cwd=tmp_path)
        assert version.returncode == 0
        assert version.stdout.startswith(b"omp ")
    run = await omp("--model", "offline/echo-thinking", "--thinking", "med", "--no-session",
                    "--mode", "json", "hi", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    bad = await omp("--thinking", "m", "-p", "hi", cwd=tmp_path)  # ambiguous: minimal, medium
    assert bad.returncode == 2


async def test_max_time_aborts_the_run(tmp_path: Path, isolated_agent_dir: Path) -> None:
    async with fake_provider([text_reply("slow", 30.0, "never")], isolated_agent_dir):
        started = trio.current_time()
        result = await omp("--model", "fake/fake-model", "--no-session", "--max-time", "1.5",
                           "--mode", "json", "hello", cwd=tmp_path)
        elapsed = trio.current_time() - started
    assert result.returncode == 1
    assert elapsed < 20
    frames = lines(result.stdout)
    end = [f for f in frames if f["type"] == "message_end"][-1]["message"]
    assert end["stopReason"] == "aborted"
    assert end["errorMessage"] == "Deadline exceeded"
    assert frames[-1]["type"] == "agent_end"
    assert "omp: Deadline exceeded" in result.stderr.decode()
    bad = await omp("--max-time", "abc", "-p", "hi", cwd=tmp_path)
    assert bad.returncode == 2
    assert b'Invalid --max-time value: "abc"' in bad.stderr


async def test_a_config_overlay_turns_off_context_files_and_tools(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    (tmp_path / "AGENTS.md").write_text("Always answer in Latin.\n")
    overlay = tmp_path / "runner.yml"
    overlay.write_text("disabledProviders: [agents-md]\nglob: {enabled: false}\n"
                       "tools: {approvalMode: yolo}\nlsp: {enabled: true}\n"
                       "theme: {dark: titanium}\nretry: {maxRetries: 1}\n")
    async with fake_provider([text_reply("ok"), text_reply("ok")], isolated_agent_dir) as fake:
        plain = await omp("--model", "fake/fake-model", "--no-session", "-p", "hi", cwd=tmp_path)
        result = await omp("--model", "fake/fake-model", "--no-session", "--config",
                           str(overlay), "--mode", "json", "hi", cwd=tmp_path)
        assert plain.returncode == result.returncode == 0, result.stderr
        before, after = (fake.requests[i].json() for i in (0, 1))
    assert "Always answer in Latin." in json.dumps(before["messages"][0])
    assert "Always answer in Latin." not in json.dumps(after["messages"][0])
    assert "glob" in [t["function"]["name"] for t in before["tools"]]
    assert "glob" not in [t["function"]["name"] for t in after["tools"]]
    notices = [f for f in lines(result.stdout) if f["type"] == "notice"]
    assert len(notices) == 1
    assert notices[0]["message"] == f"{overlay}: not used by this runtime: theme.dark"
    assert "lsp" in [t["function"]["name"] for t in after["tools"]]  # an overlay may turn it on
    missing = await omp(*OFFLINE, "--config", "nope.yml", "-p", "hi", cwd=tmp_path)
    assert missing.returncode == 1
    assert one_line(missing) == f"omp: Config overlay not found: {tmp_path / 'nope.yml'}"
    approval = tmp_path / "ask.yml"
    approval.write_text("tools:\n  approvalMode: always-ask\n")
    asks = await omp(*OFFLINE, "--config", str(approval), "-p", "hi", cwd=tmp_path)
    assert asks.returncode == 0, asks.stderr
    approval.write_text("tools:\n  approvalMode: sometimes\n")
    refused = await omp(*OFFLINE, "--config", str(approval), "-p", "hi", cwd=tmp_path)
    assert refused.returncode == 1
    assert "$.tools.approvalMode: must be one of always-ask, write, yolo" in one_line(refused)


async def test_a_profile_is_its_own_agent_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    profile = home / ".omp" / "profiles" / "work" / "agent"
    profile.mkdir(parents=True)
    write_models_yml(profile, "http://127.0.0.1:9")
    env = {k: v for k, v in os.environ.items() if k != "OMP_AGENT_DIR"} | {"HOME": str(home)}
    chosen = await omp("--profile", "work", "models", "--json", cwd=tmp_path, env=env)
    assert chosen.returncode == 0, chosen.stderr
    assert [m["selector"] for m in json.loads(chosen.stdout)["models"]] == ["fake/fake-model"]
    by_env = await omp("models", "--json", cwd=tmp_path, env=env | {"OMP_PROFILE": "work"})
    assert by_env.stdout == chosen.stdout
    default = await omp("models", "--json", cwd=tmp_path, env=env)
    assert "fake/fake-model" not in default.stdout.decode()
    invalid = await omp("--profile", "Bad Name", "-p", "hi", cwd=tmp_path, env=env)
    assert invalid.returncode == 1
    assert one_line(invalid).startswith('omp: Invalid OMP profile "Bad Name"')


async def test_a_plugin_dir_loads_python_and_skills_and_skips_typescript(
        tmp_path: Path) -> None:
    plugin = tmp_path / "plug"
    (plugin / "extensions").mkdir(parents=True)
    (plugin / "extensions" / "hello.py").write_text(
        "def setup(omp):\n"
        "    async def hello(args, ctx):\n"
        "        pass\n"
        "    omp.register_command('plug-hello', 'Say hello', hello)\n")
    (plugin / "skills" / "greet").mkdir(parents=True)
    (plugin / "skills" / "greet" / "SKILL.md").write_text(
        "---\ndescription: Greets people\n---\nSay hello.\n")
    (plugin / "hooks").mkdir()
    (plugin / "hooks" / "pre.ts").write_text("export default {}\n")
    result = await omp(*OFFLINE, "--mode", "rpc", "--no-session", "--plugin-dir", str(plugin),
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    update = next(f for f in lines(result.stdout) if f["type"] == "available_commands_update")
    names = [c["name"] for c in update["commands"]]
    assert "plug-hello" in names
    assert "skill:greet" in names
    skipped = [line for line in result.stderr.decode().splitlines() if "TypeScript" in line]
    assert len(skipped) == 1
    assert "hooks/pre.ts" in skipped[0]


# --- piped input, @file ------------------------------------------------------------------------


async def test_piped_stdin_is_the_message(tmp_path: Path) -> None:
    result = await omp(*OFFLINE, "--no-session", "-p", cwd=tmp_path, stdin=b"question\n")
    assert result.stdout == b"Echo: question\n"
    no_flag = await omp(*OFFLINE, "--no-session", cwd=tmp_path, stdin=b"question\n")
    assert no_flag.stdout == b"Echo: question\n"  # piped input alone means print mode
    nothing = await omp(*OFFLINE, "--no-session", "-p", cwd=tmp_path, stdin=b"  \n")
    assert (nothing.returncode, nothing.stdout) == (0, b"")


async def test_at_files_are_inlined_as_the_original_does(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    (tmp_path / "f.txt").write_text("FILE\n")
    (tmp_path / "empty.txt").write_text("")
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * 40
    (tmp_path / "shot.png").write_bytes(png)
    async with open_fake_llm([text_reply("ok")]) as fake:
        write_models_yml(isolated_agent_dir, fake.base_url,
                         model_fields={"input": ["text", "image"]})
        result = await omp("--model", "fake/fake-model", "--no-session", "-p", "@f.txt",
                           "@empty.txt", "@shot.png", "msg one", cwd=tmp_path,
                           stdin=b"from stdin\n")
        assert result.returncode == 0, result.stderr
        content = user_text(fake)
    text = "".join(part["text"] for part in content if part["type"] == "text")
    assert text == (f'from stdin\n<file name="{tmp_path / "f.txt"}">\nFILE\n\n</file>\n'
                    f'<file name="{tmp_path / "shot.png"}"></file>\nmsg one')
    images = [part for part in content if part["type"] == "image_url"]
    assert len(images) == 1
    assert images[0]["image_url"]["url"].startswith("data:image/png;base64,")


def test_a_document_or_binary_at_file_gets_the_originals_cannot_read_line(tmp_path: Path) -> None:
    from omp.rpc.file_args import inline_file

    (tmp_path / "report.pdf").write_bytes(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n")
    (tmp_path / "blob").write_bytes(b"ELF\0\0\0binary")
    assert inline_file("@report.pdf", tmp_path) == (
        f'<file name="{tmp_path / "report.pdf"}">[Cannot read pdf file: documents and binary '
        "files are not converted by this runtime]</file>\n", None)
    text, image = inline_file("@blob", tmp_path)
    assert text.startswith(f'<file name="{tmp_path / "blob"}">[Cannot read binary file: ')
    assert image is None


async def test_an_unusable_at_file_stops_before_any_model_call(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    async with fake_provider([], isolated_agent_dir) as fake:
        for name, error in (("missing.txt", f"omp: File not found: {tmp_path / 'missing.txt'}"),
                            ("fifo", "a FIFO"), ("dir", "a directory")):
            result = await omp("--model", "fake/fake-model", "--no-session", "-p", f"@{name}",
                               "hi", cwd=tmp_path)
            assert result.returncode == 1
            assert error in one_line(result)
            assert result.stdout == b""
        rpc = await omp("--mode", "rpc", "@x.txt", cwd=tmp_path)
        assert rpc.returncode == 1
        assert rpc.stdout == b""
        assert fake.requests == []


# --- subcommands ---------------------------------------------------------------------------------


async def test_models_json_lists_what_has_credentials(tmp_path: Path,
                                                      isolated_agent_dir: Path) -> None:
    write_models_yml(isolated_agent_dir, "http://127.0.0.1:9",
                     model_fields={"reasoning": True, "maxTokens": 4096})
    result = await omp("models", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(b"\n") == 1
    assert json.loads(result.stdout) == {"models": [{
        "provider": "fake", "id": "fake-model", "selector": "fake/fake-model",
        "name": "fake-model", "contextWindow": 128000, "maxTokens": 4096, "reasoning": True,
        "thinking": ["minimal", "low", "medium", "high"], "input": ["text"],
        "cost": {"input": 0.0, "output": 0.0, "cacheRead": 0.0, "cacheWrite": 0.0},
        "credential": "notNeeded"}]}
    table = await omp("models", cwd=tmp_path)
    assert table.stdout.startswith(b"fake (1)\n")
    none = await omp("models", "nothing-like-this", "--json", cwd=tmp_path)
    assert json.loads(none.stdout) == {"models": []}
    find = await omp("models", "find", cwd=tmp_path)
    assert find.returncode == 1


async def test_subcommand_names_are_never_prompts(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    async with fake_provider([text_reply("one"), text_reply("two")], isolated_agent_dir) as fake:
        model = ["--model", "fake/fake-model", "--no-session"]
        # ``omp acp`` serves ACP on stdio (tests/test_acp.py); the word never reaches the model.
        initialize = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":' \
                     b'{"protocolVersion":1}}\n'
        for acp in (await omp(*model, "acp", cwd=tmp_path, stdin=initialize),
                    await omp("--approval-mode=yolo", *model, "acp", cwd=tmp_path,
                              stdin=initialize)):
            assert acp.returncode == 0, acp.stderr
            assert [x["result"]["protocolVersion"] for x in lines(acp.stdout)] == [1]
        commit = await omp(*model, "commit", "the", "changes", cwd=tmp_path)
        assert commit.returncode == 2
        assert "`omp commit` is not available" in one_line(commit)
        bare = await omp(*model, "list", cwd=tmp_path)
        assert bare.returncode == 1
        assert fake.requests == []
        as_prompt = await omp(*model, "-p", "models", cwd=tmp_path)
        after_dashes = await omp(*model, "--", "commit", cwd=tmp_path)
        assert (as_prompt.stdout, after_dashes.stdout) == (b"one\n", b"two\n")
        assert [user_text(fake, i) for i in (0, 1)] == ["models", "commit"]


# --- sessions ------------------------------------------------------------------------------------


async def test_resume_by_id_prefix_and_path(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    base = [*OFFLINE, "--session-dir", str(sessions), "--mode", "json"]
    first = lines((await omp(*base, "one", cwd=tmp_path)).stdout)[0]
    assert first["type"] == "session"
    sid = first["id"]
    for target in (sid, sid[:13], str(next(sessions.iterdir()))):
        resumed = await omp(*base, "-r", target, "again", cwd=tmp_path)
        assert resumed.returncode == 0, resumed.stderr
        frames = lines(resumed.stdout)
        assert frames[0] == first
        context = next(f for f in frames if f["type"] == "agent_end")
        assert context["messages"][0]["content"][0]["text"] == "again"
    second = lines((await omp(*base, "two", cwd=tmp_path)).stdout)[0]["id"]
    common = os.path.commonprefix([sid, second])  # noqa: RUF071 (ids, not paths)
    ambiguous = await omp(*base, "-r", common, "x", cwd=tmp_path)
    assert ambiguous.returncode == 1
    assert sid in ambiguous.stderr.decode()
    assert second in ambiguous.stderr.decode()
    unknown = await omp(*base, "-r", "ffffffff-no-such", "x", cwd=tmp_path)
    assert unknown.returncode == 1
    assert one_line(unknown).startswith('omp: Session "ffffffff-no-such" not found')
    assert sid in unknown.stderr.decode()  # the candidates are listed
    assert ambiguous.stdout == unknown.stdout == b""
    cont = await omp(*base, "-c", "more", cwd=tmp_path)
    assert lines(cont.stdout)[0]["id"] == second
    by_uuid = await omp(*base, "-c", sid, "more", cwd=tmp_path)  # -c <uuid> resumes it
    assert lines(by_uuid.stdout)[0]["id"] == sid
    no_session = await omp(*OFFLINE, "--no-session", "-r", sid, "x", cwd=tmp_path)
    assert no_session.returncode == 1
    assert one_line(no_session) == "omp: --resume requires session persistence"


async def test_export_writes_html(tmp_path: Path) -> None:
    sessions = tmp_path / "sessions"
    await omp(*OFFLINE, "--session-dir", str(sessions), "-p", "hello", cwd=tmp_path)
    session = next(sessions.iterdir())
    result = await omp("--export", str(session), "out.html", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"Exported to: out.html\n"
    assert "Echo: hello" in (tmp_path / "out.html").read_text()


# --- --mode json ---------------------------------------------------------------------------------


async def test_json_mode_writes_what_the_original_writes(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    deltas = [f"w{i} " for i in range(1200)]
    async with fake_provider([text_reply(*deltas), text_reply("second")], isolated_agent_dir):
        result = await omp("--model", "fake/fake-model", "--no-session", "--mode", "json",
                           "first", "then", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout) < 300_000
    frames = lines(result.stdout)
    header = frames[0]
    assert list(header) == ["type", "version", "id", "timestamp", "cwd"]
    assert (header["type"], header["version"], header["cwd"]) == ("session", 3, str(tmp_path))
    types = [f["type"] for f in frames]
    assert "prompt_result" not in types
    assert "session_settled" not in types
    assert "ready" not in types
    assert "response" not in types
    assert types.count("agent_start") == types.count("agent_end") == 2  # two messages, two runs
    updates = [f for f in frames if f["type"] == "message_update"]
    assert all(set(u) == {"type", "assistantMessageEvent"} for u in updates)
    assert all("partial" not in u["assistantMessageEvent"] for u in updates)
    text = "".join(u["assistantMessageEvent"].get("delta", "") for u in updates)
    assert text == "".join(deltas) + "second"
    assert all("messageId" not in f for f in frames)


async def test_json_mode_exit_code_follows_the_last_answer(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    failing = {"status": 400, "body": {"error": {"message": "bad thing"}}}
    async with fake_provider([failing], isolated_agent_dir):
        result = await omp("--model", "fake/fake-model", "--no-session", "--mode", "json", "x",
                           cwd=tmp_path)
    assert result.returncode == 1
    frames = lines(result.stdout)
    assert frames[0]["type"] == "session"
    end = [f for f in frames if f["type"] == "message_end"][-1]["message"]
    assert end["stopReason"] == "error"


async def test_a_stalled_stream_is_said_on_stderr(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    async with fake_provider([text_reply("a", 2.5, "b")], isolated_agent_dir):
        result = await omp("--model", "fake/fake-model", "--no-session", "-p", "x",
                           cwd=tmp_path,
                           env={**os.environ, "OMP_STALL_NOTICE_SECONDS": "1"})
    assert result.returncode == 0
    assert result.stdout == b"ab\n"
    assert "omp: waiting for the model fake/fake-model: nothing for" in result.stderr.decode()
    help_ = await omp("--help", cwd=tmp_path)
    assert b"100 s" in help_.stdout
    assert b"120 s" in help_.stdout


# --- slash commands in the one-shot modes ------------------------------------------------------


async def test_one_shot_prompts_go_through_the_slash_commands(tmp_path: Path,
                                                              isolated_agent_dir: Path) -> None:
    """``-p`` takes each message as an rpc ``prompt`` does: ``/usage`` (a built-in of the
    original that is not here) and ``/model`` (one that is) never reach the model and say what
    they say before the answer; a project file command is expanded before it is sent."""
    commands = tmp_path / ".omp" / "commands"
    commands.mkdir(parents=True)
    (commands / "greet.md").write_text("Say hello to $ARGUMENTS.\n")
    async with fake_provider([text_reply("hello bob")], isolated_agent_dir) as fake:
        result = await omp("--model", "fake/fake-model", "--no-session", "-p", "/usage",
                           "/model", "/greet bob", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.decode().splitlines() == [
            "/usage is not available in this version.", "Current model: fake/fake-model",
            "hello bob"]
        assert len(fake.requests) == 1  # the file command only
        assert user_text(fake) == "Say hello to bob."


async def test_json_mode_writes_a_slash_commands_output_as_a_line(tmp_path: Path) -> None:
    result = await omp(*OFFLINE, "--no-session", "--mode", "json", "/stats", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    frames = lines(result.stdout)
    assert [f["type"] for f in frames] == ["session", "command_output"]
    assert frames[1]["text"] == "/stats is not available in this version."
