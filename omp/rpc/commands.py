"""Command handlers and the one route table the reader consults.

Every command type has one ``Route``: its handler and its lane (DESIGN.md §2, rpc-behavior §1.5):

* ``control`` — ``host_tool_result``, ``host_tool_update``, ``host_uri_result``,
  ``extension_ui_response``: handed to the pending request at once, never answered;
* ``immediate`` — the abort family: handled by the reader itself, in order, before it looks at
  the next line, so ``abort`` overtakes anything read after it and a command after it sees its
  effect;
* ``serial`` — everything else, answered one at a time in arrival order (a handler that never
  awaits is answered in place when the lane is idle);
* ``task`` — commands that take long and must not hold the serial lane (``bash``,
  ``export_html``, ``login``): each runs as its own task.

A handler takes its command and returns its ``Response``; a route may name what happens right
after that response is queued (``after``: the switch to protocol v2, the commands list after a
session change). This module does not know the server: it gets the session, the output queue,
the pending-request registry and an emit callable.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import msgspec
import trio
from msgspec import UNSET

from ..config import ConfigError
from ..extensions.ui import UiDisconnected
from ..login import FrameLoginUI, LoginError, run_login
from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol import payloads
from ..protocol.codec import INVALID_PARAMS
from ..protocol.events import AvailableCommandsUpdate
from ..protocol.frames import SUPPORTED_PROTOCOL_VERSIONS, Response, fail, ok
from ..session import AgentSession, SessionError
from ..session.errors import InvalidRequest
from ..session.stats import context_usage_payload, session_stats
from ..subagents import SubagentHost, SubagentRegistry, UnknownSubagent, read_messages
from .bridges import (
    ControlRegistry,
    Emit,
    HostTool,
    HostUI,
    HostUris,
    normalize_schemes,
    validate_host_tools,
)
from .output import FrameQueue, SwitchProtocol
from .paging import PageError, encode_tree, page
from .slash import Call, CommandFailed, Outcome, Residual, Slash, Started

NOT_IMPLEMENTED = "not_implemented"
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
    handler: Callable[[Any], Response | Awaitable[Response]]
    lane: Lane
    sync: bool = False
    """The handler never awaits: it returns its Response directly."""
    after: Callable[[Response], None] | None = None
    """Runs right after the response is queued (same lane, no checkpoint between)."""


@attrs.define(eq=False, repr=False)
class EventView:
    """How the host wants session events (``set_event_filter``)."""

    types: frozenset[str] | None = None
    """Session event types to send; None: all."""
    message_updates: str = "snapshot"


@attrs.define(eq=False, repr=False)
class Commands:
    session: AgentSession
    output: FrameQueue
    emit: Emit
    spawn: Callable[[Callable[[], Awaitable[None]]], None]
    """Runs work that must not hold the serial lane (extension commands) as a task."""
    command_entered: trio.Event | None = attrs.field(default=None, init=False)
    """Set when the extension command started by the last handler has run to its first wait.
    The lane that answered waits for it before the next line, so what the command does at
    once (``ctx.shutdown()``) applies to every later line, as if it had run in the lane."""
    custom: Mapping[str, CustomHandler] = attrs.field(factory=dict)
    view: EventView = attrs.field(factory=EventView)
    controls: ControlRegistry = attrs.field(factory=ControlRegistry)
    bash_scopes: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    closing: bool = attrs.field(default=False, init=False)
    """The input ended: commands still to run are answered as cancelled work."""
    subagent_level: str = attrs.field(default="off", init=False)
    host_uris: HostUris = attrs.field(init=False)
    routes: dict[type[Any], Route] = attrs.field(init=False)
    custom_names: frozenset[str] = attrs.field(init=False)
    slash: Slash = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        clash = set(self.custom) & (set(cmd.COMMANDS) | set(cmd.CONTROL_FRAMES))
        if clash:
            raise ValueError(f"custom commands cannot replace built-in ones: {sorted(clash)}")
        self.custom_names = frozenset(self.custom)
        self.host_uris = HostUris(self.controls, self.emit)
        self.session.tool_context.uris = self.host_uris
        self.routes = self._route_table()
        self.slash = Slash(self.session, self.emit, self.spawn)

    def _route_table(self) -> dict[type[Any], Route]:
        def serial(handler: Callable[[Any], Response], *,
                   after: Callable[[Response], None] | None = None) -> Route:
            return Route(handler, "serial", sync=True, after=after)

        announce = self.announce_after_success
        routes: dict[type[Any], Route] = {
            kind: Route(self.dispatch_control, "control", sync=True)
            for kind in cmd.CONTROL_FRAMES.values()}
        routes.update({
            cmd.Abort: Route(self.abort, "immediate"),
            cmd.AbortAndPrompt: Route(self.abort_and_prompt, "immediate"),
            cmd.AbortBash: Route(self.abort_bash_command, "immediate", sync=True),
            cmd.AbortRetry: Route(self.abort_retry, "immediate", sync=True),
            cmd.Bash: Route(self.bash, "task"),
            cmd.ExportHtml: Route(self.export_html, "task"),
            # compact, handoff and session changes stay in the serial lane on purpose: like the
            # original, commands after them wait until the context is rewritten (a prompt must
            # not start on the old one); ``abort`` (its own lane) still cancels them.
            cmd.Compact: Route(self.compact, "serial"),
            cmd.Handoff: Route(self.handoff, "serial"),
            cmd.NewSession: Route(self.change_session, "serial", after=announce),
            cmd.SwitchSession: Route(self.change_session, "serial", after=announce),
            cmd.OpenSession: Route(self.change_session, "serial", after=announce),
            cmd.Branch: Route(self.branch, "serial", after=announce),
            cmd.NegotiateProtocol: serial(self.negotiate_protocol,
                                          after=self.switch_after_success),
            cmd.GetState: serial(self.get_state),
            cmd.SetSteeringMode: serial(self.set_steering_mode),
            cmd.SetFollowUpMode: serial(self.set_follow_up_mode),
            cmd.SetInterruptMode: serial(self.set_interrupt_mode),
            cmd.SetTodos: serial(self.set_todos),
            cmd.SetEventFilter: serial(self.set_event_filter),
            cmd.GetAvailableCommands: serial(self.get_available_commands),
            cmd.SetModel: serial(self.set_model),
            cmd.CycleModel: serial(self.cycle_model),
            cmd.GetAvailableModels: serial(self.get_available_models),
            cmd.SetThinkingLevel: serial(self.set_thinking_level),
            cmd.CycleThinkingLevel: serial(self.cycle_thinking_level),
            cmd.GetAvailableThinkingLevels: serial(self.get_available_thinking_levels),
            cmd.SetSessionName: serial(self.set_session_name),
            cmd.GetSessionStats: serial(self.get_session_stats),
            cmd.GetLoginProviders: serial(self.get_login_providers),
            # A task: the lanes stay free while the user logs in; ``abort`` cancels it.
            cmd.Login: Route(self.login, "task"),
            cmd.SetSubagentSubscription: serial(self.set_subagent_subscription),
            cmd.GetSubagents: serial(self.get_subagents),
            cmd.GetSubagentMessages: Route(self.get_subagent_messages, "serial"),
            cmd.GetBranchMessages: serial(self.get_branch_messages),
            cmd.GetEntries: serial(self.get_entries),
            cmd.GetTree: serial(self.get_tree),
            cmd.GetMessagesPage: serial(self.get_messages_page),
            cmd.SetAutoRetry: serial(self.set_auto_retry),
            cmd.SetAutoCompaction: serial(self.set_auto_compaction),
            cmd.SetFastMode: serial(self.set_fast_mode),
            cmd.SetHostTools: serial(self.set_host_tools),
            cmd.SetHostUriSchemes: serial(self.set_host_uri_schemes),
            cmd.Prompt: serial(self.prompt),
            cmd.Steer: serial(self.steer),
            cmd.FollowUp: serial(self.follow_up),
            cmd.GetMessages: serial(self.get_messages),
            cmd.GetLastAssistantText: serial(self.get_last_assistant_text),
        })
        missing = [name for name, kind in cmd.COMMANDS.items() if kind not in routes]
        if missing:  # our own bug: every command of the protocol has a route
            raise RuntimeError(f"commands without a route: {missing}")
        return routes

    def route(self, frame: Frame) -> Route:
        if isinstance(frame, CustomCommand):
            return Route(self.run_custom, "serial")
        if isinstance(frame, cmd.Prompt) and frame.message.startswith("/") and (
                found := self.slash.builtin_for(frame.message)) is not None and found[0].awaits:
            return Route(self.prompt_builtin, "serial")
        return self.routes[type(frame)]

    def internal_error(self, frame: Frame, exc: BaseException) -> Response:
        return fail(_tag(frame), frame.id, f"Internal error: {type(exc).__name__}: {exc}",
                    INTERNAL_ERROR)

    def cancelled(self, frame: Frame) -> Response:
        return fail(_tag(frame), frame.id,
                    "Cancelled: the host closed the input before the command finished",
                    "cancelled")

    def dispatch_control(self, frame: cmd.ControlFrame) -> Response:
        self.controls.dispatch(frame)
        return _NO_RESPONSE

    def announce_after_success(self, response: Response) -> None:
        if response.success:
            self.output.put_nowait(self.available_commands_update())

    def switch_after_success(self, response: Response) -> None:
        # The switch applies to the frames after this response, never to the response itself.
        if response.success:
            self.output.put_nowait(SwitchProtocol(2))

    # -- the abort family (immediate lane) ---------------------------------------------------

    async def abort(self, frame: cmd.Abort) -> Response:
        """Cancel the run (and every RPC bash: abort includes abort_bash, rpc-behavior §10.4)
        and answer once its terminal frames are out."""
        self.abort_bash()
        self.session.registry.credentials.cancel_login()
        await self.session.abort()
        return ok("abort", frame.id)

    def abort_bash_command(self, frame: cmd.AbortBash) -> Response:
        self.abort_bash()
        return ok("abort_bash", frame.id)

    def abort_retry(self, frame: cmd.AbortRetry) -> Response:
        # Succeeds whether or not a backoff was running (rpc-behavior §2.2).
        self.session.abort_retry()
        return ok("abort_retry", frame.id)

    def abort_bash(self) -> None:
        """Cancel every running RPC ``bash``; each still answers with its cancelled result."""
        for scope in list(self.bash_scopes):
            scope.cancel()

    # -- handlers ----------------------------------------------------------------------------

    def get_state(self, frame: cmd.GetState) -> Response:
        s = self.session
        state = payloads.SessionState(
            model=s.model,
            thinkingLevel=s.thinking_level if s.model.reasoning else msgspec.UNSET,
            isStreaming=s.is_streaming,
            isCompacting=s.is_compacting,
            steeringMode=s.steering_mode,
            followUpMode=s.follow_up_mode,
            interruptMode=s.interrupt_mode,
            messageCount=s.message_count,
            queuedMessageCount=s.queued_message_count,
            todoPhases=s.todo_phases,
            systemPrompt=list(s.system_prompt),
            dumpTools=[payloads.DumpTool(name=t.name, description=t.description,
                                         parameters=t.parameters) for t in s.tools],
            contextUsage=_context_usage(s.context_usage()),
            autoCompactionEnabled=s.auto_compaction,
            fastModeEnabled=s.fast_mode,
            fastModeActive=s.fast_mode_active,
            sessionId=s.session_id,
            sessionFile=s.session_file or msgspec.UNSET,
            sessionName=s.session_name or msgspec.UNSET,
        )
        return ok("get_state", frame.id, state)

    def set_host_tools(self, frame: cmd.SetHostTools) -> Response:
        session = self.session
        problem = validate_host_tools(frame.tools, {t.name for t in session.builtin_tools})
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
        self.host_uris.schemes = schemes
        return ok("set_host_uri_schemes", frame.id,
                  payloads.HostUriSchemes(schemes=list(schemes)))

    def prompt(self, frame: cmd.Prompt) -> Response:
        """A prompt, through the slash-command dispatch (see ``omp.rpc.slash``): a skill, a
        built-in, an extension command, a file command or template, else the text as is."""
        images = frame.images if isinstance(frame.images, list) else []
        behavior = frame.streamingBehavior if isinstance(frame.streamingBehavior, str) else None
        text = frame.message
        try:
            if text.startswith("/") or "/skill:" in text:
                if (skill := self.slash.skill_for(text, images)) is not None:
                    # A skill waits for no one: while a run goes on it steers it.
                    self.session.prompt_message(skill[0], streaming_behavior=behavior or "steer",
                                                request_id=frame.id)
                    return ok("prompt", frame.id, payloads.PromptAck(agentInvoked=True))
                if (found := self.slash.builtin_for(text)) is not None:
                    builtin, args = found
                    call = Call(self.slash, args, images, frame.id)
                    return self._after_builtin(frame, self.slash.run_sync(builtin, call), images)
            return self._prompt_text(frame, "prompt", text, images, behavior)
        except (CommandFailed, SessionError) as exc:
            return fail("prompt", frame.id, str(exc))

    async def prompt_builtin(self, frame: cmd.Prompt) -> Response:
        """A built-in that awaits (``/export``, ``/session delete``), in the serial lane."""
        images = frame.images if isinstance(frame.images, list) else []
        found = self.slash.builtin_for(frame.message)
        assert found is not None
        builtin, args = found
        try:
            outcome = await self.slash.run_async(builtin, Call(self.slash, args, images,
                                                               frame.id))
            return self._after_builtin(frame, outcome, images)
        except (CommandFailed, SessionError) as exc:
            return fail("prompt", frame.id, str(exc))

    def _after_builtin(self, frame: cmd.Prompt, outcome: Outcome,
                       images: list[m.ImageContent]) -> Response:
        if isinstance(outcome, Residual):
            # ``/force <tool> <text>``: the text runs as a prompt; the answer has no data.
            self.session.prompt(outcome.text, images, request_id=frame.id)
            return ok("prompt", frame.id)
        return ok("prompt", frame.id,
                  payloads.PromptAck(agentInvoked=isinstance(outcome, Started)))

    def _prompt_text(self, frame: cmd.Prompt | cmd.AbortAndPrompt, kind: str, text: str,
                     images: list[m.ImageContent], behavior: str | None) -> Response:
        """The session pipeline (§2.2 step 3): an extension command, else the text expanded
        by a file command or a prompt template, sent to the model. Raises CommandFailed and
        SessionError."""
        if (command := self._extension_command(text)) is not None:
            return self._run_extension_command(frame.id, kind, *command)
        self.session.prompt(self.slash.expand(text), images, streaming_behavior=behavior,
                            request_id=frame.id)
        return ok(kind, frame.id, payloads.PromptAck(agentInvoked=True))

    def steer(self, frame: cmd.Steer) -> Response:
        if (command := self._extension_command(frame.message)) is not None:
            return fail("steer", frame.id, _not_queueable(command[0]))
        try:
            self.session.steer(self.slash.expand_template(frame.message), frame.images or [])
        except (CommandFailed, SessionError) as exc:
            return fail("steer", frame.id, str(exc))
        return ok("steer", frame.id)

    def follow_up(self, frame: cmd.FollowUp) -> Response:
        if (command := self._extension_command(frame.message)) is not None:
            return fail("follow_up", frame.id, _not_queueable(command[0]))
        try:
            self.session.follow_up(self.slash.expand_template(frame.message),
                                   frame.images or [])
        except (CommandFailed, SessionError) as exc:
            return fail("follow_up", frame.id, str(exc))
        return ok("follow_up", frame.id)

    async def abort_and_prompt(self, frame: cmd.AbortAndPrompt) -> Response:
        """Abort, then the prompt through the session pipeline only (no skill, no
        built-in: rpc-behavior §2.2)."""
        session = self.session
        self.abort_bash()
        await session.abort()
        images = frame.images if isinstance(frame.images, list) else []
        try:
            return self._prompt_text(frame, "abort_and_prompt", frame.message, images, None)
        except (CommandFailed, SessionError) as exc:
            return fail("abort_and_prompt", frame.id, str(exc))

    def get_messages(self, frame: cmd.GetMessages) -> Response:
        return ok("get_messages", frame.id,
                  payloads.MessagesPayload(messages=list(self.session.messages)))

    def get_last_assistant_text(self, frame: cmd.GetLastAssistantText) -> Response:
        text = self.session.last_assistant_text()
        return ok("get_last_assistant_text", frame.id,
                  payloads.LastAssistantText(text=msgspec.UNSET if text is None else text))

    def set_model(self, frame: cmd.SetModel) -> Response:
        try:
            model = self.session.set_model(frame.provider, frame.modelId)
        except SessionError as exc:
            return fail("set_model", frame.id, str(exc))
        return ok("set_model", frame.id, model)

    def cycle_model(self, frame: cmd.CycleModel) -> Response:
        s = self.session
        model = s.cycle_model()
        if model is None:
            return ok("cycle_model", frame.id, None)
        return ok("cycle_model", frame.id, payloads.CycleModelResult(
            model=model, thinkingLevel=s.thinking_level if model.reasoning else msgspec.UNSET,
            isScoped=False))

    def get_available_models(self, frame: cmd.GetAvailableModels) -> Response:
        models = self.session.registry.available()
        return ok("get_available_models", frame.id, payloads.ModelsPayload(models=models))

    def set_thinking_level(self, frame: cmd.SetThinkingLevel) -> Response:
        self.session.set_thinking_level(frame.level)
        return ok("set_thinking_level", frame.id)

    def cycle_thinking_level(self, frame: cmd.CycleThinkingLevel) -> Response:
        level = self.session.cycle_thinking_level()
        data = None if level is None else payloads.ThinkingLevelPayload(level=level)
        return ok("cycle_thinking_level", frame.id, data)

    def get_available_thinking_levels(self, frame: cmd.GetAvailableThinkingLevels) -> Response:
        return ok("get_available_thinking_levels", frame.id, payloads.ThinkingLevelsPayload(
            levels=self.session.available_thinking_levels()))

    def set_steering_mode(self, frame: cmd.SetSteeringMode) -> Response:
        self.session.steering_mode = frame.mode
        return ok("set_steering_mode", frame.id)

    def set_follow_up_mode(self, frame: cmd.SetFollowUpMode) -> Response:
        self.session.follow_up_mode = frame.mode
        return ok("set_follow_up_mode", frame.id)

    def set_interrupt_mode(self, frame: cmd.SetInterruptMode) -> Response:
        self.session.interrupt_mode = frame.mode
        return ok("set_interrupt_mode", frame.id)

    def set_todos(self, frame: cmd.SetTodos) -> Response:
        phases = self.session.set_todos(frame.phases)
        return ok("set_todos", frame.id, payloads.TodoPhasesPayload(todoPhases=phases))

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
        if events is None:
            self.view.types = None
        elif isinstance(events, list):
            self.view.types = frozenset(events)
        if isinstance(frame.messageUpdates, str):
            self.view.message_updates = frame.messageUpdates
        shown = None if self.view.types is None else [
            e for e in dict.fromkeys(events if isinstance(events, list) else sorted(
                self.view.types))]
        return ok("set_event_filter", frame.id, payloads.EventFilterPayload(
            events=shown, messageUpdates="delta" if self.view.message_updates == "delta"
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
        hold the serial lane); its ``prompt_result`` comes when it is done (rpc-behavior
        §3.3). The response has no ``data``: whether the agent is invoked is not known yet."""
        session = self.session
        extensions = session.extensions
        assert extensions is not None
        entered = self.command_entered = trio.Event()

        async def run() -> None:
            runs_before = session.runs_started
            # Set before the handler starts: whoever waits on it resumes only once the handler
            # ran up to its first wait (see ``command_entered``).
            entered.set()
            succeeded = await extensions.run_command(name, args)
            if session.runs_started == runs_before:
                self.output.put_nowait(ev.PromptResult(
                    id=request_id, agentInvoked=False,
                    status="completed" if succeeded else "error",
                    sessionSettled=session.settled,
                    error=msgspec.UNSET if succeeded else ev.PromptError(
                        message=f"Extension command /{name} failed", retryable=False)))
                return
            # It started agent work: report once that work has ended.
            status, error = await session.wait_for_idle()
            self.output.put_nowait(ev.PromptResult(
                id=request_id, agentInvoked=True, status=status,
                sessionSettled=session.settled, error=error))

        self.spawn(run)
        return ok(kind, request_id)

    # -- sessions ----------------------------------------------------------------------------

    async def change_session(self, frame: cmd.NewSession | cmd.SwitchSession | cmd.OpenSession
                             ) -> Response:
        """new_session / switch_session / open_session: the run in progress is aborted (its
        prompts answered ``aborted``), then the session continues in another file."""
        session = self.session
        kind = _tag(frame)
        data: Any
        try:
            if isinstance(frame, cmd.NewSession):
                parent = frame.parentSession if isinstance(frame.parentSession, str) else None
                await session.new_session(parent)
                data = payloads.SessionChangeResult(cancelled=False)
            elif isinstance(frame, cmd.SwitchSession):
                switched = await session.switch_session(_user_path(frame.sessionPath))
                data = payloads.SessionChangeResult(cancelled=not switched)
            else:
                cancelled, resumed = await session.open_session(
                    _user_path(frame.sessionDir))
                data = payloads.OpenSessionResult(
                    cancelled=cancelled, resumed=resumed, sessionId=session.session_id,
                    sessionFile=session.session_file or msgspec.UNSET)
        except SessionError as exc:
            return fail(kind, frame.id, str(exc))
        return ok(kind, frame.id, data)

    def get_session_stats(self, frame: cmd.GetSessionStats) -> Response:
        s = self.session
        return ok("get_session_stats", frame.id, session_stats(
            s.messages, session_file=s.session_file, session_id=s.session_id,
            context_usage=s.context_usage()))

    async def export_html(self, frame: cmd.ExportHtml) -> Response:
        """Write the session as one self-contained HTML page (in a worker thread)."""
        output = frame.outputPath if isinstance(frame.outputPath, str) else None
        try:
            shown = await self.session.export_html(output)
        except SessionError as exc:
            return fail("export_html", frame.id, str(exc))
        return ok("export_html", frame.id, payloads.ExportHtmlResult(path=shown))

    # Logins (omp.login): OAuth for providers with an ``oauth`` block in models.yml, API-key
    # login for every other provider that takes a key. Vendor-subscription logins that need us
    # to pose as the vendor's own client are not offered (DESIGN.md §4.7).
    def get_login_providers(self, frame: cmd.GetLoginProviders) -> Response:
        registry = self.session.registry
        return ok("get_login_providers", frame.id, payloads.LoginProviders(providers=[
            payloads.LoginProvider(id=target.id, name=target.name, available=True,
                                   authenticated=registry.authenticated(target.id))
            for target in registry.login_targets()]))

    async def login(self, frame: cmd.Login) -> Response:
        """Log in to a provider through the host's UI (``open_url``, ``notify``, ``input``),
        store the credential in auth.json, answer ``{providerId}``.

        One login at a time (a second one is refused while it runs). Cancelled by ``abort``
        ("Login cancelled"); a prompt pending when the host closes its input fails the login
        with the disconnect text; nothing is stored then.
        """
        registry = self.session.registry
        target = next((t for t in registry.login_targets() if t.id == frame.providerId), None)
        if target is None:
            return fail("login", frame.id, f"Unknown OAuth provider: {frame.providerId}")
        credentials = registry.credentials
        if credentials.login_running:
            return fail("login", frame.id, "A login is already in progress (abort cancels it)")
        ui = FrameLoginUI(HostUI(self.controls, self.emit), self.emit)
        stored = False
        try:
            with credentials.login_scope():
                credential = await run_login(target, ui, self.session.http.get())
                await credentials.store(target.id, credential)
                stored = True
        except (LoginError, UiDisconnected) as exc:
            return fail("login", frame.id, str(exc))
        except (ConfigError, OSError) as exc:
            return fail("login", frame.id, f"The login could not be stored: {exc}")
        if not stored:
            return fail("login", frame.id, "Login cancelled")
        return ok("login", frame.id, payloads.LoginResult(providerId=target.id))

    # Subagents (rpc-behavior §9): the registry belongs to the session's subagent host and
    # lives as long as the server; the level is kept here too (``subagent_level``).
    def _subagent_registry(self) -> SubagentRegistry | None:
        host = self.session.subagents
        return host.registry if isinstance(host, SubagentHost) else None

    def set_subagent_subscription(self, frame: cmd.SetSubagentSubscription) -> Response:
        registry = self._subagent_registry()
        if registry is None:
            return fail("set_subagent_subscription", frame.id, NO_SUBAGENT_BUS)
        self.subagent_level = registry.level = frame.level
        return ok("set_subagent_subscription", frame.id,
                  payloads.SubagentSubscriptionPayload(level=frame.level))

    def get_subagents(self, frame: cmd.GetSubagents) -> Response:
        registry = self._subagent_registry()
        if registry is None:
            return fail("get_subagents", frame.id, NO_SUBAGENT_BUS)
        return ok("get_subagents", frame.id,
                  payloads.SubagentsPayload(subagents=registry.snapshots()))

    async def get_subagent_messages(self, frame: cmd.GetSubagentMessages) -> Response:
        registry = self._subagent_registry()
        if registry is None:
            return fail("get_subagent_messages", frame.id, NO_SUBAGENT_BUS)
        if frame.subagentId is msgspec.UNSET and frame.sessionFile is msgspec.UNSET:
            return fail("get_subagent_messages", frame.id,
                        "get_subagent_messages requires subagentId or sessionFile",
                        INVALID_PARAMS)
        start = frame.fromByte if isinstance(frame.fromByte, int) else 0
        try:
            path = registry.resolve(
                frame.subagentId if isinstance(frame.subagentId, str) else None,
                frame.sessionFile if isinstance(frame.sessionFile, str) else None)
            # One read of a child's transcript, in the serial lane like the other views, in a
            # worker thread (it may be large, the disk slow).
            result = await trio.to_thread.run_sync(read_messages, path, start,
                                                   abandon_on_cancel=True)
        except UnknownSubagent as exc:
            return fail("get_subagent_messages", frame.id, str(exc))
        return ok("get_subagent_messages", frame.id, result)

    def set_session_name(self, frame: cmd.SetSessionName) -> Response:
        try:
            self.session.set_session_name(frame.name)
        except SessionError as exc:
            return fail("set_session_name", frame.id, str(exc),
                        INVALID_PARAMS if isinstance(exc, InvalidRequest) else UNSET)
        return ok("set_session_name", frame.id)

    async def branch(self, frame: cmd.Branch) -> Response:
        try:
            text = await self.session.branch(frame.entryId)
        except SessionError as exc:
            return fail("branch", frame.id, str(exc))
        return ok("branch", frame.id, payloads.BranchResult(text=text, cancelled=False))

    def get_branch_messages(self, frame: cmd.GetBranchMessages) -> Response:
        return ok("get_branch_messages", frame.id, payloads.BranchMessages(messages=[
            payloads.BranchMessage(entryId=entry_id, text=text)
            for entry_id, text in self.session.branch_messages()]))

    def get_entries(self, frame: cmd.GetEntries) -> Response:
        since = frame.since if isinstance(frame.since, str) else None
        try:
            entries = self.session.entries_json(since)
        except KeyError:
            return fail("get_entries", frame.id, f"Unknown entries cursor: {since}",
                        "unknown_since")
        return ok("get_entries", frame.id, {"entries": entries, "leafId": self.session.leaf_id})

    def get_tree(self, frame: cmd.GetTree) -> Response:
        # A long session nests deeper than a recursive encoder goes: pre-encoded.
        return ok("get_tree", frame.id, {
            "tree": msgspec.Raw(encode_tree(self.session.entry_tree())),
            "leafId": self.session.leaf_id})

    def get_messages_page(self, frame: cmd.GetMessagesPage) -> Response:
        session = self.session
        if session.is_streaming or session.is_compacting:
            return fail("get_messages_page", frame.id,
                        "Cannot page messages while the session is changing", "session_busy")
        cursor = frame.cursor if isinstance(frame.cursor, str) else None
        limit = frame.limit if isinstance(frame.limit, int) else 100
        try:
            result = page(session.messages, cursor, limit, session.session_id,
                          session.leaf_id)
        except PageError as exc:
            return fail("get_messages_page", frame.id, str(exc),
                        exc.code or msgspec.UNSET)
        return ok("get_messages_page", frame.id, result)

    def set_auto_retry(self, frame: cmd.SetAutoRetry) -> Response:
        self.session.auto_retry = frame.enabled
        return ok("set_auto_retry", frame.id)

    def set_fast_mode(self, frame: cmd.SetFastMode) -> Response:
        session = self.session
        try:
            session.set_fast_mode(frame.enabled)
        except SessionError as exc:
            return fail("set_fast_mode", frame.id, str(exc))
        return ok("set_fast_mode", frame.id, payloads.FastModePayload(
            enabled=session.fast_mode, active=session.fast_mode_active))

    def set_auto_compaction(self, frame: cmd.SetAutoCompaction) -> Response:
        self.session.auto_compaction = frame.enabled
        return ok("set_auto_compaction", frame.id)

    async def bash(self, frame: cmd.Bash) -> Response:
        """Run one shell command (its own task) and answer with its BashResult.

        ``abort_bash`` (and stdin EOF) cancel it: the process group is killed and the response
        says ``cancelled``.
        """
        from ..tools.bash import bash_result
        from ..tools.shell import ShellRun, ShellSpawnError

        session = self.session
        timeout = frame.timeout if isinstance(frame.timeout, int | float) else 300.0
        run = ShellRun(frame.command, cwd=session.cwd, timeout=timeout)
        scope = trio.CancelScope()
        if self.closing:
            scope.cancel()  # read before EOF: answered, as a cancelled command
        self.bash_scopes.add(scope)
        try:
            with scope:
                await run.run()
        except ShellSpawnError as exc:
            return fail("bash", frame.id, str(exc))
        finally:
            self.bash_scopes.discard(scope)
        result = run.result()
        session.record_bash(result)
        return ok("bash", frame.id, bash_result(result))

    async def run_custom(self, frame: CustomCommand) -> Response:
        try:
            data = await self.custom[frame.type](frame)
        except Exception as exc:
            return fail(frame.type, frame.id, str(exc) or type(exc).__name__)
        return ok(frame.type, frame.id, msgspec.UNSET if data is None else data)



    async def compact(self, frame: cmd.Compact) -> Response:
        instructions = (frame.customInstructions
                        if isinstance(frame.customInstructions, str) else None)
        try:
            result = await self.session.compact(instructions)
        except SessionError as exc:
            return fail("compact", frame.id, str(exc))
        return ok("compact", frame.id, result)

    async def handoff(self, frame: cmd.Handoff) -> Response:
        instructions = (frame.customInstructions
                        if isinstance(frame.customInstructions, str) else None)
        try:
            await self.session.handoff(instructions)
        except SessionError as exc:
            return fail("handoff", frame.id, str(exc))
        # savedPath is only for automatic handoffs saved to disk (rpc-behavior §11.7).
        return ok("handoff", frame.id, {})


_NO_RESPONSE = Response(success=True)
"""What the control route returns: control frames are never answered (the lane drops it)."""


def _not_queueable(name: str) -> str:
    return (f'Extension command "/{name}" cannot be queued. Use prompt() or execute the command '
            "when not streaming.")


def _user_path(text: str) -> Path:
    """A path a host sent, with ``~`` expanded (string work, no I/O)."""
    return Path(os.path.expanduser(text))


def _context_usage(usage: tuple[int, int] | None) -> Any:
    return msgspec.UNSET if usage is None else context_usage_payload(*usage)


def not_implemented(frame: Any) -> Response:
    kind = _tag(frame)
    return fail(kind, frame.id, f"{kind} is not implemented yet", NOT_IMPLEMENTED)


def _tag(frame: Any) -> str:
    if isinstance(frame, CustomCommand):
        return frame.type
    tag = frame.__struct_config__.tag
    return tag if isinstance(tag, str) else "unknown"
