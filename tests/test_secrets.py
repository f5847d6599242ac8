"""Secrets stay where they belong (issue 15, item 4): subprocesses do not inherit the provider
keys, and a base URL's credentials reach the provider but never a frame.

The process tests run the real ``omp --mode rpc`` against the fake LLM, with keys in its
environment the way a user has them, and look for those keys in everything a host sees: every
frame, the session file, the HTML export.
"""

from __future__ import annotations

import base64
import math
import os
import stat
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from agent_helpers import Frame, text_reply, to_frame, tool_call, tool_result_text, tools_reply

from omp.client import RpcClient
from omp.subprocess_env import EnvironmentPolicy, child_environment
from omp.testing.fake_llm import open_fake_llm
from omp.tools.grep import run_ripgrep

LIMIT = 60.0
ANTHROPIC_KEY = "sk-ant-SECRET-one"
PROXY_KEY = "sk-proxy-SECRET-two"
URL_PASSWORD = "SECRET-three"
SECRETS = (ANTHROPIC_KEY, PROXY_KEY, URL_PASSWORD)


def write_models_yml(agent_dir: Path, base_url: str) -> None:
    """Provider ``fake`` at the fake LLM, behind credentials in its URL, with its key in
    ``$MY_PROXY_KEY``."""
    scheme, _, rest = base_url.partition("://")
    (agent_dir / "models.yml").write_text(
        "providers:\n"
        "  fake:\n"
        f"    baseUrl: {scheme}://me:{URL_PASSWORD}@{rest}/v1\n"
        "    api: openai-completions\n"
        "    apiKey: MY_PROXY_KEY\n"
        "    models: [{id: fake-model, contextWindow: 128000}]\n")


def session_files(directory: Path) -> list[Path]:
    return list(directory.rglob("*.jsonl"))


def secrets_in(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


async def run_env_everywhere(tmp_path: Path, agent_dir: Path
                             ) -> tuple[list[Frame], str, dict[str, Any], Any]:
    """One prompt whose tool call runs ``env``, then RPC ``bash env``, ``get_state``,
    ``get_available_models`` and an export. Returns every frame, the bash tool's output, the
    RPC bash result and the fake server's first request."""
    script = [tools_reply(tool_call("env", "bash", {"command": "env"})), text_reply("done")]
    frames: list[Frame] = []
    async with open_fake_llm(script) as fake:
        write_models_yml(agent_dir, fake.base_url)
        async with RpcClient.spawn(args=["--mode", "rpc", "--model", "fake/fake-model"],
                                   cwd=tmp_path, max_buffered_events=math.inf) as client:
            async def call(type: str, **fields: Any) -> dict[str, Any]:
                response = to_frame(await client.request({"type": type, **fields}))
                frames.append(response)
                assert response["success"] is True, response
                return response

            await call("prompt", message="show me the environment")
            while not frames or frames[-1]["type"] != "session_settled":
                frames.append(to_frame(await client.events.receive()))
            rpc_bash = (await call("bash", command="env"))["data"]
            await call("get_state")
            await call("get_available_models")
            await call("get_messages")
            await call("get_entries")
            await call("export_html", outputPath="export.html")
            request = fake.requests[0]
    (result,) = [f["message"] for f in frames if f["type"] == "message_end"
                 and f["message"]["role"] == "toolResult"]
    return frames, tool_result_text(result), rpc_bash, request


async def test_no_frame_file_or_export_holds_a_key(tmp_path: Path, isolated_agent_dir: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("MY_PROXY_KEY", PROXY_KEY)
    monkeypatch.setenv("OMP_TEST_PLAIN", "still-visible")
    with trio.fail_after(LIMIT):
        frames, tool_output, rpc_bash, request = await run_env_everywhere(
            tmp_path, isolated_agent_dir)
    # The commands ran with the rest of the environment...
    assert "OMP_TEST_PLAIN=still-visible" in tool_output
    assert "OMP_TEST_PLAIN=still-visible" in rpc_bash["output"]
    # ...but no key reached them, nor any frame, the session file or the export.
    assert secrets_in(tool_output) == []
    assert secrets_in(rpc_bash["output"]) == []
    assert secrets_in(msgspec.json.encode(frames).decode()) == []
    (session_file,) = session_files(isolated_agent_dir)
    assert secrets_in(session_file.read_text()) == []
    export = tmp_path / "export.html"
    assert secrets_in(export.read_text()) == []
    assert stat.S_IMODE(export.stat().st_mode) == 0o600
    # The model listed to hosts has its URL without the credentials...
    state = next(f for f in frames if f.get("command") == "get_state")
    assert state["data"]["model"]["baseUrl"].endswith("/v1")
    assert "@" not in state["data"]["model"]["baseUrl"]
    # ...which still reached the provider, as the Basic authorization they stand for.
    assert request.headers["authorization"] == "Basic " + base64.b64encode(
        f"me:{URL_PASSWORD}".encode()).decode()


async def test_pass_provider_keys_lets_them_through(tmp_path: Path, isolated_agent_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``bash.passProviderKeys: true`` in the global config.yml: commands get the keys."""
    (isolated_agent_dir / "config.yml").write_text("bash:\n  passProviderKeys: true\n")
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("MY_PROXY_KEY", PROXY_KEY)
    with trio.fail_after(LIMIT):
        _, tool_output, rpc_bash, _ = await run_env_everywhere(tmp_path, isolated_agent_dir)
    for output in (tool_output, rpc_bash["output"]):
        assert f"ANTHROPIC_API_KEY={ANTHROPIC_KEY}" in output
        assert f"MY_PROXY_KEY={PROXY_KEY}" in output


async def test_ripgrep_runs_without_the_keys(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """rg's ``--pre`` preprocessor runs with rg's environment: it prints it, and rg searches
    that output, so the lines show what rg was given."""
    monkeypatch.setenv("OMP_TEST_HIDDEN_KEY", "hidden-value")
    monkeypatch.setenv("OMP_TEST_HIDDEN_PROVIDER", "hidden-value")
    monkeypatch.setenv("OMP_TEST_SHOWN", "shown-value")
    policy = EnvironmentPolicy(provider_variables=frozenset({"OMP_TEST_HIDDEN_PROVIDER"}))
    assert "OMP_TEST_HIDDEN_PROVIDER" not in child_environment(policy)
    pre = tmp_path / "pre.sh"
    pre.write_text("#!/bin/sh\nenv\n")
    pre.chmod(0o755)
    (tmp_path / "file.txt").write_text("anything\n")
    lines: list[bytes] = []

    def collect(line: bytes) -> bool:
        lines.append(line)
        return True

    with trio.fail_after(LIMIT):
        await run_ripgrep(["--pre", str(pre), "--no-filename", "OMP_TEST", "file.txt"],
                          cwd=tmp_path, on_line=collect, environment=policy)
    assert sorted(lines) == [b"OMP_TEST_SHOWN=shown-value"]
    assert os.environ["OMP_TEST_HIDDEN_KEY"] == "hidden-value"  # ours is untouched
