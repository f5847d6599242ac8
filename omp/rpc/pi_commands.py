"""The commands pi has (``@earendil-works/pi-coding-agent``) that the original lacks or names
differently, and ``list_sessions`` (docs/protocol/index.md#pis-commands).

``get_commands``, ``fork`` and ``get_fork_messages`` are pi's names for
``get_available_commands``, ``branch`` and ``get_branch_messages``, answered in pi's form;
``clear_queue`` and ``clone`` are pi's own; ``list_sessions`` is neither's (it reads stored
sessions in a worker thread, ``omp.session.listing``). Each handler takes its command and
returns its ``Response``, as in ``omp.rpc.commands``; the route table there names their lanes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec
import trio

from ..config import agent_dir
from ..protocol import commands as cmd
from ..protocol import payloads
from ..protocol.codec import INVALID_PARAMS
from ..protocol.events import Notice
from ..protocol.frames import Response, fail, ok
from ..session import AgentSession, SessionError
from ..session.entries import message_text
from .slash import Slash

MAX_NOTICES = 10
"""Skipped files said one by one up to this many; the rest in one notice."""

_PI_SOURCE: dict[str, payloads.PiCommandSource] = {
    "skill": "skill",
    "extension": "extension",
    "file": "prompt",
    "custom": "prompt",
    "mcp_prompt": "prompt",
}
"""Our command sources in pi's words; built-ins are left out, as pi leaves out its own."""


class PiCommands(msgspec.Struct, eq=False):
    session: AgentSession
    slash: Slash
    emit: Callable[[msgspec.Struct], None]

    def get_commands(self, frame: cmd.GetCommands) -> Response:
        return ok(
            "get_commands",
            frame.id,
            payloads.PiCommandsPayload(
                commands=[
                    payloads.PiCommand(
                        name=c.name, source=_PI_SOURCE[c.source], description=c.description
                    )
                    for c in self.slash.command_list()
                    if c.source in _PI_SOURCE
                ]
            ),
        )

    def clear_queue(self, frame: cmd.ClearQueue) -> Response:
        steering, follow_ups = self.session.runs.clear_queue()
        return ok(
            "clear_queue",
            frame.id,
            payloads.ClearedQueue(
                steering=[message_text(x) for x in steering],
                followUp=[message_text(x) for x in follow_ups],
            ),
        )

    async def fork(self, frame: cmd.Fork) -> Response:
        """``branch`` under pi's name. On cancellation nothing changed."""
        try:
            text = await self.session.branch(frame.entryId)
        except SessionError as exc:
            return fail("fork", frame.id, str(exc))
        return ok("fork", frame.id, payloads.ForkResult(text=text, cancelled=False))

    async def clone(self, frame: cmd.Clone) -> Response:
        """The whole current branch into a new session, continued there. On cancellation
        nothing changed."""
        try:
            await self.session.branch(None)
        except SessionError as exc:
            return fail("clone", frame.id, str(exc))
        return ok("clone", frame.id, payloads.SessionChangeResult(cancelled=False))

    def get_fork_messages(self, frame: cmd.GetForkMessages) -> Response:
        return ok(
            "get_fork_messages",
            frame.id,
            payloads.BranchMessages(
                messages=[
                    payloads.BranchMessage(entryId=entry_id, text=text)
                    for entry_id, text in self.session.store.branch_messages()
                ]
            ),
        )

    async def list_sessions(self, frame: cmd.ListSessions) -> Response:
        """The stored sessions of ``cwd`` (default: the session's) or of every project
        (``all``), newest first; a file that is no session is skipped and said in a
        ``notice``. Read in a worker thread once the session's own file has every line
        appended so far; on cancellation it is abandoned."""
        limit = frame.limit if isinstance(frame.limit, int) else None
        if limit is not None and limit <= 0:
            return fail(
                "list_sessions", frame.id, "limit must be a positive integer", INVALID_PARAMS
            )
        session = self.session
        agent_directory = session.prompt_options.agent_directory or agent_dir()
        own, here = session.store.directory, session.cwd
        query = frame.query.strip() if isinstance(frame.query, str) else ""
        wanted = frame.cwd if isinstance(frame.cwd, str) else None
        # On first use: a server that is never asked for its sessions does not load the reader.
        from ..session.listing import Listing, list_stored, project_directory

        def read() -> Listing:
            if frame.all:
                return list_stored(
                    [agent_directory / "sessions", *([own] if own else [])],
                    limit=limit,
                    query=query or None,
                )
            if wanted is not None:
                path = (here / Path(wanted).expanduser()).resolve()
                directory = project_directory(agent_directory, path)
            else:
                path, directory = here, own or project_directory(agent_directory, here)
            return list_stored([directory], cwd=str(path), limit=limit, query=query or None)

        # The session's own file is among those read: with every line the host has seen.
        await session.store.written()
        listing = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        for skipped, why in listing.skipped[:MAX_NOTICES]:
            self.emit(
                Notice(level="warning", source="sessions", message=f"Skipped {skipped}: {why}")
            )
        if len(listing.skipped) > MAX_NOTICES:
            self.emit(
                Notice(
                    level="warning",
                    source="sessions",
                    message=(
                        f"Skipped {len(listing.skipped) - MAX_NOTICES} more files that are no "
                        "sessions"
                    ),
                )
            )
        return ok("list_sessions", frame.id, payloads.StoredSessions(sessions=listing.sessions))
