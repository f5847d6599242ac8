"""Provider error texts, their classification and redaction, over real HTTP to the fake LLM.

What a host sees in ``errorMessage`` / ``errorStatus`` for each of the four APIs, that an
overflow is recognised the same way whether it came as an HTTP error, inside the stream, or from
a stored message, that a bug of ours is never retried, and that no key leaves in an error text.
(The pure parts of ``omp.llm.errors`` are tested in ``test_llm_core.py``.)
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from omp.llm import errors
from omp.llm.builder import StreamEvent
from omp.llm.stream import ModelCall
from omp.llm.types import Context, StreamOptions
from omp.protocol import messages as m
from omp.protocol.payloads import Model, ModelCost
from omp.session.retry import is_context_overflow, should_retry
from omp.session.settings import RetrySettings
from omp.testing.fake_llm import open_fake_llm

APIS = ("openai-completions", "openai-responses", "anthropic-messages", "google-generative-ai")
FREE = ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0)
KEY = "sk-live-0123456789abcdef"


def make_model(api: str, base_url: str) -> Model:
    suffix = {"openai-completions": "/v1", "openai-responses": "/v1",
              "anthropic-messages": "", "google-generative-ai": "/v1beta"}[api]
    return Model(id="test-model", name="Test", api=api, provider="test",
                 baseUrl=base_url + suffix, reasoning=False, input=["text"], cost=FREE,
                 contextWindow=128_000, maxTokens=4_096)


async def run_call(model: Model, options: StreamOptions | None = None
                   ) -> tuple[ModelCall, m.AssistantMessage]:
    def emit(event: StreamEvent) -> None:
        pass

    call = ModelCall(model, Context(messages=(m.UserMessage(content="hi", timestamp=1),)),
                     options or StreamOptions(api_key=KEY))
    async with httpx.AsyncClient() as client:
        final = await call.run(emit, http=client)
    return call, final


def error_text(final: m.AssistantMessage) -> str:
    assert isinstance(final.errorMessage, str)
    return final.errorMessage


# --- HTTP errors: the original's text, per API -------------------------------------------------

OPENAI_OVERFLOW = ("This model's maximum context length is 128000 tokens. However, your "
                   "messages resulted in 130000 tokens. Please reduce the length of the messages.")
OVERFLOW_BODIES: dict[str, tuple[Any, str]] = {
    "openai-completions": (
        {"error": {"message": OPENAI_OVERFLOW, "type": "invalid_request_error",
                   "param": "messages", "code": "context_length_exceeded"}},
        f"400 {OPENAI_OVERFLOW}\n{OPENAI_OVERFLOW} "
        "(type=invalid_request_error param=messages code=context_length_exceeded)"),
    "openai-responses": (
        {"error": {"message": "Your input exceeds the context window of this model.",
                   "type": "invalid_request_error", "param": "input",
                   "code": "context_length_exceeded"}},
        "400 Your input exceeds the context window of this model.\nYour input exceeds the "
        "context window of this model. "
        "(type=invalid_request_error param=input code=context_length_exceeded)"),
    "anthropic-messages": (
        {"type": "error",
         "error": {"type": "invalid_request_error",
                   "message": "prompt is too long: 210000 tokens > 200000 maximum"},
         "request_id": "req_011"},
        "400 prompt is too long: 210000 tokens > 200000 maximum\nprompt is too long: 210000 "
        "tokens > 200000 maximum (type=invalid_request_error)"),
    "google-generative-ai": (
        [{"error": {"code": 400, "status": "INVALID_ARGUMENT",
                    "message": "The input token count (1200000) exceeds the maximum number of "
                               "tokens allowed (1048576)."}}],
        "400 The input token count (1200000) exceeds the maximum number of tokens allowed "
        "(1048576).\nThe input token count (1200000) exceeds the maximum number of tokens "
        "allowed (1048576). (status=INVALID_ARGUMENT)"),
}


@pytest.mark.parametrize("api", APIS)
async def test_http_overflow_text_and_kind(api: str) -> None:
    body, text = OVERFLOW_BODIES[api]
    async with open_fake_llm([{"status": 400, "body": body}]) as llm:
        call, final = await run_call(make_model(api, llm.base_url))
    assert (final.stopReason, final.errorMessage, final.errorStatus) == ("error", text, 400)
    assert call.error is not None
    assert (call.error.kind, call.error.retryable) == ("context_overflow", False)
    # What a host matches, and what the session sees once only the message is left.
    assert error_text(final).startswith("400 ")
    assert is_context_overflow(None, final)


@pytest.mark.parametrize("api", APIS)
async def test_http_error_sample_from_the_spec(api: str) -> None:
    # A prompt_result's error (docs/design/protocol.md#prompt_result) is
    # "400 bad request here\nbad request here (type=server_error)"; the same body gives the same
    # text whichever API answered it.
    body = {"error": {"message": "bad request here", "type": "server_error"}}
    async with open_fake_llm([{"status": 400, "body": body}]) as llm:
        call, final = await run_call(make_model(api, llm.base_url))
    assert final.errorMessage == "400 bad request here\nbad request here (type=server_error)"
    assert final.errorStatus == 400
    assert call.error is not None
    assert call.error.kind == "bad_request"


@pytest.mark.parametrize(("body", "text"), [
    ("", "503 status code (no body)"),
    ("upstream connect error or disconnect/reset before headers",
     "503 upstream connect error or disconnect/reset before headers"),
])
async def test_http_error_without_a_json_body(body: str, text: str) -> None:
    async with open_fake_llm([{"status": 503, "body": body}]) as llm:
        call, final = await run_call(make_model("openai-completions", llm.base_url))
    assert (final.errorMessage, final.errorStatus) == (text, 503)
    assert call.error is not None
    assert call.error.retryable


# --- in-stream errors: the same classifier ------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_in_stream_overflow_is_an_overflow(api: str) -> None:
    script = [{"chunks": [{"text": "Hi"}],
               "errorEvent": "prompt is too long: 210000 tokens > 200000 maximum"}]
    async with open_fake_llm(script) as llm:
        call, final = await run_call(make_model(api, llm.base_url))
    assert call.error is not None
    assert (call.error.kind, call.error.retryable) == ("context_overflow", False)
    assert "prompt is too long: 210000 tokens > 200000 maximum" in error_text(final)
    assert errors.is_overflow_text(error_text(final))
    assert is_context_overflow(None, final)


async def test_in_stream_error_whose_code_alone_says_overflow() -> None:
    raw = ['data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hi"}}]}', "",
           'data: {"error":{"message":"Input too large","type":"invalid_request_error",'
           '"param":null,"code":"context_length_exceeded"}}', ""]
    async with open_fake_llm([{"raw": raw}]) as llm:
        call, final = await run_call(make_model("openai-completions", llm.base_url))
    assert final.errorMessage == (
        "Input too large (type=invalid_request_error code=context_length_exceeded)")
    assert call.error is not None
    assert call.error.kind == "context_overflow"
    assert is_context_overflow(None, final)


# --- transport failures ---------------------------------------------------------------------------


async def test_refused_connection_names_the_system_error() -> None:
    async with open_fake_llm([]) as llm:
        base_url = llm.base_url  # closed once the server is gone
    call, final = await run_call(make_model("openai-completions", base_url))
    assert error_text(final).startswith("ECONNREFUSED: ")
    assert call.error is not None
    assert (call.error.kind, call.error.retryable) == ("network", True)


# --- our own bugs -------------------------------------------------------------------------------


async def test_an_internal_error_is_not_retried() -> None:
    failures: list[str] = []

    def emit(event: StreamEvent) -> None:
        if event.type == "text_delta" and not failures:
            failures.append("raised")
            raise KeyError("choices")  # a bug in the code handling the stream

    async with open_fake_llm([{"chunks": [{"text": "Hi"}, {"text": " there"}]}]) as llm:
        call = ModelCall(make_model("openai-completions", llm.base_url),
                         Context(messages=(m.UserMessage(content="hi", timestamp=1),)),
                         StreamOptions(api_key=KEY))
        async with httpx.AsyncClient() as client:
            final = await call.run(emit, http=client)
    assert failures == ["raised"]
    assert call.error is not None
    assert (call.error.kind, call.error.retryable) == ("internal", False)
    assert final.errorMessage == "Internal error: KeyError: 'choices'"
    assert not should_retry(call.error, final, RetrySettings(), 1)
    assert not should_retry(None, final, RetrySettings(), 1)  # nor once stored


# --- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_a_key_echoed_in_an_error_body_is_redacted(api: str) -> None:
    body = {"error": {"message": f"Incorrect API key provided: {KEY}.",
                      "type": "invalid_request_error", "code": f"invalid_api_key:{KEY}"}}
    async with open_fake_llm([{"status": 401, "body": body}]) as llm:
        call, final = await run_call(make_model(api, llm.base_url))
        sent = llm.requests[0]
    assert KEY in str(sent.headers)  # the key did go out, in the auth header
    assert final.errorMessage == (
        "401 Incorrect API key provided: [redacted].\nIncorrect API key provided: [redacted]. "
        "(type=invalid_request_error code=invalid_api_key:[redacted])")
    assert call.error is not None
    assert KEY not in str(call.error)
    assert call.error.kind == "auth"


@pytest.mark.parametrize("api", APIS)
async def test_tokens_echoed_in_the_stream_are_redacted(api: str) -> None:
    options = StreamOptions(api_key=KEY, headers={"x-proxy-token": "proxy-tok-987654"})
    script = [{"chunks": [{"text": "Hi"}],
               "errorEvent": f"proxy rejected proxy-tok-987654 and {KEY}"}]
    async with open_fake_llm(script) as llm:
        _, final = await run_call(make_model(api, llm.base_url), options)
    text = error_text(final)
    assert "proxy rejected [redacted] and [redacted]" in text
    assert "proxy-tok-987654" not in text
    assert KEY not in text


async def test_url_userinfo_and_its_password_are_redacted() -> None:
    async with open_fake_llm([]) as llm:
        url = llm.base_url.replace("http://", "http://alice:pw-secret-42@")
        echo = f"no route for {url}/v1/chat/completions (password pw-secret-42)"
        llm.add({"status": 403, "body": {"error": {"message": echo}}})
        call, final = await run_call(make_model("openai-completions", url))
    host = llm.base_url.removeprefix("http://")
    assert final.errorMessage == (
        f"403 no route for http://[redacted]@{host}/v1/chat/completions (password [redacted])")
    assert call.error is not None
    assert call.error.kind == "auth"
