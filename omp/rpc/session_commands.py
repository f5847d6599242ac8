"""Command handlers of the session's file and context: session changes, branching, the views of
the file (entries, tree, pages, stats, HTML export), manual compaction and handoff, and RPC
``bash``. Their routes (lanes, abort families) are in ``omp.rpc.commands``; each handler takes
its command (and, when its route is ``scoped``, the cancel scope the reader registered for it)
and returns its ``Response``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import trio
from msgspec import UNSET

from ..protocol import commands as cmd
from ..protocol import events as ev
from ..protocol import payloads
from ..protocol.codec import INVALID_PARAMS
from ..protocol.frames import Response, fail, ok
from ..session import AgentSession, SessionError
from ..session.errors import InvalidRequest
from ..session.stats import session_stats


class SessionCommands(msgspec.Struct, eq=False):
    session: AgentSession

    async def change_session(self, frame: cmd.NewSession | cmd.SwitchSession | cmd.OpenSession
                             ) -> Response:
        """new_session / switch_session / open_session: the run in progress is aborted (its
        prompts answered ``aborted``), then the session continues in another file.

        On cancellation (the shutdown; ``abort`` leaves family ``command`` alone) ``Cancelled``
        propagates (``dispatch.answer`` answers it as cancelled work). Cancelled while the file
        is read or created, the session is unchanged (a file being created is still made, then
        left unused); later, the run may be aborted and the context cleared while the session
        stays in its old file."""
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
            context_usage=s.maintenance.context_usage()))

    async def export_html(self, frame: cmd.ExportHtml) -> Response:
        """Write the session as one self-contained HTML page (in a worker thread).

        On cancellation (the shutdown; ``abort`` leaves family ``command`` alone) the thread is
        abandoned and may still write the page (whole: it is replaced atomically), and
        ``Cancelled`` propagates (``dispatch.answer`` answers it as cancelled work)."""
        output = frame.outputPath if isinstance(frame.outputPath, str) else None
        try:
            shown = await self.session.export_html(output)
        except SessionError as exc:
            return fail("export_html", frame.id, str(exc))
        return ok("export_html", frame.id, payloads.ExportHtmlResult(path=shown))

    # Logins (omp.login): OAuth for providers with an ``oauth`` block in models.yml, API-key
    # login for every other provider that takes a key. Vendor-subscription logins that need us
    # to pose as the vendor's own client are not offered (docs/guides/login.md#logging-in).

    def set_session_name(self, frame: cmd.SetSessionName) -> Response:
        try:
            self.session.store.set_session_name(frame.name)
        except SessionError as exc:
            return fail("set_session_name", frame.id, str(exc),
                        INVALID_PARAMS if isinstance(exc, InvalidRequest) else UNSET)
        return ok("set_session_name", frame.id)

    async def branch(self, frame: cmd.Branch) -> Response:
        """A new file with the conversation before entry ``entryId``, continued there; the
        response has that message's text. On cancellation (the shutdown; ``abort`` leaves
        family ``command`` alone) nothing changed (the abandoned worker thread's new file may
        still appear) and ``Cancelled`` propagates (``dispatch.answer`` answers it as
        cancelled work)."""
        try:
            text = await self.session.branch(frame.entryId)
        except SessionError as exc:
            return fail("branch", frame.id, str(exc))
        return ok("branch", frame.id, payloads.BranchResult(text=text, cancelled=False))

    def get_branch_messages(self, frame: cmd.GetBranchMessages) -> Response:
        return ok("get_branch_messages", frame.id, payloads.BranchMessages(messages=[
            payloads.BranchMessage(entryId=entry_id, text=text)
            for entry_id, text in self.session.store.branch_messages()]))

    def get_entries(self, frame: cmd.GetEntries) -> Response:
        since = frame.since if isinstance(frame.since, str) else None
        try:
            entries = self.session.store.entries_json(since)
        except KeyError:
            return fail("get_entries", frame.id, f"Unknown entries cursor: {since}",
                        "unknown_since")
        return ok("get_entries", frame.id, {"entries": entries,
                                            "leafId": self.session.store.leaf_id})

    def get_tree(self, frame: cmd.GetTree) -> Response:
        from .paging import encode_tree  # lazy: omp.lazy says why

        # A long session nests deeper than a recursive encoder goes: pre-encoded.
        return ok("get_tree", frame.id, {
            "tree": msgspec.Raw(encode_tree(self.session.store.entry_tree())),
            "leafId": self.session.store.leaf_id})

    def get_messages_page(self, frame: cmd.GetMessagesPage) -> Response:
        from .paging import PageError, page  # lazy: omp.lazy says why

        session = self.session
        if session.is_streaming or session.maintenance.compacting:
            return fail("get_messages_page", frame.id,
                        "Cannot page messages while the session is changing", "session_busy")
        cursor = frame.cursor if isinstance(frame.cursor, str) else None
        limit = frame.limit if isinstance(frame.limit, int) else 100
        try:
            result = page(session.messages, cursor, limit, session.session_id,
                          session.store.leaf_id)
        except PageError as exc:
            return fail("get_messages_page", frame.id, str(exc),
                        exc.code or msgspec.UNSET)
        return ok("get_messages_page", frame.id, result)

    async def compact(self, frame: cmd.Compact, scope: trio.CancelScope) -> Response:
        """Summarise the older context (``omp.session.maintenance``), in ``scope``. Cancelled
        through ``scope`` (``abort``, the shutdown) it answers "Compaction cancelled" and the
        context is unchanged (a run it aborted first stays aborted); cancelled from outside,
        ``Cancelled`` propagates, nothing changed."""
        instructions = (frame.customInstructions
                        if isinstance(frame.customInstructions, str) else None)
        try:
            result = await self.session.maintenance.compact(instructions, scope=scope)
        except SessionError as exc:
            return fail("compact", frame.id, str(exc))
        return ok("compact", frame.id, result)

    async def handoff(self, frame: cmd.Handoff, scope: trio.CancelScope) -> Response:
        """Replace the older context by a handoff document the model writes, in ``scope``.
        Cancelled through ``scope`` (``abort``, the shutdown) it answers "Handoff cancelled"
        and the context is unchanged; cancelled from outside, ``Cancelled`` propagates,
        nothing changed."""
        instructions = (frame.customInstructions
                        if isinstance(frame.customInstructions, str) else None)
        try:
            await self.session.maintenance.handoff(instructions, scope=scope)
        except SessionError as exc:
            return fail("handoff", frame.id, str(exc))
        # savedPath is only for automatic handoffs saved to disk
        # (docs/design/sessions.md#the-handoff-response).
        return ok("handoff", frame.id, {})

    async def bash(self, frame: cmd.Bash, scope: trio.CancelScope) -> Response:
        """Run one shell command (its own task) and answer with its BashResult; its output
        streams as ``bash_execution_update`` frames meanwhile (pi's), with the command's id.

        ``abort_bash``, ``abort`` and stdin EOF cancel it (``scope``, registered when the
        command was read, so also before it started): the process group is killed and the
        response says ``cancelled``.
        """
        from ..tools.bash import bash_result
        from ..tools.shell import ShellRun, ShellSpawnError

        session = self.session
        timeout = frame.timeout if isinstance(frame.timeout, int | float) else 300.0
        command_id = msgspec.UNSET if frame.id is None else frame.id
        pace = session.sink.pace

        async def stream(text: str) -> None:
            session.publish(ev.BashExecutionUpdate(delta=text, id=command_id))
            # A host far behind stops the reading (the command then blocks on its full
            # pipe), as the model's stream does: the frames never pile up in memory.
            await pace.wait_if_behind()

        run = ShellRun(frame.command, cwd=session.cwd, timeout=timeout, on_output=stream,
                       environment=session.tool_context.environment)
        try:
            with scope:
                await run.run()
        except ShellSpawnError as exc:
            return fail("bash", frame.id, str(exc))
        result = run.result()
        session.runs.record_bash(result, exclude_from_context=frame.excludeFromContext)
        return ok("bash", frame.id, bash_result(result))


def _user_path(text: str) -> Path:
    """A path a host sent, with ``~`` expanded (string work, no I/O)."""
    return Path(os.path.expanduser(text))


def _tag(frame: Any) -> str:
    tag = frame.__struct_config__.tag
    return tag if isinstance(tag, str) else "unknown"
