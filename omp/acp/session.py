r"""One ACP session (``AcpSession``): its runtime, the prompt going, the mapping of its events
to ``session/update``\ s (it is the session's event sink), its tool-approval policy (asks the
editor with ``session/request_permission``, remembers "always"), and ``session/cancel``.

An ``AcpSession`` is complete when built: its constructor builds the runtime, whose event sink,
outbox aside and approval policy are the session's own methods, and everything built from it
(the update mapping, the dialogs, the commands). What it needs of its server it asks through
``SessionServer``. ``host`` opens the session's own nursery, as a task of the server's sessions
nursery, and holds it until the session is closed.

A prompt is the editor's from when it is sent to the session until its ``prompt_result``
(``owned``); a run going while none is (an extension's, a background job's) makes a new
prompt busy (``omp.acp.errors.BusyError``, docs/guides/acp.md#prompts-and-updates), unless a
``session/cancel`` stopped it, whose cleanup the prompt then waits for.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import attrs
import msgspec
import trio

from ..llm.builder import Pace
from ..llm.thinking import efforts
from ..mcp.config import parse_entry
from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol import messages as m
from ..rpc.commands import Commands
from ..rpc.dispatch import dispatch
from ..rpc.lifecycle import (
    CLEANUP_SECONDS,
    Runtime,
    approval_gate,
    build_runtime,
    close_extension_host,
    load_mcp,
    new_output,
    use_mcp,
)
from ..rpc.options import ServeOptions
from ..rpc.outbox import Outbox
from ..rpc.output import Output
from ..session import AgentSession
from ..session.aborts import ABORT
from ..session.approval import ApprovalRequest
from ..session.coordinator import BUSY
from ..session.sink import Published, Update
from ..tools.ask import AskTool
from . import wire as w
from .client import ClientChannel, ClientError, EditorFiles, EditorTerminals
from .dialogs import ElicitationUI
from .errors import AcpError, BusyError
from .updates import UpdateMapper, tool_call
from .views import mcp_entry, now_iso, prompt_text, stop_reason, usage_of


class SessionServer(Protocol):
    """What a session needs of the server that owns it (``omp.acp.server.AcpServer``)."""

    output: Output
    """The one writer's queue (JSON-RPC messages to the editor)."""
    client: ClientChannel
    """Requests of ours to the editor."""
    client_capabilities: w.ClientCapabilities
    """What the editor said it offers at ``initialize`` (fs, terminals, forms)."""

    def update(self, session_id: str, update: w.SessionUpdate) -> None:
        """Send ``session/update`` for ``session_id``."""
        ...

    def spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as a task of the server's (work that must not hold a request up:
        an extension command)."""
        ...

    def commands_changed(self, acp: AcpSession) -> None:
        """``acp``'s commands changed (its MCP servers' prompts): tell the editor again, if
        the session is still open."""
        ...


MCP_SETTLE_SECONDS = 10.0
"""How long opening a session waits for the editor's MCP servers' first connection attempt."""

PERMISSION_OPTIONS = [
    w.PermissionOption(optionId="allow_once", name="Allow once", kind="allow_once"),
    w.PermissionOption(optionId="allow_always", name="Always allow", kind="allow_always"),
    w.PermissionOption(optionId="reject_once", name="Reject", kind="reject_once"),
    w.PermissionOption(optionId="reject_always", name="Always reject", kind="reject_always")]
"""The original's four answers (docs/guides/acp.md#tool-permission)."""


@attrs.define(eq=False, repr=False)
class PendingPrompt:
    """One ``session/prompt`` waiting for its run."""

    request_id: str
    """The id it has in the session (``prompt_result.id``)."""
    done: trio.Event = attrs.field(factory=trio.Event)
    result: ev.PromptResult | None = None
    cancelled: bool = False


@attrs.define(eq=False, repr=False)
class AcpSession:
    """One session of the ACP server: its runtime, mapping state, the prompt going. Built
    from the server's options for it (its cwd, what it resumes, the editor's MCP servers
    among ``mcp_servers``); raises ``SessionError`` / ``ConfigError`` as ``build_runtime``,
    and then nothing was started."""

    server: SessionServer
    _options: ServeOptions = attrs.field(alias="options")
    editor_servers: list[str] = attrs.field(factory=list)
    """The names of the MCP servers the editor gave this session (the last request's)."""
    runtime: Runtime = attrs.field(init=False)
    session_id: str = attrs.field(init=False)
    """The session's id when it opened: the editor's name for it from then on."""
    commands: Commands = attrs.field(init=False)
    dialogs: ElicitationUI = attrs.field(init=False)
    """The session's dialogs (its extensions', the approval gate's), asked of the editor."""
    mapper: UpdateMapper | None = attrs.field(default=None, init=False)
    """None only while the constructor builds the runtime: what the session publishes then
    is no editor's (none knows the session yet)."""
    pending: PendingPrompt | None = None
    muted: bool = False
    """After ``session/cancel``: the cancelled turn's events are no longer forwarded."""
    accepted: int = 0
    """Tickets of the ``session/prompt`` requests read for this session so far: a prompt gets
    its ticket when the reader reads it, so a ``session/cancel`` read after it finds it even
    before its task started (docs/internals.md#the-abort-registry: work is registered when it is
    accepted)."""
    cancelled_upto: int = 0
    """The prompts with a ticket up to this one are cancelled."""
    owned: set[str] = attrs.field(factory=set)
    """The prompts sent to the session whose ``prompt_result`` has not come yet: a run going
    while this is empty is no prompt's of the editor (``session/prompt`` is then busy)."""
    stopping: bool = False
    """``session/cancel`` aborted what ran since the last prompt started: the next one waits
    for that cleanup (and is not busy because of it)."""
    prompts: int = 0
    r"""``session/prompt``\ s sent to the session so far (their ids in it: ``acp-<n>``)."""
    remembered: dict[str, bool] = attrs.field(factory=dict)
    """``allow_always`` / ``reject_always`` answers, by tool name, for this session
    (docs/guides/acp.md#tool-permission)."""
    load_problems: list[str] = attrs.field(factory=list)
    """Extensions that did not load: said in the session's first updates (``bootstrap``)."""
    _nursery: trio.Nursery | None = None
    """The session's own, opened by ``host``: its nursery's and its MCP servers' tasks."""

    def __attrs_post_init__(self) -> None:
        # Tool approval asks the editor, where --mode rpc shows its host a dialog. Each
        # session aborts its own work: a registry of its own.
        options = msgspec.structs.replace(self._options, approve=self.approve, aborts=None)
        outbox = Outbox(new_output(options, encoder_limit=sys.maxsize), discard=True,
                        aside=self.on_frame)
        runtime = self.runtime = build_runtime(options, outbox, ui=False, sink=self)
        session = runtime.session
        load_mcp(runtime)
        self.session_id = session.session_id
        self.mapper = UpdateMapper(session.cwd, lambda: session.todos.phases)
        client, capabilities = self.server.client, self.server.client_capabilities
        elicitation = capabilities.elicitation
        self.dialogs = ElicitationUI(client, self.session_id, form=elicitation is not None
                                     and elicitation.form is not None)
        session.use_approval(approval_gate(options, session, self.dialogs))
        if self.dialogs.form and (options.tools is None or "ask" in options.tools):
            # The model's questions become the editor's forms
            # (docs/guides/acp.md#dialogs-as-elicitations); with no forms every answer would be
            # "(no answer)", so the tool is not offered then.
            session.toolset.own.append(AskTool(self.dialogs))
        fs = capabilities.fs
        session.tool_context.use_editor(
            EditorFiles(client, self.session_id) if fs.readTextFile and fs.writeTextFile
            else None,
            EditorTerminals(client, self.session_id) if capabilities.terminal else None)
        self.commands = Commands(session, outbox, self.server.spawn, runtime.controls,
                                 runtime.host_uris, runtime.aborts, runtime.ui,
                                 runtime.subagents)
        self.wire_mcp()

    async def approve(self, request: ApprovalRequest) -> bool:
        """The session's tool-approval policy (``omp.session.approval.ApprovePolicy``): when
        the gate resolves a call to ``prompt`` the editor is asked with
        ``session/request_permission``; an "always" answer is remembered for the session.
        A client error or a cancelled question is a denial. On cancellation (the turn was
        cancelled) the question is abandoned and ``Cancelled`` propagates."""
        if (known := self.remembered.get(request.tool_name)) is not None:
            return known
        call = tool_call(request.tool_call_id, request.tool_name, request.arguments, None,
                         self.cwd)
        tool_call_update = w.ToolCallUpdate(
            toolCallId=call.toolCallId, title=call.title, kind=call.kind, status="pending",
            rawInput=call.rawInput, content=call.content, locations=call.locations)
        try:
            choice = await self.server.client.request_permission(
                self.session_id, tool_call_update, PERMISSION_OPTIONS)
        except ClientError:
            return False
        if choice in ("allow_always", "reject_always"):
            self.remembered[request.tool_name] = choice == "allow_always"
        return choice in ("allow_once", "allow_always")

    def accept_prompt(self) -> int:
        """The ticket of a ``session/prompt`` the reader just read (see ``accepted``)."""
        self.accepted += 1
        return self.accepted

    def note_load_problems(self, problems: list[str]) -> None:
        """Extensions that did not load, to be said in the first updates (``bootstrap``)."""
        self.load_problems = problems

    def take_load_problems(self) -> list[str]:
        """The load problems not said yet, which the caller now says; none are left."""
        problems, self.load_problems = self.load_problems, []
        return problems

    @property
    def cwd(self) -> Path:
        return self.runtime.session.cwd

    # -- requests on the session -----------------------------------------------------------

    async def prompt(self, blocks: list[w.ContentBlock], ticket: int | None) -> w.PromptResult:
        """Send the prompt through the rpc prompt dispatch and wait for its ``prompt_result``
        (or ``session/cancel``). A prompt while the last one still runs cancels that one
        first (implicit cancel, docs/guides/acp.md#prompts-and-updates); a run going that no prompt
        of the editor started makes it busy (``BusyError``). ``ticket``: the one it got when it was
        read. On cancellation (shutdown) it stops waiting."""
        runtime, commands = self.runtime, self.commands
        session = runtime.session
        if self.pending is not None:
            self.abort(upto=None if ticket is None else ticket - 1)
        if self.owned or self.stopping:
            await session.wait_for_idle()  # the cancelled work's cleanup, before this one
            self.stopping = False
        elif session.is_streaming:
            raise BusyError(BUSY)  # a run no prompt of the editor started
        if runtime.mcp is not None:
            # The MCP servers came with the session (the editor's and the config files'):
            # their first connection attempts, each bounded by its timeout, are over before a
            # prompt is sent, so their tools are offered; session/new itself answers at once.
            # A session/cancel meanwhile is seen just below.
            await runtime.mcp.wait_settled()
        if ticket is not None and ticket <= self.cancelled_upto:
            return w.PromptResult(stopReason="cancelled")  # cancelled before it started
        text, images = prompt_text(blocks)
        self.prompts += 1
        pending = PendingPrompt(f"acp-{self.prompts}")
        self.pending, self.muted = pending, False
        before = len(session.messages)
        frame = cmd.Prompt(message=text, images=images or msgspec.UNSET, id=pending.request_id)
        self.owned.add(pending.request_id)
        try:
            response = await dispatch(commands, frame)
            if not response.success:
                self.owned.discard(pending.request_id)
                if response.error == BUSY:
                    raise BusyError(BUSY)
                raise AcpError(response.error or "the prompt was refused")
            await pending.done.wait()
        finally:
            if self.pending is pending:
                self.pending = None
        added = session.messages[before:]
        usage = usage_of(added)
        if pending.cancelled:
            return w.PromptResult(stopReason="cancelled", usage=usage)
        self.end_of_turn()
        return w.PromptResult(stopReason=stop_reason(pending.result, added), usage=usage)

    def end_of_turn(self) -> None:
        """The context's usage and the session's info after a prompt
        (docs/guides/acp.md#prompts-and-updates)."""
        session = live(self)
        last = next((x for x in reversed(session.messages)
                     if isinstance(x, m.AssistantMessage)), None)
        window = session.model.contextWindow
        if last is not None and window:
            used = last.usage.input + last.usage.cacheRead + last.usage.cacheWrite \
                + last.usage.output
            cost = sum(x.usage.cost.total for x in session.messages
                       if isinstance(x, m.AssistantMessage))
            self.server.update(self.session_id, w.UsageUpdate(
                size=window, used=used,
                cost=w.Cost(amount=cost, currency="USD") if cost > 0 else msgspec.UNSET))
        self.session_info()

    def session_info(self) -> None:
        name = live(self).session_name
        self.server.update(self.session_id, w.SessionInfoUpdate(
            updatedAt=now_iso(), title=name if name else msgspec.UNSET))

    def set_config_option(self, config_id: str, value: str | bool) -> None:
        """``session/set_config_option``: the model, the thinking level
        (docs/guides/acp.md#other-session-methods). Raises AcpError naming what is wrong."""
        session = live(self)
        if isinstance(value, bool):
            raise AcpError(f"Unsupported boolean ACP config option: {config_id}")
        if config_id == "mode":
            if value != "default":
                raise AcpError(f"Unsupported ACP mode: {value}")
        elif config_id == "model":
            provider, _, model_id = value.partition("/")
            known = {f"{x.provider}/{x.id}" for x in session.registry.available()}
            if value not in known:
                raise AcpError(f"Unknown ACP model: {value}")
            session.set_model(provider, model_id)
        elif config_id == "thinking":
            levels = ["off", *efforts(session.model)]
            matches = [x for x in levels if x == value] or (
                [x for x in levels if x.startswith(value)] if len(value) >= 2 else [])
            if len(matches) != 1:
                raise AcpError(f"Unknown ACP thinking level: {value}")
            session.set_thinking_level(matches[0])
        else:
            raise AcpError(f"Unknown ACP config option: {config_id}")

    # -- the session's sink (omp.session.sink.EventSink) ---------------------------------------

    def publish(self, event: Published) -> None:
        if isinstance(event, ev.PromptResult):
            self.owned.discard(event.id)
            pending = self.pending
            if pending is not None and event.id == pending.request_id:
                pending.result = event
                pending.done.set()
            return
        if isinstance(event, ev.SessionSettled):
            return
        self.forward(event)

    def publish_update(self, event: Update) -> None:
        self.forward(event)

    @property
    def pace(self) -> Pace:
        return self.server.output

    def on_frame(self, frame: msgspec.Struct) -> None:
        """What the rpc dispatch emits (the outbox's ``aside``): a built-in's output is an
        ``agent_message_chunk`` of a message of its own."""
        if isinstance(frame, ev.Notice) and frame.source in ("mcp", "xdev", "extensions"):
            print(f"omp acp: {frame.message}", file=sys.stderr)  # no channel for it in ACP
        if isinstance(frame, ev.CommandOutput) and not self.muted:
            self.server.update(self.session_id, w.AgentMessageChunk(
                content=w.TextContent(text=frame.text), messageId=str(uuid.uuid4())))

    def forward(self, event: object) -> None:
        if self.muted or self.mapper is None:
            return
        for update in self.mapper.updates(event):
            self.server.update(self.session_id, update)

    # -- serving ---------------------------------------------------------------------------

    async def host(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                   ) -> None:
        """The session nursery and the session's MCP servers, until the session is closed;
        then its HTTP client is closed. On cancellation the run is cancelled with it and
        every MCP server ends."""
        runtime = self.runtime

        async def serve(*, task_status: trio.TaskStatus[None]) -> None:
            await runtime.session.run_nursery(task_status=task_status)
            nursery.cancel_scope.cancel()  # closed: its MCP servers end with it

        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                runtime.use_services(nursery)
                await nursery.start(serve)
                if runtime.mcp is not None:
                    await nursery.start(runtime.mcp.run)
                task_status.started()
        finally:
            with trio.move_on_after(CLEANUP_SECONDS, shield=True):
                await runtime.http.aclose()

    def wire_mcp(self) -> None:
        """``/mcp`` and the commands update see the session's MCP manager."""
        if (mcp := self.runtime.mcp) is not None:
            self.commands.slash.use_mcp(mcp)
            mcp.announce_with(self.announce_commands)

    def announce_commands(self) -> None:
        """The session's commands changed (its MCP servers' prompts): the server sends them
        again (``available_commands_update``)."""
        self.server.commands_changed(self)

    async def replace_mcp(self, servers: list[w.McpServer]) -> None:
        """``session/load`` / ``resume`` of this live session: the editor's servers become
        ``servers`` (the old ones end, their processes within the manager's close deadline;
        the new ones connect, their first attempt awaited at most ``MCP_SETTLE_SECONDS``),
        as the original reconnects (docs/guides/acp.md#sessions). The MCP config files' servers
        stay. An entry that does not parse is said on stderr and skipped. On cancellation it stops
        waiting; what was started stays the session's."""
        runtime = self.runtime
        assert self._nursery is not None  # a session is in the server's list once hosted
        parsed = []
        for server in servers:
            try:
                parsed.append(parse_entry(server.name, mcp_entry(server)))
            except ValueError as exc:
                print(f"omp acp: MCP server skipped: {exc}", file=sys.stderr)
        if runtime.mcp is None:
            if not parsed:
                return
            use_mcp(runtime, parsed)
            assert runtime.mcp is not None
            await self._nursery.start(runtime.mcp.run)
            self.wire_mcp()
        else:
            await runtime.mcp.replace(self.editor_servers, parsed)
        self.editor_servers = [x.name for x in parsed]
        with trio.move_on_after(MCP_SETTLE_SECONDS):
            await runtime.mcp.wait_settled()

    async def aclose(self) -> None:
        """Cancel the prompt, close the session (its run aborted, its nursery ended), then
        its extensions hear ``session_shutdown``. On cancellation it stops waiting."""
        self.abort()
        await self.runtime.session.aclose()
        if (extensions := self.runtime.session.extensions) is not None:
            await extensions.session_shutdown()
        await close_extension_host(self.runtime)

    def abort(self, upto: int | None = None) -> None:
        """``session/cancel``: abort the work going, answer the prompt ``cancelled`` now; the
        prompts read so far (``upto``: those up to that ticket) that have not started yet
        answer ``cancelled`` without starting."""
        self.cancelled_upto = max(self.cancelled_upto, self.accepted if upto is None else upto)
        self.runtime.aborts.cancel(*ABORT)
        self.stopping = True
        pending = self.pending
        if pending is not None and not pending.done.is_set():
            pending.cancelled = True
            self.muted = True
            pending.done.set()


def live(acp: AcpSession) -> AgentSession:
    """The agent session of an ACP session."""
    return acp.runtime.session
