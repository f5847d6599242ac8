"""Pure parts of omp.llm: error mapping, retry-after, SSE decoding, partial JSON, thinking."""

from __future__ import annotations

import email.utils
import time

import httpx
import pytest

from omp.llm import errors, thinking
from omp.llm.sse import SseDecoder, SseEvent
from omp.llm.stream import parse_partial_json
from omp.protocol.payloads import Model, ModelCost


@pytest.mark.parametrize(("status", "message", "kind"), [
    (401, "invalid x-api-key", "auth"),
    (403, "forbidden", "auth"),
    (429, "Rate limit reached for requests", "rate_limit"),
    (429, "You exceeded your current quota, please check your plan", "bad_request"),
    (503, "Service Unavailable", "overloaded"),
    (529, "Overloaded", "overloaded"),
    (500, "Internal server error", "server"),
    (502, "Bad gateway", "server"),
    (400, "This model's maximum context length is 128000 tokens", "context_overflow"),
    (400, "prompt is too long: 210000 tokens > 200000 maximum", "context_overflow"),
    (400, "The input token count (1200000) exceeds the maximum number of tokens allowed",
     "context_overflow"),
    (413, "Request Entity Too Large", "context_overflow"),
    (400, "messages: field required", "bad_request"),
])
def test_kind_for_status(status: int, message: str, kind: str) -> None:
    assert errors.kind_for_status(status, message) == kind
    error = errors.ProviderError(kind=errors.kind_for_status(status, message), message=message)
    assert error.retryable == (kind in {"rate_limit", "overloaded", "server", "network"})


def test_retry_after_sources() -> None:
    parse = errors.parse_retry_after
    assert parse(httpx.Headers({"retry-after": "3"})) == 3.0
    assert parse(httpx.Headers({"retry-after-ms": "1500", "retry-after": "9"})) == 1.5
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    got = parse(httpx.Headers({"retry-after": when}))
    assert got is not None
    assert 27 <= got <= 30
    assert parse(httpx.Headers({"x-ratelimit-reset-requests": "1m6s"})) == 66.0
    assert parse(httpx.Headers({"x-ratelimit-reset-tokens": "250ms"})) == 0.25
    google = {"error": {"code": 429, "details": [
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "12s"}]}}
    assert parse(httpx.Headers(), google) == 12.0
    assert parse(httpx.Headers()) is None


def test_messages_from_bodies_and_paths_scrubbed() -> None:
    assert errors.message_from_body({"error": {"message": "bad key"}}, "x") == "bad key"
    assert errors.message_from_body([{"error": {"message": "g"}}], "x") == "g"
    assert errors.message_from_body("plain text", "x") == "plain text"
    assert errors.message_from_body(None, "fallback") == "fallback"
    assert errors.scrub("cannot open /home/alice/.omp/agent/auth.json now") == (
        "cannot open <path> now")
    assert errors.scrub("https://api.example.com/v1/messages") == (
        "https://api.example.com/v1/messages")


def test_from_exception_maps_transport_failures() -> None:
    err = errors.from_exception(httpx.ConnectError("connection refused"), "p", "m")
    assert (err.kind, err.retryable, err.provider, err.model) == ("network", True, "p", "m")
    assert err.message == "Network error: connection refused"
    timeout = errors.from_exception(httpx.ReadTimeout("slow"), "p", "m")
    assert timeout.kind == "network"
    dropped = errors.from_exception(httpx.RemoteProtocolError("peer closed"), "p", "m")
    assert dropped.message.startswith("Connection dropped before the response was complete")
    kept = errors.ProviderError(kind="auth", message="no")
    assert errors.from_exception(kept, "p", "m") is kept
    assert (kept.provider, kept.model) == ("p", "m")


def test_stream_errors_by_type() -> None:
    assert errors.from_stream_error("Overloaded", "p", "m",
                                    error_type="overloaded_error").kind == "overloaded"
    assert errors.from_stream_error("x", "p", "m",
                                    error_type="rate_limit_error").kind == "rate_limit"
    assert errors.from_stream_error("prompt is too long", "p", "m").kind == "context_overflow"
    assert errors.from_stream_error("bad", "p", "m",
                                    error_type="invalid_request_error").kind == "bad_request"


def test_sse_decoder_split_anywhere() -> None:
    stream = (b"event: message_start\ndata: {\"a\":1}\n\n: keep-alive\n\n"
              b"data: line one\r\ndata: line two\r\n\r\ndata:nospace\n\nevent: x\n")
    expected = [SseEvent("message_start", '{"a":1}'), SseEvent(None, "line one\nline two"),
                SseEvent(None, "nospace")]
    for cut in range(len(stream) + 1):
        decoder = SseDecoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) + decoder.close()
        assert got == expected, cut


def test_sse_event_without_trailing_blank_line_is_kept_at_close() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.close() == [SseEvent(None, "[DONE]")]


@pytest.mark.parametrize(("text", "expected"), [
    ("", {}),
    ('{"path": "a.txt"}', {"path": "a.txt"}),
    ('{"path": "hel', {"path": "hel"}),
    ('{"a": [1, 2', {"a": [1, 2]}),
    ('{"a": 1, "b', {"a": 1}),
    ('{"a": 1, "b":', {"a": 1}),
    ('{"a": "x\\"y', {"a": 'x"y'}),
    ("[1, 2]", {}),
    ("not json", {}),
])
def test_partial_json(text: str, expected: dict[str, object]) -> None:
    assert parse_partial_json(text) == expected


def test_anthropic_budget_leaves_room_for_the_answer() -> None:
    small = Model(id="m", name="m", api="anthropic-messages", provider="p", baseUrl="",
                  reasoning=True, input=["text"],
                  cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                  contextWindow=1000, maxTokens=3000)
    # high wants 16384 but the model can write only 3000 tokens: 1976 for thinking.
    assert thinking.anthropic_thinking(small, "high", 2000) == (
        {"type": "enabled", "budget_tokens": 1976}, 3000)
    tiny = Model(id="m", name="m", api="anthropic-messages", provider="p", baseUrl="",
                 reasoning=True, input=["text"],
                 cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                 contextWindow=1000, maxTokens=1500)
    assert thinking.anthropic_thinking(tiny, "high", 1000) == (None, 1000)
