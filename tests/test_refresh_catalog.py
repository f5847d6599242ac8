"""``scripts/refresh_catalog.py``: its parsing of each provider's model list, on payloads
recorded from the providers' documented responses (``tests/data/catalog/``), and what it does
to the catalog. The fetching itself needs the internet and is not run here."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "catalog"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("refresh_catalog",
                                                  ROOT / "scripts" / "refresh_catalog.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["refresh_catalog"] = module
    spec.loader.exec_module(module)
    return module


script = load_script()


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


def test_compare_updates_what_changed_and_reports_the_rest() -> None:
    data = catalog()
    before = copy.deepcopy(data)
    listed = script.parse_models("groq", recorded("groq"))
    listed["openai/gpt-oss-120b"]["contextWindow"] = 200000  # as if Groq raised it
    changes, new, gone = script.compare(data, "groq", listed)
    assert changes == ["groq/openai/gpt-oss-120b: contextWindow 131072 -> 200000"]
    assert new == ["whisper-large-v3"]
    groq_ids = {m["id"] for m in before["models"] if m["provider"] == "groq"}
    assert set(gone) == groq_ids - {"openai/gpt-oss-120b", "llama-3.3-70b-versatile"}
    changed = [m for m in data["models"] if m["id"] == "openai/gpt-oss-120b"
               and m["provider"] == "groq"]
    assert changed[0]["contextWindow"] == 200000
    # Nothing else moved, and no model was removed or added without --add.
    assert len(data["models"]) == len(before["models"])
    script.compare(data, "groq", listed, add=True)
    added = data["models"][-1]
    assert (added["provider"], added["id"], added["contextWindow"]) == (
        "groq", "whisper-large-v3", 448)


def test_prices_and_images_from_openrouter_are_written_back() -> None:
    data = catalog()
    listed = script.parse_models("openrouter", recorded("openrouter"))
    listed["qwen/qwen3-coder"]["cost"]["input"] = 0.3
    changes, _, _ = script.compare(data, "openrouter", listed)
    assert "openrouter/qwen/qwen3-coder: cost.input 0.22 -> 0.3" in changes
    assert "openrouter/anthropic/claude-sonnet-4.5: contextWindow 1000000 -> 1000000" \
        not in changes


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
