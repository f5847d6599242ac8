"""omp/commands/frontmatter.py and files.py: markdown frontmatter, file commands
(``commands/*.md``) and prompt templates (``prompts/**/*.md``) found in real directories
(docs/design/extending.md#file-commands, docs/design/extending.md#prompt-templates)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from omp.commands import (
    FileCommand,
    Problem,
    ReportOnce,
    expand_file_command,
    expand_prompt_template,
    find_prompt_template,
    load_file_commands,
    load_prompt_templates,
    parse_frontmatter,
    strip_frontmatter,
)

MD = Path("/x/cmd.md")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- frontmatter ----------------------------------------------------------------------------


def test_frontmatter_and_body() -> None:
    parsed = parse_frontmatter(
        '---\ndescription: Write a conventional commit message\nargument-hint: "<scope> [notes]"'
        "\n---\nWrite a commit message for scope $1. Extra notes: $@[2]\n", MD)
    assert parsed.fields == {"description": "Write a conventional commit message",
                             "argumentHint": "<scope> [notes]"}
    assert parsed.body == "Write a commit message for scope $1. Extra notes: $@[2]"
    assert parsed.problem is None


def test_keys_become_camel_case_at_every_depth() -> None:
    parsed = parse_frontmatter("---\ndisable-model-invocation: true\nnested:\n  some-key:"
                               " [{inner-key: 1}]\nsnake_case: x\n---\n", MD)
    assert parsed.fields == {"disableModelInvocation": True,
                             "nested": {"someKey": [{"innerKey": 1}]}, "snake_case": "x"}


@pytest.mark.parametrize("text", [
    "no frontmatter\n\nat all\n",
    "--- not a delimiter\nx\n---\n",
    "---\nnever: closed\n",
    "\n---\na: b\n---\nleading blank line\n",
])
def test_without_frontmatter_the_body_is_the_whole_text(text: str) -> None:
    parsed = parse_frontmatter(text, MD)
    assert parsed.fields == {}
    assert parsed.body == text
    assert parsed.problem is None


def test_line_endings_and_html_comments() -> None:
    text = "---\r\n<!-- a: hidden -->\r\ndescription: shown\r\n---\r\nbody <!-- note -->line\r\n"
    parsed = parse_frontmatter(text, MD)
    assert parsed.fields == {"description": "shown"}
    assert parsed.body == "body line"


def test_empty_frontmatter_and_tabs() -> None:
    assert parse_frontmatter("---\n---\nbody", MD).fields == {}
    assert parse_frontmatter("---\nouter:\n\tinner: 1\n---\n", MD).fields == {
        "outer": {"inner": 1}}


def test_a_colon_in_a_plain_value_is_read_as_the_original_reads_it() -> None:
    # Not valid YAML as written; quoted again silently, no problem reported.
    parsed = parse_frontmatter("---\ndescription: Fix: the parser\nname: x\n---\nbody", MD)
    assert parsed.fields == {"description": "Fix: the parser", "name": "x"}
    assert parsed.problem is None


def test_broken_yaml_is_a_problem_and_plain_lines_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "broken.md"
    parsed = parse_frontmatter("---\ndescription: fine\nlist: [unclosed\nargument-hint: <x>\n"
                               "---\nbody\n", path)
    assert parsed.fields == {"description": "fine", "list": "[unclosed", "argumentHint": "<x>"}
    assert parsed.body == "body"
    assert parsed.problem is not None
    assert parsed.problem.path == path
    # The line is the file's line (the YAML starts on line 2).
    assert str(parsed.problem).startswith(
        f"{path}: broken frontmatter, read as plain `key: value` lines: not valid YAML (line 4,")


def test_frontmatter_that_is_not_a_mapping_is_a_problem() -> None:
    parsed = parse_frontmatter("---\n- a\n- b\n---\nbody", MD)
    assert parsed.fields == {}
    assert parsed.body == "body"
    assert parsed.problem == Problem(
        MD, "broken frontmatter, read as plain `key: value` lines: expected a mapping of keys "
            "to values, got list")


def test_strip_frontmatter_keeps_comments() -> None:
    assert strip_frontmatter("---\nname: x\n---\n\n# Title <!-- c -->\n\n") == "# Title <!-- c -->"
    assert strip_frontmatter("\r\n  no frontmatter  \r\n") == "no frontmatter"
    assert strip_frontmatter("---\nunclosed\n") == "---\nunclosed"


# --- file commands: where they come from ----------------------------------------------------


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(agent dir, home, cwd): a repository at home/repo, the session in repo/sub."""
    home = tmp_path / "home"
    (home / "repo" / ".git").mkdir(parents=True)
    cwd = home / "repo" / "sub"
    cwd.mkdir()
    return tmp_path / "agent", home, cwd


def names(commands: list[FileCommand]) -> list[str]:
    return [command.name for command in commands]


def test_nothing_but_init(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    commands, problems = load_file_commands(agent, cwd, home=home)
    assert problems == []
    assert names(commands) == ["init"]
    # The list entry exactly as the spec's observed default list shows it.
    assert msgspec.to_builtins(commands[0].available_command()) == {
        "name": "init", "description": "Generate AGENTS.md for current codebase",
        "source": "file"}
    assert commands[0].path is None
    assert "AGENTS.md" in commands[0].expand("")


def test_order_and_precedence(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    write(cwd / ".omp" / "commands" / "common.md", "project wins")
    write(cwd / ".omp" / "commands" / "zeta.md", "z")
    write(cwd / ".omp" / "commands" / "alpha.md", "a")
    write(agent / "commands" / "common.md", "user loses")
    write(agent / "commands" / "user-only.md", "u")
    write(cwd / ".claude" / "commands" / "common.md", "claude loses")
    write(cwd / ".claude" / "commands" / "claude-top.md", "c")
    write(cwd / ".claude" / "commands" / "git" / "pr.md", "nested")
    write(cwd / ".claude" / "commands" / "git" / "deep" / "log.md", "deeper")
    write(cwd / ".agents" / "commands" / "near.md", "closest .agents")
    write(home / "repo" / ".agent" / "commands" / "near.md", "farther loses")
    write(home / "repo" / ".agent" / "commands" / "far.md", "repo root")
    write(home / ".agent" / "commands" / "mine.md", "user .agent")
    write(home / ".agents" / "commands" / "init.md", "my own init")
    commands, problems = load_file_commands(agent, cwd, home=home)
    assert problems == []
    assert names(commands) == [
        "alpha", "common", "zeta",  # <cwd>/.omp/commands, by name
        "user-only",  # <agentDir>/commands
        "claude-top", "pr", "log", "git:pr", "git:deep:log",  # .claude: top, nested, a:b names
        "near", "far",  # .agents in the cwd, then .agent at the repository root
        "mine", "init",  # ~/.agent, ~/.agents: a file named init replaces the built-in one
    ]
    by_name = {command.name: command for command in commands}
    assert by_name["common"].body == "project wins"
    assert by_name["common"].source == "native:project"
    assert by_name["user-only"].source == "native:user"
    assert by_name["git:pr"].body == by_name["pr"].body == "nested"
    assert by_name["git:pr"].source == "claude:project"
    assert by_name["near"].body == "closest .agents"
    assert by_name["mine"].source == "agents:user"
    assert by_name["init"].body == "my own init"
    assert by_name["init"].path == home / ".agents" / "commands" / "init.md"


def test_the_project_walk_stops_at_the_repository_root_or_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    agent = tmp_path / "agent"
    (home / "work" / "repo" / ".git").mkdir(parents=True)
    write(home / "work" / ".agent" / "commands" / "above-repo.md", "not a project directory")
    write(home / "work" / "repo" / ".agent" / "commands" / "root.md", "repository root")
    write(home / ".agent" / "commands" / "user.md", "user level")
    write(tmp_path / ".agent" / "commands" / "above-home.md", "never read")
    commands, _ = load_file_commands(agent, home / "work" / "repo" / "a" / "b", home=home)
    assert [(c.name, c.source) for c in commands] == [
        ("root", "agents:project"), ("user", "agents:user"), ("init", "builtin")]
    # Without a repository the walk goes up to home; home itself is the user level.
    (home / "plain" / "sub").mkdir(parents=True)
    write(home / "plain" / ".agents" / "commands" / "plain.md", "project")
    commands, _ = load_file_commands(agent, home / "plain" / "sub", home=home)
    assert [(c.name, c.source) for c in commands] == [
        ("plain", "agents:project"), ("user", "agents:user"), ("init", "builtin")]


def test_native_commands_are_not_recursive_and_skip_what_is_not_a_command(
        layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    directory = cwd / ".omp" / "commands"
    write(directory / "ok.md", "ok")
    write(directory / "sub" / "nested.md", "not read: native commands are one level")
    write(directory / ".hidden.md", "hidden")
    write(directory / "notes.txt", "not markdown")
    (directory / "folder.md").mkdir()
    commands, problems = load_file_commands(agent, cwd, home=home)
    assert names(commands) == ["ok", "init"]
    assert problems == []


def test_description_and_argument_hint(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    directory = cwd / ".omp" / "commands"
    write(directory / "commit.md", '---\ndescription: "  Write a commit message  "\n'
                                   'argument-hint: "<scope> [notes]"\n---\nBody line\n')
    write(directory / "camel.md", "---\nargumentHint: <file>\n---\nReview $1\n")
    write(directory / "long.md", "\n\n   " + "x" * 70 + "\nsecond line\n")
    write(directory / "sixty.md", "y" * 60)
    write(directory / "empty.md", "")
    write(directory / "blank-description.md", "---\ndescription: '   '\n---\nFrom the body\n")
    commands, _ = load_file_commands(agent, cwd, home=home)
    entries = {c.name: msgspec.to_builtins(c.available_command()) for c in commands}
    assert entries["commit"] == {"name": "commit", "source": "file",
                                 "description": "Write a commit message",
                                 "input": {"hint": "<scope> [notes]"}}
    assert entries["camel"] == {"name": "camel", "source": "file", "description": "Review $1",
                                "input": {"hint": "<file>"}}
    # The first non-blank line as it is (indent included), cut to 60 characters.
    assert entries["long"]["description"] == "   " + "x" * 57 + "..."
    assert entries["sixty"]["description"] == "y" * 60
    assert entries["empty"] == {"name": "empty", "source": "file"}
    assert entries["blank-description"]["description"] == "From the body"


def test_files_are_read_again_on_every_call(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    path = write(cwd / ".omp" / "commands" / "fix.md", "---\ndescription: first\n---\nv1")
    commands, _ = load_file_commands(agent, cwd, home=home)
    assert (commands[0].description, commands[0].body) == ("first", "v1")
    write(path, "---\ndescription: second\n---\nv2")
    write(agent / "commands" / "new.md", "added later")
    commands, _ = load_file_commands(agent, cwd, home=home)
    assert (commands[0].description, commands[0].body) == ("second", "v2")
    assert names(commands) == ["fix", "new", "init"]


def test_broken_files_are_reported_and_the_rest_loads(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    directory = cwd / ".omp" / "commands"
    write(directory / "good.md", "fine")
    broken = write(directory / "broken.md", "---\ndescription: [oops\n---\nStill works $1\n")
    latin1 = directory / "latin1.md"
    latin1.write_bytes(b"caf\xe9\n")
    dangling = directory / "gone.md"
    os.symlink(directory / "missing-target.md", dangling)
    commands, problems = load_file_commands(agent, cwd, home=home)
    assert names(commands) == ["broken", "good", "init"]
    broken_command = commands[0]
    assert broken_command.description == "[oops"
    assert broken_command.expand("x") == "Still works x"
    assert [p.path for p in problems] == [broken, dangling, latin1]
    assert problems[0].message.startswith("broken frontmatter, read as plain `key: value` lines:")
    assert "cannot be read" in problems[1].message
    assert problems[2].message.startswith("not UTF-8 text (byte 0xe9 on line 1)")
    assert str(problems[2]).startswith(f"{latin1}: not UTF-8 text")


def test_problems_are_shown_once(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    write(cwd / ".omp" / "commands" / "broken.md", "---\na: [\n---\n")
    report = ReportOnce()
    _, problems = load_file_commands(agent, cwd, home=home)
    assert len(report.new(problems)) == 1
    _, problems = load_file_commands(agent, cwd, home=home)
    assert len(problems) == 1  # found again on every read …
    assert report.new(problems) == []  # … shown once
    write(cwd / ".omp" / "commands" / "broken.md", "---\nok: 1\nb: [\n---\n")
    _, problems = load_file_commands(agent, cwd, home=home)
    assert len(report.new(problems)) == 1  # a different mistake is news


def test_expand_file_command(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    write(cwd / ".omp" / "commands" / "commit.md",
          "---\ndescription: Commit\n---\nWrite a commit message for scope $1. "
          "Extra notes: $@[2]\n")
    write(cwd / ".omp" / "commands" / "plain.md", "Summarise the diff")
    commands, _ = load_file_commands(agent, cwd, home=home)
    assert expand_file_command('/commit parser "keep it" short', commands) == (
        "Write a commit message for scope parser. Extra notes: keep it short")
    assert expand_file_command("/plain quickly", commands) == "Summarise the diff\n\nquickly"
    assert expand_file_command("/plain", commands) == "Summarise the diff"
    assert expand_file_command("/unknown x", commands) is None
    assert expand_file_command("commit x", commands) is None
    assert expand_file_command("/commit\tx", commands) is None  # the name ends at a space only


# --- prompt templates -----------------------------------------------------------------------


def test_prompt_templates(layout: tuple[Path, Path, Path]) -> None:
    agent, _, cwd = layout
    write(agent / "prompts" / "common.md", "---\ndescription: user version\n---\nUser $1")
    write(agent / "prompts" / "deep" / "er" / "nested.md", "Nested $@")
    write(agent / "prompts" / ".hidden.md", "hidden")
    write(cwd / ".omp" / "prompts" / "common.md", "Project version")
    write(cwd / ".omp" / "prompts" / "review" / "file.md", "Review $1 focusing on $@[2]")
    write(cwd / ".omp" / "prompts" / "notes.txt", "not a template")
    templates, problems = load_prompt_templates(agent, cwd)
    assert problems == []
    assert [(t.name, t.source) for t in templates] == [
        ("common", "(user)"), ("nested", "(user:deep:er)"),
        ("common", "(project)"), ("file", "(project:review)")]
    assert templates[0].description == "user version (user)"
    assert templates[1].description == "Nested $@ (user:deep:er)"
    # The first of a name wins: a user template shadows the project's.
    common = find_prompt_template(templates, "common")
    assert common is not None
    assert common.body == "User $1"
    assert expand_prompt_template("/common a b", templates) == "User a"
    assert expand_prompt_template('/file src/a.py "error handling" perf', templates) == (
        "Review src/a.py focusing on error handling perf")
    assert expand_prompt_template("/nested x y", templates) == "Nested x y"
    assert expand_prompt_template("/notes x", templates) is None
    assert expand_prompt_template("common x", templates) is None


def test_prompt_templates_report_unreadable_files(layout: tuple[Path, Path, Path]) -> None:
    agent, _, cwd = layout
    (agent / "prompts").mkdir(parents=True)
    (agent / "prompts" / "bad.md").write_bytes(b"\xff\xfe")
    write(agent / "prompts" / "good.md", "good")
    templates, problems = load_prompt_templates(agent, cwd)
    assert [t.name for t in templates] == ["good"]
    assert [p.path for p in problems] == [agent / "prompts" / "bad.md"]
