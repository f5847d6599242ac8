"""Every test runs with its own empty agent directory and no provider keys from the machine,
so results do not depend on who runs them (child processes inherit this environment). The
temporary directories must lie outside any git work tree: ripgrep and the project walk (skills,
context files) honour the repository they find above ``tmp_path``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

PROVIDER_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY")


def pytest_sessionstart(session: pytest.Session) -> None:
    basetemp = session.config.option.basetemp
    root = Path(basetemp or tempfile.gettempdir()).resolve()
    repository = next((d for d in (root, *root.parents) if (d / ".git").exists()), None)
    if repository is not None:
        # Dozens of tests would fail obscurely (rg skipping ignored files, walks stopping at
        # the wrong root); one clear reason instead.
        raise pytest.UsageError(
            f"the temporary directory {root} lies inside the git repository {repository}; "
            "point TMPDIR (or --basetemp) outside any repository")


@pytest.fixture(autouse=True)
def isolated_agent_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "agent"
    directory.mkdir()
    monkeypatch.setenv("OMP_AGENT_DIR", str(directory))
    for name in PROVIDER_KEYS:
        monkeypatch.delenv(name, raising=False)
    return directory
