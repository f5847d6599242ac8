"""One session file on disk (omp.session.file): the original's samples, round trips, damage,
migration, modes and branching into a new file."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest
from session_helpers import (
    SAMPLE_1,
    SAMPLE_2,
    SAMPLE_3,
    assistant,
    conversation,
    lines_of,
    texts,
    user,
)

from omp.protocol.messages import (
    AssistantMessage,
    CompactionSummaryMessage,
    CustomMessage,
    TextContent,
    Usage,
)
from omp.session.context import branch_settings, build_context, user_messages
from omp.session.entries import CompactionEntry, LabelEntry, MessageEntry, RawEntry, entry_type
from omp.session.file import SessionFile, SessionFormatError, branch_file, make_private_dirs

# Keys only the original writes (omp's per-message context accounting).
ORIGINAL_ONLY_KEYS = frozenset({"contextSnapshot"})
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# --- the original's files ------------------------------------------------------------------------


def test_samples_load_and_build_their_contexts() -> None:
    first = SessionFile.open(SAMPLE_1)
    assert first.problems == []
    assert first.session_id == "01a2293a-955e-71de-a160-f7106fb936ad"
    assert first.cwd == "/home/user/project"
    assert first.name == "My Sample Session"
    assert first.leaf_id == "ae1d7970"
    assert [entry_type(e) for e in first.entries] == [
        "model_change", "thinking_level_change", "message", "message", "message", "message",
        "title_change"]
    assert texts(build_context(first)) == [
        ("user", "First question"), ("assistant", "First answer."),
        ("user", "Second question"), ("assistant", "Second answer.")]
    assert user_messages(first) == [("29722047", "First question"),
                                    ("e4c2cd11", "Second question")]
    settings = branch_settings(first)
    assert settings.thinking_level == "high"
    assert settings.models == {"default": "fake/fake-model"}

    second = SessionFile.open(SAMPLE_2)
    assert second.problems == []
    assert build_context(second) == []
    assert second.name == "My Sample Session"
    parent = second.header.parentSession
    assert isinstance(parent, str)
    assert Path(parent).name == (
        "2026-11-29T21-33-54-910Z_01a2293a-955e-71de-a160-f7106fb936ad.jsonl")
    assert Path(parent).parent.name == "--home-user-project--"

    third = SessionFile.open(SAMPLE_3)
    assert third.problems == []
    assert build_context(third) == []
    assert third.name is None
    assert [entry_type(e) for e in third.entries] == ["thinking_level_change",
                                                     "service_tier_change"]


def test_loaded_entries_keep_the_originals_keys() -> None:
    first = SessionFile.open(SAMPLE_1)
    originals = lines_of(SAMPLE_1)[2:]  # after the title slot and the header
    assert [first.entry_json(e) for e in first.entries] == originals


def test_branching_a_sample_reproduces_the_originals_branch(tmp_path: Path) -> None:
    """The sample flow branched at "First question": our branch file matches the original's."""
    source = tmp_path / SAMPLE_1.name
    shutil.copyfile(SAMPLE_1, source)
    before = source.read_bytes()
    branched, text = branch_file(SessionFile.open(source), "29722047")
    assert text == "First question"
    assert source.read_bytes() == before
    ours, theirs = lines_of(branched.path), lines_of(SAMPLE_2)[1:]  # theirs has a title slot
    assert ours[0]["parentSession"] == str(source)
    assert ours[0].keys() == theirs[0].keys()
    assert {k: ours[0][k] for k in ("type", "version", "cwd", "title", "titleSource")} == {
        k: theirs[0][k] for k in ("type", "version", "cwd", "title", "titleSource")}
    assert ours[1:] == theirs[1:]
    assert build_context(branched) == []
    assert branched.name == "My Sample Session"


def test_written_entries_have_the_originals_keys(tmp_path: Path) -> None:
    theirs: dict[str, dict[str, Any]] = {}
    for sample in (SAMPLE_1, SAMPLE_3):
        for record in lines_of(sample):
            key = record["type"]
            if key == "message":
                key = f"message/{record['message']['role']}"
            theirs.setdefault(key, record)

    file = SessionFile.create(tmp_path, cwd="/home/user/project")
    file.append_model_change("fake", "fake-model")
    file.append_thinking_level("high")
    file.append_message(user("First question"))
    file.append_message(AssistantMessage(
        content=[TextContent(text="First answer.")], api="openai-completions", provider="fake",
        model="fake-model", usage=Usage.zero(), stopReason="stop", timestamp=2,
        responseId="chatcmpl-fake-0", duration=33.4, ttft=30.9, completedAt=3))
    file.set_name("  My Sample Session  ")
    file.append_service_tier(None)

    ours = lines_of(file.path)
    assert ours[0].keys() == theirs["session"].keys()
    for record in ours[1:]:
        key = record["type"]
        if key == "message":
            key = f"message/{record['message']['role']}"
            expected = theirs[key]["message"]
            assert record["message"].keys() == expected.keys() - ORIGINAL_ONLY_KEYS, key
            if "usage" in expected:
                assert record["message"]["usage"].keys() == expected["usage"].keys()
        assert record.keys() == theirs[key].keys(), key
        assert ISO_MS.match(record["timestamp"])
        assert re.fullmatch(r"[0-9a-f]{8}", record["id"])
    assert ours[-2]["title"] == "My Sample Session"
    assert ours[-2]["source"] == "user"
    # Every entry is a child of the one before it; the first is a root.
    assert [r["parentId"] for r in ours[1:]] == [None] + [r["id"] for r in ours[1:-1]]


def test_compaction_entry_has_the_spec_keys(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    kept = user_messages(file)[1][0]
    entry = file.append_compaction("## Goal\n...", kept, 171234,
                                   {"readFiles": ["src/a.ts"], "modifiedFiles": ["src/b.ts"]},
                                   short_summary="I ...", tokens_after=23000, method="soft")
    record = lines_of(file.path)[-1]
    # The keys of docs/design/sessions.md#the-compaction-entry, in the original's order.
    assert list(record) == ["type", "id", "parentId", "timestamp", "summary", "firstKeptEntryId",
                            "tokensBefore", "details", "method", "tokensAfter", "shortSummary"]
    assert record["id"] == entry.id


@pytest.mark.parametrize("behind", [False, True], ids=["in-place", "write-behind"])
def test_set_name_keeps_an_omp_title_slot_in_step(tmp_path: Path, behind: bool) -> None:
    path = tmp_path / SAMPLE_1.name
    shutil.copyfile(SAMPLE_1, path)
    file = SessionFile.open(path)
    if behind:
        file.write_behind()  # the slot is rewritten by the writer thread, in order
    file.set_name("Renamed ü")
    file.flush()
    first = path.read_bytes().split(b"\n", 1)[0]
    assert len(first) + 1 == 256
    slot = json.loads(first)
    assert list(slot) == list(lines_of(SAMPLE_1)[0])
    assert (slot["title"], slot["source"]) == ("Renamed ü", "user")
    reopened = SessionFile.open(path)
    assert reopened.problems == []
    assert reopened.name == "Renamed ü"
    assert reopened.entries == file.entries
    # A name too long for the slot leaves it alone; the entry still names the session.
    file.set_name("x" * 300)
    file.flush()
    assert path.read_bytes().split(b"\n", 1)[0] == first
    assert SessionFile.open(path).name == "x" * 300


# --- round trip ----------------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/work/project",
                              parent_session="/old/file.jsonl")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d-\d{3}Z_[0-9a-f-]{36}\.jsonl",
                        file.path.name)
    assert file.path.name.endswith(f"_{file.session_id}.jsonl")
    assert file.session_id[14] == "7"  # UUID v7
    file.append_model_change("fake", "fake-model")
    file.append_thinking_level("medium", configured="medium")
    file.append_message(user("hello"))
    file.append_message(assistant("hi there"))
    file.append_message(CustomMessage(customType="note", content="remember", display=True,
                                      timestamp=5))
    file.set_name("Named")
    file.append_compaction("summary text", file.entries[2].id, 1234)
    file.append_message(user("after"))

    again = SessionFile.open(file.path)
    assert again.problems == []
    assert again.entries == file.entries
    assert again.header == file.header
    assert again.header.parentSession == "/old/file.jsonl"
    assert again.leaf_id == file.leaf_id
    assert again.name == "Named"
    assert build_context(again) == build_context(file)
    assert texts(build_context(again)) == [
        ("compactionSummary", "summary text"), ("user", "hello"), ("assistant", "hi there"),
        ("custom", "remember"), ("user", "after")]
    settings = branch_settings(again)
    assert settings.thinking_level == "medium"
    assert settings.models == {"default": "fake/fake-model"}


def test_set_name_rules(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    with pytest.raises(ValueError, match="Session name cannot be empty"):
        file.set_name("   ")
    assert file.set_name("  Named  ").title == "Named"
    renamed = file.set_name("Other")
    assert renamed.previousTitle == "Named"
    assert SessionFile.open(file.path).name == "Other"


def test_summaries_are_not_message_entries(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    with pytest.raises(ValueError, match="not stored as a message entry"):
        file.append_message(CompactionSummaryMessage(summary="s", tokensBefore=1, timestamp=1))


def test_appended_entries_are_on_disk_immediately(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    entry = file.append_message(user("q"))
    assert isinstance(entry, MessageEntry)
    assert lines_of(file.path)[-1]["id"] == entry.id
    assert file.path.read_bytes().endswith(b"\n")


# --- damage and migration ------------------------------------------------------------------------


def test_torn_last_line_is_skipped_silently(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    with file.path.open("ab") as handle:
        handle.write(b'{"type":"message","id":"deadbeef","parentId":"x","message":{"ro')
    torn = SessionFile.open(file.path)
    assert torn.problems == []
    assert torn.entries == file.entries
    assert texts(build_context(torn))[-1] == ("assistant", "a2")

    # Opening set the fragment aside, so the next append leaves the file valid JSON Lines.
    fragment = b'{"type":"message","id":"deadbeef","parentId":"x","message":{"ro'
    assert Path(f"{file.path}.torn").read_bytes() == fragment + b"\n"
    assert stat.S_IMODE(Path(f"{file.path}.torn").stat().st_mode) == 0o600
    torn.append_message(user("q3"))
    reopened = SessionFile.open(file.path)
    assert texts(build_context(reopened))[-1] == ("user", "q3")
    assert reopened.problems == []
    for line in file.path.read_bytes().splitlines():
        assert isinstance(msgspec.json.decode(line), dict)



def test_a_last_line_without_its_newline_is_kept_and_the_next_append_starts_a_line(
        tmp_path: Path) -> None:
    file = conversation(tmp_path)
    file.path.write_bytes(file.path.read_bytes().rstrip(b"\n"))
    reopened = SessionFile.open(file.path)
    assert reopened.problems == []
    assert reopened.entries == file.entries
    reopened.append_message(user("q3"))
    assert texts(build_context(SessionFile.open(file.path)))[-3:] == [
        ("user", "q2"), ("assistant", "a2"), ("user", "q3")]
    assert SessionFile.open(file.path).problems == []


def test_bad_json_on_the_last_line_is_skipped_silently(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    with file.path.open("ab") as handle:
        handle.write(b"{garbage\n\n")
    reopened = SessionFile.open(file.path)
    assert reopened.problems == []
    assert len(reopened.entries) == len(file.entries)


def test_bad_middle_line_is_reported_and_the_rest_loads(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    lines = file.path.read_bytes().splitlines(keepends=True)
    lines.insert(3, b"{not json\n")
    lines.insert(5, b"[1, 2]\n")
    file.path.write_bytes(b"".join(lines))
    reopened = SessionFile.open(file.path)
    assert [p.line for p in reopened.problems] == [4, 6]
    assert "invalid JSON" in reopened.problems[0].message
    assert texts(build_context(reopened)) == texts(build_context(file))


def test_missing_header_is_refused_and_the_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"type":"message","id":"a","parentId":null}\n')
    with pytest.raises(SessionFormatError, match="the session header is missing or malformed"):
        SessionFile.open(path)
    assert path.read_bytes() == b'{"type":"message","id":"a","parentId":null}\n'


def test_unknown_entries_and_roles_load_raw(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    leaf = file.leaf_id
    extra = [
        {"type": "ttsr_injection", "id": "aaaa0001", "parentId": leaf,
         "timestamp": "2026-01-01T00:00:00.000Z", "injectedRules": ["r"]},
        {"type": "message", "id": "aaaa0002", "parentId": "aaaa0001",
         "timestamp": "2026-01-01T00:00:00.000Z",
         "message": {"role": "pythonExecution", "code": "1", "output": "1", "timestamp": 9}},
        {"type": "message", "id": "aaaa0003", "parentId": "aaaa0002",
         "timestamp": "2026-01-01T00:00:00.000Z",
         "message": {"role": "user", "content": "q3", "timestamp": 10, "futureKey": {"a": 1}}},
    ]
    with file.path.open("a") as handle:
        for record in extra:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")
    reopened = SessionFile.open(file.path)
    assert reopened.problems == []
    raw = [e for e in reopened.entries if isinstance(e, RawEntry)]
    assert [e.type for e in raw] == ["ttsr_injection", "message"]
    assert texts(build_context(reopened))[-2:] == [("assistant", "a2"), ("user", "q3")]
    # Unknown keys survive, both in entry_json and in a branch file.
    assert reopened.entry_json(reopened.entries[-1]) == extra[-1]
    reopened.append_message(assistant("a3"))
    branched, text = branch_file(reopened, "aaaa0003")
    assert text == "q3"
    copied = lines_of(branched.path)
    assert copied[-2:] == extra[:2]


def test_version_1_files_are_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    records = [
        {"type": "session", "id": "s1", "timestamp": "2025-01-01T00:00:00.000Z", "cwd": "/p"},
        {"type": "message", "timestamp": "2025-01-01T00:00:01.000Z",
         "message": {"role": "user", "content": "old q", "timestamp": 1}},
        {"type": "message", "timestamp": "2025-01-01T00:00:02.000Z",
         "message": {"role": "hookMessage", "customType": "x", "content": "hook",
                     "display": True, "timestamp": 2}},
        {"type": "compaction", "timestamp": "2025-01-01T00:00:03.000Z", "summary": "sum",
         "firstKeptEntryIndex": 2, "tokensBefore": 5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    file = SessionFile.open(path)
    assert file.header.version == 3
    ids = [e.id for e in file.entries]
    assert all(re.fullmatch(r"[0-9a-f]{8}", i) for i in ids)
    compaction = file.entries[-1]
    assert isinstance(compaction, CompactionEntry)
    assert compaction.firstKeptEntryId == ids[1]
    assert texts(build_context(file)) == [("compactionSummary", "sum"), ("custom", "hook")]
    # The migration was written back.
    assert list(lines_of(path)[0]) == ["type", "version", "id", "timestamp", "cwd"]
    assert lines_of(path)[0]["version"] == 3
    assert SessionFile.open(path).entries == file.entries


# --- modes ---------------------------------------------------------------------------------------


def test_files_are_0600_in_0700_directories(tmp_path: Path) -> None:
    directory = tmp_path / "home" / "sessions" / "-proj"
    # SessionFile creates no directory; the runtime creates its own with make_private_dirs.
    with pytest.raises(FileNotFoundError, match=f"No such directory: {directory}"):
        SessionFile.create(directory, cwd="/p")
    assert not (tmp_path / "home").exists()
    make_private_dirs(directory)
    file = SessionFile.create(directory, cwd="/p")
    assert stat.S_IMODE(os.stat(file.path).st_mode) == 0o600
    for created in (directory, directory.parent):
        assert stat.S_IMODE(os.stat(created).st_mode) == 0o700
    file.append_message(user("q"))
    branched, _ = branch_file(file, file.entries[0].id)
    assert stat.S_IMODE(os.stat(branched.path).st_mode) == 0o600


def test_create_never_overwrites(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    with pytest.raises(FileExistsError):
        SessionFile.create_at(file.path, cwd="/p")


# --- branching (docs/design/sessions.md#branch) --------------------------------------------------


def test_branch_at_the_second_user_message(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    a1 = file.entries[3].id
    file.append_label(a1, "checkpoint")
    file.append_message(user("q3"))
    before = file.path.read_bytes()
    second = user_messages(file)[1][0]

    branched, text = branch_file(file, second)
    assert text == "q2"
    assert file.path.read_bytes() == before
    assert branched.path.parent == file.path.parent
    assert branched.header.parentSession == str(file.path)
    assert branched.session_id != file.session_id
    assert texts(build_context(branched)) == [("user", "q1"), ("assistant", "a1")]
    # The label came along as a fresh entry at the end, chained after the kept entries.
    last = branched.entries[-1]
    assert isinstance(last, LabelEntry)
    assert (last.targetId, last.label, last.parentId) == (a1, "checkpoint", a1)
    assert branched.labels() == {a1: "checkpoint"}
    assert [e.id for e in branched.entries[:4]] == [e.id for e in file.entries[:4]]
    assert branch_settings(branched).thinking_level == "high"


def test_branch_at_the_root_message_makes_an_empty_session(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    first = file.append_message(user("only"))
    file.set_name("Kept")
    branched, text = branch_file(file, first.id)
    assert text == "only"
    assert branched.entries == []
    assert branched.name == "Kept"
    assert branched.header.titleSource == "user"


def test_branch_refuses_non_user_entries(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    for bad in (file.entries[0].id, file.entries[3].id, "nope"):
        with pytest.raises(ValueError, match="Invalid entry ID for branching"):
            branch_file(file, bad)
