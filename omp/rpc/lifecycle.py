"""One server lifecycle, whatever the front end: ``omp --mode rpc`` and the one-shot modes.

``Runtime`` is what one ``serve()`` owns, built before anything is written: the output queue and
the outbox (the session's event sink), the pending host requests, the abort registry, the HTTP
client of its model calls, the host UI and URI bridges, the session and its subagents. A session
that cannot start raises here (``SessionError`` / ``ConfigError``) and nothing is written.

``run_lifecycle`` runs a ``Front`` (the RPC reader and lanes, or one prompt run once) inside the
one root nursery, with the one writer task, the stop signals, the session nursery; then the
shutdown, in one order for every front: the front winds down (commands answered, the run
aborted or settled, extensions told ``session_shutdown``), the output is drained for as long as
the consumer keeps reading, and the HTTP client is closed. This is hypercorn's
``worker_serve(..., shutdown_trigger=...)`` shape: the front is the shutdown trigger.

With ``ServeOptions.deadline`` (``--max-time``) a task of the root nursery aborts the run going
when it passes (``Deadline exceeded``) and no later run starts (``RunCoordinator.expire``).
Startup notices (a ``--config`` overlay's keys this runtime does not act on) are for the front
to write once it writes anything (``startup_notices``).

Signals (only when serving the process's own stdio): the first stop signal is the front's
``stop`` (rpc: the input ends as at EOF; one-shot: the run is aborted, its terminal events still
written); a second one cancels everything at once; SIGINT ends in ``KeyboardInterrupt``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec
import trio

from ..config import agent_dir
from ..extensions.discovery import discover
from ..groups import unwrap
from ..llm.stream import HttpClient
from ..process import (
    adopt_orphans,
    can_watch_signals,
    end_orphans_soon,
    hide_environment_block,
    private_memory,
    watch_stop_signals,
)
from ..protocol import events as ev
from ..protocol.codec import FrameEncoder
from ..session import AgentSession, SessionError, create_session
from ..session.aborts import AbortRegistry
from ..session.approval import ApprovalGate
from ..session.rule_sources import rule_sources
from ..session.sink import EventSink
from ..subagents import SubagentHost
from ..subagents import install as install_subagents
from ..subprocess_env import child_environment
from ..tools.base import Tool
from .bridges import ControlRegistry, HostUI, HostUris, emit_title_enabled
from .options import ServeOptions
from .outbox import Outbox
from .output import ByteSpool, Output, OutputClosedError, write_frames

if TYPE_CHECKING:
    from ..extensions.jshost import JsHost
    from ..extensions.loader import LoadReport
    from ..extensions.ui import ExtensionUI
    from ..llm.local import LocalDiscovery
    from ..mcp.config import LoadedServers, ServerConfig
    from ..mcp.manager import McpManager

DRAIN_STALL_SECONDS = 1.0
"""After the front ended, how long the output may make no progress before unsent frames are
dropped (a consumer that stopped reading must not keep us alive)."""
CLEANUP_SECONDS = 0.5
"""Deadline of the shielded close of the HTTP client."""
DEADLINE_EXCEEDED = "Deadline exceeded"
"""The aborted message's ``errorMessage`` when ``--max-time`` passes (the original's)."""


class Runtime(msgspec.Struct, eq=False):
    """What one ``serve()`` owns (docs/internals.md#resources-belong-to-a-serve)."""

    options: ServeOptions
    output: Output
    outbox: Outbox
    controls: ControlRegistry
    aborts: AbortRegistry
    http: HttpClient
    ui: HostUI
    host_uris: HostUris
    session: AgentSession
    subagents: SubagentHost | None
    mcp: McpManager | None = None
    """The MCP servers (None: none configured; nothing of the SDK is imported then)."""
    extension_host: JsHost | None = None
    """The JavaScript extension host, while one runs (``load_extensions``)."""
    discovery: LocalDiscovery | None = None
    """The local model servers being asked, from right after ``ready``
    (``start_local_discovery``; None before, or when that is off)."""
    notices: list[ev.Notice] = msgspec.field(default_factory=list)
    """Said once at startup (``startup_notices``), beside the settings' own."""
    services: trio.Nursery | None = None
    """The nursery of the session's helper processes (the JavaScript extension host, the eval
    kernel, the language servers: ``ToolContext.services``): the root nursery of
    ``run_lifecycle``; ACP: the session's own."""

    def use_services(self, services: trio.Nursery) -> None:
        """The session's helper processes start in ``services`` from now on."""
        self.services = services
        self.session.tool_context.use_services(services)

    def use_mcp(self, mcp: McpManager) -> None:
        """``mcp`` is the MCP manager from now on (``use_mcp``; ``/mcp reload`` and ACP's
        ``replace_mcp`` give a new one)."""
        self.mcp = mcp

    def use_discovery(self, discovery: LocalDiscovery) -> None:
        """``discovery`` asks the local model servers from now on (``start_local_discovery``)."""
        self.discovery = discovery

    def use_extension_host(self, host: JsHost) -> None:
        """``host`` is the JavaScript extension host running now (``load_extensions``)."""
        self.extension_host = host

    def take_extension_host(self) -> JsHost | None:
        """The JavaScript extension host, if one runs, which the caller now closes; the runtime
        has none after (``close_extension_host``)."""
        host, self.extension_host = self.extension_host, None
        return host


def build_runtime(options: ServeOptions, outbox: Outbox, *, ui: bool = True,
                  sink: EventSink | None = None, require_credentials: bool = False) -> Runtime:
    """Everything one ``serve()`` owns, the session last, its events going to ``sink`` (by
    default ``outbox``, where every other frame goes). Raises SessionError / ConfigError when
    the session cannot start. ``ui`` False: dialogs return their defaults (no host).
    ``require_credentials``: a chosen model without credentials cannot start (one-shot: nobody
    could log in); otherwise it starts and a prompt fails with the login hint."""
    output = outbox.output
    controls = ControlRegistry()
    aborts = AbortRegistry() if options.aborts is None else options.aborts
    http = HttpClient()
    host_ui = HostUI(controls, outbox.emit, enabled=ui and options.ui,
                     emit_title=emit_title_enabled(os.environ))
    host_uris = HostUris(controls, outbox.emit)
    found: list[SubagentHost] = []

    def own_tools(session: AgentSession) -> list[Tool]:
        """The tools that need the session: the host's ``ask`` (``--mode rpc-ui``) and the
        ``task`` tool with its subagent host (unless ``--tools`` chose the tools)."""
        tools: list[Tool] = []
        if options.ask_tool and host_ui.enabled:
            from ..tools.ask import AskTool  # lazy: omp.lazy says why (omp.tools)

            tools.append(AskTool(host_ui))
        host = install_subagents(
            session, outbox.emit,
            agent_directory=session.prompt_options.agent_directory or agent_dir(),
            trusted=project_trusted(options, session.cwd, session.settings.trusted_projects))
        found.append(host)
        if options.tools is None and host.can_spawn():
            tools.append(host.tool())
        return tools

    session = create_session(
        provider=options.provider, model=options.model, api_key=options.api_key,
        thinking=options.thinking, agent_directory=options.agent_dir,
        system_prompt=options.system_prompt, append_system_prompt=options.append_system_prompt,
        cwd=options.cwd, tool_names=options.tools, announce_offline=options.announce_offline,
        persist=options.persist, session_dir=options.session_dir, session_path=options.session,
        resume=options.resume, resume_session=options.resume_session, models=options.models,
        config_files=options.config_files, skill_dirs=plugin_parts(options, "skills"),
        skills=options.skills, require_credentials=require_credentials,
        sink=outbox if sink is None else sink, http=http,
        aborts=aborts, uris=host_uris, tools_from=own_tools)
    session.use_approval(approval_gate(options, session, host_ui))
    runtime = Runtime(options, output, outbox, controls, aborts, http, host_ui, host_uris,
                      session, found[0] if found else None)
    if options.rules:
        use_rules(runtime)
    return runtime


def use_rules(runtime: Runtime) -> None:
    """Load the rules (``omp.session.rule_sources`` says where) and give them to the session:
    the TTSR rules watch its stream, the always-apply ones join its system prompt, the
    rulebook ones are listed there and served by ``read rule://<name>``. A
    project's rules only when the project is trusted (otherwise a notice names what was left
    out); a rule with an ``astCondition`` is refused with a notice naming its file. The rules
    machinery is imported only when a rule place exists."""
    options, session = runtime.options, runtime.session
    directory = session.prompt_options.agent_directory or agent_dir()
    places = rule_sources(
        directory, session.cwd, packages=extension_packages(options, session.cwd),
        plugins=options.plugin_dirs, enabled_providers=session.settings.enabled_providers,
        disabled_providers=session.settings.disabled_providers)
    if not places:
        return
    from ..session.rules import RuleWatch, load_rules

    found = load_rules(
        places, settings=session.settings.ttsr,
        trusted=project_trusted(options, session.cwd, session.settings.trusted_projects))
    session.report_problems(found.problems)
    if found.skipped:
        skipped = ", ".join(str(p) for p in found.skipped)
        runtime.notices.append(ev.Notice(
            level="warning", source="rules",
            message=f"Project rules in {skipped} were not loaded: the project is not trusted "
                    "(start with --trust-project, or list it under trustedProjects in "
                    "~/.omp/agent/config.yml)"))
    for path in found.refused:
        runtime.notices.append(ev.Notice(
            level="warning", source="rules",
            message=f"Rule {path} was not loaded: it has an astCondition (ast-grep patterns), "
                    "which this runtime cannot check; use a regex condition instead"))
    if found.ttsr or found.always or found.rulebook:
        # Kept even when no rule watches the main session: subagents get theirs from it.
        watch = RuleWatch(found.ttsr, session.settings.ttsr, session.publish,
                          lambda: session.messages, session.cwd, always=found.always,
                          rulebook=found.rulebook)
        session.between.use_rules(watch)
        rulebook = watch.rulebook_for("main")
        session.prompt_options.use_rules(watch.always_for("main"), rulebook)
        session.tool_context.use_rulebook(rulebook)


def extension_packages(options: ServeOptions, cwd: Path) -> list[Path]:
    """The extension package directories given with ``-e <dir>`` (relative to ``cwd``): their
    ``rules/`` folders are rule places (a ``-e`` file is a module, not a package)."""
    paths = [p if p.is_absolute() else cwd / p for p in map(Path, options.extensions)]
    return [p for p in paths if p.is_dir()]


def approval_gate(options: ServeOptions, session: AgentSession, ui: ExtensionUI
                  ) -> ApprovalGate:
    """The settings' tool approval with the command line's over it
    (docs/guides/approval.md#modes-and-policies), its questions asked through ``ui``. The
    command line's part is the gate's alone: ``session.settings`` keeps what the files say
    (nothing else reads ``approval`` there)."""
    settings = session.settings.approval
    if options.approval_mode is not None:
        settings = msgspec.structs.replace(settings, mode=options.approval_mode)
    if options.auto_approve:
        settings = msgspec.structs.replace(settings, auto_approve=True)
    return ApprovalGate(settings, ui, options.approve, session.settings.bash,
                        observer=lambda: session.extensions,
                        session_id=lambda: session.session_id,
                        devices=lambda: session.tool_context.devices)


def start_local_discovery(runtime: Runtime, nursery: trio.Nursery,
                          environ: Mapping[str, str] | None = None, *,
                          after: Callable[[], Awaitable[object]] | None = None
                          ) -> LocalDiscovery | None:
    """Start asking the local model servers for their models (``localModels`` in
    ``config.yml``) as a task of ``nursery``, its probes beginning once ``after`` returned;
    None when it is off (there, or ``OMP_LOCAL_MODELS=0``). Called once ``ready`` is
    written: its module is imported then."""
    from ..llm.local import LocalDiscovery, turned_off  # lazy: omp.lazy says why

    session = runtime.session
    chosen = session.settings.local_models
    if not chosen.enabled or turned_off(os.environ if environ is None else environ):
        return None
    servers = session.registry.local_servers()
    if not servers:
        return None
    discovery = LocalDiscovery(session.registry, runtime.http, servers,
                               timeout=chosen.timeoutMs / 1000)
    runtime.use_discovery(discovery)
    discovery.start(nursery, after)
    return discovery


def load_mcp(runtime: Runtime) -> None:
    """The MCP servers of the files and of ``options.mcp_servers``; project servers only in
    a trusted project (otherwise one notice names them). Each front calls it once the
    runtime is built and before it routes a command: ``--mode rpc`` once ``ready`` is written
    (reading the files and importing ``omp.mcp`` cost a start about 3 ms), the one-shot modes
    before their prompts, ACP for each session it opens."""
    from ..mcp.config import load_servers, parse_entry  # lazy: omp.lazy says why

    options, session = runtime.options, runtime.session
    notices = runtime.notices
    given = []
    for name, entry in options.mcp_servers.items():
        try:
            given.append(parse_entry(name, dict(entry)))
        except ValueError as exc:
            notices.append(ev.Notice(level="warning", source="mcp",
                                     message=f"MCP server skipped: {exc}"))
    # ``/mcp reload`` reads the files again the same way (the servers given to ``serve()``
    # and the project's trust as they were at startup).
    load = functools.partial(
        load_servers, session.cwd, session.prompt_options.agent_directory or agent_dir(),
        trusted=project_trusted(options, session.cwd, session.settings.trusted_projects),
        extra=given, enabled_providers=session.settings.enabled_providers,
        disabled_providers=session.settings.disabled_providers,
        plugin_dirs=options.plugin_dirs)
    loaded = load()
    notices += [ev.Notice(level="warning", source="mcp", message=p) for p in loaded.problems]
    if loaded.untrusted:
        notices.append(ev.Notice(level="warning", source="mcp", message=(
            f"Project MCP servers not started ({', '.join(loaded.untrusted)}): the project "
            f"{session.cwd} is not trusted (start with --trust-project, or list it under "
            "trustedProjects in ~/.omp/agent/config.yml)")))
    if loaded.servers:
        use_mcp(runtime, loaded.servers, load)


def use_mcp(runtime: Runtime, servers: Sequence[ServerConfig],
            loader: Callable[[], LoadedServers] | None = None) -> None:
    """Give the runtime its ``McpManager`` for ``servers`` (its ``run`` is for the caller to
    start): the session's ``mcp://`` reads, its ``xd://`` devices, the host's OAuth UI;
    ``loader`` reads the configuration again (``/mcp reload``; None: nothing to reload)."""
    session = runtime.session
    # Imported only when a server is configured (nothing new before ``ready`` otherwise).
    from ..mcp.manager import McpManager
    from ..mcp.resources import McpUris

    # OAuth flows of HTTP servers talk to the user through the host's UI.
    mcp = McpManager(servers, session, runtime.outbox.emit,
                     credentials=session.registry.credentials,
                     host_ui=runtime.ui if runtime.ui.enabled else None, aborts=runtime.aborts,
                     loader=loader)
    runtime.use_mcp(mcp)
    # ``read mcp://<uri>`` reads the servers' resources; other URLs stay the host's.
    context = session.tool_context
    context.use_uris(McpUris(context.uris, mcp))
    if session.settings.xdev:
        from ..mcp.devices import McpDevices

        # ``tools.xdev``: the tools are ``xd://`` devices of ``read`` / ``write``.
        context.mount_devices(McpDevices(session.toolset.devices))


def plugin_parts(options: ServeOptions, part: str) -> list[Path]:
    """The ``part`` folders (``skills``, ``extensions``) of the ``--plugin-dir`` directories
    that have one."""
    return [path for d in options.plugin_dirs if (path := d / part).is_dir()]


PLUGIN_CODE_SUFFIXES = (".ts", ".mts", ".js", ".mjs", ".cjs", ".tsx")


def skipped_plugin_code(options: ServeOptions) -> list[str]:
    """One line per ``--plugin-dir`` holding TypeScript / JavaScript code outside its
    ``extensions`` folder (the original's hooks, tools, commands), which this runtime does not
    run; what is in ``extensions`` loads (TypeScript in the JavaScript extension host)."""
    lines = []
    for directory in options.plugin_dirs:
        try:
            found = sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                           if p.suffix in PLUGIN_CODE_SUFFIXES and "node_modules" not in p.parts
                           and p.relative_to(directory).parts[0] != "extensions")
        except OSError:
            continue
        if found:
            shown = ", ".join(found[:5]) + (f" and {len(found) - 5} more" if len(found) > 5
                                            else "")
            lines.append(f"plugin {directory}: its TypeScript/JavaScript code outside "
                         f"extensions/ is not run by this runtime (skipped: {shown}); its "
                         "extensions and skills load")
    return lines


def startup_notices(runtime: Runtime) -> list[ev.Notice]:
    """What the start said that a host should hear once: settings a ``--config`` overlay sets
    that this runtime does not act on, context files left out (a FIFO named ``AGENTS.md``),
    an untrusted project's rules left out, session files ``--continue`` passed over."""
    session = runtime.session
    skipped = session.store.take_startup_notes()
    return [*(ev.Notice(level="warning", source="config", message=note)
              for note in session.settings.notes),
            *session.prompt_options.take_notices(), *runtime.notices,
            *(ev.Notice(level="warning", source="session", message=note) for note in skipped)]


async def expire_at(runtime: Runtime, deadline: float) -> None:
    """At ``deadline`` (``time.monotonic()``): abort the run going with ``Deadline exceeded``;
    no later run starts. On cancellation nothing happens."""
    await trio.sleep(max(0.0, deadline - time.monotonic()))
    runtime.session.runs.abort_for_good(DEADLINE_EXCEEDED)


def new_output(options: ServeOptions, encoder_limit: int | None = None) -> Output:
    """The output queue of ``options`` (``encoder_limit``: the largest frame before the v1
    size policy applies; ``--mode json`` writes lines of any size)."""
    encoder = FrameEncoder() if encoder_limit is None else FrameEncoder(
        max_frame_bytes=encoder_limit)
    return Output(high_water_bytes=options.output_high_water_bytes,
                      spool=ByteSpool(memory_limit=options.output_memory_bytes,
                                      file_limit=options.output_spill_bytes),
                      encoder=encoder)


class Front(Protocol):
    """A front end of the lifecycle: what reads the host's wishes and decides the end."""

    async def run(self, nursery: trio.Nursery, task_status: trio.TaskStatus[None]) -> None:
        """Serve until it is time to end (the input ended, the run settled); call
        ``task_status.started()`` once serving. On cancellation it stops where it is."""

    def stop(self, signum: int) -> None:
        """The first stop signal (``signum``): end as soon as possible, terminal frames
        written."""

    async def shutdown(self) -> None:
        """Wind down after ``run``: answer what was read, end the run, extensions told.
        On cancellation it stops waiting."""


class Wiring(msgspec.Struct, eq=False):
    """The writer task and the stop signals of one front end's root nursery (``run_lifecycle``,
    ``omp.acp.main.serve_acp``).

    The writer sends ``output`` to stdout; when stdout breaks, the root is cancelled and
    ``raise_outcome`` raises the ``OutputClosedError``. The first stop signal calls ``stop``
    (the front ends as at EOF); a second cancels the root at once; after a SIGINT
    ``raise_outcome`` raises ``KeyboardInterrupt``."""

    output: Output
    stop: Callable[[int], None]
    _root: trio.Nursery | None = None
    _writing: bool = False
    _written: trio.Event = msgspec.field(default_factory=trio.Event)
    _error: OutputClosedError | None = None
    _stops: list[int] = msgspec.field(default_factory=list)

    async def start(self, root: trio.Nursery, stdout: trio.abc.SendStream | None, *,
                    signals: bool) -> None:
        """Start the writer (None: nothing is written) and, with ``signals``, the watch, as
        tasks of ``root`` (they end with it). On cancellation the watch may not have
        started."""
        self._root = root
        if stdout is not None:
            self._writing = True
            root.start_soon(self._write, stdout)
        if signals:
            await root.start(watch_stop_signals, self._on_signal)

    async def _write(self, stdout: trio.abc.SendStream) -> None:
        try:
            await write_frames(self.output, stdout)
        except OutputClosedError as exc:
            self._error = exc
            assert self._root is not None
            self._root.cancel_scope.cancel()
        self._written.set()

    def _on_signal(self, signum: int) -> None:
        self._stops.append(signum)
        if len(self._stops) == 1:
            self.stop(signum)
        else:
            assert self._root is not None
            self._root.cancel_scope.cancel()  # asked again: stop now

    async def finish(self) -> None:
        """Close the output, let the writer send it all while the consumer reads, then
        cancel the root (the writer, if the consumer stopped reading). On cancellation it
        stops waiting."""
        self.output.close()
        if self._writing:
            await _drain(self.output, self._written)
        assert self._root is not None
        self._root.cancel_scope.cancel()

    def raise_outcome(self) -> None:
        """After the root ended: ``KeyboardInterrupt`` after a SIGINT, the output's error when
        stdout broke."""
        if signal.SIGINT in self._stops:
            raise KeyboardInterrupt
        if self._error is not None:
            raise self._error


async def run_lifecycle(runtime: Runtime, stdout: trio.abc.SendStream | None, front: Front,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED, *,
                        signals: bool = False) -> None:
    """Run ``front`` with the writer (to ``stdout``; None: nothing is written), the session
    nursery and the stop signals; then the shutdown. Raises ``KeyboardInterrupt`` after a
    SIGINT, ``OutputClosedError`` when the output broke, ``SessionError`` when the session
    file stopped being written. On cancellation everything is cancelled at once; each
    cleanup has its own short deadline."""
    wiring = Wiring(runtime.output, front.stop)
    try:
        with unwrap():  # one failure leaves as itself, not in the root nursery's group
            async with trio.open_nursery() as root:
                runtime.use_services(root)
                await wiring.start(root, stdout, signals=signals)
                await root.start(runtime.session.run_nursery)
                if runtime.options.deadline is not None:
                    root.start_soon(expire_at, runtime, runtime.options.deadline)
                await front.run(root, task_status)
                # The commands' grace and the escaped orphans' run at once (omp.process).
                end_orphans_soon()
                await front.shutdown()
                await close_extension_host(runtime)
                if runtime.mcp is not None:
                    runtime.mcp.close()  # every server ends, in parallel with the drain
                await wiring.finish()
    finally:
        # The HTTP client belongs to this serve(): its connections must not outlive it.
        with trio.move_on_after(CLEANUP_SECONDS, shield=True):
            await runtime.http.aclose()
    wiring.raise_outcome()
    failure = runtime.session.store.persistence_failure
    if failure is not None:
        # Everything was answered; the host was told by a notice frame. Durability was not
        # kept, which the exit status must say (docs/design/protocol.md#end-of-input).
        raise SessionError(f"Session not saved: {failure}")


async def run_on_stdio(runtime: Runtime, front: Callable[[trio.abc.ReceiveStream], Front], *,
                       write: bool = True,
                       task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """``run_lifecycle`` on the process's own stdio (``omp``'s modes): the front gets stdin,
    the writer stdout (``write`` False: nothing is written, ``omp -p``), and meanwhile anything
    else written to fd 1 goes to stderr; the stop signals are handled (in the main thread) and
    descendants re-parented to the process are ended on return; meanwhile the process's memory
    and environment are not readable by its children (``omp.process.private_memory``), and
    the secrets of its environment (the session's ``EnvironmentPolicy.is_secret``) are gone
    from the block ``/proc/<pid>/environ`` shows for good (``hide_environment_block``: they
    were read into ``os.environ`` at the start). Raises as ``run_lifecycle``; on cancellation
    as ``run_lifecycle`` too."""
    hide_environment_block(runtime.session.tool_context.environment.is_secret)
    with StdioStreams() as (stdin, stdout), private_memory():
        async with adopt_orphans():
            await run_lifecycle(runtime, stdout if write else None, front(stdin), task_status,
                                signals=can_watch_signals())


class StdioStreams:
    """The process's stdin/stdout as trio streams, with fd 1 pointed at stderr meanwhile."""

    def __enter__(self) -> tuple[trio.abc.ReceiveStream, trio.abc.SendStream]:
        sys.stdout.flush()
        self._in_fd = os.dup(0)
        self._out_fd = os.dup(1)
        self._saved_stdout = os.dup(1)
        os.dup2(2, 1)
        self._in = trio.lowlevel.FdStream(self._in_fd)
        self._out = trio.lowlevel.FdStream(self._out_fd)
        return self._in, self._out

    def __exit__(self, *exc: object) -> None:
        # FdStream made the shared descriptions non-blocking; give the host's terminal or pipe
        # back in the mode it had.
        for fd in (0, self._saved_stdout):
            with contextlib.suppress(OSError):
                os.set_blocking(fd, True)
        for stream in (self._in, self._out):
            with contextlib.suppress(OSError):
                stream.close()
        sys.stdout.flush()
        os.dup2(self._saved_stdout, 1)
        os.close(self._saved_stdout)


async def _drain(output: Output, written: trio.Event) -> None:
    """Wait until the writer has sent everything, as long as the consumer keeps reading."""
    while not written.is_set():
        progress = output.delivered
        with trio.move_on_after(DRAIN_STALL_SECONDS):
            await written.wait()
        if output.delivered == progress:
            return  # nothing went out for a while (not one piece): nobody is reading


# -- extensions ------------------------------------------------------------------------------


def extensions_wanted(options: ServeOptions) -> bool:
    """Whether extensions are looked for at all (not with ``--no-extensions`` and none given)."""
    return bool(options.discover_extensions or options.extensions or options.extension_objects
                or options.plugin_dirs)


async def load_extensions(runtime: Runtime, mode: str = "rpc") -> LoadReport | None:
    """Discover and load the session's extensions (their modules run now; TypeScript ones in
    the JavaScript extension host, started now in ``runtime.services`` when there are some);
    None when there is nothing to load or say (the extension machinery is then never
    imported). ``mode``: what ``ctx.mode`` says to TypeScript extensions. Each load error is
    also a line on stderr. On cancellation the host is killed with its nursery."""
    options, session = runtime.options, runtime.session
    if not extensions_wanted(options):
        return None
    for line in skipped_plugin_code(options):
        print(f"omp: {line}", file=sys.stderr)
    trusted = project_trusted(options, session.cwd, session.settings.trusted_projects)
    directory = session.prompt_options.agent_directory or agent_dir()
    sources, skipped = discover(
        cwd=session.cwd, agent_dir=directory,
        paths=[*options.extensions, *plugin_parts(options, "extensions")],
        objects=list(options.extension_objects),
        discovery=options.discover_extensions, trusted=trusted)
    if not sources and skipped is None:
        return None
    from ..extensions.loader import load_sources  # lazy: omp.lazy says why

    spec = None
    if runtime.services is not None and any(s.kind == "js" for s in sources):
        from ..extensions.jsapi import HostSpec  # lazy: omp.lazy says why

        spec = HostSpec(nursery=runtime.services, cwd=session.cwd, mode=mode, trusted=trusted,
                        agent_dir=directory, env=child_environment(
                            session.tool_context.environment, {"PWD": str(session.cwd)}))
    report = await load_sources(sources, emit=runtime.outbox.emit, js_host=spec,
                                skipped_project=skipped)
    if report.js is not None:
        runtime.use_extension_host(report.js.host)
    for path, error in report.errors:
        print(f"Failed to load extension {path}: {error}", file=sys.stderr)
    return report


async def start_extensions(runtime: Runtime, mode: str = "rpc", ui: ExtensionUI | None = None,
                           *, strict: bool = False) -> LoadReport | None:
    """The one extension start of every front (rpc, ``omp -p`` / ``--mode json``, each ACP
    session, ``/reload-plugins``): load them (``load_extensions``; ``mode`` as there), use them
    (``use_extensions``, their dialogs through ``ui``), then run the session's extensions'
    ``session_start``. ``strict``: when an extension named on the command line did not load,
    none is started (the one-shot front then sends nothing). Returns what loading said. On
    cancellation it stops where it is (the JavaScript host is killed with its nursery)."""
    loaded = await load_extensions(runtime, mode)
    if loaded is not None:
        use_extensions(runtime, loaded, ui)
        if strict and loaded.named_errors:
            return loaded
    if (extensions := runtime.session.extensions) is not None:
        await extensions.session_start()
    return loaded


async def close_extension_host(runtime: Runtime) -> None:
    """Kill the JavaScript extension host, if one runs; requests still open to it fail. Not
    cut short by a cancellation of the caller: shielded, with its own deadline
    (``JsHost.aclose``)."""
    host = runtime.take_extension_host()
    if host is not None:
        await host.aclose()


def use_extensions(runtime: Runtime, loaded: LoadReport, ui: ExtensionUI | None = None) -> None:
    """Start the loaded extensions (their dialogs through ``ui``, by default the host's) and
    say what loading said, as frames: each load error (an ``extension_error`` and a
    ``notice``), warnings, an untrusted project."""
    runtime.session.use_extensions(loaded.extensions, runtime.ui if ui is None else ui)
    emit = runtime.outbox.emit
    for path, error in loaded.errors:
        emit(ev.ExtensionError(extensionPath=path, event="load", error=error))
        emit(ev.Notice(level="error", source="extensions",
                       message=f"Extension {path} did not load: {error}"))
    for message in loaded.notices:
        emit(ev.Notice(level="warning", source="extensions", message=message))
    if loaded.skipped_project is not None:
        emit(ev.Notice(level="warning", source="extensions",
                       message=untrusted_project_message(loaded.skipped_project)))


def untrusted_project_message(folder: Path) -> str:
    return (f"Project extensions in {folder} were not loaded: the project is not trusted "
            "(start with --trust-project, or list it under trustedProjects in "
            "~/.omp/agent/config.yml)")


def project_trusted(options: ServeOptions, cwd: Path, trusted: Sequence[Path]) -> bool:
    """Whether code from the project in ``cwd`` may run (project extensions, project agents):
    ``--trust-project``, or the cwd listed in the global ``trustedProjects``."""
    return options.trust_project or any(_same_path(cwd, p) for p in trusted)


def _same_path(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.expanduser().resolve()
    except OSError:
        return False
