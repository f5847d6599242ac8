"""The system prompt: the tool block, the project-context block, and prompt arguments from files."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from omp.session.system_prompt import (
    CONTEXT_FILE_MAX_BYTES,
    build_system_prompt,
    load_prompt_arg,
    looks_like_a_path,
)
from omp.tools.base import OnUpdate, Tool, ToolResult

TODAY = datetime.date(2025, 3, 7)


@attrs.frozen
class ReadTool(Tool):
    name: str = "read"
    label: str = "Read"
    description: str = "Read file contents\n\nText files come back with line numbers."
    parameters: dict[str, Any] = attrs.field(factory=lambda: {"type": "object"})

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        return ToolResult.text("contents")


@attrs.frozen
class BashTool(Tool):
    name: str = "bash"
    label: str = "Bash"
    description: str = "  Execute bash commands (ls, grep, find, etc.)  \nOutput is truncated."
    parameters: dict[str, Any] = attrs.field(factory=lambda: {"type": "object"})

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        return ToolResult.text("")


TOOLS: list[Tool] = [ReadTool(), BashTool()]

MAIN_BLOCK = """\
You are omp, an expert coding agent. A host program drives you over RPC and shows the user what \
you do; you work in the user's repository through the tools below.

Available tools:
- read: Read file contents
- bash: Execute bash commands (ls, grep, find, etc.)

Guidelines:
- Use bash for exploring files (ls, rg, find)
- Use read to look at files, not cat or sed through bash
- Be concise
- Show file paths clearly when you talk about files
- When you are done, summarise what you did in plain text"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A directory with no context file above it, so expected texts are exact."""
    for directory in tmp_path.parents:
        for name in ("AGENTS.md", "CLAUDE.md"):
            if (directory / name).exists():
                pytest.skip(f"{directory / name} exists above the test directory")
    return tmp_path


@pytest.fixture
def chain(base: Path) -> tuple[Path, Path]:
    """(agent dir, cwd): context files at several levels of base/a/b/c."""
    agent = base / "agent"
    _write(agent / "CLAUDE.md", "global claude\n")
    _write(base / "AGENTS.md", "top rules\n")
    _write(base / "a" / "CLAUDE.md", "\n\na rules\nsecond line\n\n")
    _write(base / "a" / "b" / "AGENTS.md", "b agents")
    _write(base / "a" / "b" / "CLAUDE.md", "b claude (never read)")
    cwd = base / "a" / "b" / "c"
    cwd.mkdir()
    return agent, cwd


def test_blocks_for_a_small_tool_set_without_context_files(base: Path) -> None:
    cwd = base / "work"
    cwd.mkdir()
    blocks = build_system_prompt(tools=TOOLS, cwd=cwd, agent_directory=base / "agent",
                                 today=TODAY)
    assert blocks == [
        MAIN_BLOCK,
        f"Current date: 2025-03-07\nCurrent working directory: {cwd}",
    ]


def test_context_files_from_the_global_one_then_root_down_to_cwd(chain: tuple[Path, Path],
                                                                  base: Path) -> None:
    agent, cwd = chain
    blocks = build_system_prompt(tools=TOOLS, cwd=cwd, agent_directory=agent, today=TODAY)
    assert blocks[0] == MAIN_BLOCK
    assert blocks[1] == f"""\
# Project Context

Project-specific instructions and guidelines:

## {agent}/CLAUDE.md

global claude

## {base}/AGENTS.md

top rules

## {base}/a/CLAUDE.md

a rules
second line

## {base}/a/b/AGENTS.md

b agents

Current date: 2025-03-07
Current working directory: {cwd}"""


def test_global_agents_md_wins_over_claude_md(chain: tuple[Path, Path]) -> None:
    agent, cwd = chain
    _write(agent / "AGENTS.md", "global agents")
    block = build_system_prompt(tools=TOOLS, cwd=cwd, agent_directory=agent, today=TODAY)[1]
    assert f"## {agent}/AGENTS.md\n\nglobal agents\n\n## " in block
    assert "global claude" not in block


def test_cwd_equal_to_agent_dir_lists_its_file_once(base: Path) -> None:
    agent = base / "agent"
    _write(agent / "AGENTS.md", "only once")
    block = build_system_prompt(tools=TOOLS, cwd=agent, agent_directory=agent, today=TODAY)[1]
    assert block == f"""\
# Project Context

Project-specific instructions and guidelines:

## {agent}/AGENTS.md

only once

Current date: 2025-03-07
Current working directory: {agent}"""


def test_the_same_file_through_a_symlink_is_listed_once(base: Path) -> None:
    agent = base / "agent"
    _write(agent / "AGENTS.md", "only once")
    link = base / "link"
    link.symlink_to(agent, target_is_directory=True)
    block = build_system_prompt(tools=TOOLS, cwd=link, agent_directory=agent, today=TODAY)[1]
    assert block.count("only once") == 1
    assert f"## {link}/AGENTS.md" not in block


def test_custom_prompt_replaces_the_main_block_only(chain: tuple[Path, Path]) -> None:
    agent, cwd = chain
    default = build_system_prompt(tools=TOOLS, cwd=cwd, agent_directory=agent, today=TODAY)
    custom = build_system_prompt(tools=TOOLS, cwd=cwd, agent_directory=agent, today=TODAY,
                                 custom="You are a pirate.")
    assert custom == ["You are a pirate.", default[1]]


def test_append_goes_after_the_context_files_and_before_the_date(
        chain: tuple[Path, Path]) -> None:
    agent, cwd = chain
    block = build_system_prompt(tools=TOOLS, cwd=cwd, agent_directory=agent, today=TODAY,
                                append="\nAlways answer in French.\n")[1]
    assert block.endswith(f"\n\n## {cwd.parent}/AGENTS.md\n\nb agents\n\n"
                          "Always answer in French.\n\n"
                          f"Current date: 2025-03-07\nCurrent working directory: {cwd}")


def test_append_and_model_without_context_files(base: Path) -> None:
    blocks = build_system_prompt(tools=[], cwd=base, agent_directory=base / "agent",
                                 today=TODAY, append="Extra.", model_name="Claude Sonnet 4.5")
    assert blocks[1] == ("Extra.\n\nCurrent date: 2025-03-07\n"
                         f"Current working directory: {base}\nModel: Claude Sonnet 4.5")
    assert "Available tools:\n(none)\n\n" in blocks[0]


def test_date_defaults_to_today(base: Path) -> None:
    before = datetime.date.today()
    block = build_system_prompt(tools=TOOLS, cwd=base, agent_directory=base / "agent")[1]
    after = datetime.date.today()
    assert block.splitlines()[0] in {f"Current date: {before.isoformat()}",
                                     f"Current date: {after.isoformat()}"}


def test_guidelines_follow_the_tool_set(base: Path) -> None:
    tools: list[Tool] = [ReadTool(), BashTool(), ReadTool(name="edit", description=""),
                         ReadTool(name="write", description="Create or overwrite files"),
                         ReadTool(name="grep", description="Search"),
                         ReadTool(name="ls", description="List")]
    main = build_system_prompt(tools=tools, cwd=base, agent_directory=base / "agent",
                               today=TODAY)[0]
    assert main.split("\n\n", 1)[1] == """\
Available tools:
- read: Read file contents
- bash: Execute bash commands (ls, grep, find, etc.)
- edit
- write: Create or overwrite files
- grep: Search
- ls: List

Guidelines:
- Prefer the grep and ls tools over bash for exploring files and searching code
- Use read to look at files, not cat or sed through bash
- Read a file before you edit it
- Use edit for precise changes: the old text must match the file exactly, whitespace included
- Use write only for new files or complete rewrites
- Be concise
- Show file paths clearly when you talk about files
- When you are done, summarise what you did in plain text"""
    only_find = build_system_prompt(tools=[BashTool(), ReadTool(name="find")], cwd=base,
                                    agent_directory=base / "agent", today=TODAY)[0]
    assert "- Prefer the find tool over bash for exploring files and searching code\n" in only_find
    assert "Use read" not in only_find


def test_a_file_over_64_kib_is_cut_with_a_note(base: Path) -> None:
    line = "x" * 99 + "\n"
    big = _write(base / "AGENTS.md", line * 700)  # 70_000 bytes
    block = build_system_prompt(tools=TOOLS, cwd=base, agent_directory=base / "agent",
                                today=TODAY)[1]
    body = block.split(f"## {big}\n\n", 1)[1].split("\n\nCurrent date:", 1)[0]
    kept, note = body.rsplit("\n\n", 1)
    assert kept == (line * (CONTEXT_FILE_MAX_BYTES // 100)).rstrip("\n")  # whole lines only
    assert note == f"[{big} is 70000 bytes; only its first 64 KiB are included here.]"


def test_a_cut_never_splits_a_character(base: Path) -> None:
    big = _write(base / "AGENTS.md", "é" * 40_000)  # one line, 80_000 bytes
    block = build_system_prompt(tools=TOOLS, cwd=base, agent_directory=base / "agent",
                                today=TODAY)[1]
    assert f"\n\n{'é' * (CONTEXT_FILE_MAX_BYTES // 2)}\n\n[{big} is 80000 bytes; " in block
    assert "\ufffd" not in block


def test_a_file_of_exactly_64_kib_is_whole(base: Path) -> None:
    _write(base / "AGENTS.md", "y" * CONTEXT_FILE_MAX_BYTES)
    block = build_system_prompt(tools=TOOLS, cwd=base, agent_directory=base / "agent",
                                today=TODAY)[1]
    assert f"\n\n{'y' * CONTEXT_FILE_MAX_BYTES}\n\nCurrent date:" in block
    assert "KiB" not in block


def test_unreadable_context_files_are_skipped(base: Path) -> None:
    (base / "AGENTS.md").mkdir()  # a directory: cannot be read, so CLAUDE.md is used
    _write(base / "CLAUDE.md", "claude here")
    (base / "a").mkdir()
    (base / "a" / "AGENTS.md").symlink_to(base / "missing")  # dangling
    (base / "a" / "b").mkdir()
    (base / "a" / "b" / "AGENTS.md").write_bytes(b"bad \xff byte")
    cwd = base / "a" / "b"
    block = build_system_prompt(tools=TOOLS, cwd=cwd, agent_directory=base / "agent",
                                today=TODAY)[1]
    assert block == f"""\
# Project Context

Project-specific instructions and guidelines:

## {base}/CLAUDE.md

claude here

## {cwd}/AGENTS.md

bad \ufffd byte

Current date: 2025-03-07
Current working directory: {cwd}"""


def test_load_prompt_arg_reads_a_file_or_returns_the_text(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path / "prompts" / "sys.md", "From a file.\n")
    _write(tmp_path / "SYSTEM", "No suffix.")
    home = tmp_path / "home"
    _write(home / "mine.md", "From home.")
    monkeypatch.setenv("HOME", str(home))

    assert load_prompt_arg("prompts/sys.md", tmp_path) == "From a file.\n"
    assert load_prompt_arg(str(tmp_path / "prompts" / "sys.md"), home) == "From a file.\n"
    assert load_prompt_arg("~/mine.md", tmp_path) == "From home."
    assert load_prompt_arg("SYSTEM", tmp_path) == "No suffix."
    assert load_prompt_arg("You are terse.", tmp_path) == "You are terse."
    assert load_prompt_arg("prompts", tmp_path) == "prompts"  # one word, a directory: text
    long_text = "Be careful. " * 1000  # longer than any file name may be
    assert load_prompt_arg(long_text, tmp_path) == long_text
    assert load_prompt_arg("nul\x00byte", tmp_path) == "nul\x00byte"


@pytest.mark.parametrize("text", [
    "Be terse.", "terse", "Follow STYLE.md when you edit.", "Answer in English/French please.",
    "Line one/\nline two.md", "Use ~ for home", "notes.md\x00"])
def test_prompt_text_that_names_no_file_is_the_prompt(tmp_path: Path, text: str) -> None:
    assert looks_like_a_path(text) is False
    assert load_prompt_arg(text, tmp_path) == text


@pytest.mark.parametrize(("value", "named"), [
    ("prompts/sytem.md", "{cwd}/prompts/sytem.md"),
    ("sytem.md", "{cwd}/sytem.md"),
    ("SYSTEM.TXT", "{cwd}/SYSTEM.TXT"),
    ("./prompt", "{cwd}/prompt"),
    ("../elsewhere/prompt", "{cwd}/../elsewhere/prompt"),
    ("/nonexistent/dir/prompt file.md", "/nonexistent/dir/prompt file.md"),
    ("~/missing.prompt", "{home}/missing.prompt"),
    ("prompts/", "{cwd}/prompts"),
    ("~no-such-user-here/x.md", "~no-such-user-here/x.md"),
])
def test_a_path_that_names_no_file_is_an_error_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, named: str) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "prompts").mkdir(parents=True)
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    assert looks_like_a_path(value) is True
    with pytest.raises(OSError, match=r"^\[Errno \d+\] ") as caught:
        load_prompt_arg(value, cwd)
    assert caught.value.filename == named.format(cwd=cwd, home=home)
    assert "\n" not in str(caught.value)


def test_a_path_to_something_not_a_regular_file_is_an_error(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.md")
    with pytest.raises(OSError, match="Not a regular file") as caught:
        load_prompt_arg("fifo.md", tmp_path)  # reading it would block until a writer comes
    assert caught.value.filename == str(tmp_path / "fifo.md")


def _omp(*args: str, cwd: Path, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "omp", "--model", "offline/echo", *args],
                          cwd=cwd, input=stdin, capture_output=True, timeout=60, check=False)


def test_cli_refuses_a_mistyped_prompt_file_in_one_line(tmp_path: Path) -> None:
    _write(tmp_path / "prompts" / "system.md", "Answer in French.")
    for option in ("--system-prompt", "--append-system-prompt"):
        done = _omp(option, "prompts/sytem.md", "-p", "hello", cwd=tmp_path)
        assert done.returncode == 1, done
        assert done.stdout == b""
        lines = done.stderr.decode().splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("omp: ")
        assert str(tmp_path / "prompts" / "sytem.md") in lines[0]


def test_cli_takes_plain_text_and_existing_files(tmp_path: Path) -> None:
    _write(tmp_path / "prompts" / "system.md", "Answer in French.")
    for value, expected in [("prompts/system.md", "Answer in French."),
                            ("You are terse.", "You are terse.")]:
        done = _omp("--mode", "rpc", "--no-session", "--system-prompt", value, cwd=tmp_path,
                    stdin=b'{"type":"get_state","id":"s"}\n')
        assert (done.returncode, done.stderr) == (0, b"")
        [state] = [frame for frame in map(json.loads, done.stdout.splitlines())
                   if frame.get("id") == "s"]
        assert state["data"]["systemPrompt"][0] == expected
