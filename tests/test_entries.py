"""Session entries and their JSON lines (omp.session.entries): pure, no files."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

import msgspec
import pytest

from omp.protocol.messages import CustomMessage, ImageContent, TextContent, UserMessage
from omp.session.entries import (
    CompactionEntry,
    LabelEntry,
    MessageEntry,
    ModelChangeEntry,
    RawEntry,
    SessionHeader,
    decode_entry,
    encode_line,
    entry_line_decoder,
    entry_type,
    iso_timestamp,
    iso_to_ms,
    message_text,
    new_entry_id,
    uuid7,
)


def test_lines_have_the_originals_key_order() -> None:
    header = SessionHeader(version=3, id="s", timestamp="2026-01-01T00:00:00.000Z", cwd="/p")
    assert encode_line(header) == (
        b'{"type":"session","version":3,"id":"s","timestamp":"2026-01-01T00:00:00.000Z",'
        b'"cwd":"/p"}\n')
    label = LabelEntry(id="a", parentId=None, timestamp="t", targetId="b")
    assert list(json.loads(encode_line(label))) == ["type", "id", "parentId", "timestamp",
                                                    "targetId"]
    raw = RawEntry({"type": "ttsr_injection", "id": "c", "zeta": 1, "alpha": 2})
    assert encode_line(raw) == b'{"type":"ttsr_injection","id":"c","zeta":1,"alpha":2}\n'


def test_known_entries_decode_typed_and_the_rest_raw() -> None:
    base = {"id": "a", "parentId": None, "timestamp": "2026-01-01T00:00:00.000Z"}
    compaction = decode_entry({"type": "compaction", **base, "summary": "s",
                               "firstKeptEntryId": "b", "tokensBefore": 3})
    assert isinstance(compaction, CompactionEntry)
    assert entry_type(compaction) == "compaction"
    for data in ({"type": "reset_boundary", **base},  # a type this port does not model
                 {"type": "message", **base, "message": {"role": "pythonExecution"}},
                 {"type": "compaction", **base, "summary": 5}):  # a known type, bad fields
        entry = decode_entry(data)
        assert isinstance(entry, RawEntry)
        assert entry.data is data
        assert (entry_type(entry), entry.id, entry.parentId) == (data["type"], "a", None)
    # The line decoder is strict: no raw fallback, the loader decides what to do.
    with pytest.raises(msgspec.ValidationError):
        entry_line_decoder().decode(b'{"type":"reset_boundary","id":"a"}')
    line = encode_line(MessageEntry(id="a", parentId=None, timestamp="t",
                                    message=UserMessage(content="q", timestamp=1)))
    assert isinstance(entry_line_decoder().decode(line), MessageEntry)


def test_model_change_reads_both_shapes() -> None:
    omp = ModelChangeEntry(id="a", parentId=None, timestamp="t", model="p/m")
    pi = ModelChangeEntry(id="a", parentId=None, timestamp="t", provider="p", modelId="m")
    assert omp.model_ref == pi.model_ref == "p/m"
    assert ModelChangeEntry(id="a", parentId=None, timestamp="t").model_ref is None


def test_ids_and_timestamps() -> None:
    taken = {f"{n:08x}" for n in range(50)}
    fresh = new_entry_id(taken)
    assert re.fullmatch(r"[0-9a-f]{8}", fresh)
    assert fresh not in taken
    ms = 1_764_000_000_123
    session_id = uuid.UUID(uuid7(ms))
    assert session_id.version == 7
    assert session_id.int >> 80 == ms
    moment = datetime(2026, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC)
    assert iso_timestamp(moment) == "2026-01-02T03:04:05.678Z"
    assert iso_to_ms(iso_timestamp(moment)) == int(moment.timestamp() * 1000)
    assert iso_to_ms("2026-01-02T03:04:05.678") == iso_to_ms("2026-01-02T03:04:05.678Z")
    assert iso_to_ms("not a time") == 0


def test_message_text() -> None:
    assert message_text(UserMessage(content="plain", timestamp=1)) == "plain"
    blocks: list[TextContent | ImageContent] = [
        TextContent(text="a"), ImageContent(data="", mimeType="image/png"), TextContent(text="b")]
    assert message_text(UserMessage(content=blocks, timestamp=1)) == "ab"
    assert message_text(CustomMessage(customType="x", content="c", display=True,
                                      timestamp=1)) == "c"
