"""Model and thinking commands through the real `omp --mode rpc` process, on the offline model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from omp.client import RpcClient, RpcCommandError
from omp.protocol import commands as cmd
from omp.protocol import events, payloads


async def test_offline_model_commands_end_to_end() -> None:
    with trio.fail_after(60):
        async with RpcClient.spawn(stderr=subprocess.DEVNULL) as client:
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert isinstance(state.model, payloads.Model)
            assert (state.model.provider, state.model.id) == ("offline", "echo")
            # No reasoning: "off", the one level it offers, and always there (issue 21: an ACP
            # adapter refuses a state whose level is not among the available ones).
            assert state.thinkingLevel == "off"

            available = await client.call(cmd.GetAvailableModels(), payloads.ModelsPayload)
            assert [m.id for m in available.models] == ["echo", "echo-thinking"]

            levels = await client.call(cmd.GetAvailableThinkingLevels(),
                                       payloads.ThinkingLevelsPayload)
            assert levels.levels == ["off"]
            assert await client.call(cmd.CycleThinkingLevel()) is None

            chosen = await client.call(cmd.SetModel(provider="offline", modelId="echo-thinking"),
                                       payloads.Model)
            assert chosen.reasoning is True
            await client.call(cmd.SetThinkingLevel(level="xhigh"))
            startup = await client.events.receive()
            assert isinstance(startup, events.AvailableCommandsUpdate)
            # set_model announces the change (hosts refresh their model display on it).
            assert await client.events.receive() == events.ModelChanged()
            changed = await client.events.receive()
            assert changed == events.ThinkingLevelChanged(
                thinkingLevel="high", configured="xhigh", resolved="high")
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert state.thinkingLevel == "high"  # clamped to what the model offers
            cycled = await client.call(cmd.CycleThinkingLevel(), payloads.ThinkingLevelPayload)
            assert cycled.level == "off"
            levels = await client.call(cmd.GetAvailableThinkingLevels(),
                                       payloads.ThinkingLevelsPayload)
            assert levels.levels == ["off", "minimal", "low", "medium", "high"]

            with pytest.raises(RpcCommandError) as missing:
                await client.call(cmd.SetModel(provider="offline", modelId="nope"))
            assert missing.value.error == "Model not found: offline/nope"
            with pytest.raises(RpcCommandError) as nokey:
                await client.call(cmd.SetModel(provider="openai", modelId="gpt-5"))
            assert nokey.value.error == "No API key for openai/gpt-5: set OPENAI_API_KEY"
            with pytest.raises(RpcCommandError) as bad:
                await client.call({"type": "set_thinking_level", "level": "extreme"})
            assert bad.value.code == "invalid_params"

            cycle = await client.call(cmd.CycleModel(), payloads.CycleModelResult)
            assert (cycle.model.id, cycle.isScoped) == ("echo", False)
            assert await client.events.receive() == events.ThinkingLevelChanged(
                thinkingLevel="off", configured="off", resolved="off")  # the cycle to off
            assert await client.events.receive() == events.ModelChanged()
        assert client.returncode == 0


async def test_api_keys_never_reach_a_frame(isolated_agent_dir: Path) -> None:
    secret = "sk-ant-test-0123456789-secret"
    (isolated_agent_dir / "models.yml").write_text(
        "providers:\n  corp:\n    baseUrl: http://127.0.0.1:9/v1\n    api: openai-completions\n"
        "    apiKey: CORP_KEY\n    headers: {x-secret: CORP_KEY}\n    models: [{id: m1}]\n")
    env = {"ANTHROPIC_API_KEY": secret, "CORP_KEY": secret + "-corp"}
    proc = await trio.run_process(
        [sys.executable, "-m", "omp", "--mode", "rpc"], env=_with(env),
        stdin=b"\n".join([
            b'{"id":"1","type":"get_state"}', b'{"id":"2","type":"get_available_models"}',
            b'{"id":"3","type":"set_model","provider":"corp","modelId":"m1"}',
            b'{"id":"4","type":"cycle_model"}', b'{"id":"5","type":"get_state"}']) + b"\n",
        capture_stdout=True, capture_stderr=True)
    assert proc.returncode == 0
    assert b'"provider":"anthropic"' in proc.stdout  # the key made Claude available...
    assert b'"id":"m1"' in proc.stdout
    assert secret.encode() not in proc.stdout  # ...but no frame carries it
    assert secret.encode() not in proc.stderr


def _with(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}


ONE_MODEL_PROVIDER = ("providers:\n  corp:\n    baseUrl: http://127.0.0.1:9/v1\n"
                      "    api: openai-completions\n    apiKey: CORP_KEY\n    models: [{id: m1}]\n")


async def test_offline_models_step_aside_for_a_configured_provider(
        isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "models.yml").write_text(ONE_MODEL_PROVIDER)
    env = _with({"CORP_KEY": "sk-corp"})
    with trio.fail_after(60):
        async with RpcClient.spawn(env=env, stderr=subprocess.DEVNULL) as client:
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert isinstance(state.model, payloads.Model)
            assert (state.model.provider, state.model.id) == ("corp", "m1")
            available = await client.call(cmd.GetAvailableModels(), payloads.ModelsPayload)
            assert [(m.provider, m.id) for m in available.models] == [("corp", "m1")]
            # The only real model: nothing to cycle to (it used to switch to offline/echo).
            assert await client.call(cmd.CycleModel()) is None
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert isinstance(state.model, payloads.Model)
            assert (state.model.provider, state.model.id) == ("corp", "m1")
            # Still there when asked for by name, and still not offered.
            chosen = await client.call(cmd.SetModel(provider="offline", modelId="echo"),
                                       payloads.Model)
            assert (chosen.provider, chosen.id) == ("offline", "echo")
            available = await client.call(cmd.GetAvailableModels(), payloads.ModelsPayload)
            assert [(m.provider, m.id) for m in available.models] == [("corp", "m1")]
        assert client.returncode == 0

    # ...and on the command line.
    async with RpcClient.spawn(args=("--mode", "rpc", "--provider", "offline"), env=env,
                               stderr=subprocess.DEVNULL) as client:
        state = await client.call(cmd.GetState(), payloads.SessionState)
        assert isinstance(state.model, payloads.Model)
        assert (state.model.provider, state.model.id) == ("offline", "echo")


async def test_models_yml_with_a_wrong_type_stops_startup(isolated_agent_dir: Path) -> None:
    # `reasoning: "false"` used to be taken as true, silently.
    (isolated_agent_dir / "models.yml").write_text(
        ONE_MODEL_PROVIDER.replace("{id: m1}", "{id: m1, reasoning: 'false'}"))
    proc = await trio.run_process([sys.executable, "-m", "omp", "--mode", "rpc"], stdin=b"",
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr.decode() == (
        f"omp: {isolated_agent_dir}/models.yml: $.providers.corp.models[0].reasoning: expected "
        "true or false (got 'false')\n")


async def test_bad_models_yml_stops_startup_before_ready(isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "models.yml").write_text("providers:\n  p:\n    models: [{}]\n")
    proc = await trio.run_process([sys.executable, "-m", "omp", "--mode", "rpc"], stdin=b"",
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert proc.returncode == 1
    assert proc.stdout == b""  # no ready: the runtime never accepted commands
    assert proc.stderr.decode().strip() == (
        f"omp: {isolated_agent_dir}/models.yml: $.providers.p.models[0].id: required field "
        "missing")


async def test_unknown_model_on_the_command_line() -> None:
    proc = await trio.run_process(
        [sys.executable, "-m", "omp", "--mode", "rpc", "--model", "offline/nope"], stdin=b"",
        capture_stdout=True, capture_stderr=True, check=False)
    assert (proc.returncode, proc.stdout) == (1, b"")
    assert proc.stderr == b"omp: Model not found: offline/nope\n"


async def test_offline_default_is_announced_once_on_stderr() -> None:
    proc = await trio.run_process([sys.executable, "-m", "omp", "--mode", "rpc"], stdin=b"",
                                  capture_stdout=True, capture_stderr=True)
    assert proc.stderr.decode().count("using the offline model offline/echo") == 1
    started = await trio.run_process(
        [sys.executable, "-m", "omp", "--mode", "rpc", "--model", "offline/echo"], stdin=b"",
        capture_stdout=True, capture_stderr=True)
    assert started.stderr == b""  # chosen explicitly: nothing to announce
