"""The pure parts of ACP mode: titles, kinds, locations, plans, prompt blocks, stop reasons
(docs/guides/acp.md#prompts-and-updates), and that our wire types fit the protocol's schema
models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from omp.acp import wire as w
from omp.acp.updates import plan_of, tool_call, tool_kind, tool_locations, tool_title
from omp.acp.views import prompt_text, stop_reason
from omp.protocol import events as ev
from omp.protocol import messages as m
from omp.protocol.commands import TodoItem, TodoPhase

schema = pytest.importorskip("acp.schema")


def test_titles_kinds_and_locations(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("x")
    assert tool_title("bash", {"command": "echo hi"}, "run it") == "$ echo hi"
    assert tool_title("read", {"path": "notes.txt"}, "read notes") == "read notes"
    assert tool_title("write", {"path": "out.txt"}, None) == "write: out.txt"
    assert tool_title("read", {"path": "xd://dev"}, None) == "xd://dev"
    assert tool_title("todo", {}, None) == "todo"
    assert [tool_kind(n, {}) for n in ("read", "edit", "bash", "grep", "web_search", "todo",
                                       "mystery")] == [
        "read", "edit", "execute", "search", "fetch", "think", "other"]
    assert tool_kind("write", {"path": "xd://propose"}) == "execute"
    assert tool_locations("read", {"path": "notes.txt"}, tmp_path) == [
        w.Location(path=str(tmp_path / "notes.txt"))]
    # read: only an existing file; never a URL.
    assert tool_locations("read", {"path": "missing.txt"}, tmp_path) == []
    assert tool_locations("write", {"path": "new.txt"}, tmp_path) == [
        w.Location(path=str(tmp_path / "new.txt"))]
    assert tool_locations("write", {"path": "mem://x"}, tmp_path) == []


def test_a_tool_call_leaves_the_intent_out_of_raw_input(tmp_path: Path) -> None:
    call = tool_call("c1", "bash", {"command": "ls", "i": "list files"}, "list files", tmp_path)
    assert call.rawInput == {"command": "ls"}
    assert call.title == "$ ls"
    assert call.content == [w.ToolCallContent(content=w.TextContent(text="$ ls"))]


def test_plan_maps_every_task_of_every_phase() -> None:
    phases = [TodoPhase(name="a", tasks=[TodoItem(content="one", status="completed"),
                                         TodoItem(content="two", status="abandoned")]),
              TodoPhase(name="b", tasks=[TodoItem(content="three", status="blocked"),
                                         TodoItem(content="four", status="in_progress")])]
    assert [(e.content, e.status) for e in plan_of(phases).entries] == [
        ("one", "completed"), ("two", "completed"), ("three", "pending"),
        ("four", "in_progress")]


def test_prompt_blocks_become_one_prompt() -> None:
    blocks = msgspec.json.decode(
        b'[{"type":"text","text":"do it"},{"type":"resource_link","uri":"file:///y.txt",'
        b'"name":"y.txt"},{"type":"resource","resource":{"uri":"file:///e","text":'
        b'"embedded text"}},{"type":"image","data":"AAAA","mimeType":"image/png"},'
        b'{"type":"audio","data":"AAAA","mimeType":"audio/wav"}]', type=list[w.ContentBlock])
    text, images = prompt_text(blocks)
    assert text == "do it\n\ny.txt\n\nembedded text\n\n[audio omitted]"
    assert images == [m.ImageContent(data="AAAA", mimeType="image/png")]


def _assistant(stop: m.StopReason, error: str | None = None) -> m.AssistantMessage:
    usage = m.Usage(input=1, output=1, cacheRead=0, cacheWrite=0, totalTokens=2,
                    cost=m.UsageCost(input=0, output=0, cacheRead=0, cacheWrite=0, total=0))
    return m.AssistantMessage(content=[], api="x", provider="p", model="m", usage=usage,
                              stopReason=stop, timestamp=0,
                              errorMessage=error if error is not None else msgspec.UNSET)


def test_stop_reasons() -> None:
    done = ev.PromptResult(id="acp-1", agentInvoked=True, status="completed",
                           sessionSettled=True)
    aborted = ev.PromptResult(id="acp-1", agentInvoked=True, status="aborted",
                              sessionSettled=True)
    assert stop_reason(done, [_assistant("stop")]) == "end_turn"
    assert stop_reason(aborted, [_assistant("aborted")]) == "cancelled"
    assert stop_reason(done, [_assistant("length")]) == "max_tokens"
    assert stop_reason(done, [_assistant("error", "blocked by content_filter")]) == "refusal"
    assert stop_reason(done, [_assistant("error", "HTTP 500")]) == "end_turn"
    assert stop_reason(done, []) == "end_turn"


def test_our_updates_fit_the_published_schema() -> None:
    updates: list[w.SessionUpdate] = [
        w.AgentMessageChunk(content=w.TextContent(text="hi"), messageId="m1"),
        w.ToolCall(toolCallId="c", title="t", kind="execute", status="pending", rawInput={}),
        w.ToolCallUpdate(toolCallId="c", status="completed", rawOutput={"content": []},
                         content=[w.ToolCallContent(content=w.TextContent(text="out"))]),
        w.Plan(entries=[w.PlanEntry(content="x", priority="medium", status="pending")]),
        w.UsageUpdate(size=10, used=1, cost=w.Cost(amount=0.5, currency="USD")),
        w.SessionInfoUpdate(updatedAt="2026-12-03T00:00:00.000Z"),
    ]
    for update in updates:
        data = msgspec.json.encode(w.SessionNotification(sessionId="s", update=update))
        parsed = schema.SessionNotification.model_validate_json(data)
        assert parsed.update.session_update == update.__struct_config__.tag


def test_our_requests_to_the_editor_fit_the_published_schema() -> None:
    terminal = w.ToolCallUpdate(toolCallId="c", status="in_progress",
                                content=[w.ToolCallTerminal(terminalId="term-1")])
    parsed = schema.SessionNotification.model_validate_json(
        msgspec.json.encode(w.SessionNotification(sessionId="s", update=terminal)))
    assert parsed.update.content[0].terminal_id == "term-1"
    requests: list[tuple[msgspec.Struct, Any]] = [
        (w.CreateTerminalParams(sessionId="s", command="bash", args=["-c", "ls"], cwd="/tmp",
                                outputByteLimit=51200), schema.CreateTerminalRequest),
        (w.TerminalParams(sessionId="s", terminalId="t"), schema.TerminalOutputRequest),
        (w.TerminalParams(sessionId="s", terminalId="t"), schema.WaitForTerminalExitRequest),
        (w.TerminalParams(sessionId="s", terminalId="t"), schema.KillTerminalRequest),
        (w.TerminalParams(sessionId="s", terminalId="t"), schema.ReleaseTerminalRequest),
        (w.CreateElicitationParams(mode="form", sessionId="s", message="Sure?", requestedSchema={
            "type": "object", "properties": {"value": {"type": "boolean"}},
            "required": ["value"]}), schema.CreateFormSessionElicitationRequest),
    ]
    for ours, theirs in requests:
        theirs.model_validate_json(msgspec.json.encode(ours))
