"""Session files on disk: JSONL, append-only, header first (agent-core §7, rpc-behavior §11).

The format is the one pi and omp write, so a file written here opens in the original and a file
the original wrote opens here:

* line 1 is the header ``{"type":"session","version":3,"id",...,"cwd"}``; omp's 256-byte title
  slot (a first line of type ``title``) is accepted on load but never written (pi would reject a
  file that does not start with its header; omp accepts both layouts);
* then one entry per line ``{"type","id","parentId","timestamp",...}``; entries form a tree by
  ``parentId``, the leaf is the last entry in file order and every append becomes a child of the
  leaf and moves it;
* an append is one ``os.write`` of the whole line to an ``O_APPEND`` descriptor (``fsync`` on
  request), so the only possible damage is a torn last line, which loading skips silently; any
  other unreadable line is reported in ``problems`` with its line number and skipped;
* files are created ``0600`` with ``O_EXCL`` in ``0700`` directories.

Entries are msgspec Structs tagged by ``type``. An entry of a type this port does not model, or
whose fields it cannot decode (an omp-only message role, say), loads as a :class:`RawEntry`: kept,
copied verbatim into branch files, and skipped when building the context. Loaded entries also keep
their original JSON object, so keys this port does not model (``contextSnapshot``, ...) survive
``entry_json`` and branching.

Nothing here is async: entries are small and callers run the blocking I/O in a thread or accept it.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import stat
import tempfile
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import msgspec
from msgspec import UNSET, UnsetType

from omp.protocol.messages import (
    AgentMessage,
    AssistantMessage,
    BranchSummaryMessage,
    CompactionSummaryMessage,
    CustomMessage,
    RedactedThinkingContent,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    UserContent,
    UserMessage,
)
from omp.protocol.payloads import MessagesPage

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_PAGE_LIMIT",
    "MAX_PAGE_BYTES",
    "MAX_PAGE_LIMIT",
    "BranchSettings",
    "BranchSummaryEntry",
    "CompactionEntry",
    "CustomEntry",
    "CustomMessageEntry",
    "Entry",
    "KnownEntry",
    "LabelEntry",
    "LoadProblem",
    "MessageCursor",
    "MessageEntry",
    "ModelChangeEntry",
    "PageError",
    "RawEntry",
    "ServiceTierChangeEntry",
    "SessionFile",
    "SessionFormatError",
    "SessionHeader",
    "SessionInfoEntry",
    "ThinkingLevelChangeEntry",
    "TitleChangeEntry",
    "branch_file",
    "branch_settings",
    "build_context",
    "decode_cursor",
    "encode_cursor",
    "encode_cwd",
    "encode_tree",
    "entries_since",
    "entry_type",
    "message_text",
    "newest_session",
    "page",
    "sessions_dir",
    "tree",
    "user_messages",
]

CURRENT_VERSION: Final = 3
TITLE_SLOT_BYTES: Final = 256
FILE_MODE: Final = 0o600
DIR_MODE: Final = 0o700


# --- header and entries (agent-core §7.2-§7.3) -----------------------------------------------


class SessionHeader(msgspec.Struct, tag_field="type", tag="session", frozen=True, kw_only=True,
                    omit_defaults=True):
    """The first line of a session file. Field order is the original's."""

    version: int | UnsetType = UNSET
    id: str
    timestamp: str = ""
    cwd: str = ""
    title: str | UnsetType = UNSET
    titleSource: str | UnsetType = UNSET
    parentSession: str | UnsetType = UNSET


class _Entry(msgspec.Struct, tag_field="type", frozen=True, kw_only=True, omit_defaults=True):
    # No defaults: every entry writes all three, ``parentId: null`` for a root.
    # ``SessionFile.append`` fills them in (pass ``""``/``None``/``""``).
    id: str
    parentId: str | None
    timestamp: str
    """ISO-8601 UTC with milliseconds and ``Z``."""


class MessageEntry(_Entry, tag="message", frozen=True, kw_only=True, omit_defaults=True):
    message: AgentMessage


class CustomMessageEntry(_Entry, tag="custom_message", frozen=True, kw_only=True,
                         omit_defaults=True):
    """An extension/harness message that takes part in the context (as a ``custom`` message)."""

    customType: str
    content: str | list[UserContent]
    display: bool
    details: Any = UNSET
    attribution: str | UnsetType = UNSET


class CompactionEntry(_Entry, tag="compaction", frozen=True, kw_only=True, omit_defaults=True):
    summary: str
    firstKeptEntryId: str
    tokensBefore: int
    details: Any = UNSET
    method: str | UnsetType = UNSET
    tokensAfter: int | UnsetType = UNSET
    shortSummary: str | UnsetType = UNSET
    preserveData: Any = UNSET
    warning: str | UnsetType = UNSET
    providerReplayThroughEntryId: str | UnsetType = UNSET
    fromHook: bool | UnsetType = UNSET
    fromExtension: bool | UnsetType = UNSET


class BranchSummaryEntry(_Entry, tag="branch_summary", frozen=True, kw_only=True,
                         omit_defaults=True):
    fromId: str
    """The abandoned leaf, or ``"root"``."""
    summary: str
    details: Any = UNSET
    fromHook: bool | UnsetType = UNSET
    fromExtension: bool | UnsetType = UNSET


class ModelChangeEntry(_Entry, tag="model_change", frozen=True, kw_only=True, omit_defaults=True):
    """omp writes ``model: "provider/modelId"``; pi files carry ``provider`` and ``modelId``."""

    model: str | UnsetType = UNSET
    role: str | UnsetType = UNSET
    resolvedModelIsFallback: bool | UnsetType = UNSET
    provider: str | UnsetType = UNSET
    modelId: str | UnsetType = UNSET

    @property
    def model_ref(self) -> str | None:
        """``provider/modelId`` whichever shape the entry has."""
        if isinstance(self.model, str) and self.model:
            return self.model
        if isinstance(self.provider, str) and isinstance(self.modelId, str):
            return f"{self.provider}/{self.modelId}"
        return None


class ThinkingLevelChangeEntry(_Entry, tag="thinking_level_change", frozen=True, kw_only=True,
                               omit_defaults=True):
    # The original writes ``null`` for both in some flows (rpc-behavior §11.13).
    thinkingLevel: str | None
    configured: str | UnsetType | None = UNSET


class LabelEntry(_Entry, tag="label", frozen=True, kw_only=True, omit_defaults=True):
    targetId: str
    label: str | UnsetType | None = UNSET
    """Absent or empty clears the label."""


class CustomEntry(_Entry, tag="custom", frozen=True, kw_only=True, omit_defaults=True):
    """Extension state; not part of the context."""

    customType: str
    data: Any = UNSET


class SessionInfoEntry(_Entry, tag="session_info", frozen=True, kw_only=True, omit_defaults=True):
    """pi's session name record."""

    name: str | UnsetType = UNSET


class TitleChangeEntry(_Entry, tag="title_change", frozen=True, kw_only=True, omit_defaults=True):
    """omp's session name record (``set_session_name`` writes ``source: "user"``)."""

    title: str
    source: str | UnsetType = UNSET
    previousTitle: str | UnsetType = UNSET
    trigger: str | UnsetType = UNSET


class ServiceTierChangeEntry(_Entry, tag="service_tier_change", frozen=True, kw_only=True,
                             omit_defaults=True):
    serviceTier: Any
    """Written even when ``null`` (observed)."""


KnownEntry = (
    MessageEntry
    | CustomMessageEntry
    | CompactionEntry
    | BranchSummaryEntry
    | ModelChangeEntry
    | ThinkingLevelChangeEntry
    | LabelEntry
    | CustomEntry
    | SessionInfoEntry
    | TitleChangeEntry
    | ServiceTierChangeEntry
)
_KNOWN_TYPES: Final = frozenset({
    "message", "custom_message", "compaction", "branch_summary", "model_change",
    "thinking_level_change", "label", "custom", "session_info", "title_change",
    "service_tier_change",
})


@attrs.frozen
class RawEntry:
    """An entry kept as its JSON object: an unknown type, or fields this port cannot decode."""

    data: dict[str, Any]

    @property
    def type(self) -> str:
        value = self.data.get("type")
        return value if isinstance(value, str) else ""

    @property
    def id(self) -> str:
        value = self.data.get("id")
        return value if isinstance(value, str) else ""

    @property
    def parentId(self) -> str | None:
        value = self.data.get("parentId")
        return value if isinstance(value, str) else None

    @property
    def timestamp(self) -> str:
        value = self.data.get("timestamp")
        return value if isinstance(value, str) else ""


Entry = KnownEntry | RawEntry
_E = TypeVar("_E", bound=Entry)


def entry_type(entry: Entry) -> str:
    """The entry's ``type`` (the Structs carry it as their tag, not as an attribute)."""
    if isinstance(entry, RawEntry):
        return entry.type
    tag = entry.__struct_config__.tag
    return tag if isinstance(tag, str) else ""


@attrs.frozen
class LoadProblem:
    """A line that could not be used; loading went on without it."""

    line: int
    """1-based line number in the file."""
    message: str


class SessionFormatError(ValueError):
    """The file has no valid session header (nothing was modified)."""


# --- small helpers ---------------------------------------------------------------------------


def _iso(dt: datetime) -> str:
    return f"{dt:%Y-%m-%dT%H:%M:%S}.{dt.microsecond // 1000:03d}Z"


def _now_iso() -> str:
    return _iso(datetime.now(UTC))


def _iso_to_ms(value: str) -> int:
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return 0
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def _uuid7(ms: int) -> str:
    """A UUID v7 (RFC 9562): 48-bit Unix milliseconds, version, 74 random bits."""
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> 68  # 12 bits
    rand_b = rand & ((1 << 62) - 1)
    value = ((ms & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))


def _new_id(taken: set[str] | dict[str, Any]) -> str:
    for _ in range(100):
        candidate = uuid.uuid4().hex[:8]
        if candidate not in taken:
            return candidate
    return str(uuid.uuid4())


def _encode_line(entry: Entry | SessionHeader) -> bytes:
    if isinstance(entry, RawEntry):
        return msgspec.json.encode(entry.data) + b"\n"
    return msgspec.json.encode(entry) + b"\n"


def _with_base(data: dict[str, Any], entry_id: str, parent_id: str | None,
               timestamp: str) -> dict[str, Any]:
    """``data`` with id/parentId/timestamp replaced, keeping the original's key order."""
    result: dict[str, Any] = {"type": data.get("type"), "id": entry_id, "parentId": parent_id,
                              "timestamp": timestamp}
    for key, value in data.items():
        if key not in result:
            result[key] = value
    return result


def _decode_entry(data: dict[str, Any]) -> Entry:
    if data.get("type") in _KNOWN_TYPES:
        try:
            entry: KnownEntry = msgspec.convert(data, KnownEntry)
            return entry
        except msgspec.ValidationError:
            pass
    return RawEntry(data)


def message_text(message: UserMessage | CustomMessage) -> str:
    """The text of a user-like message: the string, or its text blocks joined without separator."""
    if isinstance(message.content, str):
        return message.content
    return "".join(block.text for block in message.content if isinstance(block, TextContent))


def _make_dirs(directory: Path) -> None:
    """Create ``directory`` and any missing parents with mode 0700 (the umask cannot widen it)."""
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


def _write_new_file(path: Path, data: bytes, *, fsync: bool) -> None:
    """Create ``path`` (must not exist) 0600 and write ``data`` in full."""
    _make_dirs(path.parent)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        _write_all(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _file_name(timestamp: str, session_id: str) -> str:
    return f"{timestamp.replace(':', '-').replace('.', '-')}_{session_id}.jsonl"


# --- the session file ------------------------------------------------------------------------


@attrs.define(eq=False)
class SessionFile:
    """One session file: its header, its entries (all branches) and the leaf.

    Make one with :meth:`create`, :meth:`create_at` or :meth:`open`, not the constructor.
    """

    _path: Path
    _header: SessionHeader
    _entries: list[Entry] = attrs.field(factory=list)
    _by_id: dict[str, Entry] = attrs.field(factory=dict)
    _raw: dict[str, dict[str, Any] | bytes] = attrs.field(factory=dict)
    """The JSON object each loaded entry was read from, by id."""
    _leaf_id: str | None = None
    _slot_title: str | None = None
    _has_slot: bool = False
    """The file starts with omp's 256-byte title slot (rewritten in place by ``set_name``)."""
    _needs_newline: bool = False
    problems: list[LoadProblem] = attrs.field(factory=list)
    """Lines skipped on load (never the torn last line, which is skipped silently)."""
    fsync: bool = False
    """``fsync`` after every append (the write itself is never buffered)."""

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str | os.PathLike[str], *, cwd: str,
               parent_session: str | None = None, session_id: str | None = None,
               fsync: bool = False) -> SessionFile:
        """A new session in ``directory`` named ``<ISO time, : and . as ->_<sessionId>.jsonl``."""
        now = datetime.now(UTC)
        timestamp = _iso(now)
        sid = session_id or _uuid7(int(now.timestamp() * 1000))
        path = Path(directory) / _file_name(timestamp, sid)
        return cls._create(path, cwd=cwd, parent_session=parent_session, session_id=sid,
                           timestamp=timestamp, fsync=fsync)

    @classmethod
    def create_at(cls, path: str | os.PathLike[str], *, cwd: str,
                  parent_session: str | None = None, session_id: str | None = None,
                  fsync: bool = False) -> SessionFile:
        """A new session at exactly ``path`` (``--session <path>`` / ``switch_session``)."""
        now = datetime.now(UTC)
        sid = session_id or _uuid7(int(now.timestamp() * 1000))
        return cls._create(Path(path), cwd=cwd, parent_session=parent_session, session_id=sid,
                           timestamp=_iso(now), fsync=fsync)

    @classmethod
    def _create(cls, path: Path, *, cwd: str, parent_session: str | None, session_id: str,
                timestamp: str, fsync: bool) -> SessionFile:
        header = SessionHeader(
            version=CURRENT_VERSION, id=session_id, timestamp=timestamp, cwd=cwd,
            parentSession=UNSET if parent_session is None else parent_session,
        )
        path = Path(os.path.abspath(path))
        _write_new_file(path, _encode_line(header), fsync=fsync)
        return cls(path, header, fsync=fsync)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, fsync: bool = False) -> SessionFile:
        """Load a session file (any version; v1/v2 files are migrated and rewritten).

        Raises ``FileNotFoundError`` when it does not exist and :class:`SessionFormatError` when
        its first record is not a session header.
        """
        path = Path(os.path.abspath(path))
        data = path.read_bytes()
        return _load(path, data, fsync=fsync)

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
        if isinstance(entry, RawEntry):
            return entry.data
        raw = self._raw.get(entry.id)
        if raw is not None and self._by_id.get(entry.id) is entry:
            if isinstance(raw, bytes):
                # Loaded lines stay bytes until someone asks for them as JSON.
                decoded: dict[str, Any] = msgspec.json.decode(raw)
                self._raw[entry.id] = raw = decoded
            return raw
        result: dict[str, Any] = msgspec.to_builtins(entry)
        return result

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

    # -- appending -----------------------------------------------------------------------------

    def append(self, entry: _E) -> _E:
        """Write ``entry`` as a child of the leaf and move the leaf to it; returns what was written.

        ``parentId`` is always the current leaf; ``id`` is kept when it is set and unused, else a
        fresh 8-hex id; an empty ``timestamp`` becomes now.
        """
        entry_id = entry.id if entry.id and entry.id not in self._by_id else _new_id(self._by_id)
        timestamp = entry.timestamp or _now_iso()
        stored: Entry
        if isinstance(entry, RawEntry):
            stored = RawEntry(_with_base(entry.data, entry_id, self._leaf_id, timestamp))
        else:
            stored = msgspec.structs.replace(entry, id=entry_id, parentId=self._leaf_id,
                                             timestamp=timestamp)
        self._write(_encode_line(stored))
        self._entries.append(stored)
        self._by_id[entry_id] = stored
        self._leaf_id = entry_id
        return stored  # type: ignore[return-value]  # same class as ``entry``

    def _write(self, line: bytes) -> None:
        if self._needs_newline:
            # The file ended in a torn line: start ours on a line of its own.
            line = b"\n" + line
        flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(self._path, flags)
        try:
            _write_all(fd, line)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._needs_newline = False

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
                  "updatedAt": _now_iso(), "pad": ""}
        size = len(msgspec.json.encode(record))
        if size > TITLE_SLOT_BYTES - 1:
            return  # does not fit: the title_change entry alone records the name
        record["pad"] = " " * (TITLE_SLOT_BYTES - 1 - size)
        data = msgspec.json.encode(record) + b"\n"
        fd = os.open(self._path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.pwrite(fd, data, 0)
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        self._slot_title = title

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


# --- loading ---------------------------------------------------------------------------------


_entry_decoder: msgspec.json.Decoder[KnownEntry] | None = None


def _load(path: Path, data: bytes, *, fsync: bool) -> SessionFile:
    fast = _load_current(path, data, fsync=fsync)
    return fast if fast is not None else _load_generic(path, data, fsync=fsync)


def _load_current(path: Path, data: bytes, *, fsync: bool) -> SessionFile | None:
    """The common case, fast: a current-version file whose lines decode straight into typed
    entries (one pass per line, no intermediate dicts; the lines are kept as bytes for
    ``entry_json``). None when anything needs the careful path: an old version, a title slot,
    an unknown or malformed line, a duplicate id."""
    lines = data.split(b"\n")
    if not lines or not lines[0].startswith(b'{"type":"session"'):
        return None
    try:
        header = msgspec.json.decode(lines[0], type=SessionHeader)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if header.version != CURRENT_VERSION:
        return None
    file = SessionFile(path, header, slot_title=None, has_slot=False, problems=[],
                       fsync=fsync)
    global _entry_decoder
    if _entry_decoder is None:
        _entry_decoder = msgspec.json.Decoder(KnownEntry)
    decode = _entry_decoder.decode
    for line in lines[1:]:
        if not line:
            continue
        try:
            entry = decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        entry_id = entry.id
        if not entry_id or entry_id in file._by_id:
            return None
        file._entries.append(entry)
        file._by_id[entry_id] = entry
        file._raw[entry_id] = line
        file._leaf_id = entry_id
    file._needs_newline = data != b"" and not data.endswith(b"\n")
    return file


def _load_generic(path: Path, data: bytes, *, fsync: bool) -> SessionFile:
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n") and data != b""
    # Index of the last non-blank line: bad JSON there is a torn write, skipped silently.
    last_index = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    problems: list[LoadProblem] = []
    records: list[tuple[int, dict[str, Any]]] = []
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            value = msgspec.json.decode(line)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            if index != last_index:
                problems.append(LoadProblem(index + 1, f"invalid JSON: {exc}"))
            continue
        if not isinstance(value, dict):
            if index != last_index:
                problems.append(LoadProblem(index + 1, "not a JSON object"))
            continue
        records.append((index + 1, value))

    invalid = SessionFormatError(
        f'Cannot resume session "{path}": the session header is missing or malformed. '
        "The file was not modified."
    )
    slot_line: bytes | None = None
    slot_title: str | None = None
    if records and records[0][1].get("type") == "title":
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

    has_slot = (slot_line is not None and data.startswith(slot_line + b"\n")
                and len(slot_line) + 1 == TITLE_SLOT_BYTES)
    file = SessionFile(path, header, slot_title=slot_title, has_slot=has_slot,
                       problems=problems, fsync=fsync)
    for line_no, raw in body:
        kind = raw.get("type")
        if kind in ("session", "title"):
            problems.append(LoadProblem(line_no, f"unexpected {kind} record after the header"))
            continue
        entry_id = raw.get("id")
        if not isinstance(entry_id, str) or not entry_id:
            problems.append(LoadProblem(line_no, "entry has no id"))
            continue
        if entry_id in file._by_id:
            problems.append(LoadProblem(line_no, f"duplicate entry id {entry_id}"))
            continue
        entry = _decode_entry(raw)
        file._entries.append(entry)
        file._by_id[entry_id] = entry
        file._raw[entry_id] = raw
        file._leaf_id = entry_id
    file._needs_newline = torn_tail

    if migrated:
        out = [] if slot_line is None else [slot_line + b"\n"]
        out.append(msgspec.json.encode(header_raw) + b"\n")
        out.extend(msgspec.json.encode(file.entry_json(e)) + b"\n" for e in file._entries)
        _replace_file(path, b"".join(out))
        file._needs_newline = False
    return file


def _migrate(header: dict[str, Any], body: list[tuple[int, dict[str, Any]]], version: int) -> bool:
    """v1 → v2 (ids and a parent chain), v2 → v3 (``hookMessage`` → ``custom``), in place."""
    if version < 2:
        ids: set[str] = set()
        previous: str | None = None
        # v1 compactions point at an index into all records, the header being index 0.
        all_records = [header] + [raw for _, raw in body]
        for _, raw in body:
            raw["id"] = _new_id(ids)
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


def _replace_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    _write_new_file(tmp, data, fsync=True)
    os.replace(tmp, path)


# --- context (agent-core §7.6) ---------------------------------------------------------------


def _entry_message(file: SessionFile, entry: Entry) -> AgentMessage | None:
    if isinstance(entry, MessageEntry):
        message = entry.message
        if isinstance(message, AssistantMessage):
            stored = file._raw.get(entry.id)
            # Only lines that mention it can carry the flag: skip decoding all the others.
            if not isinstance(stored, bytes) or b'"retryRecovery"' in stored:
                raw = file.entry_json(entry).get("message")
                if isinstance(raw, dict) and raw.get("retryRecovery"):
                    return None
            if message.stopReason == "error" and not message.content:
                return None
        return message
    if isinstance(entry, CustomMessageEntry):
        return CustomMessage(
            customType=entry.customType, content=entry.content, display=entry.display,
            details=entry.details, timestamp=_iso_to_ms(entry.timestamp),
            attribution=entry.attribution if entry.attribution in ("user", "agent")
            else UNSET,  # type: ignore[arg-type]
        )
    if isinstance(entry, BranchSummaryEntry) and entry.summary:
        return BranchSummaryMessage(summary=entry.summary, fromId=entry.fromId,
                                    timestamp=_iso_to_ms(entry.timestamp))
    return None


def build_context(file: SessionFile) -> list[AgentMessage]:
    """The live context of the current branch (root → leaf), as ``buildSessionContext`` builds it.

    Message entries in order; ``custom_message`` → ``custom``; non-empty ``branch_summary`` →
    ``branchSummary``; with a compaction on the path only the latest counts: its
    ``compactionSummary`` first, then the path from its ``firstKeptEntryId`` up to it, then
    everything after it. A ``reset_boundary`` after the latest compaction keeps only what follows
    it. Then: tool calls with no result on the path are stripped (a turn left empty is dropped),
    and ``error``/``aborted`` assistant turns are dropped with their tool results. Raw (unknown)
    entries are skipped.
    """
    path = file.branch_path()
    compaction_index = -1
    reset_index = -1
    for index, entry in enumerate(path):
        if isinstance(entry, CompactionEntry):
            compaction_index = index
        elif entry_type(entry) == "reset_boundary":
            reset_index = index

    messages: list[AgentMessage] = []

    def emit(entries: Sequence[Entry]) -> None:
        for entry in entries:
            message = _entry_message(file, entry)
            if message is not None:
                messages.append(message)

    if reset_index >= 0 and reset_index > compaction_index:
        emit(path[reset_index + 1:])
    elif compaction_index >= 0:
        compaction = path[compaction_index]
        assert isinstance(compaction, CompactionEntry)
        messages.append(CompactionSummaryMessage(
            summary=compaction.summary, tokensBefore=compaction.tokensBefore,
            timestamp=_iso_to_ms(compaction.timestamp), shortSummary=compaction.shortSummary,
            tokensAfter=compaction.tokensAfter, method=compaction.method,
        ))
        kept = [e.id for e in path[:compaction_index]]
        if compaction.firstKeptEntryId in kept:
            emit(path[kept.index(compaction.firstKeptEntryId):compaction_index])
        emit(path[compaction_index + 1:])
    else:
        emit(path)

    _strip_dangling_tool_calls(messages)
    _drop_failed_turns(messages)
    return messages


def _strip_dangling_tool_calls(messages: list[AgentMessage]) -> None:
    paired = {m.toolCallId for m in messages if isinstance(m, ToolResultMessage)}
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, AssistantMessage):
            continue
        if not any(isinstance(b, ToolCall) and b.id not in paired for b in message.content):
            continue
        content = [
            msgspec.structs.replace(block, thinkingSignature=UNSET)
            if isinstance(block, ThinkingContent) and block.thinkingSignature else block
            for block in message.content
            if not (isinstance(block, ToolCall) and block.id not in paired)
            and not isinstance(block, RedactedThinkingContent)
        ]
        if content:
            messages[index] = msgspec.structs.replace(message, content=content)
        else:
            del messages[index]


def _drop_failed_turns(messages: list[AgentMessage]) -> None:
    # Deletions only happen at or after ``index``, so walking backwards stays valid.
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not (isinstance(message, AssistantMessage)
                and message.stopReason in ("error", "aborted")):
            continue
        call_ids = {b.id for b in message.content if isinstance(b, ToolCall)}
        del messages[index]
        if call_ids:
            messages[index:] = [m for m in messages[index:]
                                if not (isinstance(m, ToolResultMessage)
                                        and m.toolCallId in call_ids)]


@attrs.frozen
class BranchSettings:
    """What the current branch records besides messages (restored on switch/branch)."""

    thinking_level: str | None
    """Latest ``thinking_level_change`` level; ``None`` when there is none (or it was null)."""
    configured_thinking_level: str | None
    models: dict[str, str]
    """Role → ``provider/modelId``; ``default`` falls back to the last assistant's model."""
    service_tier: Any
    has_thinking_entry: bool


def branch_settings(file: SessionFile) -> BranchSettings:
    level: str | None = None
    configured: str | None = None
    has_level = False
    models: dict[str, str] = {}
    explicit_default = False
    tier: Any = None
    for entry in file.branch_path():
        if isinstance(entry, ThinkingLevelChangeEntry):
            has_level = True
            level = entry.thinkingLevel
            configured = entry.configured if isinstance(entry.configured, str) else level
        elif isinstance(entry, ModelChangeEntry):
            ref = entry.model_ref
            if ref is not None:
                role = entry.role if isinstance(entry.role, str) else "default"
                models[role] = ref
                explicit_default = explicit_default or role == "default"
        elif isinstance(entry, ServiceTierChangeEntry):
            tier = entry.serviceTier
        elif (isinstance(entry, MessageEntry) and isinstance(entry.message, AssistantMessage)
              and not explicit_default):
            models["default"] = f"{entry.message.provider}/{entry.message.model}"
    return BranchSettings(thinking_level=level, configured_thinking_level=configured,
                          models=models, service_tier=tier, has_thinking_entry=has_level)


# --- branching and listings (rpc-behavior §11.3, §11.4, §11.13) ------------------------------


def branch_file(file: SessionFile, entry_id: str) -> tuple[SessionFile, str]:
    """Fork before the user message ``entry_id`` into a new file next to ``file``.

    The new file holds the branch path up to (not including) that message, entries copied
    verbatim (label entries left out, then re-created for the kept entries at the end), its
    header names ``file`` as ``parentSession`` and keeps the session name. ``file`` is untouched.
    Returns the new file and the selected message's text.
    """
    entry = file.get(entry_id)
    if not isinstance(entry, MessageEntry) or not isinstance(entry.message, UserMessage):
        raise ValueError("Invalid entry ID for branching")
    text = message_text(entry.message)

    path = file.branch_path(entry.parentId) if entry.parentId is not None else []
    kept = [e for e in path if not isinstance(e, LabelEntry)]
    lines: list[bytes] = []
    previous: str | None = None
    for item in kept:
        raw = dict(file.entry_json(item))
        if raw.get("parentId") != previous:  # a left-out label was its parent
            raw["parentId"] = previous
        lines.append(msgspec.json.encode(raw) + b"\n")
        previous = item.id
    kept_ids = {e.id for e in kept}
    taken = set(kept_ids)
    for target, label in file.labels().items():
        if target not in kept_ids:
            continue
        label_entry = LabelEntry(id=_new_id(taken), parentId=previous, timestamp=_now_iso(),
                                 targetId=target, label=label)
        taken.add(label_entry.id)
        lines.append(_encode_line(label_entry))
        previous = label_entry.id

    now = datetime.now(UTC)
    timestamp = _iso(now)
    session_id = _uuid7(int(now.timestamp() * 1000))
    named = file._name_and_source()
    header = SessionHeader(
        version=CURRENT_VERSION, id=session_id, timestamp=timestamp, cwd=file.cwd,
        title=UNSET if named is None else named[0],
        titleSource=UNSET if named is None or named[1] is None else named[1],
        parentSession=str(file.path),
    )
    new_path = file.path.parent / _file_name(timestamp, session_id)
    _write_new_file(new_path, _encode_line(header) + b"".join(lines), fsync=file.fsync)
    return SessionFile.open(new_path, fsync=file.fsync), text


def user_messages(file: SessionFile) -> list[tuple[str, str]]:
    """``(entryId, text)`` of every user message in the whole file, append order, empty skipped."""
    result: list[tuple[str, str]] = []
    for entry in file.entries:
        if isinstance(entry, MessageEntry) and isinstance(entry.message, UserMessage):
            text = message_text(entry.message)
            if text:
                result.append((entry.id, text))
    return result


def entries_since(file: SessionFile, since: str | None = None) -> list[Entry]:
    """All entries in append order, or those strictly after ``since`` (``KeyError`` if unknown)."""
    entries = file.entries
    if since is None:
        return entries
    for index, entry in enumerate(entries):
        if entry.id == since:
            return entries[index + 1:]
    raise KeyError(since)


def tree(file: SessionFile) -> list[dict[str, Any]]:
    """The entry tree as JSON-ready nodes ``{"entry", "children", "label"?}``.

    ``entry`` is :meth:`SessionFile.entry_json`; entries whose parent is missing are extra roots;
    children are sorted by timestamp (stable). Built without recursion; a long session nests
    deeper than recursive JSON encoders go, so serialise it with :func:`encode_tree`. The entry
    objects are the loaded ones: do not mutate them.
    """
    labels = file.labels()
    nodes: dict[str, dict[str, Any]] = {}
    for entry in file.entries:
        node: dict[str, Any] = {"entry": file.entry_json(entry), "children": []}
        if entry.id in labels:
            node["label"] = labels[entry.id]
        nodes[entry.id] = node
    roots: list[dict[str, Any]] = []
    for entry in file.entries:
        parent = nodes.get(entry.parentId) if entry.parentId not in (None, entry.id) else None
        (parent["children"] if parent is not None else roots).append(nodes[entry.id])
    timestamps = {id(node): _iso_to_ms(str(node["entry"].get("timestamp", ""))) for node in
                  nodes.values()}
    for node in nodes.values():
        node["children"].sort(key=lambda child: timestamps[id(child)])
    return roots


def encode_tree(nodes: list[dict[str, Any]]) -> bytes:
    """JSON of :func:`tree` nodes without recursion (a long session nests thousands deep,
    past what a recursive encoder allows)."""
    out = bytearray(b"[")
    stack: list[bytes | dict[str, Any]] = []

    def push(children: list[dict[str, Any]], closing: bytes) -> None:
        stack.append(closing)
        for index in range(len(children) - 1, -1, -1):
            stack.append(children[index])
            if index:
                stack.append(b",")

    push(nodes, b"]")
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):
            out += item
            continue
        out += b'{"entry":' + msgspec.json.encode(item["entry"]) + b',"children":['
        closing = b"]"
        if "label" in item:
            closing += b',"label":' + msgspec.json.encode(item["label"])
        push(item["children"], closing + b"}")
    return bytes(out)


# --- message paging (rpc-behavior §11.12) ----------------------------------------------------

DEFAULT_PAGE_LIMIT: Final = 100
MAX_PAGE_LIMIT: Final = 256
MAX_PAGE_BYTES: Final = 768 * 1024
_MAX_SAFE_INTEGER: Final = 2**53 - 1
_BASE64URL = re.compile(r"^[A-Za-z0-9_-]+$")


class PageError(ValueError):
    """A ``get_messages_page`` request the original refuses; ``code`` is the response's code."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class MessageCursor(msgspec.Struct, frozen=True, kw_only=True):
    """The snapshot a page cursor encodes (key order is the original's)."""

    version: int
    sessionId: str
    leafId: str | None
    messageCount: int
    offset: int


def encode_cursor(session_id: str, leaf_id: str | None, message_count: int, offset: int) -> str:
    """Base64url without padding of ``{version:1, sessionId, leafId, messageCount, offset}``."""
    payload = msgspec.json.encode(MessageCursor(version=1, sessionId=session_id, leafId=leaf_id,
                                                messageCount=message_count, offset=offset))
    return base64.urlsafe_b64encode(payload).rstrip(b"=").decode("ascii")


def decode_cursor(cursor: str) -> MessageCursor:
    """Parse a cursor; anything malformed is :class:`PageError` ``Invalid RPC message cursor``."""
    invalid = PageError("Invalid RPC message cursor")
    if not isinstance(cursor, str) or not _BASE64URL.match(cursor):
        raise invalid
    try:
        payload = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        decoded = msgspec.json.decode(payload, type=MessageCursor)
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise invalid from None
    if (decoded.version != 1 or decoded.messageCount < 0 or decoded.offset < 0
            or decoded.offset > decoded.messageCount):
        raise invalid
    return decoded


def _check_limit(limit: object) -> int:
    if limit is None:
        return DEFAULT_PAGE_LIMIT
    error = PageError(f"RPC message page limit must be between 1 and {MAX_PAGE_LIMIT}")
    if isinstance(limit, bool) or not isinstance(limit, int | float):
        raise error
    if isinstance(limit, float) and not limit.is_integer():
        raise error
    value = int(limit)
    if abs(value) > _MAX_SAFE_INTEGER or not 1 <= value <= MAX_PAGE_LIMIT:
        raise error
    return value


def page(messages: Sequence[AgentMessage], cursor: str | None, limit: object,
         session_id: str, leaf_id: str | None) -> MessagesPage:
    """One ``get_messages_page`` answer over the live ``messages``.

    At most ``limit`` (default 100, 1-256) messages from the cursor's offset, stopping before the
    page's JSON would pass ~768 KiB (the first message is always included). ``nextCursor`` is
    set unless this is the last page. Raises :class:`PageError` for a bad limit, a malformed
    cursor, or a stale one (code ``stale_cursor``: session, leaf or message count changed).
    """
    count = _check_limit(limit)
    total = len(messages)
    offset = 0
    if cursor is not None:
        decoded = decode_cursor(cursor)
        if (decoded.sessionId != session_id or decoded.leafId != leaf_id
                or decoded.messageCount != total):
            raise PageError("RPC message cursor is stale", code="stale_cursor")
        offset = decoded.offset
    selected: list[AgentMessage] = []
    size = 2  # the brackets
    for message in messages[offset:offset + count]:
        encoded = len(msgspec.json.encode(message)) + (1 if selected else 0)
        if selected and size + encoded > MAX_PAGE_BYTES:
            break
        selected.append(message)
        size += encoded
    end = offset + len(selected)
    if end < total:
        return MessagesPage(messages=selected, totalMessages=total,
                            nextCursor=encode_cursor(session_id, leaf_id, total, end))
    return MessagesPage(messages=selected, totalMessages=total)


# --- locations (agent-core §7.1) -------------------------------------------------------------


def _relative_within(root: str, target: str) -> str | None:
    relative = os.path.relpath(target, root)
    if relative == ".":
        return ""
    if relative.startswith("..") or os.path.isabs(relative):
        return None
    return relative


def _encode_relative(prefix: str, relative: str) -> str:
    encoded = re.sub(r"[/\\:]", "-", relative)
    if not encoded:
        return prefix
    return f"{prefix}{encoded}" if prefix.endswith("-") else f"{prefix}-{encoded}"


def encode_cwd(cwd: str | os.PathLike[str], *, home: str | os.PathLike[str] | None = None,
               tmp: str | os.PathLike[str] | None = None) -> str:
    """The per-cwd directory name omp uses (symlinks resolved).

    Inside the temp dir (checked first): ``-tmp-<rel>`` (``-tmp`` for its root); inside home:
    ``-<rel>`` (``-`` for home itself); elsewhere pi's ``--<path with / \\ : as ->--``.
    ``/`` ``\\`` ``:`` in the relative part become ``-``.
    """
    real = os.path.realpath(os.fspath(cwd))
    home_real = os.path.realpath(os.fspath(home) if home is not None else Path.home())
    tmp_real = os.path.realpath(os.fspath(tmp) if tmp is not None else tempfile.gettempdir())
    relative = _relative_within(tmp_real, real)
    if relative is not None:
        return _encode_relative("-tmp", relative)
    relative = _relative_within(home_real, real)
    if relative is not None:
        return _encode_relative("-", relative)
    stripped = re.sub(r"^[/\\]", "", real)
    return "--" + re.sub(r"[/\\:]", "-", stripped) + "--"


def sessions_dir(agent_directory: str | os.PathLike[str], cwd: str | os.PathLike[str], *,
                 home: str | os.PathLike[str] | None = None,
                 tmp: str | os.PathLike[str] | None = None) -> Path:
    """``<agent dir>/sessions/<encoded cwd>`` (not created)."""
    return Path(agent_directory) / "sessions" / encode_cwd(cwd, home=home, tmp=tmp)


def _first_records(path: Path, limit: int = 2) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    with path.open("rb") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                value = msgspec.json.decode(line)
            except msgspec.DecodeError:
                return records
            if not isinstance(value, dict):
                return records
            records.append(value)
            if len(records) >= limit:
                break
    return records


def _is_session_file(path: Path, *, non_empty: bool) -> bool:
    try:
        records = _first_records(path, limit=3)
    except OSError:
        return False
    if records and records[0].get("type") == "title":
        records = records[1:]
    if not records:
        return False
    header = records[0]
    if header.get("type") != "session" or not isinstance(header.get("id"), str):
        return False
    if not non_empty:
        return True
    try:
        with path.open("rb") as handle:
            return any(b'"type":"message"' in line for line in handle)
    except OSError:
        return False


def newest_session(directory: str | os.PathLike[str], *, non_empty: bool = False) -> Path | None:
    """The most recently modified valid session file in ``directory`` (``--continue``).

    ``non_empty`` also requires at least one message entry (``open_session``).
    """
    root = Path(directory)
    try:
        candidates = [p for p in root.iterdir() if p.name.endswith(".jsonl")]
    except OSError:
        return None
    best: tuple[float, str, Path] | None = None
    for candidate in candidates:
        try:
            info = candidate.stat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode) or not _is_session_file(candidate, non_empty=non_empty):
            continue
        key = (info.st_mtime, candidate.name, candidate)
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else best[2]

