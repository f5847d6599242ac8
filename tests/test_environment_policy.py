"""One environment policy for every subprocess (issue 28, item 2): ``omp.subprocess_env`` step by
step, the ``shellEnvironmentPolicy`` section of ``config.yml``, and the real ``omp --mode rpc``
with the usual secrets in its environment: none reaches a command, a frame, the session file or
the export, and neither a command (``/proc/$PPID/environ``) nor a file tool (``/proc/self/...``)
can read the server's own environment.
"""

from __future__ import annotations

import ast
import math
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
from agent_helpers import (
    Frame,
    fake_provider,
    of_type,
    text_reply,
    to_frame,
    tool_call,
    tool_result_text,
    tools_reply,
)

from omp.client import RpcClient
from omp.config import ConfigError
from omp.files import OwnProcessFile, read_regular
from omp.session.settings import ShellEnvironmentSettings, load_settings
from omp.subprocess_env import CORE_VARIABLES, EnvironmentPolicy, child_environment
from omp.tools.base import ToolContext, ToolError
from omp.tools.edit import EditTool
from omp.tools.shell import run_shell
from omp.tools.write import WriteTool

LIMIT = 60.0

SECRETS = {
    "GITHUB_TOKEN": "ghp_SECRET_github",
    "AWS_SECRET_ACCESS_KEY": "SECRET_aws",
    "NPM_TOKEN": "npm_SECRET_token",
    "HF_TOKEN": "hf_SECRET_token",
    "PGPASSWORD": "SECRET_pg",
    "GOOGLE_APPLICATION_CREDENTIALS": "/SECRET/creds.json",
    "my_lower_api_key": "SECRET_lower",
}
PROVIDER_KEY = "sk-ant-SECRET-provider"
ENVIRON = {**SECRETS, "PATH": "/usr/bin:/bin", "HOME": "/home/u", "LANG": "C.UTF-8",
           "ANTHROPIC_API_KEY": PROVIDER_KEY, "MY_LLM": "SECRET_llm"}
PROVIDERS = frozenset({"ANTHROPIC_API_KEY", "MY_LLM"})


def env(**fields: Any) -> dict[str, str]:
    return child_environment(EnvironmentPolicy(provider_variables=PROVIDERS, **fields),
                             environ=ENVIRON)


# --- the steps ----------------------------------------------------------------------------------


def test_the_default_leaves_out_secrets_and_provider_keys() -> None:
    assert env() == {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "LANG": "C.UTF-8"}


def test_inherit_core_and_none() -> None:
    assert env(inherit="core") == {"PATH": "/usr/bin:/bin", "HOME": "/home/u"}
    assert {"PATH", "HOME", "USER", "SHELL", "TMPDIR"} <= CORE_VARIABLES
    assert env(inherit="none") == {}


def test_ignoring_the_default_excludes_keeps_the_provider_keys_out() -> None:
    got = env(ignore_default_excludes=True)
    assert {**got} == {k: v for k, v in ENVIRON.items() if k not in PROVIDERS}


def test_pass_provider_keys_exempts_them_from_the_default_excludes_only() -> None:
    got = env(pass_provider_keys=True)
    assert got["ANTHROPIC_API_KEY"] == PROVIDER_KEY
    assert got["MY_LLM"] == "SECRET_llm"
    assert "GITHUB_TOKEN" not in got
    assert "ANTHROPIC_API_KEY" not in env(pass_provider_keys=True, exclude=("anthropic_*",))


def test_exclude_patterns_are_wildcards_in_any_case() -> None:
    assert env(exclude=("l?ng", "HO*")) == {"PATH": "/usr/bin:/bin"}


def test_set_comes_after_the_excludes_and_include_only_after_set() -> None:
    got = env(set=(("GITHUB_TOKEN", "mine"), ("CI", "1")), include_only=("PATH", "c*", "GIT*"))
    assert got == {"PATH": "/usr/bin:/bin", "CI": "1", "GITHUB_TOKEN": "mine"}


def test_overrides_come_last() -> None:
    policy = EnvironmentPolicy(inherit="none", include_only=("PATH",))
    assert child_environment(policy, {"PWD": "/x"}, environ=ENVIRON) == {"PWD": "/x"}


async def test_a_shell_command_sees_the_policy(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("OMP_TEST_VISIBLE", "yes")
    with trio.fail_after(LIMIT):
        result = await run_shell("env", cwd=tmp_path)
        core = await run_shell("env", cwd=tmp_path, environment=EnvironmentPolicy(
            inherit="core", set=(("CI", "1"),)))
    assert "OMP_TEST_VISIBLE=yes" in result.output
    assert [s for s in SECRETS.values() if s in result.output] == []
    names = {line.partition("=")[0] for line in core.output.splitlines()}
    # bash adds a few of its own (SHLVL, _, PWD we set): nothing else of ours
    assert names - {"SHLVL", "_", "PWD"} <= CORE_VARIABLES | {"CI"}
    assert "CI=1" in core.output.splitlines()


# --- the server's own /proc files ----------------------------------------------------------------


def test_every_name_of_our_own_proc_files_is_refused(tmp_path: Path) -> None:
    ready, done = threading.Event(), threading.Event()
    tids: list[int] = []

    def worker() -> None:
        tids.append(threading.get_native_id())
        ready.set()
        done.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    ready.wait(10)
    (tmp_path / "link").symlink_to("/proc/self")
    names = ["/proc/self/environ", f"/proc/{os.getpid()}/environ", "/proc/thread-self/environ",
             f"/proc/{tids[0]}/environ", str(tmp_path / "link" / "environ"),
             f"/proc/self/task/{tids[0]}/environ", "/proc/self/mem"]
    try:
        for name in names:
            with pytest.raises(OwnProcessFile, match="a file of this server's own process"):
                read_regular(name, 1 << 20)
    finally:
        done.set()
        thread.join()
    assert read_regular("/proc/1/status", 1 << 20)  # another process's: not ours to refuse


async def test_write_and_edit_refuse_our_own_proc_files(tmp_path: Path) -> None:
    ctx = ToolContext(cwd=tmp_path)
    comm = read_around_the_gate("comm")
    with pytest.raises(ToolError, match="a file of this server's own process"):
        await WriteTool(ctx).execute("w", {"path": "/proc/self/comm", "content": "renamed"},
                                     on_update=_ignore)
    with pytest.raises(ToolError, match="a file of this server's own process"):
        await EditTool(ctx).execute("e", {"path": "/proc/self/oom_score_adj", "edits": [
            {"oldText": "0", "newText": "1000"}]}, on_update=_ignore)
    assert read_around_the_gate("comm") == comm  # not renamed


async def _ignore(_: object) -> None:
    pass


def read_around_the_gate(name: str) -> bytes:
    """``/proc/self/<name>`` read without ``omp.files`` (to check what the tools left as it
    was)."""
    with open(f"/proc/self/{name}", "rb") as file:
        return file.read()


# --- config.yml ---------------------------------------------------------------------------------


def test_the_section_from_the_global_file(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text(
        "shellEnvironmentPolicy:\n  inherit: core\n  ignoreDefaultExcludes: true\n"
        "  exclude: ['AWS_*']\n  includeOnly: [PATH]\n  set: {CI: '1'}\n")
    settings = load_settings(tmp_path)
    assert settings.environment == ShellEnvironmentSettings(
        inherit="core", ignoreDefaultExcludes=True, exclude=["AWS_*"], includeOnly=["PATH"],
        set={"CI": "1"})
    policy = settings.environment_policy(frozenset({"X_KEY"}))
    assert policy == EnvironmentPolicy(inherit="core", ignore_default_excludes=True,
                                       exclude=("AWS_*",), include_only=("PATH",),
                                       set=(("CI", "1"),), provider_variables=frozenset({"X_KEY"}))


def test_a_project_cannot_loosen_the_policy(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    agent, project = tmp_path / "agent", tmp_path / "project"  # agent: made by conftest
    (project / ".omp").mkdir(parents=True)
    (project / ".omp" / "config.yml").write_text(
        "shellEnvironmentPolicy:\n  ignoreDefaultExcludes: true\n  set: {BASH_ENV: ./evil}\n")
    settings = load_settings(agent, project)
    assert settings.environment == ShellEnvironmentSettings()
    err = capsys.readouterr().err
    assert "$.shellEnvironmentPolicy.ignoreDefaultExcludes: ignored" in err
    assert "$.shellEnvironmentPolicy.set: ignored" in err


@pytest.mark.parametrize(("text", "message"), [
    ("inherit: some", "$.shellEnvironmentPolicy.inherit: must be one of 'all', 'core', 'none'"),
    ("exclude: AWS_*", "$.shellEnvironmentPolicy.exclude: expected a list"),
    ("exclude: ['']", "$.shellEnvironmentPolicy.exclude[0]: must be a non-empty name pattern"),
    ("set: {'A=B': x}", "$.shellEnvironmentPolicy.set.A=B: a variable name must be non-empty"),
    ("set: {A: 1}", "expected a string (got 1)"),
    ("colour: red", "unknown key"),
])
def test_mistakes_are_named(tmp_path: Path, text: str, message: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.yml").write_text(f"shellEnvironmentPolicy:\n  {text}\n")
    if message == "unknown key":  # an unknown key of a modelled section: a warning, not fatal
        load_settings(tmp_path)
        assert "$.shellEnvironmentPolicy: unknown key(s) ignored: colour" in capsys.readouterr().err
        return
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert message in str(caught.value)


# --- the real process -----------------------------------------------------------------------------


def texts_of(paths: list[Path], sessions: Path) -> list[str]:
    """The texts of ``paths`` and of every session file under ``sessions``."""
    return [p.read_text() for p in [*paths, *sessions.rglob("*.jsonl")]]


def server_command(*args: str) -> list[str]:
    """``omp *args`` as a process without capabilities. As root (as in many containers)
    ``CAP_SYS_PTRACE`` and its kin read any process's memory, dumpable or not; an ordinary user
    never has them, and root without them is what such a user is to its own processes."""
    argv = [sys.executable, "-P", "-m", "omp", *args]
    if os.geteuid() != 0:
        return argv
    assert shutil.which("setpriv"), "setpriv (util-linux) is needed to test as root"
    return ["setpriv", "--bounding-set=-all", "--inh-caps=-all", *argv]


async def test_no_secret_reaches_a_command_a_frame_a_file_or_the_export(
        tmp_path: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", PROVIDER_KEY)
    monkeypatch.setenv("OMP_TEST_VISIBLE", "still-here")
    (tmp_path / "link").symlink_to("/proc/self/environ")
    cat_parent = "cat /proc/$PPID/environ"  # its parent: the server
    script = [tools_reply(
        tool_call("env", "bash", {"command": "env"}),
        tool_call("proc", "bash", {"command": cat_parent}),
        tool_call("self", "read", {"path": "/proc/self/environ"}),
        tool_call("thread", "read", {"path": "/proc/thread-self/environ"}),
        tool_call("link", "read", {"path": "link"}),
        tool_call("grep", "grep", {"pattern": "SECRET", "path": "/proc/self/environ"})),
        text_reply("done")]
    frames: list[Frame] = []
    async with fake_provider(script, isolated_agent_dir):
        with trio.fail_after(LIMIT):
            async with RpcClient.spawn(
                    command=server_command("--mode", "rpc", "--model", "fake/fake-model"),
                    cwd=tmp_path, max_buffered_events=math.inf) as client:
                async def call(type: str, **fields: Any) -> dict[str, Any]:
                    response = to_frame(await client.request({"type": type, **fields}))
                    frames.append(response)
                    assert response["success"] is True, response
                    data: dict[str, Any] = response.get("data") or {}
                    return data

                await call("prompt", message="look around")
                while not frames or frames[-1]["type"] != "session_settled":
                    frames.append(to_frame(await client.events.receive()))
                rpc_env = (await call("bash", command="env"))["output"]
                rpc_proc = await call("bash", command=cat_parent)
                await call("export_html", outputPath="export.html")
    results = {f["message"]["toolCallId"]: f["message"] for f in of_type(frames, "message_end")
               if f["message"]["role"] == "toolResult"}
    text = {call_id: tool_result_text(message) for call_id, message in results.items()}
    assert "OMP_TEST_VISIBLE=still-here" in text["env"]
    assert "OMP_TEST_VISIBLE=still-here" in rpc_env
    for call_id in ("self", "thread", "link", "grep"):
        assert results[call_id]["isError"] is True, text[call_id]
        assert "a file of this server's own process" in text[call_id]
    assert results["proc"]["isError"] is True, text["proc"]
    assert "Permission denied" in text["proc"]
    assert rpc_proc["exitCode"] != 0
    assert "Permission denied" in rpc_proc["output"]
    everything = [msgspec.json.encode(frames).decode(),
                  *texts_of([tmp_path / "export.html"], isolated_agent_dir)]
    assert len(everything) == 3  # the frames, the export, the one session file
    for secret in (*SECRETS.values(), PROVIDER_KEY):
        assert [i for i, t in enumerate(everything) if secret in t] == [], secret


async def test_the_configured_policy_reaches_rpc_bash(
        tmp_path: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_TEST_DROPPED", "x")
    (isolated_agent_dir / "config.yml").write_text(
        "shellEnvironmentPolicy:\n  inherit: core\n  set: {OMP_TEST_SET: from-config}\n")
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn(args=["--mode", "rpc"], cwd=tmp_path) as client:
            response = to_frame(await client.request({"type": "bash", "command": "env"}))
    output = response["data"]["output"]
    assert "OMP_TEST_SET=from-config" in output.splitlines()
    assert "OMP_TEST_DROPPED" not in output
    assert "OMP_AGENT_DIR" not in output  # not a core variable


def test_web_search_keys_join_the_provider_variables_when_web_is_on(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    from omp.session.setup import create_session

    def variables() -> frozenset[str]:
        session = create_session(agent_directory=isolated_agent_dir, cwd=tmp_path,
                                 persist=False, announce_offline=False)
        return session.tool_context.environment.provider_variables

    assert "ANTHROPIC_API_KEY" in variables()
    assert "TAVILY_API_KEY" not in variables()
    (isolated_agent_dir / "config.yml").write_text("web: {enabled: true}\n")
    assert {"ANTHROPIC_API_KEY", "TAVILY_API_KEY", "BRAVE_API_KEY"} <= variables()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root (CAP_SYS_PTRACE) reads a process that "
                    "is not dumpable; everyone else is refused (the test above)")
async def test_as_root_the_servers_environ_holds_no_key(
        tmp_path: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Root reads ``/proc/<server>/environ`` whatever the server's dumpable setting: the keys
    are gone from that block (overwritten once read), and still reach the provider."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", PROVIDER_KEY)
    monkeypatch.setenv("MY_LLM", "SECRET_llm")  # a models.yml key variable: no pattern names it
    monkeypatch.setenv("OMP_TEST_VISIBLE", "still-here")
    cat_parent = "cat /proc/$PPID/environ | tr '\\0' '\\n'"
    script = [tools_reply(tool_call("proc", "bash", {"command": cat_parent})), text_reply("done")]
    frames: list[Frame] = []
    async with fake_provider(script, isolated_agent_dir) as fake:
        # Provider ``fake`` with its key in $MY_LLM.
        models = isolated_agent_dir / "models.yml"
        models.write_text(models.read_text().replace("auth: none", "apiKey: MY_LLM"))
        with trio.fail_after(LIMIT):
            async with RpcClient.spawn(args=["--mode", "rpc", "--model", "fake/fake-model"],
                                       cwd=tmp_path, max_buffered_events=math.inf) as client:
                response = to_frame(await client.request({"type": "prompt", "message": "look"}))
                assert response["success"] is True, response
                while not frames or frames[-1]["type"] != "session_settled":
                    frames.append(to_frame(await client.events.receive()))
                rpc_proc = to_frame(await client.request(
                    {"type": "bash", "command": cat_parent}))["data"]
                pid = client.pid
                assert pid is not None
                # And read by the test itself.
                environ = (await trio.Path(f"/proc/{pid}/environ").read_bytes()).decode()
        request = fake.requests[0]
    (result,) = [f["message"] for f in of_type(frames, "message_end")
                 if f["message"]["role"] == "toolResult"]
    seen = {"bash tool": tool_result_text(result), "rpc bash": rpc_proc["output"],
            "/proc/<pid>/environ": environ}
    for where, text in seen.items():
        assert "OMP_TEST_VISIBLE=still-here" in text, where  # the block is still read whole
        leaked = [s for s in (*SECRETS.values(), PROVIDER_KEY, "SECRET_llm") if s in text]
        assert leaked == [], where
        assert "ANTHROPIC_API_KEY" not in text, where
        assert "MY_LLM" not in text, where
    assert result["isError"] is False
    # The key still reached the provider.
    assert request.headers["authorization"] == "Bearer SECRET_llm"


HIDE = r"""
import ctypes, os, subprocess, sys
from omp.process import hide_environment_block
from omp.subprocess_env import EnvironmentPolicy

hidden = hide_environment_block(EnvironmentPolicy(provider_variables={"MY_LLM"}).is_secret)
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
child = subprocess.run(["sh", "-c", "echo $MY_LLM $GITHUB_TOKEN $OMP_TEST_VISIBLE"],
                       capture_output=True, text=True).stdout.split()
with open("/proc/self/environ", "rb") as f:
    block = f.read()
print(repr((hidden, block, os.environ["MY_LLM"], libc.getenv(b"GITHUB_TOKEN"), child)))
"""


def test_hiding_the_environment_block_keeps_every_copy_that_is_read() -> None:
    """Only the block ``/proc/<pid>/environ`` shows loses the secrets: ``os.environ``,
    libc's ``getenv`` and a child started without ``env=`` still have them."""
    env = {"PATH": os.environ["PATH"], "GITHUB_TOKEN": "ghp_SECRET", "MY_LLM": "SECRET_llm",
           "OMP_TEST_VISIBLE": "still-here", "LANG": "C.UTF-8"}
    done = subprocess.run([sys.executable, "-c", HIDE], env=env, capture_output=True,
                          text=True, timeout=60, check=True, cwd=Path(__file__).parents[1])
    hidden, block, environ, getenv, child = ast.literal_eval(done.stdout)
    assert hidden == 2
    entries = [e for e in block.split(b"\0") if e]
    assert entries == [b"PATH=" + os.environ["PATH"].encode(), b"OMP_TEST_VISIBLE=still-here",
                       b"LANG=C.UTF-8"]
    assert b"SECRET" not in block
    assert environ == "SECRET_llm"
    assert getenv == b"ghp_SECRET"
    assert child == ["SECRET_llm", "ghp_SECRET", "still-here"]


@pytest.mark.skipif(os.geteuid() != 0, reason="only root reads a process that is not dumpable")
async def test_as_root_omp_acp_environ_holds_no_key(tmp_path: Path, isolated_agent_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", PROVIDER_KEY)
    monkeypatch.setenv("OMP_TEST_VISIBLE", "still-here")
    with trio.fail_after(LIMIT):
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "omp", "acp", "--model", "offline/echo"], cwd=tmp_path,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            await proc.stdin.send_all(b'{"jsonrpc":"2.0","id":1,"method":"initialize",'
                                      b'"params":{"protocolVersion":1}}\n')
            answer = b""
            while b"\n" not in answer:  # answered: past the start
                answer += await proc.stdout.receive_some(65536)
            environ = await trio.Path(f"/proc/{proc.pid}/environ").read_bytes()
        finally:
            await proc.stdin.aclose()
            await proc.wait()
    assert b'"protocolVersion":1' in answer
    assert b"OMP_TEST_VISIBLE=still-here" in environ
    assert [s for s in (*SECRETS.values(), PROVIDER_KEY) if s.encode() in environ] == []
