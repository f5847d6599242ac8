"""The anthropic-messages and google-generative-ai adapters, over real HTTP to the fake LLM.

Each test scripts the fake server, runs one model call through ``omp.llm.stream`` and checks
what a caller sees: the exact event sequence, the final message, the error kind, and what was
sent on the wire. Nothing in the client's path is mocked.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import msgspec
import pytest
import trio
import trio.testing

from omp.llm.builder import StreamEvent
from omp.llm.errors import ErrorKind
from omp.llm.stream import ModelCall, collect
from omp.llm.types import Context, LlmMessage, StreamOptions, ToolDefinition
from omp.protocol import messages as m
from omp.protocol.payloads import Model, ModelCost
from omp.testing.fake_llm import open_fake_llm

APIS = ("anthropic", "google")
COST = ModelCost(input=3.0, output=15.0, cacheRead=0.3, cacheWrite=3.75)
READ = ToolDefinition("read", "Read a file", {"type": "object", "properties": {
    "path": {"type": "string"}}, "required": ["path"]})
PNG = "iVBORw0KGgo="


def make_model(api: str, base_url: str, *, reasoning: bool = False, model_id: str | None = None,
               images: bool = True) -> Model:
    anthropic = api == "anthropic"
    return Model(
        id=model_id or ("claude-sonnet-4-5" if anthropic else "gemini-2.5-pro"),
        name="Test model", api="anthropic-messages" if anthropic else "google-generative-ai",
        provider=api, baseUrl=base_url if anthropic else base_url + "/v1beta",
        reasoning=reasoning, input=["text", "image"] if images else ["text"], cost=COST,
        contextWindow=200_000 if anthropic else 1_048_576,
        maxTokens=64_000 if anthropic else 65_536)


def user(text: str) -> m.UserMessage:
    return m.UserMessage(content=text, timestamp=1)


def assistant(model: Model, *content: m.AssistantContent, stop: m.StopReason = "stop",
              model_id: str | None = None) -> m.AssistantMessage:
    return m.AssistantMessage(
        content=list(content), api=model.api, provider=model.provider,
        model=model_id or model.id, usage=m.Usage.zero(), stopReason=stop, timestamp=2)


def result(call_id: str, name: str, text: str, *, error: bool = False) -> m.ToolResultMessage:
    return m.ToolResultMessage(toolCallId=call_id, toolName=name, isError=error,
                               content=[m.TextContent(text=text)], timestamp=3)


def context(*messages: LlmMessage, tools: tuple[ToolDefinition, ...] = ()) -> Context:
    return Context(system_prompt=("You are a test.",), messages=messages or (user("Hi"),),
                   tools=tools)


def types(events: list[StreamEvent]) -> list[str]:
    return [e.type for e in events]


async def run_call(model: Model, ctx: Context, options: StreamOptions,
                   client: httpx.AsyncClient) -> tuple[ModelCall, list[StreamEvent]]:
    """Like ``collect``, but keeps the ``ModelCall`` (its ``error`` and ``final``)."""
    events: list[StreamEvent] = []

    def emit(event: StreamEvent) -> None:
        event.freeze()
        events.append(event)

    call = ModelCall(model, ctx, options)
    await call.run(emit, http=client)
    return call, events


def live_tasks() -> set[trio.lowlevel.Task]:
    found: set[trio.lowlevel.Task] = set()
    root = trio.lowlevel.current_root_task()
    assert root is not None
    todo = [root]
    while todo:
        task = todo.pop()
        found.add(task)
        for nursery in task.child_nurseries:
            todo.extend(nursery.child_tasks)
    return found


# --- streaming ---------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_text_in_several_deltas(api: str) -> None:
    script = [{"chunks": [{"text": "Hel"}, {"text": "lo"}, {"text": ", world"}],
               "usage": {"input": 10, "output": 3}}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model(api, llm.base_url)
        final, events = await collect(model, context(), StreamOptions(), http=client)

    assert types(events) == ["start", "text_start", "text_delta", "text_delta", "text_delta",
                             "text_end", "done"]
    assert [e.delta for e in events if e.type == "text_delta"] == ["Hel", "lo", ", world"]
    assert events[3].partial.content == [m.TextContent(text="Hello")]  # snapshot, not live
    assert events[5].content == "Hello, world"
    assert final.content == [m.TextContent(text="Hello, world")]
    assert final.stopReason == "stop"
    assert (final.api, final.provider, final.model) == (model.api, model.provider, model.id)
    assert final.responseId == ("msg_fake_1" if api == "anthropic" else "fake-1")
    assert events[-1].message is final
    assert events[-1].reason == "stop"
    # No key configured: no auth header at all.
    assert not {"x-api-key", "x-goog-api-key", "authorization"} & set(llm.requests[0].headers)


async def test_anthropic_thinking_signature_and_redacted_thinking() -> None:
    script = [
        {"chunks": [{"thinking": "Let me "}, {"thinking": "think.", "signature": "sig-part-1"},
                    {"signature": "-part-2"}, {"redactedThinking": "b3BhcXVl"},
                    {"text": "Answer"}]},
        {"chunks": [{"text": "again"}]},
        {"chunks": [{"text": "other"}]},
    ]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model("anthropic", llm.base_url, reasoning=True)
        options = StreamOptions(thinking="high", temperature=0.5)
        final, events = await collect(model, context(), options, http=client)
        # Replay: the same model gets the signed thinking and the redacted block verbatim...
        history = context(user("Hi"), final, user("More"))
        await collect(model, history, options, http=client)
        # ... another model gets the thinking as text and no redacted block.
        other = msgspec.structs.replace(model, id="claude-opus-4-1")
        await collect(other, history, StreamOptions(), http=client)

    assert types(events) == ["start", "thinking_start", "thinking_delta", "thinking_delta",
                             "thinking_end", "text_start", "text_delta", "text_end", "done"]
    assert events[4].content == "Let me think."
    assert final.content == [
        m.ThinkingContent(thinking="Let me think.", thinkingSignature="sig-part-1-part-2"),
        m.RedactedThinkingContent(data="b3BhcXVl"),
        m.TextContent(text="Answer"),
    ]

    first = llm.requests[0]
    body = first.json()
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 16384}
    assert body["max_tokens"] == 32000 + 16384  # default cap plus the budget, under 64000
    assert "temperature" not in body  # the API rejects it with thinking
    assert first.headers["anthropic-beta"] == (
        "fine-grained-tool-streaming-2025-05-14,interleaved-thinking-2025-05-14")

    replayed = llm.requests[1].json()["messages"][1]
    assert replayed == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Let me think.", "signature": "sig-part-1-part-2"},
        {"type": "redacted_thinking", "data": "b3BhcXVl"},
        {"type": "text", "text": "Answer"},
    ]}
    cross = llm.requests[2].json()
    assert cross["messages"][1] == {"role": "assistant", "content": [
        {"type": "text", "text": "Let me think."}, {"type": "text", "text": "Answer"}]}
    assert "thinking" not in cross
    assert llm.requests[2].headers["anthropic-beta"] == "fine-grained-tool-streaming-2025-05-14"


async def test_google_thinking_signatures_and_replay() -> None:
    script = [
        {"chunks": [{"thinking": "Plan", "signature": "thought-sig"}, {"text": "Done"}]},
        {"chunks": [{"text": "again"}]},
        {"chunks": [{"text": "v3"}]},
    ]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model("google", llm.base_url, reasoning=True)
        final, events = await collect(model, context(), StreamOptions(thinking="medium"),
                                      http=client)
        call = m.ToolCall(id="c1", name="read", arguments={"path": "a"},
                          thoughtSignature="call-sig")
        history = context(user("Hi"), final, assistant(model, call, stop="toolUse"),
                          result("c1", "read", "A"), user("More"))
        await collect(model, history, StreamOptions(thinking="medium"), http=client)
        # Gemini 3: levels instead of budgets; foreign calls get the documented bypass value.
        gemini3 = make_model("google", llm.base_url, reasoning=True, model_id="gemini-3-pro")
        await collect(gemini3, history, StreamOptions(thinking="high"), http=client)

    assert types(events) == ["start", "thinking_start", "thinking_delta", "thinking_end",
                             "text_start", "text_delta", "text_end", "done"]
    assert final.content == [m.ThinkingContent(thinking="Plan", thinkingSignature="thought-sig"),
                             m.TextContent(text="Done")]
    assert llm.requests[0].json()["generationConfig"]["thinkingConfig"] == {
        "thinkingBudget": 8192, "includeThoughts": True}

    contents = llm.requests[1].json()["contents"]
    assert contents[1] == {"role": "model", "parts": [
        {"text": "Plan", "thought": True, "thoughtSignature": "thought-sig"}, {"text": "Done"}]}
    assert contents[2] == {"role": "model", "parts": [
        {"functionCall": {"name": "read", "args": {"path": "a"}},
         "thoughtSignature": "call-sig"}]}

    v3 = llm.requests[2].json()
    assert v3["generationConfig"]["thinkingConfig"] == {"thinkingLevel": "HIGH",
                                                        "includeThoughts": True}
    assert v3["contents"][1] == {"role": "model", "parts": [{"text": "Plan"}, {"text": "Done"}]}
    assert v3["contents"][2]["parts"][0]["thoughtSignature"] == "skip_thought_signature_validator"


@pytest.mark.parametrize("api", APIS)
async def test_two_tool_calls_with_split_arguments(api: str) -> None:
    script = [{"chunks": [
        {"text": "Checking."},
        {"toolCall": {"id": "toolu_1", "name": "read",
                      "arguments": ['{"pa', 'th": "a', '.txt"}']}},
        {"toolCall": {"id": "toolu_2", "name": "grep",
                      "arguments": ['{"pattern"', ': "x", ', '"limit": 5', "}"]}},
    ]}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model(api, llm.base_url)
        final, events = await collect(model, context(tools=(READ,)), StreamOptions(),
                                      http=client)

    first = m.ToolCall(id="toolu_1", name="read", arguments={"path": "a.txt"})
    second = m.ToolCall(id="toolu_2", name="grep", arguments={"pattern": "x", "limit": 5})
    assert final.content == [m.TextContent(text="Checking."), first, second]
    assert final.stopReason == "toolUse"
    if api == "anthropic":  # streamed as the model wrote them
        assert types(events) == [
            "start", "text_start", "text_delta", "text_end",
            "toolcall_start", "toolcall_delta", "toolcall_delta", "toolcall_delta",
            "toolcall_end",
            "toolcall_start", "toolcall_delta", "toolcall_delta", "toolcall_delta",
            "toolcall_delta", "toolcall_end", "done"]
        partial_call = events[6].partial.content[1]
        assert isinstance(partial_call, m.ToolCall)
        assert partial_call.arguments == {"path": "a"}  # best-effort parse of '{"path": "a'
    else:  # Gemini sends a call whole: one delta with all of it
        assert types(events) == [
            "start", "text_start", "text_delta", "text_end",
            "toolcall_start", "toolcall_delta", "toolcall_end",
            "toolcall_start", "toolcall_delta", "toolcall_end", "done"]
        assert msgspec.json.decode(events[5].delta) == {"path": "a.txt"}
    assert [e.tool_call for e in events if e.type == "toolcall_end"] == [first, second]
    assert events[-1].reason == "toolUse"


async def test_google_tool_call_ids_generated_when_missing_or_duplicate() -> None:
    def chunk(part: dict[str, Any], finish: str | None = None) -> str:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [part]}}
        if finish:
            candidate["finishReason"] = finish
        return "data: " + msgspec.json.encode({"candidates": [candidate]}).decode() + "\r\n"

    raw = [
        chunk({"functionCall": {"name": "read", "args": {"path": "a"}},
               "thoughtSignature": "sig-a"}), "",
        chunk({"functionCall": {"name": "read", "args": {"path": "b"}, "id": "dup"}}), "",
        chunk({"functionCall": {"name": "ls", "args": {}, "id": "dup"}}, "STOP"), "",
    ]
    async with open_fake_llm([{"raw": raw}]) as llm, httpx.AsyncClient() as client:
        model = make_model("google", llm.base_url)
        final, _ = await collect(model, context(tools=(READ,)), StreamOptions(), http=client)

    calls = [b for b in final.content if isinstance(b, m.ToolCall)]
    assert re.fullmatch(r"read_\d{13}_\d+", calls[0].id)
    assert calls[0].thoughtSignature == "sig-a"
    assert calls[1].id == "dup"
    assert re.fullmatch(r"ls_\d{13}_\d+", calls[2].id)
    assert len({c.id for c in calls}) == 3
    assert final.stopReason == "toolUse"  # STOP with tool calls


@pytest.mark.parametrize("api", APIS)
async def test_usage_and_cost(api: str) -> None:
    usage = {"input": 1000, "output": 500, "cacheRead": 200, "cacheWrite": 100, "reasoning": 100}
    async with open_fake_llm([{"chunks": [{"text": "ok"}], "usage": usage}]) as llm, \
            httpx.AsyncClient() as client:
        model = make_model(api, llm.base_url)
        final, _ = await collect(model, context(), StreamOptions(), http=client)

    u = final.usage
    if api == "anthropic":
        assert (u.input, u.output, u.cacheRead, u.cacheWrite, u.totalTokens) == (
            1000, 500, 200, 100, 1800)
    else:  # promptTokenCount includes the cached tokens; output includes thoughts
        assert (u.input, u.output, u.cacheRead, u.cacheWrite, u.totalTokens) == (
            1000, 500, 200, 0, 1700)
        assert u.reasoningTokens == 100
    assert u.cost.input == pytest.approx(3.0 * u.input / 1e6)
    assert u.cost.output == pytest.approx(15.0 * 500 / 1e6)
    assert u.cost.cacheRead == pytest.approx(0.3 * 200 / 1e6)
    assert u.cost.cacheWrite == pytest.approx(3.75 * u.cacheWrite / 1e6)
    assert u.cost.total == pytest.approx(
        u.cost.input + u.cost.output + u.cost.cacheRead + u.cost.cacheWrite)
    assert u.cost.total > 0


# --- the request -------------------------------------------------------------------------------


async def test_anthropic_request() -> None:
    async with open_fake_llm([{"chunks": [{"text": "ok"}]}]) as llm, \
            httpx.AsyncClient() as client:
        model = make_model("anthropic", llm.base_url)
        history = (
            m.UserMessage(content=[m.TextContent(text="Read the files"),
                                   m.ImageContent(data=PNG, mimeType="image/png")], timestamp=1),
            assistant(model,
                      m.TextContent(text=" "),
                      m.ThinkingContent(thinking="musing"),  # unsigned: sent as text
                      m.ToolCall(id="call|1", name="read", arguments={"path": "a"}),
                      m.ToolCall(id="call/1", name="read", arguments={"path": "b"}),
                      m.ToolCall(id="orphan id", name="read", arguments={"path": "c"}),
                      stop="toolUse"),
            result("call/1", "read", "B missing", error=True),
            result("call|1", "read", "A"),
            assistant(model, m.TextContent(text="half"), stop="error"),  # failed turn: dropped
            user("continue"),
        )
        ctx = Context(system_prompt=("You are helpful.", "Be brief."), messages=history,
                      tools=(READ,))
        options = StreamOptions(api_key="sk-ant-secret", headers={"x-extra": "1"},
                                temperature=0.2)
        final, _ = await collect(model, ctx, options, http=client)

    assert final.stopReason == "stop"
    (request,) = llm.requests
    assert (request.method, request.path) == ("POST", "/v1/messages")
    assert request.headers["x-api-key"] == "sk-ant-secret"
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert request.headers["anthropic-beta"] == "fine-grained-tool-streaming-2025-05-14"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["x-extra"] == "1"
    assert "authorization" not in request.headers
    assert b"sk-ant-secret" not in request.body

    body = request.json()
    assert body["model"] == "claude-sonnet-4-5"
    assert body["stream"] is True
    assert body["max_tokens"] == 32000
    assert body["temperature"] == 0.2
    assert "thinking" not in body
    assert body["system"] == [
        {"type": "text", "text": "You are helpful."},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert body["tools"] == [{"name": "read", "description": "Read a file",
                              "input_schema": READ.parameters}]
    assert body["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "Read the files"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": PNG}}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "musing"},
            {"type": "tool_use", "id": "call_1", "name": "read", "input": {"path": "a"}},
            {"type": "tool_use", "id": "call_1_2", "name": "read", "input": {"path": "b"}},
            {"type": "tool_use", "id": "orphan_id", "name": "read", "input": {"path": "c"}}]},
        {"role": "user", "content": [  # all results of the turn in one message
            {"type": "tool_result", "tool_use_id": "call_1_2", "content": "B missing",
             "is_error": True},
            {"type": "tool_result", "tool_use_id": "call_1", "content": "A"},
            {"type": "tool_result", "tool_use_id": "orphan_id", "content": "No result provided",
             "is_error": True}]},
        {"role": "user", "content": [
            {"type": "text", "text": "continue", "cache_control": {"type": "ephemeral"}}]},
    ]


async def test_google_request() -> None:
    async with open_fake_llm([{"chunks": [{"text": "ok"}]}]) as llm, \
            httpx.AsyncClient() as client:
        model = make_model("google", llm.base_url, reasoning=True, images=False)
        history = (
            m.UserMessage(content=[m.TextContent(text="Read the files"),
                                   m.ImageContent(data=PNG, mimeType="image/png")], timestamp=1),
            assistant(model,
                      m.TextContent(text="Reading.", textSignature="text-sig"),
                      m.ToolCall(id="c1", name="read", arguments={"path": "a"}),
                      m.ToolCall(id="c2", name="read", arguments={"path": "b"}),
                      stop="toolUse"),
            result("c1", "read", "A"),
            result("c2", "read", "boom", error=True),
            user("continue"),
        )
        ctx = Context(system_prompt=("You are helpful.", "Be brief."), messages=history,
                      tools=(READ,))
        options = StreamOptions(api_key="goog-secret", thinking="low", max_tokens=1000,
                                temperature=0.3)
        final, _ = await collect(model, ctx, options, http=client)

    assert final.stopReason == "stop"
    (request,) = llm.requests
    assert request.path == "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
    assert request.query == {"alt": "sse"}
    assert request.headers["x-goog-api-key"] == "goog-secret"
    assert "goog-secret" not in request.target
    assert b"goog-secret" not in request.body
    assert "authorization" not in request.headers

    body = request.json()
    assert body["systemInstruction"] == {"parts": [{"text": "You are helpful."},
                                                   {"text": "Be brief."}]}
    assert body["generationConfig"] == {
        "maxOutputTokens": 1000, "temperature": 0.3,
        "thinkingConfig": {"thinkingBudget": 4096, "includeThoughts": True}}
    assert body["tools"] == [{"functionDeclarations": [
        {"name": "read", "description": "Read a file", "parametersJsonSchema": READ.parameters}]}]
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "Read the files"}]},  # text-only model: no image
        {"role": "model", "parts": [
            {"text": "Reading.", "thoughtSignature": "text-sig"},
            {"functionCall": {"name": "read", "args": {"path": "a"}}},
            {"functionCall": {"name": "read", "args": {"path": "b"}}}]},
        {"role": "user", "parts": [  # the turn's results, together
            {"functionResponse": {"name": "read", "response": {"output": "A"}}},
            {"functionResponse": {"name": "read", "response": {"error": "boom"}}}]},
        {"role": "user", "parts": [{"text": "continue"}]},
    ]


# --- errors ------------------------------------------------------------------------------------

OVERFLOW = {
    "anthropic": "prompt is too long: 210000 tokens > 200000 maximum",
    "google": "The input token count (1200000) exceeds the maximum number of tokens allowed "
              "(1048576).",
}
HTTP_ERRORS: list[tuple[str, int, dict[str, str], str, ErrorKind, float | None]] = []
for _api in APIS:
    HTTP_ERRORS += [
        (_api, 401, {}, "invalid x-api-key", "auth", None),
        (_api, 429, {"retry-after": "3"}, "Number of requests has exceeded your rate limit",
         "rate_limit", 3.0),
        (_api, 529 if _api == "anthropic" else 503, {}, "The service is busy", "overloaded",
         None),
        (_api, 500, {}, "Internal server error", "server", None),
        (_api, 400, {}, OVERFLOW[_api], "context_overflow", None),
        (_api, 400, {}, "max_tokens: Field required", "bad_request", None),
    ]


def error_body(api: str, status: int, message: str) -> dict[str, Any]:
    if api == "anthropic":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    return {"error": {"code": status, "message": message, "status": "INVALID_ARGUMENT"}}


@pytest.mark.parametrize(("api", "status", "headers", "message", "kind", "retry_after"),
                         HTTP_ERRORS, ids=[f"{e[0]}-{e[1]}-{e[4]}" for e in HTTP_ERRORS])
async def test_http_error_kinds(api: str, status: int, headers: dict[str, str], message: str,
                                kind: ErrorKind, retry_after: float | None) -> None:
    script = [{"status": status, "headers": headers, "body": error_body(api, status, message)}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        call, events = await run_call(make_model(api, llm.base_url), context(),
                                      StreamOptions(api_key="k"), client)

    assert types(events) == ["error"]  # never started
    assert call.error is not None
    assert call.final is not None
    assert call.error.kind == kind
    assert call.error.http_status == status
    assert call.error.retry_after == retry_after
    assert call.error.provider == api
    assert call.final.stopReason == "error"
    # The original's text: status and message, then the message with the body's machine field.
    field = "type=api_error" if api == "anthropic" else "status=INVALID_ARGUMENT"
    assert call.final.errorMessage == f"{status} {message}\n{message} ({field})"
    assert call.final.errorMessage == call.error.message
    assert call.final.errorStatus == status
    assert events[0].message is call.final
    assert events[0].reason == "error"


@pytest.mark.parametrize("api", APIS)
async def test_in_stream_overloaded_error(api: str) -> None:
    script = [{"chunks": [{"text": "Hi"}], "errorEvent": "Overloaded"}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        call, events = await run_call(make_model(api, llm.base_url), context(),
                                      StreamOptions(), client)

    assert types(events) == ["start", "text_start", "text_delta", "error"]
    assert call.error is not None
    assert call.final is not None
    assert call.error.kind == "overloaded"
    assert call.error.retryable
    assert call.final.stopReason == "error"
    # The message and the event's own type / status, like an HTTP error's second line.
    assert call.final.errorMessage == {"anthropic": "Overloaded (type=overloaded_error)",
                                       "google": "Overloaded (status=UNAVAILABLE)"}[api]
    assert call.final.content == [m.TextContent(text="Hi")]  # what arrived is kept


@pytest.mark.parametrize(("api", "stop", "expected"), [
    ("anthropic", "length", "length"), ("google", "length", "length"),
    ("anthropic", "error", "refusal"), ("google", "error", "SAFETY")])
async def test_finish_reasons(api: str, stop: str, expected: str) -> None:
    script = [{"chunks": [{"text": "Some"}], "stop": stop}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        call, events = await run_call(make_model(api, llm.base_url), context(),
                                      StreamOptions(), client)

    assert call.final is not None
    if expected == "length":
        assert call.final.stopReason == "length"
        assert events[-1].type == "done"
        assert events[-1].reason == "length"
    else:  # a refusal / safety stop: an error that names the reason, and not worth a retry
        assert call.final.stopReason == "error"
        assert call.error is not None
        assert call.error.kind == "bad_request"
        assert expected in (call.final.errorMessage or "")
        assert call.final.content == [m.TextContent(text="Some")]


@pytest.mark.parametrize("api", APIS)
async def test_dropped_stream(api: str) -> None:
    script = [{"chunks": [{"text": "partial"}, {"text": " more"}], "dropAfter": 1}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        call, events = await run_call(make_model(api, llm.base_url), context(),
                                      StreamOptions(), client)

    assert types(events) == ["start", "text_start", "text_delta", "error"]
    assert call.error is not None
    assert call.final is not None
    assert call.error.kind == "network"
    assert call.error.retryable
    # Named like the original's system error for a connection the peer cut.
    assert call.error.message == ("ECONNRESET: peer closed connection without sending complete "
                                  "message body (incomplete chunked read)")
    assert call.final.stopReason == "error"
    assert call.final.content == [m.TextContent(text="partial")]


ENDS_EARLY = {
    "anthropic": [
        "event: message_start",
        'data: {"type":"message_start","message":{"id":"msg_1","usage":{"input_tokens":5,'
        '"output_tokens":0}}}', "",
        "event: content_block_start",
        'data: {"type":"content_block_start","index":0,"content_block":{"type":"text",'
        '"text":""}}', "",
        "event: content_block_delta",
        'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
        '"text":"cut"}}', "",
    ],
    "google": [
        'data: {"candidates":[{"content":{"role":"model","parts":[{"text":"cut"}]}}]}', "",
    ],
}


@pytest.mark.parametrize("api", APIS)
async def test_stream_that_ends_without_its_terminator(api: str) -> None:
    async with open_fake_llm([{"raw": ENDS_EARLY[api]}]) as llm, httpx.AsyncClient() as client:
        call, events = await run_call(make_model(api, llm.base_url), context(),
                                      StreamOptions(), client)

    assert events[-1].type == "error"
    assert call.error is not None
    assert call.final is not None
    assert call.error.kind == "network"
    assert "stream ended early" in call.error.message
    assert call.final.stopReason == "error"


@pytest.mark.parametrize("api", APIS)
async def test_hung_stream_cancelled(api: str) -> None:
    script = [{"chunks": [{"text": "thinking about it"}, {"text": "never sent"}],
               "usage": {"input": 42}, "hangAfter": 1}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        baseline = live_tasks()
        model = make_model(api, llm.base_url)
        events: list[StreamEvent] = []

        scope = trio.move_on_after(10)

        def emit(event: StreamEvent) -> None:
            event.freeze()
            events.append(event)
            if event.type == "text_delta":  # the stream now hangs: give up on it shortly
                scope.deadline = trio.current_time() + 0.05

        call = ModelCall(model, context(), StreamOptions())
        with scope:
            await call.run(emit, http=client)
        assert scope.cancelled_caught

        with trio.fail_after(5):
            await llm.wait_for_disconnect()
            await llm.wait_until(lambda fake: fake.connections == 0)
        await trio.testing.wait_all_tasks_blocked()
        assert live_tasks() == baseline

    assert llm.disconnects == 1
    assert types(events) == ["start", "text_start", "text_delta"]  # no terminal event
    assert call.final is not None
    assert call.final.stopReason == "aborted"
    assert call.final.errorMessage == "Request was aborted"
    assert call.final.content == [m.TextContent(text="thinking about it")]
    if api == "anthropic":  # message_start arrived, so the prompt's usage is known
        assert call.final.usage.input == 42



@pytest.mark.parametrize("api", APIS)
async def test_no_response_headers_is_a_first_event_timeout(api: str) -> None:
    # A server that accepts the connection and never answers (the fake always sends its head).
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    accepted: list[trio.SocketStream] = []

    async def accept_and_stay_silent() -> None:
        accepted.append(await listener.accept())
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery, httpx.AsyncClient() as client:
        nursery.start_soon(accept_and_stay_silent)
        model = make_model(api, f"http://127.0.0.1:{port}")
        with trio.fail_after(5):
            call, events = await run_call(model, context(),
                                          StreamOptions(first_event_timeout=0.2), client)
        nursery.cancel_scope.cancel()
    for stream in accepted:
        await stream.aclose()
    await listener.aclose()

    assert types(events) == ["error"]
    assert call.error is not None
    assert call.error.kind == "network"
    assert "first event timeout" in call.error.message


@pytest.mark.parametrize("api", APIS)
async def test_connection_reused_after_a_complete_stream(api: str) -> None:
    script = [{"chunks": [{"text": "one"}]}, {"chunks": [{"text": "two"}]}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model(api, llm.base_url)
        for _ in range(2):
            final, _ = await collect(model, context(), StreamOptions(), http=client)
            assert final.stopReason == "stop"

    assert [r.connection for r in llm.requests] == [1, 1]
    assert llm.disconnects == 0
