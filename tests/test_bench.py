"""Every benchmark in bench/ runs (at a small size) and leaves the user's files alone: nothing
in HOME (where ``~/.omp`` would hold sessions) and nothing left in TMPDIR."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SMALL = {
    "bench_agent.py": ["--runs", "1", "--deltas", "20"],
    "bench_extensions.py": ["--rounds", "2", "--calls", "3"],
    "bench_http.py": ["--sessions", "2", "--deltas", "20", "--runs", "1"],
    "bench_llm.py": ["--deltas", "100", "--rounds", "1"],
    "bench_many.py": ["--idle", "2", "--warm", "1", "--sessions", "2", "--deltas", "10",
                      "--burst", "1"],
    "bench_rpc.py": ["--runs", "1", "--frames", "100", "--env-block"],
    "bench_sessions.py": ["--entries", "50", "--runs", "1", "--list", "20"],
    "bench_subagents.py": ["--runs", "1", "--children", "5"],
    "bench_tools.py": ["--mb", "1", "--dirs", "2", "--runs", "1", "--batch", "2", "--mcp-mib", "1"],
    "bench_ts_extensions.py": ["--starts", "1", "--rounds", "1", "--calls", "2"],
}


def test_every_benchmark_is_listed_here() -> None:
    assert sorted(p.name for p in BENCH.glob("bench_*.py")) == sorted(SMALL)


# bench_tools starts a kernel, a language server and an MCP server: the longest of them.
@pytest.mark.parametrize("script", [
    pytest.param(name, marks=pytest.mark.long) if name == "bench_tools.py" else name
    for name in sorted(SMALL)])
def test_a_benchmark_touches_neither_home_nor_tmp(tmp_path: Path, script: str) -> None:
    home, tmp, cwd = tmp_path / "home", tmp_path / "tmp", tmp_path / "cwd"
    for directory in (home, tmp, cwd):
        directory.mkdir()
    # As a user runs it: no OMP_AGENT_DIR (the test fixture sets one), so omp would use ~/.omp.
    env = {k: v for k, v in os.environ.items() if k != "OMP_AGENT_DIR"}
    env.update(HOME=str(home), TMPDIR=str(tmp))
    done = subprocess.run([sys.executable, str(BENCH / script), *SMALL[script]], cwd=cwd,
                          env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    assert done.stdout.strip(), "a benchmark prints figures"
    assert sorted(home.rglob("*")) == []
    assert sorted(tmp.rglob("*")) == []
