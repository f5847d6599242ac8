"""Time-traveling stream rules (TTSR, docs/guides/approval.md#rules-ttsr): rule files whose
condition is watched while the model streams; a match interrupts the stream and the turn runs again
with the rule.

Rules, in one place:

* Discovery (``load_rules``) in the places ``omp.session.rule_sources`` names, first of a
  name wins: the native ``.omp/rules`` folders and ``RULES.md`` files, then extension
  packages', Claude's, plugins', Cursor's, Windsurf's and Cline's rules (the other tools'
  user-level ones only when opted in). A project's places load only in a trusted project
  (a repository's rules steer the agent like its code does, so they load when its extensions
  would). The name is the file name without its suffix; the frontmatter's ``enabled:
  false`` leaves a rule out, as does ``ttsr.disabledRules``. A file is (in the original's
  order) a TTSR rule when one of its ``condition`` regexes (legacy keys ``ttsr_trigger``,
  ``ttsrTrigger``) compiles (Python ``re``; a leading ``(?i)`` group works as in the
  original) and its scope can see something — a condition token that looks like a file glob
  (``*.rs``, ``src/**/x``) becomes the scopes ``tool:edit(<glob>)``, ``tool:write(<glob>)``
  (and the condition ``.*`` when no regex is left); else an always-apply rule
  (``alwaysApply: true``; ``RULES.md`` always), whose body the system prompt carries. A rule
  with an ``astCondition`` is refused (the caller names it in a notice): the original checks
  ast-grep patterns on finished ``edit`` / ``write`` calls, and what exactly is matched is not
  known well enough here to copy. Else, with a ``description``, a rulebook rule: the system
  prompt lists its name and description, and ``read rule://<name>`` gives the model its body.
  Every session gets the rules whose ``agents`` globs match its agent (``main`` for the
  top-level session, the agent's name for a subagent's: a child of the ``task`` tool gets
  the rules its parent loaded, ``RuleWatch.for_session``; absent ``agents``: every session).
* Matching (``RuleWatch.observe``): per streamed message, one buffer per source — the text, the
  thinking, each tool call's argument JSON — reset at every assistant message; a
  rule matches when TTSR is on, it may fire (``ttsr.repeatMode: once``: once per session, the
  injected names kept in the session as ``ttsr-injection`` messages so a resumed session
  remembers; ``after-gap``: again after ``ttsr.repeatGap`` model calls), its scope admits the
  source (default: text and any tool, not thinking), its ``globs`` (and a scope's path glob)
  match a path of the call's arguments (then it is checked on the call's final arguments, at
  ``toolcall_end``), and a condition regex is found in the buffer — as in the original, in
  the source's whole text so far, so a match may span deltas; searched from where a match
  the new delta made possible can start (``reach``): linear time over a long answer for a
  condition of bounded length, the original's quadratic search for one without a bound.
* A match writes ``ttsr_triggered {rules}`` at once (the rule objects as the original writes
  them). When the rule's ``interruptMode`` (else ``ttsr.interruptMode``) says so for that
  source, the loop cuts the stream (its own cancel scope around the model call; the HTTP
  stream is closed): the partial assistant message ends ``aborted`` with ``TTSR matched rule:
  <name>``, without its tool calls, and its turn ends; the run saga then drops that message
  from the context (``ttsr.contextMode: discard``; ``keep`` keeps it), adds the hidden
  ``ttsr-injection`` custom message (persisted, no message frames; the model reads it as a
  user message) and runs another attempt of the same run (a new ``agent_start``, one
  ``agent_end`` at the end). All of it inside the run's scope: an abort meanwhile ends the run
  as any abort does.
* A match that does not interrupt: in a tool call's arguments, its reminder (the original's
  ``<system-reminder …>`` text) becomes the first text block of that call's result, if the
  call runs; in the text or thinking, the same ``ttsr-injection`` message is queued as a
  follow-up once the assistant message ended normally (``message_done``), as in the
  original: the loop takes it in (with its message frames) when the agent would otherwise
  stop, in the same attempt.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from ..agent.loop import now_ms
from ..commands.dirs import entries
from ..commands.frontmatter import parse_frontmatter
from ..commands.problems import Problem
from ..config import ConfigError, read_text
from ..llm.builder import StreamEvent
from ..protocol import events as ev
from ..protocol import messages as m
from ..tools.base import RulebookRule, ToolResult
from .rule_sources import Level
from .rule_sources import Source as Place
from .settings import TtsrSettings

UNBOUNDED = 1 << 20
"""A reach this long (or none at all: ``.*``, ``+``) means "search the whole text"."""
INJECTION_TYPE = "ttsr-injection"
Source = Literal["text", "thinking", "tool"]
_GLOB_LIKE = re.compile(r"^[\w.\-/{},*?]*\*[\w.\-/{},*?]*$")
_SCOPE = re.compile(r"^(?:tool:)?([A-Za-z0-9_.\-]*)(?:\((.*)\))?$")
_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


@attrs.define(frozen=True)
class ToolScope:
    name: str | None
    """None: any tool."""
    glob: str | None = None


@attrs.define(frozen=True)
class Scope:
    text: bool = False
    thinking: bool = False
    tools: tuple[ToolScope, ...] = ()

    def tool_scopes(self, name: str) -> list[ToolScope]:
        return [t for t in self.tools if t.name is None or t.name == name]


@attrs.define(frozen=True, eq=False)
class Rule:
    name: str
    path: Path
    source: Place
    content: str
    fields: Mapping[str, Any]
    """The frontmatter as written (for ``ttsr_triggered``)."""
    conditions: tuple[re.Pattern[str], ...]
    scope: Scope
    globs: tuple[str, ...] = ()
    interrupt_mode: str | None = None
    agents: tuple[str, ...] | None = None
    """Globs of the agents whose sessions the rule watches (None: every session)."""

    @property
    def level(self) -> Level:
        return self.source.level

    def applies_to(self, agent: str) -> bool:
        """Whether the rule watches the session of ``agent`` (``main``: the top-level
        session; a subagent: its agent's name)."""
        return self.agents is None or any(fnmatch.fnmatchcase(agent, a) for a in self.agents)

    @property
    def needs_path(self) -> bool:
        return bool(self.globs) or any(t.glob for t in self.scope.tools)

    def event_object(self) -> dict[str, Any]:
        """The rule as ``ttsr_triggered`` carries it
        (docs/guides/approval.md#what-a-host-sees-of-a-rule)."""
        f = self.fields
        out: dict[str, Any] = {"name": self.name, "path": str(self.path),
                               "content": self.content}
        if (globs := _strings(f.get("globs"))) is not None:
            out["globs"] = globs
        out["alwaysApply"] = f.get("alwaysApply") is True
        if isinstance(f.get("description"), str):
            out["description"] = f["description"]
        if (condition := _strings(_condition_field(f))) is not None:
            out["condition"] = condition
        if (ast := _strings(f.get("astCondition"))) is not None:
            out["astCondition"] = ast
        if (scope := _strings(f.get("scope"))) is not None:
            out["scope"] = [t for s in scope for t in _split(s)]
        if (agents := _strings(f.get("agents"))) is not None:
            out["agents"] = agents
        if isinstance(f.get("interruptMode"), str):
            out["interruptMode"] = f["interruptMode"]
        out["_source"] = {"provider": self.source.provider,
                          "providerName": self.source.provider_name, "path": str(self.path),
                          "level": self.level}
        return out


def _condition_field(fields: Mapping[str, Any]) -> Any:
    for key in ("condition", "ttsr_trigger", "ttsrTrigger"):
        if fields.get(key) is not None:
            return fields[key]
    return None


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


def _split(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def _compile(token: str) -> re.Pattern[str] | None:
    flags = 0
    if (found := re.match(r"^\(\?([imsx]+)\)", token)) is not None:
        for letter in found.group(1):
            flags |= _FLAGS[letter]
        token = token[found.end():]
    try:
        return re.compile(token, flags)
    except (re.error, RecursionError, OverflowError):
        return None


def _looks_like_glob(token: str) -> bool:
    return bool(_GLOB_LIKE.match(token)) and (token.startswith("*") or "/" in token
                                              or "**" in token)


def _scope(tokens: list[str] | None) -> Scope | None:
    """The scope the tokens name; None for a token that names nothing known."""
    if tokens is None:
        return Scope(text=True, tools=(ToolScope(None),))
    text = thinking = False
    tools: list[ToolScope] = []
    for token in (t for s in tokens for t in _split(s)):
        if token == "text":
            text = True
        elif token == "thinking":
            thinking = True
        elif token in ("tool", "toolcall"):
            tools.append(ToolScope(None))
        elif (found := _SCOPE.match(token)) is not None and (found.group(1) or found.group(2)):
            name, glob = found.group(1), found.group(2)
            tools.append(ToolScope(None if name in ("", "tool", "toolcall") else name,
                                   glob or None))
    return Scope(text, thinking, tuple(tools))


Kind = Literal["ttsr", "always", "rulebook", "refused", "other", "disabled"]
"""What a rule file is to a session: a TTSR rule, an always-apply rule (its body goes into
the system prompt), a rulebook rule (a ``description``: listed in the system prompt, read on
demand as ``rule://<name>``), one refused (``astCondition``), one of no use (none of these),
or turned off (``enabled: false``)."""


def parse_rule(path: Path, source: Place, text: str, name: str | None = None
               ) -> tuple[Kind, Rule | None, Problem | None]:
    """What the rule file at ``path`` (from ``source``) is, with the rule when it is one of
    use; the frontmatter's problem, if any."""
    parsed = parse_frontmatter(text, path)
    fields = parsed.fields
    name = name or path.name.rsplit(".", 1)[0]
    if fields.get("enabled") is False:
        return "disabled", None, parsed.problem
    plain = Rule(name=name, path=path, source=source, content=parsed.body.strip(),
                 fields=fields, conditions=(), scope=Scope(),
                 globs=tuple(_strings(fields.get("globs")) or ()),
                 agents=_agents(fields.get("agents")))
    if source.sticky:
        return "always", plain, parsed.problem
    if source.conditions and _strings(fields.get("astCondition")):
        return "refused", None, parsed.problem
    ttsr = _ttsr(plain, fields) if source.conditions else None
    if ttsr is not None:
        return "ttsr", ttsr, parsed.problem
    if fields.get("alwaysApply") is True:
        return "always", plain, parsed.problem
    if isinstance(fields.get("description"), str) and fields["description"].strip():
        return "rulebook", plain, parsed.problem
    return "other", None, parsed.problem


def _ttsr(plain: Rule, fields: Mapping[str, Any]) -> Rule | None:
    """``plain`` as a TTSR rule, when a condition of it compiles and its scope sees
    something."""
    tokens = _strings(_condition_field(fields)) or []
    patterns: list[re.Pattern[str]] = []
    glob_scopes: list[ToolScope] = []
    for token in tokens:
        if _looks_like_glob(token):
            glob_scopes += [ToolScope("edit", token), ToolScope("write", token)]
        elif (pattern := _compile(token)) is not None:
            patterns.append(pattern)
    if glob_scopes and not patterns:
        patterns.append(re.compile(".*"))
    if not patterns:
        return None
    scope = _scope(_strings(fields.get("scope")))
    if scope is None:
        return None
    if glob_scopes:
        given = fields.get("scope") is not None
        scope = attrs.evolve(scope, text=scope.text and given, tools=(
            *(scope.tools if given else ()), *glob_scopes))
    if not (scope.text or scope.thinking or scope.tools):
        return None
    mode = fields.get("interruptMode")
    return attrs.evolve(plain, conditions=tuple(patterns), scope=scope, interrupt_mode=(
        mode if mode in ("never", "prose-only", "tool-only", "always") else None))


def _agents(value: Any) -> tuple[str, ...] | None:
    names = _strings(value)
    return None if names is None else tuple(names)


@attrs.define(eq=False, repr=False)
class Discovery:
    """What ``load_rules`` found."""

    ttsr: list[Rule] = attrs.field(factory=list)
    always: list[Rule] = attrs.field(factory=list)
    """Always-apply rules (``alwaysApply: true``, ``RULES.md``): their bodies go into the
    system prompt."""
    rulebook: list[Rule] = attrs.field(factory=list)
    """Rules with only a ``description``: the model reads them on demand (``rule://``)."""
    problems: list[Problem] = attrs.field(factory=list)
    skipped: list[Path] = attrs.field(factory=list)
    """A project's rule places left out: the project is not trusted."""
    refused: list[Path] = attrs.field(factory=list)
    """Rule files with an ``astCondition``, which this runtime cannot check."""


def load_rules(places: Sequence[Place], *, trusted: bool,
               settings: TtsrSettings) -> Discovery:
    """The rules of ``places`` (``rule_sources``; a project's only when ``trusted``), the
    first of a name winning; names in ``ttsr.disabledRules`` are dropped. Blocking (small
    files, through the regular-file gate)."""
    found = Discovery()
    claimed: set[str] = set()
    disabled = set(settings.disabledRules)
    for source in places:
        if source.level == "project" and not trusted:
            found.skipped.append(source.path)
            continue
        files = ([source.path] if source.name is not None
                 else _rule_files(source.path, source.suffixes))
        for path in files:
            name = source.name or path.name.rsplit(".", 1)[0]
            if name in claimed:
                continue
            try:
                text = read_text(path)
            except ConfigError as error:
                found.problems.append(Problem.from_config_error(path, error))
                continue
            kind, rule, problem = parse_rule(path, source, text, name)
            if problem is not None:
                found.problems.append(problem)
            if kind == "disabled":
                continue  # not discovered: a rule of that name further down may load
            claimed.add(name)
            if name in disabled:
                continue
            if kind == "refused":
                found.refused.append(path)
            elif kind == "ttsr" and rule is not None:
                found.ttsr.append(rule)
            elif kind == "always" and rule is not None:
                found.always.append(rule)
            elif kind == "rulebook" and rule is not None:
                found.rulebook.append(rule)
    return found


def _rule_files(directory: Path, suffixes: tuple[str, ...]) -> list[Path]:
    return sorted(Path(e.path) for e in entries(directory)
                  if e.name.endswith(suffixes) and not _is_dir(e))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


@functools.cache
def reach(pattern: re.Pattern[str]) -> int | None:
    """How far before the end of a text a match of ``pattern`` that the text's last delta
    made possible can start: the pattern's longest match plus its look-arounds' (None: no
    bound, as for ``.*`` or ``+``, or a pattern the parser cannot size).

    A new match ends in the new delta, or just before it when a look-ahead or an end anchor
    needed the delta; so searching from ``len(old text) - reach`` finds every match the whole
    text would, in time linear in the delta. The sizes come from the ``re`` package's own
    parser (``re._parser``, private: anything unexpected from it means "no bound", which is
    only slower)."""
    parser: Any = getattr(re, "_parser", None)
    try:
        tree = parser.parse(pattern.pattern, pattern.flags)
        longest = int(tree.getwidth()[1]) + _assertions(tree)
    except Exception:  # the private parser changed: search the whole text, as the original
        return None
    return None if longest >= UNBOUNDED else longest


def _assertions(node: Any) -> int:
    """The longest look-arounds of a parsed pattern (``getwidth`` counts them as 0), added
    up over the whole tree: a bound, not an exact figure."""
    total = 0
    for op, value in node.data:
        if str(op) in ("ASSERT", "ASSERT_NOT"):
            inner = value[1]
            total += int(inner.getwidth()[1]) + _assertions(inner)
        else:
            total += sum(_assertions(part) for part in _subpatterns(value))
    return total


def _subpatterns(value: Any) -> Iterable[Any]:
    if hasattr(value, "getwidth"):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _subpatterns(item)


def _start(pattern: re.Pattern[str], old: int, floor: int) -> int:
    """Where to search for ``pattern`` in a text whose first ``old`` characters were searched
    before (``floor``: not before this)."""
    bound = reach(pattern)
    return floor if bound is None else max(floor, old - bound)


def _candidate_paths(arguments: Mapping[str, Any], cwd: Path) -> list[str]:
    """Paths in a call's arguments (keys ``path`` / ``*path``, ``paths`` / ``*paths``), each as
    given, without ``./``, absolute, and relative to the cwd."""
    found: list[str] = []
    for key, value in arguments.items():
        lowered = key.lower()
        values = ([value] if lowered.endswith("path") and isinstance(value, str)
                  else [v for v in value if isinstance(v, str)]
                  if lowered.endswith("paths") and isinstance(value, list) else [])
        for raw in values:
            absolute = Path(raw) if os.path.isabs(raw) else cwd / raw
            forms = [raw, raw.removeprefix("./"), str(absolute)]
            if absolute.is_relative_to(cwd):
                forms.append(str(absolute.relative_to(cwd)))
            found += forms
    return found


def _glob_match(glob: str, paths: Iterable[str]) -> bool:
    return any(fnmatch.fnmatch(p, glob) or fnmatch.fnmatch(os.path.basename(p), glob)
               for p in paths)


def injection_text(rules: Sequence[Rule], cwd: Path, home: Path) -> str:
    """The ``ttsr-injection`` message (docs/guides/approval.md#what-a-host-sees-of-a-rule), rules
    joined by a blank line."""
    blocks = []
    for rule in rules:
        blocks.append(
            f'<system-interrupt reason="rule_violation" rule="{rule.name}" '
            f'path="{_shown_path(rule.path, cwd, home)}">\n'
            "Output interrupted: violated user-defined rule.\n"
            "Not prompt injection; coding agent enforcing project rules.\n"
            "MUST comply:\n\n"
            f"{rule.content}\n"
            "</system-interrupt>")
    return "\n\n".join(blocks)


def _shown_path(path: Path, cwd: Path, home: Path) -> str:
    for base, prefix in ((cwd, ""), (home, "~/")):
        try:
            return prefix + str(path.relative_to(base))
        except ValueError:
            continue
    return str(path)


@attrs.define(eq=False, repr=False)
class Interrupt:
    """Rules that matched: ``stream`` True when they cut the stream."""

    rules: list[Rule]
    stream: bool

    @property
    def reason(self) -> str:
        names = [r.name for r in self.rules]
        label = "rule" if len(names) == 1 else "rules"
        return f"TTSR matched {label}: {', '.join(names)}"


@attrs.define(eq=False, repr=False)
class RuleWatch:
    """One session's rules and what they have seen (``omp.agent.loop.StreamWatch``)."""

    loaded: list[Rule]
    """Every rule discovered (for every agent)."""
    settings: TtsrSettings
    publish: Callable[[ev.SessionEvent], None]
    history: Callable[[], Sequence[m.AgentMessage]]
    """The session's messages: the injected names are read back from them once."""
    cwd: Path
    home: Path = attrs.field(factory=Path.home)
    agent: str = "main"
    """Whose session this is: ``main``, or a subagent's agent name (the rules' ``agents``)."""
    always: list[Rule] = attrs.field(factory=list)
    """The always-apply rules discovered (for every agent)."""
    rulebook: list[Rule] = attrs.field(factory=list)
    """The rulebook rules discovered (for every agent)."""
    rules: list[Rule] = attrs.field(init=False)
    """The rules that watch this session."""
    _injected: dict[str, int] | None = None
    """Rule name → the model call it fired at."""
    _calls: int = 0
    _buffers: dict[str, str] = attrs.field(factory=dict)
    """Per source, what it streamed in this message: all of it, or (``_keep``) its end."""
    _shortened: set[str] = attrs.field(factory=set)
    _keep: int | None = attrs.field(default=None, init=False)
    """How much of a source's text a later search can need (the longest ``reach`` of the
    rules' conditions, plus one); None: all of it (a condition without a bound)."""
    _pending: list[Rule] = attrs.field(factory=list)
    """Matched the text without interrupting: a follow-up once the message ended normally."""
    _by_call: dict[str, list[Rule]] = attrs.field(factory=dict)
    """Matched a tool call's arguments without interrupting: added to that call's result."""

    def __attrs_post_init__(self) -> None:
        self.rules = [r for r in self.loaded if r.applies_to(self.agent)]
        # Rules gated by a path are searched on the call's final arguments only.
        reaches = [reach(p) for r in self.rules if not r.needs_path for p in r.conditions]
        self._keep = (None if any(x is None for x in reaches)
                      else max((x for x in reaches if x is not None), default=0) + 1)

    def for_session(self, agent: str, publish: Callable[[ev.SessionEvent], None],
                    history: Callable[[], Sequence[m.AgentMessage]]) -> RuleWatch:
        """The same rules watching another session (a subagent's, ``agent`` its agent's
        name), with its own buffers and its own record of what fired."""
        return RuleWatch(self.loaded, self.settings, publish, history, self.cwd, self.home,
                         agent, self.always, self.rulebook)

    def always_for(self, agent: str) -> tuple[str, ...]:
        """The bodies of the always-apply rules for ``agent``'s session (its system prompt
        carries them), in discovery order."""
        return tuple(r.content for r in self.always if r.applies_to(agent) and r.content)

    def rulebook_for(self, agent: str) -> tuple[RulebookRule, ...]:
        """The rulebook rules for ``agent``'s session (its system prompt lists them, its
        ``read`` serves them as ``rule://<name>``), in discovery order."""
        return tuple(RulebookRule(r.name, " ".join(str(r.fields["description"]).split()),
                                  r.content, r.path)
                     for r in self.rulebook if r.applies_to(agent))

    @property
    def active(self) -> bool:
        return self.settings.enabled and bool(self.rules)

    def begin(self) -> None:
        """A model call starts: the buffers start empty (and reminders for calls that never
        ran, or text matches of a message that never ended normally, are forgotten)."""
        self._calls += 1
        self._buffers.clear()
        self._shortened.clear()
        self._by_call.clear()
        self._pending.clear()

    def _fired(self) -> dict[str, int]:
        if self._injected is None:
            self._injected = {}
            for message in self.history():
                if (isinstance(message, m.CustomMessage) and message.customType == INJECTION_TYPE
                        and isinstance(message.details, dict)):
                    for name in message.details.get("rules") or []:
                        self._injected[str(name)] = 0
        return self._injected

    def _may_fire(self, rule: Rule) -> bool:
        at = self._fired().get(rule.name)
        if at is None:
            return True
        return (self.settings.repeatMode == "after-gap"
                and self._calls - at >= self.settings.repeatGap)

    def observe(self, event: StreamEvent) -> Interrupt | None:
        """Look at one stream event; an interrupt when a rule says the stream must stop."""
        kind = event.type
        key: str
        source: Source
        tool: str | None
        if kind == "text_delta":
            key, source, tool = "text", "text", None
        elif kind == "thinking_delta":
            key, source, tool = "thinking", "thinking", None
        elif kind in ("toolcall_delta", "toolcall_end"):
            key, source, tool = f"toolcall:{event.content_index}", "tool", event.tool_name
        else:
            return None
        paths: list[str] | None = None
        old = 0  # how much of ``buffer`` earlier events already searched
        floor = 0
        if kind == "toolcall_end" and event.tool_call is not None:
            arguments = event.tool_call.arguments
            # The final arguments, whole: matched as the model meant them.
            buffer = json.dumps(arguments, ensure_ascii=False)
            paths = _candidate_paths(arguments, self.cwd)
        else:
            # As the original: the accumulated text of the source is searched, so a match may
            # span deltas. Each condition is searched only from where a match the new delta
            # made possible can start (``reach``), and only as much text is kept as that
            # needs: linear time for bounded conditions; one without a bound (``a.*b``)
            # searches the whole text at every delta, as the original does. A shortened text
            # is searched from 1, so that ``^`` (without MULTILINE) does not match where the
            # shortening began.
            tail = self._buffers.get(key, "")
            buffer = tail + event.delta
            old = len(tail)
            floor = 1 if key in self._shortened else 0
            keep = self._keep
            if keep is not None and len(buffer) > keep:
                self._buffers[key] = buffer[-keep:]
                self._shortened.add(key)
            else:
                self._buffers[key] = buffer
        matched = [r for r in self.rules if self._may_fire(r)
                   and self._admits(r, source, tool, paths)
                   and any(p.search(buffer, _start(p, old, floor)) for p in r.conditions)]
        if not matched:
            return None
        fired = self._fired()
        for rule in matched:
            fired[rule.name] = self._calls
        self.publish(ev.TtsrTriggered(rules=[r.event_object() for r in matched]))
        cutting = [r for r in matched if self._interrupts(r, source)]
        quiet = [r for r in matched if r not in cutting]
        if source == "tool" and quiet:
            call_id = event.tool_call.id if event.tool_call is not None else event.tool_call_id
            self._by_call.setdefault(call_id, []).extend(quiet)
        else:
            self._pending += quiet
        return Interrupt(cutting, True) if cutting else None

    def tool_result(self, call_id: str, result: ToolResult) -> ToolResult:
        """``result`` with a reminder of the rules the call's arguments matched without
        interrupting, as its first text block
        (docs/guides/approval.md#what-a-host-sees-of-a-rule)."""
        rules = self._by_call.pop(call_id, None)
        if not rules:
            return result
        text = "\n\n".join(
            f'<system-reminder reason="rule_violation" rule="{rule.name}" '
            f'path="{_shown_path(rule.path, self.cwd, self.home)}">\n'
            "User-defined rule matched tool-call arguments. Rule configured not to interrupt "
            "→ tool ran. MUST comply with the following instruction on subsequent tool calls "
            "and responses. NOT prompt injection — coding agent enforcing project rules.\n\n"
            f"{rule.content}\n"
            "</system-reminder>" for rule in rules)
        return ToolResult([m.TextContent(text=text), *result.content], result.details)

    def _admits(self, rule: Rule, source: Source, tool: str | None,
                paths: list[str] | None) -> bool:
        scope = rule.scope
        if source == "text":
            return scope.text
        if source == "thinking":
            return scope.thinking
        assert tool is not None
        scopes = scope.tool_scopes(tool)
        if not scopes:
            return False
        if not rule.needs_path:
            return True
        if paths is None:
            return False  # decided on the final arguments
        if rule.globs and not any(_glob_match(g, paths) for g in rule.globs):
            return False
        return any(t.glob is None or _glob_match(t.glob, paths) for t in scopes)

    def _interrupts(self, rule: Rule, source: Source) -> bool:
        mode = rule.interrupt_mode or self.settings.interruptMode
        if mode == "always":
            return True
        if mode == "prose-only":
            return source in ("text", "thinking")
        if mode == "tool-only":
            return source == "tool"
        return False

    def message_done(self, message: m.AssistantMessage) -> m.CustomMessage | None:
        """The assistant message of a model call ended: the hidden message carrying the rules
        its text or thinking matched without interrupting, which the loop queues as a
        follow-up (docs/guides/approval.md#what-a-host-sees-of-a-rule). None when none matched, or
        when the message ended ``aborted`` / ``error``: then they are dropped, as in the
        original."""
        pending, self._pending = self._pending, []
        if not pending or message.stopReason in ("aborted", "error"):
            return None
        return self.injection(Interrupt(pending, False))

    def injection(self, interrupt: Interrupt) -> m.CustomMessage:
        """The hidden message that carries ``interrupt``'s rules to the model."""
        return m.CustomMessage(
            customType=INJECTION_TYPE, content=injection_text(interrupt.rules, self.cwd,
                                                              self.home),
            display=False, timestamp=now_ms(), attribution="agent",
            details={"rules": [r.name for r in interrupt.rules]})
