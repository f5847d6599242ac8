"""Skills: discovery, the listing offered to the model, ``/skill:<name>``
(docs/design/extending.md#skills).

A skill is a directory holding a ``SKILL.md``: frontmatter (``description`` required; ``name``,
``enabled``, ``hide``, ``disable-model-invocation``, anything else carried along unused), then
the instructions. Only the listing (name and description) goes into the system prompt; the model
reads a skill when it needs it (``read skill://<name>``, resolved by ``resolve_skill_uri``), and
``/skill:<name> args`` puts the whole skill in front of it as a ``skill-prompt`` message.

**Where skills are found**, in priority order (the first skill of a name wins):

1. ``.omp/skills/`` in the cwd and each ancestor up to the repository root (or home), closest
   first; then ``<agentDir>/skills/``;
2. ``.claude/skills/`` in the same directories, home left out (``~/.claude/skills`` is opt-in
   in the original, and this runtime has no setting for it);
3. ``.agent/skills/`` and ``.agents/skills/`` in the same directories (home left out), then in
   home.

Each directory is scanned one level deep (``<dir>/<skill>/SKILL.md``): names starting with
``.`` are skipped, linked directories are followed, and within one directory skills are taken
in name order. A sub-directory without ``SKILL.md``, an empty ``SKILL.md``, one with
``enabled: false`` and one without a ``description`` are skipped silently, as in the original.

**Names**: the frontmatter ``name`` (trimmed), else the directory name. A name with whitespace
or ``/`` in it could never be typed as ``/skill:<name>`` nor read as ``skill://<name>``; the
original loads it anyway, here it is reported and skipped. Two files that are one file (a link)
load once, silently; a second skill of a loaded name is reported
(``name collision: "<name>" already loaded from <path>, skipping this one``) and skipped. The
final list is sorted by name, case-insensitively.

Limits: none on the number of skills; a ``SKILL.md`` is read like any configuration file
(regular UTF-8 file, at most ``omp.config.MAX_CONFIG_BYTES``; larger is reported and skipped).
The original has no size limit for authored skills.

**Settings**: the ``skills`` section of ``config.yml`` (``SkillSettings``, the original's keys
and defaults): ``enabled: false`` loads none; each source has its switch (``enablePiProject``,
``enablePiUser``, ``enableClaudeProject``, ``enableClaudeUser`` (off), ``enableAgentsProject``,
``enableAgentsUser``, ``enableCodexUser`` (off: ``~/.codex/skills``));
``customDirectories`` are scanned first, so their skills win over a same-named one from the
default places; ``includeSkills`` (when not empty) and ``ignoredSkills`` are glob patterns on
the name; ``enableSkillCommands: false`` keeps the skills out of the command list and
``/skill:<name>`` (the model still reads them).
"""

from __future__ import annotations

import fnmatch
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..config import ConfigError, read_text
from ..protocol.messages import CustomMessage, ImageContent, TextContent, UserContent
from ..protocol.payloads import AvailableCommand, CommandInput
from .dirs import entries, project_dirs
from .frontmatter import parse_frontmatter, strip_frontmatter
from .problems import Problem

SKILL_FILE = "SKILL.md"
SKILL_PROMPT_TYPE = "skill-prompt"
SKILL_URI_SCHEME = "skill://"
SKILL_URI_LINE = "- `skill://<name>`: instructions; `/<path>`: its file"
"""The line for ``skill://`` in a system prompt's list of internal URLs, as the original has it."""

_INVALID_NAME = r"[\s/]"
_INLINE_TOKEN = r"(^|\s)/skill:([^\s/]+)(\s|\Z)"
# The spec quotes the opening words; the rest of the sentence is ours.
_RESOLVE_PATHS = ("Resolve relative paths in this skill (such as `scripts/run.py` or "
                  "`templates/base.md`) against this directory; read the files it refers to, and "
                  "run its scripts with the shell tool when its instructions say so.")


class SkillSettings(msgspec.Struct, kw_only=True):
    """The ``skills`` section of ``config.yml`` (docs/design/extending.md#where-skills-are-found,
    docs/design/extending.md#invoking-a-skill)."""

    enabled: bool = True
    enableSkillCommands: bool = True
    """Skills are ``skill:<name>`` commands and ``/skill:<name>`` expands them."""
    enablePiProject: bool = True
    """``.omp/skills`` in the project's directories."""
    enablePiUser: bool = True
    """``<agent dir>/skills``."""
    enableClaudeProject: bool = True
    enableClaudeUser: bool = False
    """``~/.claude/skills``."""
    enableAgentsProject: bool = True
    enableAgentsUser: bool = True
    enableCodexUser: bool = False
    """``~/.codex/skills``."""
    customDirectories: list[str] = msgspec.field(default_factory=list)
    """Scanned before the default places (``~`` expanded; relative to the cwd otherwise)."""
    ignoredSkills: list[str] = msgspec.field(default_factory=list)
    """Glob patterns on the name: matching skills are left out."""
    includeSkills: list[str] = msgspec.field(default_factory=list)
    """Glob patterns on the name: when not empty, only matching skills load."""


class Skill(msgspec.Struct, frozen=True):
    """A loaded skill; ``path`` is its ``SKILL.md``."""

    name: str
    description: str
    path: Path
    source: str  # "custom", "native:project", "native:user", "claude:project",
    #              "claude:user", "agents:project", "agents:user", "codex:user"
    hide: bool = False  # left out of the system-prompt listing, still invocable and readable

    @property
    def base_dir(self) -> Path:
        return self.path.parent

    def available_command(self) -> AvailableCommand:
        """This skill's entry in ``available_commands_update``: ``skill:<name>``."""
        return AvailableCommand(name=f"skill:{self.name}", source="skill",
                                description=self.description or f"Run {self.name} skill",
                                input=CommandInput(hint="arguments"))


class SkillInvocation(msgspec.Struct, frozen=True):
    """``/skill:<name>`` found in a prompt: the skill's name and the rest of the text."""

    name: str
    args: str


class SkillUriError(ValueError):
    """A ``skill://`` URI that names no loaded skill, or a file outside its directory."""


def load_skills(agent_dir: Path, cwd: Path, *, home: Path | None = None,
                settings: SkillSettings | None = None) -> tuple[list[Skill], list[Problem]]:
    """The skills for a session in ``cwd``, sorted by name, and what was wrong on the way.
    ``home`` (default: the user's) is where the project walk stops and where the user's
    ``.agent(s)``, ``.claude`` and ``.codex`` directories are; ``settings``: the ``skills``
    section (default: the original's defaults)."""
    settings = SkillSettings() if settings is None else settings
    if not settings.enabled:
        return [], []
    home = (Path.home() if home is None else home).absolute()
    cwd = cwd.absolute()
    projects = project_dirs(cwd, home)
    scans = [(cwd / Path(d).expanduser(), "custom") for d in settings.customDirectories]
    if settings.enablePiProject:
        scans += [(d / ".omp" / "skills", "native:project") for d in projects]
    if settings.enablePiUser:
        scans.append((agent_dir / "skills", "native:user"))
    if settings.enableClaudeProject:
        scans += [(d / ".claude" / "skills", "claude:project") for d in projects if d != home]
    if settings.enableClaudeUser:
        scans.append((home / ".claude" / "skills", "claude:user"))
    if settings.enableAgentsProject:
        scans += [(d / base / "skills", "agents:project")
                  for d in projects if d != home for base in (".agent", ".agents")]
    if settings.enableAgentsUser:
        scans += [(home / base / "skills", "agents:user") for base in (".agent", ".agents")]
    if settings.enableCodexUser:
        scans.append((home / ".codex" / "skills", "codex:user"))

    problems: list[Problem] = []
    loaded: dict[str, Skill] = {}
    real_paths: set[str] = set()
    for directory, source in scans:
        for skill in _scan(directory, source, problems):
            if not _selected(skill.name, settings):
                continue
            real = os.path.realpath(skill.path)
            if real in real_paths:
                continue
            if (existing := loaded.get(skill.name)) is not None:
                problems.append(Problem(skill.path, f'name collision: "{skill.name}" '
                                        f"already loaded from {existing.path}, skipping this one"))
                continue
            loaded[skill.name] = skill
            real_paths.add(real)
    return sorted(loaded.values(), key=_order), problems


def _selected(name: str, settings: SkillSettings) -> bool:
    def matches(patterns: list[str]) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)

    if settings.includeSkills and not matches(settings.includeSkills):
        return False
    return not matches(settings.ignoredSkills)


def _order(skill: Skill) -> tuple[str, str, str]:
    return skill.name.lower(), skill.name, str(skill.path)


def _scan(directory: Path, source: str, problems: list[Problem]) -> list[Skill]:
    skills = []
    for entry in entries(directory):
        if not (entry.is_dir(follow_symlinks=False) or entry.is_symlink()):
            continue
        path = Path(entry.path) / SKILL_FILE
        if not os.path.lexists(path):
            continue
        skill = _load(path, entry.name, source, problems)
        if skill is not None:
            skills.append(skill)
    return sorted(skills, key=_order)


def _load(path: Path, dir_name: str, source: str, problems: list[Problem]) -> Skill | None:
    try:
        text = read_text(path)
    except ConfigError as error:
        problems.append(Problem.from_config_error(path, error))
        return None
    if not text:
        return None
    parsed = parse_frontmatter(text, path)
    if parsed.problem is not None:
        problems.append(parsed.problem)
    fields = parsed.fields
    description = fields.get("description")
    if fields.get("enabled") is False or not description:
        return None
    if not isinstance(description, str):
        problems.append(Problem(path, f"description is {_yaml_kind(description)}, not text; "
                                      "skill skipped"))
        return None
    raw_name = fields.get("name")
    name = raw_name.strip() if isinstance(raw_name, str) and raw_name.strip() else dir_name
    if re.search(_INVALID_NAME, name):
        problems.append(Problem(path, f"skill name {name!r} has whitespace or '/' in it, so it "
                                      "could not be invoked as /skill:<name> nor read as "
                                      "skill://<name>; skill skipped"))
        return None
    hide = fields.get("hide") is True or fields.get("disableModelInvocation") is True
    return Skill(name=name, description=description, path=path, source=source, hide=hide)


def _yaml_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def skills_prompt(skills: Sequence[Skill]) -> str:
    """The system-prompt section that offers ``skills`` to the model (hidden ones left out);
    ``""`` when there is none to offer. Only useful when the model has a tool that can read
    ``skill://`` URIs."""
    visible = [skill for skill in skills if not skill.hide]
    if not visible:
        return ""
    # One line per skill: a description written over several lines is joined into one.
    listing = [f"- {skill.name}: {' '.join(skill.description.split())}" for skill in visible]
    return "\n".join(["# Skills & Rules", "Matching skill → MUST read `skill://<name>` first.",
                      "<skills>", *listing, "</skills>"])


def parse_skill_invocation(text: str) -> SkillInvocation | None:
    """``/skill:<name>`` in a prompt, or None (docs/design/extending.md#invoking-a-skill).

    At the start (leading whitespace aside), ``/skill:<name> args``: the name runs to the first
    space, the args are the rest, trimmed. Elsewhere, a ``/skill:<name>`` token (no whitespace
    or ``/`` in the name) between whitespace or the text's ends: the args are the text before
    and after it, joined by a space. A text starting with another ``/command`` or with a
    local-execution sigil (``!``, ``$ ``, ``$$ ``) has no inline token. Whether a skill of that
    name exists is the caller's question.
    """
    start = text.lstrip()
    if start.startswith("/skill:"):
        name, _, args = start.removeprefix("/skill:").partition(" ")
        return SkillInvocation(name, args.strip()) if name else None
    if start.startswith("/") or _local_execution(start):
        return None
    match = re.search(_INLINE_TOKEN, text)
    if match is None:
        return None
    before = text[:match.start(2) - len("/skill:")].rstrip()
    after = text[match.end(2):].lstrip()
    return SkillInvocation(match[2], " ".join(part for part in (before, after) if part).strip())


def _local_execution(start: str) -> bool:
    """``!cmd`` / ``!!cmd`` (shell) or ``$ code`` / ``$$ code`` (python): not ``${…}``."""
    if start.startswith("!"):
        return True
    if not start.startswith("$") or start.startswith("${"):
        return False
    after = start[2:3] if start.startswith("$$") else start[1:2]
    return after in ("", " ", "\t", "\n", "\r")


def find_skill(skills: Sequence[Skill], name: str) -> Skill | None:
    return next((skill for skill in skills if skill.name == name), None)


def skill_message(skill: Skill, args: str, raw_prompt: str, *,
                  images: Sequence[ImageContent] = (),
                  timestamp: int | None = None) -> CustomMessage:
    """The ``skill-prompt`` message ``/skill:<name> args`` (``raw_prompt``, as the user typed
    it) sends to the model: the skill's ``SKILL.md`` re-read now, frontmatter removed.

    Raises ConfigError (naming the file and why) when the file cannot be read.
    """
    body = strip_frontmatter(read_text(skill.path))
    args = args.strip()
    text = (f'[IMPORTANT: User invoked the "{skill.name}" skill; follow its instructions. '
            f"Full skill below.]\n\n{body}\n\n---\n\n[Skill directory: {skill.base_dir}]\n"
            f"{_RESOLVE_PATHS}")
    if args:
        text += f"\nUser: {args}"
    from .render import format_prompt  # lazy: omp.lazy says why

    content = format_prompt(text).strip()
    details: dict[str, Any] = {"name": skill.name, "path": str(skill.path)}
    if args:
        details["args"] = args
    details["prompt"] = raw_prompt
    details["lineCount"] = len(body.split("\n")) if body else 0
    message_content: str | list[UserContent] = (
        [TextContent(text=content), *images] if images else content)
    return CustomMessage(customType=SKILL_PROMPT_TYPE, content=message_content, display=True,
                         details=details, attribution="user",
                         timestamp=int(time.time() * 1000) if timestamp is None else timestamp)


def resolve_skill_uri(skills: Sequence[Skill], uri: str) -> Path:
    """The file ``skill://<name>`` (its ``SKILL.md``) or ``skill://<name>/<relative path>``
    (a file in its directory) stands for. Raises SkillUriError for an unknown skill or a path
    that leaves the skill's directory (links included)."""
    if not uri.startswith(SKILL_URI_SCHEME):
        raise SkillUriError(f"{uri!r} is not a skill:// URI")
    name, _, relative = uri.removeprefix(SKILL_URI_SCHEME).partition("/")
    skill = find_skill(skills, name)
    if skill is None:
        known = ", ".join(s.name for s in skills) or "none"
        raise SkillUriError(f"no skill named {name!r} (loaded skills: {known})")
    if not relative.strip("/"):
        return skill.path
    root = os.path.realpath(skill.base_dir)
    target = os.path.realpath(skill.base_dir / relative)
    if os.path.commonpath([root, target]) != root:
        raise SkillUriError(f"{uri!r} leaves the directory of skill {name!r}")
    return Path(target)
