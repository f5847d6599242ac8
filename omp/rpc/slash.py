"""Slash commands over RPC (docs/design/extending.md#slash-commands): the one command registry and
the dispatch of a ``prompt`` that starts with ``/``.

**The list** (``available_commands_update``, ``get_available_commands``) is built in the
original's order, first name wins: the built-ins below (their aliases reserved too), every skill
as ``skill:<name>``, the extensions' commands (less those a built-in shadows), then the file
commands, re-read from disk on every build. Prompt templates are not listed.

**A prompt** is offered, in order, to: a skill (``/skill:<name> args`` at the start, or the
token inside the text) → a built-in (the name runs to the first space or ``:``) → an extension
command → a file command → a prompt template → the model, as the text it has become. An unknown
``/x`` is not an error: it reaches the model as typed. ``steer`` / ``follow_up`` expand prompt
templates only.

**Built-ins** run in the serial lane and write what they have to say as ``command_output``
(``session_info_update`` / ``config_update`` first where they change those); the response is
``{agentInvoked: false, disposition: "handled"}``, or ``{agentInvoked: true, disposition:
"started"}`` when they started a run (``/retry``) or left a prompt to run (``/force <tool>
<text>``: ``queued`` when a run goes on). ``/compact``, ``/handoff`` and ``/rename``
without a title are background work: the response comes first, their output when done. Only the
built-ins that fit this runtime exist; the original's others (``ABSENT_BUILTINS``: MCP,
marketplace, SSH, usage, stats, its terminal UI's commands ...) never reach the model: unless an
extension, a file command or a template took the name, they answer ``{agentInvoked: false,
disposition: "handled"}`` with one ``command_output`` saying that they are not available here.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from ..commands import (
    FileCommand,
    PromptTemplate,
    TemplateError,
    find_skill,
    load_file_commands,
    load_prompt_templates,
    parse_skill_invocation,
    skill_message,
    split_command,
)
from ..config import ConfigError, agent_dir
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol import payloads
from ..session import SessionError
from ..session.estimates import estimate_context_tokens, estimate_tokens
from ..session.settings import load_settings
from ..session.system_prompt import read_context_files

if TYPE_CHECKING:
    from ..mcp.manager import McpManager
    from ..session import AgentSession

Emit = Callable[[msgspec.Struct], None]
Spawn = Callable[[Callable[[], Awaitable[None]]], None]


class Local:
    """A built-in's outcome: handled here, no run (``{agentInvoked: false}``)."""


class Started:
    """A built-in's outcome: it started a run (``{agentInvoked: true}``)."""


class Residual(msgspec.Struct, frozen=True):
    """A built-in's outcome: ``text`` is prompted as if the user had typed it."""

    text: str


LOCAL, STARTED = Local(), Started()
Outcome = Local | Started | Residual


class CommandFailed(Exception):
    """A built-in refused: the prompt's response is ``success: false`` with this text."""


Handler = Callable[["Call"], "Outcome | Awaitable[Outcome]"]


class Builtin(msgspec.Struct, frozen=True):
    name: str
    description: str
    handler: Handler
    aliases: tuple[str, ...] = ()
    hint: str | None = None
    subcommands: tuple[tuple[str, str], ...] = ()
    awaits: bool = False
    """The handler is async (it must run in the serial lane as a task, not in place)."""
    awaits_for: Callable[[str], bool] | None = None
    """With ``awaits``: which argument texts await; the others are answered in place, when
    they are read (``/mcp``: only ``test`` connects; ``reauth`` registers its flow with the
    abort registry before the next line, so an ``abort`` right behind it cancels the flow)."""

    def waits(self, args: str) -> bool:
        """Whether ``/<name> <args>`` must run in the serial lane as a task."""
        return self.awaits and (self.awaits_for is None or self.awaits_for(args))

    def entry(self) -> payloads.AvailableCommand:
        return payloads.AvailableCommand(
            name=self.name, source="builtin", description=self.description,
            aliases=list(self.aliases) if self.aliases else msgspec.UNSET,
            input=payloads.CommandInput(hint=self.hint) if self.hint else msgspec.UNSET,
            subcommands=[payloads.Subcommand(name=n, description=d)
                         for n, d in self.subcommands] if self.subcommands else msgspec.UNSET)


class Call(msgspec.Struct, eq=False):
    """One built-in invocation: its argument text and what it may use."""

    slash: Slash
    args: str
    images: list[m.ImageContent]
    request_id: str | int | None = None

    @property
    def session(self) -> AgentSession:
        return self.slash.session

    def output(self, text: str) -> None:
        self.slash.emit(ev.CommandOutput(text=text))


def _by_name() -> dict[str, Builtin]:
    """The built-in commands by name and by alias."""
    return {name: builtin for builtin in BUILTINS for name in (builtin.name, *builtin.aliases)}


class Slash(msgspec.Struct, eq=False):
    """The command registry of one server's session."""

    session: AgentSession
    emit: Emit
    spawn: Spawn
    home: Path | None = None
    """Where the user's ``~/.agent(s)``, ``~/.claude`` folders are (default: the real home)."""
    templates: list[PromptTemplate] = msgspec.field(default_factory=list)
    builtins: dict[str, Builtin] = msgspec.field(default_factory=_by_name)
    """By name and by alias."""
    ordered: list[Builtin] = msgspec.field(default_factory=lambda: list(BUILTINS))
    reload_extensions: Callable[[], Awaitable[None]] | None = None
    """Set by the server that loaded the session's extensions: imports them again."""
    mcp: McpManager | None = None
    """The server's MCP servers (``/mcp``, their prompts as commands); None: none configured."""
    project_trusted: bool = False
    """Whether the project's own MCP servers may run (``/mcp test`` of one of them)."""

    def __post_init__(self) -> None:
        self.reload_templates()

    def use_mcp(self, mcp: McpManager) -> None:
        """``/mcp`` and the servers' prompts as commands go to ``mcp`` from now on."""
        self.mcp = mcp

    def set_project_trusted(self, trusted: bool) -> None:
        """Whether ``/mcp test`` may run one of the project's own servers."""
        self.project_trusted = trusted

    def allow_reload(self, reload: Callable[[], Awaitable[None]]) -> None:
        """``/reload-plugins`` imports the session's extensions again with ``reload``."""
        self.reload_extensions = reload

    @property
    def agent_directory(self) -> Path:
        return self.session.prompt_options.agent_directory or agent_dir()

    # -- loading -------------------------------------------------------------------------

    def file_commands(self) -> list[FileCommand]:
        """Re-read from disk each time (the original does, so an edit shows at once)."""
        commands, problems = load_file_commands(self.agent_directory, self.session.cwd,
                                                home=self.home)
        self.session.report_problems(problems)
        return commands

    def reload_templates(self) -> None:
        templates, problems = load_prompt_templates(self.agent_directory, self.session.cwd)
        self.templates = templates
        self.session.report_problems(problems)

    def reload(self) -> None:
        """``/reload-plugins``: the ``skills`` settings, skills, templates (file commands are
        read on every use). A settings file that no longer loads is said on stderr and the
        session keeps the settings it has."""
        try:
            fresh = load_settings(self.agent_directory, self.session.cwd)
        except ConfigError as exc:
            print(f"omp: {exc}", file=sys.stderr)
        else:
            self.session.settings.use_skills(fresh.skills)
        self.session.load_skills()
        self.reload_templates()

    # -- the list ------------------------------------------------------------------------

    def command_list(self) -> list[payloads.AvailableCommand]:
        entries: list[payloads.AvailableCommand] = []
        taken: set[str] = set()

        def add(entry: payloads.AvailableCommand, *names: str) -> None:
            if entry.name in taken:
                return
            taken.update((entry.name, *names))
            entries.append(entry)

        for builtin in self.ordered:
            add(builtin.entry(), *builtin.aliases)
        if self.session.settings.skills.enableSkillCommands:
            for skill in self.session.skills:
                add(skill.available_command())
        extensions = self.session.extensions
        if extensions is not None:
            for command in extensions.commands().values():
                if self._shadowed(command.name):
                    continue
                add(payloads.AvailableCommand(
                    name=command.name, source="extension",
                    description=command.description or "(extension command)",
                    input=payloads.CommandInput(hint="arguments")))
        for file_command in self.file_commands():
            add(file_command.available_command())
        if self.mcp is not None:
            for name, description, *_ in self.mcp.prompt_commands():
                add(payloads.AvailableCommand(name=name, source="mcp_prompt",
                                              description=description,
                                              input=payloads.CommandInput(hint="arguments")))
        return entries

    def mcp_prompt_for(self, text: str) -> tuple[Any, str, str] | None:
        """``(connection, prompt name, argument text)`` when ``text`` is ``/<server>:<prompt>
        ...`` for a prompt of a connected MCP server."""
        if self.mcp is None or not text.startswith("/"):
            return None
        name, _, rest = text[1:].partition(" ")
        for command, _description, connection, prompt in self.mcp.prompt_commands():
            if command == name:
                return connection, prompt, rest.strip()
        return None

    def _shadowed(self, name: str) -> bool:
        """A built-in takes ``name``: itself, an alias, or ``<builtin>:<x>``."""
        return name in self.builtins or name.partition(":")[0] in self.builtins

    # -- dispatch ------------------------------------------------------------------------

    def builtin_for(self, text: str) -> tuple[Builtin, str] | None:
        """``(builtin, args)`` when ``text`` is ``/name args`` (or ``/name:args``) for one."""
        if not text.startswith("/"):
            return None
        body = text[1:]
        end = next((i for i, c in enumerate(body) if c.isspace() or c == ":"), len(body))
        builtin = self.builtins.get(body[:end])
        if builtin is None:
            return None
        return builtin, body[end + 1:].strip() if end < len(body) else ""

    def skill_for(self, text: str, images: Sequence[m.ImageContent] = ()
                  ) -> tuple[m.CustomMessage, str] | None:
        """The ``skill-prompt`` message for ``/skill:<name> args`` when that skill exists.
        Raises CommandFailed when its file cannot be read."""
        invocation = parse_skill_invocation(text)
        if invocation is None or not self.session.settings.skills.enableSkillCommands:
            return None
        skill = find_skill(self.session.skills, invocation.name)
        if skill is None:
            return None
        try:
            return skill_message(skill, invocation.args, text, images=images), skill.name
        except ConfigError as exc:
            raise CommandFailed(f"Failed to load skill {skill.name}: {exc}") from None

    def expand(self, text: str) -> str:
        """A file command's or a prompt template's expansion of ``text``; ``text`` as it is
        when it names neither. Raises CommandFailed for a template that cannot be rendered."""
        if not text.startswith("/"):
            return text
        parts = split_command(text)
        if parts is None:
            return text
        name, args = parts
        try:
            command = next((c for c in self.file_commands() if c.name == name), None)
            if command is not None:
                return command.expand(args)
            return self.expand_template(text)
        except TemplateError as exc:
            raise CommandFailed(f"/{name}: {exc}") from None

    def absent_builtin(self, text: str) -> str | None:
        """The ``command_output`` for ``/name ...`` when ``name`` is a built-in of the original
        that this runtime does not have; None otherwise."""
        parts = split_command(text) if text.startswith("/") else None
        if parts is None or parts[0] not in ABSENT_BUILTINS:
            return None
        return f"/{parts[0]} is not available in this version."

    def expand_template(self, text: str) -> str:
        """``steer`` / ``follow_up``: prompt templates only."""
        parts = split_command(text) if text.startswith("/") else None
        if parts is None:
            return text
        name, args = parts
        template = next((t for t in self.templates if t.name == name), None)
        if template is None:
            return text
        try:
            return template.expand(args)
        except TemplateError as exc:
            raise CommandFailed(f"/{name}: {exc}") from None

    def run_sync(self, builtin: Builtin, call: Call) -> Outcome:
        result = builtin.handler(call)
        assert not isinstance(result, Awaitable)
        return result

    async def run_async(self, builtin: Builtin, call: Call) -> Outcome:
        """Run an async built-in. On cancellation (shutdown) its work is cancelled."""
        result = builtin.handler(call)
        return await result if isinstance(result, Awaitable) else result

    # -- side channels -------------------------------------------------------------------

    def session_info(self) -> None:
        s = self.session
        self.emit(ev.SessionInfoUpdate(sessionId=s.session_id,
                                       title=s.session_name or msgspec.UNSET))

    def config(self) -> None:
        s = self.session
        self.emit(ev.ConfigUpdate(model=s.model, thinkingLevel=s.thinking_level
                                  if s.model.reasoning else msgspec.UNSET))


# --- the built-ins ------------------------------------------------------------------------------


def _model(call: Call, *, session_only: bool = False) -> Outcome:
    s = call.session
    if not call.args:
        call.output(f"Current model: {s.model.provider}/{s.model.id}")
        return LOCAL
    selector, _, level = call.args.split()[0].partition(":")
    provider, _, model_id = selector.rpartition("/")
    candidates = [x for x in s.registry.all_models()
                  if x.id == model_id and (not provider or x.provider == provider)]
    if not candidates:
        call.output(f"Unknown model: {call.args.split()[0]}")
        return LOCAL
    if level and level not in _LEVELS:
        call.output(f"Unknown thinking level: {level} (one of {', '.join(_LEVELS)})")
        return LOCAL
    chosen = candidates[0]
    try:
        s.set_model(chosen.provider, chosen.id)
    except SessionError as exc:
        raise CommandFailed(str(exc)) from None
    if level:
        s.set_thinking_level(level)  # type: ignore[arg-type]
    call.slash.session_info()
    call.slash.config()
    shown = f"{chosen.provider}/{chosen.id}"
    call.output(f"Session-only model: {shown}." if session_only else f"Model set to {shown}.")
    return LOCAL


def _switch(call: Call) -> Outcome:
    return _model(call, session_only=True)


def _fast(call: Call) -> Outcome:
    s = call.session
    arg = call.args.split()[0].lower() if call.args else ""
    models = s.models
    if arg == "status":
        unavailable = models.fast_mode and not models.fast_mode_active
        call.output(f"Fast mode is {'on' if models.fast_mode else 'off'}"
                    f"{' (not available for the current model)' if unavailable else ''}.")
        return LOCAL
    if arg not in ("", "on", "off"):
        call.output("Usage: /fast [on|off|status]")
        return LOCAL
    enable = (not models.fast_mode) if arg == "" else arg == "on"
    try:
        models.set_fast_mode(enable)
    except SessionError as exc:
        call.output(str(exc))
        return LOCAL
    call.output("Fast mode enabled." if enable else "Fast mode disabled.")
    return LOCAL


async def _export(call: Call) -> Outcome:
    path = next((a for a in call.args.split() if not a.startswith("--")), None)
    try:
        written = await call.session.export_html(path)
    except SessionError as exc:
        call.output(f"Failed to export session: {exc}")
        return LOCAL
    call.output(f"Session exported to: {written}")
    return LOCAL


def _dump(call: Call) -> Outcome:
    s = call.session
    lines = []
    for message in s.messages:
        lines.append(f"## {message.role}\n\n{_message_text(message)}")
    transcript = "\n\n".join(lines) if lines else "(no messages yet)"
    request = {"model": f"{s.model.provider}/{s.model.id}", "systemPrompt": s.system_prompt,
               "tools": [{"name": t.name, "description": t.description,
                          "parameters": t.parameters} for t in s.tools],
               "messages": msgspec.to_builtins(s.messages)}
    fd, name = tempfile.mkstemp(prefix="omp-request-", suffix=".json")  # 0600
    with os.fdopen(fd, "wb") as out:
        out.write(msgspec.json.encode(request))
    call.output(f"{transcript}\n\nLLM request JSON: {name}")
    return LOCAL


def _message_text(message: Any) -> str:
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return content
    parts = []
    for block in content or ():
        if isinstance(block, m.TextContent):
            parts.append(block.text)
        elif isinstance(block, m.ToolCall):
            arguments = msgspec.json.encode(block.arguments).decode()
            parts.append(f"[tool call {block.name} {arguments}]")
        elif isinstance(block, m.ImageContent):
            parts.append("[image]")
    return "\n".join(parts)


def _todo(call: Call) -> Outcome:
    from ..tools.base import ToolError
    from ..tools.todo import apply_op, render_todos

    s = call.session
    op, _, rest = call.args.partition(" ")
    rest = rest.strip()
    if not op:
        phases = s.todos.phases
        call.output(render_todos(phases) if any(p.tasks for p in phases)
                    else "No todos. Use /todo append <task> to start one.")
        return LOCAL
    if op not in ("append", "start", "done", "drop", "rm"):
        call.output("Usage: /todo [append <task>|start <task>|done <task>|drop <task>|rm <task>]")
        return LOCAL
    if not rest:
        call.output(f"Usage: /todo {op} <task>")
        return LOCAL
    args: dict[str, Any] = ({"op": "append", "items": [rest]} if op == "append"
                            else {"op": op, "task": rest})
    try:
        headline = apply_op(s.todos, args)
    except ToolError as exc:
        call.output(str(exc))
        return LOCAL
    call.output(f"{headline}\n\n{render_todos(s.todos.phases)}" if headline
                else render_todos(s.todos.phases))
    return LOCAL


async def _session(call: Call) -> Outcome:
    s = call.session
    sub = call.args.split()[0] if call.args else "info"
    if sub == "info":
        lines = [f"Session: {s.session_id}", f"Title: {s.session_name or '(unnamed)'}",
                 f"CWD: {s.cwd}", f"File: {s.session_file or '(in memory)'}",
                 f"Messages: {len(s.messages)}"]
        call.output("\n".join(lines))
        return LOCAL
    if sub == "delete":
        if s.is_streaming:
            raise CommandFailed("Cannot delete the session while a response is in progress")
        path = s.session_file
        if path is None:
            call.output("No session file to delete (the session is in memory).")
            return LOCAL
        await s.new_session()
        try:
            await trio.Path(path).unlink()
        except OSError as exc:
            call.output(f"Failed to delete session: {exc}")
            return LOCAL
        call.slash.session_info()
        call.output(f"Session deleted: {path}")
        return LOCAL
    call.output("Usage: /session [info|delete]")
    return LOCAL


def _jobs(call: Call) -> Outcome:
    call.output(call.session.jobs.report())
    return LOCAL


def _changelog(call: Call) -> Outcome:
    # Beside the package's modules (not importlib.resources: omp.llm.models.read_catalog).
    text = (Path(__file__).parents[1] / "CHANGELOG.md").read_text(encoding="utf-8")
    if call.args.strip() != "full":
        sections = text.split("\n## ")
        text = "\n## ".join(sections[:4])  # the title and the three newest entries
    call.output(text.strip())
    return LOCAL


def _mcp_awaits(args: str) -> bool:
    return args.split()[:1] in (["test"], ["unauth"], ["reload"])


def _mcp(call: Call) -> Outcome | Awaitable[Outcome]:
    """``/mcp ...``; ``test`` connects to a server (awaited: on cancellation the connection
    is closed), ``unauth`` rewrites ``auth.json``, ``reload`` waits for the servers it stops
    (all three awaited in the serial lane); the rest answers at once."""
    from ..mcp.commands import mcp_command, mcp_reload, mcp_test, mcp_unauth  # lazy: omp.lazy

    words = call.args.split()
    s = call.session
    if not _mcp_awaits(call.args):
        call.output(mcp_command(call.args, call.slash.mcp, s.cwd, call.slash.agent_directory))
        return LOCAL

    async def awaited() -> Outcome:
        if words[0] == "unauth":
            call.output(await mcp_unauth(words[1] if len(words) > 1 else None, call.slash.mcp))
            return LOCAL
        if words[0] == "reload":
            call.output(await mcp_reload(call.slash.mcp))
            return LOCAL
        call.output(await mcp_test(words[1] if len(words) > 1 else None, call.slash.mcp,
                                   s.cwd, call.slash.agent_directory,
                                   trusted=call.slash.project_trusted,
                                   policy=s.tool_context.environment,
                                   credentials=s.registry.credentials, http=s.http.async_client,
                                   settings=s.settings))
        return LOCAL

    return awaited()


def _tools(call: Call) -> Outcome:
    s = call.session
    active = {t.name for t in s.tools}
    call.output("\n".join(f"{'*' if t.name in active else '-'} {t.name}" for t in s.toolset.all())
                or "No tools.")
    return LOCAL


def _context(call: Call) -> Outcome:
    s = call.session
    system = sum(len(block) for block in s.system_prompt) // 4
    tools = sum(len(msgspec.json.encode({"n": t.name, "d": t.description, "p": t.parameters}))
                for t in s.tools) // 4
    by_role: dict[str, int] = {}
    for message in s.messages:
        by_role[message.role] = by_role.get(message.role, 0) + estimate_tokens(message)
    usage = s.maintenance.context_usage()
    window = s.model.contextWindow
    total = usage[0] if usage is not None else system + tools + sum(by_role.values())
    lines = ["Context usage", f"Model: {s.model.provider}/{s.model.id}",
             f"Total: {total:,} tokens" + (f" of {window:,} ({total * 100 // window}%)"
                                           if window else ""),
             f"System prompt: ~{system:,} tokens", f"Tools ({len(s.tools)}): ~{tools:,} tokens"]
    lines += [f"{role} messages: ~{count:,} tokens" for role, count in by_role.items()]
    call.output("\n".join(lines))
    return LOCAL


def _compact(call: Call) -> Outcome:
    s = call.session
    focus = call.args or None
    # Registered now, before the next line is read: an ``abort`` right behind it cancels it.
    scope = s.aborts.hold("maintenance")

    async def work() -> None:
        try:
            result = await s.maintenance.compact(focus, scope=scope)
        except SessionError as exc:
            if str(exc) != "Compaction cancelled":  # aborted: silent, as the original
                call.output(f"Compaction failed: {_strip(str(exc), 'Compaction failed: ')}")
            return
        finally:
            s.aborts.release(scope)
        before = result.tokensBefore
        after = estimate_context_tokens(s.messages)
        call.output(f"Compaction complete. Tokens: {before:,} -> {after:,} "
                    f"(saved {max(before - after, 0):,}).")

    call.slash.spawn(work)
    return LOCAL


def _handoff(call: Call) -> Outcome:
    s = call.session
    if s.is_streaming:
        raise CommandFailed("Cannot hand off while a response is in progress")
    focus = call.args or None
    scope = s.aborts.hold("maintenance")  # before the next line: ``abort`` cancels it

    async def work() -> None:
        try:
            await s.maintenance.handoff(focus, scope=scope)
        except SessionError as exc:
            text = str(exc)
            call.output(text if text == "Handoff cancelled"
                        else f"Handoff failed: {_strip(text, 'Handoff failed: ')}")
            return
        finally:
            s.aborts.release(scope)
        call.output("Context handed off and compacted in place.")

    call.slash.spawn(work)
    return LOCAL


def _strip(text: str, prefix: str) -> str:
    return text[len(prefix):] if text.startswith(prefix) else text


def _retry(call: Call) -> Outcome:
    s = call.session
    if s.is_streaming or not s.retry_failed_turn(call.request_id):
        call.output("Nothing to retry.")
        return LOCAL
    call.output("Retrying the last failed turn.")
    return STARTED


def _rename(call: Call) -> Outcome:
    s = call.session
    if call.args:
        try:
            s.store.set_session_name(call.args)
        except SessionError as exc:
            raise CommandFailed(str(exc)) from None
        call.slash.session_info()
        call.output(f"Session renamed to {s.session_name}.")
        return LOCAL

    async def work() -> None:
        try:
            title = await s.maintenance.generate_title()
            s.store.set_session_name(title)
        except SessionError as exc:
            call.output(f"Failed to generate a title: {exc}")
            return
        call.slash.session_info()
        call.output(f"Session renamed to {s.session_name}.")

    call.slash.spawn(work)
    return LOCAL


def _force(call: Call) -> Outcome:
    s = call.session
    tool, _, prompt = call.args.partition(" ")
    if not tool:
        call.output("Usage: /force <tool> [prompt]")
        return LOCAL
    names = [t.name for t in s.tools]
    if tool not in names:
        raise CommandFailed(f"Unknown tool: {tool} (active tools: {', '.join(names) or 'none'})")
    s.toolset.force(tool)
    call.output(f"Next turn forced to use {tool}.")
    return Residual(prompt.strip()) if prompt.strip() else LOCAL


async def _reload(call: Call) -> Outcome:
    # The context files are read again too, in a worker thread (the prompt built below uses
    # them); one left out is said as a notice, as at startup.
    options = call.session.prompt_options
    found = await trio.to_thread.run_sync(read_context_files, options.cwd, options.directory,
                                          options.disabled_context)
    options.use_context(*found)
    call.slash.reload()
    for notice in options.take_notices():
        call.slash.emit(notice)
    if call.slash.reload_extensions is not None:
        await call.slash.reload_extensions()
        call.output("Reloaded extensions, skills, prompt templates and file commands.")
    else:
        call.output("Reloaded skills, prompt templates and file commands.")
    call.slash.emit(ev.AvailableCommandsUpdate(commands=call.slash.command_list()))
    return LOCAL


ABSENT_BUILTINS = frozenset({
    # The original's built-ins that answer over RPC (docs/design/extending.md#built-ins) ...
    "security", "skillful", "extended-context", "computer", "prewalk", "advisor", "trace",
    "share", "browser", "usage", "stats", "ssh", "fresh", "shake", "pin", "memory",
    "move", "wt", "worktree", "add-dir", "remove-dir", "dirs", "marketplace", "plugins",
    "plugin", "review", "green", "autoresearch",
    # ... and those of its terminal UI, which would reach its model as text over RPC.
    "settings", "setup", "plan", "plan-review", "vibe", "goal", "guided-goal", "loop", "queue",
    "collab", "join", "leave", "copy", "open", "hotkeys", "extensions", "agents", "git", "hub",
    "branch", "fork", "tree", "login", "logout", "new", "clear", "delete", "resume", "btw",
    "tan", "omfg", "cleanse", "debug", "exit", "restart", "live", "pause", "quit", "q"})
"""Built-in commands of the original this runtime does not have: they answer that they are not
available here instead of reaching the model."""

_LEVELS = ("off", "minimal", "low", "medium", "high", "xhigh", "max")

BUILTINS: tuple[Builtin, ...] = (
    Builtin("model", "Show current model selection", _model, aliases=("models",),
            hint="[provider/model[:thinking]]"),
    Builtin("switch", "Switch the model for this session only", _switch,
            hint="[provider/model[:thinking]]"),
    Builtin("fast", "Toggle fast mode", _fast, hint="[on|off|status]",
            subcommands=(("on", "Enable fast mode"), ("off", "Disable fast mode"),
                         ("status", "Show fast mode status"))),
    Builtin("export", "Export the session to an HTML file", _export, hint="[path]",
            awaits=True),
    Builtin("dump", "Show the full transcript and write the LLM request as JSON", _dump),
    Builtin("todo", "Show or edit the todo list", _todo,
            hint="[append|start|done|drop|rm] <task>",
            subcommands=(("append", "Add a task"), ("start", "Start a task"),
                         ("done", "Complete a task"), ("drop", "Abandon a task"),
                         ("rm", "Remove a task"))),
    Builtin("session", "Show session info or delete the session file", _session,
            hint="[info|delete]", awaits=True,
            subcommands=(("info", "Show session info"), ("delete", "Delete the session file"))),
    Builtin("jobs", "List background jobs", _jobs),
    Builtin("changelog", "Show recent changes", _changelog, hint="[full]"),
    Builtin("tools", "List the tools (* active, - inactive)", _tools),
    Builtin("context", "Show the context usage breakdown", _context),
    Builtin("compact", "Compact the conversation context", _compact, hint="[focus]"),
    Builtin("handoff", "Hand off the context to a fresh summary", _handoff, hint="[focus]"),
    Builtin("retry", "Retry the last failed turn", _retry),
    Builtin("rename", "Rename the session (without a title: generate one)", _rename,
            hint="[title]"),
    Builtin("reload-plugins", "Reload extensions, skills, prompt templates and file commands",
            _reload, awaits=True),
    Builtin("force", "Force the next turn to use a tool", _force, hint="<tool> [prompt]"),
    Builtin("mcp", "Manage MCP servers", _mcp, awaits=True, awaits_for=_mcp_awaits,
            hint="[list|add|remove|test|enable|disable|reconnect|reauth|unauth|reload|help]",
            subcommands=(("list", "List configured servers and their state"),
                         ("add", "Add a server"), ("remove", "Remove a server"),
                         ("test", "Connect to a server once"),
                         ("reauth", "Authorize a server with OAuth"),
                         ("unauth", "Forget a server's OAuth tokens"),
                         ("reload", "Apply the MCP configuration now"),
                         ("notifications", "Show the resource subscriptions"),
                         ("enable", "Enable a server"), ("disable", "Disable a server"),
                         ("reconnect", "Reconnect servers now"),
                         ("prompts", "List prompts"), ("resources", "List resources"),
                         ("help", "Show help"))),
)

