"""settings.yml: defaults, a valid file, and every kind of mistake named exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from omp.llm.models import ConfigError
from omp.session.settings import (
    CompactionSettings,
    RetrySettings,
    Settings,
    load_settings,
    load_settings_file,
)


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_omps() -> None:
    settings = Settings()
    assert settings.compaction == CompactionSettings(
        enabled=True, reserveTokens=None, keepRecentTokens=20000, thresholdPercent=-1.0,
        thresholdTokens=-1, autoContinue=True, midTurnEnabled=True)
    assert settings.retry == RetrySettings(enabled=True, maxRetries=10, baseDelayMs=500,
                                           maxDelayMs=300_000)


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path) == Settings()


def test_agent_dir_is_the_default_directory(isolated_agent_dir: Path) -> None:
    write(isolated_agent_dir, "settings.yml", "retry:\n  maxRetries: 2\n")
    assert load_settings().retry.maxRetries == 2


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "retry:\ncompaction:\n"])
def test_empty_file_or_sections_mean_defaults(tmp_path: Path, text: str) -> None:
    write(tmp_path, "settings.yml", text)
    assert load_settings(tmp_path) == Settings()


def test_valid_file(tmp_path: Path) -> None:
    write(tmp_path, "settings.yml", """\
compaction:
  enabled: false
  reserveTokens: 8000
  keepRecentTokens: 12000
  thresholdPercent: 80
  thresholdTokens: 90000
  autoContinue: false
  midTurnEnabled: false
retry:
  enabled: false
  maxRetries: 3
  baseDelayMs: 2000
  maxDelayMs: 60000
""")
    assert load_settings(tmp_path) == Settings(
        compaction=CompactionSettings(enabled=False, reserveTokens=8000, keepRecentTokens=12000,
                                      thresholdPercent=80.0, thresholdTokens=90000,
                                      autoContinue=False, midTurnEnabled=False),
        retry=RetrySettings(enabled=False, maxRetries=3, baseDelayMs=2000, maxDelayMs=60000))


def test_partial_file_keeps_other_defaults(tmp_path: Path) -> None:
    write(tmp_path, "settings.yml", "compaction:\n  keepRecentTokens: 5000\n")
    settings = load_settings(tmp_path)
    assert settings.compaction == CompactionSettings(keepRecentTokens=5000)
    assert settings.retry == RetrySettings()


def test_reserve_tokens_null_is_automatic(tmp_path: Path) -> None:
    write(tmp_path, "settings.yml", "compaction:\n  reserveTokens: null\n")
    assert load_settings(tmp_path).compaction.reserveTokens is None


def test_settings_yaml_spelling_is_read(tmp_path: Path) -> None:
    write(tmp_path, "settings.yaml", "retry:\n  maxRetries: 4\n")
    assert load_settings(tmp_path).retry.maxRetries == 4


MISTAKES = [
    ("retry: [1", "not valid YAML (line 1, column 10): expected ',' or ']', but got "
     "'<stream end>'"),
    ("- retry\n", "expected a mapping with `compaction` and/or `retry` keys, got list"),
    ("colour: blue\n", "$: unknown key(s): colour"),
    ("retry:\n  baseDelay: 1\n  maxDelay: 2\n", "$.retry: unknown key(s): baseDelay, maxDelay"),
    ("compaction: 3\n", "$.compaction: expected a mapping"),
    ("retry: [1, 2]\n", "$.retry: expected a mapping"),
    ("retry:\n  maxRetries: 2.5\n", "$.retry.maxRetries: expected an integer (got 2.5)"),
    ("retry:\n  maxRetries: '3'\n", "$.retry.maxRetries: expected an integer (got '3')"),
    ("retry:\n  maxRetries: true\n", "$.retry.maxRetries: expected an integer (got True)"),
    ("retry:\n  enabled: 'no'\n", "$.retry.enabled: expected true or false (got 'no')"),
    ("compaction:\n  reserveTokens: lots\n",
     "$.compaction.reserveTokens: expected an integer (got 'lots')"),
    ("compaction:\n  thresholdPercent: high\n",
     "$.compaction.thresholdPercent: expected a number (got 'high')"),
    ("retry:\n  enabled: 1\n  maxDelayMs: 1.5\n",
     "$.retry.enabled: expected true or false (got 1); "
     "$.retry.maxDelayMs: expected an integer (got 1.5)"),
    ("compaction:\n  reserveTokens: 0\n",
     "$.compaction.reserveTokens: must be greater than 0, got 0 (or null for the automatic "
     "reserve)"),
    ("compaction:\n  keepRecentTokens: -5\n",
     "$.compaction.keepRecentTokens: must not be negative, got -5"),
    ("retry:\n  maxRetries: -1\n", "$.retry.maxRetries: must not be negative, got -1"),
    ("retry:\n  baseDelayMs: -500\n", "$.retry.baseDelayMs: must not be negative, got -500"),
    ("retry:\n  maxDelayMs: -1\n", "$.retry.maxDelayMs: must not be negative, got -1"),
]


@pytest.mark.parametrize(("text", "message"), MISTAKES)
def test_mistakes_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "settings.yml", text)
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert str(caught.value) == f"{path}: {message}"


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "settings.yml"
    path.mkdir()
    with pytest.raises(ConfigError) as caught:
        load_settings_file(path)
    assert str(caught.value) == f"{path}: cannot be read: Is a directory"
