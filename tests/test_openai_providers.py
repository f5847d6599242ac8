"""The openai-completions and openai-responses adapters, over real HTTP to the fake LLM server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
import trio

from omp.llm.builder import StreamEvent
from omp.llm.stream import ModelCall, collect
from omp.llm.types import Context, StreamOptions, ToolDefinition
from omp.protocol import messages as m
from omp.protocol.payloads import Model, ModelCost
from omp.testing.fake_llm import FakeLLM, open_fake_llm

APIS = ("openai-completions", "openai-responses")
api_param = pytest.mark.parametrize("api", APIS)
FREE = ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0)
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJ"
       "RU5ErkJggg==")
WEATHER = ToolDefinition("get_weather", "Weather for a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]})


def make_model(llm: FakeLLM, api: str, *, model_id: str = "gpt-test", reasoning: bool = False,
               images: bool = False, cost: ModelCost = FREE) -> Model:
    return Model(id=model_id, name="GPT Test", api=api, provider="openai",
                 baseUrl=llm.base_url + "/v1", reasoning=reasoning,
                 input=["text", "image"] if images else ["text"], cost=cost,
                 contextWindow=128_000, maxTokens=16_384)


def user(text: str | list[m.UserContent]) -> m.UserMessage:
    return m.UserMessage(content=text, timestamp=1)


def types(events: list[StreamEvent]) -> list[str]:
    return [e.type for e in events]


async def run_call(model: Model, context: Context, options: StreamOptions | None = None
                   ) -> tuple[ModelCall, list[StreamEvent]]:
    """Run a call like ``collect`` but keep the ModelCall (for ``call.error``)."""
    events: list[StreamEvent] = []

    def emit(event: StreamEvent) -> None:
        event.freeze()
        events.append(event)

    call = ModelCall(model, context, options or StreamOptions(api_key="sk-test"))
    async with httpx.AsyncClient() as client:
        await call.run(emit, http=client)
    return call, events


def walk_tasks() -> set[trio.lowlevel.Task]:
    found: set[trio.lowlevel.Task] = set()

    def visit(task: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
        yield task
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                yield from visit(child)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    found.update(visit(root))
    return found


# --- streaming ----------------------------------------------------------------------------------


@api_param
async def test_text_streamed_in_deltas(api: str) -> None:
    script = [{"chunks": [{"text": "Hel"}, {"text": "lo, "}, {"text": "world"}],
               "usage": {"input": 7, "output": 3}}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model(llm, api)
        final, events = await collect(model, Context(messages=(user("hi"),)),
                                      StreamOptions(api_key="sk-test"), http=client)
    assert types(events) == ["start", "text_start", "text_delta", "text_delta", "text_delta",
                             "text_end", "done"]
    assert [e.delta for e in events if e.type == "text_delta"] == ["Hel", "lo, ", "world"]
    assert events[3].partial.content == [m.TextContent(text="Hello, ")]
    assert events[5].content == "Hello, world"
    assert events[-1].reason == "stop"
    assert final is events[-1].message
    assert [b.text for b in final.content if isinstance(b, m.TextContent)] == ["Hello, world"]
    assert len(final.content) == 1
    assert (final.api, final.provider, final.model) == (api, "openai", "gpt-test")
    assert final.stopReason == "stop"
    assert final.errorMessage is msgspec.UNSET
    assert (final.usage.input, final.usage.output) == (7, 3)
    if api == "openai-completions":
        assert final.responseId == "chatcmpl-fake-1"
    else:
        assert final.responseId == "resp_fake_1"
        block = final.content[0]
        assert isinstance(block, m.TextContent)
        assert isinstance(block.textSignature, str)
        assert msgspec.json.decode(block.textSignature) == {"v": 1, "id": "msg_fake_1_0"}


@api_param
async def test_thinking_streamed_and_replayed_to_the_same_model_only(api: str) -> None:
    script: list[dict[str, Any]] = [
        {"chunks": [{"thinking": "Let me "}, {"thinking": "think", "signature": "enc-1"},
                    {"text": "Answer"}]},
        {"chunks": [{"text": "again"}], "repeat": True}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model(llm, api, reasoning=True)
        options = StreamOptions(api_key="sk-test", thinking="medium")
        final, events = await collect(model, Context(messages=(user("why?"),)), options,
                                      http=client)
        history = (user("why?"), final, user("and then?"))
        await collect(model, Context(messages=history), options, http=client)
        other = make_model(llm, api, model_id="gpt-other", reasoning=True)
        await collect(other, Context(messages=history), options, http=client)
        same_body, other_body = llm.requests[1].json(), llm.requests[2].json()

    assert types(events) == ["start", "thinking_start", "thinking_delta", "thinking_delta",
                             "thinking_end", "text_start", "text_delta", "text_end", "done"]
    assert events[4].content == "Let me think"
    thinking, text = final.content
    assert isinstance(thinking, m.ThinkingContent)
    assert isinstance(thinking.thinkingSignature, str)
    assert thinking.thinking == "Let me think"
    assert isinstance(text, m.TextContent)
    assert text.text == "Answer"
    if api == "openai-completions":
        assert thinking.thinkingSignature == "reasoning_content"
        assistant = same_body["messages"][1]
        assert assistant == {"role": "assistant", "content": "Answer",
                             "reasoning_content": "Let me think"}
        # Another model gets the thinking as plain text, in no reasoning field.
        assert other_body["messages"][1] == {"role": "assistant",
                                             "content": "Let me thinkAnswer"}
    else:
        item = msgspec.json.decode(thinking.thinkingSignature)
        assert item["type"] == "reasoning"
        assert item["encrypted_content"] == "enc-1"
        replay = same_body["input"]
        assert replay[1] == item
        assert replay[2]["type"] == "message"
        assert replay[2]["id"] == "msg_fake_1_1"
        assert replay[2]["content"][0]["text"] == "Answer"
        assert b"enc-1" not in llm.requests[2].body
        assert other_body["input"][1:3] == [
            {"role": "assistant",
             "content": [{"type": "output_text", "text": "Let me think", "annotations": []}]},
            {"role": "assistant",
             "content": [{"type": "output_text", "text": "Answer", "annotations": []}]}]


@api_param
async def test_two_tool_calls_with_split_arguments(api: str) -> None:
    script: list[dict[str, Any]] = [
        {"chunks": [
            {"text": "Checking."},
            {"toolCall": {"id": "call_1", "name": "get_weather",
                          "arguments": ['{"ci', 'ty": "Pa', 'ris", "uni', 'ts": "C"}']}},
            {"toolCall": {"id": "call_2", "name": "get_time",
                          "arguments": ['{"tz"', ': "Europe/', 'Paris", "h24": ', 'true}']}}]},
        {"chunks": [{"text": "Sunny."}]}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model(llm, api)
        context = Context(messages=(user("weather?"),), tools=(WEATHER,))
        options = StreamOptions(api_key="sk-test")
        final, events = await collect(model, context, options, http=client)
        first, second = (b for b in final.content if isinstance(b, m.ToolCall))
        results = tuple(
            m.ToolResultMessage(toolCallId=c.id, toolName=c.name, isError=False, timestamp=2,
                                content=[m.TextContent(text=f"result {c.name}")])
            for c in (first, second))
        await collect(model, Context(messages=(*context.messages, final, *results)), options,
                      http=client)
        follow_up = llm.requests[1].json()

    assert types(events) == [
        "start", "text_start", "text_delta", "text_end",
        "toolcall_start", *["toolcall_delta"] * 4, "toolcall_end",
        "toolcall_start", *["toolcall_delta"] * 4, "toolcall_end", "done"]
    assert events[-1].reason == "toolUse"
    assert final.stopReason == "toolUse"
    # Every delta re-parses the arguments so far, best effort.
    assert events[6].partial.content[1].arguments == {"city": "Pa"}  # type: ignore[union-attr]
    assert (first.name, first.arguments) == ("get_weather", {"city": "Paris", "units": "C"})
    assert (second.name, second.arguments) == ("get_time", {"tz": "Europe/Paris", "h24": True})
    end = events[9]
    assert end.type == "toolcall_end"
    assert end.tool_call == first
    if api == "openai-completions":
        assert (first.id, second.id) == ("call_1", "call_2")
        assistant, tool_1, tool_2 = follow_up["messages"][1:]
        assert assistant["content"] == "Checking."
        assert [(c["id"], c["function"]["name"], msgspec.json.decode(c["function"]["arguments"]))
                for c in assistant["tool_calls"]] == [
            ("call_1", "get_weather", {"city": "Paris", "units": "C"}),
            ("call_2", "get_time", {"tz": "Europe/Paris", "h24": True})]
        assert tool_1 == {"role": "tool", "tool_call_id": "call_1",
                          "content": "result get_weather"}
        assert tool_2 == {"role": "tool", "tool_call_id": "call_2", "content": "result get_time"}
    else:
        assert (first.id, second.id) == ("call_1|fc_fake_1_1", "call_2|fc_fake_1_2")
        calls = [i for i in follow_up["input"] if i.get("type") == "function_call"]
        outputs = [i for i in follow_up["input"] if i.get("type") == "function_call_output"]
        assert [(c["call_id"], c["id"], c["name"]) for c in calls] == [
            ("call_1", "fc_fake_1_1", "get_weather"), ("call_2", "fc_fake_1_2", "get_time")]
        assert outputs == [
            {"type": "function_call_output", "call_id": "call_1", "output": "result get_weather"},
            {"type": "function_call_output", "call_id": "call_2", "output": "result get_time"}]


@api_param
async def test_usage_and_cost(api: str) -> None:
    cost = ModelCost(input=3.0, output=15.0, cacheRead=0.3, cacheWrite=3.75)
    script = [{"chunks": [{"text": "ok"}],
               "usage": {"input": 1000, "output": 200, "cacheRead": 400, "reasoning": 50}}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        final, _ = await collect(make_model(llm, api, cost=cost),
                                 Context(messages=(user("hi"),)),
                                 StreamOptions(api_key="sk-test"), http=client)
    usage = final.usage
    assert (usage.input, usage.output, usage.cacheRead, usage.cacheWrite) == (1000, 200, 400, 0)
    assert usage.totalTokens == 1600
    assert usage.reasoningTokens == 50
    assert usage.cost.input == pytest.approx(3.0 * 1000 / 1e6)
    assert usage.cost.output == pytest.approx(15.0 * 200 / 1e6)
    assert usage.cost.cacheRead == pytest.approx(0.3 * 400 / 1e6)
    assert usage.cost.cacheWrite == 0
    assert usage.cost.total == pytest.approx((3.0 * 1000 + 15.0 * 200 + 0.3 * 400) / 1e6)


@pytest.mark.parametrize("stop", ["length", "stop"])
@api_param
async def test_finish_reason(api: str, stop: str) -> None:
    script = [{"chunks": [{"text": "cut"}], "stop": stop}]
    async with open_fake_llm(script) as llm:
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)))
    assert types(events)[-1] == "done"
    assert events[-1].reason == stop
    assert call.final is not None
    assert call.final.stopReason == stop


# --- the request --------------------------------------------------------------------------------


@api_param
async def test_request_body_and_headers(api: str) -> None:
    key = "sk-secret-key-123"
    script = [{"chunks": [{"text": "ok"}], "repeat": True}]
    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        model = make_model(llm, api, reasoning=True)
        context = Context(system_prompt=("You are terse.", "Be kind."),
                          messages=(user("hello"),), tools=(WEATHER,))
        await collect(model, context, StreamOptions(
            api_key=key, thinking="high", max_tokens=1234, headers={"x-extra": "yes"}),
            http=client)
        await collect(model, context, StreamOptions(thinking="off"), http=client)
        with_key, without_key = llm.requests

    assert with_key.method == "POST"
    assert with_key.headers["authorization"] == f"Bearer {key}"
    assert with_key.headers["x-extra"] == "yes"
    assert with_key.headers["content-type"] == "application/json"
    assert key.encode() not in with_key.body
    assert "authorization" not in without_key.headers
    # The first response was read to its end, so its connection carried the second request.
    assert with_key.connection == without_key.connection
    body, off = with_key.json(), without_key.json()
    assert body["model"] == "gpt-test"
    assert body["stream"] is True
    if api == "openai-completions":
        assert with_key.path == "/v1/chat/completions"
        assert body["stream_options"] == {"include_usage": True}
        assert body["messages"] == [
            {"role": "system", "content": "You are terse.\n\nBe kind."},
            {"role": "user", "content": "hello"}]
        assert body["max_completion_tokens"] == 1234
        assert body["reasoning_effort"] == "high"
        assert body["tools"] == [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather for a city.",
            "parameters": WEATHER.parameters}}]
        assert "reasoning_effort" not in off
        # Without one asked for, the model's own (at most 64,000: omp.llm.providers).
        assert off.get("max_completion_tokens") == (
            min(model.maxTokens, 64000) if model.maxTokens else None)
    else:
        assert with_key.path == "/v1/responses"
        assert body["store"] is False
        assert body["instructions"] == "You are terse.\n\nBe kind."
        assert body["input"] == [{"role": "user",
                                  "content": [{"type": "input_text", "text": "hello"}]}]
        assert body["max_output_tokens"] == 1234
        assert body["reasoning"] == {"effort": "high", "summary": "auto"}
        assert body["include"] == ["reasoning.encrypted_content"]
        assert body["tools"] == [{"type": "function", "name": "get_weather",
                                  "description": "Weather for a city.",
                                  "parameters": WEATHER.parameters}]
        assert "reasoning" not in off
        assert "include" not in off


@pytest.mark.parametrize("images", [False, True])
@api_param
async def test_images_only_for_models_that_take_them(api: str, images: bool) -> None:
    picture = m.ImageContent(data=PNG, mimeType="image/png")
    call_1 = m.ToolCall(id="call_1", name="read", arguments={"path": "a.png"})
    assistant = m.AssistantMessage(
        content=[call_1], api=api, provider="openai", model="gpt-test", usage=m.Usage.zero(),
        stopReason="toolUse", timestamp=2)
    history = (
        user([m.TextContent(text="look at this"), picture]),
        assistant,
        m.ToolResultMessage(toolCallId="call_1", toolName="read", isError=False, timestamp=3,
                            content=[m.TextContent(text="Read image file [image/png]"), picture]),
    )
    async with open_fake_llm([{"chunks": [{"text": "ok"}]}]) as llm:
        call, _ = await run_call(make_model(llm, api, images=images),
                                 Context(messages=history))
        request = llm.requests[0]
    assert call.error is None
    body = request.json()
    url = f"data:image/png;base64,{PNG}"
    if not images:
        assert PNG.encode() not in request.body
    if api == "openai-completions":
        messages = body["messages"]
        assert messages[2] == {"role": "tool", "tool_call_id": "call_1",
                               "content": "Read image file [image/png]"}
        if images:
            assert messages[0]["content"] == [
                {"type": "text", "text": "look at this"},
                {"type": "image_url", "image_url": {"url": url}}]
            # Tool messages cannot hold images: they follow in a user message.
            assert messages[3] == {"role": "user", "content": [
                {"type": "text", "text": "Attached image(s) from tool result:"},
                {"type": "image_url", "image_url": {"url": url}}]}
        else:
            assert messages[0] == {"role": "user", "content": "look at this"}
            assert len(messages) == 3
    else:
        items = body["input"]
        assert items[2] == {"type": "function_call_output", "call_id": "call_1",
                            "output": "Read image file [image/png]"}
        if images:
            image_part = {"type": "input_image", "detail": "auto", "image_url": url}
            assert items[0]["content"] == [{"type": "input_text", "text": "look at this"},
                                           image_part]
            assert items[3] == {"role": "user", "content": [
                {"type": "input_text", "text": "Attached image(s) from tool result:"},
                image_part]}
        else:
            assert items[0] == {"role": "user",
                                "content": [{"type": "input_text", "text": "look at this"}]}
            assert len(items) == 3


@api_param
async def test_history_is_repaired_before_sending(api: str) -> None:
    def turn(content: list[m.AssistantContent], stop: m.StopReason) -> m.AssistantMessage:
        return m.AssistantMessage(content=content, api=api, provider="openai", model="gpt-test",
                                  usage=m.Usage.zero(), stopReason=stop, timestamp=2)

    orphan = m.ToolCall(id="call_9", name="get_weather", arguments={"city": "Oslo"})
    history = (
        user("one"),
        turn([m.TextContent(text="boom")], "error"),  # failed turn: dropped
        turn([m.ThinkingContent(thinking="hmm")], "aborted"),  # aborted, said nothing: dropped
        turn([m.TextContent(text="I was say")], "aborted"),  # aborted with text: kept
        user("two"),
        turn([orphan], "toolUse"),  # its result never came
        m.ToolResultMessage(toolCallId="call_404", toolName="x", isError=False, timestamp=3,
                            content=[m.TextContent(text="stray")]),  # no such call: dropped
        user("three"),
    )
    async with open_fake_llm([{"chunks": [{"text": "ok"}]}]) as llm:
        call, _ = await run_call(make_model(llm, api), Context(messages=history))
        request = llm.requests[0]
    assert call.error is None
    assert b"boom" not in request.body
    assert b"hmm" not in request.body
    assert b"stray" not in request.body
    body = request.json()
    if api == "openai-completions":
        assert body["messages"] == [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "I was say"},
            {"role": "user", "content": "two"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_9", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
            {"role": "tool", "tool_call_id": "call_9", "content": "No result provided"},
            {"role": "user", "content": "three"}]
    else:
        assert [(i.get("type"), i.get("role")) for i in body["input"]] == [
            (None, "user"), (None, "assistant"), (None, "user"), ("function_call", None),
            ("function_call_output", None), (None, "user")]
        assert body["input"][4] == {"type": "function_call_output", "call_id": "call_9",
                                    "output": "No result provided"}


async def test_responses_ids_from_another_provider_are_made_plain() -> None:
    foreign = m.AssistantMessage(
        content=[m.ToolCall(id="toolu_01.A/b", name="get_weather", arguments={})],
        api="anthropic-messages", provider="anthropic", model="claude", usage=m.Usage.zero(),
        stopReason="toolUse", timestamp=2)
    history = (user("hi"), foreign,
               m.ToolResultMessage(toolCallId="toolu_01.A/b", toolName="get_weather",
                                   isError=False, timestamp=3,
                                   content=[m.TextContent(text="sunny")]))
    async with open_fake_llm([{"chunks": [{"text": "ok"}]}]) as llm:
        await run_call(make_model(llm, "openai-responses"), Context(messages=history))
        items = llm.requests[0].json()["input"]
    assert items[1] == {"type": "function_call", "call_id": "toolu_01_A_b",
                        "name": "get_weather", "arguments": "{}"}
    assert items[2] == {"type": "function_call_output", "call_id": "toolu_01_A_b",
                        "output": "sunny"}


# --- errors -------------------------------------------------------------------------------------

HTTP_ERRORS = [
    pytest.param(401, {}, "Incorrect API key provided: sk-te***", "auth", False, None,
                 id="401-auth"),
    pytest.param(429, {"retry-after": "3"}, "Rate limit reached for requests", "rate_limit",
                 True, 3.0, id="429-rate-limit"),
    pytest.param(503, {}, "The engine is currently overloaded", "overloaded", True, None,
                 id="503-overloaded"),
    pytest.param(500, {}, "The server had an error while processing your request", "server",
                 True, None, id="500-server"),
    pytest.param(400, {}, "This model's maximum context length is 128000 tokens. However, your "
                 "messages resulted in 130000 tokens.", "context_overflow", False, None,
                 id="400-context-overflow"),
    pytest.param(400, {}, "Invalid value for 'tools[0].function.name'", "bad_request", False,
                 None, id="400-bad-request"),
]


@pytest.mark.parametrize(("status", "headers", "message", "kind", "retryable", "retry_after"),
                         HTTP_ERRORS)
@api_param
async def test_http_error_status(api: str, status: int, headers: dict[str, str], message: str,
                                 kind: str, retryable: bool, retry_after: float | None) -> None:
    script = [{"status": status, "headers": headers,
               "body": {"error": {"message": message, "type": "invalid_request_error"}}}]
    async with open_fake_llm(script) as llm:
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)))
    assert types(events) == ["error"]  # refused before any content: no start
    error = call.error
    assert error is not None
    assert (error.kind, error.retryable, error.http_status) == (kind, retryable, status)
    # The original's text: status and message, then the message with the body's machine fields.
    text = f"{status} {message}\n{message} (type=invalid_request_error)"
    assert (error.provider, error.model, error.message) == ("openai", "gpt-test", text)
    assert error.retry_after == retry_after
    final = events[0].message
    assert final is call.final
    assert final is not None
    assert (final.stopReason, final.errorMessage, final.errorStatus) == ("error", text, status)
    assert events[0].reason == "error"


@api_param
async def test_in_stream_error_event(api: str) -> None:
    script = [{"chunks": [{"text": "partial"}], "errorEvent": "The server had an error"}]
    async with open_fake_llm(script) as llm:
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)))
    # A failure ends the stream where it stands: the open block gets no text_end.
    assert types(events) == ["start", "text_start", "text_delta", "error"]
    assert call.error is not None
    assert call.error.kind == "server"
    assert call.error.retryable
    assert "The server had an error" in call.error.message
    assert call.final is not None
    assert call.final.stopReason == "error"
    assert call.final.content == [m.TextContent(text="partial")]


@api_param
async def test_refusal_finish_is_an_error(api: str) -> None:
    # The fake renders stop "error" as finish_reason content_filter / a failed response.
    async with open_fake_llm([{"chunks": [{"text": "I can"}], "stop": "error"}]) as llm:
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)))
    assert types(events)[-1] == "error"
    assert call.error is not None
    assert call.final is not None
    assert call.final.stopReason == "error"
    if api == "openai-completions":
        assert call.error.kind == "bad_request"
        assert call.final.errorMessage == "Provider finish_reason: content_filter"
    else:
        assert call.error.kind == "server"
        assert call.final.errorMessage == "server_error: fake LLM: stop reason error"


@api_param
async def test_dropped_stream(api: str) -> None:
    script = [{"chunks": [{"text": "a"}, {"text": "b"}, {"text": "c"}], "dropAfter": 2}]
    async with open_fake_llm(script) as llm:
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)))
    assert types(events) == ["start", "text_start", "text_delta", "text_delta", "error"]
    assert call.error is not None
    assert call.error.kind == "network"
    assert call.error.retryable
    assert call.final is not None
    assert call.final.stopReason == "error"
    # Named like the original's system error for a connection the peer cut.
    assert call.final.errorMessage == ("ECONNRESET: peer closed connection without sending "
                                       "complete message body (incomplete chunked read)")
    assert call.final.content == [m.TextContent(text="ab")]


@pytest.mark.parametrize(("api", "raw"), [
    ("openai-completions",
     ['data: {"id":"c1","choices":[{"index":0,"delta":{"content":"half"}}]}', ""]),
    ("openai-responses",
     ["event: response.created", 'data: {"type":"response.created","response":{"id":"r1"}}',
      "", 'data: {"type":"response.output_item.added","item":{"type":"message","id":"m1"}}',
      "", 'data: {"type":"response.output_text.delta","item_id":"m1","delta":"half"}', ""]),
])
async def test_stream_that_ends_cleanly_but_early(api: str, raw: list[str]) -> None:
    # The body ends properly, but without [DONE] / response.completed and without a finish.
    async with open_fake_llm([{"raw": raw}]) as llm:
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)))
    assert types(events) == ["start", "text_start", "text_delta", "error"]
    assert call.error is not None
    assert call.error.kind == "network"
    assert call.final is not None
    assert call.final.errorMessage == ("The stream ended early: the connection closed before "
                                       "the response was complete")
    assert call.final.content == [m.TextContent(text="half")]


@api_param
async def test_stalled_stream_times_out(api: str) -> None:
    async with open_fake_llm([{"chunks": [{"text": "a"}, {"text": "b"}], "hangAfter": 1}]) as llm:
        options = StreamOptions(api_key="sk-test", first_event_timeout=5, idle_timeout=0.2)
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)),
                                      options)
        await llm.wait_for_disconnect()
    assert types(events)[-1] == "error"
    assert call.error is not None
    assert call.error.kind == "network"
    assert "stream stall timeout" in call.error.message


@api_param
@pytest.mark.parametrize(("hang_after", "stalled_after"), [(1, 0.3), (0, 0.2)])
async def test_stall_bounded_by_httpx_names_the_limit_that_ran_out(
        api: str, hang_after: int, stalled_after: float) -> None:
    # The idle limit (0.3 s) is the longer one, so httpx's read timeout is the idle watchdog
    # (no deadline of ours per chunk); the wait for the first event keeps its own (0.2 s).
    script = [{"chunks": [{"text": "a"}, {"text": "b"}], "hangAfter": hang_after}]
    async with open_fake_llm(script) as llm:
        options = StreamOptions(api_key="sk-test", first_event_timeout=0.2, idle_timeout=0.3)
        started = trio.current_time()
        call, events = await run_call(make_model(llm, api), Context(messages=(user("hi"),)),
                                      options)
        took = trio.current_time() - started
        await llm.wait_for_disconnect()
    assert types(events)[-1] == "error"
    assert call.error is not None
    assert call.error.kind == "network"
    assert call.error.message == (f"Stream stalled: no data for {stalled_after:g} s "
                                  "(stream stall timeout; stream.idleTimeoutMs in config.yml)")
    assert stalled_after <= took < 5


async def test_an_event_that_takes_long_to_arrive_is_progress_keep_alives_are_not() -> None:
    """A stall is no byte of an event for ``idle_timeout`` (0.3 s): an event trickling in for
    1.5 s is read whole; keep-alive comments for as long are a stall."""
    trickle = {"prefix": 'data: {"choices":[{"delta":{"content":"', "fill": "x", "bytes": 30,
               "every": 0.05, "suffix": '"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'}
    first = 'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    keep_alives = {"fill": ": keep-alive\n\n", "every": 0.05}
    options = StreamOptions(api_key="sk-test", first_event_timeout=5, idle_timeout=0.3)
    context = Context(messages=(user("hi"),))
    async with open_fake_llm([{"raw": [first], "flood": trickle},
                              {"raw": [first], "flood": keep_alives}]) as llm:
        slow, _ = await run_call(make_model(llm, "openai-completions"), context, options)
        stalled, _ = await run_call(make_model(llm, "openai-completions"), context, options)
        await llm.wait_for_disconnect()
    assert slow.error is None
    assert slow.final is not None
    assert slow.final.content == [m.TextContent(text="a" + "x" * 30)]
    assert stalled.error is not None
    assert stalled.error.kind == "network"
    assert stalled.error.message.startswith(
        "Stream stalled: no event (keep-alives only) for 0.3 s (stream stall timeout")


@api_param
async def test_hung_stream_cancelled(api: str) -> None:
    script = [{"chunks": [{"text": "never "}, {"text": "finishes"}], "hangAfter": 1}]
    events: list[StreamEvent] = []

    def emit(event: StreamEvent) -> None:
        event.freeze()
        events.append(event)

    async with open_fake_llm(script) as llm, httpx.AsyncClient() as client:
        before = walk_tasks()
        call = ModelCall(make_model(llm, api), Context(messages=(user("hi"),)),
                         StreamOptions(api_key="sk-test"))
        with trio.move_on_after(0.5) as scope:
            await call.run(emit, http=client)
        assert scope.cancelled_caught
        with trio.fail_after(5):
            await llm.wait_for_disconnect()
            await llm.wait_until(lambda fake: fake.connections == 0 and fake.active == 0)
        assert walk_tasks() == before
    assert types(events) == ["start", "text_start", "text_delta"]  # nothing after the abort
    assert call.final is not None
    assert call.final.stopReason == "aborted"
    assert call.final.errorMessage == "Request was aborted"
    assert call.final.content == [m.TextContent(text="never ")]
    assert call.error is None


# --- chat-completions quirks of compatible servers ----------------------------------------------


async def test_completions_compatible_server_quirks() -> None:
    # ``reasoning`` as the field, tool calls that all say index 0 but differ by id, and one
    # without an id; no [DONE] after the finish.
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return "data: " + msgspec.json.encode(
            {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).decode() + "\n"

    raw = [
        chunk({"reasoning": "hmm"}),
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f",
                                                                   "arguments": '{"x":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
        chunk({"tool_calls": [{"index": 0, "id": "b", "function": {"name": "g",
                                                                   "arguments": "{}"}}]}),
        chunk({"tool_calls": [{"index": 1, "function": {"name": "h", "arguments": "{}"}}]}),
        chunk({}, "TOOL_CALLS"),
    ]
    async with open_fake_llm([{"raw": raw}]) as llm:
        call, events = await run_call(make_model(llm, "openai-completions"),
                                      Context(messages=(user("hi"),)))
    assert call.error is None
    assert call.final is not None
    thinking, *calls = call.final.content
    assert thinking == m.ThinkingContent(thinking="hmm", thinkingSignature="reasoning")
    assert [(c.id[:5], c.name, c.arguments) for c in calls] == [  # type: ignore[union-attr]
        ("a", "f", {"x": 1}), ("b", "g", {}), ("call_", "h", {})]
    assert call.final.stopReason == "toolUse"
    assert types(events).count("toolcall_end") == 3


async def test_completions_chunks_of_another_shape_are_read_leniently() -> None:
    # Chunks decode straight into a typed struct; one of another shape (choices an object,
    # a delta that is a string, a bare number, a choice that is not an object) must neither
    # fail the stream nor lose what the well-formed chunks around it said.
    raw = [
        'data: {"id": "chatcmpl-1", "choices": [{"delta": {"content": "Hel"}}]}\n',
        'data: {"choices": {"0": {"delta": {"content": "lost"}}}}\n',
        'data: {"choices": [{"delta": "not an object"}]}\n',
        "data: 42\n",
        'data: {"choices": ["not an object"], "usage": {"prompt_tokens": 7,'
        ' "completion_tokens": 2}}\n',
        'data: {"choices": [{"delta": {"content": "lo", "tool_calls": 5}, '
        '"finish_reason": "stop"}]}\n',
        "data: [DONE]\n",
    ]
    async with open_fake_llm([{"raw": raw}]) as llm:
        call, _ = await run_call(make_model(llm, "openai-completions"),
                                 Context(messages=(user("hi"),)))
    assert call.error is None
    assert call.final is not None
    assert call.final.content == [m.TextContent(text="Hello")]
    assert call.final.responseId == "chatcmpl-1"
    assert (call.final.usage.input, call.final.usage.output) == (7, 2)
    assert call.final.stopReason == "stop"


async def test_completions_malformed_chunk_is_a_provider_error() -> None:
    raw = ['data: {"choices": [{"delta": {"content": "a"}}]}\n', "data: {not json\n"]
    async with open_fake_llm([{"raw": raw}]) as llm:
        call, _ = await run_call(make_model(llm, "openai-completions"),
                                 Context(messages=(user("hi"),)))
    assert call.error is not None
    assert call.error.message.startswith("Malformed stream from ")
    assert call.error.message.endswith("; it sent: '{not json'")
    assert call.error.kind == "bad_response"
    assert not call.error.retryable
    assert call.final is not None
    assert call.final.stopReason == "error"


async def test_responses_summary_parts_refusal_and_incomplete() -> None:
    def event(kind: str, **fields: Any) -> str:
        return (f"event: {kind}\ndata: "
                + msgspec.json.encode({"type": kind, **fields}).decode() + "\n")

    reasoning = {"type": "reasoning", "id": "rs_1", "encrypted_content": "enc",
                 "summary": [{"type": "summary_text", "text": "First."},
                             {"type": "summary_text", "text": "Second."}]}
    raw = [
        event("response.created", response={"id": "resp_9", "status": "in_progress"}),
        event("response.output_item.added", output_index=0,
              item={"type": "reasoning", "id": "rs_1", "summary": []}),
        event("response.reasoning_summary_part.added", item_id="rs_1", summary_index=0),
        event("response.reasoning_summary_text.delta", item_id="rs_1", delta="First."),
        event("response.reasoning_summary_part.added", item_id="rs_1", summary_index=1),
        event("response.reasoning_summary_text.delta", item_id="rs_1", delta="Second."),
        event("response.output_item.done", output_index=0, item=reasoning),
        event("response.output_item.added", output_index=1,
              item={"type": "message", "id": "msg_1", "content": []}),
        event("response.refusal.delta", item_id="msg_1", delta="I can't help"),
        event("response.output_item.done", output_index=1,
              item={"type": "message", "id": "msg_1", "phase": "final_answer",
                    "content": [{"type": "refusal", "refusal": "I can't help"}]}),
        event("response.incomplete", response={
            "id": "resp_9", "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 5, "output_tokens": 9, "total_tokens": 14}}),
    ]
    async with open_fake_llm([{"raw": raw}]) as llm:
        call, events = await run_call(make_model(llm, "openai-responses", reasoning=True),
                                      Context(messages=(user("hi"),)))
    assert call.error is None
    assert [e.delta for e in events if e.type == "thinking_delta"] == [
        "First.", "\n\n", "Second."]
    final = call.final
    assert final is not None
    assert final.content == [
        m.ThinkingContent(thinking="First.\n\nSecond.",
                          thinkingSignature=msgspec.json.encode(reasoning).decode()),
        m.TextContent(text="I can't help",
                      textSignature='{"v":1,"id":"msg_1","phase":"final_answer"}')]
    assert final.stopReason == "length"
    assert final.responseId == "resp_9"
    assert (final.usage.input, final.usage.output, final.usage.totalTokens) == (5, 9, 14)
