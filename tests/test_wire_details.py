"""The wire details third-party hosts read (issue 21): ``get_state`` before the first call, a
chosen model whose provider has no credential yet, built-in slash commands that are not
here, ``read`` of an unserved URL, through the real ``omp --mode rpc``."""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
import trio
from agent_helpers import text_reply
from extension_helpers import open_process_host
from login_helpers import call, login_response, providers_of, start_login

from omp.testing.fake_llm import open_fake_llm

LIMIT = 60


def write_keyed(agent_dir: Path, base_url: str, variable: str) -> None:
    """models.yml: provider ``fake`` whose ``apiKey`` names ``variable`` (left unset)."""
    config = {"providers": {"fake": {
        "baseUrl": f"{base_url}/v1", "api": "openai-completions", "apiKey": variable,
        "models": [{"id": "fake-model", "contextWindow": 128000}]}}}
    (agent_dir / "models.yml").write_bytes(msgspec.json.encode(config))


async def test_get_state_before_the_first_call(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with open_process_host(tmp_path) as host:  # the offline model: no reasoning
            state = (await call(host, "get_state"))["data"]
            levels = (await call(host, "get_available_thinking_levels"))["data"]["levels"]
    assert state["thinkingLevel"] == "off"
    assert state["thinkingLevel"] in levels
    usage = state["contextUsage"]
    # The system prompt and the eight tools' definitions, estimated: thousands of tokens,
    # not the handful an empty message list gives.
    assert usage["tokens"] > 2000
    assert usage["contextWindow"] == 128000
    assert usage["percent"] == round(usage["tokens"] / 128000 * 100, usage_digits(usage))


def usage_digits(usage: dict[str, float]) -> int:
    text = repr(usage["percent"])
    return len(text.partition(".")[2])


async def test_a_model_without_credentials_starts_and_works_after_login(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    key = "sk-LATE-LOGIN-SECRET"
    async with open_fake_llm([text_reply("after login")]) as fake:
        write_keyed(isolated_agent_dir, fake.base_url, "FAKE_TEST_KEY")
        with trio.fail_after(LIMIT):
            async with open_process_host(
                    tmp_path, args=["--mode", "rpc", "--model", "fake/fake-model"],
                    env={"FAKE_TEST_KEY": None}) as host:
                state = (await call(host, "get_state"))["data"]
                before = providers_of(await call(host, "get_login_providers"))
                refused = await call(host, "prompt", message="hello")
                await start_login(host, "fake")
                prompt = await host.ui_request("input")
                await host.answer(prompt, value=key)
                logged_in = await login_response(host)
                accepted = await call(host, "prompt", message="hello")
                frames = await host.until(lambda f: f["type"] == "agent_end")
        assert len(fake.requests) == 1
        assert fake.requests[0].headers.get("authorization") == f"Bearer {key}"
    assert state["model"]["id"] == "fake-model"
    assert before["fake"]["authenticated"] is False
    assert refused["success"] is False
    assert refused["error"] == "No API key for fake/fake-model: set FAKE_TEST_KEY"
    assert logged_in["success"] is True
    assert accepted["success"] is True
    end = [f for f in frames if f["type"] == "message_end"][-1]["message"]
    assert end["content"] == [{"type": "text", "text": "after login"}]


async def test_an_unset_api_key_variable_is_named(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    write_keyed(isolated_agent_dir, "http://127.0.0.1:9", "FAKE_TEST_KEY")
    with trio.fail_after(LIMIT):
        result = await trio.run_process(
            [sys.executable, "-m", "omp", "--no-session", "-p", "hi"], stdin=b"",
            capture_stdout=True, capture_stderr=True, cwd=tmp_path, check=False)
    assert result.returncode == 0
    assert result.stderr.decode() == (
        "omp: models.yml provider fake: its apiKey names FAKE_TEST_KEY, which is not set; "
        "using the offline model offline/echo\n")


async def test_one_shot_still_refuses_a_model_without_credentials(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    write_keyed(isolated_agent_dir, "http://127.0.0.1:9", "FAKE_TEST_KEY")
    with trio.fail_after(LIMIT):
        result = await trio.run_process(
            [sys.executable, "-m", "omp", "--model", "fake/fake-model", "-p", "hi"], stdin=b"",
            capture_stdout=True, capture_stderr=True, cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert result.stderr == b"omp: No API key for fake/fake-model: set FAKE_TEST_KEY\n"


async def test_read_of_an_unserved_url_is_an_error_not_a_local_file(tmp_path: Path) -> None:
    (tmp_path / "zz:").mkdir()
    (tmp_path / "zz:" / "x").write_text("a local file that looks like the URL\n")
    command = msgspec.json.encode({"path": "zz://x"}).decode()
    with trio.fail_after(LIMIT):
        result = await trio.run_process(
            [sys.executable, "-m", "omp", "--model", "offline/echo", "--no-session", "--mode",
             "json", f"[[tool read {command}]]"], stdin=b"", capture_stdout=True,
            capture_stderr=True, cwd=tmp_path, check=False)
    frames = [msgspec.json.decode(line) for line in result.stdout.splitlines()]
    end = next(f for f in frames if f["type"] == "tool_execution_end")
    assert end["isError"] is True
    assert end["result"]["content"][0]["text"] == (
        "Cannot read zz://x: no host serves zz:// URLs; read a file path.")
