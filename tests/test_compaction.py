"""Compaction: token estimates, the threshold, cut points, the summary request and call."""

from __future__ import annotations

from typing import Any

import httpx
import msgspec
import pytest

from omp.llm.errors import ProviderError
from omp.llm.types import StreamOptions
from omp.protocol import messages as m
from omp.protocol.payloads import CompactionDetails, CompactionResult, Model, ModelCost
from omp.session.compaction import (
    IMAGE_TOKENS,
    SHORT_SUMMARY_PROMPT,
    SUMMARY_PROMPT,
    SUMMARY_SYSTEM_PROMPT,
    UPDATE_SUMMARY_PROMPT,
    anchored_context_tokens,
    compact,
    compaction_threshold,
    effective_reserve_tokens,
    estimate_context_tokens,
    estimate_tokens,
    file_operations,
    find_cut_point,
    serialize_conversation,
    should_compact,
    summarize,
    summary_max_tokens,
    summary_request,
)
from omp.session.settings import CompactionSettings
from omp.testing.fake_llm import FakeLLM, open_fake_llm

DEFAULTS = CompactionSettings()
PNG = m.ImageContent(data="iVBORw0KGgo=", mimeType="image/png")


def user(text: str, ts: int = 1) -> m.UserMessage:
    return m.UserMessage(content=text, timestamp=ts)


def tokens(n: int) -> str:
    """Text estimated at exactly ``n`` tokens."""
    return "x" * (4 * n)


def assistant(*blocks: m.AssistantContent, usage: m.Usage | None = None,
              stop: m.StopReason = "stop", ts: int = 1) -> m.AssistantMessage:
    return m.AssistantMessage(content=list(blocks), api="openai-completions", provider="openai",
                              model="gpt-test", usage=usage or m.Usage.zero(), stopReason=stop,
                              timestamp=ts)


def text(value: str) -> m.TextContent:
    return m.TextContent(text=value)


def call(call_id: str, name: str, **arguments: Any) -> m.ToolCall:
    return m.ToolCall(id=call_id, name=name, arguments=arguments)


def result(call_id: str, value: str, name: str = "read") -> m.ToolResultMessage:
    return m.ToolResultMessage(toolCallId=call_id, toolName=name, content=[text(value)],
                               isError=False, timestamp=1)


def usage(*, input: int = 0, output: int = 0, context: int | None = None) -> m.Usage:
    zero = m.Usage.zero()
    return m.Usage(input=input, output=output, cacheRead=0, cacheWrite=0,
                   totalTokens=input + output, cost=zero.cost,
                   contextTokens=msgspec.UNSET if context is None else context)


def make_model(llm: FakeLLM, *, context_window: int | None = 128_000,
               max_tokens: int | None = 16_384) -> Model:
    return Model(id="gpt-test", name="GPT Test", api="openai-completions", provider="openai",
                 baseUrl=llm.base_url + "/v1", reasoning=False, input=["text"],
                 cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                 contextWindow=context_window, maxTokens=max_tokens)


# --- token estimation ----------------------------------------------------------------------------


def test_estimates_are_utf8_bytes_over_four_rounded_up() -> None:
    assert estimate_tokens(user("")) == 0
    assert estimate_tokens(user("hello")) == 2  # 5 bytes
    assert estimate_tokens(user("abcd")) == 1
    assert estimate_tokens(user("日本語")) == 3  # 9 bytes
    assert estimate_tokens(m.UserMessage(content=[text("abcdefgh"), PNG, PNG], timestamp=1)) == (
        2 + 2 * IMAGE_TOKENS)


def test_assistant_estimate_counts_text_thinking_and_tool_calls() -> None:
    message = assistant(m.ThinkingContent(thinking="hmm?"), text("ok"),
                        call("c1", "read", path="a.py"))
    # "hmm?" 4 + "ok" 2 + "read" 4 + '{"path":"a.py"}' 15 = 25 bytes
    assert estimate_tokens(message) == 7


def test_other_kinds_are_estimated_by_what_the_model_reads() -> None:
    assert estimate_tokens(result("c1", tokens(10))) == 10
    bash = m.BashExecutionMessage(command="ls", output="a.txt\nb", cancelled=False,
                                  truncated=False, timestamp=1, exitCode=0)
    assert estimate_tokens(bash) == 3  # 2 + 7 bytes
    excluded = m.BashExecutionMessage(command="ls", output="a.txt", cancelled=False,
                                      truncated=False, timestamp=1, excludeFromContext=True)
    assert estimate_tokens(excluded) == 0
    summary = m.CompactionSummaryMessage(summary=tokens(5), tokensBefore=999, timestamp=1)
    assert estimate_tokens(summary) == 5
    custom = m.CustomMessage(customType="note", content=tokens(3), display=True, timestamp=1)
    assert estimate_tokens(custom) == 3


def test_context_tokens_are_the_last_usage_plus_what_follows() -> None:
    # No usage anywhere: everything is estimated.
    messages: list[m.AgentMessage] = [user(tokens(10)), assistant(text(tokens(5)))]
    assert estimate_context_tokens(messages) == 15
    messages = [user(tokens(10)), assistant(text(tokens(5)), usage=usage(input=1000, output=50)),
                result("c1", tokens(7)), user(tokens(3))]
    assert estimate_context_tokens(messages) == 1050 + 7 + 3
    # contextTokens wins over the total when the provider reported it.
    messages[1] = assistant(text("x"), usage=usage(input=1000, output=50, context=1200))
    assert estimate_context_tokens(messages) == 1200 + 10
    # A failed or aborted reply does not anchor: the previous good one does.
    messages.append(assistant(text(tokens(2)), usage=usage(input=5000), stop="error"))
    messages.append(assistant(text(tokens(1)), usage=usage(input=6000), stop="aborted"))
    assert estimate_context_tokens(messages) == 1200 + 10 + 2 + 1


def test_the_request_overhead_counts_only_before_the_first_usage() -> None:
    # The system prompt and tools are inside the provider's count once there is one; before,
    # they are estimated with everything else (and only then computed: Maintenance).
    first = [user(tokens(10))]
    assert anchored_context_tokens(first) is None
    assert estimate_context_tokens(first, overhead=500) == 510
    reply = assistant(text(tokens(5)), usage=usage(input=600, output=5))
    answered: list[m.AgentMessage] = [*first, reply, user(tokens(3))]
    assert anchored_context_tokens(answered) == 605 + 3
    assert estimate_context_tokens(answered, overhead=500) == 605 + 3


def test_usage_from_before_a_compaction_is_ignored() -> None:
    summary = m.CompactionSummaryMessage(summary=tokens(20), tokensBefore=150_000, timestamp=100)
    kept = assistant(text(tokens(4)), usage=usage(input=150_000), ts=50)
    assert estimate_context_tokens([summary, kept, user(tokens(6), ts=110)]) == 20 + 4 + 6
    fresh = assistant(text(tokens(4)), usage=usage(input=900, output=100), ts=120)
    assert estimate_context_tokens([summary, kept, user(tokens(6), ts=110), fresh,
                                    user(tokens(2), ts=130)]) == 1000 + 2


# --- when ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("window", "reserve", "threshold"), [
    (200_000, 30_000, 170_000), (128_000, 19_200, 108_800), (32_000, 16_384, 15_616),
    (16_000, 2_400, 13_600),
])
def test_omp_default_reserve_and_threshold(window: int, reserve: int, threshold: int) -> None:
    # The examples of docs/design/sessions.md#settings-and-threshold.
    assert effective_reserve_tokens(window, DEFAULTS) == reserve
    assert compaction_threshold(window, DEFAULTS) == threshold


def test_explicit_reserve_tokens() -> None:
    pi_like = CompactionSettings(reserveTokens=16384)
    assert compaction_threshold(200_000, pi_like) == 183_616
    # A reserve that leaves less than 15% of the window falls back to 15%.
    assert effective_reserve_tokens(20_000, CompactionSettings(reserveTokens=18_000)) == 3_000


def test_threshold_tokens_and_percent_win_and_are_clamped() -> None:
    assert compaction_threshold(200_000, CompactionSettings(thresholdTokens=50_000)) == 50_000
    assert compaction_threshold(200_000, CompactionSettings(thresholdTokens=900_000)) == 199_999
    assert compaction_threshold(200_000, CompactionSettings(thresholdPercent=80)) == 160_000
    assert compaction_threshold(200_000, CompactionSettings(thresholdPercent=150)) == 198_000
    assert compaction_threshold(200_000, CompactionSettings(thresholdPercent=0.5)) == 2_000
    both = CompactionSettings(thresholdTokens=50_000, thresholdPercent=80)
    assert compaction_threshold(200_000, both) == 50_000


def test_should_compact_above_the_threshold_only() -> None:
    assert not should_compact(170_000, 200_000, DEFAULTS)
    assert should_compact(170_001, 200_000, DEFAULTS)
    assert not should_compact(170_001, 200_000, CompactionSettings(enabled=False))
    assert not should_compact(10_000_000, None, DEFAULTS)  # unknown window
    assert not should_compact(10_000_000, 0, DEFAULTS)


# --- cut points ----------------------------------------------------------------------------------


def test_nothing_to_compact() -> None:
    assert find_cut_point([], 100) is None
    assert find_cut_point([user(tokens(10)), assistant(text(tokens(10)))], 100) is None
    # One huge message: the only cut point is the start.
    assert find_cut_point([user(tokens(500))], 100) is None


def test_keeps_the_oldest_suffix_that_fits() -> None:
    messages: list[m.AgentMessage] = [user(tokens(400)), assistant(text(tokens(400))),
                                      user(tokens(400)), assistant(text(tokens(400)))]
    assert find_cut_point(messages, 900) == 2
    assert find_cut_point(messages, 799) == 3
    assert find_cut_point(messages, 1200) == 1


def test_newest_cut_point_is_kept_even_when_it_alone_is_too_big() -> None:
    messages: list[m.AgentMessage] = [user(tokens(10)), assistant(call("c1", "read", path="x")),
                                      result("c1", tokens(5000))]
    assert find_cut_point(messages, 100) == 1


def test_never_cuts_at_a_tool_result() -> None:
    messages: list[m.AgentMessage] = [
        user(tokens(100)),
        assistant(call("c1", "read", path="a"), call("c2", "read", path="b")),
        result("c1", tokens(100)), result("c2", tokens(100)),
        assistant(text(tokens(10))),
    ]
    # 4 + 3 + 2 = 210 tokens fit 215, but a suffix cannot start at a tool result; with the
    # call (8 tokens) it is 218.
    assert find_cut_point(messages, 215) == 4
    assert find_cut_point(messages, 218) == 1


def test_never_cuts_between_a_tool_call_and_its_result() -> None:
    note = m.CustomMessage(customType="note", content="n", display=False, timestamp=1)
    messages: list[m.AgentMessage] = [
        user(tokens(100)), assistant(call("c1", "bash", command="make")), note,
        result("c1", tokens(5), name="bash"), assistant(text(tokens(5))),
    ]
    # The note (11 tokens with what follows) fits 15 but sits between c1 and its result: the
    # cut cannot be there; with the call itself (6 tokens) the suffix is 17.
    assert find_cut_point(messages, 15) == 4
    assert find_cut_point(messages, 17) == 1


def test_file_operations() -> None:
    messages: list[m.AgentMessage] = [
        assistant(call("1", "read", path="src/a.py"), call("2", "read", path="src/b.py")),
        assistant(call("3", "edit", path="src/b.py", oldText="x", newText="y"),
                  call("4", "write", path="new.txt", content="z"),
                  call("5", "bash", command="ls"), call("6", "read", offset=3)),
    ]
    previous = CompactionDetails(readFiles=["old.md"], modifiedFiles=["gone.py"])
    assert file_operations(messages, previous) == CompactionDetails(
        readFiles=["old.md", "src/a.py"], modifiedFiles=["gone.py", "new.txt", "src/b.py"])


# --- the summary request -------------------------------------------------------------------------

CONVERSATION: list[m.AgentMessage] = [
    user("Fix the failing test in tests/test_a.py"),
    assistant(m.ThinkingContent(thinking="Read it first."), text("Let me look."),
              call("c1", "read", path="tests/test_a.py"),
              call("c2", "bash", command="pytest -q", timeout=60)),
    result("c1", "def test_a(): assert add(1, 2) == 4"),
    result("c2", "1 failed", name="bash"),
    m.BashExecutionMessage(command="git status", output="M a.py", cancelled=False,
                           truncated=False, timestamp=1, exitCode=0),
    assistant(text("The expected value is wrong.")),
]
SERIALIZED = """\
[User]: Fix the failing test in tests/test_a.py

[Assistant thinking]: Read it first.

[Assistant]: Let me look.

[Assistant tool calls]: read(path="tests/test_a.py"); bash(command="pytest -q", timeout=60)

[Tool result]: def test_a(): assert add(1, 2) == 4

[Tool result]: 1 failed

[User]: Ran `git status`
```
M a.py
```

[Assistant]: The expected value is wrong."""


def test_summary_request_text() -> None:
    context = summary_request(CONVERSATION, None, None)
    assert context.system_prompt == (SUMMARY_SYSTEM_PROMPT,)
    assert context.tools == ()
    (message,) = context.messages
    assert isinstance(message, m.UserMessage)
    assert message.content == [text(f"<conversation>\n{SERIALIZED}\n</conversation>\n\n"
                                     f"{SUMMARY_PROMPT}")]
    assert "## Goal" in SUMMARY_PROMPT
    assert "### In Progress" in SUMMARY_PROMPT
    assert "untrusted" in SUMMARY_SYSTEM_PROMPT


def test_update_request_with_previous_summary_and_focus() -> None:
    context = summary_request(CONVERSATION[:1], "## Goal\nOld goal", "  the test names  ")
    (message,) = context.messages
    assert isinstance(message, m.UserMessage)
    assert message.content == [text(
        "<conversation>\n[User]: Fix the failing test in tests/test_a.py\n</conversation>\n\n"
        "<previous-summary>\n## Goal\nOld goal\n</previous-summary>\n\n"
        f"{UPDATE_SUMMARY_PROMPT}\n\nAdditional focus: the test names")]


def test_long_tool_results_are_truncated() -> None:
    serialized = serialize_conversation([result("c1", "a" * 2000), result("c2", "b" * 2500)])
    assert serialized == ("[Tool result]: " + "a" * 2000 + "\n\n[Tool result]: " + "b" * 2000
                          + "\n\n[... 500 more characters truncated]")


# --- the summary call against the fake server ----------------------------------------------------


async def test_summarize_sends_the_conversation_and_returns_the_summary() -> None:
    script = [{"chunks": [{"text": "## Goal\n"}, {"text": "Fix test_a"}]}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        summary = await summarize(make_model(llm), StreamOptions(api_key="sk-test"),
                                  CONVERSATION, None, "Keep the test names", http=client)
        (request,) = llm.requests
    assert summary == "## Goal\nFix test_a"
    body = request.json()
    assert request.path == "/v1/chat/completions"
    assert body["messages"][0] == {"role": "system", "content": SUMMARY_SYSTEM_PROMPT}
    sent = body["messages"][1]
    assert sent["role"] == "user"
    assert f"<conversation>\n{SERIALIZED}\n</conversation>" in sent["content"]
    assert sent["content"].endswith("\n\nAdditional focus: Keep the test names")
    assert "tools" not in body


async def test_summarize_failure_is_a_provider_error() -> None:
    script = [{"status": 503, "body": {"error": {"message": "Service overloaded"}}}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        with pytest.raises(ProviderError) as caught:
            await summarize(make_model(llm), StreamOptions(api_key="sk-test"), CONVERSATION,
                            http=client)
    assert caught.value.kind == "overloaded"
    assert caught.value.http_status == 503
    assert str(caught.value) == "Summarization failed: 503 Service overloaded"


async def test_summarize_without_text_fails() -> None:
    script = [{"chunks": [{"thinking": "nothing to say", "signature": "s"}]}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        with pytest.raises(ProviderError, match="Summarization failed: the model answered with "
                                                "no text"):
            await summarize(make_model(llm), StreamOptions(api_key="sk-test"), CONVERSATION,
                            http=client)


# --- a whole compaction --------------------------------------------------------------------------


def test_summary_budget() -> None:
    llm_model = Model(id="m", name="m", api="openai-completions", provider="p", baseUrl="",
                      reasoning=False, input=["text"],
                      cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                      contextWindow=32_000, maxTokens=None)
    assert summary_max_tokens(llm_model, DEFAULTS) == 13_107  # 80% of 16384
    big = msgspec.structs.replace(llm_model, contextWindow=1_000_000)
    assert summary_max_tokens(big, DEFAULTS) == 16_384  # capped
    assert summary_max_tokens(msgspec.structs.replace(big, maxTokens=4096), DEFAULTS) == 4096
    unknown = msgspec.structs.replace(llm_model, contextWindow=None)
    assert summary_max_tokens(unknown, CompactionSettings(reserveTokens=1000)) == 800


async def test_compact_summarises_after_the_previous_summary() -> None:
    previous = m.CompactionSummaryMessage(summary="## Goal\nEarlier work", tokensBefore=90_000,
                                          timestamp=10)
    messages: list[m.AgentMessage] = [
        previous,
        user(tokens(300), ts=20),
        assistant(call("c1", "read", path="src/a.py"), call("c2", "edit", path="src/b.py"),
                  usage=usage(input=5000, output=100), ts=21),
        result("c1", tokens(300)), result("c2", "ok", name="edit"),
        user("What now?", ts=22),
        assistant(text(tokens(50)), usage=usage(input=6000, output=50), ts=23),
    ]
    script = [{"chunks": [{"text": "## Goal\nMerged"}]},
              {"chunks": [{"text": "I merged the work.\n"}, {"text": " Tests next."}]}]
    settings = CompactionSettings(keepRecentTokens=100)
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        plan = await compact(make_model(llm), StreamOptions(api_key="sk-test"), messages,
                             settings, custom_instructions="files", http=client)
        request, short_request = llm.requests
    assert plan is not None
    assert plan.first_kept_index == 5
    assert plan.summarized == tuple(messages[1:5])
    assert plan.kept == tuple(messages[5:])
    assert plan.details == CompactionDetails(readFiles=["src/a.py"], modifiedFiles=["src/b.py"])
    assert plan.summary == ("## Goal\nMerged\n\n<read-files>\nsrc/a.py\n</read-files>\n\n"
                            "<modified-files>\nsrc/b.py\n</modified-files>")
    assert plan.tokens_before == 6050
    summary_tokens = estimate_tokens(plan.summary_message(0))
    assert plan.tokens_after == summary_tokens + 3 + 50  # "What now?" is 9 bytes
    # omp's shortSummary: a second, short request over the summary, one line for display.
    assert plan.short_summary == "I merged the work. Tests next."
    short_body = short_request.json()
    assert short_body["messages"][1]["content"] == "## Goal\nMerged"
    assert SHORT_SUMMARY_PROMPT in short_body["messages"][0]["content"]
    assert plan.messages(99) == [
        m.CompactionSummaryMessage(summary=plan.summary, tokensBefore=6050, timestamp=99,
                                   tokensAfter=plan.tokens_after,
                                   shortSummary="I merged the work. Tests next."),
        *messages[5:]]
    assert plan.result("e5f6a7b8") == CompactionResult(
        summary=plan.summary, firstKeptEntryId="e5f6a7b8", tokensBefore=6050,
        details=plan.details, shortSummary="I merged the work. Tests next.")

    body = request.json()
    content = body["messages"][1]["content"]
    assert content.startswith("<conversation>\n[User]: " + tokens(300))
    assert "[Assistant tool calls]: read(path=\"src/a.py\"); edit(path=\"src/b.py\")" in content
    assert "What now?" not in content  # kept, not summarised
    assert "<previous-summary>\n## Goal\nEarlier work\n</previous-summary>" in content
    assert content.endswith("Additional focus: files")
    assert body["max_completion_tokens"] == 15_360  # 80% of the 19200 reserve of 128k


async def test_compact_with_nothing_to_compact_makes_no_call() -> None:
    async with open_fake_llm([]) as llm, httpx.AsyncClient() as client:
        plan = await compact(make_model(llm), StreamOptions(api_key="sk-test"),
                             [user("hi"), assistant(text("hello"))], DEFAULTS, http=client)
        assert plan is None
        assert llm.requests == []
