"""Session entries and their JSON lines (docs/design/sessions.md#file-layout,
docs/design/sessions.md#entries): the types, ids, timestamps, codec.

The format is the one pi and omp write, so an entry written here reads in the original and an
entry the original wrote reads here:

* the header ``{"type":"session","version":3,"id",...,"cwd"}`` (:class:`SessionHeader`) is the
  file's first record; every entry after it is ``{"type","id","parentId","timestamp",...}`` with
  an 8-hex ``id`` (:func:`new_entry_id`), ``parentId: null`` for a root and an ISO-8601 UTC
  ``timestamp`` with milliseconds and ``Z`` (:func:`now_iso`); a session id is a UUID v7
  (:func:`uuid7`);
* entries are msgspec Structs tagged by ``type``, encoded one per line by :func:`encode_line` with
  the original's key order;
* an entry of a type this port does not model, or whose fields it cannot decode (an omp-only
  message role, say), decodes as a :class:`RawEntry` (:func:`decode_entry`): kept as its JSON
  object, so it can be copied verbatim and skipped when building the context.

Pure data and codec: no file I/O, no async, nothing here knows where the lines are stored.
"""

from __future__ import annotations

import functools
import os
import uuid
from datetime import UTC, datetime
from typing import Any, Final

import msgspec
from msgspec import UNSET, UnsetType

from omp.protocol.messages import AgentMessage, CustomMessage, TextContent, UserContent, UserMessage

__all__ = [
    "CURRENT_VERSION",
    "BranchSummaryEntry",
    "CompactionEntry",
    "CustomEntry",
    "CustomMessageEntry",
    "Entry",
    "KnownEntry",
    "LabelEntry",
    "MessageEntry",
    "ModelChangeEntry",
    "RawEntry",
    "ServiceTierChangeEntry",
    "SessionHeader",
    "SessionInfoEntry",
    "ThinkingLevelChangeEntry",
    "TitleChangeEntry",
    "decode_entry",
    "encode_line",
    "entry_line_decoder",
    "entry_type",
    "iso_timestamp",
    "iso_to_ms",
    "message_text",
    "new_entry_id",
    "now_iso",
    "uuid7",
]

CURRENT_VERSION: Final = 3
"""The header ``version`` this port writes (older files are migrated on load)."""


# --- header and entries (docs/design/sessions.md#file-layout, docs/design/sessions.md#entries) ---


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
    # The original writes ``null`` for both in some flows (docs/design/sessions.md#entries).
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


class RawEntry(msgspec.Struct, frozen=True):
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


def entry_type(entry: Entry) -> str:
    """The entry's ``type`` (the Structs carry it as their tag, not as an attribute)."""
    if isinstance(entry, RawEntry):
        return entry.type
    tag = entry.__struct_config__.tag
    return tag if isinstance(tag, str) else ""


# --- ids and timestamps ----------------------------------------------------------------------


def iso_timestamp(dt: datetime) -> str:
    """``dt`` as the entries' timestamps are written: ISO-8601 with milliseconds and ``Z``."""
    return f"{dt:%Y-%m-%dT%H:%M:%S}.{dt.microsecond // 1000:03d}Z"


def now_iso() -> str:
    return iso_timestamp(datetime.now(UTC))


def iso_to_ms(value: str) -> int:
    """Unix milliseconds of an ISO-8601 timestamp (naive means UTC); 0 when unparseable."""
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return 0
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def uuid7(ms: int) -> str:
    """A UUID v7 (RFC 9562): 48-bit Unix milliseconds, version, 74 random bits."""
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = rand >> 68  # 12 bits
    rand_b = rand & ((1 << 62) - 1)
    value = ((ms & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b
    return str(uuid.UUID(int=value))


def new_entry_id(taken: set[str] | dict[str, Any]) -> str:
    """8 hex characters not in ``taken`` (a full UUID in the unlikely case none is found)."""
    for _ in range(100):
        candidate = uuid.uuid4().hex[:8]
        if candidate not in taken:
            return candidate
    return str(uuid.uuid4())


# --- lines -----------------------------------------------------------------------------------


def encode_line(entry: Entry | SessionHeader) -> bytes:
    """One line of the file, newline included (a :class:`RawEntry` as its JSON object)."""
    if isinstance(entry, RawEntry):
        return msgspec.json.encode(entry.data) + b"\n"
    return msgspec.json.encode(entry) + b"\n"


def decode_entry(data: dict[str, Any]) -> Entry:
    """The typed entry for a JSON object, or a :class:`RawEntry` wrapping ``data`` itself."""
    if data.get("type") in _KNOWN_TYPES:
        try:
            entry: KnownEntry = msgspec.convert(data, KnownEntry)
            return entry
        except msgspec.ValidationError:
            pass
    return RawEntry(data)


@functools.cache
def entry_line_decoder() -> msgspec.json.Decoder[KnownEntry]:
    """A strict decoder from a line straight to a typed entry (no :class:`RawEntry` fallback:
    it raises ``msgspec.DecodeError``/``ValidationError``). Built on first use."""
    return msgspec.json.Decoder(KnownEntry)


def message_text(message: UserMessage | CustomMessage) -> str:
    """The text of a user-like message: the string, or its text blocks joined without separator."""
    if isinstance(message.content, str):
        return message.content
    return "".join(block.text for block in message.content if isinstance(block, TextContent))
