"""The model registry: catalog, models.yml, auth.json, keys, thinking levels."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import msgspec
import pytest

from omp.config import ConfigError
from omp.llm import thinking
from omp.llm.models import ModelRegistry, load_auth_file, split_url_credentials
from omp.llm.models_file import load_models_file
from omp.protocol.payloads import Model, ModelCost
from omp.session import SessionError, create_session

VALID_YML = """
providers:
  my-local:
    baseUrl: http://localhost:8000/v1
    api: openai-completions
    apiKey: MY_LOCAL_KEY
    headers: {x-team: platform}
    models:
      - id: qwen3-coder
        name: Qwen3 Coder (local)
        reasoning: true
        input: [text]
        contextWindow: 131072
        maxTokens: 8192
        cost: {input: 0.5, output: 1}
        thinking: {mode: effort, efforts: [low, high]}
      - id: tiny
        api: anthropic-messages
  nokey:
    baseUrl: http://localhost:9000
    api: openai-completions
    auth: none
    models: [{id: free}]
  anthropic:
    modelOverrides:
      claude-sonnet-4-5: {contextWindow: 1000000}
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def registry(directory: Path, **environ: str) -> ModelRegistry:
    return ModelRegistry.load(directory, environ=environ)


def test_catalog_models_are_complete() -> None:
    reg = registry(Path("/nonexistent"))
    providers = {m.provider for m in reg.all_models()}
    assert {"anthropic", "openai", "google", "offline"} <= providers
    for model in reg.models:
        assert model.api in {"anthropic-messages", "openai-responses", "google-generative-ai",
                             "openai-completions", "offline"}
        assert model.input[0] == "text"
        if model.provider in ("anthropic", "openai", "google", "groq", "offline"):
            # The aggregators list a few models without published limits (null, as the
            # original lists them); the first-party providers publish every one.
            assert model.contextWindow
            assert model.maxTokens
    # Without keys only the offline models are available, and the default is offline.
    assert [m.provider for m in reg.available()] == ["offline", "offline"]
    assert (reg.default_model().provider, reg.default_model().id) == ("offline", "echo")


def test_environment_keys_pick_the_default(tmp_path: Path) -> None:
    reg = registry(tmp_path, OPENAI_API_KEY="sk-test")
    assert reg.default_model().id == "gpt-5.1"
    assert reg.api_key("openai") == "sk-test"
    reg = registry(tmp_path, OPENAI_API_KEY="a", GEMINI_API_KEY="b", ANTHROPIC_API_KEY="c")
    assert reg.default_model().provider == "anthropic"


def test_the_start_model_order_of_the_models_guide(tmp_path: Path) -> None:
    """docs/guides/models.md, "Models and keys": the built-in defaults, then the other catalog
    providers, then the providers models.yml adds (in the file's order, when they have
    credentials), then the offline model."""
    write(tmp_path, "models.yml", """\
providers:
  keyed:
    baseUrl: http://127.0.0.1:9/v1
    api: openai-completions
    apiKey: KEYED_KEY
    models: [{id: k1}]
  keyless:
    baseUrl: http://127.0.0.1:9/v1
    api: openai-completions
    auth: none
    models: [{id: free-1}, {id: free-2}]
""")

    def start(**environ: str) -> tuple[str, str]:
        model = registry(tmp_path, **environ).default_model()
        return model.provider, model.id

    assert start() == ("keyless", "free-1")  # keyed's variable is not set
    assert start(KEYED_KEY="k") == ("keyed", "k1")  # the file's order
    assert start(KEYED_KEY="k", GROQ_API_KEY="g")[0] == "groq"  # the catalog's first
    assert start(GROQ_API_KEY="g", OPENAI_API_KEY="o") == ("openai", "gpt-5.1")
    write(tmp_path, "models.yml", "providers: {}\n")
    assert start() == ("offline", "echo")


def test_valid_models_yml(tmp_path: Path) -> None:
    write(tmp_path, "models.yml", VALID_YML)
    reg = registry(tmp_path, MY_LOCAL_KEY="local-secret")
    qwen = reg.find("my-local", "qwen3-coder")
    assert qwen is not None
    assert qwen == Model(
        id="qwen3-coder", name="Qwen3 Coder (local)", api="openai-completions",
        provider="my-local", baseUrl="http://localhost:8000/v1", reasoning=True, input=["text"],
        cost=ModelCost(input=0.5, output=1.0, cacheRead=0.0, cacheWrite=0.0),
        contextWindow=131072, maxTokens=8192, thinking=qwen.thinking)
    assert thinking.available_levels(qwen) == ["off", "low", "high"]
    tiny = reg.find("my-local", "tiny")
    assert tiny is not None
    assert (tiny.api, tiny.contextWindow, tiny.maxTokens, tiny.name) == (
        "anthropic-messages", 128000, 16384, "tiny")
    assert reg.api_key("my-local") == "local-secret"
    assert reg.headers(qwen) == {"x-team": "platform"}
    assert reg.has_credentials("nokey")
    sonnet = reg.find("anthropic", "claude-sonnet-4-5")
    assert sonnet is not None
    assert sonnet.contextWindow == 1_000_000
    available = {(m.provider, m.id) for m in reg.available()}
    assert {("my-local", "qwen3-coder"), ("nokey", "free")} <= available
    # The key never becomes part of a model (models are sent to hosts).
    assert b"local-secret" not in msgspec.json.encode(reg.models)


def test_key_variables_are_hidden_from_subprocesses(tmp_path: Path) -> None:
    """The variables a registry reads secrets from: the built-in providers', a models.yml
    ``apiKey`` naming a variable and header values naming one, which the session's
    environment policy keeps from subprocesses (``test_secrets``). Literal keys and plain
    header values are no names."""
    write(tmp_path, "models.yml", VALID_YML.replace(
        "headers: {x-team: platform}", "headers: {x-team: platform, x-token: MY_TOKEN_VAR}"
    ).replace("auth: none", "apiKey: sk-a-literal-key"))
    reg = registry(tmp_path)
    names = reg.key_variables()
    assert {"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY",
            "MY_LOCAL_KEY", "MY_TOKEN_VAR"} <= names
    assert not names & {"platform", "sk-a-literal-key", "x-team"}


@pytest.mark.parametrize(("url", "stripped", "basic"), [
    ("https://user:s3cret@proxy.example/v1", "https://proxy.example/v1", "user:s3cret"),
    ("http://tok@127.0.0.1:8080/v1?x=a@b#f", "http://127.0.0.1:8080/v1?x=a@b#f", "tok:"),
    ("https://u%40x:p%3Aw@h/", "https://h/", "u@x:p:w"),
    ("https://a:b:c@h", "https://h", "a:b:c"),
    ("https://proxy.example/v1/a@b", "https://proxy.example/v1/a@b", None),
    ("not a url", "not a url", None),
])
def test_split_url_credentials(url: str, stripped: str, basic: str | None) -> None:
    expected = None if basic is None else "Basic " + base64.b64encode(basic.encode()).decode()
    assert split_url_credentials(url) == (stripped, expected)


def test_base_url_credentials_never_reach_a_model(tmp_path: Path) -> None:
    """A baseUrl with ``user:secret@`` (a new provider's, a built-in one's): the models hold
    the URL without it, and the request gets the Basic authorization it stands for, in place
    of any other authorization header."""
    write(tmp_path, "models.yml", VALID_YML.replace(
        "baseUrl: http://localhost:8000/v1", "baseUrl: http://me:hunter2@localhost:8000/v1"
    ).replace("  anthropic:\n", "  anthropic:\n    baseUrl: https://gw:gwpass@gateway.example\n"))
    reg = registry(tmp_path, MY_LOCAL_KEY="k", ANTHROPIC_API_KEY="a")
    assert b"hunter2" not in msgspec.json.encode(reg.models)
    assert b"gwpass" not in msgspec.json.encode(reg.models)
    qwen = reg.find("my-local", "qwen3-coder")
    sonnet = reg.find("anthropic", "claude-sonnet-4-5")
    assert qwen is not None
    assert sonnet is not None
    assert (qwen.baseUrl, sonnet.baseUrl) == ("http://localhost:8000/v1",
                                              "https://gateway.example")
    assert reg.headers(qwen) == {"x-team": "platform",
                                 "authorization": "Basic " + base64.b64encode(
                                     b"me:hunter2").decode()}
    assert reg.headers(sonnet)["authorization"] == "Basic " + base64.b64encode(
        b"gw:gwpass").decode()
    direct = ModelRegistry(models=[msgspec.structs.replace(qwen, baseUrl="http://a:b@h")])
    assert direct.models[0].baseUrl == "http://h"


def test_literal_key_and_unset_variable(tmp_path: Path) -> None:
    write(tmp_path, "models.yml", VALID_YML.replace("apiKey: MY_LOCAL_KEY", "apiKey: sk-literal"))
    assert registry(tmp_path).api_key("my-local") == "sk-literal"
    write(tmp_path, "models.yml", VALID_YML)
    reg = registry(tmp_path)  # MY_LOCAL_KEY not set
    assert reg.api_key("my-local") is None
    assert reg.missing_key_hint("my-local") == "set MY_LOCAL_KEY"
    assert not any(m.provider == "my-local" for m in reg.available())


MODEL = ("providers:\n  p:\n    baseUrl: http://x\n    apiKey: K\n    api: openai-completions\n"
         "    models: [{{id: m, {}}}]\n")
MISTAKES = [
    ("providers: [1, 2", "models.yml: not valid YAML (line 1, column 17): expected ',' or ']', "
     "but got '<stream end>'"),
    ("- a\n- b\n", "models.yml: expected a mapping with a `providers` key, got list"),
    ("providers:\n  p:\n    api: openai-completions\n    apiKey: K\n    models: [{id: m}]\n",
     "models.yml: $.providers.p.baseUrl: required for a provider with models"),
    ("providers:\n  p:\n    baseUrl: http://x\n    api: openai-completions\n"
     "    models: [{id: m}]\n",
     "models.yml: $.providers.p.apiKey: required for a provider with models (an environment "
     "variable name or the key; or set `auth: none`)"),
    ("providers:\n  p:\n    baseUrl: http://x\n    apiKey: K\n    models: [{id: m}]\n",
     "models.yml: $.providers.p.models[0].api: no api for this model (set `api` on the model "
     "or its provider)"),
    ("providers:\n  p:\n    baseUrl: http://x\n    apiKey: K\n    api: openai-completions\n"
     "    models: [{id: ' '}]\n",
     "models.yml: $.providers.p.models[0].id: must not be empty"),
    ("providers:\n  p:\n    baseUrl: http://x\n    apiKey: K\n    api: openai-completions\n"
     "    models: [{id: m, contextWindow: 0}]\n",
     "models.yml: $.providers.p.models[0].contextWindow: must be greater than 0, got 0"),
    ("providers:\n  p:\n    baseUrl: http://x\n    apiKey: K\n    api: openai-completions\n"
     "    models: [{id: m, maxTokens: lots}]\n",
     "models.yml: $.providers.p.models[0].maxTokens: expected an integer (got 'lots')"),
    ("providers:\n  p:\n    baseUrl: http://x\n    apiKey: K\n    api: carrier-pigeon\n"
     "    models: [{id: m}]\n",
     "models.yml: $.providers.p.api: must be one of 'openai-completions', 'openai-responses', "
     "'anthropic-messages', 'google-generative-ai', 'offline' (got 'carrier-pigeon')"),
    ("providers:\n  p:\n    baseUrl: http://x\n    apiKey: K\n    api: openai-completions\n"
     "    models: [{id: m, colour: blue}]\n",
     "models.yml: $.providers.p.models[0]: unknown key(s): colour"),
    ("providers:\n  p:\n    models: [{name: no-id}]\n    baseUrl: http://x\n    apiKey: K\n",
     "models.yml: $.providers.p.models[0].id: required field missing"),
    # Each of these used to be accepted, converted into something else.
    (MODEL.format("reasoning: 'false'"),
     "models.yml: $.providers.p.models[0].reasoning: expected true or false (got 'false')"),
    (MODEL.format("maxTokens: 99.7"),
     "models.yml: $.providers.p.models[0].maxTokens: expected an integer (got 99.7)"),
    (MODEL.format("contextWindow: '128000'"),
     "models.yml: $.providers.p.models[0].contextWindow: expected an integer (got '128000')"),
    (MODEL.format("input: text"),
     "models.yml: $.providers.p.models[0].input: expected a list (got 'text')"),
    (MODEL.format("headers: {x-team: 7}"),
     "models.yml: $.providers.p.models[0].headers.x-team: expected a string (got 7)"),
    ("providers:\n  p:\n    apiKey: [a, b]\n",
     "models.yml: $.providers.p.apiKey: expected a string (got ['a', 'b'])"),
    ("providers:\n  anthropic:\n    modelOverrides:\n      claude-sonnet-4-5: {maxTokens: 0}\n",
     "models.yml: $.providers.anthropic.modelOverrides.claude-sonnet-4-5.maxTokens: must be "
     "greater than 0, got 0"),
]


@pytest.mark.parametrize(("text", "message"), MISTAKES)
def test_models_yml_mistakes_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "models.yml", text)
    with pytest.raises(ConfigError) as caught:
        load_models_file(path)
    assert str(caught.value) == f"{tmp_path}/{message}"


def test_models_yml_that_is_not_a_readable_file_stops_loading(tmp_path: Path) -> None:
    # It used to be skipped silently: no custom providers, and no word why.
    (tmp_path / "models.yml").mkdir()
    with pytest.raises(ConfigError) as caught:
        registry(tmp_path)
    assert str(caught.value) == f"{tmp_path}/models.yml: is a directory, not a file"
    (tmp_path / "models.yml").rmdir()
    (tmp_path / "models.yml").write_bytes(b"providers:\n  p:\n    apiKey: s\xe9cret\n")
    with pytest.raises(ConfigError) as caught:
        registry(tmp_path)
    assert str(caught.value) == (f"{tmp_path}/models.yml: not UTF-8 text (byte 0xe9 on line 3); "
                                 "save the file as UTF-8")


def test_offline_models_step_aside_for_a_real_provider(tmp_path: Path) -> None:
    offline = registry(tmp_path)
    assert [(m.provider, m.id) for m in offline.available()] == [
        ("offline", "echo"), ("offline", "echo-thinking")]
    keyed = registry(tmp_path, OPENAI_API_KEY="sk-test")
    available = keyed.available()
    assert available
    assert {m.provider for m in available} == {"openai"}
    # Still there to be chosen by name.
    assert keyed.has_credentials("offline")
    assert keyed.find("offline", "echo") is not None
    # A custom provider that needs no key counts as configured too.
    write(tmp_path, "models.yml", "providers:\n  local:\n    baseUrl: http://127.0.0.1:9\n"
          "    api: openai-completions\n    auth: none\n    models: [{id: m}]\n")
    assert [(m.provider, m.id) for m in registry(tmp_path).available()] == [("local", "m")]


def test_auth_json_forms_and_permissions(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    path = write(tmp_path, "auth.json",
                 '{"anthropic": "sk-a", "openai": {"type": "api_key", "key": "sk-o"}}')
    os.chmod(path, 0o600)
    assert load_auth_file(path) == {"anthropic": "sk-a", "openai": "sk-o"}
    assert capsys.readouterr().err == ""
    os.chmod(path, 0o644)
    load_auth_file(path)
    assert "is readable by others; run `chmod 600" in capsys.readouterr().err
    reg = registry(tmp_path, ANTHROPIC_API_KEY="from-env")
    assert reg.api_key("anthropic") == "sk-a"  # auth.json outranks the environment
    write(tmp_path, "auth.json", '{"openai": 5}')
    with pytest.raises(ConfigError, match=r"auth.json: \$.openai: expected a key string"):
        load_auth_file(tmp_path / "auth.json")


def test_cli_key_outranks_everything(tmp_path: Path) -> None:
    reg = ModelRegistry.load(tmp_path, environ={"OPENAI_API_KEY": "env"},
                             cli_keys={"openai": "cli"})
    assert reg.api_key("openai") == "cli"


def model(reasoning: bool, api: str = "anthropic-messages", **extra: object) -> Model:
    return Model(id="m", name="m", api=api, provider="p", baseUrl="", reasoning=reasoning,
                 input=["text"], cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                 contextWindow=1000, maxTokens=64000, **extra)  # type: ignore[arg-type]


def test_thinking_levels_and_clamping() -> None:
    plain = model(False)
    assert thinking.available_levels(plain) == ["off"]
    assert thinking.clamp(plain, "high") == "off"
    assert thinking.cycle(plain, "off") is None
    claude = model(True)
    assert thinking.available_levels(claude) == ["off", "minimal", "low", "medium", "high",
                                                 "xhigh"]
    gpt = model(True, api="openai-responses")
    assert thinking.clamp(gpt, "xhigh") == "high"
    assert thinking.cycle(gpt, "high") == "off"
    assert thinking.openai_effort(gpt, "low") == "low"
    assert thinking.openai_effort(gpt, "off") is None


def test_provider_parameters() -> None:
    claude = model(True)
    assert thinking.anthropic_thinking(claude, "medium", 8000) == (
        {"type": "enabled", "budget_tokens": 8192}, 16192)
    assert thinking.anthropic_thinking(claude, "off", 8000) == (None, 8000)
    flash = Model(id="gemini-2.5-flash", name="f", api="google-generative-ai", provider="google",
                  baseUrl="", reasoning=True, input=["text"],
                  cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                  contextWindow=1, maxTokens=1)
    assert thinking.google_thinking_config(flash, "high") == {"thinkingBudget": 16384,
                                                              "includeThoughts": True}
    assert thinking.google_thinking_config(flash, "off") == {"thinkingBudget": 0}
    gemini3 = msgspec.structs.replace(flash, id="gemini-3-pro-preview")
    assert thinking.google_thinking_config(gemini3, "low") == {"thinkingLevel": "LOW",
                                                               "includeThoughts": True}


def test_startup_choices(tmp_path: Path) -> None:
    session = create_session(model="offline/echo-thinking", thinking="xhigh",
                             agent_directory=tmp_path, environ={})
    assert (session.model.id, session.thinking_level) == ("echo-thinking", "high")
    with pytest.raises(SessionError, match=r"^Model not found: nope$"):
        create_session(model="nope", agent_directory=tmp_path, environ={})
    with pytest.raises(SessionError, match=r"^Unknown provider: zzz"):
        create_session(provider="zzz", agent_directory=tmp_path, environ={})
    with pytest.raises(SessionError,
                       match=r"^No API key for anthropic/claude-sonnet-4-5: set ANTHROPIC_API"):
        create_session(provider="anthropic", agent_directory=tmp_path, environ={})
    session = create_session(provider="anthropic", api_key="sk-cli", agent_directory=tmp_path,
                             environ={})
    assert session.registry.api_key("anthropic") == "sk-cli"
    with pytest.raises(SessionError, match="--api-key needs --provider"):
        create_session(api_key="k", agent_directory=tmp_path, environ={})


def test_registries_share_the_catalogs_models(tmp_path: Path) -> None:
    """One registry per session: the shipped catalog's models (immutable) are decoded once
    per process and shared, not copied per session (bench_many's idle memory per session)."""
    first = ModelRegistry.load(tmp_path / "a", environ={})
    second = ModelRegistry.load(tmp_path / "b", environ={})
    assert len(first.all_models()) > 50
    second.ensure_all()
    assert all(a is b for a, b in zip(first.models, second.models, strict=True))
    # Each registry's list is its own: a change to one (models.yml, a local server) is not
    # seen by the other.
    first.models.pop()
    assert len(second.models) == len(first.models) + 1
