"""The system prompt a session sends: a list of blocks (``get_state.systemPrompt`` shows the list).

Block 1 says who the agent is, which tools it has and how to use them; ``--system-prompt``
replaces it whole. Block 2 is about this project and this moment: the context files (the global
``AGENTS.md`` of the agent directory, then one per directory from the filesystem root down to
the cwd; the settings' ``disabledProviders`` leaves sources out), the skills the model may read
(``skill://<name>``, when it has the ``read`` tool) and the rulebook rules it may read
(``rule://<name>``, likewise), the always-apply rules, the ``--append-system-prompt`` text, the
date and the cwd. Block 1 changes only with the tool set, so a provider can cache it across
sessions.

Everything here is pure except reading files: the context files and prompt files, each through
the regular-file gate (``omp.files``), so a FIFO or a device under a context file's name is
skipped, never waited on; the files are small and cut at ``CONTEXT_FILE_MAX_BYTES``. A session's
:class:`PromptOptions` reads its context files once (at startup, where reads on the event loop
are fine; ``/reload-plugins`` reads them again in a worker thread) and every later prompt
(a tool change) is built from what was read, without touching the disk. A context file that is
there but cannot be used is left out and said once: on stderr, and as a ``notice`` the server
sends after ``ready`` (:meth:`PromptOptions.take_notices`).
"""

from __future__ import annotations

import codecs
import datetime
import errno
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec

from ..commands.skills import Skill, skills_prompt
from ..config import agent_dir
from ..files import UnusableFile, describe_kind, read_part, read_regular
from ..protocol.events import Notice
from ..tools.base import RulebookRule, Tool

CONTEXT_FILE_NAMES = ("AGENTS.md", "CLAUDE.md")
"""Per directory, the first of these that can be read is that directory's context file."""
CONTEXT_FILE_MAX_BYTES = 64 * 1024
PROMPT_FILE_MAX_BYTES = 4 * 1024 * 1024
"""The largest ``--system-prompt`` / ``--append-system-prompt`` file read (a mistaken path to a
log or an image must not fill memory)."""

ContextFiles = list[tuple[Path, str]]
"""(path, text) per context file, in prompt order."""

_IDENTITY = (
    "You are omp, an expert coding agent. A host program drives you over RPC and shows the "
    "user what you do; you work in the user's repository through the tools below."
)
_EXPLORING_TOOLS = ("grep", "ast_grep", "glob", "find", "ls")


def build_system_prompt(*, tools: Sequence[Tool], cwd: Path, agent_directory: Path,
                        custom: str | None = None, append: str | None = None,
                        today: datetime.date | None = None,
                        model_name: str | None = None,
                        skills: Sequence[Skill] = (),
                        context: ContextFiles | None = None,
                        disabled_context: frozenset[str] = frozenset(),
                        rules: Sequence[str] = (),
                        rulebook: Sequence[RulebookRule] = ()) -> list[str]:
    """The system prompt blocks for a session in ``cwd`` with ``tools`` active.

    ``custom`` (``--system-prompt``) replaces the first block; ``append``
    (``--append-system-prompt``) goes after the project context. ``today`` defaults to the
    local date; ``model_name``, when given, is named after the working directory. ``context``
    is the context files as read by :func:`read_context_files`; without it they are read now
    (blocking), and those that cannot be read are left out: nothing here raises for a file's
    sake.
    """
    main = custom if custom is not None else _main_block(tools)
    # Skills and rulebook rules are read on demand through ``read``'s skill:// and rule://
    # URIs: without it, no listing.
    readable = any(t.name == "read" for t in tools)
    listing = (_join(skills_prompt(skills), rulebook_prompt(rulebook, heading=not skills))
               if readable else "")
    if context is None:
        context, _ = read_context_files(cwd, agent_directory, disabled_context)
    return [main, _project_block(context=context, cwd=cwd, append=append,
                                 today=today or datetime.date.today(), model_name=model_name,
                                 skills=listing, rules=rules)]


def _join(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def rulebook_prompt(rules: Sequence[RulebookRule], *, heading: bool = True) -> str:
    """The system-prompt lines that offer the rulebook rules (``""`` for none): the
    original's "Skills & Rules" section (its heading only when no skill came before), one
    line per rule with its description. The sentence is ours: the spec does not quote the
    original's."""
    if not rules:
        return ""
    lines = ["# Skills & Rules"] if heading else []
    lines += ["Rule that applies to the task → MUST read `rule://<name>` first and follow it.",
              "<rules>", *(f"- {r.name}: {r.description}" for r in rules), "</rules>"]
    return "\n".join(lines)


PROMPT_FILE_SUFFIXES = (".md", ".markdown", ".txt", ".prompt")
"""A ``--system-prompt`` value of one word ending in one of these is meant as a file name."""


def load_prompt_arg(value: str, cwd: Path) -> str:
    """``--system-prompt`` / ``--append-system-prompt``: the content of the file ``value`` names
    (relative to ``cwd`` or absolute, ``~`` expanded), or ``value`` itself when it is text.

    A value is text when no such file exists and it does not look like a path (see
    ``looks_like_a_path``). One that looks like a path but names no regular file raises
    ``OSError`` naming the path (``FileNotFoundError`` when nothing is there), and so does a
    file that exists but cannot be read (or is over ``PROMPT_FILE_MAX_BYTES``): taking a
    mistyped path for the prompt text would hide the mistake from the user.
    """
    meant_as_path = looks_like_a_path(value)
    try:
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = cwd / path
        is_file = path.is_file()
    except (OSError, ValueError, RuntimeError) as exc:
        # Too long for a path, a NUL byte, no home directory for "~user".
        if meant_as_path:
            raise FileNotFoundError(errno.ENOENT, f"cannot be read as a path ({exc})",
                                    value) from exc
        return value
    if not is_file:
        if not meant_as_path:
            return value
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "Is a directory, not a prompt file", str(path))
        if path.exists():  # a FIFO, a socket, a device
            raise OSError(errno.EINVAL, "Not a regular file", str(path))
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
    try:
        # Through the gate: a FIFO swapped in since the check is refused, not waited on.
        data = read_regular(path, PROMPT_FILE_MAX_BYTES)
    except UnusableFile as exc:
        raise OSError(errno.EINVAL, str(exc), str(path)) from None
    return data.decode("utf-8", errors="replace")


def looks_like_a_path(value: str) -> bool:
    """Whether a prompt argument was meant as a file name even when no such file exists.

    Prompt text is sentences, a path is one word: a single line that starts like a path
    (``/``, ``./``, ``../``, ``~/``) or, without whitespace, contains a ``/`` or ends in one of
    ``PROMPT_FILE_SUFFIXES``. So ``prompts/sytem.md`` and ``~/sys.txt`` are paths, while
    ``Be terse.`` and ``Follow STYLE.md when you edit.`` are text.
    """
    if not value or "\n" in value or "\x00" in value:
        return False
    if value == "~" or value.startswith(("/", "./", "../", "~/")):
        return True
    if any(char.isspace() for char in value):
        return False
    return "/" in value or value.lower().endswith(PROMPT_FILE_SUFFIXES)


# --- block 1 ----------------------------------------------------------------------------------


def _main_block(tools: Sequence[Tool]) -> str:
    tool_lines = [_tool_line(tool) for tool in tools] or ["(none)"]
    guidelines = [f"- {line}" for line in _guidelines({tool.name for tool in tools})]
    return "\n\n".join([
        _IDENTITY,
        "\n".join(["Available tools:", *tool_lines]),
        "\n".join(["Guidelines:", *guidelines]),
    ])


def _tool_line(tool: Tool) -> str:
    lines = tool.description.strip().splitlines()
    return f"- {tool.name}: {lines[0].strip()}" if lines else f"- {tool.name}"


def _guidelines(names: set[str]) -> list[str]:
    out: list[str] = []
    exploring = [name for name in _EXPLORING_TOOLS if name in names]
    if "bash" in names:
        if exploring:
            out.append(f"Prefer the {_and_list(exploring)} {_tools_word(exploring)} over bash "
                       "for exploring files and searching code")
        else:
            out.append("Use bash for exploring files (ls, rg, find)")
    if "read" in names:
        if "bash" in names:
            out.append("Use read to look at files, not cat or sed through bash")
        if "edit" in names:
            out.append("Read a file before you edit it")
    if "edit" in names:
        out.append("Use edit for precise changes: the old text must match the file exactly, "
                   "whitespace included")
    if "write" in names:
        out.append("Use write only for new files or complete rewrites")
    out += [
        "Be concise",
        "Show file paths clearly when you talk about files",
        "When you are done, summarise what you did in plain text",
    ]
    return out


def _and_list(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _tools_word(words: list[str]) -> str:
    return "tool" if len(words) == 1 else "tools"


# --- block 2 ----------------------------------------------------------------------------------


def _project_block(*, context: ContextFiles, cwd: Path, append: str | None,
                   today: datetime.date, model_name: str | None, skills: str = "",
                   rules: Sequence[str] = ()) -> str:
    parts: list[str] = []
    blocks = [f"## {path}\n\n{text}" for path, text in context]
    if blocks:
        parts += ["# Project Context", "Project-specific instructions and guidelines:", *blocks]
    if skills:
        parts.append(skills)
    if rules:
        # Where the original puts them: after the skills, each body on its own lines.
        parts.append("\n".join(rules))
    if append and append.strip():
        parts.append(append.strip())
    facts = [f"Current date: {today.isoformat()}", f"Current working directory: {cwd}"]
    if model_name:
        facts.append(f"Model: {model_name}")
    parts.append("\n".join(facts))
    return "\n\n".join(parts)


CONTEXT_SOURCES = {"AGENTS.md": "agents-md", "CLAUDE.md": "claude"}
"""The original's discovery provider of each context file name (``disabledProviders``)."""


def read_context_files(cwd: Path, agent_directory: Path,
                       disabled: frozenset[str] = frozenset()
                       ) -> tuple[ContextFiles, list[str]]:
    """The context files for ``cwd`` and why any that is there was left out; the sources in
    ``disabled`` (the original's ``disabledProviders``: ``agents-md``, ``claude``, ``native``
    for the global one) are not looked at.

    The global one (in ``agent_directory``) first, then one per directory from the root down to
    ``cwd``, each file once; per directory the first of ``CONTEXT_FILE_NAMES`` that can be read.
    A name with nothing behind it (or a dangling link) is passed over in silence; one that is
    there but unusable (a FIFO, a device, a directory, no permission) is passed over with a
    problem text naming it. Blocking, but never on a FIFO or a device: each file goes through
    the regular-file gate and is read to at most ``CONTEXT_FILE_MAX_BYTES`` (+1).
    """
    files: ContextFiles = []
    problems: list[str] = []
    seen: set[Path] = set()
    reported: set[Path] = set()
    absolute = Path(os.path.abspath(cwd))
    names = tuple(n for n in CONTEXT_FILE_NAMES if CONTEXT_SOURCES[n] not in disabled)
    directories = [*reversed(absolute.parents), absolute]
    if "native" not in disabled:
        directories.insert(0, agent_directory)
    for directory in directories:
        for name in names:
            path = directory / name
            try:
                text = _read_context_file(path)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except (OSError, UnusableFile) as exc:
                key = _resolved(path)
                if key not in reported:  # the agent directory may also be a parent of cwd
                    reported.add(key)
                    problems.append(_skipped(path, exc))
                continue
            key = _resolved(path)
            if key not in seen:
                seen.add(key)
                if text.strip():
                    files.append((path, text))
            break
    return files, problems


def _skipped(path: Path, exc: OSError | UnusableFile) -> str:
    if isinstance(exc, UnusableFile):
        return f"Context file {path} was skipped: it is {describe_kind(exc.mode)}, not a " \
               "regular file"
    return f"Context file {path} was skipped: {exc.strerror or exc}"


def _read_context_file(path: Path) -> str:
    """The file's text, cut to ``CONTEXT_FILE_MAX_BYTES`` with a note. Raises ``OSError`` or
    :class:`~omp.files.UnusableFile` when it cannot be read."""
    try:
        data, size = read_part(path, CONTEXT_FILE_MAX_BYTES + 1, cut=True)
    except UnusableFile:
        raise
    except ValueError as exc:  # a name the system refuses (a NUL byte in the cwd)
        raise OSError(errno.EINVAL, str(exc)) from None
    if len(data) <= CONTEXT_FILE_MAX_BYTES:
        return data.decode("utf-8", errors="replace").strip("\n").rstrip()
    cut = data[:CONTEXT_FILE_MAX_BYTES]
    # End on a whole line when that keeps most of the text, else on a whole UTF-8 character
    # (the incremental decoder holds back a character the cut split).
    newline = cut.rfind(b"\n")
    if newline >= CONTEXT_FILE_MAX_BYTES // 2:
        cut = cut[:newline]
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(cut, final=False).strip("\n").rstrip()
    total = max(size, len(data))
    return (f"{text}\n\n[{path} is {total} bytes; only its first "
            f"{CONTEXT_FILE_MAX_BYTES // 1024} KiB are included here.]")


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return Path(os.path.abspath(path))


class PromptOptions(msgspec.Struct, eq=False):
    """What a session's system prompt is built from, kept so it can be rebuilt when the tools
    change (``set_host_tools``)."""

    cwd: Path
    agent_directory: Path | None = None
    custom: str | None = None
    append: str | None = None
    skills: Sequence[Skill] = ()
    disabled_context: frozenset[str] = frozenset()
    """Context-file sources left out (``disabledProviders``)."""
    context: ContextFiles | None = None
    """The context files as read (None: not yet; the first ``build`` reads them, blocking)."""
    rules: tuple[str, ...] = ()
    """The bodies of the always-apply rules (``alwaysApply``, ``RULES.md``)."""
    rulebook: tuple[RulebookRule, ...] = ()
    """The rules the model reads on demand (``rule://<name>``)."""
    problems: list[str] = msgspec.field(default_factory=list)
    """Context files left out since the last ``take_notices``, and why."""

    def use_skills(self, skills: Sequence[Skill]) -> None:
        """The next system prompt lists these skills."""
        self.skills = skills

    def use_rules(self, rules: tuple[str, ...], rulebook: tuple[RulebookRule, ...]) -> None:
        """The next system prompt carries these always-apply rules and names this rulebook."""
        self.rules = rules
        self.rulebook = rulebook

    def build(self, tools: Sequence[Tool]) -> list[str]:
        if self.context is None:
            self.use_context(*read_context_files(self.cwd, self.directory,
                                                 self.disabled_context))
        return build_system_prompt(
            tools=tools, cwd=self.cwd, agent_directory=self.directory, custom=self.custom,
            append=self.append, skills=self.skills, context=self.context, rules=self.rules,
            rulebook=self.rulebook)

    @property
    def directory(self) -> Path:
        """The agent directory the global context file is read from."""
        return self.agent_directory or agent_dir()

    def use_context(self, context: ContextFiles, problems: Sequence[str]) -> None:
        """Build from ``context`` (what :func:`read_context_files` returned) from now on; its
        ``problems`` are said on stderr now and wait for ``take_notices``."""
        self.context = context
        for problem in problems:
            print(f"omp: warning: {problem}", file=sys.stderr)
        self.problems += problems

    def take_notices(self) -> list[Notice]:
        """A ``notice`` per context file left out since the last call (the server sends them
        after ``ready``, and after ``/reload-plugins``)."""
        problems, self.problems = self.problems, []
        return [Notice(level="warning", source="context-files", message=problem)
                for problem in problems]
