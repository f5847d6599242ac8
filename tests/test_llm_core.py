"""Pure parts of omp.llm: error mapping, retry-after, SSE decoding, partial JSON, thinking."""

from __future__ import annotations

import email.utils
import errno
import time

import httpx
import pytest

from omp.llm import errors, thinking
from omp.llm.builder import parse_partial_json
from omp.llm.http import stream_timeout
from omp.llm.sse import EventTooLarge, SseDecoder, SseEvent
from omp.llm.types import StreamOptions
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


def test_http_error_texts_lead_with_the_status_and_carry_type_and_code() -> None:
    text = errors.http_error_text
    # The status line, then the message with its machine fields
    # (docs/design/agent-loop.md#provider-adapters).
    assert text(400, {"error": {"message": "bad request here", "type": "server_error"}}, "") == (
        "400 bad request here\nbad request here (type=server_error)")
    overflow = {"error": {"message": "This model's maximum context length is 128000 tokens.",
                          "type": "invalid_request_error", "param": None,
                          "code": "context_length_exceeded"}}
    assert text(400, overflow, "") == (
        "400 This model's maximum context length is 128000 tokens.\n"
        "This model's maximum context length is 128000 tokens. "
        "(type=invalid_request_error code=context_length_exceeded)")
    anthropic = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert text(529, anthropic, "") == "529 Overloaded\nOverloaded (type=overloaded_error)"
    google = [{"error": {"code": 400, "message": "API key not valid.",
                         "status": "INVALID_ARGUMENT"}}]
    assert text(400, google, "") == (
        "400 API key not valid.\nAPI key not valid. (status=INVALID_ARGUMENT)")
    # Nothing to add: one line.
    assert text(401, {"error": {"message": "bad key"}}, "") == "401 bad key"
    assert text(401, {"error": "Unauthorized"}, "") == "401 Unauthorized"
    assert text(502, "<html>Bad gateway</html>", " <html>Bad gateway</html>\n") == (
        "502 <html>Bad gateway</html>")
    assert text(404, {"detail": "Not Found"}, '{"detail": "Not Found"}') == (
        '404 {"detail": "Not Found"}')
    assert text(500, "", "") == "500 status code (no body)"
    long = text(500, "x" * 10_000, "x" * 10_000)
    assert len(long) == len("500 ") + errors.MAX_DETAIL_CHARS + 1


def test_describe_error() -> None:
    assert errors.describe_error({"message": "Overloaded", "type": "overloaded_error"}) == (
        "Overloaded (type=overloaded_error)")
    assert errors.describe_error({"message": "m", "type": "t", "param": "p", "code": "c"}) == (
        "m (type=t param=p code=c)")
    assert errors.describe_error({"message": "m", "code": 503}) == "m"
    assert errors.describe_error({"type": "error", "error": {"message": "m"}}) == "m"
    assert errors.describe_error({"code": "x"}) is None


def test_paths_scrubbed() -> None:
    assert errors.scrub("cannot open /home/alice/.omp/agent/auth.json now") == (
        "cannot open <path> now")
    assert errors.scrub("https://api.example.com/v1/messages") == (
        "https://api.example.com/v1/messages")


def test_one_overflow_classifier() -> None:
    overflow = errors.is_overflow_text
    for text in ("prompt is too long: 210000 tokens > 200000 maximum",
                 "This model's maximum context length is 128000 tokens",
                 "400 bad\nbad (type=invalid_request_error code=context_length_exceeded)",
                 "Your input exceeds the context window of this model",
                 "model_context_window_exceeded",
                 "The input token count (1200000) exceeds the maximum number of tokens allowed",
                 "Please reduce the length of the messages."):
        assert overflow(text), text
    assert overflow("Request Entity Too Large", 413)
    assert not overflow("max_tokens must be at most the model's context window size")
    assert not overflow("Service Unavailable", 503)


@pytest.mark.parametrize(("text", "status", "expected"), [
    ("whatever", 429, True), ("whatever", 408, True), ("whatever", 503, True),
    ("whatever", 400, False), ("whatever", 401, False),
    ("You exceeded your current quota", 429, False),
    ("400 x\nx (type=insufficient_quota)", None, False),
    ("ECONNRESET: peer closed connection without sending complete message body", None, True),
    ("ECONNREFUSED: All connection attempts failed", None, True),
    ("The stream ended early: the connection closed before the response was complete", None,
     True),
    ("Internal error: RecursionError: maximum recursion depth exceeded", None, False),
    ("prompt is too long", 500, False),
    ("The model refused", None, False),
])
def test_one_transient_classifier(text: str, status: int | None, expected: bool) -> None:
    assert errors.is_transient_text(text, status) is expected


def test_from_exception_maps_transport_failures() -> None:
    err = errors.from_exception(httpx.ConnectError("All connection attempts failed"), "p", "m")
    assert (err.kind, err.retryable, err.provider, err.model) == ("network", True, "p", "m")
    assert err.message == "ECONNREFUSED: All connection attempts failed"
    timeout = errors.from_exception(httpx.ReadTimeout("The read operation timed out"), "p", "m")
    assert (timeout.kind, timeout.message) == (
        "network", "ETIMEDOUT: ReadTimeout: The read operation timed out")
    dropped = errors.from_exception(httpx.RemoteProtocolError("peer closed"), "p", "m")
    assert (dropped.kind, dropped.message) == ("network", "ECONNRESET: peer closed")
    reset = httpx.ReadError("reset")
    reset.__cause__ = ConnectionResetError(errno.ECONNRESET, "reset")
    assert errors.from_exception(reset, "p", "m").message == "ECONNRESET: reset"
    unreachable = httpx.ConnectError("unreachable")
    unreachable.__context__ = OSError(errno.EHOSTUNREACH, "unreachable")
    assert errors.from_exception(unreachable, "p", "m").message == "EHOSTUNREACH: unreachable"
    bad_url = errors.from_exception(httpx.UnsupportedProtocol("no scheme"), "p", "m")
    assert (bad_url.kind, bad_url.retryable) == ("bad_request", False)
    kept = errors.ProviderError(kind="auth", message="no")
    assert errors.from_exception(kept, "p", "m") is kept
    assert (kept.provider, kept.model) == ("p", "m")


def test_our_own_bugs_are_internal_and_never_retried() -> None:
    for exc in (RecursionError("maximum recursion depth exceeded"), KeyError("choices"),
                ValueError("bad")):
        err = errors.from_exception(exc, "p", "m")
        assert err.kind == "internal"
        assert not err.retryable
        assert err.message == f"Internal error: {type(exc).__name__}: {exc}"
    group = ExceptionGroup("in a nursery", [KeyError("x")])
    assert errors.from_exception(group, "p", "m").message == "Internal error: KeyError: 'x'"


def test_secrets_redacted_from_every_text() -> None:
    model = Model(id="m", name="m", api="openai-completions", provider="p",
                  baseUrl="https://user:hunter22@proxy.example/v1", reasoning=False,
                  input=["text"], cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                  contextWindow=1000, maxTokens=100,
                  headers={"x-org-token": "tok-model-123", "anthropic-version": "2023-06-01"})
    options = StreamOptions(api_key="sk-secret-1", headers={"Authorization": "Bearer tok-call"})
    secrets = errors.secrets_of(model, options)
    assert {"sk-secret-1", "tok-model-123", "tok-call", "hunter22"} <= set(secrets)
    assert "2023-06-01" not in secrets  # not an auth header
    text = ("key sk-secret-1 tok-call tok-model-123 hunter22 sk-secret-1 via "
            "https://user:hunter22@proxy.example/v1 version 2023-06-01")
    assert errors.redact(text, secrets) == (
        "key [redacted] [redacted] [redacted] [redacted] [redacted] via "
        "https://[redacted]@proxy.example/v1 version 2023-06-01")
    # URL userinfo goes even when nobody said it was a secret.
    assert errors.redact("see http://a:b@h/x") == "see http://[redacted]@h/x"
    assert errors.redact("tiny x", ["x"]) == "tiny x"  # too short to be a key
    # Longest first, in one pass: no piece of a key survives, the marker is never rewritten.
    assert errors.redact("sk-abcd-efgh", ["abcd", "sk-abcd-efgh", "dact"]) == "[redacted]"
    leaked = errors.from_exception(RuntimeError("echo sk-secret-1"), "p", "m", secrets=secrets)
    assert leaked.message == "Internal error: RuntimeError: echo [redacted]"
    passed = errors.ProviderError(kind="server", message="401 bad key sk-secret-1")
    assert errors.from_exception(passed, "p", "m", secrets=secrets).message == (
        "401 bad key [redacted]")
    assert str(passed) == "401 bad key [redacted]"


def test_stream_errors_by_type() -> None:
    assert errors.from_stream_error("Overloaded", "p", "m",
                                    error_type="overloaded_error").kind == "overloaded"
    assert errors.from_stream_error("x", "p", "m",
                                    error_type="rate_limit_error").kind == "rate_limit"
    assert errors.from_stream_error("prompt is too long", "p", "m").kind == "context_overflow"
    assert errors.from_stream_error("bad", "p", "m",
                                    error_type="invalid_request_error").kind == "bad_request"
    assert errors.from_stream_error("something broke", "p", "m").kind == "server"


def test_sse_decoder_split_anywhere() -> None:
    stream = (b"event: message_start\ndata: {\"a\":1}\n\n: keep-alive\n\n"
              b"data: line one\r\ndata: line two\r\n\r\ndata:nospace\n\n"
              + "data: h\u00e9llo \u2713\n\nevent: x\n".encode())
    expected = [SseEvent("message_start", '{"a":1}'), SseEvent(None, "line one\nline two"),
                SseEvent(None, "nospace"), SseEvent(None, "h\u00e9llo \u2713")]
    for cut in range(len(stream) + 1):
        decoder = SseDecoder()
        got = decoder.feed(stream[:cut]) + decoder.feed(stream[cut:]) + decoder.close()
        assert got == expected, cut


@pytest.mark.parametrize(("first", "idle", "read"), [(100, 120, 120), (5, 5, 5), (5, 0.2, None)])
def test_httpx_read_timeout_is_the_idle_watchdog_only_when_it_is_the_longer_one(
        first: float, idle: float, read: float | None) -> None:
    timeout = stream_timeout(StreamOptions(first_event_timeout=first, idle_timeout=idle))
    assert (timeout.connect, timeout.read, timeout.write, timeout.pool) == (30.0, read, None, None)


@pytest.mark.parametrize("size", [1, 3, 7, 100, 4096])
def test_sse_decoder_bounds_an_event_however_it_arrives(size: int) -> None:
    """One line, several data lines, a comment: past the bound, ``EventTooLarge`` as soon as
    the decoder holds more than it; an event within it passes whatever the chunking."""
    def feed(stream: bytes) -> list[SseEvent]:
        decoder = SseDecoder(max_event_bytes=100)
        got: list[SseEvent] = []
        for start in range(0, len(stream), size):
            got += decoder.feed(stream[start:start + size])
        return got + decoder.close()

    fits = b"data: " + b"x" * 94 + b"\n\n"  # 100 bytes
    assert feed(fits * 3) == [SseEvent(None, "x" * 94)] * 3
    for over in (b"data: " + b"y" * 500,  # one line, never ended
                 b"data: " + b"y" * 60 + b"\ndata: " + b"y" * 60 + b"\n\n",  # two lines
                 b": " + b"k" * 300 + b"\n\n"):  # a comment is a line too
        with pytest.raises(EventTooLarge) as caught:
            feed(over)
        assert caught.value.limit == 100
        assert caught.value.size <= 100 + max(size, 100)  # raised as soon as it was over


def test_sse_decoder_reads_a_long_line_in_pieces_linearly() -> None:
    """A 64 MiB line in 64 KiB pieces: each piece is kept as it came, joined once."""
    decoder = SseDecoder()
    piece = b"x" * 65536
    assert decoder.feed(b"data: ") == []
    for _ in range(1024):
        assert decoder.feed(piece) == []
    (event,) = decoder.feed(b"\n\n")
    assert len(event.data) == 1024 * 65536


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
