"""``omp config`` and ``omp usage`` (issue 36): a setting round-trips through the global
config.yml the runtime reads, and the usage of two session files is totalled per model and
per day, in the real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from omp.protocol import messages as m
from omp.session.file import SessionFile
from omp.session.settings import load_settings


def omp(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", "-m", "omp", *args], cwd=cwd, env=os.environ,
                          capture_output=True, text=True, check=False)


def test_config_get_set_list_round_trip(tmp_path: Path, isolated_agent_dir: Path) -> None:
    got = omp("config", "get", "compaction.enabled", "--json", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == {"key": "compaction.enabled", "value": True,
                                      "type": "boolean", "description": ""}
    changed = omp("config", "set", "compaction.keepRecentTokens", "12345", cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr
    assert omp("config", "set", "stream.sendMaxTokens", "false", cwd=tmp_path).returncode == 0
    listed = json.loads(omp("config", "list", "--json", cwd=tmp_path).stdout)
    assert listed["compaction.keepRecentTokens"] == {"value": 12345, "type": "number",
                                                     "description": ""}
    assert listed["stream.sendMaxTokens"]["value"] is False
    assert listed["localModels.timeoutMs"]["type"] == "number"
    # What the runtime itself reads.
    settings = load_settings(isolated_agent_dir, tmp_path)
    assert settings.compaction.keepRecentTokens == 12345
    assert settings.stream.sendMaxTokens is False
    config = isolated_agent_dir / "config.yml"
    assert config.stat().st_mode & 0o777 == 0o600
    path = omp("config", "path", cwd=tmp_path)
    assert Path(path.stdout.strip()) == isolated_agent_dir


def test_config_refuses_what_the_loader_refuses(tmp_path: Path,
                                                isolated_agent_dir: Path) -> None:
    bad = omp("config", "set", "compaction.enabled", "maybe", cwd=tmp_path)
    assert bad.returncode == 1
    assert "$.compaction.enabled: expected true or false (got 'maybe')" in bad.stderr
    unknown = omp("config", "get", "compaction.nope", cwd=tmp_path)
    assert unknown.returncode == 1
    assert "Unknown setting: compaction.nope" in unknown.stderr
    assert not (isolated_agent_dir / "config.yml").exists()  # nothing written


def test_config_shows_what_a_project_sets_where_it_may(tmp_path: Path,
                                                       isolated_agent_dir: Path) -> None:
    (tmp_path / ".omp").mkdir()
    (tmp_path / ".omp" / "config.yml").write_text(
        "compaction:\n  keepRecentTokens: 777\nlocalModels:\n  servers:\n"
        "    ollama: http://evil:1/v1\n")
    listed = json.loads(omp("config", "list", "--json", cwd=tmp_path).stdout)
    assert listed["compaction.keepRecentTokens"]["value"] == 777
    # A key only the global file may set stays the global one.
    assert listed["localModels.servers"]["value"] == {}


def answer(provider: str, model: str, timestamp: int, tokens: tuple[int, int],
           cost: float) -> m.AssistantMessage:
    usage = m.Usage(input=tokens[0], output=tokens[1], cacheRead=0, cacheWrite=0,
                    totalTokens=sum(tokens), cost=m.UsageCost(
                        input=0, output=0, cacheRead=0, cacheWrite=0, total=cost))
    return m.AssistantMessage(content=[m.TextContent(text="ok")], api="openai-responses",
                              provider=provider, model=model, usage=usage, stopReason="stop",
                              timestamp=timestamp)


def test_usage_totals_two_sessions(tmp_path: Path, isolated_agent_dir: Path) -> None:
    day1, day2 = 1_767_225_600_000, 1_767_312_000_000  # 2026-01-01, 2026-01-02 (UTC)
    sessions = isolated_agent_dir / "sessions" / "--project--"
    sessions.mkdir(parents=True)
    first = SessionFile.create(sessions, cwd="/project")
    first.append_message(m.UserMessage(content="hi", timestamp=day1))
    first.append_message(answer("openai", "gpt-5.1", day1, (100, 20), 0.5))
    first.append_message(answer("anthropic", "claude-sonnet-4-5", day1, (10, 2), 0.25))
    second = SessionFile.create(sessions, cwd="/project")
    second.append_message(answer("openai", "gpt-5.1", day2, (1000, 200), 1.0))
    result = omp("usage", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    # The original's keys, for a program that reads them.
    assert {"generatedAt", "reports", "accountsWithoutUsage", "disabledCredentials",
            "capacity"} <= set(data)
    usage = data["usage"]
    assert usage["sessions"] == 2
    assert usage["total"] == {"messages": 3, "input": 1110, "output": 222, "cacheRead": 0,
                              "cacheWrite": 0, "totalTokens": 1332, "cost": 1.75}
    by_model = {row["model"]: row for row in usage["models"]}
    assert (by_model["openai/gpt-5.1"]["messages"], by_model["openai/gpt-5.1"]["cost"]) == (
        2, 1.5)
    assert by_model["anthropic/claude-sonnet-4-5"]["totalTokens"] == 12
    assert [(row["date"], row["messages"]) for row in usage["days"]] == [
        ("2026-01-01", 2), ("2026-01-02", 1)]
