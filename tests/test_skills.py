"""omp/commands/skills.py: skills found in real directories, the listing offered to the model,
``/skill:<name>`` parsing, the ``skill-prompt`` message and ``skill://`` paths
(docs/design/extending.md#skills)."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from omp.commands import (
    SKILL_URI_LINE,
    Skill,
    SkillInvocation,
    SkillSettings,
    SkillUriError,
    find_skill,
    load_skills,
    parse_skill_invocation,
    resolve_skill_uri,
    skill_message,
    skills_prompt,
)
from omp.config import ConfigError
from omp.protocol.messages import CustomMessage, ImageContent, TextContent

PDF_SKILL = """\
---
name: pdf-tools
description: Extract text and tables from PDF files; use when the user mentions PDFs.
hide: false
---
# PDF tools
Run `scripts/extract.py <file>` …
"""


def skill(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "SKILL.md"
    path.write_text(text, encoding="utf-8")
    return path


def described(description: str, name: str | None = None) -> str:
    name_line = f"name: {name}\n" if name is not None else ""
    return f"---\n{name_line}description: {description}\n---\nInstructions for {description}\n"


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(agent dir, home, cwd): a repository at home/repo, the session in repo/a/b."""
    home = tmp_path / "home"
    (home / "repo" / ".git").mkdir(parents=True)
    cwd = home / "repo" / "a" / "b"
    cwd.mkdir(parents=True)
    return tmp_path / "agent", home, cwd


def sources(skills: list[Skill]) -> list[tuple[str, str, str]]:
    return [(s.name, s.description, s.source) for s in skills]


# --- discovery ------------------------------------------------------------------------------


def test_no_skills(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    assert load_skills(agent, cwd, home=home) == ([], [])


def test_where_skills_are_found_and_who_wins(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    repo = home / "repo"
    # The same name everywhere: the closest .omp/skills wins.
    skill(cwd / ".omp" / "skills" / "same", described("cwd .omp", "same"))
    skill(repo / "a" / ".omp" / "skills" / "same", described("parent .omp", "same"))
    skill(agent / "skills" / "same", described("agent dir", "same"))
    skill(cwd / ".claude" / "skills" / "same", described("claude", "same"))
    skill(cwd / ".agents" / "skills" / "same", described("agents", "same"))
    # One name per place, to see every place is read.
    skill(repo / ".omp" / "skills" / "repo-omp", described("repo .omp"))
    skill(agent / "skills" / "user-omp", described("agent dir"))
    skill(repo / "a" / ".claude" / "skills" / "claude-up", described("claude up"))
    skill(cwd / ".agent" / "skills" / "agent-here", described("agent here"))
    skill(repo / ".agents" / "skills" / "agents-root", described("agents root"))
    skill(home / ".agents" / "skills" / "agents-user", described("agents user"))
    # Native beats claude beats agents for one name found in several of them.
    skill(agent / "skills" / "order", described("native user", "order"))
    skill(cwd / ".claude" / "skills" / "order", described("claude project", "order"))
    skill(cwd / ".agent" / "skills" / "order2", described("agents project", "order2"))
    skill(repo / ".claude" / "skills" / "order2", described("claude at the root", "order2"))
    skills, problems = load_skills(agent, cwd, home=home)
    assert sources(skills) == [
        ("agent-here", "agent here", "agents:project"),
        ("agents-root", "agents root", "agents:project"),
        ("agents-user", "agents user", "agents:user"),
        ("claude-up", "claude up", "claude:project"),
        ("order", "native user", "native:user"),
        ("order2", "claude at the root", "claude:project"),
        ("repo-omp", "repo .omp", "native:project"),
        ("same", "cwd .omp", "native:project"),
        ("user-omp", "agent dir", "native:user"),
    ]
    same = find_skill(skills, "same")
    assert same is not None
    assert same.path == cwd / ".omp" / "skills" / "same" / "SKILL.md"
    assert same.base_dir == cwd / ".omp" / "skills" / "same"
    # Every loser is reported, in the words of the original.
    winner = cwd / ".omp" / "skills" / "same" / "SKILL.md"
    assert [str(p) for p in problems if "same" in p.message] == [
        f'{path}: name collision: "same" already loaded from {winner}, skipping this one'
        for path in (repo / "a" / ".omp" / "skills" / "same" / "SKILL.md",
                     agent / "skills" / "same" / "SKILL.md",
                     cwd / ".claude" / "skills" / "same" / "SKILL.md",
                     cwd / ".agents" / "skills" / "same" / "SKILL.md")]
    assert len(problems) == 6


def test_the_walk_stops_at_the_repository_root(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "work" / "repo" / ".git").mkdir(parents=True)
    skill(home / "work" / ".omp" / "skills" / "above", described("above the repository"))
    skill(home / "work" / ".claude" / "skills" / "above2", described("above the repository"))
    skill(home / "work" / "repo" / ".omp" / "skills" / "root", described("repository root"))
    skills, _ = load_skills(tmp_path / "agent", home / "work" / "repo", home=home)
    assert [s.name for s in skills] == ["root"]


def test_without_a_repository_the_walk_stops_at_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    cwd = home / "projects" / "p"
    cwd.mkdir(parents=True)
    skill(tmp_path / ".omp" / "skills" / "above-home", described("never"))
    skill(home / ".omp" / "skills" / "home-omp", described("home .omp is a project directory"))
    skill(home / ".claude" / "skills" / "home-claude", described("home is not a project here"))
    skill(home / "projects" / ".claude" / "skills" / "up", described("ancestor .claude"))
    skills, _ = load_skills(tmp_path / "agent", cwd, home=home)
    assert sources(skills) == [("home-omp", "home .omp is a project directory", "native:project"),
                               ("up", "ancestor .claude", "claude:project")]


def test_what_is_skipped_silently(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skills_dir = cwd / ".omp" / "skills"
    skill(skills_dir / "no-description", "---\nname: x\n---\nbody\n")
    skill(skills_dir / "empty-description", "---\ndescription: ''\n---\nbody\n")
    skill(skills_dir / "no-frontmatter", "# Just markdown\n")
    skill(skills_dir / "disabled", "---\ndescription: off\nenabled: false\n---\n")
    skill(skills_dir / "empty", "")
    skill(skills_dir / ".hidden", described("hidden directory"))
    (skills_dir / "no-skill-file").mkdir()
    (skills_dir / "SKILL.md").write_text(described("not inside a skill directory"))
    (skills_dir / "loose-file.md").write_text(described("a file, not a directory"))
    skill(skills_dir / "deep" / "nested", described("one level only"))
    skill(skills_dir / "kept", described("kept"))
    skills, problems = load_skills(agent, cwd, home=home)
    assert [s.name for s in skills] == ["kept"]
    assert problems == []


def test_names(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skills_dir = cwd / ".omp" / "skills"
    skill(skills_dir / "dir-name", described("named by its directory"))
    skill(skills_dir / "other", described("named in frontmatter", "  Frontmatter-Name  "))
    skill(skills_dir / "blank", "---\nname: '  '\ndescription: blank name\n---\n")
    skill(skills_dir / "number", "---\nname: 42\ndescription: not a text name\n---\n")
    spaced = skill(skills_dir / "spaced", described("bad", "two words"))
    slashed = skill(skills_dir / "slashed", described("bad", "a/b"))
    dir_spaced = skill(skills_dir / "dir with space", described("bad directory name"))
    skills, problems = load_skills(agent, cwd, home=home)
    assert [s.name for s in skills] == ["blank", "dir-name", "Frontmatter-Name", "number"]
    assert sorted(map(str, problems)) == sorted(
        f"{path}: skill name {name!r} has whitespace or '/' in it, so it could not be invoked "
        "as /skill:<name> nor read as skill://<name>; skill skipped"
        for path, name in ((spaced, "two words"), (slashed, "a/b"),
                           (dir_spaced, "dir with space")))


def test_sorted_case_insensitively(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    for name in ("beta", "Alpha", "alpha2", "Gamma", "delta"):
        skill(agent / "skills" / name, described(name))
    skills, _ = load_skills(agent, cwd, home=home)
    assert [s.name for s in skills] == ["Alpha", "alpha2", "beta", "delta", "Gamma"]


def test_a_linked_skill_loads_once(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    original = skill(agent / "skills" / "common", described("common", "common"))
    (cwd / ".omp" / "skills").mkdir(parents=True)
    os.symlink(agent / "skills" / "common", cwd / ".omp" / "skills" / "linked")
    skills, problems = load_skills(agent, cwd, home=home)
    # The project link wins (it comes first) and the same file under the user dir is
    # dropped silently, not reported as a collision.
    assert [(s.name, s.path) for s in skills] == [
        ("common", cwd / ".omp" / "skills" / "linked" / "SKILL.md")]
    assert problems == []
    assert original.exists()


def test_hidden_skills(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skills_dir = agent / "skills"
    skill(skills_dir / "shown", "---\ndescription: shown\nhide: false\n---\n")
    skill(skills_dir / "hidden", "---\ndescription: hidden\nhide: true\n---\n")
    skill(skills_dir / "no-model", "---\ndescription: x\ndisable-model-invocation: true\n---\n")
    skill(skills_dir / "string-true", "---\ndescription: x\nhide: 'true'\n---\n")
    skills, _ = load_skills(agent, cwd, home=home)
    assert {s.name: s.hide for s in skills} == {
        "shown": False, "hidden": True, "no-model": True, "string-true": False}
    prompt = skills_prompt(skills)
    assert "- shown: shown" in prompt
    assert "- string-true: x" in prompt
    assert "hidden" not in prompt
    assert "no-model" not in prompt
    # Hidden skills are still commands.
    assert {s.available_command().name for s in skills} == {
        "skill:shown", "skill:hidden", "skill:no-model", "skill:string-true"}


def test_broken_skill_files_are_reported(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skills_dir = cwd / ".omp" / "skills"
    latin1 = skills_dir / "latin1" / "SKILL.md"
    latin1.parent.mkdir(parents=True)
    latin1.write_bytes(b"---\ndescription: caf\xe9\n---\n")
    broken = skill(skills_dir / "broken-yaml", "---\ndescription: still read\nx: [\n---\nbody")
    number = skill(skills_dir / "number", "---\ndescription: 42\n---\n")
    (skills_dir / "is-dir" / "SKILL.md").mkdir(parents=True)
    skills, problems = load_skills(agent, cwd, home=home)
    assert sources(skills) == [("broken-yaml", "still read", "native:project")]
    by_path = {p.path: p.message for p in problems}
    assert by_path[latin1].startswith("not UTF-8 text (byte 0xe9 on line 2)")
    assert by_path[broken].startswith("broken frontmatter, read as plain `key: value` lines: "
                                      "not valid YAML (line ")
    assert by_path[number] == "description is a number, not text; skill skipped"
    assert by_path[skills_dir / "is-dir" / "SKILL.md"] == "is a directory, not a file"
    assert len(problems) == 4


# --- what the model sees --------------------------------------------------------------------


def test_the_system_prompt_listing(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skill(cwd / ".omp" / "skills" / "pdf-tools", PDF_SKILL)
    skills, _ = load_skills(agent, cwd, home=home)
    # The spec's example, verbatim.
    assert skills_prompt(skills) == (
        "# Skills & Rules\n"
        "Matching skill → MUST read `skill://<name>` first.\n"
        "<skills>\n"
        "- pdf-tools: Extract text and tables from PDF files; use when the user mentions PDFs.\n"
        "</skills>")
    assert SKILL_URI_LINE == "- `skill://<name>`: instructions; `/<path>`: its file"


def test_listing_keeps_one_line_per_skill() -> None:
    skills = [Skill("b", "second line\n  continues here ", Path("/s/b/SKILL.md"), "native:user"),
              Skill("a", "first", Path("/s/a/SKILL.md"), "native:user")]
    assert skills_prompt(skills).splitlines()[3:5] == [
        "- b: second line continues here", "- a: first"]
    assert skills_prompt([]) == ""
    assert skills_prompt([Skill("h", "x", Path("/h/SKILL.md"), "native:user", hide=True)]) == ""


def test_command_list_entries() -> None:
    described_skill = Skill("pdf-tools", "Extract text from PDFs", Path("/s/SKILL.md"),
                            "native:project")
    # The spec's example entry, verbatim.
    assert msgspec.to_builtins(described_skill.available_command()) == {
        "name": "skill:pdf-tools", "description": "Extract text from PDFs",
        "input": {"hint": "arguments"}, "source": "skill"}
    # A skill always has a description once loaded; the fallback wording is the original's.
    bare = Skill("bare", "", Path("/s/SKILL.md"), "native:project")
    assert bare.available_command().description == "Run bare skill"


# --- /skill:<name> --------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "invocation"), [
    ("/skill:pdf-tools extract page 3", SkillInvocation("pdf-tools", "extract page 3")),
    ("  /skill:pdf-tools   extract  page 3  ", SkillInvocation("pdf-tools", "extract  page 3")),
    ("/skill:pdf-tools", SkillInvocation("pdf-tools", "")),
    ("/skill:a/b rest", SkillInvocation("a/b", "rest")),  # leading form: up to the first space
    ("/skill:", None),
    ("/skill: x", None),
    ("please /skill:pdf-tools check report.pdf",
     SkillInvocation("pdf-tools", "please check report.pdf")),
    ("check this /skill:pdf-tools", SkillInvocation("pdf-tools", "check this")),
    ("/skill:x\tand more", SkillInvocation("x\tand", "more")),
    ("line one\n/skill:pdf-tools\nline three", SkillInvocation("pdf-tools",
                                                               "line one line three")),
    ("a /skill:x/y b", None),  # a / in an inline name: not a token
    ("path/skill:x b", None),  # not after whitespace
    # The name is anything up to whitespace; whether a skill has it is the caller's question.
    ("use /skill:x, then", SkillInvocation("x,", "use then")),
    ("/compact /skill:pdf-tools", None),  # another command first
    ("!ls /skill:pdf-tools", None),
    ("!!ls /skill:pdf-tools", None),
    ("$ print(1) /skill:pdf-tools", None),
    ("$$ x /skill:pdf-tools", None),
    ("$", None),
    ("${HOME} has /skill:pdf-tools", SkillInvocation("pdf-tools", "${HOME} has")),
    ("$HOME has /skill:pdf-tools", SkillInvocation("pdf-tools", "$HOME has")),
    ("no skill here", None),
])
def test_parse_skill_invocation(text: str, invocation: SkillInvocation | None) -> None:
    assert parse_skill_invocation(text) == invocation


def test_skill_message(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    path = skill(cwd / ".omp" / "skills" / "pdf-tools", PDF_SKILL)
    skills, _ = load_skills(agent, cwd, home=home)
    message = skill_message(skills[0], " extract page 3 ", "/skill:pdf-tools extract page 3",
                            timestamp=1795986739198)
    wire = msgspec.to_builtins(message)
    content = wire.pop("content")
    assert wire == {
        "role": "custom", "customType": "skill-prompt", "display": True, "attribution": "user",
        "details": {"name": "pdf-tools", "path": str(path), "args": "extract page 3",
                    "prompt": "/skill:pdf-tools extract page 3", "lineCount": 2},
        "timestamp": 1795986739198}
    assert list(wire["details"]) == ["name", "path", "args", "prompt", "lineCount"]
    directory = cwd / ".omp" / "skills" / "pdf-tools"
    head = ('[IMPORTANT: User invoked the "pdf-tools" skill; follow its instructions. Full skill '
            "below.]\n\n# PDF tools\nRun `scripts/extract.py <file>` …\n\n---\n\n"
            f"[Skill directory: {directory}]\nResolve relative paths in this skill ")
    assert content.startswith(head)
    assert content.endswith("\nUser: extract page 3")
    assert content.count("\n") == head.count("\n") + 1  # the paths sentence is one line


def test_skill_message_without_args_and_with_images(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skill(agent / "skills" / "s", "---\ndescription: d\n---\n\nStep one\n\n\n\nStep two  \n")
    skills, _ = load_skills(agent, cwd, home=home)
    message = skill_message(skills[0], "   ", "/skill:s")
    assert isinstance(message.content, str)
    assert "User:" not in message.content
    assert message.details == {"name": "s", "path": str(skills[0].path), "prompt": "/skill:s",
                               "lineCount": 5}
    # The prompt formatter runs over the message, as the original renders it.
    assert "\n\nStep one\nStep two\n\n---\n\n" in message.content
    image = ImageContent(data="aGk=", mimeType="image/png")
    with_image = skill_message(skills[0], "look", "/skill:s look", images=[image])
    assert isinstance(with_image.content, list)
    text, attached = with_image.content
    assert isinstance(text, TextContent)
    assert text.text.endswith("\nUser: look")
    assert attached == image
    assert isinstance(with_image, CustomMessage)


def test_skill_message_reads_the_file_again(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    path = skill(agent / "skills" / "s", "---\ndescription: d\n---\nold text\n")
    skills, _ = load_skills(agent, cwd, home=home)
    path.write_text("---\ndescription: d\n---\nnew text\n")
    assert "new text" in str(skill_message(skills[0], "", "/skill:s").content)
    path.unlink()
    with pytest.raises(ConfigError, match=f"^{path}: cannot be read: No such file"):
        skill_message(skills[0], "", "/skill:s")


# --- skill:// -------------------------------------------------------------------------------


def test_resolve_skill_uri(layout: tuple[Path, Path, Path], tmp_path: Path) -> None:
    agent, home, cwd = layout
    path = skill(agent / "skills" / "pdf-tools", PDF_SKILL)
    script = path.parent / "scripts" / "extract.py"
    script.parent.mkdir()
    script.write_text("print()")
    (tmp_path / "secret").write_text("no")
    os.symlink(tmp_path / "secret", path.parent / "escape")
    skills, _ = load_skills(agent, cwd, home=home)
    assert resolve_skill_uri(skills, "skill://pdf-tools") == path
    assert resolve_skill_uri(skills, "skill://pdf-tools/") == path
    assert resolve_skill_uri(skills, "skill://pdf-tools/scripts/extract.py") == script.resolve()
    with pytest.raises(SkillUriError, match="leaves the directory of skill 'pdf-tools'"):
        resolve_skill_uri(skills, "skill://pdf-tools/../../secret")
    with pytest.raises(SkillUriError, match="leaves the directory"):
        resolve_skill_uri(skills, "skill://pdf-tools/escape")
    with pytest.raises(SkillUriError, match=r"no skill named 'nope' \(loaded skills: pdf-tools\)"):
        resolve_skill_uri(skills, "skill://nope")
    with pytest.raises(SkillUriError, match="not a skill:// URI"):
        resolve_skill_uri(skills, "file:///etc/passwd")


# --- the skills section of config.yml ------------------------------------------------------------


def test_skills_enabled_false_loads_none(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skill(cwd / ".omp" / "skills" / "kept", described("kept"))
    assert load_skills(agent, cwd, home=home, settings=SkillSettings(enabled=False)) == ([], [])


def test_each_source_has_its_switch(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    skill(cwd / ".omp" / "skills" / "pi-project", described("p"))
    skill(agent / "skills" / "pi-user", described("u"))
    skill(cwd / ".claude" / "skills" / "claude-project", described("cp"))
    skill(home / ".claude" / "skills" / "claude-user", described("cu"))
    skill(cwd / ".agents" / "skills" / "agents-project", described("ap"))
    skill(home / ".agent" / "skills" / "agents-user", described("au"))
    skill(home / ".codex" / "skills" / "codex-user", described("xu"))
    by_default, _ = load_skills(agent, cwd, home=home)
    assert [s.name for s in by_default] == [
        "agents-project", "agents-user", "claude-project", "pi-project", "pi-user"]
    everything, _ = load_skills(agent, cwd, home=home, settings=SkillSettings(
        enableClaudeUser=True, enableCodexUser=True))
    assert sources(everything) == [
        ("agents-project", "ap", "agents:project"), ("agents-user", "au", "agents:user"),
        ("claude-project", "cp", "claude:project"), ("claude-user", "cu", "claude:user"),
        ("codex-user", "xu", "codex:user"), ("pi-project", "p", "native:project"),
        ("pi-user", "u", "native:user")]
    nothing, _ = load_skills(agent, cwd, home=home, settings=SkillSettings(
        enablePiProject=False, enablePiUser=False, enableClaudeProject=False,
        enableAgentsProject=False, enableAgentsUser=False))
    assert nothing == []


def test_custom_directories_win_over_the_default_places(
        layout: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    agent, home, cwd = layout
    monkeypatch.setenv("HOME", str(home))
    skill(cwd / ".omp" / "skills" / "same", described("from the project"))
    skill(home / "my-skills" / "same", described("from the custom directory"))
    skill(cwd / "vendored" / "extra", described("relative to the cwd"))
    skills, problems = load_skills(agent, cwd, home=home, settings=SkillSettings(
        customDirectories=["~/my-skills", "vendored", "missing"]))
    assert sources(skills) == [("extra", "relative to the cwd", "custom"),
                               ("same", "from the custom directory", "custom")]
    assert [str(p) for p in problems] == [
        f'{cwd / ".omp" / "skills" / "same" / "SKILL.md"}: name collision: "same" already '
        f'loaded from {home / "my-skills" / "same" / "SKILL.md"}, skipping this one']


def test_include_and_ignored_patterns_select_by_name(layout: tuple[Path, Path, Path]) -> None:
    agent, home, cwd = layout
    for name in ("pdf-read", "pdf-write", "docx", "xlsx"):
        skill(cwd / ".omp" / "skills" / name, described(name))
    chosen, _ = load_skills(agent, cwd, home=home, settings=SkillSettings(
        includeSkills=["pdf-*", "xlsx"], ignoredSkills=["*-write"]))
    assert [s.name for s in chosen] == ["pdf-read", "xlsx"]
    ignored, _ = load_skills(agent, cwd, home=home, settings=SkillSettings(
        ignoredSkills=["pdf-*"]))
    assert [s.name for s in ignored] == ["docx", "xlsx"]
