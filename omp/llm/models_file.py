"""``models.yml``: custom providers in the original's format, parsed with cattrs into attrs
classes, with errors that name the file, the place in it and the problem.

Imported only when a models.yml exists (startup does not pay for cattrs and these classes).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import attrs
import msgspec

from ..protocol.payloads import Model, ModelCost, ModelThinking
from .models import Api, ConfigError


@attrs.define(kw_only=True)
class CostConfig:
    input: float = 0.0
    output: float = 0.0
    cacheRead: float = 0.0
    cacheWrite: float = 0.0


@attrs.define(kw_only=True)
class ThinkingConfig:
    mode: Literal["effort", "budget", "google-level", "anthropic-adaptive",
                  "anthropic-budget-effort"] = "effort"
    efforts: list[Literal["minimal", "low", "medium", "high", "xhigh"]] = attrs.field(
        factory=list)
    defaultLevel: Literal["off", "minimal", "low", "medium", "high", "xhigh"] | None = None


@attrs.define(kw_only=True)
class ModelConfig:
    id: str
    name: str | None = None
    api: Api | None = None
    baseUrl: str | None = None
    reasoning: bool = False
    input: list[Literal["text", "image"]] = attrs.field(factory=lambda: ["text"])
    contextWindow: int = 128000
    maxTokens: int = 16384
    cost: CostConfig = attrs.field(factory=CostConfig)
    headers: dict[str, str] = attrs.field(factory=dict)
    compat: dict[str, Any] = attrs.field(factory=dict)
    thinking: ThinkingConfig | None = None


@attrs.define(kw_only=True)
class ModelOverride:
    name: str | None = None
    reasoning: bool | None = None
    input: list[Literal["text", "image"]] | None = None
    contextWindow: int | None = None
    maxTokens: int | None = None
    cost: CostConfig | None = None
    headers: dict[str, str] | None = None
    compat: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None


@attrs.define(kw_only=True)
class ProviderConfig:
    baseUrl: str | None = None
    api: Api | None = None
    apiKey: str | None = None
    auth: Literal["apiKey", "none"] = "apiKey"
    headers: dict[str, str] = attrs.field(factory=dict)
    authHeader: bool = False
    compat: dict[str, Any] = attrs.field(factory=dict)
    models: list[ModelConfig] = attrs.field(factory=list)
    modelOverrides: dict[str, ModelOverride] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class ModelsFile:
    providers: dict[str, ProviderConfig] = attrs.field(factory=dict)


def _converter() -> Any:
    import cattrs

    return cattrs.Converter(forbid_extra_keys=True)


def read_yaml_mapping(path: Path, expected: str) -> dict[str, Any] | None:
    """A user-edited YAML file's top-level mapping (None when the file is empty).

    Raises ConfigError naming the file and, for bad YAML, the line and column.
    """
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: not valid YAML{where}: {problem}") from None
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected {expected}, got {type(raw).__name__}")
    return raw


def load_models_file(path: Path) -> ModelsFile:
    """Parse and validate ``models.yml``. Raises ConfigError naming the file, path and problem."""
    import cattrs

    raw = read_yaml_mapping(path, "a mapping with a `providers` key")
    if raw is None:
        return ModelsFile()
    try:
        parsed: ModelsFile = _converter().structure(raw, ModelsFile)
    except cattrs.BaseValidationError as exc:
        problems = cattrs.transform_error(exc, path="$")
        raise ConfigError(f"{path}: " + "; ".join(_plain(p) for p in problems)) from None
    _validate(parsed, path)
    return parsed


def _plain(problem: str) -> str:
    # cattrs: "required field missing @ $.providers['x'].models[0].id" → "$.providers.x...: ..."
    what, _, where = problem.partition(" @ ")
    where = re.sub(r"\['([^']*)'\]", r".\1", where)
    if m := re.match(r"extra fields found \((.*)\)$", what):
        what = f"unknown key(s): {m[1]}"
    elif m := re.match(r"unknown error \((.*) not in literal typing\.Literal\[(.*)\]\)$", what):
        what = f"must be one of {m[2]} (got {m[1]!r})"
    elif what == "invalid value for type, expected int":
        what = "expected an integer"
    return f"{where}: {what}" if where else what


def _validate(parsed: ModelsFile, path: Path) -> None:
    for name, provider in parsed.providers.items():
        where = f"$.providers.{name}"
        if not name.strip():
            raise ConfigError(f"{path}: {where}: provider names must not be empty")
        if provider.models:
            if not provider.baseUrl and not all(m.baseUrl for m in provider.models):
                raise ConfigError(f"{path}: {where}.baseUrl: required for a provider with "
                                  "models")
            if provider.auth != "none" and not provider.apiKey:
                raise ConfigError(f"{path}: {where}.apiKey: required for a provider with models"
                                  " (an environment variable name or the key; or set "
                                  "`auth: none`)")
        for i, model in enumerate(provider.models):
            mwhere = f"{where}.models[{i}]"
            if not model.id.strip():
                raise ConfigError(f"{path}: {mwhere}.id: must not be empty")
            if not (model.api or provider.api):
                raise ConfigError(f"{path}: {mwhere}.api: no api for this model (set `api` on "
                                  "the model or its provider)")
            for field in ("contextWindow", "maxTokens"):
                if getattr(model, field) <= 0:
                    raise ConfigError(f"{path}: {mwhere}.{field}: must be greater than 0, got "
                                      f"{getattr(model, field)}")




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
