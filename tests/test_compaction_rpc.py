"""Compaction through the real ``omp --mode rpc`` process and the fake LLM server
(docs/design/sessions.md#compaction, docs/design/protocol.md#session-events,
docs/design/sessions.md#when-compaction-runs).

Each test checks what a host sees: the ``compact`` response (``CompactionResult``), the
``auto_compaction_start`` / ``auto_compaction_end`` frames, the live context (``get_messages``),
the session entries and file, and the requests the fake LLM received (the summary request is
one model call with the current model, recognised by its system prompt).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import trio
from agent_helpers import (
    FAKE_ARGS,
    AgentHarness,
    Frame,
    of_type,
    open_agent,
    request_messages,
    text_reply,
    tool_call,
    tools_reply,
)

from omp.session.compaction import SHORT_SUMMARY_PROMPT, SUMMARY_PROMPT, SUMMARY_SYSTEM_PROMPT
from omp.testing.fake_llm import FakeLLM

TEST_TIMEOUT = 90
SUMMARY_MARK = "context summarization assistant"
"""A phrase of the summariser's system prompt: only summary requests contain it."""
assert SUMMARY_MARK in SUMMARY_SYSTEM_PROMPT
SUMMARY = "## Goal\nParse config.yml and report the keys.\n\n## Next Steps\n1. Add tests."
OVERFLOW = ("This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 131072 tokens. Please reduce the length of the messages.")
FOCUS = "Focus on the YAML parser decisions"

QUESTIONS = (
    "Question one: please read config.yml and tell me which keys it defines.",
    "Question two: should the parser reject unknown keys or ignore them?",
    "Question three: write down the plan for the tests of the parser.",
)
ANSWERS = (
    "config.yml defines three keys: name, port and debug. The port is an integer and debug is "
    "a boolean; name is a free-form string.",
    "Reject them: an unknown key is almost always a typo, and silently ignoring it hides the "
    "mistake until much later. The error should name the key and its line.",
    "Plan: one test per key type, one for an unknown key, one for a missing file, and one for "
    "invalid YAML, each asserting the exact error message the user sees.",
)
KEEP_RECENT = 75
"""keepRecentTokens for the tests: the last turn (question + answer, ~55 estimated tokens) fits,
with the answer before it (~95) it does not."""


def summary_reply(*pieces: str | float, hang: bool = False,
                  repeat: bool = False) -> dict[str, Any]:
    reply = text_reply(*(pieces or (SUMMARY,)), usage={"input": 400, "output": 60})
    reply["match"] = {"bodyContains": SUMMARY_MARK}
    if hang:
        reply["hangAfter"] = 0
    if repeat:
        reply["repeat"] = True
    return reply


def answer(text: str, prompt_tokens: int = 1000) -> dict[str, Any]:
    return text_reply(text, usage={"input": prompt_tokens, "output": 40})


def write_settings(agent_dir: Path, **compaction: Any) -> None:
    (agent_dir / "config.yml").write_text(json.dumps({"compaction": compaction}) + "\n")


def content_text(content: Any) -> str:
    """The text of a message's ``content`` as a provider request or a host sees it."""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


SHORT_SUMMARY = "I set up config parsing; tests come next."
SHORT_REPLY: dict[str, Any] = {
    **text_reply(SHORT_SUMMARY), "repeat": True,
    "match": {"bodyContains": "like the description of a pull request"}}
"""Answers the second, short request of every compaction (omp's ``shortSummary``)."""
assert "like the description of a pull request" in SHORT_SUMMARY_PROMPT


def is_summary_request(fake: FakeLLM, index: int) -> bool:
    return SUMMARY_MARK.encode() in fake.requests[index].body


async def prompt(agent: AgentHarness, text: str) -> list[Frame]:
    """Send a prompt and return its frames up to ``session_settled``."""
    request_id = await agent.send("prompt", message=text)
    frames = await agent.until_settled()
    (response,) = [f for f in frames if f["type"] == "response" and f.get("id") == request_id]
    assert response["success"], response
    return frames


async def three_turns(agent: AgentHarness) -> None:
    """The conversation the manual-compaction tests start from; the first turn reads a file."""
    for question in QUESTIONS:
        frames = await prompt(agent, question)
        (result,) = of_type(frames, "prompt_result")
        assert result["status"] == "completed", result


def three_turn_script() -> list[dict[str, Any]]:
    return [
        tools_reply(tool_call("call_read", "read", {"path": "config.yml"}),
                    text="Reading config.yml."),
        answer(ANSWERS[0]),
        answer(ANSWERS[1]),
        answer(ANSWERS[2]),
    ]


def summarised(messages: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(role, text) of messages, for readable comparisons."""
    out = []
    for message in messages:
        role = message["role"]
        text = (message["summary"] if role == "compactionSummary"
                else content_text(message.get("content", "")))
        out.append((role, text))
    return out


# --- manual compaction ---------------------------------------------------------------------------


async def test_manual_compact_with_custom_instructions(tmp_path: Path,
                                                       isolated_agent_dir: Path) -> None:
    """``compact {customInstructions}``: the result, the summary request, the new context, a
    second compaction refused, the entry on disk, and the same context after ``--continue``."""
    (tmp_path / "config.yml").write_text("name: demo\nport: 8080\ndebug: true\n")
    write_settings(isolated_agent_dir, keepRecentTokens=KEEP_RECENT)
    script = [SHORT_REPLY, summary_reply(), *three_turn_script()]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await three_turns(agent)
            before = (await agent.data("get_messages"))["messages"]
            assert [m["role"] for m in before] == [
                "user", "assistant", "toolResult", "assistant", "user", "assistant", "user",
                "assistant"]
            turn_requests = len(agent.fake.requests)

            result = await agent.data("compact", customInstructions=FOCUS)

            # One summary request, with the current model, then the short one.
            assert len(agent.fake.requests) == turn_requests + 2
            assert is_summary_request(agent.fake, -2)
            body = agent.fake.requests[-2].json()
            assert body["model"] == "fake-model"
            assert "tools" not in body or not body["tools"]
            assert result["shortSummary"] == SHORT_SUMMARY
            sent = request_messages(agent.fake, -2)
            assert [m["role"] for m in sent] in (["system", "user"], ["developer", "user"])
            assert content_text(sent[0]["content"]) == SUMMARY_SYSTEM_PROMPT
            request_text = content_text(sent[1]["content"])
            # The serialised conversation: everything before the kept last turn.
            conversation = (
                f"<conversation>\n[User]: {QUESTIONS[0]}\n\n"
                f"[Assistant]: Reading config.yml.\n\n"
                f'[Assistant tool calls]: read(path="config.yml")\n\n'
                f"[Tool result]: ")
            assert request_text.startswith(conversation), request_text[:600]
            assert f"[Assistant]: {ANSWERS[0]}" in request_text
            assert f"[User]: {QUESTIONS[1]}\n\n[Assistant]: {ANSWERS[1]}\n</conversation>" in (
                request_text)
            assert QUESTIONS[2] not in request_text  # the kept turn is not summarised
            assert SUMMARY_PROMPT in request_text
            assert request_text.endswith(f"\n\nAdditional focus: {FOCUS}")

            # The CompactionResult.
            assert set(result) <= {"summary", "shortSummary", "firstKeptEntryId",
                                   "tokensBefore", "details", "preserveData"}
            assert result["summary"] == SUMMARY + "\n\n<read-files>\nconfig.yml\n</read-files>"
            assert result["details"] == {"readFiles": ["config.yml"], "modifiedFiles": []}
            assert isinstance(result["tokensBefore"], int)
            assert result["tokensBefore"] >= 1040  # the last reported prompt + reply size

            # firstKeptEntryId names the entry of the first kept message: question three.
            entries = (await agent.data("get_entries"))["entries"]
            by_id = {e["id"]: e for e in entries}
            kept = by_id[result["firstKeptEntryId"]]
            assert kept["type"] == "message"
            assert kept["message"]["role"] == "user"
            assert content_text(kept["message"]["content"]) == QUESTIONS[2]
            (compaction,) = [e for e in entries if e["type"] == "compaction"]
            assert compaction["summary"] == result["summary"]
            assert compaction["firstKeptEntryId"] == result["firstKeptEntryId"]
            assert compaction["tokensBefore"] == result["tokensBefore"]
            assert compaction["details"] == result["details"]
            assert entries[-1] == compaction  # the leaf moved to it

            # The live context: the summary, then the kept messages unchanged.
            after = (await agent.data("get_messages"))["messages"]
            assert after[0]["role"] == "compactionSummary"
            assert after[0]["summary"] == result["summary"]
            assert after[0]["tokensBefore"] == result["tokensBefore"]
            assert after[1:] == before[-2:]
            state = await agent.data("get_state")
            assert state["messageCount"] == 3
            assert state["isCompacting"] is False

            # Nothing is left to compact right after (the kept turn fits keepRecentTokens).
            again = await agent.call("compact")
            assert (again.success, again.error) == (
                False, "Nothing to compact (session too small)")
            assert len(agent.fake.requests) == turn_requests + 2
            assert (await agent.data("get_messages"))["messages"] == after

            # No auto_compaction_* frames for a manual compaction.
            assert of_type(await agent.quiet(),
                           "auto_compaction_start", "auto_compaction_end") == []
            assert of_type(agent.frames, "auto_compaction_start", "auto_compaction_end") == []
            session_file = Path(state["sessionFile"])

        # On disk: the compaction entry, as get_entries showed it.
        text = await trio.Path(session_file).read_text()
        lines = [json.loads(line) for line in text.splitlines()]
        on_disk = [line for line in lines if line.get("type") == "compaction"]
        assert len(on_disk) == 1
        assert on_disk[0]["id"] == compaction["id"]
        assert on_disk[0]["firstKeptEntryId"] == result["firstKeptEntryId"]
        assert on_disk[0]["summary"] == result["summary"]

        # A new process continuing the session rebuilds the same context.
        async with open_agent(tmp_path, isolated_agent_dir, [],
                              args=(*FAKE_ARGS, "--continue")) as agent:
            state = await agent.data("get_state")
            assert state["sessionFile"] == str(session_file)
            resumed = (await agent.data("get_messages"))["messages"]
            assert summarised(resumed) == summarised(after)
            # The rebuilt summary carries the entry's timestamp; the live one was stamped by a
            # separate clock read just before the entry was written (a millisecond may tick).
            assert abs(resumed[0].pop("timestamp") - after[0].pop("timestamp")) <= 50
            assert resumed == after


async def test_compact_before_any_turn_and_after_one_turn(tmp_path: Path,
                                                          isolated_agent_dir: Path) -> None:
    """An empty or one-turn session has nothing to summarise: no model call is made."""
    script = [SHORT_REPLY, summary_reply(), answer(ANSWERS[0])]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            empty = await agent.call("compact")
            assert (empty.success, empty.error) == (
                False, "Nothing to compact (session too small)")
            await prompt(agent, QUESTIONS[0])
            small = await agent.call("compact", customInstructions=FOCUS)
            assert (small.success, small.error) == (
                False, "Nothing to compact (session too small)")
            assert not any(is_summary_request(agent.fake, i)
                           for i in range(len(agent.fake.requests)))
            assert len((await agent.data("get_messages"))["messages"]) == 2


async def test_the_model_sees_the_summary_after_compaction(tmp_path: Path,
                                                          isolated_agent_dir: Path) -> None:
    """The next turn's request carries the summary (convertToLlm turns ``compactionSummary``
    into a user message holding ``<summary>…</summary>``,
    docs/design/agent-loop.md#what-the-model-is-sent) instead of the summarised turns."""
    (tmp_path / "config.yml").write_text("name: demo\n")
    write_settings(isolated_agent_dir, keepRecentTokens=KEEP_RECENT)
    script = [SHORT_REPLY, summary_reply(), *three_turn_script(), answer("Understood.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await three_turns(agent)
            await agent.data("compact")
            await prompt(agent, "Go on with the plan.")
            sent = request_messages(agent.fake, -1)
            text = "\n".join(content_text(m.get("content") or "") for m in sent)
            assert QUESTIONS[0] not in text  # summarised away
            assert QUESTIONS[2] in text  # kept
            assert f"<summary>\n{SUMMARY}" in text, [m["role"] for m in sent]


async def test_context_usage_after_compaction_ignores_the_old_anchor(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """After a compaction the provider-reported size of a turn from before it measures a
    context that no longer exists: ``contextUsage`` is re-estimated locally
    (docs/design/sessions.md#context-usage)."""
    (tmp_path / "config.yml").write_text("name: demo\n")
    write_settings(isolated_agent_dir, keepRecentTokens=KEEP_RECENT)
    big = 60_000
    script = [SHORT_REPLY, summary_reply(),
              tools_reply(tool_call("c1", "read", {"path": "config.yml"})),
              answer(ANSWERS[0], big), answer(ANSWERS[1], big), answer(ANSWERS[2], big)]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await three_turns(agent)
            assert (await agent.data("get_state"))["contextUsage"]["tokens"] >= big
            result = await agent.data("compact")
            assert result["tokensBefore"] >= big
            usage = (await agent.data("get_state"))["contextUsage"]
            stats = (await agent.data("get_session_stats"))["contextUsage"]
            assert usage == stats
            assert usage["tokens"] < big, usage


# --- overflow -------------------------------------------------------------------------------------


async def test_context_overflow_compacts_and_runs_the_turn_again(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """A prompt the model refuses as too long: ``auto_compaction_start {reason: overflow}``, the
    summary call, ``auto_compaction_end {willRetry: true, result}``, then the turn runs again and
    answers; one ``prompt_result`` (completed); the error is not in the live context."""
    # Only the question that overflowed (~16 estimated tokens) is kept.
    write_settings(isolated_agent_dir, keepRecentTokens=20)
    script = [
        SHORT_REPLY,
        summary_reply(),
        answer(ANSWERS[0]),
        answer(ANSWERS[1]),
        {"status": 400, "body": {"error": {"message": OVERFLOW, "type": "invalid_request_error",
                                           "code": "context_length_exceeded"}}},
        answer("Here is the plan for the parser tests."),
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await prompt(agent, QUESTIONS[0])
            await prompt(agent, QUESTIONS[1])
            request_id = await agent.send("prompt", message=QUESTIONS[2])
            frames = await agent.until_settled()
            assert await agent.quiet() == []

            types = [f["type"] for f in frames]
            start_at = types.index("auto_compaction_start")
            end_at = types.index("auto_compaction_end")
            assert types.count("auto_compaction_start") == types.count("auto_compaction_end") == 1
            start, end = frames[start_at], frames[end_at]
            assert start["reason"] == "overflow"
            assert start.get("action", "context-full") == "context-full"
            assert end["willRetry"] is True
            assert end["aborted"] is False
            assert "errorMessage" not in end
            result = end["result"]
            assert result["summary"] == SUMMARY
            assert isinstance(result["firstKeptEntryId"], str)
            assert result["firstKeptEntryId"]
            assert result["tokensBefore"] > 0

            # The failed turn first: its assistant message ends with the provider's error.
            failed = [f["message"] for f in of_type(frames[:start_at], "message_end")
                      if f["message"]["role"] == "assistant"]
            assert len(failed) == 1
            assert failed[0]["stopReason"] == "error"
            assert "maximum context length" in failed[0]["errorMessage"]
            # No agent_end between the failed attempt and the compaction
            # (docs/design/protocol.md#one-terminal-agent_end): the overflow is said by a warning
            # notice instead.
            assert "agent_end" not in types[:start_at]
            (notice,) = of_type(frames, "notice")
            assert notice["level"] == "warning"
            assert "context window" in notice["message"]
            assert start_at < types.index("notice") < end_at
            # The summary request between the two, then the turn again, answered.
            assert is_summary_request(agent.fake, 3)  # then the short summary request
            assert len(agent.fake.requests) == 6
            rerun = [f["message"] for f in of_type(frames[end_at:], "message_end")
                     if f["message"]["role"] == "assistant"]
            assert [content_text(m["content"]) for m in rerun] == [
                "Here is the plan for the parser tests."]
            assert rerun[0]["stopReason"] == "stop"
            assert "agent_end" in types[end_at:]
            # The re-run sends the same question again (not a second copy of it).
            sent = request_messages(agent.fake, 5)
            assert content_text(sent[-1]["content"]) == QUESTIONS[2]
            assert sum(content_text(m.get("content") or "") == QUESTIONS[2] for m in sent) == 1

            # One terminal agent_end for the whole run, with the re-run's messages.
            (agent_end,) = of_type(frames, "agent_end")
            assert agent_end["isTerminal"] is True
            assert [m["role"] for m in agent_end["messages"]] == ["assistant"]
            results = of_type(frames, "prompt_result")
            assert [(r["id"], r["status"]) for r in results] == [(request_id, "completed")]
            assert types.index("prompt_result") > end_at
            assert types.count("session_settled") == 1

            # The live context: summary, the question, the answer; no trace of the error.
            messages = (await agent.data("get_messages"))["messages"]
            assert summarised(messages) == [
                ("compactionSummary", SUMMARY), ("user", QUESTIONS[2]),
                ("assistant", "Here is the plan for the parser tests.")]
            assert "maximum context length" not in json.dumps(messages)
            entries = (await agent.data("get_entries"))["entries"]
            (compaction,) = [e for e in entries if e["type"] == "compaction"]
            assert compaction["firstKeptEntryId"] == result["firstKeptEntryId"]
            assert compaction["shortSummary"] == SHORT_SUMMARY == result["shortSummary"]


OVERFLOW_REPLY = {"status": 400, "body": {"error": {
    "message": OVERFLOW, "type": "invalid_request_error", "code": "context_length_exceeded"}}}


async def test_overflow_with_nothing_to_compact_ends_the_prompt(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """The very first prompt overflows: nothing can be summarised, so no retry follows; the
    prompt ends with the error and a terminal ``agent_end``."""
    script = [SHORT_REPLY, summary_reply(), OVERFLOW_REPLY]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            request_id = await agent.send("prompt", message=QUESTIONS[0])
            frames = await agent.until_settled()
            assert await agent.quiet() == []
            assert len(agent.fake.requests) == 1  # no summary call, no second attempt
            # The recovery is still said: one start/end pair, skipped (issue 21).
            assert [f["reason"] for f in of_type(frames, "auto_compaction_start")] == [
                "overflow"]
            assert of_type(frames, "auto_compaction_end") == [{
                "type": "auto_compaction_end", "action": "context-full", "aborted": False,
                "willRetry": False, "errorMessage": "Nothing to compact (session too small)",
                "skipped": True}]
            results = of_type(frames, "prompt_result")
            assert [(r["id"], r["status"]) for r in results] == [(request_id, "error")]
            assert "maximum context length" in results[0]["error"]["message"]
            ends = of_type(frames, "agent_end")
            assert ends, frames
            assert ends[-1].get("isTerminal", True) is True, ends[-1]


async def test_second_overflow_after_recovery_ends_the_prompt(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """The re-run after an overflow compaction overflows again: one recovery only; the prompt
    ends with the error, the last ``agent_end`` is terminal."""
    write_settings(isolated_agent_dir, keepRecentTokens=20)
    script = [SHORT_REPLY, summary_reply(), answer(ANSWERS[0]), OVERFLOW_REPLY, OVERFLOW_REPLY]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await prompt(agent, QUESTIONS[0])
            request_id = await agent.send("prompt", message=QUESTIONS[1])
            frames = await agent.until_settled()
            assert await agent.quiet() == []
            starts = of_type(frames, "auto_compaction_start")
            assert [f["reason"] for f in starts] == ["overflow"]
            # turn, overflow, summary (and its short form), overflow again
            assert len(agent.fake.requests) == 5
            results = of_type(frames, "prompt_result")
            assert [(r["id"], r["status"]) for r in results] == [(request_id, "error")]
            ends = of_type(frames, "agent_end")
            assert [e["isTerminal"] for e in ends] == [True], ends


async def test_context_overflow_with_auto_compaction_off_is_an_error(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``set_auto_compaction false``: an overflow is the prompt's error, nothing is compacted."""
    script = [
        SHORT_REPLY,
        summary_reply(),
        answer(ANSWERS[0]),
        {"status": 400, "body": {"error": {"message": OVERFLOW, "type": "invalid_request_error",
                                           "code": "context_length_exceeded"}}},
    ]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await prompt(agent, QUESTIONS[0])
            await agent.data("set_auto_compaction", enabled=False)
            frames = await prompt(agent, QUESTIONS[1])
            assert of_type(frames, "auto_compaction_start", "auto_compaction_end") == []
            (result,) = of_type(frames, "prompt_result")
            assert result["status"] == "error"
            assert "maximum context length" in result["error"]["message"]
            assert len(agent.fake.requests) == 2


# --- threshold -----------------------------------------------------------------------------------


async def test_threshold_auto_compaction_and_set_auto_compaction(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """A tiny threshold: after a turn ``auto_compaction_start {reason: threshold}`` and
    ``auto_compaction_end {willRetry: false, result}``; ``set_auto_compaction false`` stops it
    and ``get_state.autoCompactionEnabled`` follows."""
    write_settings(isolated_agent_dir, thresholdTokens=1, keepRecentTokens=1)
    script = [SHORT_REPLY, summary_reply(repeat=True), answer(ANSWERS[0]), answer(ANSWERS[1]),
              answer(ANSWERS[2]), answer("Fourth answer.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            assert (await agent.data("get_state"))["autoCompactionEnabled"] is True

            frames = await prompt(agent, QUESTIONS[0])
            types = [f["type"] for f in frames]
            (start,) = of_type(frames, "auto_compaction_start")
            (end,) = of_type(frames, "auto_compaction_end")
            assert start["reason"] == "threshold"
            assert (end["willRetry"], end["aborted"]) == (False, False)
            assert end["result"]["summary"] == SUMMARY
            # Maintenance runs before the run's agent_end, which is held until it is done.
            assert (types.index("auto_compaction_start") < types.index("auto_compaction_end")
                    < types.index("agent_end") < types.index("session_settled"))
            assert types.count("agent_start") == 1  # no retry, no continuation
            (result,) = of_type(frames, "prompt_result")
            assert result["status"] == "completed"
            assert is_summary_request(agent.fake, -2)  # the summary, then its short form
            messages = (await agent.data("get_messages"))["messages"]
            # keepRecentTokens 1: only the newest cut point (the answer) is kept.
            assert summarised(messages) == [("compactionSummary", SUMMARY),
                                            ("assistant", ANSWERS[0])]
            entries = (await agent.data("get_entries"))["entries"]
            assert [e for e in entries if e["type"] == "compaction"][-1][
                "firstKeptEntryId"] == end["result"]["firstKeptEntryId"]

            # The next turn compacts again, merging into the previous summary.
            frames = await prompt(agent, QUESTIONS[1])
            assert [f["reason"] for f in of_type(frames, "auto_compaction_start")] == [
                "threshold"]
            sent = request_messages(agent.fake, -2)  # -1: the short summary
            assert f"<previous-summary>\n{SUMMARY}\n</previous-summary>" in content_text(
                sent[-1]["content"])

            # Off: no compaction events, and the state says so.
            off = await agent.call("set_auto_compaction", enabled=False)
            assert off.success
            assert (await agent.data("get_state"))["autoCompactionEnabled"] is False
            requests = len(agent.fake.requests)
            frames = await prompt(agent, QUESTIONS[2])
            assert of_type(frames, "auto_compaction_start", "auto_compaction_end") == []
            assert len(agent.fake.requests) == requests + 1
            assert not is_summary_request(agent.fake, -1)
            assert len((await agent.data("get_messages"))["messages"]) == 4

            # On again.
            await agent.data("set_auto_compaction", enabled=True)
            assert (await agent.data("get_state"))["autoCompactionEnabled"] is True
            frames = await prompt(agent, "Fourth question.")
            assert [f["reason"] for f in of_type(frames, "auto_compaction_start")] == [
                "threshold"]


async def test_terminal_agent_end_comes_after_threshold_compaction(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """When a host sees the terminal ``agent_end`` the session is idle: a prompt is accepted
    even though a threshold compaction followed the turn (its summary is slow here)."""
    write_settings(isolated_agent_dir, thresholdTokens=1, keepRecentTokens=1)
    script = [SHORT_REPLY, summary_reply(1.0, SUMMARY, repeat=True), answer(ANSWERS[0]),
              answer(ANSWERS[1])]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message=QUESTIONS[0])
            await agent.until(lambda f: f["type"] == "agent_end"
                              and f.get("isTerminal", True) is True)
            second = await agent.call("prompt", message=QUESTIONS[1])
            assert (second.success, second.error) == (True, msgspec.UNSET), second
            await agent.until(lambda f: f["type"] == "prompt_result"
                              and f.get("id") == second.id)


async def test_settings_can_disable_auto_compaction(tmp_path: Path,
                                                    isolated_agent_dir: Path) -> None:
    """``compaction.enabled: false`` in config.yml: off from the start."""
    write_settings(isolated_agent_dir, enabled=False, thresholdTokens=1, keepRecentTokens=1)
    script = [SHORT_REPLY, summary_reply(repeat=True), answer(ANSWERS[0])]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            assert (await agent.data("get_state"))["autoCompactionEnabled"] is False
            frames = await prompt(agent, QUESTIONS[0])
            assert of_type(frames, "auto_compaction_start", "auto_compaction_end") == []
            assert len(agent.fake.requests) == 1


# --- abort ----------------------------------------------------------------------------------------


async def test_abort_cancels_a_manual_compaction(tmp_path: Path,
                                                 isolated_agent_dir: Path) -> None:
    """``abort`` while the summary call hangs: ``compact`` fails with ``Compaction cancelled``,
    the context and the file are unchanged, and a later ``compact`` works."""
    (tmp_path / "config.yml").write_text("name: demo\n")
    write_settings(isolated_agent_dir, keepRecentTokens=KEEP_RECENT)
    script = [SHORT_REPLY, summary_reply(hang=True), *three_turn_script()]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await three_turns(agent)
            before = (await agent.data("get_messages"))["messages"]
            entries_before = (await agent.data("get_entries"))["entries"]
            turn_requests = len(agent.fake.requests)

            compact_id = await agent.send("compact", customInstructions=FOCUS)
            await agent.fake.wait_until(lambda fake: len(fake.requests) > turn_requests)
            assert is_summary_request(agent.fake, -1)
            abort = await agent.call("abort")
            assert abort.success
            frames = await agent.until_response(compact_id)
            response = frames[-1]
            assert (response["success"], response["error"]) == (False, "Compaction cancelled")
            with trio.fail_after(5):
                await agent.fake.wait_for_disconnect()  # the summary stream was closed

            assert (await agent.data("get_messages"))["messages"] == before
            assert (await agent.data("get_entries"))["entries"] == entries_before
            assert (await agent.data("get_state"))["isCompacting"] is False
            assert of_type(agent.frames, "auto_compaction_start", "auto_compaction_end") == []

            # Not stuck: the next compaction goes through.
            agent.fake.add(summary_reply())
            result = await agent.data("compact")
            assert result["summary"].startswith(SUMMARY)
            messages = (await agent.data("get_messages"))["messages"]
            assert messages[0]["role"] == "compactionSummary"
            assert messages[1:] == before[-2:]


async def test_abort_cancels_a_threshold_compaction(tmp_path: Path,
                                                    isolated_agent_dir: Path) -> None:
    """``abort`` while an automatic compaction's summary call hangs: ``auto_compaction_end
    {aborted: true, willRetry: false}``, and the context is left as the turn made it."""
    write_settings(isolated_agent_dir, thresholdTokens=1, keepRecentTokens=1)
    script = [SHORT_REPLY, summary_reply(hang=True), answer(ANSWERS[0])]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message=QUESTIONS[0])
            await agent.until_type("auto_compaction_start")
            await agent.fake.wait_until(lambda fake: len(fake.requests) == 2)
            abort = await agent.call("abort")
            assert abort.success
            frames = await agent.until_settled()
            (end,) = of_type(frames, "auto_compaction_end")
            assert (end["aborted"], end["willRetry"]) == (True, False)
            assert "result" not in end
            assert len(of_type(agent.frames, "prompt_result")) == 1
            messages = (await agent.data("get_messages"))["messages"]
            assert summarised(messages) == [("user", QUESTIONS[0]), ("assistant", ANSWERS[0])]
            entries = (await agent.data("get_entries"))["entries"]
            assert [e for e in entries if e["type"] == "compaction"] == []
            state = await agent.data("get_state")
            assert (state["isStreaming"], state["isCompacting"]) == (False, False)


async def test_compact_aborts_the_run_in_progress(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    """``compact`` while a prompt streams: the run is aborted first (its prompt answered
    ``aborted``), then the context is compacted."""
    write_settings(isolated_agent_dir, keepRecentTokens=KEEP_RECENT)
    script = [SHORT_REPLY, summary_reply(), answer(ANSWERS[0]), answer(ANSWERS[1]),
              {"chunks": [{"text": "Working on it"}], "hangAfter": 1}]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await prompt(agent, QUESTIONS[0])
            await prompt(agent, QUESTIONS[1])
            prompt_id = await agent.send("prompt", message=QUESTIONS[2])
            await agent.until(lambda f: f["type"] == "message_update"
                              and f["assistantMessageEvent"]["type"] == "text_delta")
            compact_id = await agent.send("compact")
            frames = await agent.until_response(compact_id)
            response = frames[-1]
            assert response["success"], response
            results = [f for f in agent.frames if f["type"] == "prompt_result"
                       and f.get("id") == prompt_id]
            assert [r["status"] for r in results] == ["aborted"]
            messages = (await agent.data("get_messages"))["messages"]
            assert messages[0]["role"] == "compactionSummary"
            assert QUESTIONS[0] not in json.dumps(messages[1:])
            state = await agent.data("get_state")
            assert (state["isStreaming"], state["isCompacting"]) == (False, False)
