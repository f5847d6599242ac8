"""File commands (``commands/*.md``, listed with source ``file``) and prompt templates
(``prompts/**/*.md``, never listed): discovery and expansion
(docs/design/extending.md#file-commands, docs/design/extending.md#prompt-templates).

**File commands**, by priority; the first command of a name wins, later ones are dropped
silently:

1. ``<cwd>/.omp/commands/*.md``, then ``<agentDir>/commands/*.md`` (a project command shadows
   the user's);
2. ``<cwd>/.claude/commands/**/*.md``: a nested ``a/b.md`` is the command ``b`` and also
   ``a:b`` (all top-level files first, then nested ones by their file name, then the ``a:b``
   names), as Claude Code users already have them;
3. ``.agent/commands/*.md`` and ``.agents/commands/*.md`` in the cwd and each ancestor up to
   the repository root or home (closest first, home left to the user level), then
   ``~/.agent/commands``, ``~/.agents/commands``;
4. ``init`` ("Generate AGENTS.md for current codebase"), built in, unless a file defines it.

The name is the file name without ``.md``. The description is the frontmatter ``description``
(trimmed), else the body's first non-blank line cut to 60 characters (``...`` added when cut);
``argument-hint`` (or ``argumentHint``) becomes the list entry's ``input.hint``. The body is what
follows the frontmatter. ``load_file_commands`` reads the disk every time it is called, so the
command list always shows the files as they are now.

**Prompt templates**: ``<agentDir>/prompts/`` then ``<cwd>/.omp/prompts/``, each searched
recursively (shallower first); the name is the file name without ``.md``, and the first
template of a name wins, so a user template shadows a project one (as in the original). Callers
load them once per session.

A file that cannot be read is left out and reported; a broken frontmatter is reported and the
file still loads (``omp.commands.frontmatter``). Nothing here raises for a file's sake.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from ..config import ConfigError, read_text
from ..protocol.payloads import AvailableCommand, CommandInput
from .dirs import markdown_files, project_dirs
from .frontmatter import parse_frontmatter
from .problems import Problem
from .templates import expand, split_command

DESCRIPTION_FROM_BODY_CHARS = 60

INIT_DESCRIPTION = "Generate AGENTS.md for current codebase"
# Our own wording; the original's embedded prompt asks for the same file.
_INIT_BODY = """\
Create or update AGENTS.md at the root of this repository: the briefing a coding agent reads \
before it works here.

First study the codebase: its layout, languages and frameworks, how to install, build, run, \
test and lint it (the exact commands), and the conventions the existing code follows. Read the \
README, the build and CI configuration, and any existing AGENTS.md, CLAUDE.md or similar files.

Then write AGENTS.md in concise Markdown with:
- a short overview of what the project is and how it is organised;
- the exact commands for setup, build, tests (including a single test) and linting;
- the code style and conventions that are not obvious from a glance;
- the pitfalls and rules a newcomer must know before changing things.

Prefer facts you verified in the repository over general advice. If AGENTS.md exists, keep what \
is still true and improve the rest."""


class FileCommand(msgspec.Struct, frozen=True):
    """A markdown command: ``/name args`` becomes its expanded body."""

    name: str
    description: str
    body: str
    argument_hint: str | None
    path: Path | None  # None for the built-in ``init``
    source: str  # "native:project", "native:user", "claude:project", "agents:project",
    #              "agents:user" or "builtin"

    def available_command(self) -> AvailableCommand:
        """This command's entry in ``available_commands_update`` (source ``file``)."""
        return AvailableCommand(
            name=self.name, source="file",
            description=self.description or UNSET,
            input=CommandInput(hint=self.argument_hint) if self.argument_hint else UNSET)

    def expand(self, args_text: str) -> str:
        """The text sent to the model for ``/name <args_text>``; raises ``TemplateError``."""
        return expand(self.body, args_text)


class PromptTemplate(msgspec.Struct, frozen=True):
    """A prompt template: ``/name args`` becomes its expanded body; never listed."""

    name: str
    description: str  # with its source label, e.g. "Review a file (project:review)"
    body: str
    path: Path
    source: str  # "(user)", "(project)", "(user:sub:dir)"

    def expand(self, args_text: str) -> str:
        """The text sent to the model for ``/name <args_text>``; raises ``TemplateError``."""
        return expand(self.body, args_text)


def load_file_commands(agent_dir: Path, cwd: Path, *, home: Path | None = None
                       ) -> tuple[list[FileCommand], list[Problem]]:
    """Every file command for a session in ``cwd``, in list order, and what was wrong on the
    way. ``home`` (default: the user's) is where the project walk stops and where the user's
    ``.agent(s)`` directories are."""
    home = Path.home() if home is None else home
    cwd = cwd.absolute()
    problems: list[Problem] = []
    commands: list[FileCommand] = []
    seen: set[str] = set()

    def add(command: FileCommand) -> None:
        if command.name not in seen:
            seen.add(command.name)
            commands.append(command)

    for directory, source in ((cwd / ".omp" / "commands", "native:project"),
                              (agent_dir / "commands", "native:user")):
        for path in markdown_files(directory, recursive=False):
            if (command := _load_command(path, path.name[:-3], source, problems)) is not None:
                add(command)
    for command in _claude_commands(cwd / ".claude" / "commands", problems):
        add(command)
    agent_dirs = [(d / base / "commands", "agents:project")
                  for d in project_dirs(cwd, home) if d != home.absolute()
                  for base in (".agent", ".agents")]
    agent_dirs += [(home / base / "commands", "agents:user") for base in (".agent", ".agents")]
    for directory, source in agent_dirs:
        for path in markdown_files(directory, recursive=False):
            if (command := _load_command(path, path.name[:-3], source, problems)) is not None:
                add(command)
    add(FileCommand(name="init", description=INIT_DESCRIPTION, body=_INIT_BODY,
                    argument_hint=None, path=None, source="builtin"))
    return commands, problems


def _claude_commands(directory: Path, problems: list[Problem]) -> list[FileCommand]:
    top: list[FileCommand] = []
    nested: list[FileCommand] = []
    aliases: list[FileCommand] = []
    for path in markdown_files(directory, recursive=True):
        command = _load_command(path, path.name[:-3], "claude:project", problems)
        if command is None:
            continue
        relative = path.relative_to(directory).with_suffix("")
        if len(relative.parts) == 1:
            top.append(command)
        else:
            nested.append(command)
            aliases.append(msgspec.structs.replace(command, name=":".join(relative.parts)))
    return top + nested + aliases


def _load_command(path: Path, name: str, source: str,
                  problems: list[Problem]) -> FileCommand | None:
    try:
        text = read_text(path)
    except ConfigError as error:
        problems.append(Problem.from_config_error(path, error))
        return None
    parsed = parse_frontmatter(text, path)
    if parsed.problem is not None:
        problems.append(parsed.problem)
    hint = _trimmed_string(parsed.fields.get("argumentHint"))
    return FileCommand(name=name, description=_description(parsed.fields, parsed.body),
                       body=parsed.body, argument_hint=hint, path=path, source=source)


def load_prompt_templates(agent_dir: Path, cwd: Path
                          ) -> tuple[list[PromptTemplate], list[Problem]]:
    """The prompt templates for a session in ``cwd`` (user ones first) and what was wrong."""
    problems: list[Problem] = []
    templates: list[PromptTemplate] = []
    for directory, level in ((agent_dir / "prompts", "user"),
                             (cwd.absolute() / ".omp" / "prompts", "project")):
        for path in markdown_files(directory, recursive=True):
            try:
                text = read_text(path)
            except ConfigError as error:
                problems.append(Problem.from_config_error(path, error))
                continue
            parsed = parse_frontmatter(text, path)
            if parsed.problem is not None:
                problems.append(parsed.problem)
            sub = ":".join(path.relative_to(directory).parent.parts)
            label = f"({level}:{sub})" if sub else f"({level})"
            description = _description(parsed.fields, parsed.body)
            templates.append(PromptTemplate(
                name=path.name[:-3], path=path, body=parsed.body, source=label,
                description=f"{description} {label}" if description else label))
    return templates, problems


def find_file_command(commands: Sequence[FileCommand], name: str) -> FileCommand | None:
    """The command called ``name`` (the first, as in the list)."""
    return next((command for command in commands if command.name == name), None)


def find_prompt_template(templates: Sequence[PromptTemplate],
                         name: str) -> PromptTemplate | None:
    """The template called ``name``: the first one, so a user template wins."""
    return next((template for template in templates if template.name == name), None)


def expand_file_command(text: str, commands: Sequence[FileCommand]) -> str | None:
    """What ``text`` (``/name args…``) becomes when ``name`` is a file command; None when it
    is not one. Raises ``TemplateError`` when the command's body cannot be rendered."""
    parts = split_command(text)
    command = find_file_command(commands, parts[0]) if parts is not None else None
    return command.expand(parts[1]) if command is not None and parts is not None else None


def expand_prompt_template(text: str, templates: Sequence[PromptTemplate]) -> str | None:
    """What ``text`` (``/name args…``) becomes when ``name`` is a prompt template; None when
    it is not one. Raises ``TemplateError`` when the template cannot be rendered."""
    parts = split_command(text)
    template = find_prompt_template(templates, parts[0]) if parts is not None else None
    return template.expand(parts[1]) if template is not None and parts is not None else None


def _description(fields: Mapping[str, Any], body: str) -> str:
    if description := _trimmed_string(fields.get("description")):
        return description
    first = next((line for line in body.split("\n") if line.strip()), "")
    if len(first) > DESCRIPTION_FROM_BODY_CHARS:
        return first[:DESCRIPTION_FROM_BODY_CHARS] + "..."
    return first


def _trimmed_string(value: object) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None
