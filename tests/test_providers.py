"""The provider catalog (issue 26): every provider a key makes available, and the quirks of each
provider family handled where a real client would trip, against the fake LLM server standing in
for the provider (the catalog model with its base URL pointed at the fake)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from agent_helpers import text_reply, to_frame

from omp.client import RpcClient
from omp.llm.errors import parse_retry_after
from omp.llm.models import ModelRegistry, read_catalog
from omp.llm.stream import ModelCall
from omp.llm.types import Context, StreamOptions, ThinkingLevel, ToolDefinition
from omp.protocol import messages as m
from omp.protocol.payloads import Model
from omp.testing.fake_llm import FakeLLM, open_fake_llm

LIMIT = 60.0
CATALOG = read_catalog()
KEYED = sorted(name for name, p in CATALOG.providers.items()
               if p.auth == "apiKey" and p.env)
LOCAL = sorted(name for name, p in CATALOG.providers.items() if p.discovery is not None)
WEATHER = ToolDefinition("get_weather", "Weather for a city.",
                   {"type": "object", "properties": {"city": {"type": "string"}}})


def catalog_model(provider: str, model_id: str | None = None) -> Model:
    reg = ModelRegistry.load(Path("/nonexistent"), environ={})
    found = [x for x in reg.models_of(provider) if model_id is None or x.id == model_id]
    assert found, (provider, model_id)
    return found[0]


def at(llm: FakeLLM, model: Model) -> Model:
    """``model`` served by the fake LLM: its base URL replaced, as a models.yml ``baseUrl``
    for the provider does."""
    suffix = "" if model.api == "anthropic-messages" else "/v1"
    return msgspec.structs.replace(model, baseUrl=llm.base_url + suffix)


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    return "data: " + msgspec.json.encode({
        "id": "chatcmpl-1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        **extra}).decode() + "\n"


async def run(model: Model, context: Context, *, thinking: ThinkingLevel = "off",
              max_tokens: int | None = None) -> ModelCall:
    call = ModelCall(model, context, StreamOptions(api_key="sk-test", thinking=thinking,
                                                   max_tokens=max_tokens))
    async with httpx.AsyncClient() as client:
        await call.run(lambda event: None, http=client)
    return call


def user(text: str) -> m.UserMessage:
    return m.UserMessage(content=text, timestamp=1)


# --- the catalog ------------------------------------------------------------------------------


def test_catalog_covers_the_providers_users_have_keys_for() -> None:
    assert {"openrouter", "groq", "deepseek", "mistral", "xai", "fireworks", "together",
            "cerebras", "moonshot", "zai", "huggingface", "nvidia", "deepinfra", "perplexity",
            "minimax", "anthropic", "openai", "google"} <= set(KEYED)
    assert LOCAL == ["llama.cpp", "lm-studio", "ollama", "vllm"]


def test_catalog_entries_are_consistent() -> None:
    apis = {"openai-completions", "openai-responses", "anthropic-messages",
            "google-generative-ai", "offline"}
    seen: set[tuple[str, str]] = set()
    for name, provider in CATALOG.providers.items():
        assert provider.api in apis, name
        assert provider.name, name
        assert all(re.fullmatch(r"[A-Z][A-Z0-9_]*", var) for var in provider.env), name
        if provider.discovery is not None:
            assert provider.baseUrl.startswith("http://127.0.0.1:"), name
            assert provider.auth == "none", name
        elif name != "offline":
            assert provider.baseUrl.startswith("https://"), name
    for name, models in CATALOG.models.items():
        provider = CATALOG.providers[name]
        assert provider.discovery is None, name  # local servers list their own
        for model in models:
            assert (name, model.id) not in seen, model
            seen.add((name, model.id))
            assert (model.api or provider.api) in apis, model
            assert (model.baseUrl or provider.baseUrl).startswith(("https://", "offline:"))
            # Unknown limits are null (a few aggregator models, as the original lists them).
            assert model.contextWindow is None or model.contextWindow > 0, model
            assert model.maxTokens is None or model.maxTokens > 0, model
            cost = model.cost
            assert min(cost.input, cost.output, cost.cacheRead, cost.cacheWrite) >= 0, model
    # Two providers read their key from the same variable only where the original's do (one
    # key for two plans of the same vendor).
    variables = [var for p in CATALOG.providers.values() for var in p.env]
    assert {v for v in variables if variables.count(v) > 1} <= {"OPENCODE_API_KEY"}


@pytest.mark.parametrize("provider", KEYED)
def test_a_key_in_the_environment_makes_the_provider_available(provider: str,
                                                               tmp_path: Path) -> None:
    variable = CATALOG.providers[provider].env[0]
    reg = ModelRegistry.load(tmp_path, environ={variable: "sk-secret"})
    available = reg.available()
    assert available, provider
    sharing = {name for name, p in CATALOG.providers.items() if variable in p.env}
    assert {x.provider for x in available} == sharing
    assert reg.credential(provider) == "env"
    assert reg.api_key(provider) == "sk-secret"
    assert reg.default_model().provider in sharing
    assert variable in reg.key_variables()  # kept from every subprocess
    # Without it the provider is not offered, and its login asks for the key.
    bare = ModelRegistry.load(tmp_path, environ={})
    assert provider not in {x.provider for x in bare.available()}
    assert bare.credential(provider) == "missing"
    assert bare.missing_key_hint(provider).startswith(f"set {variable}")
    assert provider in {t.id for t in bare.login_targets()}


def test_a_stored_key_makes_the_provider_available(tmp_path: Path) -> None:
    (tmp_path / "auth.json").write_text('{"cerebras": {"type": "api_key", "key": "csk-1"}}')
    (tmp_path / "auth.json").chmod(0o600)
    reg = ModelRegistry.load(tmp_path, environ={})
    assert {x.provider for x in reg.available()} == {"cerebras"}
    assert reg.credential("cerebras") == "stored"


def test_models_yml_overrides_and_extends_the_catalog(tmp_path: Path) -> None:
    (tmp_path / "models.yml").write_text(
        "providers:\n"
        "  groq:\n"
        "    baseUrl: http://127.0.0.1:9/openai/v1\n"
        "    modelOverrides:\n"
        "      llama-3.3-70b-versatile: {contextWindow: 64000}\n"
        "  mistral:\n"
        "    apiKey: MY_MISTRAL\n"
        "    api: openai-completions\n"
        "    baseUrl: https://api.mistral.ai/v1\n"
        "    models: [{id: my-finetune}]\n")
    reg = ModelRegistry.load(tmp_path, environ={"GROQ_API_KEY": "g", "MY_MISTRAL": "m"})
    groq = reg.find("groq", "llama-3.3-70b-versatile")
    assert groq is not None
    assert groq.contextWindow == 64000
    assert groq.baseUrl == "http://127.0.0.1:9/openai/v1"
    # The catalog's quirk flags: the provider's, with a model's own laid over them.
    deepseek = reg.find("deepseek", "deepseek-chat")
    assert deepseek is not None
    assert deepseek.compat == {"maxTokensField": "max_tokens", "supportsReasoningEffort": False}
    grok = reg.find("xai", "grok-4")
    assert grok is not None
    assert grok.compat == {"supportsReasoningEffort": False}
    assert [x.id for x in reg.models if x.provider == "mistral"] == ["my-finetune"]
    assert reg.credential("mistral") == "config"


# --- through the process ----------------------------------------------------------------------


async def test_groq_key_in_the_environment_end_to_end(tmp_path: Path,
                                                      isolated_agent_dir: Path) -> None:
    """A user with only GROQ_API_KEY: Groq's models are offered (with where the key comes
    from, never the key), the session starts on one, and a prompt reaches Groq's API (the
    fake) with the key, reading Groq's usage from its ``x_groq`` object."""
    key = "gsk_SECRET_groq_key"
    raw = [chunk({"role": "assistant", "content": ""}),
           chunk({"content": "Hello from Groq"}),
           chunk({}, "stop", x_groq={"id": "req_1", "usage": {
               "prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}),
           "data: [DONE]\n"]
    frames: list[dict[str, Any]] = []
    with trio.fail_after(LIMIT):
        async with open_fake_llm([{"raw": raw}]) as llm:
            (isolated_agent_dir / "models.yml").write_text(
                f"providers:\n  groq:\n    baseUrl: {llm.base_url}/openai/v1\n")
            env = {**os.environ, "GROQ_API_KEY": key}
            async with RpcClient.spawn(args=["--mode", "rpc", "--no-session"], env=env,
                                       cwd=tmp_path, max_buffered_events=math.inf) as client:
                models = to_frame(await client.request({"type": "get_available_models"}))
                every = to_frame(await client.request({"type": "get_available_models",
                                                       "all": True}))
                state = to_frame(await client.request({"type": "get_state"}))
                prompt = to_frame(await client.request({"type": "prompt", "message": "hi"}))
                frames += [models, state, prompt]
                while frames[-1]["type"] != "session_settled":
                    frames.append(to_frame(await client.events.receive()))
    listed = models["data"]["models"]
    assert {x["provider"] for x in listed} == {"groq"}
    assert {x["credential"] for x in listed} == {"env"}
    # ``all``: the same first, then what other keys would unlock, said to be missing.
    everything = every["data"]["models"]
    assert everything[:len(listed)] == listed
    rest = everything[len(listed):]
    assert {x["credential"] for x in rest} == {"missing"}
    assert {"deepseek", "mistral", "anthropic"} <= {x["provider"] for x in rest}
    assert "offline" not in {x["provider"] for x in rest}
    assert state["data"]["model"]["provider"] == "groq"
    assert prompt["success"] is True
    request = llm.requests[0]
    assert request.path == "/openai/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {key}"
    assert request.json()["model"] == "openai/gpt-oss-120b"
    end = next(f for f in frames if f["type"] == "message_end"
               and f["message"]["role"] == "assistant")
    assert end["message"]["content"] == [{"type": "text", "text": "Hello from Groq"}]
    assert (end["message"]["usage"]["input"], end["message"]["usage"]["output"]) == (11, 4)
    assert key not in msgspec.json.encode(frames).decode()


# --- quirks, per provider family --------------------------------------------------------------


async def test_mistral_gets_its_own_ids_and_tool_names() -> None:
    history = (
        user("weather?"),
        m.AssistantMessage(
            content=[m.ToolCall(id="call_Xy7|fc_123", name="get_weather",
                                arguments={"city": "Paris"})],
            api="openai-responses", provider="openai", model="gpt-5",
            usage=m.Usage.zero(), stopReason="toolUse", timestamp=2),
        m.ToolResultMessage(toolCallId="call_Xy7|fc_123", toolName="get_weather",
                            content=[m.TextContent(text="sunny")], isError=False, timestamp=3),
    )
    async with open_fake_llm([text_reply("ok")]) as llm:
        call = await run(at(llm, catalog_model("mistral", "devstral-medium-latest")),
                         Context(messages=history, tools=(WEATHER,)), thinking="high",
                         max_tokens=1000)
    assert call.error is None
    body = llm.requests[0].json()
    assert "reasoning_effort" not in body  # not a reasoning model
    assert body["max_tokens"] == 1000
    assert "max_completion_tokens" not in body
    assistant, tool = body["messages"][1], body["messages"][2]
    call_id = assistant["tool_calls"][0]["id"]
    assert re.fullmatch(r"[a-zA-Z0-9]{9}", call_id)
    assert tool == {"role": "tool", "tool_call_id": call_id, "content": "sunny",
                    "name": "get_weather"}


async def test_openrouter_asks_for_reasoning_its_way_and_streams_it_as_reasoning() -> None:
    raw = [chunk({"reasoning": "Let me think."}), chunk({"content": "Done."}),
           chunk({}, "stop"),
           'data: {"id": "gen-1", "choices": [], "usage": {"prompt_tokens": 5, '
           '"completion_tokens": 7, "completion_tokens_details": {"reasoning_tokens": 3}}}\n',
           "data: [DONE]\n"]
    async with open_fake_llm([{"raw": raw}]) as llm:
        call = await run(at(llm, catalog_model("openrouter", "anthropic/claude-sonnet-4.5")),
                         Context(messages=(user("hi"),)), thinking="high")
    body = llm.requests[0].json()
    assert body["reasoning"] == {"effort": "high"}
    assert "reasoning_effort" not in body
    assert call.final is not None
    assert call.final.content == [
        m.ThinkingContent(thinking="Let me think.", thinkingSignature="reasoning"),
        m.TextContent(text="Done.")]
    assert (call.final.usage.input, call.final.usage.output) == (5, 7)


async def test_deepseek_reasoning_content_and_cache_hits() -> None:
    raw = [chunk({"reasoning_content": "First, "}), chunk({"reasoning_content": "think."}),
           chunk({"content": "Answer."}),
           chunk({}, "stop", usage={"prompt_tokens": 100, "completion_tokens": 9,
                                    "prompt_cache_hit_tokens": 60,
                                    "prompt_cache_miss_tokens": 40}),
           "data: [DONE]\n"]
    async with open_fake_llm([{"raw": raw}]) as llm:
        call = await run(at(llm, catalog_model("deepseek", "deepseek-reasoner")),
                         Context(messages=(user("hi"),)), thinking="high", max_tokens=500)
    body = llm.requests[0].json()
    assert "reasoning_effort" not in body  # the reasoner always thinks; the field is refused
    assert body["max_tokens"] == 500
    assert call.final is not None
    assert call.final.content[0] == m.ThinkingContent(
        thinking="First, think.", thinkingSignature="reasoning_content")
    usage = call.final.usage
    assert (usage.input, usage.cacheRead, usage.output) == (40, 60, 9)


@pytest.mark.parametrize(("model_id", "sent"), [("grok-4", None), ("grok-3-mini", "high"),
                                                ("grok-code-fast-1", None)])
async def test_xai_reasoning_effort_only_where_the_model_takes_it(model_id: str,
                                                                  sent: str | None) -> None:
    # xAI over the Responses API, as the original calls it.
    async with open_fake_llm([text_reply("ok")]) as llm:
        call = await run(at(llm, catalog_model("xai", model_id)),
                         Context(messages=(user("hi"),)), thinking="high")
    assert call.error is None
    assert llm.requests[0].path == "/v1/responses"
    assert llm.requests[0].json().get("reasoning", {}).get("effort") == sent


@pytest.mark.parametrize(("level", "sent"), [("high", "enabled"), ("off", "disabled")])
async def test_zai_thinking_switch(level: ThinkingLevel, sent: str) -> None:
    async with open_fake_llm([text_reply("ok")]) as llm:
        # Z.AI's own API (the catalog calls most GLM models over its Anthropic-style one).
        await run(at(llm, catalog_model("zai", "glm-5.3-flash")),
                  Context(messages=(user("hi"),)), thinking=level)
    body = llm.requests[0].json()
    assert body["thinking"] == {"type": sent}
    assert "reasoning_effort" not in body


async def test_local_server_whole_object_arguments_stop_after_calls_and_no_usage() -> None:
    """What Ollama's and llama.cpp's OpenAI endpoints send: each call whole in one chunk (the
    arguments once as an object), no ids on the second, all at index 0, ``finish_reason:
    stop`` after them, and no usage anywhere."""
    raw = [chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function", "function": {
               "name": "get_weather", "arguments": {"city": "Paris"}}}]}),
           chunk({"tool_calls": [{"index": 0, "type": "function", "function": {
               "name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}),
           chunk({}, "stop"), "data: [DONE]\n"]
    entry = CATALOG.providers["ollama"]
    async with open_fake_llm([{"raw": raw}]) as llm:
        model = Model(id="qwen3:8b", name="qwen3:8b", api=entry.api, provider="ollama",
                      baseUrl=llm.base_url + "/v1", reasoning=False, input=["text"],
                      cost=catalog_model("groq").cost, contextWindow=None, maxTokens=None,
                      compat=dict(entry.compat))
        call = await run(model, Context(messages=(user("weather?"),), tools=(WEATHER,)))
    assert call.error is None
    assert call.final is not None
    calls = [b for b in call.final.content if isinstance(b, m.ToolCall)]
    assert [(c.name, c.arguments) for c in calls] == [
        ("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]
    assert calls[0].id == "call_a"
    assert calls[1].id  # made up: the result must be paired with it
    assert call.final.stopReason == "toolUse"
    assert call.final.usage.input == call.final.usage.output == 0
    assert "stream_options" not in llm.requests[0].json()


async def test_anthropic_family_provider_minimax(tmp_path: Path) -> None:
    """A catalog provider on the Anthropic Messages API: its key as ``x-api-key`` at its own
    base URL."""
    reg = ModelRegistry.load(tmp_path, environ={"MINIMAX_API_KEY": "mm-key"})
    model = reg.default_model()
    assert (model.provider, model.api) == ("minimax", "anthropic-messages")
    async with open_fake_llm([text_reply("hi")]) as llm:
        call = ModelCall(at(llm, model), Context(messages=(user("hi"),)),
                         StreamOptions(api_key=reg.api_key("minimax")))
        async with httpx.AsyncClient() as client:
            await call.run(lambda event: None, http=client)
    assert call.error is None
    request = llm.requests[0]
    assert request.path == "/v1/messages"
    assert request.headers["x-api-key"] == "mm-key"
    assert request.json()["model"] == CATALOG.providers["minimax"].defaultModel


@pytest.mark.parametrize(("headers", "seconds"), [
    ({"retry-after": "7"}, 7.0),                                  # Groq, Together, DeepSeek...
    ({"x-ratelimit-reset-requests": "2m59.56s"}, 179.56),         # Groq, OpenAI
    ({"retry-after-ms": "1500"}, 1.5),                            # OpenRouter via Anthropic
])
async def test_429_with_retry_after_from_a_catalog_provider(headers: dict[str, str],
                                                            seconds: float) -> None:
    assert parse_retry_after(httpx.Headers(headers)) == pytest.approx(seconds)
    reply = {"status": 429, "headers": headers,
             "body": {"error": {"message": "Rate limit reached", "type": "tokens"}}}
    async with open_fake_llm([reply]) as llm:
        call = await run(at(llm, catalog_model("groq")), Context(messages=(user("hi"),)))
    assert call.error is not None
    assert call.error.kind == "rate_limit"
    assert call.error.retryable
    assert call.error.retry_after == pytest.approx(seconds, abs=0.01)
