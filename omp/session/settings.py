"""Session settings: ``<agent dir>/settings.yml`` (auto-compaction and auto-retry).

User-edited, so it is read like ``models.yml``: cattrs into attrs classes, unknown keys rejected,
and every mistake reported as one ``ConfigError`` naming the file, the ``$.path`` in it and the
problem. A missing (or empty) file means the defaults.

```yaml
compaction:
  enabled: true           # set_auto_compaction overrides it for a session
  reserveTokens: null     # null: max(15% of the window, 16384), see effective_reserve_tokens
  keepRecentTokens: 20000
  thresholdPercent: -1    # > 0: compact above this percentage of the window
  thresholdTokens: -1     # > 0: compact above this many tokens (wins over the percentage)
  autoContinue: true
  midTurnEnabled: true
retry:
  enabled: true           # set_auto_retry overrides it for a session
  maxRetries: 10
  baseDelayMs: 500
  maxDelayMs: 300000      # a longer wait asked for by the provider fails the retry at once
```

Defaults are omp's (agent-core §5.2, §6.1, §6.2); key names are the original's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs

from ..llm.models import ConfigError, agent_dir

SETTINGS_FILES = ("settings.yml", "settings.yaml")


@attrs.define(kw_only=True)
class CompactionSettings:
    """agent-core §6.1 (omp column) and §6.2."""

    enabled: bool = True
    reserveTokens: int | None = None
    """Tokens kept free for the reply. ``None`` (omp's default): ``max(15% of the window,
    16384)``, see ``compaction.effective_reserve_tokens``."""
    keepRecentTokens: int = 20000
    """Roughly how many tokens of the newest messages a compaction keeps verbatim."""
    thresholdPercent: float = -1.0
    """Compact above this percentage of the context window when > 0 (clamped to 1..99)."""
    thresholdTokens: int = -1
    """Compact above this many context tokens when > 0 (clamped to 1..window-1)."""
    autoContinue: bool = True
    """After a threshold compaction that interrupted work, continue it."""
    midTurnEnabled: bool = True
    """Compact between two turns of one run when the threshold is crossed."""


@attrs.define(kw_only=True)
class RetrySettings:
    """agent-core §5.2 (omp column)."""

    enabled: bool = True
    maxRetries: int = 10
    """Retries of one failed turn before giving up (``maxAttempts`` of ``auto_retry_start``)."""
    baseDelayMs: int = 500
    """Backoff of the first retry; doubled per retry up to 8 s, with up to 25% jitter off."""
    maxDelayMs: int = 300_000
    """Longest ``retry-after`` wait honoured; a provider asking for more fails the retry."""


@attrs.define(kw_only=True)
class Settings:
    compaction: CompactionSettings = attrs.field(factory=CompactionSettings)
    retry: RetrySettings = attrs.field(factory=RetrySettings)


def load_settings(directory: Path | None = None) -> Settings:
    """The settings of the agent directory (``$OMP_AGENT_DIR`` or ``~/.omp/agent`` when None).

    No settings file: the defaults. A wrong one raises ConfigError (never half-applied).
    """
    directory = agent_dir() if directory is None else directory
    for name in SETTINGS_FILES:
        if (directory / name).is_file():
            return load_settings_file(directory / name)
    return Settings()


def load_settings_file(path: Path) -> Settings:
    """Parse and validate one settings file. Raises ConfigError naming the file, path and
    problem."""
    import cattrs

    from ..llm.models_file import read_yaml_mapping

    raw = read_yaml_mapping(path, "a mapping with `compaction` and/or `retry` keys")
    if raw is None:
        return Settings()
    # A section whose keys are all commented out (`retry:` alone) reads as null: its defaults.
    raw = {key: value for key, value in raw.items() if value is not None}
    try:
        settings: Settings = _converter().structure(raw, Settings)
    except cattrs.BaseValidationError as exc:
        problems = cattrs.transform_error(exc, path="$", format_exception=_describe)
        raise ConfigError(f"{path}: " + "; ".join(_plain(p) for p in problems)) from None
    _validate(settings, path)
    return settings


class _Problem(ValueError):
    """A value of the wrong type; the message is shown to the user as it is."""


def _converter() -> Any:
    import cattrs

    converter = cattrs.Converter(forbid_extra_keys=True)

    # cattrs' own hooks call int()/bool(), which would take `maxRetries: 2.7` as 2 and
    # `enabled: "no"` as true: a settings file gets exactly the type it documents.
    def strict_int(value: Any, _: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Problem(f"expected an integer (got {value!r})")
        return value

    def strict_float(value: Any, _: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Problem(f"expected a number (got {value!r})")
        return float(value)

    def strict_bool(value: Any, _: Any) -> bool:
        if not isinstance(value, bool):
            raise _Problem(f"expected true or false (got {value!r})")
        return value

    converter.register_structure_hook(int, strict_int)
    converter.register_structure_hook(float, strict_float)
    converter.register_structure_hook(bool, strict_bool)
    return converter


def _describe(exc: BaseException, type_: Any) -> str:
    import cattrs
    from cattrs.v import format_exception

    if isinstance(exc, _Problem):
        return str(exc)
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return "unknown key(s): " + ", ".join(sorted(exc.extra_fields))
    if isinstance(type_, type) and attrs.has(type_):
        return "expected a mapping"
    return format_exception(exc, type_)


def _plain(problem: str) -> str:
    # cattrs: "<what> @ $.compaction['x']" → "$.compaction.x: <what>"
    what, _, where = problem.partition(" @ ")
    where = re.sub(r"\['([^']*)'\]", r".\1", where)
    return f"{where}: {what}" if where else what


def _validate(settings: Settings, path: Path) -> None:
    c, r = settings.compaction, settings.retry
    if c.reserveTokens is not None and c.reserveTokens <= 0:
        raise ConfigError(f"{path}: $.compaction.reserveTokens: must be greater than 0, got "
                          f"{c.reserveTokens} (or null for the automatic reserve)")
    checks = (("compaction.keepRecentTokens", c.keepRecentTokens),
              ("retry.maxRetries", r.maxRetries), ("retry.baseDelayMs", r.baseDelayMs),
              ("retry.maxDelayMs", r.maxDelayMs))
    for where, value in checks:
        if value < 0:
            raise ConfigError(f"{path}: $.{where}: must not be negative, got {value}")
