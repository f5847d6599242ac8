"""The model's output limit on the wire (issue 36): each API's field, as the original sends it
(``omp.llm.providers.output_limit``), read from the requests the fake LLM received; and
``stream.sendMaxTokens: false`` leaving it out."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import trio
from agent_helpers import text_reply, to_frame

from omp.client import RpcClient
from omp.llm.models import ModelRegistry
from omp.llm.stream import ModelCall
from omp.llm.types import Context, StreamOptions
from omp.protocol import messages as m
from omp.protocol.payloads import Model
from omp.testing.fake_llm import open_fake_llm

LIMIT = 60.0


def catalog_model(provider: str, model_id: str) -> Model:
    model = ModelRegistry.load(Path("/nonexistent"), environ={}).find(provider, model_id)
    assert model is not None, (provider, model_id)
    return model


async def body_of(model: Model, **options: Any) -> dict[str, Any]:
    """The JSON body of one call of ``model`` (served by the fake LLM)."""
    async with open_fake_llm([text_reply("ok")]) as llm:
        suffix = "" if model.api == "anthropic-messages" else "/v1"
        served = msgspec.structs.replace(model, baseUrl=llm.base_url + suffix)
        call = ModelCall(served, Context(messages=(m.UserMessage(content="hi", timestamp=1),)),
                         StreamOptions(api_key="sk-test", **options))
        async with httpx.AsyncClient() as client:
            await call.run(lambda event: None, http=client)
    assert call.error is None, call.error
    body: dict[str, Any] = llm.requests[0].json()
    return body


# The model's own limit, never above 64,000 on the OpenAI-style APIs (as the original asks).
@pytest.mark.parametrize(("provider", "model_id", "field", "value"), [
    ("openai", "gpt-5.1", "max_output_tokens", 64000),                # Responses
    ("groq", "openai/gpt-oss-120b", "max_completion_tokens", 64000),  # chat completions
    ("groq", "llama-3.1-8b-instant", "max_completion_tokens", None),
    ("mistral", "devstral-medium-latest", "max_tokens", None),        # its own field name
    ("google", "gemini-2.5-pro", "maxOutputTokens", 65536),           # Gemini
    ("anthropic", "claude-sonnet-4-5", "max_tokens", 32000),          # Messages: required
])
async def test_each_api_carries_the_models_output_limit(provider: str, model_id: str,
                                                        field: str, value: int | None) -> None:
    model = catalog_model(provider, model_id)
    expected = value if value is not None else min(model.maxTokens or 0, 64000)
    assert expected > 0
    body = await body_of(model)
    sent = body["generationConfig"][field] if provider == "google" else body[field]
    assert sent == expected
    # One field: the chat-completions name the model does not take is not sent beside it.
    assert not ({"max_tokens", "max_completion_tokens"} - {field}) & set(body)


async def test_a_limit_asked_for_is_sent_within_the_models() -> None:
    model = catalog_model("openai", "gpt-5.1")
    assert (await body_of(model, max_tokens=1000))["max_output_tokens"] == 1000
    small = msgspec.structs.replace(model, maxTokens=500)
    assert (await body_of(small, max_tokens=1000))["max_output_tokens"] == 500


async def test_a_router_gets_a_limit_only_when_asked() -> None:
    # OpenRouter sends a request to one of several upstreams, each with its own limit.
    model = catalog_model("openrouter", "qwen/qwen3-coder")
    assert "max_completion_tokens" not in await body_of(model)
    assert "max_tokens" not in await body_of(model)
    assert (await body_of(model, max_tokens=300))["max_completion_tokens"] == 300


@pytest.mark.parametrize(("provider", "model_id", "field"), [
    ("openai", "gpt-5.1", "max_output_tokens"),
    ("groq", "openai/gpt-oss-120b", "max_completion_tokens"),
    ("google", "gemini-2.5-pro", "maxOutputTokens"),
])
async def test_the_setting_leaves_it_out(provider: str, model_id: str, field: str) -> None:
    body = await body_of(catalog_model(provider, model_id), send_max_tokens=False)
    assert field not in body.get("generationConfig", body)


async def test_anthropic_requires_one_and_gets_it_whatever_the_setting() -> None:
    body = await body_of(catalog_model("anthropic", "claude-sonnet-4-5"), send_max_tokens=False)
    assert body["max_tokens"] == 32000


@pytest.mark.parametrize("send", [True, False])
async def test_config_yml_stream_send_max_tokens_through_the_process(
        send: bool, tmp_path: Path, isolated_agent_dir: Path) -> None:
    """A session's calls follow ``stream.sendMaxTokens`` of config.yml."""
    with trio.fail_after(LIMIT):
        async with open_fake_llm([text_reply("hi")]) as llm:
            (isolated_agent_dir / "models.yml").write_text(
                f"providers:\n  openai:\n    baseUrl: {llm.base_url}/v1\n")
            if not send:
                (isolated_agent_dir / "config.yml").write_text(
                    "stream:\n  sendMaxTokens: false\n")
            env = {**os.environ, "OPENAI_API_KEY": "sk-test"}
            async with RpcClient.spawn(args=["--mode", "rpc", "--no-session", "--model",
                                             "openai/gpt-5.1"], env=env, cwd=tmp_path,
                                       max_buffered_events=math.inf) as client:
                frames = [to_frame(await client.request({"type": "prompt", "message": "hi"}))]
                while frames[-1]["type"] != "session_settled":
                    frames.append(to_frame(await client.events.receive()))
    body = llm.requests[0].json()
    assert body.get("max_output_tokens") == (64000 if send else None)
