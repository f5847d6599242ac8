"""ACP authentication (docs/guides/acp.md#logging-in-from-the-editor): the ``terminal`` method
offered to an editor that can run one, driven by the ``agent-client-protocol`` package's client
against the real ``omp acp``, and the login that method runs (``omp acp --acp-terminal-auth``) as a
real process in a pipe."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from test_acp import OMP, Recorder

acp = pytest.importorskip("acp")
schema = pytest.importorskip("acp.schema")


def initialize(cwd: Path, terminal: bool) -> dict[str, Any]:
    """``initialize`` with or without ``auth.terminal``, then ``authenticate`` with each
    method id; what came back."""

    async def main() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with acp.spawn_agent_process(Recorder(), OMP[0], *OMP[1:], "acp", cwd=str(cwd),
                                           env=dict(os.environ)) as (conn, process):
            init = await asyncio.wait_for(conn.initialize(
                protocol_version=1, client_capabilities=schema.ClientCapabilities(
                    auth=schema.AuthCapabilities(terminal=terminal))), 30)
            seen["methods"] = [m.model_dump(by_alias=True, exclude_none=True)
                               for m in init.auth_methods]
            for method in ("agent", "terminal"):
                try:
                    await conn.authenticate(method_id=method)
                    seen[method] = "ok"
                except acp.RequestError as exc:
                    seen[method] = (exc.code, exc.data)
            assert process.stdin is not None
            process.stdin.close()
            assert await asyncio.wait_for(process.wait(), 30) == 0
        return seen

    return asyncio.run(main())


@pytest.mark.parametrize("terminal", [True, False])
async def test_the_terminal_method_is_offered_to_an_editor_that_runs_it(
        tmp_path: Path, isolated_agent_dir: Path, terminal: bool) -> None:
    seen = await trio.to_thread.run_sync(initialize, tmp_path, terminal)
    agent = {"id": "agent", "name": "Use existing local credentials",
             "description": "Authenticate via the provider keys/OAuth state already "
                            "configured under ~/.omp."}
    assert seen["agent"] == "ok"
    if not terminal:
        assert seen["methods"] == [agent]
        assert seen["terminal"] == (-32603, {"details": "Unknown ACP auth method: terminal"})
        return
    assert seen["methods"] == [agent, {
        "type": "terminal", "id": "terminal", "name": "Set up Oh My Pi in terminal",
        "description": "Log in to a provider in a terminal: paste an API key or complete an "
                       "OAuth login.",
        "args": ["--acp-terminal-auth"]}]
    assert seen["terminal"] == "ok"


def terminal_login(cwd: Path, typed: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OMP, "acp", "--acp-terminal-auth"], cwd=cwd, input=typed,
                          capture_output=True, text=True, timeout=60, env=dict(os.environ),
                          check=False)


async def test_the_terminal_login_stores_a_pasted_key(tmp_path: Path,
                                                      isolated_agent_dir: Path) -> None:
    key = "sk-ant-terminal-login-0123456789"
    done = await trio.to_thread.run_sync(
        terminal_login, tmp_path, f"no-such-provider\nanthropic\nBearer {key}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No provider 'no-such-provider': give its number or id." in done.stdout
    assert "Paste your Anthropic API key" in done.stdout
    assert done.stdout.rstrip().endswith("Logged in to Anthropic. Return to your editor.")
    assert key not in done.stdout + done.stderr  # the key is never shown
    stored = json.loads((isolated_agent_dir / "auth.json").read_text())
    assert key in json.dumps(stored["anthropic"])
    # Listed as logged in the next time.
    again = await trio.to_thread.run_sync(terminal_login, tmp_path, "")
    assert again.returncode == 1
    assert "[anthropic] (logged in)" in again.stdout
    assert again.stdout.rstrip().endswith("Nothing changed.")


async def test_the_terminal_login_refuses_an_empty_key(tmp_path: Path,
                                                       isolated_agent_dir: Path) -> None:
    done = await trio.to_thread.run_sync(terminal_login, tmp_path, "anthropic\n\n")
    assert done.returncode == 1
    assert "Login failed: API key is required" in done.stdout
    assert not (isolated_agent_dir / "auth.json").exists()


def test_the_flag_belongs_to_acp() -> None:
    done = subprocess.run([*OMP, "--mode", "rpc", "--acp-terminal-auth"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "--acp-terminal-auth is for `omp acp`" in done.stderr
