"""Settings: the original's config.yml (global) and .omp/ files (project), the old settings.yml
fallback, trusted projects, and every kind of mistake named exactly."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import of_type, open_agent, text_reply

from omp.client import RpcClient
from omp.commands import SkillSettings
from omp.config import ConfigError
from omp.protocol import commands as cmd
from omp.protocol import payloads
from omp.session.settings import (
    BashSettings,
    CompactionSettings,
    RetrySettings,
    Settings,
    load_settings,
)
from omp.subprocess_env import child_environment

TEST_TIMEOUT = 60


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_are_omps() -> None:
    settings = Settings()
    assert settings.compaction == CompactionSettings(
        enabled=True, reserveTokens=None, keepRecentTokens=20000, thresholdPercent=-1.0,
        thresholdTokens=-1, autoContinue=True, midTurnEnabled=True)
    assert settings.retry == RetrySettings(enabled=True, maxRetries=10, baseDelayMs=500,
                                           maxDelayMs=300_000)
    assert settings.trusted_projects == ()


def test_missing_file_means_defaults(tmp_path: Path) -> None:
    assert load_settings(tmp_path, tmp_path) == Settings()


def test_agent_dir_is_the_default_directory(isolated_agent_dir: Path) -> None:
    write(isolated_agent_dir, "config.yml", "retry:\n  maxRetries: 2\n")
    assert load_settings().retry.maxRetries == 2


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "retry:\ncompaction:\n"])
def test_empty_file_or_sections_mean_defaults(tmp_path: Path, text: str) -> None:
    write(tmp_path, "config.yml", text)
    assert load_settings(tmp_path) == Settings()


def test_every_key_we_model(tmp_path: Path) -> None:
    write(tmp_path, "config.yml", """\
compaction:
  enabled: false
  reserveTokens: 8000
  keepRecentTokens: 12000
  thresholdPercent: 80
  thresholdTokens: 90000
  autoContinue: false
  midTurnEnabled: false
retry:
  enabled: false
  maxRetries: 3
  baseDelayMs: 2000
  maxDelayMs: 60000
""")
    assert load_settings(tmp_path) == Settings(
        compaction=CompactionSettings(enabled=False, reserveTokens=8000, keepRecentTokens=12000,
                                      thresholdPercent=80.0, thresholdTokens=90000,
                                      autoContinue=False, midTurnEnabled=False),
        retry=RetrySettings(enabled=False, maxRetries=3, baseDelayMs=2000, maxDelayMs=60000))


def test_the_skills_section(tmp_path: Path) -> None:
    write(tmp_path, "config.yml", """\
skills:
  enableSkillCommands: false
  enableClaudeUser: true
  customDirectories: [~/skills]
  ignoredSkills: ["draft-*"]
""")
    project = tmp_path / "project"
    write(project / ".omp", "config.yml", "skills:\n  includeSkills: [pdf]\n")
    assert load_settings(tmp_path, project).skills == SkillSettings(
        enableSkillCommands=False, enableClaudeUser=True, customDirectories=["~/skills"],
        ignoredSkills=["draft-*"], includeSkills=["pdf"])


# A user's file of the original omp: many sections we do not model, and keys of ours beside
# keys of the original we do not use.
ORIGINAL_CONFIG = """\
lastChangelogVersion: 14.2.0
modelRoles:
  default: anthropic/claude-sonnet-4-5
  smol: anthropic/claude-haiku-4-5
defaultThinkingLevel: high
theme:
  dark: titanium
  light: light
steeringMode: one-at-a-time
task:
  isolation:
    enabled: false
  maxConcurrency: 4
bash:
  autoBackground:
    enabled: true
    thresholdMs: 60000
skills:
  enableSkillCommands: true
extensions:
  - ~/omp-extensions/notify.ts
statusLine:
  segments: [model, tokens, cost]
compaction:
  enabled: true
  strategy: summary
  keepRecentTokens: 30000
  thresholdPercent: 85
  idleEnabled: false
  idleThresholdTokens: 200000
  supersedeReads: true
  remoteEnabled: true
retry:
  enabled: true
  maxRetries: 4
  modelFallback: true
  fallbackChains:
    default: [openai/gpt-5.1]
  fallbackRevertPolicy: cooldown-expiry
"""


def test_a_users_config_yml_of_the_original_loads(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "config.yml", ORIGINAL_CONFIG)
    settings = load_settings(tmp_path)
    assert settings.compaction == CompactionSettings(keepRecentTokens=30000,
                                                     thresholdPercent=85.0)
    assert settings.retry == RetrySettings(maxRetries=4)
    assert capsys.readouterr().err == ""  # nothing there is a mistake


def test_an_unknown_key_in_a_section_we_model_is_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "config.yml", "compaction:\n  keepRecentToken: 5\n  strategy: summary\n"
                 "retry:\n  maxRetrys: 1\n  baseDelay: 2\n  maxRetries: 3\n")
    assert load_settings(tmp_path) == Settings(retry=RetrySettings(maxRetries=3))
    assert capsys.readouterr().err == (
        f"omp: warning: {path}: $.compaction: unknown key(s) ignored: keepRecentToken\n"
        f"omp: warning: {path}: $.retry: unknown key(s) ignored: baseDelay, maxRetrys\n")


def test_null_means_not_set_except_for_the_reserve(tmp_path: Path) -> None:
    write(tmp_path, "config.yml", "compaction:\n  enabled:\n  keepRecentTokens: null\n"
          "  reserveTokens: null\n")
    assert load_settings(tmp_path) == Settings()


def test_config_yaml_spelling_is_read(tmp_path: Path) -> None:
    write(tmp_path, "config.yaml", "retry:\n  maxRetries: 4\n")
    assert load_settings(tmp_path).retry.maxRetries == 4


def test_settings_yml_is_only_a_fallback(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    legacy = write(tmp_path, "settings.yml", "retry:\n  maxRetries: 2\n")
    assert load_settings(tmp_path).retry.maxRetries == 2
    assert capsys.readouterr().err == (
        f"omp: warning: {legacy}: read because there is no config.yml; rename it to config.yml "
        "(where the original omp keeps its settings)\n")
    write(tmp_path, "config.yml", "retry:\n  baseDelayMs: 100\n")
    assert load_settings(tmp_path).retry == RetrySettings(baseDelayMs=100)  # not merged
    assert capsys.readouterr().err == ""


# --- project files -----------------------------------------------------------------------------


def test_project_files_override_the_global_one_key_by_key(tmp_path: Path) -> None:
    agent, project = tmp_path / "agent", tmp_path / "project"
    write(agent, "config.yml", "compaction:\n  keepRecentTokens: 1000\n  reserveTokens: 8000\n"
          "retry:\n  maxRetries: 2\n  baseDelayMs: 100\n")
    write(project, ".omp/settings.json",
          '{"retry": {"maxRetries": 5, "maxDelayMs": 1000}, "theme": "dark"}')
    write(project, ".omp/config.yml", "retry:\n  maxRetries: 7\ncompaction:\n"
          "  reserveTokens: null\n")
    settings = load_settings(agent, project)
    # config.yml over settings.json over the global file, for the keys each one sets.
    assert settings.retry == RetrySettings(maxRetries=7, baseDelayMs=100, maxDelayMs=1000)
    assert settings.compaction == CompactionSettings(keepRecentTokens=1000, reserveTokens=None)
    # Without a cwd only the global file counts.
    assert load_settings(agent).retry == RetrySettings(maxRetries=2, baseDelayMs=100)


def test_a_mistake_in_a_project_file_names_that_file(tmp_path: Path) -> None:
    agent, project = tmp_path / "agent", tmp_path / "project"
    write(agent, "config.yml", "retry:\n  maxRetries: 2\n")
    path = write(project, ".omp/config.yml", "retry:\n  maxRetries: many\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(agent, project)
    assert str(caught.value) == f"{path}: $.retry.maxRetries: expected an integer (got 'many')"
    path.unlink()
    path = write(project, ".omp/settings.json", '{"retry": {"enabled": "yes"}}')
    with pytest.raises(ConfigError) as caught:
        load_settings(agent, project)
    assert str(caught.value) == f"{path}: $.retry.enabled: expected true or false (got 'yes')"


# --- trusted projects --------------------------------------------------------------------------


def test_trusted_projects_come_from_the_global_file(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    write(tmp_path, "config.yml", "trustedProjects:\n  - ~/src/app\n  - /srv/tools/../lib\n")
    assert load_settings(tmp_path).trusted_projects == (tmp_path / "home/src/app",
                                                        Path("/srv/lib"))


def test_a_project_cannot_trust_itself(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    agent, project = tmp_path / "agent", tmp_path / "project"
    write(agent, "config.yml", "trustedProjects: [/srv/other]\n")
    for name, text in ((".omp/config.yml", f"trustedProjects: [{project}]\n"),
                       (".omp/settings.json", f'{{"trustedProjects": ["{project}"]}}')):
        path = write(project, name, text)
        assert load_settings(agent, project).trusted_projects == (Path("/srv/other"),)
        assert capsys.readouterr().err == (
            f"omp: warning: {path}: $.trustedProjects: ignored; only the global "
            f"{agent}/config.yml can trust projects\n")
        path.unlink()


# --- provider keys for subprocesses ------------------------------------------------------------


PROVIDER_VARIABLES = frozenset({"OMP_TEST_PROVIDER_KEY"})
ENVIRON = {"OMP_TEST_PROVIDER_KEY": "sk-1", "PATH": "/bin"}


def test_pass_provider_keys_comes_from_the_global_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings(tmp_path)
    assert settings.bash == BashSettings(passProviderKeys=False)
    policy = settings.environment_policy(PROVIDER_VARIABLES)
    assert child_environment(policy, environ=ENVIRON) == {"PATH": "/bin"}
    write(tmp_path, "config.yml", "bash:\n  passProviderKeys: true\n  autoBackground: {}\n")
    settings = load_settings(tmp_path)
    assert settings.bash == BashSettings(passProviderKeys=True)
    policy = settings.environment_policy(PROVIDER_VARIABLES)
    assert child_environment(policy, environ=ENVIRON) == ENVIRON
    assert capsys.readouterr().err == ""


def test_a_project_cannot_ask_for_the_provider_keys(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agent, project = tmp_path / "agent", tmp_path / "project"
    for name, text in ((".omp/config.yml", "bash: {passProviderKeys: true}\n"),
                       (".omp/settings.json", '{"bash": {"passProviderKeys": true}}')):
        path = write(project, name, text)
        settings = load_settings(agent, project)
        assert settings.bash.passProviderKeys is False
        policy = settings.environment_policy(PROVIDER_VARIABLES)
        assert "OMP_TEST_PROVIDER_KEY" not in child_environment(policy, environ=ENVIRON)
        assert capsys.readouterr().err == (
            f"omp: warning: {path}: $.bash.passProviderKeys: ignored; only the global "
            f"{agent}/config.yml can set it\n")
        path.unlink()


def test_an_agent_directory_inside_the_project_is_read_once_as_global(tmp_path: Path) -> None:
    agent = tmp_path / ".omp"
    write(agent, "config.yml", "trustedProjects: [/srv/app]\nretry:\n  maxRetries: 1\n")
    settings = load_settings(agent, tmp_path)
    assert (settings.trusted_projects, settings.retry.maxRetries) == ((Path("/srv/app"),), 1)


# --- mistakes ----------------------------------------------------------------------------------


MISTAKES = [
    ("retry: [1", "not valid YAML (line 1, column 10): expected ',' or ']', but got "
     "'<stream end>'"),
    ("- retry\n", "expected a mapping of settings sections (compaction, retry, ...), got list"),
    ("compaction: 3\n", "$.compaction: expected a mapping (got 3)"),
    ("retry: [1, 2]\n", "$.retry: expected a mapping (got [1, 2])"),
    ("retry:\n  maxRetries: 2.5\n", "$.retry.maxRetries: expected an integer (got 2.5)"),
    ("retry:\n  maxRetries: '3'\n", "$.retry.maxRetries: expected an integer (got '3')"),
    ("retry:\n  maxRetries: true\n", "$.retry.maxRetries: expected an integer (got True)"),
    ("retry:\n  enabled: 'no'\n", "$.retry.enabled: expected true or false (got 'no')"),
    ("compaction:\n  enabled: 'false'\n",
     "$.compaction.enabled: expected true or false (got 'false')"),
    ("compaction:\n  reserveTokens: lots\n",
     "$.compaction.reserveTokens: expected an integer (got 'lots')"),
    ("compaction:\n  thresholdPercent: high\n",
     "$.compaction.thresholdPercent: expected a number (got 'high')"),
    ("retry:\n  enabled: 1\n  maxDelayMs: 1.5\n",
     "$.retry.enabled: expected true or false (got 1); "
     "$.retry.maxDelayMs: expected an integer (got 1.5)"),
    ("compaction:\n  reserveTokens: 0\n",
     "$.compaction.reserveTokens: must be greater than 0, got 0 (or null for the automatic "
     "reserve)"),
    ("compaction:\n  keepRecentTokens: -5\n",
     "$.compaction.keepRecentTokens: must not be negative, got -5"),
    ("retry:\n  maxRetries: -1\n", "$.retry.maxRetries: must not be negative, got -1"),
    ("retry:\n  baseDelayMs: -500\n", "$.retry.baseDelayMs: must not be negative, got -500"),
    ("retry:\n  maxDelayMs: -1\n", "$.retry.maxDelayMs: must not be negative, got -1"),
    ("skills:\n  enabled: maybe\n", "$.skills.enabled: expected true or false (got 'maybe')"),
    ("skills:\n  ignoredSkills: draft\n",
     "$.skills.ignoredSkills: expected a list (got 'draft')"),
    ("trustedProjects: ~/src/app\n", "$.trustedProjects: expected a list (got '~/src/app')"),
    ("trustedProjects: [src/app]\n",
     "$.trustedProjects[0]: must be an absolute path or start with ~ (got 'src/app')"),
    ("trustedProjects: ['']\n",
     "$.trustedProjects[0]: must be an absolute path or start with ~ (got '')"),
    ("mcp:\n  maxMessageBytes: 0\n",
     "$.mcp.maxMessageBytes: expected a whole number of 1 or more (got 0)"),
    ("mcp:\n  maxMessageBytes: 1.5\n",
     "$.mcp.maxMessageBytes: expected a whole number of 1 or more (got 1.5)"),
    ("stream:\n  maxEventBytes: 0\n", "$.stream.maxEventBytes: must be 1 or more, got 0"),
    ("stream:\n  idleTimeoutMs: many\n",
     "$.stream.idleTimeoutMs: expected an integer (got 'many')"),
    ("stream:\n  maxMessageChars: 20000000\n",
     "$.stream.maxMessageChars: must be at most 10000000 (its session-file line must fit the "
     "largest frame), got 20000000"),
]


def test_the_stream_bounds(tmp_path: Path) -> None:
    defaults = load_settings(tmp_path).stream
    assert (defaults.maxEventBytes, defaults.maxMessageChars, defaults.idleTimeoutMs,
            defaults.maxResponseBytes) == (16 * 1024 * 1024, 4 * 1024 * 1024, 120_000,
                                           256 * 1024 * 1024)
    write(tmp_path, "config.yml", "stream:\n  maxEventBytes: 1000\n  idleTimeoutMs: 5000\n")
    write(tmp_path / "project" / ".omp", "config.yml", "stream:\n  maxResponseBytes: 7\n")
    chosen = load_settings(tmp_path, tmp_path / "project").stream
    assert (chosen.maxEventBytes, chosen.idleTimeoutMs, chosen.maxResponseBytes) == (
        1000, 5000, 7)


def test_the_mcp_message_limit(tmp_path: Path) -> None:
    assert load_settings(tmp_path).mcp_max_message_bytes == 64 * 1024 * 1024
    write(tmp_path, "config.yml", "mcp:\n  maxMessageBytes: 1000\n")
    assert load_settings(tmp_path).mcp_max_message_bytes == 1000


@pytest.mark.parametrize(("text", "message"), MISTAKES)
def test_mistakes_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "config.yml", text)
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert str(caught.value) == f"{path}: {message}"


def test_a_config_yml_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.mkdir()
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert str(caught.value) == f"{path}: is a directory, not a file"
    path.rmdir()
    path.write_bytes(b"# r\xe9glages\nretry:\n  maxRetries: 2\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(tmp_path)
    assert str(caught.value) == (f"{path}: not UTF-8 text (byte 0xe9 on line 1); save the file "
                                 "as UTF-8")


# --- through the process -----------------------------------------------------------------------


async def auto_compaction_enabled(cwd: Path) -> bool:
    async with RpcClient.spawn(args=("--mode", "rpc", "--model", "offline/echo"), cwd=cwd,
                               stderr=subprocess.DEVNULL) as client:
        state = await client.call(cmd.GetState(), payloads.SessionState)
    assert isinstance(state.autoCompactionEnabled, bool)
    return state.autoCompactionEnabled


async def test_config_yml_and_the_project_file_take_effect(tmp_path: Path,
                                                           isolated_agent_dir: Path) -> None:
    write(isolated_agent_dir, "config.yml",
          ORIGINAL_CONFIG.replace("compaction:\n  enabled: true", "compaction:\n  enabled: false"))
    project = tmp_path / "project"
    project.mkdir()
    with trio.fail_after(TEST_TIMEOUT):
        assert await auto_compaction_enabled(project) is False
        write(project, ".omp/config.yml", "compaction:\n  enabled: true\n")
        assert await auto_compaction_enabled(project) is True


async def test_retry_settings_of_both_layers_reach_a_run(tmp_path: Path,
                                                         isolated_agent_dir: Path) -> None:
    write(isolated_agent_dir, "config.yml", "retry:\n  maxRetries: 2\n  baseDelayMs: 1\n")
    write(tmp_path, ".omp/config.yml", "retry:\n  maxRetries: 3\n")
    script: list[dict[str, Any]] = [
        {"status": 503, "body": {"error": {"message": "overloaded"}}}, text_reply("Fine.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Hello?", id="p1")
            frames = await agent.until_settled()
    (start,) = of_type(frames, "auto_retry_start")
    assert start["maxAttempts"] == 3  # the project's
    assert start["delayMs"] <= 1  # the global file's base delay (jitter only shortens it)


def unreadable(path: Path) -> None:
    path.mkdir()


@pytest.mark.parametrize(("make", "message"), [
    (lambda p: p.write_text(ORIGINAL_CONFIG.replace("maxRetries: 4", "maxRetries: four")),
     "$.retry.maxRetries: expected an integer (got 'four')"),
    (lambda p: p.write_bytes(b"theme:\n  dark: \xff\n"),
     "not UTF-8 text (byte 0xff on line 2); save the file as UTF-8"),
    (unreadable, "is a directory, not a file"),
])
async def test_a_bad_config_yml_stops_startup_with_one_line(
        isolated_agent_dir: Path, make: Callable[[Path], object], message: str) -> None:
    path = isolated_agent_dir / "config.yml"
    make(path)
    proc = await trio.run_process(
        [sys.executable, "-m", "omp", "--mode", "rpc", "--model", "offline/echo"], stdin=b"",
        capture_stdout=True, capture_stderr=True, check=False)
    assert (proc.returncode, proc.stdout) == (1, b"")  # no ready: nothing was accepted
    assert proc.stderr.decode() == f"omp: {path}: {message}\n"  # no traceback


OFFLINE_LINE = ("omp: no API key configured (set ANTHROPIC_API_KEY, OPENAI_API_KEY, "
                "GEMINI_API_KEY or another provider's key: `omp models --all` lists them; or add "
                "a provider to models.yml); using the offline model offline/echo")
"""What a start with no model chosen and no key anywhere says on stderr."""


async def start_on_no_model(cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """``omp --mode rpc`` with no model chosen (so it says it falls back to the offline one),
    its input closed at once."""
    with trio.fail_after(TEST_TIMEOUT):
        return await trio.run_process([sys.executable, "-m", "omp", "--mode", "rpc"], stdin=b"",
                                      cwd=cwd, capture_stdout=True, capture_stderr=True,
                                      check=False)


async def test_a_config_error_is_said_before_the_offline_model_line(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    path = write(isolated_agent_dir, "config.yml", "retry:\n  maxRetries: four\n")
    proc = await start_on_no_model(tmp_path)
    assert (proc.returncode, proc.stdout) == (1, b"")
    # The user's mistake is the first thing they read (the start stops there).
    assert proc.stderr.decode().splitlines()[0] == (
        f"omp: {path}: $.retry.maxRetries: expected an integer (got 'four')")


async def test_a_misspelt_top_level_key_is_a_warning_naming_the_closest_key(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # The original's own keys (ORIGINAL_CONFIG: theme, modelRoles, statusLine...) are no
    # mistake, even though this runtime does not use them.
    path = write(isolated_agent_dir, "config.yml",
                 ORIGINAL_CONFIG + "compactoin:\n  enabled: false\nqwertyuiop: 1\n")
    proc = await start_on_no_model(tmp_path)
    assert proc.returncode == 0  # a warning, not a failed start
    assert b'"type":"ready"' in proc.stdout
    assert proc.stderr.decode().splitlines() == [
        f"omp: warning: {path}: $.compactoin: unknown key ignored (did you mean compaction?)",
        f"omp: warning: {path}: $.qwertyuiop: unknown key ignored",
        OFFLINE_LINE]
