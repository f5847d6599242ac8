"""The session store: a session's file and identity, its branching, and the views of it.

``SessionStore`` owns the ``SessionFile`` (None with ``--no-session``) and what identifies the
session (its id, its name). Every finished message, model and thinking-level change is appended
through ``persist``; a write that fails is reported once (a ``notice``) and the session goes on
in memory, the reason kept in ``persistence_failure`` (the process then exits 1).

Appends are written behind the loop by the file's writer thread (``omp.session.writer``), in
order; ``written`` waits for them (at the close), and so does loading or creating another
file: the file read may be one this session wrote, and "the newest session" (``--continue``,
``open_session``) is the one modified last, which a file left behind must not become by lines
landing after its successor was created. Loading or creating another file (``new_session``,
``switch_session``, ``open_session``, ``branch``, ``clone``) happens in a worker
thread *before* anything changes: a file that cannot be read or created changes nothing, and
neither does a cancellation before it is loaded. Adopting a loaded file is synchronous:
``adopt`` makes it the session and returns what the rest of the session takes from it (the live
context, the model and thinking level it last used).

The store never touches the agent, the model or the runs; the ``AgentSession`` façade applies
what ``adopt`` returns.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import trio

from ..files import UnusableFile
from ..protocol import messages as m
from ..protocol.events import Notice
from .context import BranchSettings, branch_settings, build_context, entries_since, entry_tree
from .context import user_messages as branch_user_messages
from .entries import CURRENT_VERSION, SessionHeader, iso_timestamp
from .errors import InvalidRequest, SessionError
from .file import SessionFile, branch_file, fork_file
from .locations import newest_session
from .sink import Published
from .writer import on_loop

MAX_SESSION_NAME_CHARS = 1000
Built = tuple[list[m.AgentMessage], BranchSettings]
"""A file's live context and branch settings, built from it."""


class Adopted(msgspec.Struct, frozen=True):
    """What a session takes from a file it adopts."""

    messages: list[m.AgentMessage]
    settings: BranchSettings | None
    """The branch's last model and thinking level; None for a fresh in-memory session."""
    fresh: bool
    """The file has no entries yet: its first ones (model, thinking level) are to be written."""


class SessionStore(msgspec.Struct, eq=False):
    cwd: Path
    publish: Callable[[Published], None]
    """Where a persistence failure's ``notice`` goes."""
    directory: Path | None = None
    """Where new session files go (None: in memory only)."""
    file: SessionFile | None = None
    persistence_failure: str | None = None
    """Why the session file stopped being written, once it did."""
    startup_notes: list[str] = msgspec.field(default_factory=list)
    """What the start passed over that a host should hear once (``--continue`` skipping an
    unusable newer file); ``omp.rpc.lifecycle.startup_notices`` takes them."""
    _session_id: str = msgspec.field(default_factory=lambda: str(uuid.uuid4()))
    _started: str = msgspec.field(default_factory=lambda: iso_timestamp(datetime.now(UTC)))
    """When the in-memory session began (its header's ``timestamp``)."""
    _name: str | None = None
    max_line_bytes: int | None = None
    """``stream.maxSessionLineBytes``: the longest line of the files it adopts (None: the
    file's own bound, the largest frame)."""
    _left: list[SessionFile] = msgspec.field(default_factory=list)
    """Files this session left (``adopt``) while their writer threads still had lines queued:
    they are written before any file is read again or another is created (``written``):
    the read may be of one of them, and "the newest session" is the one modified last."""

    def take_startup_notes(self) -> list[str]:
        """The ``startup_notes`` said so far, which the caller now says; none are left."""
        notes, self.startup_notes = self.startup_notes, []
        return notes

    # -- identity ----------------------------------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.file.session_id if self.file is not None else self._session_id

    def header(self) -> SessionHeader:
        """The session's header entry: the file's as stored, or, in memory (``--no-session``),
        the one its file would have (``--mode json`` writes it first,
        docs/design/command-line.md#json-mode-mode-json)."""
        if self.file is not None:
            return self.file.header
        return SessionHeader(version=CURRENT_VERSION, id=self._session_id,
                             timestamp=self._started, cwd=str(self.cwd))

    @property
    def session_file(self) -> str | None:
        return None if self.file is None else str(self.file.path)

    @property
    def session_name(self) -> str | None:
        return self.file.name if self.file is not None else self._name

    def set_session_name(self, name: str) -> None:
        """Name the session. Raises SessionError for an empty name, one longer than
        ``MAX_SESSION_NAME_CHARS`` (it is in every ``get_state``, which must stay far below the
        frame limit) or one the file cannot take."""
        name = name.strip()
        if not name:
            raise InvalidRequest("Session name cannot be empty")
        if len(name) > MAX_SESSION_NAME_CHARS:
            raise InvalidRequest(f"Session name is too long: {len(name):,} characters (the "
                                 f"limit is {MAX_SESSION_NAME_CHARS:,})")
        if self.file is not None:
            try:
                self.file.set_name(name)
            except (OSError, ValueError) as exc:
                raise SessionError(f"Session name cannot be saved: {exc}") from None
        else:
            self._name = name

    # -- writing -----------------------------------------------------------------------------

    def persist(self, write: Callable[[SessionFile], object]) -> None:
        """Append to the session file (its writer thread writes the line behind the loop). A
        write failure is reported once as a notice and the session goes on in memory: the run
        is not lost because the disk is."""
        if self.file is None:
            return
        try:
            write(self.file)
        except OSError as exc:
            self._file_failed(self.file, exc)

    async def written(self) -> None:
        """Wait until the writer threads have written every line appended so far: the session
        file's (a failure is the usual persistence failure) and those of the files this
        session left (their failures were reported through their own callbacks). On
        cancellation it stops waiting (the threads go on writing)."""
        for left in self._left:
            if left.pending:
                with contextlib.suppress(OSError):
                    await trio.to_thread.run_sync(left.flush, abandon_on_cancel=True)
        self._left.clear()
        if (file := self.file) is not None and file.pending:
            try:
                await trio.to_thread.run_sync(file.flush, abandon_on_cancel=True)
            except OSError as exc:
                self._file_failed(file, exc)

    def _file_failed(self, file: SessionFile, exc: OSError) -> None:
        """``file`` could not be written (an append, or its writer thread; once per file)."""
        if file is self.file:  # in memory from now on, under the same id and name
            self.file = None
            self._session_id, self._name = file.session_id, file.name
        path = file.path
        self.persistence_failure = f"the session file {path} could not be written: " + (
            f"{exc.strerror or exc}")
        self.publish(Notice(level="error", source="session-persistence",
                            message=f"Could not write the session file {path.name}: "
                                    f"{exc.strerror or exc}; continuing in memory"))

    def append_message(self, message: m.AgentMessage) -> None:
        self.persist(lambda f: f.append_message(message))

    # -- which file ----------------------------------------------------------------------------

    def adopt(self, file: SessionFile | None, built: Built | None = None) -> Adopted:
        """Make ``file`` the session (None: a fresh in-memory one); ``built``: its context and
        settings as already built from it (off the loop). Its appends are written behind the
        loop from now on."""
        if self.file is not None and self.file is not file and self.file.pending:
            self._left.append(self.file)
        self.file = file
        self._name = None
        if file is None:
            self._session_id = str(uuid.uuid4())
            self._started = iso_timestamp(datetime.now(UTC))
            return Adopted([], None, fresh=False)
        file.write_behind(on_loop(functools.partial(self._file_failed, file)))
        if self.max_line_bytes is not None:
            file.set_max_line_bytes(self.max_line_bytes)
        messages, settings = built or (build_context(file), branch_settings(file))
        return Adopted(messages, settings, fresh=not file.entries)

    def open_startup(self, *, session_path: Path | None, resume: bool) -> Adopted:
        """The file a process starts with: ``--session FILE`` (opened, or created there),
        ``--continue`` (the newest session of this cwd), else a new one. Raises SessionError
        naming the file when it cannot be read or created."""
        assert self.directory is not None
        skipped: list[str] = []
        newest = None
        try:
            if session_path is not None:
                file = (SessionFile.open(session_path) if session_path.exists()
                        else SessionFile.create_at(session_path, cwd=str(self.cwd)))
            elif resume and (newest := newest_session(self.directory,
                                                      skipped=skipped)) is not None:
                file = SessionFile.open(newest)
            else:
                file = SessionFile.create(self.directory, cwd=str(self.cwd))
            then = f"continuing {newest.name}" if newest else "starting a new session"
            self.startup_notes += [f"--continue skipped {line}; {then}" for line in skipped]
        except (OSError, ValueError, RecursionError) as exc:
            raise SessionError(f"Cannot open the session file: {_reason(exc)}") from None
        return self.adopt(file)

    async def load_new(self, parent_session: str | None) -> SessionFile | None:
        """A new file for ``new_session`` (None in memory), created in a worker thread. Raises
        SessionError; on cancellation nothing was created."""
        if self.file is None or self.directory is None:
            return None
        create = functools.partial(SessionFile.create, self.directory, cwd=str(self.cwd),
                                   parent_session=parent_session)
        await self.written()  # the file left behind must not look newer than this one
        try:
            return await trio.to_thread.run_sync(create)
        except OSError as exc:
            raise SessionError(f"Cannot create a session file: {exc.strerror or exc}") from None

    async def load_switch(self, path: Path) -> SessionFile:
        """The file ``switch_session`` continues in (a new empty one there when missing).
        Raises SessionError; on cancellation nothing changed."""
        if self.file is None and self.directory is None:
            raise SessionError("switch_session requires session persistence (omit --no-session)")
        if not await trio.Path(path.parent).is_dir():
            raise SessionError(f"File not found: {path}")
        create = functools.partial(SessionFile.create_at, path, cwd=str(self.cwd))
        await self.written()  # it may be this very file, or one left before
        try:
            return (await _load_file(path) if await trio.Path(path).exists() else
                    await trio.to_thread.run_sync(create))
        except (OSError, ValueError, RecursionError) as exc:
            raise SessionError(f"Cannot open session {path}: {_reason(exc)}") from None

    async def load_open(self, directory: Path, *, empty: bool
                        ) -> tuple[SessionFile | None, bool]:
        """``open_session``: the newest non-empty session in ``directory`` (resumed), or a
        new one there; (file, resumed). The file is None when that is the session already
        (``empty``: the live context is empty). Raises SessionError; on cancellation nothing
        changed."""
        if self.file is None:
            raise SessionError("open_session requires session persistence (omit --no-session)")
        await self.written()  # the newest may be a file this session wrote, still growing
        newest = await trio.to_thread.run_sync(
            lambda: newest_session(directory, non_empty=True), abandon_on_cancel=True)
        if newest is not None and newest == self.file.path:
            return None, True
        if newest is None and self.file.path.parent == directory and empty:
            return None, False  # already the empty session of that directory
        create = functools.partial(SessionFile.create, directory, cwd=str(self.cwd))
        try:
            if newest is not None:
                return await _load_file(newest), True
            file = await trio.to_thread.run_sync(create)
        except (OSError, ValueError, RecursionError) as exc:
            raise SessionError(f"Cannot open a session in {directory}: {_reason(exc)}") from None
        self.directory = directory
        return file, False

    async def branch(self, entry_id: str) -> tuple[SessionFile, str, Built]:
        """A new file with the conversation before user message ``entry_id``, that message's
        text, and the new file's context and settings: written, read and built in a worker
        thread (a long session never blocks the loop). Raises SessionError; on cancellation
        the thread is abandoned and nothing changed here (its new file may still appear)."""
        file = self.file
        if file is None:
            raise SessionError("branch requires session persistence (omit --no-session)")
        await self.written()  # the file branched from must not look newer than the branch
        try:
            return await trio.to_thread.run_sync(_branch_and_build, file, entry_id,
                                                 abandon_on_cancel=True)
        except ValueError:
            raise SessionError("Invalid entry ID for branching") from None
        except OSError as exc:
            raise SessionError(f"Cannot write the branch: {exc.strerror or exc}") from None

    async def clone(self) -> tuple[SessionFile, str, Built]:
        """A new file with the whole current branch (pi's ``clone``), no text, and its context
        and settings, written and built in a worker thread as ``branch`` does. Raises
        SessionError; on cancellation the thread is abandoned and nothing changed here."""
        file = self.file
        if file is None:
            raise SessionError("clone requires session persistence (omit --no-session)")
        if file.leaf_id is None:
            raise SessionError("Cannot clone session: no current entry selected")
        await self.written()  # the file cloned must not look newer than the clone
        try:
            return await trio.to_thread.run_sync(_clone_and_build, file,
                                                 abandon_on_cancel=True)
        except OSError as exc:
            raise SessionError(f"Cannot write the clone: {exc.strerror or exc}") from None

    # -- views (get_entries, get_tree, paging, export) ---------------------------------------

    @property
    def leaf_id(self) -> str | None:
        """The current entry of the session file (None in memory or before any entry)."""
        return None if self.file is None else self.file.leaf_id

    def entries_json(self, since: str | None = None) -> list[dict[str, Any]]:
        """The file's entries (after entry ``since``) as JSON objects; KeyError for an unknown
        ``since``. Empty for an in-memory session."""
        file = self.file
        return [] if file is None else [file.entry_json(e) for e in entries_since(file, since)]

    def entry_tree(self) -> list[dict[str, Any]]:
        """The file's entries as a tree (``get_tree``); empty for an in-memory session."""
        return [] if self.file is None else entry_tree(self.file)

    def branch_messages(self) -> list[tuple[str, str]]:
        return [] if self.file is None else branch_user_messages(self.file)

    def entry_id_of(self, message: m.AgentMessage) -> str | None:
        """The entry that holds ``message`` (the same object once loaded or appended)."""
        if self.file is None:
            return None
        for entry in self.file.branch_path():
            if getattr(entry, "message", None) is message:
                return str(entry.id)
        return None

    async def export_html(self, output_path: str | None, *, messages: list[m.AgentMessage],
                          model: str) -> str:
        """Write the session as one self-contained HTML page, private (0600) like the session;
        returns the path as shown to the host. Only a regular file is replaced (a FIFO, a
        device or a directory at ``output_path`` is refused). Rendering and writing run in a
        worker thread. Raises SessionError. On cancellation the thread is abandoned and may
        still write the page (never half: it is replaced atomically)."""
        from .export_html import default_export_name, render_html, write_html

        file = self.file
        if file is None:
            raise SessionError("Cannot export in-memory session to HTML")
        shown = output_path if output_path is not None else default_export_name(file.path)
        entries = [file.entry_json(e) for e in file.entries]
        title = self.session_name or file.path.name
        session_id = self.session_id

        def render_and_write() -> None:
            target = self.cwd / Path(os.path.expanduser(shown))  # an absolute path stays as is
            write_html(target, render_html(title=title, session_id=session_id,
                                           messages=messages, entries=entries, model=model))

        try:
            await trio.to_thread.run_sync(render_and_write, abandon_on_cancel=True)
        except UnusableFile as exc:
            raise SessionError(f"Cannot write {shown}: {exc}") from None
        except OSError as exc:
            raise SessionError(f"Cannot write {shown}: {exc.strerror or exc}") from None
        return shown


def _branch_and_build(file: SessionFile, entry_id: str) -> tuple[SessionFile, str, Built]:
    """``branch_file`` and the new file's context and settings (blocking, for a worker thread:
    the new file is nobody else's yet)."""
    new, text = branch_file(file, entry_id)
    return new, text, (build_context(new), branch_settings(new))


def _clone_and_build(file: SessionFile) -> tuple[SessionFile, str, Built]:
    """``fork_file`` and the new file's context and settings (blocking, for a worker thread)."""
    new = fork_file(file)
    return new, "", (build_context(new), branch_settings(new))


async def _load_file(path: Path) -> SessionFile:
    """Read a whole session file in a worker thread (a large file never blocks the loop).
    ``SessionFile.open`` refuses anything but a regular file of a sane size before reading it
    (a FIFO could block forever). On cancellation the read is abandoned (its thread finishes
    on its own) and nothing changed."""
    return await trio.to_thread.run_sync(SessionFile.open, path, abandon_on_cancel=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply to be read"
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    return str(exc)
