"""The built-in catalog (``omp/llm/catalog.json``, issue 36): at least every model the original
lists for the API-key providers it ships, and ``omp models --json`` listing each provider's
models with their windows and limits once its key variable is set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from omp.llm.models import ModelRegistry, catalog_providers, read_catalog

ORIGINAL_COUNTS = {
    "anthropic": 25, "openai": 55, "google": 44, "openrouter": 525, "groq": 20,
    "abliteration": 3, "aiand": 11, "aimlapi": 349, "alibaba-coding-plan": 12,
    "alibaba-token-plan": 8, "baseten": 17, "cerebras": 8, "cline-pass": 20,
    "commandcode": 69, "coreweave": 39, "deepinfra": 106, "deepseek": 4, "firepass": 2,
    "fireworks": 35, "gmi-cloud": 1, "huggingface": 76, "kilo": 566, "meta": 5,
    "minimax": 8, "minimax-code": 9, "minimax-code-cn": 9, "mistral": 31, "moonshot": 17,
    "nanogpt": 1074, "novita": 117, "nvidia": 169, "ollama-cloud": 51, "opencode-go": 35,
    "opencode-zen": 95, "qianfan": 1, "sakana": 3, "synthetic": 11, "together": 39,
    "umans": 9, "venice": 156, "vercel-ai-gateway": 308, "wafer-serverless": 20,
    "xai": 31, "xiaomi": 6, "xiaomi-token-plan-ams": 4, "xiaomi-token-plan-cn": 4,
    "xiaomi-token-plan-sgp": 4, "yolo-auto": 1, "zai": 16, "zenmux": 264,
    "zhipu-coding-plan": 15}
"""The original's models per API-key provider (``@oh-my-pi/pi-catalog`` 18.2.3,
``src/models.json``; with the Anthropic, OpenAI, Gemini, OpenRouter and Groq keys set its
``omp models --json`` lists 669). A refresh may add models, never fall below these."""

CATALOG = read_catalog()


@pytest.mark.parametrize("provider", sorted(ORIGINAL_COUNTS))
def test_the_catalog_has_at_least_the_originals_models(provider: str) -> None:
    assert len(CATALOG.models.get(provider, [])) >= ORIGINAL_COUNTS[provider]


def test_the_catalog_says_where_it_comes_from() -> None:
    data = json.loads((Path(__file__).parent.parent / "omp" / "llm" / "catalog.json")
                      .read_text())
    assert data["source"]["package"] == "@oh-my-pi/pi-catalog"
    assert data["source"]["version"]


def test_a_start_without_keys_decodes_no_providers_models(tmp_path: Path) -> None:
    """The catalog's thousands of models are decoded provider by provider, when a provider
    is used: a registry without keys has the offline models only."""
    registry = ModelRegistry.load(tmp_path, environ={})
    assert registry.default_model().provider == "offline"
    assert {m.provider for m in registry.models} == {"offline"}
    with_key = ModelRegistry.load(tmp_path, environ={"GROQ_API_KEY": "gsk-test"})
    assert {m.provider for m in with_key.available()} == {"groq"}
    assert {m.provider for m in with_key.models} <= {"groq", "offline"}
    assert len(with_key.all_models()) == sum(len(v) for v in CATALOG.models.values())


def omp_models(env_keys: dict[str, str], tmp_path: Path,
               *extra: str) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items()
           if k not in {name for p in catalog_providers().values() for name in p.env}}
    result = subprocess.run([sys.executable, "-P", "-m", "omp", "models", "--json", *extra],
                            env={**env, **env_keys}, cwd=tmp_path, capture_output=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    models: list[dict[str, object]] = json.loads(result.stdout)["models"]
    return models


def test_omp_models_lists_every_providers_models_with_windows_and_limits(
        tmp_path: Path) -> None:
    """Every key variable of every catalog provider set (fake values): each provider's
    catalog models listed, each with its context window and output limit."""
    keys = {p.env[0]: f"fake-{name}" for name, p in catalog_providers().items()
            if p.env and p.auth == "apiKey"}
    listed = omp_models(keys, tmp_path)
    by_provider: dict[str, dict[str, dict[str, object]]] = {}
    for entry in listed:
        by_provider.setdefault(str(entry["provider"]), {})[str(entry["id"])] = entry
    for name, models in CATALOG.models.items():
        if name == "offline":
            continue
        assert set(by_provider.get(name, {})) == {m.id for m in models}, name
        for model in models:
            entry = by_provider[name][model.id]
            assert (entry["contextWindow"], entry["maxTokens"]) == (
                model.contextWindow, model.maxTokens)
            assert entry["credential"] == "env"
    assert b"fake-" not in json.dumps(listed).encode()


def test_the_five_keys_of_the_issue(tmp_path: Path) -> None:
    listed = omp_models({"ANTHROPIC_API_KEY": "a", "OPENAI_API_KEY": "o", "GEMINI_API_KEY": "g",
                         "OPENROUTER_API_KEY": "r", "GROQ_API_KEY": "q"}, tmp_path)
    counts: dict[str, int] = {}
    for entry in listed:
        counts[str(entry["provider"])] = counts.get(str(entry["provider"]), 0) + 1
    for provider in ("anthropic", "openai", "google", "openrouter", "groq"):
        assert counts[provider] >= ORIGINAL_COUNTS[provider]
    assert len(listed) >= 669
    sonnet = next(e for e in listed if e["selector"] == "anthropic/claude-sonnet-4-5")
    assert sonnet["contextWindow"]
    assert sonnet["maxTokens"]


async def test_refresh_adds_a_listed_id_and_caches_it(tmp_path: Path,
                                                      isolated_agent_dir: Path) -> None:
    """``omp models --refresh`` asks the configured provider's ``/models`` (the fake LLM as
    Groq): an id the catalog lacks is listed, cached with its date, and listed again by a
    later ``omp models`` without asking."""
    import trio

    from omp.testing.fake_llm import open_fake_llm

    listing = {"match": {"path": "/models"}, "repeat": True, "body": {"object": "list", "data": [
        {"id": "openai/gpt-oss-120b", "object": "model"},
        {"id": "brand-new-model", "object": "model"}]}}
    async with open_fake_llm([listing]) as llm:
        (isolated_agent_dir / "models.yml").write_text(
            f"providers:\n  groq:\n    baseUrl: {llm.base_url}/openai/v1\n")
        keys = {"GROQ_API_KEY": "gsk-secret"}
        refreshed = await trio.to_thread.run_sync(
            lambda: omp_models(keys, tmp_path, "--refresh"))
        later = await trio.to_thread.run_sync(lambda: omp_models(keys, tmp_path))
    (request,) = llm.requests
    assert (request.method, request.path) == ("GET", "/openai/v1/models")
    assert request.headers["authorization"] == "Bearer gsk-secret"
    for listed in (refreshed, later):
        new = [e for e in listed if e["selector"] == "groq/brand-new-model"]
        assert len(new) == 1
        assert (new[0]["contextWindow"], new[0]["maxTokens"]) == (None, None)
    cache = json.loads((isolated_agent_dir / "models-cache.json").read_text())
    assert cache["groq"]["ids"] == ["brand-new-model"]
    assert cache["groq"]["date"].startswith("20")
    assert "gsk-secret" not in (isolated_agent_dir / "models-cache.json").read_text()


async def test_rpc_get_available_models_refresh_asks_only_when_told(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """Over RPC, ``get_available_models`` asks no provider; with ``refresh: true`` it asks
    the configured provider's ``/models`` (the fake LLM as Groq) first, lists the new id,
    caches it, and ``set_model`` finds it."""
    import trio

    from omp.client import RpcClient
    from omp.protocol import commands as cmd
    from omp.protocol import payloads
    from omp.testing.fake_llm import open_fake_llm

    listing = {"match": {"path": "/models"}, "repeat": True, "body": {"object": "list", "data": [
        {"id": "openai/gpt-oss-120b", "object": "model"},
        {"id": "brand-new-model", "object": "model"}]}}
    env = {k: v for k, v in os.environ.items()
           if k not in {name for p in catalog_providers().values() for name in p.env}}
    env["GROQ_API_KEY"] = "gsk-secret"
    with trio.fail_after(60):
        async with open_fake_llm([listing]) as llm:
            (isolated_agent_dir / "models.yml").write_text(
                f"providers:\n  groq:\n    baseUrl: {llm.base_url}/openai/v1\n")
            async with RpcClient.spawn(args=["--mode", "rpc", "--no-session"], cwd=tmp_path,
                                       env=env, stderr=subprocess.DEVNULL) as client:
                plain = await client.call(cmd.GetAvailableModels(), payloads.ModelsPayload)
                assert llm.requests == []
                refreshed = await client.call(cmd.GetAvailableModels(refresh=True),
                                              payloads.ModelsPayload)
                chosen = await client.call(cmd.SetModel(provider="groq",
                                                        modelId="brand-new-model"),
                                           payloads.Model)
    selectors = [[f"{m.provider}/{m.id}" for m in listed.models]
                 for listed in (plain, refreshed)]
    assert "groq/brand-new-model" not in selectors[0]
    assert "groq/openai/gpt-oss-120b" in selectors[0]
    assert selectors[1] == [*selectors[0], "groq/brand-new-model"]
    assert chosen.id == "brand-new-model"
    (request,) = llm.requests
    assert (request.method, request.path) == ("GET", "/openai/v1/models")
    cache = json.loads((isolated_agent_dir / "models-cache.json").read_text())
    assert cache["groq"]["ids"] == ["brand-new-model"]


def test_every_registry_has_the_ids_the_last_refresh_cached(isolated_agent_dir: Path) -> None:
    """``models-cache.json`` is read by any process's registry (an RPC server, a one-shot run,
    ``omp models``), when the provider is brought in; an id the catalog has is not added twice
    and a provider the catalog lacks is ignored."""
    (isolated_agent_dir / "models-cache.json").write_text(json.dumps({
        "groq": {"date": "2026-12-01T00:00:00+00:00",
                 "ids": ["brand-new-model", "openai/gpt-oss-120b"]},
        "nobody": {"date": "2026-12-01T00:00:00+00:00", "ids": ["x"]}}))
    registry = ModelRegistry.load(isolated_agent_dir, environ={"GROQ_API_KEY": "gsk-secret"})
    found = registry.find("groq", "brand-new-model")
    assert found is not None
    assert (found.api, found.contextWindow) == (catalog_providers()["groq"].api, None)
    ids = [m.id for m in registry.models_of("groq")]
    assert ids.count("openai/gpt-oss-120b") == 1
    assert ids[-1] == "brand-new-model"  # after the catalog's own
    assert all(m.provider != "nobody" for m in registry.all_models())


async def test_an_rpc_server_offers_the_cached_ids_without_asking(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """A server started after a refresh lists and switches to a cached id, and asks no
    provider (the fake LLM as Groq's base URL, never called)."""
    import trio

    from omp.client import RpcClient
    from omp.protocol import commands as cmd
    from omp.protocol import payloads
    from omp.testing.fake_llm import open_fake_llm

    (isolated_agent_dir / "models-cache.json").write_text(json.dumps({
        "groq": {"date": "2026-12-01T00:00:00+00:00", "ids": ["brand-new-model"]}}))
    env = {k: v for k, v in os.environ.items()
           if k not in {name for p in catalog_providers().values() for name in p.env}}
    env["GROQ_API_KEY"] = "gsk-secret"
    with trio.fail_after(60):
        async with open_fake_llm([]) as llm:
            (isolated_agent_dir / "models.yml").write_text(
                f"providers:\n  groq:\n    baseUrl: {llm.base_url}/openai/v1\n")
            async with RpcClient.spawn(args=["--mode", "rpc", "--no-session"], cwd=tmp_path,
                                       env=env, stderr=subprocess.DEVNULL) as client:
                listed = await client.call(cmd.GetAvailableModels(), payloads.ModelsPayload)
                chosen = await client.call(cmd.SetModel(provider="groq",
                                                        modelId="brand-new-model"),
                                           payloads.Model)
            assert llm.requests == []
    assert "groq/brand-new-model" in [f"{m.provider}/{m.id}" for m in listed.models]
    assert chosen.baseUrl == f"{llm.base_url}/openai/v1"
