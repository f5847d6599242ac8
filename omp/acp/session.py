r"""One ACP session (``AcpSession``): its runtime, the prompt going, the mapping of its events
to ``session/update``\ s (it is the session's event sink), its tool-approval policy (asks the
editor with ``session/request_permission``, remembers "always"), and ``session/cancel``.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import msgspec
import trio

from ..llm.builder import Pace
from ..protocol import events as ev
from ..rpc.commands import Commands
from ..rpc.lifecycle import CLEANUP_SECONDS, Runtime
from ..session import AgentSession
from ..session.aborts import ABORT
from ..session.approval import ApprovalRequest
from ..session.sink import Published, Update
from . import wire as w
from .client import ClientError
from .updates import UpdateMapper, tool_call

if TYPE_CHECKING:
    from .server import AcpServer


PERMISSION_OPTIONS = [
    w.PermissionOption(optionId="allow_once", name="Allow once", kind="allow_once"),
    w.PermissionOption(optionId="allow_always", name="Always allow", kind="allow_always"),
    w.PermissionOption(optionId="reject_once", name="Reject", kind="reject_once"),
    w.PermissionOption(optionId="reject_always", name="Always reject", kind="reject_always")]
"""The original's four answers (omp-surface C.7)."""


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
    """One session of the ACP server: its runtime, mapping state, the prompt going."""

    server: AcpServer
    session_id: str = ""
    runtime: Runtime | None = None
    commands: Commands | None = None
    mapper: UpdateMapper | None = None
    pending: PendingPrompt | None = None
    muted: bool = False
    """After ``session/cancel``: the cancelled turn's events are no longer forwarded."""
    accepted: int = 0
    """Tickets of the ``session/prompt`` requests read for this session so far: a prompt gets
    its ticket when the reader reads it, so a ``session/cancel`` read after it finds it even
    before its task started (DESIGN.md §2: work is registered when it is accepted)."""
    cancelled_upto: int = 0
    """The prompts with a ticket up to this one are cancelled."""
    remembered: dict[str, bool] = attrs.field(factory=dict)
    """``allow_always`` / ``reject_always`` answers, by tool name, for this session (C.7)."""

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

    @property
    def cwd(self) -> Path:
        assert self.runtime is not None
        return self.runtime.session.cwd

    # -- the session's sink (omp.session.sink.EventSink) ---------------------------------------

    def publish(self, event: Published) -> None:
        if isinstance(event, ev.PromptResult):
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
        if isinstance(frame, ev.Notice) and frame.source == "mcp":
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
        assert runtime is not None

        async def serve(*, task_status: trio.TaskStatus[None]) -> None:
            await runtime.session.serve(task_status=task_status)
            nursery.cancel_scope.cancel()  # closed: its MCP servers end with it

        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(serve)
                if runtime.mcp is not None:
                    await nursery.start(runtime.mcp.run)
                task_status.started()
        finally:
            with trio.move_on_after(CLEANUP_SECONDS, shield=True):
                await runtime.http.aclose()

    async def close(self) -> None:
        """Cancel the prompt, close the session (its run aborted, its nursery ended), then
        its extensions hear ``session_shutdown``. On cancellation it stops waiting."""
        if self.runtime is None:
            return
        self.cancel()
        await self.runtime.session.close()
        if (extensions := self.runtime.session.extensions) is not None:
            await extensions.session_shutdown()

    def cancel(self, upto: int | None = None) -> None:
        """``session/cancel``: abort the work going, answer the prompt ``cancelled`` now; the
        prompts read so far (``upto``: those up to that ticket) that have not started yet
        answer ``cancelled`` without starting."""
        if self.runtime is None:
            return
        self.cancelled_upto = max(self.cancelled_upto, self.accepted if upto is None else upto)
        self.runtime.aborts.cancel(*ABORT)
        pending = self.pending
        if pending is not None and not pending.done.is_set():
            pending.cancelled = True
            self.muted = True
            pending.done.set()


def live(acp: AcpSession) -> AgentSession:
    """The session of an opened ACP session."""
    assert acp.runtime is not None
    return acp.runtime.session
