"""What a session file holds for the agent (omp.session.context): the live context of the
current branch, its settings, and the listings of the whole file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from session_helpers import assistant, conversation, texts, tool_result, user

from omp.protocol.messages import (
    AssistantMessage,
    CompactionSummaryMessage,
    TextContent,
    ThinkingContent,
    ToolCall,
    Usage,
    UserMessage,
)
from omp.session.context import branch_settings, build_context, entries_since, user_messages
from omp.session.entries import RawEntry
from omp.session.file import SessionFile

# --- the live context (docs/design/sessions.md#the-live-context) ---------------------------------


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


def append_lines(file: SessionFile, records: list[dict[str, Any]]) -> None:
    with file.path.open("a") as handle:
        for record in records:
            handle.write(json.dumps(record, separators=(",", ":")) + "\n")


@pytest.mark.parametrize("layout", ["current", "with an unknown entry"])
def test_retry_recovery_turns_are_left_out(tmp_path: Path, layout: str) -> None:
    """omp marks a turn replaced by a retry with ``retryRecovery`` (a key this port does not
    model); it stays in the file but not in the context, whichever way the file loads."""
    file = conversation(tmp_path)
    records: list[dict[str, Any]] = []
    parent = file.leaf_id
    for n, flag in enumerate((True, False, None)):
        message = msgspec.to_builtins(assistant(f"retry {n}"))
        if flag is not None:
            message["retryRecovery"] = flag
        records.append({"type": "message", "id": f"bbbb000{n}", "parentId": parent,
                        "timestamp": "2026-01-01T00:00:00.000Z", "message": message})
        parent = f"bbbb000{n}"
    if layout != "current":  # the careful loader, which keeps every line as a dict
        records.append({"type": "ttsr_injection", "id": "bbbb0009", "parentId": parent,
                        "timestamp": "2026-01-01T00:00:00.000Z"})
    append_lines(file, records)
    reopened = SessionFile.open(file.path)
    assert reopened.problems == []
    assert len(reopened.entries) == len(file.entries) + len(records)
    assert texts(build_context(reopened))[-3:] == [
        ("assistant", "a2"), ("assistant", "retry 1"), ("assistant", "retry 2")]


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


# --- branch settings -----------------------------------------------------------------------------


def test_branch_settings_follow_the_path(tmp_path: Path) -> None:
    file = SessionFile.create(tmp_path, cwd="/p")
    assert branch_settings(file).has_thinking_entry is False
    file.append_message(assistant("inferred"))
    assert branch_settings(file).models == {"default": "fake/fake-model"}
    fork = file.leaf_id
    # pi's shape of model_change, a role, a null level, a service tier.
    file.append(RawEntry({"type": "model_change", "provider": "pi", "modelId": "m1"}))
    file.append_model_change("omp", "small", role="smol")
    file.append_thinking_level(None)
    file.append_service_tier("priority")
    file.append_message(assistant("later"))  # an explicit default is not overridden
    settings = branch_settings(SessionFile.open(file.path))
    assert settings.models == {"default": "pi/m1", "smol": "omp/small"}
    assert (settings.thinking_level, settings.configured_thinking_level) == (None, None)
    assert settings.has_thinking_entry is True
    assert settings.service_tier == "priority"
    file.move_leaf(fork)
    assert branch_settings(file).models == {"default": "fake/fake-model"}
    assert branch_settings(file).service_tier is None


# --- listings ------------------------------------------------------------------------------------


def test_user_messages_cover_every_branch(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    file.move_leaf(file.entries[3].id)  # back to a1
    file.append_message(user("q2 again"))
    file.append_message(UserMessage(content=[], timestamp=9))  # empty text: skipped
    assert [t for _, t in user_messages(file)] == ["q1", "q2", "q2 again"]
    assert texts(build_context(file)) == [("user", "q1"), ("assistant", "a1"),
                                          ("user", "q2 again"), ("user", "")]


def test_entries_since(tmp_path: Path) -> None:
    file = conversation(tmp_path)
    ids = [e.id for e in file.entries]
    assert entries_since(file) == file.entries
    assert [e.id for e in entries_since(file, ids[3])] == ids[4:]
    assert entries_since(file, ids[-1]) == []
    with pytest.raises(KeyError, match="unknown1"):
        entries_since(file, "unknown1")
