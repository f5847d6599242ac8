"""Agent definitions: the bundled ones and the user's and project's agent files
(docs/guides/subagents.md#subagents).

Discovery runs again at every spawn (files may change between calls), first definition of a
name wins: the project's ``<cwd>/.omp/agents/*.md`` (only when the project is trusted: its files
steer what code runs, as project extensions do), then the user's ``<agent dir>/agents/*.md``,
then the bundled agents. Only ``*.md`` files, sorted by name. A file whose ``name`` or
``description`` is not a string, or whose name is ``main``/``sub``, is skipped with a warning
on stderr (once per file and problem is not tracked: discovery is cheap and rare).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..commands.frontmatter import parse_frontmatter
from ..config import MAX_CONFIG_BYTES
from ..files import UnusableFile, read_regular

AgentSource = Literal["bundled", "user", "project"]
READ_ONLY_TOOLS = frozenset({"read", "grep", "glob", "web_search", "ast_grep", "yield", "ask",
                             "todo", "recall", "reflect", "retain", "memory_edit", "checkpoint",
                             "rewind"})
"""An agent whose declared tools all lie in this set is read-only (the READ-ONLY badge)."""
_ALIASES = {"search": "grep", "find": "glob"}
_RESERVED = frozenset({"main", "sub"})


class AgentDef(msgspec.Struct, frozen=True):
    name: str
    description: str
    prompt: str
    """The role prompt (the file's body)."""
    source: AgentSource = "bundled"
    tools: tuple[str, ...] | None = None
    """Declared tools (``yield`` included); None: the full default tool set."""
    spawns: str = ""
    """``*``: any agent; a comma-separated list: those; empty: cannot spawn."""
    model: tuple[str, ...] = ()
    """Model patterns, the first resolvable wins; ``@role`` aliases fall back to the parent's."""
    thinking: str | None = None
    blocking: bool = False
    """Runs inline even when background execution is on."""
    request_budget: int = 200

    @property
    def read_only(self) -> bool:
        declared = [t for t in (self.tools or ()) if t != "yield"]
        return bool(declared) and all(t in READ_ONLY_TOOLS for t in declared)


_WORKER = """You are a worker agent, hyper-focused on the one assignment you were given.

- Do the work yourself with your tools; keep going until it is done.
- Prefer editing existing files over creating new ones; do not write new documentation.
- Be concise: your final report goes to another agent, not to a human.
- When you are done, call `yield` with your result (or with `error` for a real blocker)."""

_SCOUT = """You are a scout: fast, read-only exploration and research.

- Search broadly, read what matters, never modify anything.
- Return compressed context: a summary, the relevant files with what each holds, the
  architecture as it bears on the question.
- When you are done, call `yield` with your findings."""

_REVIEWER = """You are a code review specialist.

- Read the change and its surroundings; run read-only commands to check claims.
- Report concrete findings with file paths and lines, a priority (0-3) and your confidence.
- Conclude with an overall verdict (correct or incorrect), then call `yield`."""

_SECURITY = """You are a security reviewer: read-only, evidence-backed vulnerability discovery.

- Trace untrusted input to dangerous sinks; every finding needs evidence (file, line, path).
- Classify severity and confidence; suggest a remediation.
- Summarise what you covered, then call `yield`."""

BUNDLED: tuple[AgentDef, ...] = (
    AgentDef("task", "General-purpose worker with full capabilities for delegated multi-step "
             "tasks.", _WORKER, spawns="*", model=("@task",), thinking="auto"),
    AgentDef("sonic", "Low-reasoning agent for strictly mechanical updates or data collection.",
             _WORKER, model=("@smol",), thinking="medium", request_budget=100),
    AgentDef("scout", "MUST be used for exploratory research and broad searches: fast, "
             "read-only, returns compressed context.", _SCOUT,
             tools=("read", "grep", "glob", "web_search", "yield"), model=("@smol",),
             thinking="medium", request_budget=100),
    AgentDef("reviewer", "Code review specialist.", _REVIEWER,
             tools=("read", "grep", "glob", "bash", "lsp", "web_search", "ast_grep", "yield",
                    "task"), spawns="scout", model=("@slow",)),
    AgentDef("security-reviewer", "Read-only, evidence-backed vulnerability discovery.",
             _SECURITY, tools=("read", "grep", "glob", "lsp", "ast_grep", "yield")),
)


def discover_agents(agent_directory: Path, cwd: Path, *, trusted: bool) -> list[AgentDef]:
    """Every agent, first definition of a name first (project, user, bundled). Blocking I/O
    (a few small files): callers on the event loop run it in a thread."""
    found: dict[str, AgentDef] = {}
    directories: list[tuple[Path, AgentSource]] = []
    if trusted:
        directories.append((cwd / ".omp" / "agents", "project"))
    directories.append((agent_directory / "agents", "user"))
    for directory, source in directories:
        for agent in _load_dir(directory, source):
            found.setdefault(agent.name, agent)
    for agent in BUNDLED:
        found.setdefault(agent.name, agent)
    return list(found.values())


def _load_dir(directory: Path, source: AgentSource) -> list[AgentDef]:
    try:
        paths = sorted(p for p in directory.iterdir() if p.suffix == ".md" and p.is_file())
    except OSError:
        return []
    agents = []
    for path in paths:
        try:
            # The regular-file gate: a FIFO named *.md is refused, never waited on.
            text = read_regular(path, MAX_CONFIG_BYTES).decode("utf-8")
        except (OSError, UnicodeDecodeError, UnusableFile) as exc:
            print(f"omp: agent file {path} skipped: {exc}", file=sys.stderr)
            continue
        agent, problem = parse_agent(text, path, source)
        if agent is None:
            print(f"omp: agent file {path} skipped: {problem}", file=sys.stderr)
            continue
        agents.append(agent)
    return agents


def parse_agent(text: str, path: Path, source: AgentSource
                ) -> tuple[AgentDef | None, str | None]:
    """An agent file read (docs/guides/subagents.md#subagents): the agent, or None and
    why it is skipped."""
    parsed = parse_frontmatter(text, path)
    fields = parsed.fields
    name, description = fields.get("name"), fields.get("description")
    if not isinstance(name, str) or not name.strip():
        return None, "`name` must be a string"
    if not isinstance(description, str):
        return None, "`description` must be a string"
    name = name.strip()
    if name.lower() in _RESERVED:
        return None, f"the agent name {name!r} is reserved"
    tools = _names(fields.get("tools"))
    if tools is not None:
        tools = tuple(dict.fromkeys(_ALIASES.get(t.lower(), t.lower()) for t in tools))
        if "yield" not in tools:
            tools = (*tools, "yield")
    spawns_raw = fields.get("spawns")
    spawns_list = _names(spawns_raw)
    spawns = ("*" if spawns_raw == "*" or spawns_list == ("*",)
              else ",".join(spawns_list) if spawns_list else "")
    if spawns_raw is None and tools is not None and "task" in tools:
        spawns = "*"
    thinking = fields.get("thinkingLevel", fields.get("thinking"))
    return AgentDef(
        name=name, description=description.strip(), prompt=parsed.body.strip(), source=source,
        tools=tools, spawns=spawns, model=_names(fields.get("model")) or (),
        thinking=str(thinking).strip() if isinstance(thinking, str | int) else None,
        blocking=_bool(fields.get("blocking"))), None


def _names(value: Any) -> tuple[str, ...] | None:
    """A CSV string or a list, as trimmed non-empty names; None when absent."""
    if value is None:
        return None
    items: Sequence[Any] = value.split(",") if isinstance(value, str) else (
        value if isinstance(value, list) else [value])
    return tuple(s for s in (str(v).strip() for v in items) if s)


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() == "true"
    return value is True
