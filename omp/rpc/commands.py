"""Command handlers and the routing table the reader consults.

A handler takes the decoded command and returns its ``Response`` (or ``None`` when it wrote the
response itself). Handlers that never await are registered as *inline*: the reader answers them in
place when the serial lane is idle. Commands whose issue has not landed answer
``code: "not_implemented"``, so a host can tell "not yet" from "wrong".
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio

from ..protocol import commands as cmd
from ..protocol import payloads
from ..protocol.codec import INVALID_PARAMS
from ..protocol.events import AvailableCommandsUpdate
from ..protocol.frames import SUPPORTED_PROTOCOL_VERSIONS, Response, fail, ok
from ..session import SessionError
from .bridges import HostTool, HostUris, normalize_schemes, validate_host_tools
from .output import SwitchProtocol

if TYPE_CHECKING:
    from .server import RpcServer

NOT_IMPLEMENTED = "not_implemented"
INTERNAL_ERROR = "internal_error"

# Commands that take time run as tasks in the command nursery (DESIGN.md §2).
TASK_COMMANDS: tuple[type[msgspec.Struct], ...] = (
    cmd.Bash, cmd.ExportHtml,
)
# ``compact`` and ``handoff`` stay in the serial lane on purpose: like the original, commands
# after them wait until the context is rewritten (a prompt must not start on the old one);
# ``abort`` (its own lane) still cancels them.


class CustomCommand(msgspec.Struct, frozen=True, kw_only=True):
    """A command an embedding host registered (``ServeOptions.commands``), with its raw body."""

    type: str
    id: cmd.RequestId | None = None
    params: dict[str, Any]

    @classmethod
    def decode(cls, line: bytes, names: frozenset[str]) -> CustomCommand | None:
        try:
            body = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return None
        if not isinstance(body, dict) or body.get("type") not in names:
            return None
        rid = body.get("id")
        if not isinstance(rid, str | int) or isinstance(rid, bool):
            rid = None
        return cls(type=body["type"], id=rid, params=body)


Handler = Callable[[Any], Response | None]
AsyncHandler = Callable[[Any], Awaitable[Response | None]]


@attrs.define(eq=False)
class CommandRouter:
    server: RpcServer
    custom: Mapping[str, Callable[[CustomCommand], Awaitable[Any]]]
    event_filter: frozenset[str] | None = attrs.field(default=None, init=False)
    message_updates: str = attrs.field(default="snapshot", init=False)
    bash_scopes: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    closing: bool = attrs.field(default=False, init=False)
    subagent_level: str = attrs.field(default="off", init=False)
    host_uris: HostUris = attrs.field(init=False)
    custom_names: frozenset[str] = attrs.field(init=False)
    _inline: dict[type[Any], Handler] = attrs.field(factory=dict, init=False)
    _pending_control: dict[tuple[str, str], Callable[[Any], None]] = attrs.field(
        factory=dict, init=False)
    control_types: frozenset[type[Any]] = frozenset(
        cls for cls in cmd.CONTROL_FRAMES.values())
    immediate_types: frozenset[type[Any]] = frozenset(
        {cmd.Abort, cmd.AbortBash, cmd.AbortRetry, cmd.AbortAndPrompt})
    task_types: frozenset[type[Any]] = frozenset(TASK_COMMANDS)

    def __attrs_post_init__(self) -> None:
        clash = set(self.custom) & (set(cmd.COMMANDS) | set(cmd.CONTROL_FRAMES))
        if clash:
            raise ValueError(f"custom commands cannot replace built-in ones: {sorted(clash)}")
        self.custom_names = frozenset(self.custom)
        self.host_uris = HostUris(self)
        self.server.session.tool_context.uris = self.host_uris
        self._inline = {
            cmd.GetState: self.get_state,
            cmd.SetSteeringMode: self.set_steering_mode,
            cmd.SetFollowUpMode: self.set_follow_up_mode,
            cmd.SetInterruptMode: self.set_interrupt_mode,
            cmd.SetTodos: self.set_todos,
            cmd.NegotiateProtocol: self.negotiate_protocol,
            cmd.SetEventFilter: self.set_event_filter,
            cmd.GetAvailableCommands: self.get_available_commands,
            cmd.SetModel: self.set_model,
            cmd.CycleModel: self.cycle_model,
            cmd.GetAvailableModels: self.get_available_models,
            cmd.SetThinkingLevel: self.set_thinking_level,
            cmd.CycleThinkingLevel: self.cycle_thinking_level,
            cmd.GetAvailableThinkingLevels: self.get_available_thinking_levels,
            cmd.SetSessionName: self.set_session_name,
            cmd.GetSessionStats: self.get_session_stats,
            cmd.GetLoginProviders: self.get_login_providers,
            cmd.Login: self.login,
            cmd.SetSubagentSubscription: self.set_subagent_subscription,
            cmd.GetSubagents: self.get_subagents,
            cmd.GetSubagentMessages: self.get_subagent_messages,
            cmd.GetBranchMessages: self.get_branch_messages,
            cmd.GetEntries: self.get_entries,
            cmd.GetTree: self.get_tree,
            cmd.GetMessagesPage: self.get_messages_page,
            cmd.Branch: self.branch,
            cmd.SetAutoRetry: self.set_auto_retry,
            cmd.SetAutoCompaction: self.set_auto_compaction,
            cmd.SetHostTools: self.set_host_tools,
            cmd.SetHostUriSchemes: self.set_host_uri_schemes,
            cmd.Prompt: self.prompt,
            cmd.Steer: self.steer,
            cmd.FollowUp: self.follow_up,
            cmd.GetMessages: self.get_messages,
            cmd.GetLastAssistantText: self.get_last_assistant_text,
        }

    # -- dispatch ----------------------------------------------------------------------------

    def inline(self, kind: type[Any]) -> Handler | None:
        return self._inline.get(kind)

    async def handle(self, frame: Any) -> Response | None:
        """Answer any command; used by the serial lane and by command tasks.

        On cancellation the command's own work is cancelled and ``Cancelled`` propagates.
        """
        if isinstance(frame, CustomCommand):
            return await self._custom(frame)
        if (handler := self._inline.get(type(frame))) is not None:
            return handler(frame)
        if isinstance(frame, cmd.Abort):
            self.abort_bash()  # abort_bash is part of abort (rpc-behavior §10.4)
            await self.server.session.abort()
            return ok("abort", frame.id)
        if isinstance(frame, cmd.AbortAndPrompt):
            return await self.abort_and_prompt(frame)
        if isinstance(frame, cmd.AbortBash | cmd.AbortRetry):
            return await self.abort_family(frame)
        if isinstance(frame, cmd.Bash):
            return await self.bash(frame)
        if isinstance(frame, cmd.NewSession | cmd.SwitchSession | cmd.OpenSession):
            return await self.change_session(frame)
        if isinstance(frame, cmd.ExportHtml):
            return await self.export_html(frame)
        if isinstance(frame, cmd.Handoff):
            instructions = (frame.customInstructions
                            if isinstance(frame.customInstructions, str) else None)
            try:
                await self.server.session.handoff(instructions)
            except SessionError as exc:
                return fail("handoff", frame.id, str(exc))
            # savedPath is only for automatic handoffs saved to disk (rpc-behavior §11.7).
            return ok("handoff", frame.id, {})
        if isinstance(frame, cmd.Compact):
            instructions = (frame.customInstructions
                            if isinstance(frame.customInstructions, str) else None)
            try:
                result = await self.server.session.compact(instructions)
            except SessionError as exc:
                return fail("compact", frame.id, str(exc))
            return ok("compact", frame.id, result)
        return not_implemented(frame)

    def internal_error(self, frame: Any, exc: BaseException) -> Response:
        return fail(_tag(frame), frame.id, f"Internal error: {type(exc).__name__}: {exc}",
                    INTERNAL_ERROR)

    # -- control frames ----------------------------------------------------------------------

    def expect_control(self, kind: str, request_id: str, on_frame: Callable[[Any], None]) -> None:
        """Route control frames of ``kind`` for ``request_id`` to ``on_frame`` until released."""
        self._pending_control[(kind, request_id)] = on_frame

    def release_control(self, kind: str, request_id: str) -> None:
        self._pending_control.pop((kind, request_id), None)

    def control(self, frame: Any) -> None:
        """A result or update for a request we made. Unknown or settled ids are ignored."""
        kind = _tag(frame)
        if kind == "host_tool_update":
            kind = "host_tool_result"  # one registration serves a call's updates and result
        on_frame = self._pending_control.get((kind, frame.id))
        if on_frame is not None:
            on_frame(frame)

    # -- handlers ----------------------------------------------------------------------------

    def get_state(self, frame: cmd.GetState) -> Response:
        s = self.server.session
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
            sessionId=s.session_id,
            sessionFile=s.session_file or msgspec.UNSET,
            sessionName=s.session_name or msgspec.UNSET,
        )
        return ok("get_state", frame.id, state)

    def set_host_tools(self, frame: cmd.SetHostTools) -> Response:
        session = self.server.session
        problem = validate_host_tools(frame.tools, {t.name for t in session.builtin_tools})
        if problem is not None:
            return fail("set_host_tools", frame.id, problem, INVALID_PARAMS)
        tools = [HostTool(self, name=t.name.strip(), description=t.description.strip(),
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
        images = frame.images if isinstance(frame.images, list) else []
        behavior = frame.streamingBehavior if isinstance(frame.streamingBehavior, str) else None
        try:
            self.server.session.prompt(frame.message, images, streaming_behavior=behavior,
                                       request_id=frame.id)
        except SessionError as exc:
            return fail("prompt", frame.id, str(exc))
        return ok("prompt", frame.id, payloads.PromptAck(agentInvoked=True))

    def steer(self, frame: cmd.Steer) -> Response:
        try:
            self.server.session.steer(frame.message, frame.images or [])
        except SessionError as exc:
            return fail("steer", frame.id, str(exc))
        return ok("steer", frame.id)

    def follow_up(self, frame: cmd.FollowUp) -> Response:
        try:
            self.server.session.follow_up(frame.message, frame.images or [])
        except SessionError as exc:
            return fail("follow_up", frame.id, str(exc))
        return ok("follow_up", frame.id)

    async def abort_and_prompt(self, frame: cmd.AbortAndPrompt) -> Response:
        session = self.server.session
        await session.abort()
        images = frame.images if isinstance(frame.images, list) else []
        try:
            session.prompt(frame.message, images, request_id=frame.id)
        except SessionError as exc:
            return fail("abort_and_prompt", frame.id, str(exc))
        return ok("abort_and_prompt", frame.id, payloads.PromptAck(agentInvoked=True))

    def get_messages(self, frame: cmd.GetMessages) -> Response:
        return ok("get_messages", frame.id,
                  payloads.MessagesPayload(messages=list(self.server.session.messages)))

    def get_last_assistant_text(self, frame: cmd.GetLastAssistantText) -> Response:
        text = self.server.session.last_assistant_text()
        return ok("get_last_assistant_text", frame.id,
                  payloads.LastAssistantText(text=msgspec.UNSET if text is None else text))

    def set_model(self, frame: cmd.SetModel) -> Response:
        try:
            model = self.server.session.set_model(frame.provider, frame.modelId)
        except SessionError as exc:
            return fail("set_model", frame.id, str(exc))
        return ok("set_model", frame.id, model)

    def cycle_model(self, frame: cmd.CycleModel) -> Response:
        s = self.server.session
        model = s.cycle_model()
        if model is None:
            return ok("cycle_model", frame.id, None)
        return ok("cycle_model", frame.id, payloads.CycleModelResult(
            model=model, thinkingLevel=s.thinking_level if model.reasoning else msgspec.UNSET,
            isScoped=False))

    def get_available_models(self, frame: cmd.GetAvailableModels) -> Response:
        models = self.server.session.registry.available()
        return ok("get_available_models", frame.id, payloads.ModelsPayload(models=models))

    def set_thinking_level(self, frame: cmd.SetThinkingLevel) -> Response:
        self.server.session.set_thinking_level(frame.level)
        return ok("set_thinking_level", frame.id)

    def cycle_thinking_level(self, frame: cmd.CycleThinkingLevel) -> Response:
        level = self.server.session.cycle_thinking_level()
        data = None if level is None else payloads.ThinkingLevelPayload(level=level)
        return ok("cycle_thinking_level", frame.id, data)

    def get_available_thinking_levels(self, frame: cmd.GetAvailableThinkingLevels) -> Response:
        return ok("get_available_thinking_levels", frame.id, payloads.ThinkingLevelsPayload(
            levels=self.server.session.available_thinking_levels()))

    def set_steering_mode(self, frame: cmd.SetSteeringMode) -> Response:
        self.server.session.steering_mode = frame.mode
        return ok("set_steering_mode", frame.id)

    def set_follow_up_mode(self, frame: cmd.SetFollowUpMode) -> Response:
        self.server.session.follow_up_mode = frame.mode
        return ok("set_follow_up_mode", frame.id)

    def set_interrupt_mode(self, frame: cmd.SetInterruptMode) -> Response:
        self.server.session.interrupt_mode = frame.mode
        return ok("set_interrupt_mode", frame.id)

    def set_todos(self, frame: cmd.SetTodos) -> Response:
        phases = self.server.session.set_todos(frame.phases)
        return ok("set_todos", frame.id, payloads.TodoPhasesPayload(todoPhases=phases))

    def negotiate_protocol(self, frame: cmd.NegotiateProtocol) -> Response | None:
        version = frame.protocolVersion
        if type(version) is not int or version not in SUPPORTED_PROTOCOL_VERSIONS or version < 2:
            shown = version if isinstance(version, str) else msgspec.json.encode(version).decode()
            return fail("negotiate_protocol", frame.id,
                        f"Unsupported RPC protocol version: {shown}", INVALID_PARAMS)
        # The switch applies to the frames after this response, never to the response itself.
        self.server.output.put_nowait(
            ok("negotiate_protocol", frame.id, payloads.ProtocolVersionPayload(protocolVersion=2)))
        self.server.output.put_nowait(SwitchProtocol(version))
        return None

    def set_event_filter(self, frame: cmd.SetEventFilter) -> Response:
        events = frame.events
        if isinstance(events, list) and not all(e.strip() for e in events):
            return fail("set_event_filter", frame.id,
                        "events must be null or an array of non-empty event type strings",
                        INVALID_PARAMS)
        if events is None:
            self.event_filter = None
        elif isinstance(events, list):
            self.event_filter = frozenset(events)
        if isinstance(frame.messageUpdates, str):
            self.message_updates = frame.messageUpdates
        shown = None if self.event_filter is None else [
            e for e in dict.fromkeys(events if isinstance(events, list) else sorted(
                self.event_filter))]
        return ok("set_event_filter", frame.id, payloads.EventFilterPayload(
            events=shown, messageUpdates="delta" if self.message_updates == "delta"
            else "snapshot"))

    def get_available_commands(self, frame: cmd.GetAvailableCommands) -> Response:
        return ok("get_available_commands", frame.id,
                  payloads.AvailableCommandsPayload(commands=[]))

    def available_commands_update(self) -> AvailableCommandsUpdate:
        # No slash commands exist yet; the frame is still sent once at startup, as hosts expect.
        return AvailableCommandsUpdate(commands=[])

    async def abort_family(self, frame: cmd.AbortBash | cmd.AbortRetry) -> Response:
        if isinstance(frame, cmd.AbortBash):
            self.abort_bash()
        else:
            # Succeeds whether or not a backoff was running (rpc-behavior §2.2).
            self.server.session.abort_retry()
        return ok(_tag(frame), frame.id)

    # -- sessions ----------------------------------------------------------------------------

    async def change_session(self, frame: cmd.NewSession | cmd.SwitchSession | cmd.OpenSession
                             ) -> Response | None:
        """new_session / switch_session / open_session: the run in progress is aborted (its
        prompts answered ``aborted``), then the session continues in another file."""
        session = self.server.session
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
        self.server.output.put_nowait(ok(kind, frame.id, data))
        self.server.announce_commands()
        return None

    def get_session_stats(self, frame: cmd.GetSessionStats) -> Response:
        from ..session.stats import session_stats

        s = self.server.session
        return ok("get_session_stats", frame.id, session_stats(
            s.messages, session_file=s.session_file, session_id=s.session_id,
            context_usage=s.context_usage()))

    async def export_html(self, frame: cmd.ExportHtml) -> Response:
        """Write the session as one self-contained HTML page (in a worker thread)."""
        from ..session.export_html import default_export_name, render_html, write_html

        s = self.server.session
        if s.file is None:
            return fail("export_html", frame.id, "Cannot export in-memory session to HTML")
        shown = (frame.outputPath if isinstance(frame.outputPath, str)
                 else default_export_name(s.file.path))
        target = _user_path(shown)
        if not target.is_absolute():
            target = s.cwd / target
        page = render_html(title=s.session_name or s.file.path.name, session_id=s.session_id,
                           messages=list(s.messages),
                           entries=[s.file.entry_json(e) for e in s.file.entries],
                           model=f"{s.model.provider}/{s.model.id}")
        try:
            await trio.to_thread.run_sync(write_html, target, page)
        except OSError as exc:
            return fail("export_html", frame.id, f"Cannot write {shown}: {exc.strerror or exc}")
        return ok("export_html", frame.id, payloads.ExportHtmlResult(path=shown))

    # No OAuth flows are built in (keys come from the environment, auth.json or models.yml),
    # which the spec allows: an empty provider list, and login refuses every id.
    def get_login_providers(self, frame: cmd.GetLoginProviders) -> Response:
        return ok("get_login_providers", frame.id, payloads.LoginProviders(providers=[]))

    def login(self, frame: cmd.Login) -> Response:
        return fail("login", frame.id, f"Unknown OAuth provider: {frame.providerId}")

    # There is no `task` tool, so no subagent ever exists; the subscription is still kept so
    # hosts that set it up front work unchanged.
    def set_subagent_subscription(self, frame: cmd.SetSubagentSubscription) -> Response:
        self.subagent_level = frame.level
        return ok("set_subagent_subscription", frame.id,
                  payloads.SubagentSubscriptionPayload(level=frame.level))

    def get_subagents(self, frame: cmd.GetSubagents) -> Response:
        return ok("get_subagents", frame.id, payloads.SubagentsPayload(subagents=[]))

    def get_subagent_messages(self, frame: cmd.GetSubagentMessages) -> Response:
        if frame.subagentId is msgspec.UNSET and frame.sessionFile is msgspec.UNSET:
            return fail("get_subagent_messages", frame.id,
                        "get_subagent_messages requires subagentId or sessionFile",
                        INVALID_PARAMS)
        target = frame.subagentId if isinstance(frame.subagentId, str) else frame.sessionFile
        return fail("get_subagent_messages", frame.id,
                    f"Unknown subagent or session file unavailable: {target}")

    def set_session_name(self, frame: cmd.SetSessionName) -> Response:
        try:
            self.server.session.set_session_name(frame.name)
        except SessionError as exc:
            return fail("set_session_name", frame.id, str(exc))
        return ok("set_session_name", frame.id)

    def branch(self, frame: cmd.Branch) -> Response | None:
        try:
            text = self.server.session.branch(frame.entryId)
        except SessionError as exc:
            return fail("branch", frame.id, str(exc))
        self.server.output.put_nowait(
            ok("branch", frame.id, payloads.BranchResult(text=text, cancelled=False)))
        self.server.announce_commands()
        return None

    def get_branch_messages(self, frame: cmd.GetBranchMessages) -> Response:
        return ok("get_branch_messages", frame.id, payloads.BranchMessages(messages=[
            payloads.BranchMessage(entryId=entry_id, text=text)
            for entry_id, text in self.server.session.branch_messages()]))

    def get_entries(self, frame: cmd.GetEntries) -> Response:
        from ..session.store import entries_since

        file = self.server.session.file
        if file is None:
            return ok("get_entries", frame.id, {"entries": [], "leafId": None})
        since = frame.since if isinstance(frame.since, str) else None
        try:
            entries = entries_since(file, since)
        except KeyError:
            return fail("get_entries", frame.id, f"Unknown entries cursor: {since}",
                        "unknown_since")
        return ok("get_entries", frame.id, {
            "entries": [file.entry_json(e) for e in entries], "leafId": file.leaf_id})

    def get_tree(self, frame: cmd.GetTree) -> Response:
        from ..session.store import encode_tree, tree

        file = self.server.session.file
        if file is None:
            return ok("get_tree", frame.id, {"tree": [], "leafId": None})
        # A long session nests deeper than a recursive encoder goes: pre-encoded.
        return ok("get_tree", frame.id, {"tree": msgspec.Raw(encode_tree(tree(file))),
                                         "leafId": file.leaf_id})

    def get_messages_page(self, frame: cmd.GetMessagesPage) -> Response:
        from ..session.store import PageError, page

        session = self.server.session
        if session.is_streaming or session.is_compacting:
            return fail("get_messages_page", frame.id,
                        "Cannot page messages while the session is changing", "session_busy")
        cursor = frame.cursor if isinstance(frame.cursor, str) else None
        limit = frame.limit if isinstance(frame.limit, int) else 100
        try:
            result = page(session.messages, cursor, limit, session.session_id,
                          session.file.leaf_id if session.file is not None else None)
        except PageError as exc:
            return fail("get_messages_page", frame.id, str(exc),
                        exc.code or msgspec.UNSET)
        return ok("get_messages_page", frame.id, result)

    def set_auto_retry(self, frame: cmd.SetAutoRetry) -> Response:
        self.server.session.auto_retry = frame.enabled
        return ok("set_auto_retry", frame.id)

    def set_auto_compaction(self, frame: cmd.SetAutoCompaction) -> Response:
        self.server.session.auto_compaction = frame.enabled
        return ok("set_auto_compaction", frame.id)

    def abort_bash(self) -> None:
        """Cancel every running RPC ``bash``; each still answers with its cancelled result."""
        for scope in list(self.bash_scopes):
            scope.cancel()

    async def bash(self, frame: cmd.Bash) -> Response:
        """Run one shell command (its own task) and answer with its BashResult.

        ``abort_bash`` (and stdin EOF) cancel it: the process group is killed and the response
        says ``cancelled``.
        """
        from ..tools.bash import bash_result
        from ..tools.shell import ShellRun, ShellSpawnError

        session = self.server.session
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

    async def _custom(self, frame: CustomCommand) -> Response:
        try:
            data = await self.custom[frame.type](frame)
        except Exception as exc:
            return fail(frame.type, frame.id, str(exc) or type(exc).__name__)
        return ok(frame.type, frame.id, msgspec.UNSET if data is None else data)


def _user_path(text: str) -> Path:
    """A path a host sent, with ``~`` expanded (string work, no I/O)."""
    return Path(os.path.expanduser(text))


def _context_usage(usage: tuple[int, int] | None) -> Any:
    from ..session.stats import context_usage_payload

    return msgspec.UNSET if usage is None else context_usage_payload(*usage)


def not_implemented(frame: Any) -> Response:
    kind = _tag(frame)
    return fail(kind, frame.id, f"{kind} is not implemented yet", NOT_IMPLEMENTED)


def _tag(frame: Any) -> str:
    if isinstance(frame, CustomCommand):
        return frame.type
    tag = frame.__struct_config__.tag
    return tag if isinstance(tag, str) else "unknown"
