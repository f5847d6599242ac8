"""``models.yml``: custom providers in the original's format, as attrs classes read through the
strict converter of ``omp/config.py`` (which names the file, the ``$.path`` and the problem), plus
the checks between fields that a type cannot express.

Imported only when a models.yml exists (startup does not pay for cattrs and these classes).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..config import problem, read_yaml_mapping, structure
from ..login.config import OAuthConfig
from ..protocol.commands import ThinkingLevel
from ..protocol.payloads import Model, ModelCost, ModelThinking
from .types import Api


class CostConfig(msgspec.Struct, kw_only=True):
    input: float = 0.0
    output: float = 0.0
    cacheRead: float = 0.0
    cacheWrite: float = 0.0


class ThinkingConfig(msgspec.Struct, kw_only=True):
    mode: Literal["effort", "budget", "google-level", "anthropic-adaptive",
                  "anthropic-budget-effort"] = "effort"
    efforts: list[Literal["minimal", "low", "medium", "high", "xhigh", "max"]] = msgspec.field(
        default_factory=list)
    defaultLevel: ThinkingLevel | None = None


class ModelConfig(msgspec.Struct, kw_only=True):
    id: str
    name: str | None = None
    api: Api | None = None
    baseUrl: str | None = None
    reasoning: bool = False
    input: list[Literal["text", "image"]] = msgspec.field(default_factory=lambda: ["text"])
    contextWindow: int = 128000
    maxTokens: int = 16384
    cost: CostConfig = msgspec.field(default_factory=CostConfig)
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    compat: dict[str, Any] = msgspec.field(default_factory=dict)
    thinking: ThinkingConfig | None = None


class ModelOverride(msgspec.Struct, kw_only=True):
    name: str | None = None
    reasoning: bool | None = None
    input: list[Literal["text", "image"]] | None = None
    contextWindow: int | None = None
    maxTokens: int | None = None
    cost: CostConfig | None = None
    headers: dict[str, str] | None = None
    compat: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None


class ProviderConfig(msgspec.Struct, kw_only=True):
    baseUrl: str | None = None
    api: Api | None = None
    apiKey: str | None = None
    auth: Literal["apiKey", "none"] = "apiKey"
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    authHeader: bool = False
    compat: dict[str, Any] = msgspec.field(default_factory=dict)
    oauth: OAuthConfig | None = None
    """Log in with OAuth 2.0 (``login``); requests then carry the token as a Bearer header."""
    models: list[ModelConfig] = msgspec.field(default_factory=list)
    modelOverrides: dict[str, ModelOverride] = msgspec.field(default_factory=dict)


class ModelsFile(msgspec.Struct, kw_only=True):
    providers: dict[str, ProviderConfig] = msgspec.field(default_factory=dict)


def load_models_file(path: Path) -> ModelsFile:
    """Parse and validate ``models.yml``. Raises ConfigError naming the file, path and problem."""
    raw = read_yaml_mapping(path, "a mapping with a `providers` key")
    if raw is None:
        return ModelsFile()
    parsed = structure(raw, ModelsFile, path)
    _validate(parsed, path)
    return parsed


def _validate(parsed: ModelsFile, path: Path) -> None:
    for name, provider in parsed.providers.items():
        where = f"$.providers.{name}"
        if not name.strip():
            raise problem(path, where, "provider names must not be empty")
        if provider.models:
            if not provider.baseUrl and not all(m.baseUrl for m in provider.models):
                raise problem(path, f"{where}.baseUrl", "required for a provider with models")
            if provider.auth != "none" and not provider.apiKey and provider.oauth is None:
                raise problem(path, f"{where}.apiKey", "required for a provider with models (an "
                              "environment variable name or the key; or set `auth: none`)")
        if provider.oauth is not None:
            _validate_oauth(path, f"{where}.oauth", provider.oauth)
        for i, model in enumerate(provider.models):
            mwhere = f"{where}.models[{i}]"
            if not model.id.strip():
                raise problem(path, f"{mwhere}.id", "must not be empty")
            if not (model.api or provider.api):
                raise problem(path, f"{mwhere}.api", "no api for this model (set `api` on the "
                              "model or its provider)")
            _positive(path, mwhere, model.contextWindow, model.maxTokens)
        for model_id, ov in provider.modelOverrides.items():
            _positive(path, f"{where}.modelOverrides.{model_id}", ov.contextWindow, ov.maxTokens)


def _validate_oauth(path: Path, where: str, oauth: OAuthConfig) -> None:
    needed = "deviceAuthorizationUrl" if oauth.flow == "device" else "authorizationUrl"
    if getattr(oauth, needed) is None:
        raise problem(path, f"{where}.{needed}", f"required for `flow: {oauth.flow}`")
    if not oauth.clientId.strip():
        raise problem(path, f"{where}.clientId", "must not be empty")
    for field in ("tokenUrl", "deviceAuthorizationUrl", "authorizationUrl"):
        url = getattr(oauth, field)
        if url is None:
            continue
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise problem(path, f"{where}.{field}", f"must be an absolute http(s) URL, got "
                          f"{url!r}")
    if not 0 <= oauth.redirectPort <= 65535:
        raise problem(path, f"{where}.redirectPort", f"must be a port number from 0 to 65535, "
                      f"got {oauth.redirectPort}")
    if any(not scope or " " in scope for scope in oauth.scopes):
        raise problem(path, f"{where}.scopes", "each scope must be one non-empty word")


def _positive(path: Path, where: str, context_window: int | None, max_tokens: int | None) -> None:
    for field, value in (("contextWindow", context_window), ("maxTokens", max_tokens)):
        if value is not None and value <= 0:
            raise problem(path, f"{where}.{field}", f"must be greater than 0, got {value}")


def cost_of(c: CostConfig) -> ModelCost:
    return ModelCost(input=c.input, output=c.output, cacheRead=c.cacheRead,
                     cacheWrite=c.cacheWrite)


def thinking_of(t: ThinkingConfig | None) -> Any:
    if t is None:
        return msgspec.UNSET
    return ModelThinking(mode=t.mode, efforts=list(t.efforts),
                         defaultLevel=t.defaultLevel or msgspec.UNSET)


def override(model: Model, ov: ModelOverride) -> Model:
    changes: dict[str, Any] = {}
    for field in ("name", "reasoning", "input", "contextWindow", "maxTokens"):
        if (value := getattr(ov, field)) is not None:
            changes[field] = value
    if ov.cost is not None:
        changes["cost"] = cost_of(ov.cost)
    if ov.compat is not None:
        changes["compat"] = ov.compat
    if ov.thinking is not None:
        changes["thinking"] = thinking_of(ov.thinking)
    return msgspec.structs.replace(model, **changes)
