"""``scripts/refresh_catalog.py``: its parsing of each provider's model list, on payloads
recorded from the providers' documented responses (``tests/data/catalog/``), and what it does
to the catalog. The fetching itself needs the internet and is not run here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from repo_files import load_repo_file

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "catalog"


script = load_repo_file("scripts/refresh_catalog.py")


def recorded(name: str) -> Any:
    return json.loads((DATA / f"{name}.json").read_text())


def catalog() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(script.CATALOG.read_text())
    return data


def test_openrouter_list_gives_limits_prices_images_and_reasoning() -> None:
    listed = script.parse_models("openrouter", recorded("openrouter"))
    assert set(listed) == {"anthropic/claude-sonnet-4.5", "qwen/qwen3-coder",
                           "mistralai/devstral-medium"}  # no id, not an object: skipped
    assert listed["anthropic/claude-sonnet-4.5"] == {
        "contextWindow": 1000000, "maxTokens": 64000,
        "cost": {"input": 3.0, "output": 15.0, "cacheRead": 0.3, "cacheWrite": 3.75},
        "images": True, "reasoning": True}
    assert listed["qwen/qwen3-coder"]["cost"] == {"input": 0.22, "output": 0.95}
    assert listed["qwen/qwen3-coder"]["reasoning"] is False
    assert "maxTokens" not in listed["mistralai/devstral-medium"]  # null: not reported


@pytest.mark.parametrize(("provider", "model_id", "facts"), [
    ("groq", "openai/gpt-oss-120b", {"contextWindow": 131072, "maxTokens": 65536}),
    ("mistral", "mistral-medium-latest", {"contextWindow": 131072, "images": True}),
    ("mistral", "codestral-latest", {"contextWindow": 256000, "images": False}),
    ("together", "moonshotai/Kimi-K2-Instruct-0905",
     {"contextWindow": 262144, "cost": {"input": 1.0, "output": 3.0}}),
    ("google", "gemini-2.5-pro",
     {"contextWindow": 1048576, "maxTokens": 65536, "reasoning": True}),
    ("deepseek", "deepseek-reasoner", {}),
])
def test_each_list_format(provider: str, model_id: str, facts: dict[str, Any]) -> None:
    assert script.parse_models(provider, recorded(provider))[model_id] == facts


@pytest.mark.parametrize("payload", [None, [], {"data": "no"}, {"models": 3}, "text"])
def test_a_list_of_another_shape_gives_nothing(payload: Any) -> None:
    assert script.parse_models("groq", payload) == {}
    assert script.parse_models("google", payload) == {}


def small_catalog() -> dict[str, Any]:
    """A catalog of two providers in the file's layout (the shipped one changes with each
    refresh; these tests are about what ``compare`` does)."""
    model = {"reasoning": False, "input": ["text"],
             "cost": {"input": 0.22, "output": 1, "cacheRead": 0, "cacheWrite": 0}}
    return {"_comment": "test", "providers": {
        "groq": {"api": "openai-completions", "baseUrl": "https://api.groq.com/openai/v1",
                 "env": ["GROQ_API_KEY"]},
        "openrouter": {"api": "openai-completions", "baseUrl": "https://openrouter.ai/api/v1",
                       "env": ["OPENROUTER_API_KEY"]}},
        "models": {
            "groq": [{"id": "openai/gpt-oss-120b", "name": "gpt-oss-120b", **model,
                      "contextWindow": 131072, "maxTokens": 65536},
                     {"id": "llama-3.3-70b-versatile", "name": "Llama", **model,
                      "contextWindow": 131072, "maxTokens": 32768},
                     {"id": "gone-model", "name": "Gone", **model,
                      "contextWindow": 8192, "maxTokens": 8192}],
            "openrouter": [{"id": "qwen/qwen3-coder", "name": "Qwen3 Coder", **model,
                            "contextWindow": 262144, "maxTokens": 262144},
                           {"id": "anthropic/claude-sonnet-4.5", "name": "Sonnet", **model,
                            "input": ["text", "image"], "contextWindow": 1000000,
                            "maxTokens": 64000}]}}


def test_compare_updates_what_changed_and_reports_the_rest() -> None:
    data = small_catalog()
    before = copy.deepcopy(data)
    listed = script.parse_models("groq", recorded("groq"))
    listed["openai/gpt-oss-120b"]["contextWindow"] = 200000  # as if Groq raised it
    changes, new, gone = script.compare(data, "groq", listed)
    assert changes == ["groq/openai/gpt-oss-120b: contextWindow 131072 -> 200000"]
    assert new == ["whisper-large-v3"]
    assert gone == ["gone-model"]
    assert data["models"]["groq"][0]["contextWindow"] == 200000
    # Nothing else moved, and no model was removed or added without --add.
    assert len(data["models"]["groq"]) == len(before["models"]["groq"])
    script.compare(data, "groq", listed, add=True)
    added = data["models"]["groq"][-1]
    assert (added["id"], added["contextWindow"]) == ("whisper-large-v3", 448)


def test_prices_and_images_from_openrouter_are_written_back() -> None:
    data = small_catalog()
    listed = script.parse_models("openrouter", recorded("openrouter"))
    listed["qwen/qwen3-coder"]["cost"]["input"] = 0.3
    changes, _, _ = script.compare(data, "openrouter", listed)
    assert "openrouter/qwen/qwen3-coder: cost.input 0.22 -> 0.3" in changes
    assert "openrouter/anthropic/claude-sonnet-4.5: contextWindow 1000000 -> 1000000" \
        not in changes


# --- the original's published catalog --------------------------------------------------------

ORIGINAL = recorded("original")
"""An excerpt of the original's ``models.json`` and ``rules.json`` (pi-catalog 18.2.3):
a few models of providers taken, replaced and left out."""


def generated() -> dict[str, Any]:
    catalog: dict[str, Any] = script.from_original(
        ORIGINAL["models"], ORIGINAL["rules"], small_catalog(), ORIGINAL["version"])
    return catalog


def test_from_original_takes_every_api_key_provider_with_its_facts() -> None:
    data = generated()
    assert data["source"] == {"package": "@oh-my-pi/pi-catalog", "version": "18.2.3"}
    anthropic = data["providers"]["anthropic"]
    assert (anthropic["api"], anthropic["baseUrl"], anthropic["env"]) == (
        "anthropic-messages", "https://api.anthropic.com", ["ANTHROPIC_API_KEY"])
    sonnet = next(m for m in data["models"]["anthropic"] if m["id"] == "claude-sonnet-4-5")
    assert sonnet == {
        "id": "claude-sonnet-4-5", "name": "Claude Sonnet 4.5", "reasoning": True,
        "input": ["text", "image"],
        "cost": {"input": 3, "output": 15, "cacheRead": 0.3, "cacheWrite": 3.75},
        "contextWindow": 1000000, "maxTokens": 64000,
        "thinking": ORIGINAL["models"]["anthropic"]["claude-sonnet-4-5"]["thinking"]}
    # Not an API key over an API spoken here: left out, with the reason in EXCLUDED.
    assert "amazon-bedrock" not in data["providers"]
    assert "muse-code" not in data["providers"]
    assert {"amazon-bedrock", "muse-code"} <= set(script.EXCLUDED)


def test_from_original_says_where_a_model_is_served_otherwise() -> None:
    data = generated()
    zai = data["providers"]["zai"]
    flash = next(m for m in data["models"]["zai"] if m["id"] == "glm-5.3-flash")
    glm = next(m for m in data["models"]["zai"] if m["id"] == "glm-4.6")
    # One of each: the first found wins the provider's default, the other says its own.
    assert {(zai["api"], zai["baseUrl"]), (flash.get("api", zai["api"]),
                                          flash.get("baseUrl", zai["baseUrl"]))} == {
        ("anthropic-messages", "https://api.z.ai/api/anthropic"),
        ("openai-completions", "https://api.z.ai/api/coding/paas/v4")}
    assert "api" not in glm or glm["api"] != flash.get("api", zai["api"])
    # Ollama's cloud is called over its OpenAI-compatible API, without an output limit.
    cloud = data["providers"]["ollama-cloud"]
    assert (cloud["api"], cloud["baseUrl"]) == ("openai-completions", "https://ollama.com/v1")
    assert cloud["compat"]["sendMaxTokens"] is False


def test_from_original_quirks_and_kept_models() -> None:
    data = generated()
    # The quirks this runtime reads, said once on the provider when all its models share them.
    assert data["providers"]["mistral"]["compat"] == {
        "maxTokensField": "max_tokens", "requiresToolResultName": True,
        "toolCallIdFormat": "alnum9"}
    router = data["providers"]["openrouter"]
    assert router["compat"] == {"thinkingFormat": "openrouter", "sendMaxTokens": False}
    # Our models the original lacks are kept, with the API they were written for.
    assert [m["id"] for m in data["models"]["groq"]] == [
        "openai/gpt-oss-120b", "llama-3.3-70b-versatile", "gone-model"]
    assert data["models"]["openrouter"][0]["id"] == "qwen/qwen3-coder"
    assert "anthropic/claude-sonnet-4.5" in {m["id"] for m in data["models"]["openrouter"]}


def test_from_original_is_rendered_in_the_runtime_layout(tmp_path: Path) -> None:
    """The file the runtime reads provider by provider: what it decodes of it is what was
    generated."""
    import msgspec

    from omp.llm.models import Catalog

    text = script.render(generated())
    decoded = msgspec.json.decode(text.encode(), type=Catalog)
    assert set(decoded.models) >= {"anthropic", "zai", "ollama-cloud"}
    assert text.index('"providers"') < text.index('\n  "models": {')


def test_render_keeps_the_file_layout() -> None:
    # Written back unchanged, the catalog is byte for byte what is shipped, so a refresh's
    # diff shows only what changed.
    assert script.render(catalog()) == script.CATALOG.read_text()


def test_main_without_keys_skips_and_writes_nothing(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    copy_path = tmp_path / "catalog.json"
    copy_path.write_text(script.CATALOG.read_text())
    assert script.main(["--catalog", str(copy_path), "--provider", "groq"]) == 0
    assert "groq: skipped (set GROQ_API_KEY)" in capsys.readouterr().out
    assert copy_path.read_text() == script.CATALOG.read_text()
