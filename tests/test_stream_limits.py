"""Bounds on what a provider may send (issue 40, item 2), through the real ``omp --mode rpc``
against the fake LLM flooding it: one 100 MB event, a stream without end, an answer that never
stops growing, keep-alives with no event, and streams that do not parse. Each fails the turn
with its reason, in bounded memory (the server's peak RSS, ``tests/procfs.py``), and only the
stall is retried."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import procfs
import trio
from agent_helpers import Frame, of_type, open_agent, text_reply

from omp.llm.types import MAX_MESSAGE_CHARS_LIMIT
from omp.protocol import messages as m
from omp.protocol.frames import MAX_REASSEMBLED_FRAME_BYTES
from omp.session.entries import MessageEntry, encode_line

LIMIT = 120.0
MIB = 1024 * 1024
EMPTY_CHUNK = 'data: {"id":"c","choices":[]}\n\n'
"""A chat-completions event that adds nothing to the answer."""
TEXT_CHUNK = ('data: {"id":"c","choices":[{"index":0,"delta":{"content":"'
              + "x" * 1000 + '"}}]}\n\n')
PEAK_GROWTH_MIB = 200
"""Generous: the bounds under test are 16 MiB (an event) and a few MiB; without them the
100 MB event alone took 1.17 GB."""


async def run_prompt(tmp_path: Path, agent_dir: Path, script: list[dict[str, Any]],
                     config: str = "", *, deltas: bool = False) -> tuple[list[Frame], float, Any]:
    """One prompt against ``script`` (``config``: the global config.yml; ``deltas``: message
    updates carry the delta only); its frames, the server's peak RSS growth over its RSS
    before the prompt (MiB), and the fake server."""
    if config:
        (agent_dir / "config.yml").write_text(config)
    with trio.fail_after(LIMIT):
        async with open_agent(tmp_path, agent_dir, script) as agent:
            if deltas:
                await agent.data("set_event_filter", messageUpdates="delta")
            before = procfs.reset_peak_rss(agent.pid)
            await agent.send("prompt", message="go", id="p")
            frames = await agent.until(lambda f: f["type"] == "prompt_result")
            growth = procfs.peak_rss_mb(agent.pid) - before
            frames += await agent.until_settled()
            return frames, growth, agent.fake


def final_error(frames: list[Frame]) -> str:
    (result,) = of_type(frames, "prompt_result")
    assert result["status"] == "error", result
    ends = [f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "assistant"]
    assert ends[-1]["stopReason"] == "error"
    text: str = ends[-1]["errorMessage"]
    return text


def session_lines(agent_dir: Path) -> list[bytes]:
    (path,) = agent_dir.rglob("*.jsonl")
    return path.read_bytes().splitlines()


async def test_a_100_mb_event_fails_at_the_event_bound(tmp_path: Path,
                                                       isolated_agent_dir: Path) -> None:
    flood = {"prefix": 'data: "', "bytes": 100_000_000, "suffix": '"\n\n'}
    frames, growth, fake = await run_prompt(tmp_path, isolated_agent_dir, [{"flood": flood}])
    assert final_error(frames) == ("Stream over a limit: an event of more than 16777216 bytes "
                                   "(stream.maxEventBytes in config.yml)")
    assert len(fake.requests) == 1  # not retried
    assert of_type(frames, "auto_retry_start") == []
    print(f"100 MB event: peak RSS growth {growth:.1f} MiB")
    assert growth < PEAK_GROWTH_MIB
    assert max(map(len, session_lines(isolated_agent_dir))) < 64 * 1024


async def test_a_stream_without_end_fails_at_the_response_bound(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    frames, growth, fake = await run_prompt(
        tmp_path, isolated_agent_dir, [{"flood": {"fill": EMPTY_CHUNK}}],
        config="stream:\n  maxResponseBytes: 8388608\n")
    assert final_error(frames) == ("Stream over a limit: more than 8388608 bytes in one "
                                   "response (stream.maxResponseBytes in config.yml)")
    assert len(fake.requests) == 1
    print(f"endless stream: peak RSS growth {growth:.1f} MiB")
    assert growth < PEAK_GROWTH_MIB


async def test_an_answer_without_end_fails_at_the_message_bound(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # Delta updates: with the default snapshots, the ~1,000 updates before the bound would
    # carry the growing message each, half a gigabyte of frames to read (a minute of the
    # suite), and the bound is the same either way.
    frames, growth, fake = await run_prompt(
        tmp_path, isolated_agent_dir, [{"flood": {"fill": TEXT_CHUNK}}],
        config="stream:\n  maxMessageChars: 1048576\n", deltas=True)
    assert final_error(frames) == ("Stream over a limit: a message of more than 1048576 "
                                   "characters (stream.maxMessageChars in config.yml)")
    assert len(fake.requests) == 1
    print(f"endless answer: peak RSS growth {growth:.1f} MiB")
    assert growth < PEAK_GROWTH_MIB
    # What arrived within the bound is kept, and its session-file line is within it too.
    (end,) = [f["message"] for f in of_type(frames, "message_end")
              if f["message"]["role"] == "assistant"]
    kept = sum(len(c.get("text", "")) for c in end["content"])
    assert 1048576 - 1000 < kept <= 1048576
    lines = session_lines(isolated_agent_dir)
    assert max(map(len, lines)) < 1048576 + 64 * 1024
    assert all(len(line) < MAX_REASSEMBLED_FRAME_BYTES for line in lines)


async def test_keep_alives_without_an_event_are_a_stall_and_retried(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # One event, then only keep-alives (before the first event the allowance is the first
    # event's timeout, 100 s).
    keep_alives = {"raw": [EMPTY_CHUNK], "flood": {"fill": ": keep-alive\n\n", "every": 0.05}}
    frames, _, fake = await run_prompt(
        tmp_path, isolated_agent_dir, [keep_alives, text_reply("recovered")],
        config="stream:\n  idleTimeoutMs: 500\nretry:\n  baseDelayMs: 1\n")
    (retry,) = of_type(frames, "auto_retry_start")
    assert retry["errorMessage"].startswith(
        "Stream stalled: no event (keep-alives only) for 0.5 s")
    assert "stream.idleTimeoutMs" in retry["errorMessage"]
    (result,) = of_type(frames, "prompt_result")
    assert result["status"] == "completed"
    assert len(fake.requests) == 2


async def test_a_stream_that_does_not_parse_fails_at_once(tmp_path: Path,
                                                          isolated_agent_dir: Path) -> None:
    frames, _, fake = await run_prompt(
        tmp_path, isolated_agent_dir, [{"raw": ["data: upstream said no", ""], "repeat": True}])
    error = final_error(frames)
    assert error.startswith("Malformed stream from fake: an event is not JSON (")
    assert error.endswith("; it sent: 'upstream said no'")
    assert len(fake.requests) == 1  # the original fails at once too
    assert of_type(frames, "auto_retry_start") == []


async def test_a_body_that_is_no_event_stream_fails_at_once_quoting_it(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    page = "<html><body><h1>502 Bad Gateway</h1></body></html>"
    frames, _, fake = await run_prompt(
        tmp_path, isolated_agent_dir,
        [{"raw": [page], "headers": {"content-type": "text/html"}, "repeat": True}])
    assert final_error(frames) == ("Malformed stream from fake: the response is not an event "
                                   f"stream; it sent: {page + chr(10)!r}")
    assert len(fake.requests) == 1
    assert msgspec.json.encode(frames).count(b"auto_retry_start") == 0


def test_the_largest_message_allowed_fits_the_largest_frame_in_the_session_file() -> None:
    """``stream.maxMessageChars`` at its most, in the characters whose JSON is longest
    (``\\u0001``: six bytes), split over text, thinking and a tool call's arguments: the
    session file's line for it is still within the largest frame the output path allows."""
    third = "\x01" * (MAX_MESSAGE_CHARS_LIMIT // 3)
    message = m.AssistantMessage(
        content=[m.ThinkingContent(thinking=third), m.TextContent(text=third),
                 m.ToolCall(id="c1", name="write", arguments={"content": third})],
        api="openai-completions", provider="fake", model="fake-model", usage=m.Usage.zero(),
        stopReason="toolUse", timestamp=1)
    line = encode_line(MessageEntry(id="0123abcd", parentId="89abcdef",
                                    timestamp="2026-12-07T00:00:00.000Z", message=message))
    assert 6 * MAX_MESSAGE_CHARS_LIMIT - 6 <= len(line) < MAX_REASSEMBLED_FRAME_BYTES
