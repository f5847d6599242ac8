"""The fake LLM server over real loopback HTTP: four stream formats, errors, cuts, the CLI."""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio

from omp.llm.sse import SseDecoder, SseEvent
from omp.testing.fake_llm import FakeLLM, open_fake_llm, serve_fake_llm
from omp.testing.script import Chunk, Reply

COMPLETIONS = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
GOOGLE = "/v1beta/models/gemini-test:streamGenerateContent"

# Thinking (two deltas, signed), text (two deltas), two tool calls whose arguments arrive in
# pieces, and usage: every format must carry all of it.
FULL_REPLY: dict[str, Any] = {
    "chunks": [
        {"thinking": "Let me "}, {"thinking": "think", "signature": "sig-1"},
        {"text": "Hel"}, {"text": "lo"},
        {"toolCall": {"id": "call_1", "name": "get_weather",
                      "arguments": ['{"city": ', '"Paris"}']}},
        {"toolCall": {"id": "call_2", "name": "get_time",
                      "arguments": ['{"tz"', ': "UTC"', "}"]}},
    ],
    "usage": {"input": 10, "output": 20, "cacheRead": 3, "cacheWrite": 4, "reasoning": 5},
}


async def read_events(response: httpx.Response) -> list[SseEvent]:
    decoder = SseDecoder()
    events: list[SseEvent] = []
    async for data in response.aiter_bytes():
        events += decoder.feed(data)
    return events + decoder.close()


async def post_events(fake: FakeLLM, path: str, body: Any = None,
                      client: httpx.AsyncClient | None = None) -> list[SseEvent]:
    async def go(c: httpx.AsyncClient) -> list[SseEvent]:
        async with c.stream("POST", fake.base_url + path, json=body or {"model": "m"}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"] == "text/event-stream"
            return await read_events(r)
    with trio.fail_after(10):
        if client is not None:
            return await go(client)
        async with httpx.AsyncClient() as c:
            return await go(c)


def payloads(events: list[SseEvent]) -> list[Any]:
    return [json.loads(e.data) for e in events if e.data != "[DONE]"]


# ----------------------------------------------------------------------------- the formats


async def test_openai_completions_stream() -> None:
    async with open_fake_llm([FULL_REPLY]) as fake:
        events = await post_events(fake, COMPLETIONS, {
            "model": "gpt-test", "stream": True, "stream_options": {"include_usage": True}})
    assert all(e.event is None for e in events)
    assert events[-1].data == "[DONE]"
    chunks = payloads(events)
    assert {c["model"] for c in chunks} == {"gpt-test"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0]["role"] == "assistant"
    assert [d["reasoning_content"] for d in deltas if "reasoning_content" in d] == [
        "Let me ", "think"]
    assert [d["content"] for d in deltas if d.get("content")] == ["Hel", "lo"]
    calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
    assert calls[0] == {"index": 0, "id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": '}}
    assert calls[1] == {"index": 0, "function": {"arguments": '"Paris"}'}}
    assert calls[2]["id"] == "call_2"
    assert calls[2]["function"]["name"] == "get_time"
    by_index: dict[int, str] = {}
    for tc in calls:
        by_index[tc["index"]] = by_index.get(tc["index"], "") + tc["function"]["arguments"]
    assert by_index == {0: '{"city": "Paris"}', 1: '{"tz": "UTC"}'}
    assert len([tc for tc in calls if tc["index"] == 1]) == 3
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finish[:-1] == [None] * (len(finish) - 1)
    assert finish[-1] == "tool_calls"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 13, "completion_tokens": 20, "total_tokens": 33,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 5}}


async def test_openai_completions_usage_only_when_asked() -> None:
    async with open_fake_llm([{"chunks": [{"text": "hi"}], "usage": {"input": 1}}]) as fake:
        events = await post_events(fake, COMPLETIONS, {"model": "m", "stream": True})
    assert not any("usage" in c for c in payloads(events))
    assert payloads(events)[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1].data == "[DONE]"


async def test_openai_responses_stream() -> None:
    async with open_fake_llm([FULL_REPLY]) as fake:
        events = await post_events(fake, RESPONSES, {"model": "gpt-5-test", "stream": True})
    data = payloads(events)
    for event, payload in zip(events, data, strict=True):
        assert event.event == payload["type"]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    names = [e.event for e in events]
    assert names[:2] == ["response.created", "response.in_progress"]
    assert names[-1] == "response.completed"
    added = [d["item"] for d in data if d["type"] == "response.output_item.added"]
    assert [i["type"] for i in added] == ["reasoning", "message", "function_call",
                                          "function_call"]
    assert [d["delta"] for d in data if d["type"] == "response.reasoning_summary_text.delta"] \
        == ["Let me ", "think"]
    assert [d["delta"] for d in data if d["type"] == "response.output_text.delta"] \
        == ["Hel", "lo"]
    assert [d["delta"] for d in data if d["type"] == "response.function_call_arguments.delta"] \
        == ['{"city": ', '"Paris"}', '{"tz"', ': "UTC"', "}"]
    assert [d["arguments"] for d in data
            if d["type"] == "response.function_call_arguments.done"] \
        == ['{"city": "Paris"}', '{"tz": "UTC"}']
    done = [d["item"] for d in data if d["type"] == "response.output_item.done"]
    assert done[0]["type"] == "reasoning"
    assert done[0]["summary"] == [{"type": "summary_text", "text": "Let me think"}]
    assert done[0]["encrypted_content"] == "sig-1"
    assert done[1]["content"] == [{"type": "output_text", "text": "Hello", "annotations": []}]
    assert (done[2]["call_id"], done[2]["name"], done[2]["arguments"]) == (
        "call_1", "get_weather", '{"city": "Paris"}')
    assert done[3]["call_id"] == "call_2"
    assert [d["output_index"] for d in data if d["type"] == "response.output_item.done"] \
        == [0, 1, 2, 3]
    response = data[-1]["response"]
    assert response["status"] == "completed"
    assert response["model"] == "gpt-5-test"
    assert response["output"] == done
    assert response["usage"] == {
        "input_tokens": 13, "input_tokens_details": {"cached_tokens": 3},
        "output_tokens": 20, "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 33}


async def test_anthropic_messages_stream() -> None:
    reply = {**FULL_REPLY, "chunks": [*FULL_REPLY["chunks"][:2], {"redactedThinking": "opaque"},
                                      *FULL_REPLY["chunks"][2:]]}
    async with open_fake_llm([reply]) as fake:
        events = await post_events(fake, MESSAGES, {"model": "claude-test", "stream": True})
    data = payloads(events)
    for event, payload in zip(events, data, strict=True):
        assert event.event == payload["type"]
    names = [e.event for e in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    start = data[0]["message"]
    assert start["model"] == "claude-test"
    assert start["usage"] == {"input_tokens": 10, "cache_creation_input_tokens": 4,
                              "cache_read_input_tokens": 3, "output_tokens": 0}
    blocks = [d["content_block"] for d in data if d["type"] == "content_block_start"]
    assert blocks == [
        {"type": "thinking", "thinking": ""},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": ""},
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}},
        {"type": "tool_use", "id": "call_2", "name": "get_time", "input": {}},
    ]
    deltas: dict[int, list[dict[str, Any]]] = {}
    for d in data:
        if d["type"] == "content_block_delta":
            deltas.setdefault(d["index"], []).append(d["delta"])
    assert deltas[0] == [{"type": "thinking_delta", "thinking": "Let me "},
                         {"type": "thinking_delta", "thinking": "think"},
                         {"type": "signature_delta", "signature": "sig-1"}]
    assert 1 not in deltas
    assert deltas[2] == [{"type": "text_delta", "text": "Hel"},
                         {"type": "text_delta", "text": "lo"}]
    assert [d["partial_json"] for d in deltas[3]] == ['{"city": ', '"Paris"}']
    assert [d["partial_json"] for d in deltas[4]] == ['{"tz"', ': "UTC"', "}"]
    # Every block starts before its deltas and stops after them, in index order.
    opened: list[int] = []
    for d in data:
        if d["type"] == "content_block_start":
            assert d["index"] == len(opened)
            opened.append(d["index"])
        elif d["type"] in ("content_block_delta", "content_block_stop"):
            assert d["index"] == opened[-1]
    assert [d["index"] for d in data if d["type"] == "content_block_stop"] == [0, 1, 2, 3, 4]
    assert data[-2] == {"type": "message_delta",
                        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                        "usage": {"output_tokens": 20}}


async def test_google_stream() -> None:
    async with open_fake_llm([FULL_REPLY]) as fake:
        events = await post_events(fake, GOOGLE + "?alt=sse", {"contents": []})
        assert fake.requests[0].query == {"alt": "sse"}
    data = payloads(events)
    parts = [p for d in data for p in d["candidates"][0]["content"]["parts"]]
    assert parts == [
        {"text": "Let me ", "thought": True},
        {"text": "think", "thought": True, "thoughtSignature": "sig-1"},
        {"text": "Hel"}, {"text": "lo"},
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}},
        {"functionCall": {"name": "get_time", "args": {"tz": "UTC"}, "id": "call_2"}},
    ]
    assert {d["modelVersion"] for d in data} == {"gemini-test"}
    assert [d["candidates"][0].get("finishReason") for d in data][-1] == "STOP"
    assert all("finishReason" not in d["candidates"][0] for d in data[:-1])
    assert data[-1]["usageMetadata"] == {
        "promptTokenCount": 13, "candidatesTokenCount": 15, "thoughtsTokenCount": 5,
        "cachedContentTokenCount": 3, "totalTokenCount": 33}


async def test_google_events_end_in_crlf() -> None:
    async with open_fake_llm([{"chunks": [{"text": "a"}]}]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            r = await c.post(fake.base_url + GOOGLE)
    assert r.content.startswith(b"data: {")
    assert r.content.endswith(b"}\r\n\r\n")
    assert r.content.count(b"\r\n\r\n") == 2


NATIVE_STOPS = {
    COMPLETIONS: {"stop": "stop", "length": "length", "toolUse": "tool_calls",
                  "error": "content_filter"},
    RESPONSES: {"stop": "completed", "length": "incomplete", "toolUse": "completed",
                "error": "failed"},
    MESSAGES: {"stop": "end_turn", "length": "max_tokens", "toolUse": "tool_use",
               "error": "refusal"},
    GOOGLE: {"stop": "STOP", "length": "MAX_TOKENS", "toolUse": "STOP", "error": "SAFETY"},
}


def native_stop(path: str, data: list[Any]) -> str:
    last = data[-1]
    if path == COMPLETIONS:
        return str(last["choices"][0]["finish_reason"])
    if path == RESPONSES:
        return str(last["response"]["status"])
    if path == MESSAGES:
        return str(data[-2]["delta"]["stop_reason"])
    return str(last["candidates"][0]["finishReason"])


@pytest.mark.parametrize("path", list(NATIVE_STOPS))
@pytest.mark.parametrize("stop", ["stop", "length", "toolUse", "error"])
async def test_stop_reasons(path: str, stop: str) -> None:
    async with open_fake_llm([{"chunks": [{"text": "x"}], "stop": stop}]) as fake:
        data = payloads(await post_events(fake, path))
    assert native_stop(path, data) == NATIVE_STOPS[path][stop]
    if path == RESPONSES and stop == "length":
        assert data[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


@pytest.mark.parametrize("path", list(NATIVE_STOPS))
async def test_stop_defaults_to_tool_use_after_a_tool_call(path: str) -> None:
    call = {"toolCall": {"id": "c", "name": "n", "arguments": ["{}"]}}
    async with open_fake_llm([{"chunks": [call]}, {"chunks": [{"text": "x"}]}]) as fake:
        assert native_stop(path, payloads(await post_events(fake, path))) \
            == NATIVE_STOPS[path]["toolUse"]
        assert native_stop(path, payloads(await post_events(fake, path))) \
            == NATIVE_STOPS[path]["stop"]


async def test_in_stream_errors() -> None:
    reply = {"chunks": [{"text": "partial"}], "errorEvent": "Overloaded", "repeat": True}
    async with open_fake_llm([reply]) as fake:
        completions = await post_events(fake, COMPLETIONS)
        responses = await post_events(fake, RESPONSES)
        anthropic = await post_events(fake, MESSAGES)
        google = await post_events(fake, GOOGLE)
    assert payloads(completions)[-1] == {"error": {
        "message": "Overloaded", "type": "server_error", "param": None, "code": None}}
    assert all(e.data != "[DONE]" for e in completions)
    assert not any(c.get("choices", [{}])[0].get("finish_reason") for c in
                   payloads(completions)[:-1])
    assert [e.event for e in responses[-2:]] == ["error", "response.failed"]
    assert payloads(responses)[-2]["message"] == "Overloaded"
    assert payloads(responses)[-1]["response"]["error"] == {
        "code": "server_error", "message": "Overloaded"}
    assert "response.completed" not in [e.event for e in responses]
    assert anthropic[-1].event == "error"
    assert payloads(anthropic)[-1] == {
        "type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert "message_stop" not in [e.event for e in anthropic]
    assert payloads(google)[-1] == {
        "error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}}
    assert payloads(google)[0]["candidates"][0]["content"]["parts"] == [{"text": "partial"}]


async def test_raw_lines_are_sent_verbatim() -> None:
    raw = ["event: custom", 'data: {"a": 1}', "", ": comment", "data: [DONE]", ""]
    async with open_fake_llm([{"raw": raw}]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            r = await c.post(fake.base_url + MESSAGES, json={})
    assert r.headers["content-type"] == "text/event-stream"
    assert r.text == "event: custom\ndata: {\"a\": 1}\n\n: comment\ndata: [DONE]\n\n"


async def test_a_flood_of_a_given_size_follows_the_raw_lines() -> None:
    flood = {"prefix": 'data: "', "fill": "xy", "bytes": 300_001, "suffix": '"\n\n'}
    async with open_fake_llm([{"raw": [": first"], "flood": flood}]) as fake, \
            httpx.AsyncClient() as c:
        with trio.fail_after(10):
            r = await c.post(fake.base_url + COMPLETIONS, json={})
    assert r.text == ': first\ndata: "' + ("xy" * 150_001)[:300_001] + '"\n\n'


async def test_a_flood_without_end_goes_on_until_the_client_leaves() -> None:
    async with open_fake_llm([{"flood": {"fill": ": keep-alive\n\n"}}]) as fake, \
            httpx.AsyncClient() as c:
        with trio.fail_after(10):
            seen = 0
            async with c.stream("POST", fake.base_url + COMPLETIONS, json={}) as r:
                async for data in r.aiter_bytes():
                    seen += len(data)
                    if seen > 4 * 1024 * 1024:
                        break
            await fake.wait_for_disconnect()
    assert fake.disconnects == 1


async def test_one_hundred_thousand_deltas_arrive_in_order() -> None:
    texts = [f"t{i} " for i in range(100_000)]
    reply = Reply(chunks=[Chunk(text=t) for t in texts])
    async with open_fake_llm([reply]) as fake:
        data = payloads(await post_events(fake, COMPLETIONS))
    got = [c["choices"][0]["delta"].get("content") for c in data]
    assert [g for g in got if g] == texts


# ----------------------------------------------------------------------------- HTTP errors


async def test_error_status_with_headers_and_json_body() -> None:
    body = {"error": {"message": "rate limited", "type": "rate_limit_error"}}
    script = [{"status": 429, "headers": {"retry-after": "3", "x-request-id": "req-1"},
               "body": body}]
    async with open_fake_llm(script) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            r = await c.post(fake.base_url + MESSAGES, json={"model": "m"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "3"
    assert r.headers["x-request-id"] == "req-1"
    assert r.headers["content-type"] == "application/json"
    assert r.json() == body


async def test_error_status_with_text_body() -> None:
    async with open_fake_llm([{"status": 503, "body": "upstream down"}]) as fake, \
            httpx.AsyncClient() as c:
        with trio.fail_after(10):
            r = await c.post(fake.base_url + COMPLETIONS, json={})
    assert r.status_code == 503
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text == "upstream down"


async def test_exhausted_script_answers_500_naming_the_path() -> None:
    async with open_fake_llm([{"chunks": [{"text": "once"}]}]) as fake, \
            httpx.AsyncClient() as c:
        with trio.fail_after(10):
            first = await c.post(fake.base_url + COMPLETIONS, json={})
            second = await c.post(fake.base_url + RESPONSES, json={})
    assert first.status_code == 200
    assert second.status_code == 500
    message = second.json()["error"]["message"]
    assert "fake LLM: script exhausted" in message
    assert RESPONSES in message
    assert len(fake.requests) == 2


async def test_unknown_path_for_a_stream_is_404() -> None:
    async with open_fake_llm([{"chunks": [{"text": "x"}]}]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            r = await c.post(fake.base_url + "/v1/embeddings", json={})
    assert r.status_code == 404
    assert "/v1/embeddings" in r.json()["error"]["message"]


# ----------------------------------------------------------------------------- matching


async def test_matching_by_path_model_and_body() -> None:
    script: list[dict[str, Any]] = [
        {"match": {"bodyContains": "weather"}, "chunks": [{"text": "by body"}]},
        {"match": {"model": "gemini-x"}, "chunks": [{"text": "by google model"}]},
        {"match": {"model": "gpt-a"}, "chunks": [{"text": "by model"}]},
        {"match": {"path": "/messages"}, "chunks": [{"text": "by path"}], "repeat": True},
        {"chunks": [{"text": "anything"}]},
    ]

    def text(data: list[SseEvent]) -> str:
        return "".join(c["choices"][0]["delta"].get("content", "")
                       for c in payloads(data) if c.get("choices"))

    async with open_fake_llm(script) as fake:
        assert text(await post_events(fake, COMPLETIONS, {"model": "gpt-a"})) == "by model"
        anthropic = await post_events(fake, MESSAGES, {"model": "gpt-a"})
        assert payloads(anthropic)[3]["delta"]["text"] == "by path"
        anthropic = await post_events(fake, MESSAGES, {"model": "claude"})
        assert payloads(anthropic)[3]["delta"]["text"] == "by path"  # repeat stays
        google = await post_events(fake, "/v1beta/models/gemini-x:streamGenerateContent")
        assert payloads(google)[0]["candidates"][0]["content"]["parts"][0]["text"] \
            == "by google model"
        assert text(await post_events(
            fake, COMPLETIONS, {"model": "m", "q": "the weather?"})) == "by body"
        assert text(await post_events(fake, COMPLETIONS, {"model": "gpt-a"})) == "anything"
        assert fake.remaining == 1  # only the repeat entry
        assert [r.model for r in fake.requests] == [
            "gpt-a", "gpt-a", "claude", "gemini-x", "m", "gpt-a"]


async def test_add_appends_replies_at_runtime() -> None:
    async with open_fake_llm() as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            assert (await c.post(fake.base_url + COMPLETIONS, json={})).status_code == 500
            fake.add({"status": 418, "body": {"later": True}})
            fake.add(Reply(status=201, body="typed"))
            fake.add({"body": {"not": "streamed"}})
            assert (await c.post(fake.base_url + COMPLETIONS, json={})).status_code == 418
            assert (await c.post(fake.base_url + COMPLETIONS, json={})).text == "typed"
            plain = await c.post(fake.base_url + COMPLETIONS, json={})
            assert (plain.status_code, plain.json()) == (200, {"not": "streamed"})


async def test_script_as_json_text_or_file(tmp_path: Path) -> None:
    text = json.dumps([{"status": 400, "body": {"from": "json"}}])
    file = tmp_path / "script.json"
    file.write_text(json.dumps([{"status": 401, "body": {"from": "file"}}]))
    async with open_fake_llm(text) as a, open_fake_llm(file) as b, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            assert (await c.post(a.base_url + MESSAGES)).json() == {"from": "json"}
            assert (await c.post(b.base_url + MESSAGES)).status_code == 401


async def test_bad_script_raises_naming_the_field() -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `sttus`"):
        async with open_fake_llm([{"sttus": 500}]):
            pass  # pragma: no cover


async def test_google_tool_call_arguments_must_be_an_object() -> None:
    bad = {"chunks": [{"toolCall": {"id": "c", "name": "n", "arguments": ['{"a": ']}}]}
    async with open_fake_llm([bad, bad]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            r = await c.post(fake.base_url + GOOGLE, json={})
            assert r.status_code == 500
            assert "not a JSON object" in r.json()["error"]["message"]
            # Other formats stream broken arguments as they are.
            events = await post_events(fake, MESSAGES, client=c)
    assert payloads(events)[3]["delta"]["partial_json"] == '{"a": '


# ----------------------------------------------------------------------------- requests


async def test_records_requests() -> None:
    async with open_fake_llm([{"chunks": [{"text": "x"}]}]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            await c.post(fake.base_url + GOOGLE + "?alt=sse&key=k", json={"contents": [1]},
                         headers={"X-Goog-Api-Key": "secret"})
    [request] = fake.requests
    assert request.method == "POST"
    assert request.path == GOOGLE
    assert request.target == GOOGLE + "?alt=sse&key=k"
    assert request.query == {"alt": "sse", "key": "k"}
    assert request.headers["x-goog-api-key"] == "secret"
    assert request.headers["content-type"] == "application/json"
    assert request.json() == {"contents": [1]}
    assert request.body == b'{"contents":[1]}'


async def test_keep_alive_reuses_one_connection() -> None:
    async with open_fake_llm([{"chunks": [{"text": "x"}], "repeat": True}]) as fake:
        async with httpx.AsyncClient() as c:
            for path in NATIVE_STOPS:
                await post_events(fake, path, client=c)
            with trio.fail_after(10):  # also a request whose response is read whole
                assert (await c.post(fake.base_url + COMPLETIONS, json={})).status_code == 200
            assert fake.connections == 1
        assert {r.connection for r in fake.requests} == {1}
        assert len(fake.requests) == 5
        with trio.fail_after(10):
            await fake.wait_until(lambda f: f.connections == 0)
    assert fake.disconnects == 0


async def text_arrivals(reply: dict[str, Any]) -> list[tuple[float, str]]:
    """Each text delta of ``reply`` (chat completions) with the time it was read."""
    arrivals: list[tuple[float, str]] = []
    async with open_fake_llm([reply]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            async with c.stream("POST", fake.base_url + COMPLETIONS, json={}) as r:
                decoder = SseDecoder()
                async for data in r.aiter_bytes():
                    for event in decoder.feed(data):
                        if event.data != "[DONE]":
                            delta = json.loads(event.data)["choices"][0]["delta"]
                            if delta.get("content"):
                                arrivals.append((trio.current_time(), delta["content"]))
    return arrivals


async def test_delays_are_real_time_between_flushed_deltas() -> None:
    reply = {"chunks": [{"text": "a"}, {"text": "b", "delay": 0.3}, {"delay": 0.2},
                        {"text": "c"}]}
    arrivals = await text_arrivals(reply)
    assert [t for _, t in arrivals] == ["a", "b", "c"]
    assert arrivals[1][0] - arrivals[0][0] >= 0.29
    assert arrivals[2][0] - arrivals[1][0] >= 0.19


async def test_at_is_a_schedule_from_the_start_of_the_reply() -> None:
    # "b" is due 0.3 s in but waits behind a 0.5 s delay; "c" is still due at 0.9 s, not 0.6 s
    # after "b" (a late chunk does not push the later ones back).
    reply = {"chunks": [{"text": "a"}, {"delay": 0.5}, {"text": "b", "at": 0.3},
                        {"text": "c", "at": 0.9}]}
    arrivals = await text_arrivals(reply)
    assert [t for _, t in arrivals] == ["a", "b", "c"]
    assert arrivals[1][0] - arrivals[0][0] >= 0.49
    assert 0.2 <= arrivals[2][0] - arrivals[1][0] < 0.55


# ----------------------------------------------------------------------------- cut streams


def count_tasks(task: trio.lowlevel.Task) -> int:
    return 1 + sum(count_tasks(child) for nursery in task.child_nurseries
                   for child in nursery.child_tasks)


@pytest.mark.parametrize("path", list(NATIVE_STOPS))
async def test_drop_after_cuts_the_connection_mid_stream(path: str) -> None:
    reply = {"chunks": [{"text": "partial"}, {"text": "never sent"}], "dropAfter": 1}
    events: list[SseEvent] = []
    async with open_fake_llm([reply]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10), pytest.raises(httpx.RemoteProtocolError):  # noqa: PT012
            async with c.stream("POST", fake.base_url + path, json={}) as r:
                assert r.status_code == 200
                decoder = SseDecoder()
                async for data in r.aiter_bytes():
                    events += decoder.feed(data)
        with trio.fail_after(10):
            await fake.wait_until(lambda f: f.connections == 0)
        assert fake.disconnects == 0  # the server hung up, not the client
    text = json.dumps(payloads(events))
    assert "partial" in text
    assert "never sent" not in text


async def test_hang_after_then_client_cancel_is_seen_as_a_disconnect() -> None:
    reply = {"chunks": [{"text": "first"}, {"text": "never"}], "hangAfter": 1}
    async with open_fake_llm([reply]) as fake:
        baseline = count_tasks(trio.lowlevel.current_task())
        got_first = trio.Event()
        async with httpx.AsyncClient() as c:
            async def consume() -> None:
                async with c.stream("POST", fake.base_url + MESSAGES, json={}) as r:
                    decoder = SseDecoder()
                    async for data in r.aiter_bytes():
                        if any(e.event == "content_block_delta" for e in decoder.feed(data)):
                            got_first.set()

            with trio.fail_after(10):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(consume)
                    await got_first.wait()
                    assert fake.active == 1
                    assert fake.disconnects == 0
                    nursery.cancel_scope.cancel()
                # The cancelled request closed its connection; the client is still open.
                await fake.wait_for_disconnect()
                await fake.wait_idle()
                await fake.wait_until(lambda f: f.connections == 0)
            assert fake.disconnects == 1
            assert fake.active == 0
            assert count_tasks(trio.lowlevel.current_task()) == baseline


async def test_hang_after_zero_sends_only_the_head() -> None:
    async with open_fake_llm([{"chunks": [{"text": "x"}], "hangAfter": 0}]) as fake, \
            httpx.AsyncClient() as c:
        with trio.fail_after(10):
            async with c.stream("POST", fake.base_url + RESPONSES, json={}) as r:
                assert r.status_code == 200
                with trio.move_on_after(0.2) as waited:
                    await r.aiter_bytes().__anext__()
                assert waited.cancelled_caught
        with trio.fail_after(10):
            await fake.wait_for_disconnect()


async def test_client_gone_during_a_delay_is_counted_without_waiting_it_out() -> None:
    reply = {"chunks": [{"text": "a"}, {"text": "b", "delay": 3600}]}
    async with open_fake_llm([reply]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            async with c.stream("POST", fake.base_url + COMPLETIONS, json={}) as r:
                await r.aiter_bytes().__anext__()
            await fake.wait_for_disconnect()
            await fake.wait_idle()


async def test_client_gone_mid_burst_is_counted() -> None:
    reply = Reply(chunks=[Chunk(text="x" * 100) for _ in range(100_000)])
    async with open_fake_llm([reply]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            async with c.stream("POST", fake.base_url + MESSAGES, json={}) as r:
                await r.aiter_bytes().__anext__()
            await fake.wait_for_disconnect()
            await fake.wait_until(lambda f: f.connections == 0)
        assert fake.disconnects == 1


async def test_leaving_the_block_cancels_live_responses() -> None:
    reply = {"chunks": [{"text": "a"}], "hangAfter": 1}
    with trio.fail_after(10):
        async with httpx.AsyncClient() as c:
            outside = count_tasks(trio.lowlevel.current_task())
            async with open_fake_llm([reply]) as fake:
                before = count_tasks(trio.lowlevel.current_task())
                r = await c.send(c.build_request("POST", fake.base_url + MESSAGES, json={}),
                                 stream=True)
                await fake.wait_until(lambda f: f.active == 1)
            # The server is gone with all its tasks; the client sees the cut.
            assert before > outside
            assert count_tasks(trio.lowlevel.current_task()) == outside
            with pytest.raises(httpx.RemoteProtocolError):
                await r.aread()
            await r.aclose()


async def test_block_exception_propagates_unwrapped() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with open_fake_llm():
            raise KeyError("mine")


async def test_serve_fake_llm_in_the_callers_nursery() -> None:
    async with trio.open_nursery() as nursery:
        fake: FakeLLM = await nursery.start(serve_fake_llm, [{"status": 204}])
        async with httpx.AsyncClient() as c:
            with trio.fail_after(10):
                assert (await c.post(fake.base_url + MESSAGES)).status_code == 204
        nursery.cancel_scope.cancel()


# ----------------------------------------------------------------------------- CLI


@pytest.fixture
def script_file(tmp_path: Path) -> Path:
    path = tmp_path / "script.json"
    path.write_text(json.dumps([
        {"chunks": [{"text": "Hello"}, {"text": " CLI"}], "usage": {"input": 2, "output": 2}}]))
    return path


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "omp.testing.fake_llm", *args]


async def first_line(stream: trio.abc.ReceiveStream) -> str:
    buffer = b""
    while b"\n" not in buffer:
        data = await stream.receive_some()
        assert data, f"no line before EOF: {buffer!r}"
        buffer += data
    return buffer.split(b"\n", 1)[0].decode()


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT])
async def test_cli_serves_a_script_until_signalled(script_file: Path,
                                                   stop_signal: signal.Signals) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            process: trio.Process = await nursery.start(functools.partial(
                trio.run_process, cli("--script", str(script_file), "--port", "0"),
                stdout=subprocess.PIPE, check=False))
            assert process.stdout is not None
            first = await first_line(process.stdout)
            assert first.startswith("fake LLM listening on http://127.0.0.1:")
            url = first.removeprefix("fake LLM listening on ")
            async with httpx.AsyncClient() as c:
                events = []
                async with c.stream("POST", url + COMPLETIONS, json={"model": "m"}) as r:
                    events = await read_events(r)
            text = "".join(c["choices"][0]["delta"].get("content", "")
                           for c in payloads(events) if c.get("choices"))
            assert text == "Hello CLI"
            process.send_signal(stop_signal)
            assert await process.wait() == 0


@pytest.mark.parametrize(("content", "expected"), [
    ('[{"status": "x"}]', "Expected `int`, got `str` - at `$[0].status`"),
    ("[{", "truncated"),
])
async def test_cli_bad_script_exits_2(tmp_path: Path, content: str, expected: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with trio.fail_after(30):
        done = await trio.run_process(cli("--script", str(path)), capture_stdout=True,
                                      capture_stderr=True, check=False)
    assert done.returncode == 2
    assert f"bad script {path}" in done.stderr.decode()
    assert expected.lower() in done.stderr.decode().lower()
    assert done.stdout == b""


async def test_cli_usage_errors_exit_2(script_file: Path) -> None:
    with trio.fail_after(30):
        unknown = await trio.run_process(cli("--script", str(script_file), "--bogus"),
                                         capture_stdout=True, capture_stderr=True, check=False)
        missing = await trio.run_process(cli("--script", "/nonexistent/script.json"),
                                         capture_stdout=True, capture_stderr=True, check=False)
    assert unknown.returncode == 2
    assert b"usage:" in unknown.stderr
    assert missing.returncode == 2
    assert b"cannot read script /nonexistent/script.json" in missing.stderr


async def test_a_gate_holds_the_answer_until_the_test_opens_it() -> None:
    """What comes before the gate is sent; the rest waits, however long, for ``open_gate``;
    a gate stays open for every later answer."""
    reply = {"chunks": [{"text": "before"}, {"gate": "go", "text": " after"}]}
    async with open_fake_llm([reply, reply]) as fake, httpx.AsyncClient() as c:
        with trio.fail_after(10):
            async with c.stream("POST", fake.base_url + MESSAGES, json={}) as r:
                decoder = SseDecoder()
                events: list[SseEvent] = []
                chunks = r.aiter_bytes()
                while "before" not in json.dumps(payloads(events)):
                    events += decoder.feed(await chunks.__anext__())
                await fake.wait_until(lambda f: f.waiting == {"go": 1})
                assert "after" not in json.dumps(payloads(events))
                fake.open_gate("go")
                async for data in chunks:
                    events += decoder.feed(data)
            assert fake.waiting == {}
            assert '" after"' in json.dumps(payloads(events))
            assert [e.event for e in events][-1] == "message_stop"
            second = await post_events(fake, MESSAGES)  # the gate is open now
            assert "after" in json.dumps(payloads(second))
