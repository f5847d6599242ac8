"""Auto-retry policy: which failures are retried, how long to wait, and the wait on trio time."""

from __future__ import annotations

import random

import httpx
import msgspec
import pytest
import trio
import trio.testing

from omp.llm import errors
from omp.llm.builder import discard
from omp.llm.errors import ErrorKind, ProviderError
from omp.llm.stream import ModelCall
from omp.llm.types import Context, StreamOptions
from omp.protocol import messages as m
from omp.protocol.payloads import Model, ModelCost
from omp.session.retry import (
    RetryWaitTooLong,
    backoff_delay,
    is_context_overflow,
    is_transient,
    should_retry,
)
from omp.session.settings import RetrySettings
from omp.testing.fake_llm import open_fake_llm

DEFAULTS = RetrySettings()


def failed(error_message: str | None = "boom", *, stop: m.StopReason = "error",
           status: int | None = None) -> m.AssistantMessage:
    return m.AssistantMessage(
        content=[], api="openai-completions", provider="openai", model="gpt-test",
        usage=m.Usage.zero(), stopReason=stop, timestamp=1,
        errorMessage=msgspec.UNSET if error_message is None else error_message,
        errorStatus=msgspec.UNSET if status is None else status)


def problem(kind: ErrorKind, *, retry_after: float | None = None) -> ProviderError:
    return ProviderError(kind=kind, message="boom", retry_after=retry_after)


class FixedRandom(random.Random):
    """``random()`` always returns ``value``: no jitter (0.0) or the most (just under 1)."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# --- should_retry ------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "expected"), [
    ("rate_limit", True), ("overloaded", True), ("server", True), ("network", True),
    ("context_overflow", False), ("auth", False), ("bad_request", False), ("internal", False),
])
def test_retried_error_kinds(kind: ErrorKind, expected: bool) -> None:
    assert should_retry(problem(kind), failed(), DEFAULTS, 1) is expected


def test_attempts_are_limited_by_max_retries() -> None:
    error = problem("overloaded")
    assert [should_retry(error, failed(), DEFAULTS, n) for n in (1, 10, 11)] == [
        True, True, False]
    three = RetrySettings(maxRetries=3)
    assert [should_retry(error, failed(), three, n) for n in (3, 4)] == [True, False]
    assert not should_retry(error, failed(), RetrySettings(maxRetries=0), 1)
    assert not should_retry(error, failed(), DEFAULTS, 0)


def test_never_when_disabled() -> None:
    assert not should_retry(problem("rate_limit"), failed(), RetrySettings(enabled=False), 1)


@pytest.mark.parametrize("stop", ["aborted", "stop", "length", "toolUse"])
def test_only_error_stops_are_retried(stop: m.StopReason) -> None:
    assert not should_retry(problem("network"), failed(stop=stop), DEFAULTS, 1)


def test_error_without_message_is_not_retried() -> None:
    assert not should_retry(problem("server"), failed(None), DEFAULTS, 1)


@pytest.mark.parametrize(("text", "status", "expected"), [
    ("503 Service Unavailable", None, True),
    ("Overloaded", None, True),
    ("Rate limit reached for requests", None, True),
    ("Connection dropped before the response was complete: peer closed connection", None, True),
    ("Network error: ConnectError", None, True),
    ("Request timed out (ReadTimeout)", None, True),
    ("Stream stalled: no data for 120 s (stream stall timeout)", None, True),
    ("Please retry your request", None, True),
    ("whatever the body said", 429, True),
    ("whatever the body said", 502, True),
    ("whatever the body said", 408, True),
    ("Invalid schema for function 'read'", 400, False),
    ("Incorrect API key provided", 401, False),
    ("Request Entity Too Large", 413, False),
    ("prompt is too long: 210000 tokens > 200000 maximum", None, False),
    ("This model's maximum context length is 128000 tokens (500 too many)", 500, False),
    ("The model refused", None, False),
    # A stream we would not read: the same answer next time, whatever the words it quotes.
    ("Malformed stream from x: an event is not JSON (...); it sent: 'timeout, overloaded'",
     None, False),
    ("Malformed stream event: 'upstream 503'", None, False),  # stored by earlier versions
    ("Stream over a limit: an event of more than 16777216 bytes (stream.maxEventBytes in "
     "config.yml)", None, False),
    ("Stream stalled: no event (keep-alives only) for 120 s (stream stall timeout; "
     "stream.idleTimeoutMs in config.yml)", None, True),
])
def test_stored_messages_are_classified_by_status_and_text(text: str, status: int | None,
                                                           expected: bool) -> None:
    assert should_retry(None, failed(text, status=status), DEFAULTS, 1) is expected


def test_provider_error_decides_over_the_text() -> None:
    # The text looks transient, but the call said the key is wrong.
    assert not should_retry(problem("auth"), failed("503 upstream"), DEFAULTS, 1)
    assert should_retry(problem("server"), failed("odd text"), DEFAULTS, 1)


def test_context_overflow_detection() -> None:
    assert is_context_overflow(problem("context_overflow"), failed())
    assert not is_context_overflow(problem("server"), failed("prompt is too long"))
    assert is_context_overflow(None, failed("prompt is too long: 1 > 0"))
    assert is_context_overflow(None, failed("too big", status=413))
    assert not is_context_overflow(None, failed("503 Service Unavailable"))
    # The original's HTTP text: the code alone says it.
    assert is_context_overflow(None, failed(
        "400 Input too large\nInput too large (type=invalid_request_error "
        "code=context_length_exceeded)", status=400))


@pytest.mark.parametrize(("text", "status"), [
    ("prompt is too long: 210000 tokens > 200000 maximum", None),
    ("Request Entity Too Large", 413),
    ("400 x\nx (type=invalid_request_error code=context_length_exceeded)", 400),
    ("Your input exceeds the context window of this model", None),
    ("max_tokens must be below the model's context window", 400),
    ("503 Service Unavailable", 503),
    ("The input token count (1200000) exceeds the maximum number of tokens allowed", None),
])
def test_stored_and_live_overflow_agree(text: str, status: int | None) -> None:
    """One classifier: a stored message is an overflow exactly when the same text and status
    from the provider would have made a ``context_overflow`` error."""
    live = errors.kind_for_status(status or 400, text) == "context_overflow"
    assert is_context_overflow(None, failed(text, status=status)) is live
    assert errors.is_overflow_text(text, status) is live


def test_internal_errors_are_never_retried() -> None:
    # A bug of ours (a RecursionError while handling the stream), live and once stored.
    bug = errors.from_exception(RecursionError("maximum recursion depth exceeded"), "p", "m")
    stored = failed(bug.message)
    assert bug.kind == "internal"
    assert not should_retry(bug, stored, DEFAULTS, 1)
    assert not is_transient(None, stored)  # though the text says "Internal error"


async def test_real_provider_failures_from_the_fake_server() -> None:
    """The ProviderErrors a real call produces are classified as the user would expect."""
    script = [
        {"status": 429, "headers": {"retry-after": "3"},
         "body": {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}},
        {"chunks": [{"text": "partial"}], "dropAfter": 1},
        {"status": 400, "body": {"error": {"message": "This model's maximum context length is "
                                                      "128000 tokens", "type": "invalid"}}},
        {"status": 401, "body": {"error": {"message": "Incorrect API key provided"}}},
    ]
    results: list[tuple[ProviderError | None, m.AssistantMessage]] = []
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = Model(id="gpt-test", name="GPT Test", api="openai-completions",
                      provider="openai", baseUrl=llm.base_url + "/v1", reasoning=False,
                      input=["text"], cost=ModelCost(input=0, output=0, cacheRead=0,
                                                     cacheWrite=0),
                      contextWindow=128_000, maxTokens=16_384)
        for _ in script:
            call = ModelCall(model, Context(messages=(m.UserMessage(content="hi",
                                                                    timestamp=1),)),
                             StreamOptions(api_key="sk-test"))
            final = await call.run(discard, http=client)
            results.append((call.error, final))

    decisions = [should_retry(error, final, DEFAULTS, 1) for error, final in results]
    assert decisions == [True, True, False, False]
    rate_limited = results[0][0]
    assert rate_limited is not None
    assert rate_limited.retry_after == 3.0
    # The provider's retry-after is longer than the first backoff (≤ 0.5 s): it wins.
    assert backoff_delay(1, DEFAULTS, rate_limited.retry_after, random.Random(1)) == 3.0
    assert is_context_overflow(*results[2])


# --- backoff_delay -----------------------------------------------------------------------------


def test_backoff_for_a_seeded_rng() -> None:
    rng = random.Random(1234)
    delays = [backoff_delay(n, DEFAULTS, None, rng) for n in range(1, 8)]
    assert delays == [0.37919330803848267, 0.8898168502061619, 1.9962542649707067,
                      3.089024037550876, 6.1214620052724715, 6.8355448538821015,
                      6.65687303702403]
    # The same seed gives the same delays: min(500 · 2^(n-1), 8000) · (1 - random() · 0.25).
    check = random.Random(1234)
    assert delays == [min(500 * 2 ** (n - 1), 8000) * (1 - check.random() * 0.25) / 1000
                      for n in range(1, 8)]


def test_backoff_doubles_then_is_capped_at_8_seconds() -> None:
    no_jitter = FixedRandom(0.0)
    assert [backoff_delay(n, DEFAULTS, None, no_jitter) for n in range(1, 9)] == [
        0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    assert backoff_delay(1000, DEFAULTS, None, no_jitter) == 8.0


def test_jitter_takes_at_most_a_quarter_off() -> None:
    most = FixedRandom(0.999999)
    assert backoff_delay(5, DEFAULTS, None, most) == pytest.approx(6.000002)
    rng = random.Random(99)
    for n in range(1, 12):
        full = min(0.5 * 2 ** (n - 1), 8.0)
        assert 0.75 * full < backoff_delay(n, DEFAULTS, None, rng) <= full


def test_base_delay_setting_and_a_base_above_the_cap() -> None:
    no_jitter = FixedRandom(0.0)
    pi_like = RetrySettings(baseDelayMs=2000)
    assert [backoff_delay(n, pi_like, None, no_jitter) for n in (1, 2, 3, 4)] == [
        2.0, 4.0, 8.0, 8.0]
    slow = RetrySettings(baseDelayMs=10_000)
    assert [backoff_delay(n, slow, None, no_jitter) for n in (1, 2)] == [10.0, 10.0]


def test_retry_after_is_a_minimum() -> None:
    no_jitter = FixedRandom(0.0)
    assert backoff_delay(1, DEFAULTS, 3.0, no_jitter) == 3.0
    assert backoff_delay(5, DEFAULTS, 3.0, no_jitter) == 8.0  # the backoff is longer
    assert backoff_delay(1, DEFAULTS, 0.0, no_jitter) == 0.5
    assert backoff_delay(1, DEFAULTS, 300.0, no_jitter) == 300.0  # exactly maxDelayMs


def test_retry_after_beyond_max_delay_fails_the_saga() -> None:
    with pytest.raises(RetryWaitTooLong) as caught:
        backoff_delay(1, DEFAULTS, 301.0, FixedRandom(0.0))
    assert caught.value.requested_ms == 301_000
    assert caught.value.max_ms == 300_000
    assert caught.value.final_error("Rate limit reached") == (
        "Provider requested 301000ms wait, exceeds retry.maxDelayMs (300000ms). "
        "Original error: Rate limit reached")
    with pytest.raises(RetryWaitTooLong):
        backoff_delay(1, RetrySettings(maxDelayMs=1000), 1.5, FixedRandom(0.0))


def test_attempt_is_one_based() -> None:
    with pytest.raises(ValueError, match="attempt is 1-based, got 0"):
        backoff_delay(0, DEFAULTS, None, FixedRandom(0.0))


# --- a saga on trio time ------------------------------------------------------------------------


async def test_a_whole_saga_of_backoffs_in_virtual_time(autojump_clock: trio.testing.MockClock
                                                        ) -> None:
    settings = RetrySettings(maxRetries=6)
    rng = FixedRandom(0.0)
    attempt, waited = 1, []
    while should_retry(problem("overloaded"), failed(), settings, attempt):
        await trio.sleep(backoff_delay(attempt, settings, None, rng))  # as the session waits
        waited.append(trio.current_time())
        attempt += 1
    assert attempt == 7
    assert waited == [0.5, 1.5, 3.5, 7.5, 15.5, 23.5]
