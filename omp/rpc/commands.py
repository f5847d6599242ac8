"""The one route table the reader consults, and the handlers of prompting, the abort family,
the protocol itself and the host's tools (the session's file and context are handled in
``omp.rpc.session_commands``, the agent's settings in ``omp.rpc.settings_commands``).

Every command type has one ``Route``: its handler and its lane (docs/internals.md#command-lanes,
docs/design/protocol.md#lanes):

* ``control`` — ``host_tool_result``, ``host_tool_update``, ``host_uri_result``,
  ``extension_ui_response``: handed to the pending request at once, never answered;
* ``immediate`` — the abort family: handled by the reader itself, in order, before it looks at
  the next line, so ``abort`` overtakes anything read after it and a command after it sees its
  effect;
* ``serial`` — everything else, answered one at a time in arrival order (a handler that never
  awaits is answered in place when the lane is idle);
* ``task`` — commands that take long and must not hold the serial lane (``bash``,
  ``export_html``, ``login``): each runs as its own task.

A route that can be aborted names its family in the ``AbortRegistry`` (``omp.session.aborts``):
the reader registers the command's cancel scope there when it reads the line, before it reads
the next one, so an ``abort`` written right after it finds it. A ``scoped`` handler gets that
scope and answers for itself when it is cancelled (``bash``: its cancelled ``BashResult``;
``login``: "Login cancelled"; ``prompt``: its run is that scope, born aborted); any other
handler is run inside it and answered as cancelled work.

A handler takes its command and returns its ``Response``; a route may name what happens right
after that response is queued (``after``: the switch to protocol v2, the commands list after a
session change). This module does not know the server: it gets what it uses in its
constructor (the session, the outbox, the pending-request registry, the abort registry, the
subagent host, the host's UI).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import msgspec
import trio

from ..protocol import commands as cmd
from ..protocol import messages as m
from ..protocol import payloads
from ..protocol.codec import INVALID_PARAMS
from ..protocol.events import AvailableCommandsUpdate, CommandOutput
from ..protocol.frames import SUPPORTED_PROTOCOL_VERSIONS, Response, fail, ok
from ..session import AgentSession, SessionError
from ..session.aborts import ABORT, AbortRegistry, Family
from ..session.stats import context_usage_payload, tokens_per_second
from ..subagents import SubagentHost
from .bridges import (
    INPUT_CLOSED,
    ControlRegistry,
    HostTool,
    HostUI,
    HostUris,
    normalize_schemes,
    validate_host_tools,
)
from .outbox import EventView, Outbox
from .output import Output, SwitchProtocol
from .pi_commands import PiCommands
from .session_commands import SessionCommands
from .settings_commands import SettingsCommands
from .slash import Call, CommandFailed, Outcome, Residual, Slash, Started

INTERNAL_ERROR = "internal_error"
NO_SUBAGENT_BUS = "Subagent event bus is unavailable"

Lane = Literal["control", "immediate", "serial", "task"]


class CustomCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A command an embedding host registered (``ServeOptions.commands``), with its raw body."""

    type: str
    id: cmd.RequestId | None = None
    params: dict[str, Any]

    @classmethod
    def decode(cls, line: bytes, names: frozenset[str]) -> CustomCommand | None:
        try:
            body = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):
            return None
        if not isinstance(body, dict) or body.get("type") not in names:
            return None
        rid = body.get("id")
        if not isinstance(rid, str | int) or isinstance(rid, bool):
            rid = None
        return cls(type=body["type"], id=rid, params=body)


Frame = cmd.Inbound | CustomCommand
"""What a route handles: a frame of the protocol (command or control frame) or a custom command."""
Inbound = cmd.Inbound | CustomCommand | Response
"""What the reader routes: a decoded line (a ``Response`` when the line was bad)."""
CustomHandler = Callable[[CustomCommand], Awaitable[Any]]


class Route(msgspec.Struct, frozen=True):
    handler: Callable[..., Response | Awaitable[Response]]
    lane: Lane
    sync: bool = False
    """The handler never awaits: it returns its Response directly."""
    after: Callable[[Response], None] | None = None
    """Runs right after the response is queued (same lane, no checkpoint between)."""
    family: Family | None = None
    """The abort family of the command's work: its scope is registered when it is read."""
    scoped: bool = False
    """The handler takes that scope too (``handler(frame, scope)``) and answers for itself
    when it is cancelled."""


class Commands:
    # A plain class, not attrs: this module is imported at every start, where attrs' generated
    # methods cost more than the class itself (omp/lazy.py).
    __slots__ = ("aborts", "command_entered", "controls", "custom", "custom_names", "files",
                 "host_uris", "outbox", "pi", "routes", "session", "settings", "slash", "spawn",
                 "subagents", "ui")

    def __init__(self, session: AgentSession, outbox: Outbox,
                 spawn: Callable[[Callable[[], Awaitable[None]]], None],
                 controls: ControlRegistry, host_uris: HostUris, aborts: AbortRegistry,
                 ui: HostUI, subagents: SubagentHost | None = None, *,
                 custom: Mapping[str, CustomHandler] | None = None) -> None:
        custom = custom if custom is not None else {}
        clash = set(custom) & (set(cmd.COMMANDS) | set(cmd.CONTROL_FRAMES))
        if clash:
            raise ValueError(f"custom commands cannot replace built-in ones: {sorted(clash)}")
        self.session = session
        self.outbox = outbox
        self.spawn = spawn
        """Runs work that must not hold the serial lane (extension commands) as a task."""
        self.controls = controls
        self.host_uris = host_uris
        self.aborts = aborts
        self.ui = ui
        self.subagents = subagents
        self.command_entered: trio.Event | None = None
        """Set when the extension command started by the last handler has run to its first
        wait. The lane that answered waits for it before the next line, so what the command
        does at once (``ctx.shutdown()``) applies to every later line, as if it had run in the
        lane."""
        self.custom = custom
        self.custom_names = frozenset(custom)
        self.files = SessionCommands(session)
        """The session's file and context (``omp.rpc.session_commands``)."""
        self.settings = SettingsCommands(session, controls, self.emit, subagents)
        """Model, modes, messages, login, subagents (``omp.rpc.settings_commands``)."""
        self.slash = Slash(session, self.emit, spawn)
        self.pi = PiCommands(session, self.slash, self.emit)
        """pi's commands and ``list_sessions`` (``omp.rpc.pi_commands``)."""
        self.routes: dict[type[Any], Route] = self._route_table()

    @property
    def output(self) -> Output:
        return self.outbox.output

    @property
    def emit(self) -> Callable[[msgspec.Struct], None]:
        return self.outbox.emit

    def _route_table(self) -> dict[type[Any], Route]:
        def serial(handler: Callable[[Any], Response], *,
                   after: Callable[[Response], None] | None = None) -> Route:
            return Route(handler, "serial", sync=True, after=after)

        announce = self.announce_after_success
        files, settings, pi = self.files, self.settings, self.pi
        routes: dict[type[Any], Route] = {
            kind: Route(self.dispatch_control, "control", sync=True)
            for kind in cmd.CONTROL_FRAMES.values()}
        routes.update({
            cmd.Abort: Route(self.abort, "immediate"),
            cmd.AbortAndPrompt: Route(self.abort_and_prompt, "immediate"),
            cmd.AbortBash: Route(self.abort_bash, "immediate", sync=True),
            cmd.AbortRetry: Route(self.abort_retry, "immediate", sync=True),
            cmd.Bash: Route(files.bash, "task", family="bash", scoped=True),
            cmd.ExportHtml: Route(files.export_html, "task", family="command"),
            # compact, handoff and session changes stay in the serial lane on purpose: like the
            # original, commands after them wait until the context is rewritten (a prompt must
            # not start on the old one); ``abort`` (its own lane) still cancels them.
            cmd.Compact: Route(files.compact, "serial", family="maintenance", scoped=True),
            cmd.Handoff: Route(files.handoff, "serial", family="maintenance", scoped=True),
            cmd.NewSession: Route(files.change_session, "serial", after=announce,
                                  family="command"),
            cmd.SwitchSession: Route(files.change_session, "serial", after=announce,
                                     family="command"),
            cmd.OpenSession: Route(files.change_session, "serial", after=announce,
                                   family="command"),
            cmd.Branch: Route(files.branch, "serial", after=announce, family="command"),
            cmd.NegotiateProtocol: serial(self.negotiate_protocol,
                                          after=self.switch_after_success),
            cmd.GetState: serial(self.get_state),
            cmd.SetSteeringMode: serial(settings.set_steering_mode),
            cmd.SetFollowUpMode: serial(settings.set_follow_up_mode),
            cmd.SetInterruptMode: serial(settings.set_interrupt_mode),
            cmd.SetTodos: serial(settings.set_todos),
            cmd.SetEventFilter: serial(self.set_event_filter),
            cmd.GetAvailableCommands: serial(self.get_available_commands),
            # Both may wait for the local servers being asked, and get_available_models with
            # ``refresh`` for the providers' lists (each at most its timeout; the shutdown
            # cancels the wait: ``abort`` leaves the family ``command`` alone).
            cmd.SetModel: Route(settings.set_model, "serial", family="command"),
            cmd.CycleModel: serial(settings.cycle_model),
            cmd.GetAvailableModels: Route(settings.get_available_models, "serial",
                                          family="command"),
            cmd.SetThinkingLevel: serial(settings.set_thinking_level),
            cmd.CycleThinkingLevel: serial(settings.cycle_thinking_level),
            cmd.GetAvailableThinkingLevels: serial(settings.get_available_thinking_levels),
            cmd.SetSessionName: serial(files.set_session_name),
            cmd.GetSessionStats: serial(files.get_session_stats),
            cmd.GetLoginProviders: serial(settings.get_login_providers),
            # A task: the lanes stay free while the user logs in; ``abort`` cancels it.
            cmd.Login: Route(settings.login, "task", family="login", scoped=True),
            cmd.SetSubagentSubscription: serial(settings.set_subagent_subscription),
            cmd.GetSubagents: serial(settings.get_subagents),
            cmd.GetSubagentMessages: Route(settings.get_subagent_messages, "serial",
                                           family="command"),
            cmd.GetBranchMessages: serial(files.get_branch_messages),
            cmd.GetEntries: serial(files.get_entries),
            cmd.GetTree: serial(files.get_tree),
            cmd.GetMessagesPage: serial(files.get_messages_page),
            cmd.SetAutoRetry: serial(settings.set_auto_retry),
            cmd.SetAutoCompaction: serial(settings.set_auto_compaction),
            cmd.SetFastMode: serial(settings.set_fast_mode),
            cmd.SetHostTools: serial(self.set_host_tools),
            cmd.SetHostUriSchemes: serial(self.set_host_uri_schemes),
            cmd.Prompt: Route(self.prompt, "serial", sync=True, after=self.after_prompt,
                              family="run", scoped=True),
            cmd.Steer: serial(self.steer),
            cmd.FollowUp: serial(self.follow_up),
            cmd.GetMessages: serial(settings.get_messages),
            cmd.GetLastAssistantText: serial(settings.get_last_assistant_text),
            cmd.GetCommands: serial(pi.get_commands),
            cmd.ClearQueue: serial(pi.clear_queue),
            cmd.Fork: Route(pi.fork, "serial", after=announce, family="command"),
            cmd.Clone: Route(pi.clone, "serial", after=announce, family="command"),
            cmd.GetForkMessages: serial(pi.get_fork_messages),
            # Reads the files in a thread (the shutdown stops waiting for it).
            cmd.ListSessions: Route(pi.list_sessions, "serial", family="command"),
        })
        missing = [name for name, kind in cmd.COMMANDS.items() if kind not in routes]
        if missing:  # our own bug: every command of the protocol has a route
            raise RuntimeError(f"commands without a route: {missing}")
        return routes

    def route(self, frame: Frame) -> Route:
        if isinstance(frame, CustomCommand):
            return Route(self.run_custom, "serial", family="command")
        if isinstance(frame, cmd.Prompt) and frame.message.startswith("/") and (
                found := self.slash.builtin_for(frame.message)) is not None and found[0].waits(
                    found[1]):
            return Route(self.prompt_builtin, "serial", after=self.after_prompt,
                         family="command")
        if isinstance(frame, cmd.Prompt) and self.slash.mcp_prompt_for(frame.message):
            return Route(self.prompt_mcp, "serial", after=self.after_prompt, family="command")
        return self.routes[type(frame)]

    def internal_error(self, frame: Frame, exc: BaseException) -> Response:
        return fail(_tag(frame), frame.id, f"Internal error: {type(exc).__name__}: {exc}",
                    INTERNAL_ERROR)

    def cancelled(self, frame: Frame) -> Response:
        return fail(_tag(frame), frame.id, INPUT_CLOSED, "cancelled")

    def dispatch_control(self, frame: cmd.ControlFrame) -> Response:
        self.controls.dispatch(frame)
        return _NO_RESPONSE

    def announce_after_success(self, response: Response) -> None:
        if response.success:
            # Through the outbox, as every side frame: a front that reads none (omp -p, each
            # ACP session's own queue) discards it instead of queueing it for ever.
            self.emit(self.available_commands_update())

    def switch_after_success(self, response: Response) -> None:
        # The switch applies to the frames after this response, never to the response itself.
        if response.success:
            self.output.put_nowait(SwitchProtocol(2))

    # -- the abort family (immediate lane) ---------------------------------------------------

    async def abort(self, frame: cmd.Abort) -> Response:
        """Cancel everything of the abort family read so far (the run or the prompt that would
        start one, a retry backoff, a manual compaction, every RPC bash, a login) and answer
        once the aborted run's terminal frames are out."""
        await self._abort()
        return ok("abort", frame.id)

    async def _abort(self) -> None:
        """On cancellation, stops waiting (the abort still happened)."""
        for done in self.aborts.cancel(*ABORT):
            await done.wait()

    def abort_bash(self, frame: cmd.AbortBash) -> Response:
        """Cancel every RPC ``bash`` read so far; each still answers with its cancelled
        result."""
        self.aborts.cancel("bash")
        return ok("abort_bash", frame.id)

    def abort_retry(self, frame: cmd.AbortRetry) -> Response:
        # Succeeds whether or not a backoff was running (docs/design/protocol.md#command-table).
        self.aborts.cancel("retry")
        return ok("abort_retry", frame.id)

    # -- handlers ----------------------------------------------------------------------------

    def get_state(self, frame: cmd.GetState) -> Response:
        s = self.session
        models = s.models
        agent = s.agent
        state = payloads.SessionState(
            model=models.model,
            # Always there ("off" for a model without reasoning, the one level it offers): an
            # ACP adapter refuses a state whose level is absent from the available ones.
            thinkingLevel=models.thinking_level,
            isStreaming=s.is_streaming,
            isCompacting=s.maintenance.compacting,
            steeringMode=agent.steering_mode,
            followUpMode=agent.follow_up_mode,
            interruptMode=agent.interrupt_mode,
            messageCount=len(s.messages),
            queuedMessageCount=s.queued_message_count,
            pendingMessageCount=s.queued_message_count,
            todoPhases=s.todos.phases,
            systemPrompt=list(s.system_prompt),
            dumpTools=[payloads.DumpTool(name=t.name, description=t.description,
                                         parameters=t.parameters) for t in s.tools],
            contextUsage=_context_usage(s.maintenance.context_usage()),
            autoCompactionEnabled=s.auto_compaction,
            fastModeEnabled=models.fast_mode,
            fastModeActive=models.fast_mode_active,
            tokensPerSecond=tokens_per_second(s.messages),
            sessionId=s.session_id,
            sessionFile=s.session_file or msgspec.UNSET,
            sessionName=s.session_name or msgspec.UNSET,
        )
        return ok("get_state", frame.id, state)

    def set_host_tools(self, frame: cmd.SetHostTools) -> Response:
        session = self.session
        problem = validate_host_tools(frame.tools, {t.name for t in session.toolset.own})
        if problem is not None:
            return fail("set_host_tools", frame.id, problem, INVALID_PARAMS)
        tools = [HostTool(self.controls, self.emit, name=t.name.strip(),
                          description=t.description.strip(),
                          label=(t.label.strip() if isinstance(t.label, str) and t.label.strip()
                                 else t.name.strip()), parameters=t.parameters)
                 for t in frame.tools]
        session.set_host_tools(tools)
        return ok("set_host_tools", frame.id,
                  payloads.HostToolNames(toolNames=[t.name for t in tools]))

    def set_host_uri_schemes(self, frame: cmd.SetHostUriSchemes) -> Response:
        schemes, problem = normalize_schemes(frame.schemes)
        if schemes is None:
            return fail("set_host_uri_schemes", frame.id, problem or "invalid schemes",
                        INVALID_PARAMS)
        self.host_uris.use_schemes(schemes)
        return ok("set_host_uri_schemes", frame.id,
                  payloads.HostUriSchemes(schemes=list(schemes)))

    def prompt(self, frame: cmd.Prompt, scope: trio.CancelScope) -> Response:
        """A prompt, through the slash-command dispatch (see ``omp.rpc.slash``): a skill, a
        built-in, an extension command, a file command or template, else the text as is.
        ``scope`` is the one registered when it was read: the run it starts is that scope (an
        ``abort`` read after the prompt aborts that run, even before it started)."""
        images = frame.images if isinstance(frame.images, list) else []
        behavior = frame.streamingBehavior if isinstance(frame.streamingBehavior, str) else None
        text = frame.message
        try:
            if text.startswith("/") or "/skill:" in text:
                if (skill := self.slash.skill_for(text, images)) is not None:
                    # A skill waits for no one: while a run goes on it steers it.
                    disposition = self._disposition()
                    self.session.prompt_message(skill[0], streaming_behavior=behavior or "steer",
                                                request_id=frame.id, scope=scope)
                    return ok("prompt", frame.id, payloads.PromptAck(agentInvoked=True,
                                                                     disposition=disposition))
                if (found := self.slash.builtin_for(text)) is not None:
                    builtin, args = found
                    call = Call(self.slash, args, images, frame.id)
                    return self._after_builtin(frame, self.slash.run_sync(builtin, call), images,
                                               scope)
            return self._prompt_text(frame, "prompt", text, images, behavior, scope)
        except (CommandFailed, SessionError) as exc:
            return fail("prompt", frame.id, str(exc))

    async def prompt_builtin(self, frame: cmd.Prompt) -> Response:
        """A built-in that awaits (``/export``, ``/session delete``), in the serial lane.

        On cancellation (the shutdown; ``abort`` leaves family ``command`` alone) the built-in's
        work is cancelled where it is and ``Cancelled`` propagates (``dispatch.answer`` answers
        it as cancelled work): what it did so far stays (``/session delete`` may have moved to
        a new session without deleting the old file; ``/export`` may still write its page)."""
        images = frame.images if isinstance(frame.images, list) else []
        found = self.slash.builtin_for(frame.message)
        assert found is not None
        builtin, args = found
        try:
            outcome = await self.slash.run_async(builtin, Call(self.slash, args, images,
                                                               frame.id))
            return self._after_builtin(frame, outcome, images, None)
        except (CommandFailed, SessionError) as exc:
            return fail("prompt", frame.id, str(exc))

    async def prompt_mcp(self, frame: cmd.Prompt) -> Response:
        """``/<server>:<prompt> k=v ...``: the server's prompt (``prompts/get``) is sent as the
        user's prompt; the response has no data (the original's custom-command path).

        On cancellation (the shutdown; ``abort`` leaves family ``command`` alone) the
        ``prompts/get`` request is abandoned, nothing is prompted, and ``Cancelled``
        propagates (``dispatch.answer`` answers it as cancelled work)."""
        found = self.slash.mcp_prompt_for(frame.message)
        if found is None:  # the server went away since the command was read
            return self._prompt_text(frame, "prompt", frame.message, frame.images or [], None,
                                     None)
        from ..mcp.commands import prompt_arguments  # lazy: omp.lazy says why

        connection, prompt, args = found
        try:
            text = await connection.prompt_text(prompt, prompt_arguments(args))
        except Exception as exc:  # the server's failure is the host's answer, not our crash
            reason = str(exc) or type(exc).__name__
            return fail("prompt", frame.id,
                        f'MCP prompt "{connection.name}:{prompt}" failed: {reason}')
        images = frame.images if isinstance(frame.images, list) else []
        disposition = self._disposition()
        try:
            self.session.prompt(text, images, request_id=frame.id)
        except SessionError as exc:
            return fail("prompt", frame.id, str(exc))
        return ok("prompt", frame.id, payloads.PromptAck(agentInvoked=True,
                                                         disposition=disposition))

    def _after_builtin(self, frame: cmd.Prompt, outcome: Outcome, images: list[m.ImageContent],
                       scope: trio.CancelScope | None) -> Response:
        if isinstance(outcome, Residual):
            # ``/force <tool> <text>``: the text runs as a prompt.
            disposition = self._disposition()
            self.session.prompt(outcome.text, images, request_id=frame.id, scope=scope)
            return ok("prompt", frame.id, payloads.PromptAck(agentInvoked=True,
                                                             disposition=disposition))
        started = isinstance(outcome, Started)
        return ok("prompt", frame.id, payloads.PromptAck(
            agentInvoked=started, disposition="started" if started else "handled"))

    def _disposition(self) -> payloads.Disposition:
        """What becomes of a prompt accepted now: queued behind the run going on, or the
        start of a run (docs/protocol/index.md#how-a-prompt-ends)."""
        return "queued" if self.session.runs.run is not None else "started"

    def after_prompt(self, response: Response) -> None:
        """Right after a prompt's response: the ``prompt_result`` of one handled here (a
        built-in that started no run), so that every accepted prompt has one."""
        data = response.data
        if (response.success and isinstance(data, payloads.PromptAck)
                and data.agentInvoked is False):
            self.session.runs.local(response.id)

    def _prompt_text(self, frame: cmd.Prompt | cmd.AbortAndPrompt, kind: str, text: str,
                     images: list[m.ImageContent], behavior: str | None,
                     scope: trio.CancelScope | None) -> Response:
        """The session pipeline (docs/design/extending.md#dispatch-order): an extension command,
        else the text expanded by a file command or a prompt template, sent to the model. Raises
        CommandFailed and SessionError."""
        if (command := self._extension_command(text)) is not None:
            return self._run_extension_command(frame.id, kind, *command)
        expanded = self.slash.expand(text)
        if expanded is text and (absent := self.slash.absent_builtin(text)) is not None:
            # One of the original's built-ins: said to the host, never sent to the model.
            self.slash.emit(CommandOutput(text=absent))
            return ok(kind, frame.id, payloads.PromptAck(agentInvoked=False,
                                                         disposition="handled"))
        disposition = self._disposition()
        self.session.prompt(expanded, images, streaming_behavior=behavior,
                            request_id=frame.id, scope=scope)
        return ok(kind, frame.id, payloads.PromptAck(agentInvoked=True,
                                                     disposition=disposition))

    def steer(self, frame: cmd.Steer) -> Response:
        if (command := self._extension_command(frame.message)) is not None:
            return fail("steer", frame.id, _not_queueable(command[0]))
        disposition = self._disposition()
        try:
            self.session.steer(self.slash.expand_template(frame.message), frame.images or [])
        except (CommandFailed, SessionError) as exc:
            return fail("steer", frame.id, str(exc))
        return ok("steer", frame.id, payloads.QueueAck(disposition=disposition))

    def follow_up(self, frame: cmd.FollowUp) -> Response:
        if (command := self._extension_command(frame.message)) is not None:
            return fail("follow_up", frame.id, _not_queueable(command[0]))
        disposition = self._disposition()
        try:
            self.session.follow_up(self.slash.expand_template(frame.message),
                                   frame.images or [])
        except (CommandFailed, SessionError) as exc:
            return fail("follow_up", frame.id, str(exc))
        return ok("follow_up", frame.id, payloads.QueueAck(disposition=disposition))

    async def abort_and_prompt(self, frame: cmd.AbortAndPrompt) -> Response:
        """Abort, then the prompt through the session pipeline only (no skill, no
        built-in: docs/design/protocol.md#command-table). Its run's scope is registered before the
        reader reads the next line (the reader waits for this handler).

        On cancellation while it waits for the aborted work to end, the abort still happened;
        no prompt is sent, nothing is answered and ``Cancelled`` propagates."""
        await self._abort()
        images = frame.images if isinstance(frame.images, list) else []
        try:
            return self._prompt_text(frame, "abort_and_prompt", frame.message, images, None,
                                     None)
        except (CommandFailed, SessionError) as exc:
            return fail("abort_and_prompt", frame.id, str(exc))

    def negotiate_protocol(self, frame: cmd.NegotiateProtocol) -> Response:
        version = frame.protocolVersion
        if type(version) is not int or version not in SUPPORTED_PROTOCOL_VERSIONS or version < 2:
            shown = version if isinstance(version, str) else msgspec.json.encode(version).decode()
            return fail("negotiate_protocol", frame.id,
                        f"Unsupported RPC protocol version: {shown}", INVALID_PARAMS)
        return ok("negotiate_protocol", frame.id,
                  payloads.ProtocolVersionPayload(protocolVersion=2))

    def set_event_filter(self, frame: cmd.SetEventFilter) -> Response:
        events = frame.events
        if isinstance(events, list) and not all(e.strip() for e in events):
            return fail("set_event_filter", frame.id,
                        "events must be null or an array of non-empty event type strings",
                        INVALID_PARAMS)
        view = self.outbox.view
        self.outbox.use_view(EventView(
            types=None if events is None else frozenset(events) if isinstance(events, list)
            else view.types,
            message_updates=frame.messageUpdates if isinstance(frame.messageUpdates, str)
            else view.message_updates))
        shown = None if self.outbox.view.types is None else [
            e for e in dict.fromkeys(events if isinstance(events, list) else sorted(
                self.outbox.view.types))]
        return ok("set_event_filter", frame.id, payloads.EventFilterPayload(
            events=shown, messageUpdates="delta" if self.outbox.view.message_updates == "delta"
            else "snapshot"))

    def get_available_commands(self, frame: cmd.GetAvailableCommands) -> Response:
        return ok("get_available_commands", frame.id,
                  payloads.AvailableCommandsPayload(commands=self.command_list()))

    def available_commands_update(self) -> AvailableCommandsUpdate:
        return AvailableCommandsUpdate(commands=self.command_list())

    def command_list(self) -> list[payloads.AvailableCommand]:
        """The slash commands a host can offer (``omp.rpc.slash``)."""
        return self.slash.command_list()

    # -- extension commands ------------------------------------------------------------------

    def _extension_command(self, text: str) -> tuple[str, str] | None:
        """``(name, args)`` when ``text`` is ``/name args`` for an extension command."""
        extensions = self.session.extensions
        if extensions is None or not text.startswith("/"):
            return None
        name, _, args = text[1:].partition(" ")
        name = name.strip()
        if name not in extensions.commands():
            return None
        return name, args.strip()

    def _run_extension_command(self, request_id: cmd.RequestId | None, kind: str, name: str,
                               args: str) -> Response:
        """Start ``/name args`` as a task (it may wait for the host's answers and must not
        hold the serial lane); its ``prompt_result`` comes when it is done
        (docs/design/protocol.md#prompt_result). The response says ``handled`` (pi's word) and
        no ``agentInvoked``: whether the agent is invoked is not known yet."""
        runs = self.session.runs
        extensions = self.session.extensions
        assert extensions is not None
        entered = self.command_entered = trio.Event()
        ticket = runs.open_command(request_id)

        async def run() -> None:
            with runs.running_command(ticket):
                # Set before the handler starts: whoever waits on it resumes only once the
                # handler ran up to its first wait (see ``command_entered``).
                entered.set()
                succeeded = await extensions.run_command(name, args)
            runs.command_ended(ticket, succeeded, name)

        self.spawn(run)
        return ok(kind, request_id, payloads.PromptAck(disposition="handled"))

    def take_command_entered(self) -> trio.Event | None:
        """The ``command_entered`` event of the extension command the last handler started,
        if any; cleared, so each is waited for once."""
        entered, self.command_entered = self.command_entered, None
        return entered

    async def run_custom(self, frame: CustomCommand) -> Response:
        """A command the embedding host registered: its handler's data, or its exception's
        text as the failure. On cancellation (the shutdown; ``abort`` leaves family
        ``command`` alone) the handler is cancelled with it and ``Cancelled`` propagates
        (``dispatch.answer`` answers it as cancelled work)."""
        try:
            data = await self.custom[frame.type](frame)
        except Exception as exc:
            return fail(frame.type, frame.id, str(exc) or type(exc).__name__)
        return ok(frame.type, frame.id, msgspec.UNSET if data is None else data)


_NO_RESPONSE = Response(success=True)
"""What the control route returns: control frames are never answered (the lane drops it)."""


def _not_queueable(name: str) -> str:
    return (f'Extension command "/{name}" cannot be queued. Use prompt() or execute the command '
            "when not streaming.")


def _context_usage(usage: tuple[int, int] | None) -> Any:
    return msgspec.UNSET if usage is None else context_usage_payload(*usage)


def _tag(frame: Any) -> str:
    if isinstance(frame, CustomCommand):
        return frame.type
    tag = frame.__struct_config__.tag
    return tag if isinstance(tag, str) else "unknown"
