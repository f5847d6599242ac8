"""Session files on disk (omp.session.store): the original's samples, round trips, damage, modes,
branching, listings, paging, compaction and locations."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest

from omp.protocol.messages import (
    AgentMessage,
    AssistantMessage,
    BranchSummaryMessage,
    CompactionSummaryMessage,
    CustomMessage,
    TextContent,
    ThinkingContent,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from omp.session.store import (
    CompactionEntry,
    LabelEntry,
    MessageEntry,
    PageError,
    RawEntry,
    SessionFile,
    SessionFormatError,
    branch_file,
    branch_settings,
    build_context,
    decode_cursor,
    encode_cursor,
    encode_cwd,
    encode_tree,
    entries_since,
    entry_type,
    newest_session,
    page,
    sessions_dir,
    tree,
    user_messages,
)

SAMPLES = Path(__file__).resolve().parents[2] / "shared" / "samples" / "sessions"
SAMPLE_1 = SAMPLES / "omp-session-1.jsonl"
SAMPLE_2 = SAMPLES / "omp-session-2.jsonl"
SAMPLE_3 = SAMPLES / "omp-session-3.jsonl"
needs_samples = pytest.mark.skipif(
    not SAMPLE_1.is_file(), reason=f"recorded session samples not found in {SAMPLES}"
)
# Keys only the original writes (omp's per-message context accounting).
ORIGINAL_ONLY_KEYS = frozenset({"contextSnapshot"})
ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# --- helpers ---------------------------------------------------------------------------------


def user(text: str, ts: int = 1) -> UserMessage:
    return UserMessage(content=[TextContent(text=text)], timestamp=ts, attribution="user")


def assistant(text: str = "", *, calls: tuple[ToolCall, ...] = (), stop: Any = "stop",
              ts: int = 2) -> AssistantMessage:
    content: list[Any] = [TextContent(text=text)] if text else []
    content.extend(calls)
    return AssistantMessage(content=content, api="openai-completions", provider="fake",
                            model="fake-model", usage=Usage.zero(), stopReason=stop, timestamp=ts)


def tool_result(call_id: str, text: str = "ok") -> ToolResultMessage:
    return ToolResultMessage(toolCallId=call_id, toolName="bash",
                             content=[TextContent(text=text)], isError=False, timestamp=3)


def texts(messages: list[AgentMessage]) -> list[tuple[str, str]]:
    result = []
    for message in messages:
        role = message.__struct_config__.tag
        if isinstance(message, UserMessage | CustomMessage):
            content = message.content
            text = content if isinstance(content, str) else "".join(
                b.text for b in content if isinstance(b, TextContent))
        elif isinstance(message, AssistantMessage | ToolResultMessage):
            text = "".join(b.text for b in message.content if isinstance(b, TextContent))
        elif isinstance(message, CompactionSummaryMessage | BranchSummaryMessage):
            text = message.summary
        else:
            text = ""
        result.append((str(role), text))
    return result


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def conversation(directory: Path) -> SessionFile:
    """Two turns on a fresh file: q1/a1/q2/a2 after model and thinking entries."""
    file = SessionFile.create(directory, cwd="/work/project")
    file.append_model_change("fake", "fake-model")
    file.append_thinking_level("high")
    for n in (1, 2):
        file.append_message(user(f"q{n}"))
        file.append_message(assistant(f"a{n}"))
    return file


# --- the original's files --------------------------------------------------------------------


@needs_samples
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


@needs_samples
def test_loaded_entries_keep_the_originals_keys() -> None:
    first = SessionFile.open(SAMPLE_1)
    originals = lines_of(SAMPLE_1)[2:]  # after the title slot and the header
    assert [first.entry_json(e) for e in first.entries] == originals


@needs_samples
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


@needs_samples
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
    # The example of agent-core §6.6.
    assert list(record) == ["type", "id", "parentId", "timestamp", "summary", "firstKeptEntryId",
                            "tokensBefore", "details", "method", "tokensAfter", "shortSummary"]
    assert record["id"] == entry.id


# --- round trip ------------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path / "sessions", cwd="/work/project",
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


# --- damage ----------------------------------------------------------------------------------


def test_torn_last_line_is_skipped_silently(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    with file.path.open("ab") as handle:
        handle.write(b'{"type":"message","id":"deadbeef","parentId":"x","message":{"ro')
    torn = SessionFile.open(file.path)
    assert torn.problems == []
    assert torn.entries == file.entries
    assert texts(build_context(torn))[-1] == ("assistant", "a2")

    # Appending after a torn line starts a fresh line; the fragment is then a bad middle line.
    torn.append_message(user("q3"))
    reopened = SessionFile.open(file.path)
    assert texts(build_context(reopened))[-1] == ("user", "q3")
    fragment_line = len(file.path.read_text().splitlines()) - 1
    assert [p.line for p in reopened.problems] == [fragment_line]


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


# --- modes -----------------------------------------------------------------------------------


def test_files_are_0600_in_0700_directories(tmp_path: Path) -> None:
    directory = tmp_path / "agent" / "sessions" / "-proj"
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


# --- branching, listings ---------------------------------------------------------------------


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


def test_user_messages_cover_every_branch(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    file.move_leaf(file.entries[3].id)  # back to a1
    file.append_message(user("q2 again"))
    file.append_message(UserMessage(content=[], timestamp=9))  # empty text: skipped
    assert [t for _, t in user_messages(file)] == ["q1", "q2", "q2 again"]
    assert texts(build_context(file)) == [("user", "q1"), ("assistant", "a1"),
                                          ("user", "q2 again"), ("user", "")]


def test_entries_since_and_tree(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    ids = [e.id for e in file.entries]
    assert entries_since(file) == file.entries
    assert [e.id for e in entries_since(file, ids[3])] == ids[4:]
    assert entries_since(file, ids[-1]) == []
    with pytest.raises(KeyError, match="unknown1"):
        entries_since(file, "unknown1")

    file.move_leaf(ids[3])
    fork = file.append_message(user("other"))
    file.append_label(fork.id, "fork")
    roots = tree(file)
    assert [r["entry"]["id"] for r in roots] == [ids[0]]
    node = roots[0]
    for expected in ids[1:4]:
        (node,) = node["children"]
        assert node["entry"]["id"] == expected
    assert [c["entry"]["id"] for c in node["children"]] == [ids[4], fork.id]
    forked = node["children"][1]
    assert forked["label"] == "fork"
    assert [c["entry"]["type"] for c in forked["children"]] == ["label"]
    assert json.loads(encode_tree(roots)) == json.loads(msgspec.json.encode(roots))
    assert list(json.loads(encode_tree(roots))[0]) == ["entry", "children"]
    assert encode_tree([]) == b"[]"


def test_tree_of_a_long_session_needs_no_recursion(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    for n in range(1500):
        file.append_message(user(f"m{n}"))
    depth, node = 1, tree(file)[0]
    while node["children"]:
        (node,) = node["children"]
        depth += 1
    assert depth == 1500
    encoded = encode_tree(tree(file))
    assert encoded.count(b'"children":[') == 1500


# --- context rules ---------------------------------------------------------------------------


def test_compaction_context(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    q2 = user_messages(file)[1][0]
    compaction = file.append_compaction("the summary", q2, 500, short_summary="short",
                                        tokens_after=50, method="soft")
    file.append_message(user("q3"))
    messages = build_context(file)
    assert texts(messages) == [("compactionSummary", "the summary"), ("user", "q2"),
                               ("assistant", "a2"), ("user", "q3")]
    summary = messages[0]
    assert isinstance(summary, CompactionSummaryMessage)
    assert (summary.tokensBefore, summary.shortSummary, summary.tokensAfter, summary.method) == (
        500, "short", 50, "soft")
    assert summary.timestamp > 1_700_000_000_000
    # Only the latest compaction counts.
    file.append_compaction("newer", compaction.id, 600)
    assert texts(build_context(file)) == [("compactionSummary", "newer"), ("user", "q3")]


def test_branch_summary_and_reset_boundary(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    a1 = file.entries[3].id
    file.append_branch_summary(a1, "what happened over there")
    assert texts(build_context(file))[-1] == ("branchSummary", "what happened over there")
    file.append(RawEntry({"type": "reset_boundary"}))
    file.append_message(user("fresh"))
    assert texts(build_context(file)) == [("user", "fresh")]


def test_failed_turns_and_dangling_tool_calls_are_dropped(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    file.append_message(user("q1"))
    call = ToolCall(id="c1", name="bash", arguments={"command": "ls"})
    file.append_message(assistant("trying", calls=(call,), stop="aborted"))
    file.append_message(tool_result("c1", "Tool execution was aborted"))
    file.append_message(user("q2"))
    file.append_message(assistant("", stop="error"))
    file.append_message(user("q3"))
    thinking = ThinkingContent(thinking="hmm", thinkingSignature="sig")
    file.append_message(AssistantMessage(
        content=[thinking, TextContent(text="ok"), ToolCall(id="c2", name="bash", arguments={})],
        api="x", provider="fake", model="m", usage=Usage.zero(), stopReason="toolUse",
        timestamp=4))
    messages = build_context(file)
    assert texts(messages) == [("user", "q1"), ("user", "q2"), ("user", "q3"),
                               ("assistant", "ok")]
    last = messages[-1]
    assert isinstance(last, AssistantMessage)
    assert [type(b).__name__ for b in last.content] == ["ThinkingContent", "TextContent"]
    assert isinstance(last.content[0], ThinkingContent)
    assert last.content[0].thinkingSignature is msgspec.UNSET


def test_empty_and_reset_leaf(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    assert build_context(file) == []
    assert file.leaf_id is None
    file.append_message(user("q"))
    file.move_leaf(None)
    assert build_context(file) == []
    root = file.append_message(user("new root"))
    assert root.parentId is None
    assert texts(build_context(file)) == [("user", "new root")]


# --- paging ----------------------------------------------------------------------------------


def test_paging() -> None:
    messages: list[AgentMessage] = [user(f"m{n}") for n in range(5)]
    first = page(messages, None, 2, "sid", "leaf")
    assert texts(first.messages) == [("user", "m0"), ("user", "m1")]
    assert first.totalMessages == 5
    assert isinstance(first.nextCursor, str)
    assert "=" not in first.nextCursor
    decoded = json.loads(base64.urlsafe_b64decode(first.nextCursor + "=="))
    assert decoded == {"version": 1, "sessionId": "sid", "leafId": "leaf", "messageCount": 5,
                       "offset": 2}
    assert list(decoded) == ["version", "sessionId", "leafId", "messageCount", "offset"]
    second = page(messages, first.nextCursor, 2, "sid", "leaf")
    assert texts(second.messages) == [("user", "m2"), ("user", "m3")]
    assert isinstance(second.nextCursor, str)
    last = page(messages, second.nextCursor, 2, "sid", "leaf")
    assert texts(last.messages) == [("user", "m4")]
    assert last.nextCursor is msgspec.UNSET
    assert "nextCursor" not in msgspec.json.decode(msgspec.json.encode(last))
    # Default limit, empty list.
    assert len(page(messages, None, None, "sid", "leaf").messages) == 5
    assert msgspec.json.encode(page([], None, None, "sid", None)) == (
        b'{"messages":[],"totalMessages":0}')


def test_paging_errors() -> None:
    messages: list[AgentMessage] = [user(f"m{n}") for n in range(3)]
    cursor = page(messages, None, 1, "sid", "leaf").nextCursor
    assert isinstance(cursor, str)
    # Stale after an append, a leaf move, or another session.
    for args in (([*messages, user("new")], "sid", "leaf"), (messages, "sid", "other"),
                 (messages, "sid2", "leaf")):
        with pytest.raises(PageError, match="RPC message cursor is stale") as info:
            page(args[0], cursor, 1, args[1], args[2])
        assert info.value.code == "stale_cursor"
    for bad in ("", "!!!", "abc", base64.urlsafe_b64encode(b'{"version":2}').decode(),
                encode_cursor("sid", "leaf", 3, 4).rstrip("=")):
        with pytest.raises(PageError, match="Invalid RPC message cursor") as info:
            page(messages, bad, 1, "sid", "leaf")
        assert info.value.code is None
    for limit in (0, 257, -1, 1.5, "10", True):
        with pytest.raises(PageError, match="RPC message page limit must be between 1 and 256"):
            page(messages, None, limit, "sid", "leaf")
    assert len(page(messages, None, 256, "sid", "leaf").messages) == 3
    assert decode_cursor(encode_cursor("s", None, 0, 0)).leafId is None


def test_page_byte_cap() -> None:
    big = "x" * (300 * 1024)
    messages: list[AgentMessage] = [user(big), user(big), user(big), user("small")]
    first = page(messages, None, 10, "s", "l")
    assert len(first.messages) == 2
    assert isinstance(first.nextCursor, str)
    huge: list[AgentMessage] = [user("y" * (900 * 1024)), user("z")]
    only = page(huge, None, 10, "s", "l")
    assert len(only.messages) == 1  # the first message always goes


# --- locations -------------------------------------------------------------------------------


def test_cwd_encoding(tmp_path: Path) -> None:
    home, tmp = "/home/user", "/tmp"
    assert encode_cwd("/home/user/proj/x", home=home, tmp=tmp) == "-proj-x"
    assert encode_cwd("/home/user", home=home, tmp=tmp) == "-"
    assert encode_cwd("/tmp/abc/d", home=home, tmp=tmp) == "-tmp-abc-d"
    assert encode_cwd("/tmp", home=home, tmp=tmp) == "-tmp"
    assert encode_cwd("/work/repo", home=home, tmp=tmp) == "--work-repo--"
    assert encode_cwd("/home/user2/p", home=home, tmp=tmp) == "--home-user2-p--"
    # The sample's directory: a cwd outside home and the temp dir gets pi's form.
    assert encode_cwd("/home/user/project", home="/nonexistent", tmp="/nonexistent-tmp") == (
        "--home-user-project--")
    assert sessions_dir("/agent", "/work/repo", home=home, tmp=tmp) == Path(
        "/agent/sessions/--work-repo--")
    # Symlinks are resolved.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert encode_cwd(tmp_path / "link", home="/nonexistent", tmp=tmp_path) == "-tmp-real"


def test_newest_session(tmp_path: Path) -> None:
    assert newest_session(tmp_path / "missing") is None
    assert newest_session(tmp_path) is None
    older = SessionFile.create(tmp_path, cwd="/p")
    older.append_message(user("q"))
    newer = SessionFile.create(tmp_path, cwd="/p")
    (tmp_path / "junk.jsonl").write_text("not a session\n")
    os.utime(older.path, (1_000_000, 1_000_000))
    os.utime(newer.path, (2_000_000, 2_000_000))
    os.utime(tmp_path / "junk.jsonl", (3_000_000, 3_000_000))
    assert newest_session(tmp_path) == newer.path
    assert newest_session(tmp_path, non_empty=True) == older.path


@needs_samples
def test_set_name_keeps_an_omp_title_slot_in_step(tmp_path: Path) -> None:
    path = tmp_path / SAMPLE_1.name
    shutil.copyfile(SAMPLE_1, path)
    file = SessionFile.open(path)
    file.set_name("Renamed ü")
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
    assert path.read_bytes().split(b"\n", 1)[0] == first
    assert SessionFile.open(path).name == "x" * 300


@needs_samples
def test_newest_session_accepts_the_title_slot_layout(tmp_path: Path) -> None:
    shutil.copyfile(SAMPLE_1, tmp_path / SAMPLE_1.name)
    assert newest_session(tmp_path, non_empty=True) == tmp_path / SAMPLE_1.name


def test_appended_entries_are_on_disk_immediately(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    entry = file.append_message(user("q"))
    assert isinstance(entry, MessageEntry)
    assert lines_of(file.path)[-1]["id"] == entry.id
    assert file.path.read_bytes().endswith(b"\n")
