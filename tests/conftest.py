"""Every test runs with its own empty agent directory and no provider keys from the machine,
so results do not depend on who runs them (child processes inherit this environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

PROVIDER_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")


@pytest.fixture(autouse=True)
def isolated_agent_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "agent"
    directory.mkdir()
    monkeypatch.setenv("OMP_AGENT_DIR", str(directory))
    for name in PROVIDER_KEYS:
        monkeypatch.delenv(name, raising=False)
    return directory
