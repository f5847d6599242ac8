"""One session file on disk: JSONL, append-only, header first
(docs/design/sessions.md#session-files).

:class:`SessionFile` owns one file and the in-memory copy of its entries; every write goes through
it. The layout is the one pi and omp write, so a file written here opens in the original and a
file the original wrote opens here:

* line 1 is the header; omp's 256-byte title slot (a first line of type ``title``) is accepted on
  load but never written (pi would reject a file that does not start with its header; omp accepts
  both layouts), and ``set_name`` keeps an existing slot in step;
* then one entry per line; entries form a tree by ``parentId``, the leaf is the last entry in file
  order and every append becomes a child of the leaf and moves it;
* an append is one ``os.write`` of the whole line to an ``O_APPEND`` descriptor (``fsync`` on
  request), so the only possible damage is a torn last line (a crash mid-write). Opening the
  file repairs it: the fragment is appended to ``<file>.torn`` (``0600``, next to it) and cut
  off the file, so the next append does not leave it in the middle and the file stays valid
  JSON Lines (when the file cannot be written, the fragment is skipped and the next append
  starts a line of its own). Any other unreadable line is reported in ``problems`` with its
  line number and skipped;
* with :meth:`SessionFile.write_behind` (what a serving session does) the write happens in a
  writer thread, in order, and an append only queues its line: ``omp.session.writer`` says what
  that keeps and what it costs; without it, the append writes before it returns;
* files are created ``0600`` with ``O_EXCL``; a directory is never created here: the one a file
  goes in must exist (:func:`make_private_dirs` creates the runtime's own, ``0700``), so a path
  a host names never leaves directories behind. Version 1 and 2 files are migrated on load and
  rewritten whole (temp file, then ``os.replace``);
* a line is at most ``max_line_bytes`` long (``stream.maxSessionLineBytes``, at most the largest
  frame): the longest strings of a longer entry are kept whole in files of the session's
  artifacts directory, written first, and the line keeps their heads and names them
  (``omp.session.oversize``);
* a session file is a regular file of at most ``MAX_SESSION_FILE_BYTES``: anything else (a FIFO,
  a device, a huge sparse file) is refused before it is read (``omp.files``), and appends never
  wait on a FIFO swapped in for the file;
* loaded entries keep their original JSON object, so keys this port does not model
  (``contextSnapshot``, ...) survive ``entry_json`` and branching (:func:`branch_file`,
  docs/design/sessions.md#branch).

Everything here is blocking and synchronous and never calls trio: :meth:`SessionFile.open` does
the whole load (read, decode, migrate) in one call, so a caller may run it, or
:func:`branch_file`, in a worker thread. A :class:`SessionFile` is not thread-safe: use it from
one thread at a time; the one exception is :func:`branch_file`, which only reads the entries
that exist when it starts and may run in a worker thread while the owner appends.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import msgspec
from msgspec import UNSET

from omp.files import read_regular
from omp.protocol.frames import MAX_REASSEMBLED_FRAME_BYTES
from omp.protocol.messages import (
    AgentMessage,
    BranchSummaryMessage,
    CompactionSummaryMessage,
    CustomMessage,
    UserMessage,
)

from .entries import (
    CURRENT_VERSION,
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    Entry,
    KnownEntry,
    LabelEntry,
    MessageEntry,
    ModelChangeEntry,
    RawEntry,
    ServiceTierChangeEntry,
    SessionHeader,
    SessionInfoEntry,
    ThinkingLevelChangeEntry,
    TitleChangeEntry,
    decode_entry,
    encode_line,
    entry_line_decoder,
    iso_timestamp,
    message_text,
    new_entry_id,
    now_iso,
    uuid7,
)
from .writer import LineWriter, open_for_write, write_all

__all__ = ["MAX_SESSION_FILE_BYTES", "LoadProblem", "SessionFile", "SessionFormatError",
           "branch_file", "make_private_dirs"]

MAX_SESSION_FILE_BYTES: Final = 1 << 30
"""The largest session file loaded (1 GiB). Loading holds it in memory a few times over; a
larger one is refused with :class:`~omp.files.UnusableFile` before anything is read."""
TITLE_SLOT_BYTES: Final = 256
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700

_E = TypeVar("_E", bound=Entry)


class LoadProblem(msgspec.Struct, frozen=True):
    """A line that could not be used; loading went on without it."""

    line: int
    """1-based line number in the file."""
    message: str


class SessionFormatError(ValueError):
    """The file has no valid session header (nothing was modified)."""


# --- writing bytes ---------------------------------------------------------------------------


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and any missing parents with mode 0700 (the umask cannot widen it).

    Only for directories the runtime owns (the default session directory, a subagent's
    artifacts); a directory a host names is used as it is, never created.
    """
    missing: list[Path] = []
    current = directory
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(path, DIR_MODE)


def _write_new_file(path: Path, data: bytes | list[bytes], *, fsync: bool) -> None:
    """Create ``path`` (must not exist; its directory must) 0600 and write ``data`` in full:
    bytes, or lines to join with ``\n`` (written a piece at a time: see ``_joined``)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except FileNotFoundError:
        if not os.path.isdir(path.parent):
            raise FileNotFoundError(errno.ENOENT, f"No such directory: {path.parent}",
                                    str(path)) from None
        raise
    try:
        os.fchmod(fd, FILE_MODE)
        for piece in [data] if isinstance(data, bytes) else _joined(data):
            write_all(fd, piece)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _joined(lines: list[bytes], piece_bytes: int = 256 * 1024) -> Iterator[bytes]:
    """``b"\n".join(lines)`` in pieces of about ``piece_bytes``. One join of a 13 MB session
    holds the GIL 10-16 ms (a copy into fresh pages), and in a worker thread (``branch``) that
    stops the event loop just as well; a piece holds it a fraction of a millisecond."""
    start = size = 0
    for index, line in enumerate(lines):
        size += len(line) + 1
        if size >= piece_bytes or index == len(lines) - 1:
            last = index == len(lines) - 1
            yield b"\n".join(lines[start:index + 1]) + (b"" if last else b"\n")
            start, size = index + 1, 0


def _replace_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    _write_new_file(tmp, data, fsync=True)
    os.replace(tmp, path)


def _file_name(timestamp: str, session_id: str) -> str:
    return f"{timestamp.replace(':', '-').replace('.', '-')}_{session_id}.jsonl"


def _with_base(data: dict[str, Any], entry_id: str, parent_id: str | None,
               timestamp: str) -> dict[str, Any]:
    """``data`` with id/parentId/timestamp replaced, keeping the original's key order."""
    result: dict[str, Any] = {"type": data.get("type"), "id": entry_id, "parentId": parent_id,
                              "timestamp": timestamp}
    for key, value in data.items():
        if key not in result:
            result[key] = value
    return result


# --- the session file ------------------------------------------------------------------------


class SessionFile(msgspec.Struct, eq=False):
    """One session file: its header, its entries (all branches) and the leaf.

    Make one with :meth:`create`, :meth:`create_at` or :meth:`open`. The constructor takes the
    state as loaded (the loaders below build it, then hand it over whole); it writes nothing.
    """

    _path: Path
    _header: SessionHeader
    _entries: list[Entry] = msgspec.field(default_factory=list)
    _by_id: dict[str, Entry] = msgspec.field(default_factory=dict)
    _raw: dict[str, dict[str, Any] | bytes] = msgspec.field(default_factory=dict)
    """The JSON object (or still-undecoded line) each loaded entry was read from, by id."""
    _leaf_id: str | None = None
    _slot_title: str | None = None
    _has_slot: bool = False
    """The file starts with omp's 256-byte title slot (rewritten in place by ``set_name``)."""
    _needs_newline: bool = False
    """The file ends in a torn line: the next append starts a line of its own."""
    problems: list[LoadProblem] = msgspec.field(default_factory=list)
    """Lines skipped on load (never the torn last line, which is set aside silently)."""
    fsync: bool = False
    """``fsync`` after every write: each append, or each batch of the writer thread (the bytes
    themselves are never buffered in this process beyond the writer's queue)."""
    _writer: LineWriter | None = None
    """The writer thread appends go to (``write_behind``); None: they are written in place."""
    max_line_bytes: int = MAX_REASSEMBLED_FRAME_BYTES
    """The longest line an append writes (``stream.maxSessionLineBytes`` of the session that
    adopts the file: ``set_max_line_bytes``): the longest strings of a longer entry go to files
    of their own (``omp.session.oversize``)."""

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str | os.PathLike[str], *, cwd: str,
               parent_session: str | None = None, session_id: str | None = None,
               fsync: bool = False) -> SessionFile:
        """A new session in ``directory`` named ``<ISO time, : and . as ->_<sessionId>.jsonl``.

        ``directory`` must exist (``FileNotFoundError`` saying "No such directory" otherwise).
        """
        now = datetime.now(UTC)
        timestamp = iso_timestamp(now)
        sid = session_id or uuid7(int(now.timestamp() * 1000))
        path = Path(directory) / _file_name(timestamp, sid)
        return cls._create(path, cwd=cwd, parent_session=parent_session, session_id=sid,
                           timestamp=timestamp, fsync=fsync)

    @classmethod
    def create_at(cls, path: str | os.PathLike[str], *, cwd: str,
                  parent_session: str | None = None, session_id: str | None = None,
                  fsync: bool = False) -> SessionFile:
        """A new session at exactly ``path`` (``--session <path>`` / ``switch_session``); its
        directory must exist (``FileNotFoundError`` saying "No such directory" otherwise)."""
        now = datetime.now(UTC)
        sid = session_id or uuid7(int(now.timestamp() * 1000))
        return cls._create(Path(path), cwd=cwd, parent_session=parent_session, session_id=sid,
                           timestamp=iso_timestamp(now), fsync=fsync)

    @classmethod
    def _create(cls, path: Path, *, cwd: str, parent_session: str | None, session_id: str,
                timestamp: str, fsync: bool) -> SessionFile:
        header = SessionHeader(
            version=CURRENT_VERSION, id=session_id, timestamp=timestamp, cwd=cwd,
            parentSession=UNSET if parent_session is None else parent_session,
        )
        path = Path(os.path.abspath(path))
        _write_new_file(path, encode_line(header), fsync=fsync)
        return cls(path, header, fsync=fsync)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, fsync: bool = False) -> SessionFile:
        """Load a session file (any version; v1/v2 files are migrated and rewritten).

        The whole load (read, decode, migration) happens in this one blocking call. Lines
        still queued in another ``SessionFile``'s writer thread are not waited for: whoever
        owns that one flushes it first (``SessionStore`` does before it loads another file).
        Raises ``FileNotFoundError`` when it does not exist, :class:`~omp.files.UnusableFile`
        when it is not a regular file or is over ``MAX_SESSION_FILE_BYTES``, and
        :class:`SessionFormatError` when its first record is not a session header.
        """
        path = Path(os.path.abspath(path))
        data = read_regular(path, MAX_SESSION_FILE_BYTES)
        return _loaded(path, _split_lines(data), fsync=fsync)

    # -- properties ----------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self._path

    @property
    def header(self) -> SessionHeader:
        return self._header

    @property
    def session_id(self) -> str:
        return self._header.id

    @property
    def cwd(self) -> str:
        return self._header.cwd

    @property
    def entries(self) -> list[Entry]:
        """Every entry of every branch, in file (append) order. A copy."""
        return list(self._entries)

    @property
    def leaf_id(self) -> str | None:
        return self._leaf_id

    @property
    def name(self) -> str | None:
        """The latest ``title_change``/``session_info`` name, else the header's or slot's title."""
        found = self._name_and_source()
        return None if found is None else found[0]

    @property
    def name_source(self) -> str | None:
        """Who set :attr:`name` (``"user"``, ``"auto"``), when the record naming it says."""
        found = self._name_and_source()
        return None if found is None else found[1]

    def _name_and_source(self) -> tuple[str, str | None] | None:
        for entry in reversed(self._entries):
            if isinstance(entry, TitleChangeEntry) and entry.title:
                return entry.title, entry.source if isinstance(entry.source, str) else None
            if isinstance(entry, SessionInfoEntry) and isinstance(entry.name, str) and entry.name:
                return entry.name.strip(), "user"
        header = self._header
        if isinstance(header.title, str) and header.title:
            source = header.titleSource if isinstance(header.titleSource, str) else None
            return header.title, source
        if self._slot_title:
            return self._slot_title, None
        return None

    # -- lookups -------------------------------------------------------------------------------

    def get(self, entry_id: str) -> Entry | None:
        return self._by_id.get(entry_id)

    def entry_json(self, entry: Entry) -> dict[str, Any]:
        """The entry as a JSON object: verbatim as loaded (unknown keys kept), else encoded."""
        return self._entry_json(entry, keep=True)

    def _entry_json(self, entry: Entry, *, keep: bool) -> dict[str, Any]:
        """``entry_json``; with ``keep`` a loaded line decoded here replaces its bytes (without,
        nothing changes: what ``branch_file`` uses from a worker thread)."""
        if isinstance(entry, RawEntry):
            return entry.data
        raw = self._raw.get(entry.id)
        if raw is not None and self._by_id.get(entry.id) is entry:
            if isinstance(raw, bytes):
                # Loaded lines stay bytes until someone asks for them as JSON.
                decoded: dict[str, Any] = msgspec.json.decode(raw)
                if keep:
                    self._raw[entry.id] = decoded
                return decoded
            return raw
        result: dict[str, Any] = msgspec.to_builtins(entry)
        return result

    def _loaded_line(self, entry: Entry) -> bytes | None:
        """The line ``entry`` was loaded from, while it is still undecoded bytes."""
        raw = None if isinstance(entry, RawEntry) else self._raw.get(entry.id)
        return raw if isinstance(raw, bytes) and self._by_id.get(entry.id) is entry else None

    def message_flag(self, entry: MessageEntry, key: str) -> bool:
        """Whether the entry's message, as loaded, has a truthy ``key`` this port does not model
        (omp's ``retryRecovery``). Cheap for a loaded line that never mentions ``key``: it is not
        decoded again."""
        raw = self._raw.get(entry.id)
        if isinstance(raw, bytes) and f'"{key}"'.encode() not in raw:
            return False
        message = self.entry_json(entry).get("message")
        return isinstance(message, dict) and bool(message.get(key))

    def branch_path(self, leaf_id: str | None = None) -> list[Entry]:
        """Root → ``leaf_id`` (default: the current leaf), following ``parentId``; cycle-safe."""
        start = self._leaf_id if leaf_id is None else leaf_id
        path: list[Entry] = []
        seen: set[str] = set()
        current = self._by_id.get(start) if start is not None else None
        while current is not None and current.id not in seen:
            seen.add(current.id)
            path.append(current)
            parent = current.parentId
            current = self._by_id.get(parent) if parent is not None else None
        path.reverse()
        return path

    def move_leaf(self, entry_id: str | None) -> None:
        """Point the leaf at an existing entry (or ``None``: the next append is a new root).

        Nothing is written; the next append becomes a child of that entry (a new branch).
        """
        if entry_id is not None and entry_id not in self._by_id:
            raise KeyError(entry_id)
        self._leaf_id = entry_id

    def labels(self) -> dict[str, str]:
        """Current label per target id (later label entries win; empty clears)."""
        result: dict[str, str] = {}
        for entry in self._entries:
            if isinstance(entry, LabelEntry):
                if isinstance(entry.label, str) and entry.label:
                    result[entry.targetId] = entry.label
                else:
                    result.pop(entry.targetId, None)
        return result

    # -- appending -----------------------------------------------------------------------------

    def append(self, entry: _E) -> _E:
        """Write ``entry`` as a child of the leaf and move the leaf to it; returns what was written.

        ``parentId`` is always the current leaf; ``id`` is kept when it is set and unused, else a
        fresh 8-hex id; an empty ``timestamp`` becomes now.
        """
        entry_id = (entry.id if entry.id and entry.id not in self._by_id
                    else new_entry_id(self._by_id))
        timestamp = entry.timestamp or now_iso()
        stored: Entry
        if isinstance(entry, RawEntry):
            stored = RawEntry(_with_base(entry.data, entry_id, self._leaf_id, timestamp))
        else:
            stored = msgspec.structs.replace(entry, id=entry_id, parentId=self._leaf_id,
                                             timestamp=timestamp)
        line = encode_line(stored)
        if len(line) > self.max_line_bytes:
            stored, line = self._kept_aside(stored, line)
        self._write(line)
        self._entries.append(stored)
        self._by_id[entry_id] = stored
        self._leaf_id = entry_id
        return stored  # type: ignore[return-value]  # same class as ``entry``

    def _kept_aside(self, entry: Entry, line: bytes) -> tuple[Entry, bytes]:
        """``entry`` with its longest strings in files of the session's artifacts directory
        (``<file without .jsonl>/<entry id>.<n>.txt``, 0600 in 0700), written before the line
        that names them, and that line (``omp.session.oversize``). In place, even behind a
        writer thread: a line this long is a rare event. Raises OSError when a file cannot be
        written (the session's persistence failure)."""
        from .oversize import fit

        data = msgspec.json.decode(line)
        directory = self._path.with_suffix("")

        def path_of(n: int) -> Path:
            return directory / f"{entry.id}.{n}.txt"

        kept = fit(data, len(line), self.max_line_bytes, lambda n: str(path_of(n)))
        if not kept:
            return entry, line
        make_private_dirs(directory)
        for n, text in enumerate(kept):
            _write_new_file(path_of(n), text.encode("utf-8", "surrogatepass"), fsync=self.fsync)
        stored = decode_entry(data)
        return stored, encode_line(stored)

    def _write(self, line: bytes) -> None:
        if self._needs_newline:
            # The file ended in a torn line: start ours on a line of its own.
            line = b"\n" + line
        if self._writer is not None:
            self._writer.append(line)
        else:
            fd = open_for_write(self._path, os.O_WRONLY | os.O_APPEND)
            try:
                write_all(fd, line)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        self._needs_newline = False

    def set_max_line_bytes(self, limit: int) -> None:
        """From the next append on, a line longer than ``limit`` bytes keeps its longest
        strings in files of their own (``omp.session.oversize``); what is written stays."""
        self.max_line_bytes = limit

    def write_behind(self, on_failure: Callable[[OSError], None] | None = None) -> None:
        """From now on an append hands its line to a writer thread and returns without waiting
        for the disk (``omp.session.writer``): order is kept, and a failed write stops the
        writer. ``on_failure`` is then called once, from the writer thread; without it the
        failure is raised (``OSError``) by the next append or :meth:`flush`. Idempotent."""
        if self._writer is None:
            self._writer = LineWriter(self._path, fsync=self.fsync, on_failure=on_failure)

    def flush(self) -> None:
        """Block until every line handed to the writer thread is written (nothing to do without
        ``write_behind``). Raises the ``OSError`` that stopped the writer when there was no
        ``on_failure`` to take it and no append raised it yet."""
        if self._writer is not None:
            self._writer.flush()

    @property
    def pending(self) -> bool:
        """Lines handed to the writer thread are not all written yet (or a failure is still
        to be raised by ``flush``)."""
        return self._writer is not None and self._writer.pending

    def append_message(self, message: AgentMessage) -> MessageEntry | CustomMessageEntry:
        """A ``message`` entry; a ``custom`` message becomes a ``custom_message`` entry.

        Compaction and branch summaries have their own entry types and are refused.
        """
        if isinstance(message, CompactionSummaryMessage | BranchSummaryMessage):
            raise ValueError(f"{message.__class__.__name__} is not stored as a message entry")
        if isinstance(message, CustomMessage):
            return self.append(CustomMessageEntry(
                id="", parentId=None, timestamp="", customType=message.customType,
                content=message.content, display=message.display, details=message.details,
                attribution=message.attribution,
            ))
        return self.append(MessageEntry(id="", parentId=None, timestamp="", message=message))

    def append_model_change(self, provider: str, model_id: str, *, role: str | None = None,
                            fallback: bool = False) -> ModelChangeEntry:
        return self.append(ModelChangeEntry(
            id="", parentId=None, timestamp="", model=f"{provider}/{model_id}",
            role=UNSET if role is None else role, resolvedModelIsFallback=fallback,
        ))

    def append_thinking_level(self, level: str | None, *,
                              configured: str | None = None) -> ThinkingLevelChangeEntry:
        return self.append(ThinkingLevelChangeEntry(
            id="", parentId=None, timestamp="", thinkingLevel=level, configured=configured,
        ))

    def append_service_tier(self, tier: Any) -> ServiceTierChangeEntry:
        return self.append(ServiceTierChangeEntry(id="", parentId=None, timestamp="",
                                                  serviceTier=tier))

    def append_compaction(self, summary: str, first_kept_entry_id: str, tokens_before: int,
                          details: Any = UNSET, *, short_summary: str | None = None,
                          tokens_after: int | None = None, method: str | None = None,
                          preserve_data: Any = UNSET) -> CompactionEntry:
        return self.append(CompactionEntry(
            id="", parentId=None, timestamp="", summary=summary,
            firstKeptEntryId=first_kept_entry_id, tokensBefore=tokens_before, details=details,
            method=UNSET if method is None else method,
            tokensAfter=UNSET if tokens_after is None else tokens_after,
            shortSummary=UNSET if short_summary is None else short_summary,
            preserveData=preserve_data,
        ))

    def append_branch_summary(self, from_id: str | None, summary: str,
                              details: Any = UNSET) -> BranchSummaryEntry:
        """Move the leaf to ``from_id`` and record a summary of the branch left behind."""
        self.move_leaf(from_id)
        return self.append(BranchSummaryEntry(
            id="", parentId=None, timestamp="", fromId=from_id or "root", summary=summary,
            details=details,
        ))

    def append_label(self, target_id: str, label: str | None) -> LabelEntry:
        if target_id not in self._by_id:
            raise KeyError(target_id)
        return self.append(LabelEntry(id="", parentId=None, timestamp="", targetId=target_id,
                                      label=label if label else UNSET))

    def append_custom(self, custom_type: str, data: Any = UNSET) -> CustomEntry:
        return self.append(CustomEntry(id="", parentId=None, timestamp="",
                                       customType=custom_type, data=data))

    def set_name(self, name: str) -> TitleChangeEntry:
        """Name the session (``set_session_name``): a user-sourced ``title_change`` entry."""
        title = name.strip()
        if not title:
            raise ValueError("Session name cannot be empty")
        previous = self.name
        entry = self.append(TitleChangeEntry(
            id="", parentId=None, timestamp="", title=title, source="user",
            previousTitle=previous if previous and previous != title else UNSET,
        ))
        if self._has_slot:
            self._rewrite_slot(title)
        return entry

    def _rewrite_slot(self, title: str) -> None:
        """Keep an omp title slot in step with the name (it is what omp's listings read)."""
        record = {"type": "title", "v": 1, "title": title, "source": "user",
                  "updatedAt": now_iso(), "pad": ""}
        size = len(msgspec.json.encode(record))
        if size > TITLE_SLOT_BYTES - 1:
            return  # does not fit: the title_change entry alone records the name
        record["pad"] = " " * (TITLE_SLOT_BYTES - 1 - size)
        data = msgspec.json.encode(record) + b"\n"
        if self._writer is not None:
            self._writer.overwrite(0, data)  # in order with the appends, off the caller's thread
        else:
            fd = open_for_write(self._path, os.O_WRONLY)
            try:
                os.pwrite(fd, data, 0)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        self._slot_title = title


# --- loading ---------------------------------------------------------------------------------
# The loaders build the whole state in locals and hand it to the constructor once.


def _leaf_of(entries: list[Entry]) -> str | None:
    return entries[-1].id if entries else None


def _loaded(path: Path, lines: list[bytes], *, fsync: bool) -> SessionFile:
    """The file ``path`` whose content split at ``\n`` is ``lines`` (so ``lines[-1]`` is empty
    when the file ends with a newline, and ``[b""]`` is an empty file)."""
    fast = _load_current(path, lines, fsync=fsync)
    return fast if fast is not None else _load_generic(path, lines, fsync=fsync)


def _torn_tail(lines: list[bytes]) -> bool:
    """Whether the file ``lines`` came from does not end with a newline (an empty one does)."""
    return lines[-1] != b""


def _split_lines(data: bytes) -> list[bytes]:
    """``data.split(b"\n")``, a line at a time. One ``split`` of a large file holds the GIL for
    as long as it takes (10 ms for 13 MB), and in a worker thread that stops the event loop
    just as well; between two lines the loop gets its turn."""
    lines: list[bytes] = []
    find = data.find
    start = 0
    while (end := find(b"\n", start)) >= 0:
        lines.append(data[start:end])
        start = end + 1
    lines.append(data[start:])
    return lines


def _load_current(path: Path, lines: list[bytes], *,
                  fsync: bool) -> SessionFile | None:
    """The common case, fast: a current-version file whose lines decode straight into typed
    entries (one pass per line, no intermediate dicts; the lines are kept as bytes for
    ``entry_json``). None when anything needs the careful path: an old version, a title slot,
    an unknown or malformed line, a duplicate id."""
    if not lines or not lines[0].startswith(b'{"type":"session"'):
        return None
    try:
        header = msgspec.json.decode(lines[0], type=SessionHeader)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if header.version != CURRENT_VERSION:
        return None
    entries: list[Entry] = []
    by_id: dict[str, Entry] = {}
    raw: dict[str, dict[str, Any] | bytes] = {}
    decode = entry_line_decoder().decode
    for line in lines[1:]:
        if not line:
            continue
        try:
            entry: KnownEntry = decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        entry_id = entry.id
        if not entry_id or entry_id in by_id:
            return None
        entries.append(entry)
        by_id[entry_id] = entry
        raw[entry_id] = line
    return SessionFile(path, header, entries, by_id, raw, _leaf_of(entries),
                       _needs_newline=_torn_tail(lines), fsync=fsync)


def _set_torn_line_aside(path: Path, lines: list[bytes], index: int) -> bool:
    """Move line ``index`` (the last one with content, which did not decode: a torn write) from
    the file ``lines`` came from to ``<file>.torn``: appended there, then cut off here. False
    when the file is not as it was read, or cannot be written (it is then left as it is)."""
    start = sum(len(line) + 1 for line in lines[:index])
    size = sum(len(line) + 1 for line in lines) - 1
    try:
        fd = open_for_write(path, os.O_WRONLY)
        try:
            if os.fstat(fd).st_size != size:
                return False  # written meanwhile (by another process): not ours to cut
            aside = os.open(f"{path}.torn", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                            | os.O_NOFOLLOW, 0o600)
            try:
                write_all(aside, b"\n".join(lines[index:]).rstrip(b"\n") + b"\n")
                os.fsync(aside)
            finally:
                os.close(aside)
            os.ftruncate(fd, start)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def _load_generic(path: Path, lines: list[bytes], *, fsync: bool) -> SessionFile:
    torn_tail = _torn_tail(lines)
    # Index of the last non-blank line: bad JSON there is a torn write, set aside silently.
    last_index = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    problems: list[LoadProblem] = []
    records: list[tuple[int, dict[str, Any]]] = []
    torn_index: int | None = None
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            value = msgspec.json.decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            if index != last_index:
                problems.append(LoadProblem(index + 1, f"invalid JSON: {exc}"))
            else:
                torn_index = index
            continue
        if not isinstance(value, dict):
            if index != last_index:
                problems.append(LoadProblem(index + 1, "not a JSON object"))
            else:
                torn_index = index
            continue
        records.append((index + 1, value))

    invalid = SessionFormatError(
        f'Cannot resume session "{path}": the session header is missing or malformed. '
        "The file was not modified."
    )
    slot_line: bytes | None = None
    slot_title: str | None = None
    slot_is_first = False  # the title slot is the file's first line
    if records and records[0][1].get("type") == "title":
        slot_is_first = records[0][0] == 1
        slot_line = lines[records[0][0] - 1]
        title = records[0][1].get("title")
        slot_title = title if isinstance(title, str) and title else None
        records = records[1:]
    if not records:
        raise invalid
    header_raw = records[0][1]
    if header_raw.get("type") != "session" or not isinstance(header_raw.get("id"), str):
        raise invalid
    try:
        header = msgspec.convert(header_raw, SessionHeader)
    except msgspec.ValidationError:
        raise invalid from None
    body = records[1:]

    version = header_raw.get("version")
    migrated = False
    if not isinstance(version, int) or version < CURRENT_VERSION:
        migrated = _migrate(header_raw, body, version if isinstance(version, int) else 1)
        header = msgspec.convert(header_raw, SessionHeader)

    has_slot = (slot_line is not None and slot_is_first
                and len(slot_line) + 1 == TITLE_SLOT_BYTES)
    entries: list[Entry] = []
    by_id: dict[str, Entry] = {}
    raw_by_id: dict[str, dict[str, Any] | bytes] = {}
    for line_no, raw in body:
        kind = raw.get("type")
        if kind in ("session", "title"):
            problems.append(LoadProblem(line_no, f"unexpected {kind} record after the header"))
            continue
        entry_id = raw.get("id")
        if not isinstance(entry_id, str) or not entry_id:
            problems.append(LoadProblem(line_no, "entry has no id"))
            continue
        if entry_id in by_id:
            problems.append(LoadProblem(line_no, f"duplicate entry id {entry_id}"))
            continue
        entry = decode_entry(raw)
        entries.append(entry)
        by_id[entry_id] = entry
        raw_by_id[entry_id] = raw

    if torn_index is not None and records and not migrated and _set_torn_line_aside(
            path, lines, torn_index):
        torn_tail = False  # the file now ends after the last good line
    if migrated:
        # Each kept entry's JSON is its (migrated) record, which ``entry_json`` would return.
        out = [] if slot_line is None else [slot_line + b"\n"]
        out.append(msgspec.json.encode(header_raw) + b"\n")
        out.extend(msgspec.json.encode(raw_by_id[e.id]) + b"\n" for e in entries)
        _replace_file(path, b"".join(out))
    return SessionFile(path, header, entries, by_id, raw_by_id, _leaf_of(entries), slot_title,
                       has_slot, torn_tail and not migrated, problems, fsync)


def _migrate(header: dict[str, Any], body: list[tuple[int, dict[str, Any]]], version: int) -> bool:
    """v1 → v2 (ids and a parent chain), v2 → v3 (``hookMessage`` → ``custom``), in place."""
    if version < 2:
        ids: set[str] = set()
        previous: str | None = None
        # v1 compactions point at an index into all records, the header being index 0.
        all_records = [header] + [raw for _, raw in body]
        for _, raw in body:
            raw["id"] = new_entry_id(ids)
            ids.add(raw["id"])
            raw["parentId"] = previous
            previous = raw["id"]
        for _, raw in body:
            if raw.get("type") != "compaction":
                continue
            index = raw.pop("firstKeptEntryIndex", None)
            if isinstance(index, int) and 0 < index < len(all_records):
                raw["firstKeptEntryId"] = all_records[index]["id"]
    for _, raw in body:
        message = raw.get("message")
        if (raw.get("type") == "message" and isinstance(message, dict)
                and message.get("role") == "hookMessage"):
            message["role"] = "custom"
    # ``version`` second, where the original writes it (v1 headers have none).
    rest = {k: v for k, v in header.items() if k not in ("type", "version")}
    header.clear()
    header.update({"type": "session", "version": CURRENT_VERSION, **rest})
    return True


# --- branching (docs/design/sessions.md#branch) ----------------------------------------------


def branch_file(file: SessionFile, entry_id: str) -> tuple[SessionFile, str]:
    """Fork before the user message ``entry_id`` into a new file next to ``file``.

    The new file holds the branch path up to (not including) that message, entries copied
    verbatim (label entries left out, then re-created for the kept entries at the end), its
    header names ``file`` as ``parentSession`` and keeps the session name. ``file`` is untouched:
    it is only read, and only the entries it has when this starts, so this may run in a worker
    thread while the owner goes on appending to ``file`` (appends only add entries). Returns the
    new file (built from what was written, not read back) and the selected message's text.
    Blocking.
    """
    entry = file.get(entry_id)
    if not isinstance(entry, MessageEntry) or not isinstance(entry.message, UserMessage):
        raise ValueError("Invalid entry ID for branching")
    return _write_branch(file, entry.parentId), message_text(entry.message)


def fork_file(file: SessionFile) -> SessionFile:
    """The whole current branch of ``file`` (up to its leaf) into a new file next to it, as
    ``branch_file`` writes one (ACP ``session/fork``). Blocking."""
    return _write_branch(file, file.leaf_id)


def _write_branch(file: SessionFile, last: str | None) -> SessionFile:
    """A new file next to ``file`` with its branch path up to entry ``last`` (None: no entry)
    (``branch_file``). Blocking."""
    path = file.branch_path(last) if last is not None else []
    kept = [e for e in path if not isinstance(e, LabelEntry)]
    lines: list[bytes] = []  # the new file's entry lines, without their b"\n"
    previous: str | None = None
    for item in kept:
        line = file._loaded_line(item)
        if line is not None and item.parentId == previous:
            lines.append(line)  # as loaded: nothing to decode or encode again
        else:
            raw = dict(file._entry_json(item, keep=False))
            if raw.get("parentId") != previous:  # a left-out label was its parent
                raw["parentId"] = previous
            lines.append(msgspec.json.encode(raw))
        previous = item.id
    kept_ids = {e.id for e in kept}
    taken = set(kept_ids)
    for target, label in file.labels().items():
        if target not in kept_ids:
            continue
        label_entry = LabelEntry(id=new_entry_id(taken), parentId=previous, timestamp=now_iso(),
                                 targetId=target, label=label)
        taken.add(label_entry.id)
        lines.append(msgspec.json.encode(label_entry))
        previous = label_entry.id

    now = datetime.now(UTC)
    timestamp = iso_timestamp(now)
    session_id = uuid7(int(now.timestamp() * 1000))
    name, source = file.name, file.name_source
    header = SessionHeader(
        version=CURRENT_VERSION, id=session_id, timestamp=timestamp, cwd=file.cwd,
        title=UNSET if name is None else name,
        titleSource=UNSET if name is None or source is None else source,
        parentSession=str(file.path),
    )
    new_path = file.path.parent / _file_name(timestamp, session_id)
    lines.insert(0, msgspec.json.encode(header))
    lines.append(b"")  # the file ends with a newline
    _write_new_file(new_path, lines, fsync=file.fsync)
    return _loaded(new_path, lines, fsync=file.fsync)
