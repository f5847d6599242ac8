"""Thinking levels, ``max`` included: clamping and cycling (pure), and the same through the real
``omp --mode rpc`` process (``set_thinking_level``, ``cycle_thinking_level``, ``--thinking``)."""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from omp.cli import build_parser
from omp.client import RpcClient, RpcCommandError
from omp.llm import thinking
from omp.llm.types import THINKING_LEVELS, ThinkingLevel
from omp.protocol import commands as cmd
from omp.protocol import events, payloads
from omp.protocol.codec import decode_line
from omp.protocol.payloads import Model, ModelCost, ModelThinking

LIMIT = 60
ALL: list[ThinkingLevel] = ["off", "minimal", "low", "medium", "high", "xhigh", "max"]


def model(api: str = "openai-responses", efforts: Sequence[str] | None = None, *,
          reasoning: bool = True, model_id: str = "m") -> Model:
    extra: dict[str, Any] = {}
    if efforts is not None:
        extra["thinking"] = ModelThinking(mode="effort", efforts=list(efforts))
    return Model(id=model_id, name=model_id, api=api, provider="p", baseUrl="",
                 reasoning=reasoning, input=["text"],
                 cost=ModelCost(input=0, output=0, cacheRead=0, cacheWrite=0),
                 contextWindow=200_000, maxTokens=64_000, **extra)


# --- pure ---------------------------------------------------------------------------------------


def test_levels_rank_from_off_to_max() -> None:
    assert list(THINKING_LEVELS) == ALL
    assert decode_line(b'{"type":"set_thinking_level","level":"max"}') == \
        cmd.SetThinkingLevel(level="max")


@pytest.mark.parametrize(("efforts", "api", "asked", "effective"), [
    (None, "openai-responses", "max", "high"),           # default ladder tops out at high
    (None, "openai-responses", "xhigh", "high"),
    (None, "anthropic-messages", "max", "xhigh"),        # anthropic's ladder adds xhigh
    (["low", "high", "max"], "openai-responses", "max", "max"),
    (["low", "high", "max"], "openai-responses", "xhigh", "high"),
    (["low", "high", "max"], "openai-responses", "medium", "low"),
    (["low", "high", "max"], "openai-responses", "minimal", "low"),  # below all: the lowest
    (["low", "high", "max"], "openai-responses", "off", "off"),
    (ALL[1:], "openai-responses", "max", "max"),
])
def test_clamp(efforts: list[str] | None, api: str, asked: ThinkingLevel,
               effective: ThinkingLevel) -> None:
    assert thinking.clamp(model(api, efforts), asked) == effective


def test_clamp_on_a_model_without_reasoning_is_off() -> None:
    plain = model(reasoning=False)
    assert thinking.clamp(plain, "max") == "off"
    assert thinking.cycle(plain, "max") is None


def walk(m: Model, start: ThinkingLevel, steps: int) -> list[ThinkingLevel]:
    out: list[ThinkingLevel] = []
    level: ThinkingLevel | None = start
    for _ in range(steps):
        assert level is not None
        level = thinking.cycle(m, level)
        assert level is not None
        out.append(level)
    return out


def test_cycle_walks_the_offered_levels_in_rank_order() -> None:
    assert walk(model(efforts=ALL[1:]), "off", 8) == [*ALL[1:], "off", "minimal"]
    assert walk(model("anthropic-messages"), "high", 3) == ["xhigh", "off", "minimal"]
    assert walk(model(), "high", 2) == ["off", "minimal"]
    assert walk(model(efforts=["max", "low"]), "off", 3) == ["low", "max", "off"]
    # from a configured level the model does not offer: the next after its clamped value
    assert walk(model(efforts=["low", "high"]), "max", 1) == ["off"]
    assert walk(model(efforts=["low", "high"]), "medium", 1) == ["high"]


def test_max_reaches_the_providers() -> None:
    gpt = model(efforts=ALL[1:])
    assert thinking.openai_effort(gpt, "max") == "max"
    assert thinking.openai_effort(model(), "max") == "high"
    claude = model("anthropic-messages", ALL[1:])
    assert thinking.anthropic_thinking(claude, "max", 8000) == (
        {"type": "enabled", "budget_tokens": 32768}, 40768)
    flash = model("google-generative-ai", ALL[1:], model_id="gemini-2.5-flash")
    assert thinking.google_thinking_config(flash, "max") == {"thinkingBudget": 32768,
                                                             "includeThoughts": True}
    gemini3 = msgspec.structs.replace(flash, id="gemini-3-pro-preview")
    assert thinking.google_thinking_config(gemini3, "max") == {"thinkingLevel": "HIGH",
                                                               "includeThoughts": True}


def test_command_line_accepts_max() -> None:
    assert build_parser().parse_args(["--thinking", "max"]).thinking == "max"


# --- through the real process ---------------------------------------------------------------------


def spawn(tmp_path: Path, *args: str) -> Any:
    return RpcClient.spawn(args=("--mode", "rpc", *args), cwd=tmp_path, env=dict(os.environ),
                           close_timeout=30, max_buffered_events=math.inf,
                           stderr=subprocess.DEVNULL)


async def level_changes(client: RpcClient) -> list[events.ThinkingLevelChanged]:
    out: list[events.ThinkingLevelChanged] = []
    while True:
        try:
            event = client.events.receive_nowait()
        except trio.WouldBlock:
            return out
        if isinstance(event, events.ThinkingLevelChanged):
            out.append(event)


async def test_set_thinking_level_max_is_clamped_by_the_process(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--model", "offline/echo-thinking") as client:
            await client.call(cmd.SetThinkingLevel(level="max"))
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert state.thinkingLevel == "high"  # echo-thinking offers minimal..high
            assert await level_changes(client) == [events.ThinkingLevelChanged(
                thinkingLevel="high", configured="max", resolved="high")]
            cycled = await client.call(cmd.CycleThinkingLevel(), payloads.ThinkingLevelPayload)
            assert cycled.level == "off"
            with pytest.raises(RpcCommandError) as bad:
                await client.call({"type": "set_thinking_level", "level": "maximum"})
            assert bad.value.code == "invalid_params"
        assert client.returncode == 0


MODELS_YML = """\
providers:
  corp:
    baseUrl: http://127.0.0.1:9/v1
    api: openai-responses
    apiKey: sk-test-thinking
    models:
      - id: deep
        reasoning: true
        thinking: {mode: effort, efforts: [minimal, low, medium, high, xhigh, max]}
      - id: shallow
        reasoning: true
        thinking: {mode: effort, efforts: [low, high]}
"""


async def test_cycle_and_max_on_a_model_that_offers_them(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "models.yml").write_text(MODELS_YML)
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--model", "corp/deep", "--thinking", "high") as client:
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert state.thinkingLevel == "high"
            levels = await client.call(cmd.GetAvailableThinkingLevels(),
                                       payloads.ThinkingLevelsPayload)
            assert levels.levels == ALL
            walked = []
            for _ in range(4):
                cycled = await client.call(cmd.CycleThinkingLevel(),
                                           payloads.ThinkingLevelPayload)
                walked.append(cycled.level)
            assert walked == ["xhigh", "max", "off", "minimal"]
            await client.call(cmd.SetThinkingLevel(level="max"))
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert state.thinkingLevel == "max"
            # another model re-clamps the configured max to what it offers
            await client.call(cmd.SetModel(provider="corp", modelId="shallow"))
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert state.thinkingLevel == "high"
        assert client.returncode == 0


async def test_thinking_max_on_the_command_line(tmp_path: Path, isolated_agent_dir: Path
                                                ) -> None:
    (isolated_agent_dir / "models.yml").write_text(MODELS_YML)
    with trio.fail_after(LIMIT):
        async with spawn(tmp_path, "--model", "corp/deep", "--thinking", "max") as client:
            state = await client.call(cmd.GetState(), payloads.SessionState)
            assert state.thinkingLevel == "max"
        assert client.returncode == 0
