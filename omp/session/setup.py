"""Building the session a server starts with, from the command line's choices."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..config import agent_dir
from ..llm.models import OFFLINE_PROVIDER, ModelRegistry
from ..llm.types import THINKING_LEVELS, ThinkingLevel
from ..protocol.payloads import Model
from ..tools import default_tools
from ..tools.base import Tool, ToolContext
from ..tools.todo_state import TodoState
from .agent_session import AgentSession, SessionError
from .file import make_private_dirs
from .locations import sessions_dir
from .settings import load_settings
from .system_prompt import PromptOptions


def create_session(*, provider: str | None = None, model: str | None = None,
                   api_key: str | None = None, thinking: str | None = None,
                   agent_directory: Path | None = None,
                   environ: Mapping[str, str] | None = None,
                   system_prompt: str | None = None, append_system_prompt: str | None = None,
                   cwd: Path | None = None, tools: Sequence[Tool] | None = None,
                   tool_names: Sequence[str] | None = None,
                   persist: bool = True, session_dir: Path | None = None,
                   session_path: Path | None = None, resume: bool = False,
                   announce_offline: bool = True) -> AgentSession:
    """The startup session. Raises ``SessionError`` / ``ConfigError`` with a message for the user.

    ``model`` is ``provider/id`` or an id; ``provider`` alone picks that provider's first model.
    ``api_key`` is for the chosen provider. With nothing chosen and no credentials anywhere, the
    offline model is used and (``announce_offline``) said so once on stderr.
    """
    if thinking is not None and thinking not in THINKING_LEVELS:
        raise SessionError(f"Unknown thinking level: {thinking} (expected one of "
                           f"{', '.join(THINKING_LEVELS)})")
    probe = ModelRegistry.load(agent_directory, environ=environ)
    chosen = _choose(probe, provider, model) if (provider or model) else None
    if api_key is not None:
        if chosen is None:
            raise SessionError("--api-key needs --provider or --model to say which provider "
                               "it is for")
        cli_keys = {chosen.provider: api_key}
        registry = ModelRegistry.load(agent_directory, environ=environ, cli_keys=cli_keys)
    else:
        registry = probe
    if chosen is None:
        chosen = registry.default_model()
        if chosen.provider == OFFLINE_PROVIDER and announce_offline:
            print("omp: no API key configured (set ANTHROPIC_API_KEY, OPENAI_API_KEY or "
                  "GEMINI_API_KEY, or add a provider to models.yml); using the offline model "
                  f"{chosen.provider}/{chosen.id}", file=sys.stderr)
    elif not registry.has_credentials(chosen.provider):
        raise SessionError(f"No API key for {chosen.provider}/{chosen.id}: "
                           f"{registry.missing_key_hint(chosen.provider)}")
    level: ThinkingLevel = "off"
    for known in THINKING_LEVELS:
        if thinking == known:
            level = known
    cwd = Path.cwd() if cwd is None else cwd
    todos = TodoState()
    context = ToolContext(cwd)
    active = list(default_tools(context, todos)) if tools is None else list(tools)
    if tool_names is not None:
        by_name = {t.name: t for t in active}
        unknown = [n for n in tool_names if n not in by_name]
        if unknown:
            raise SessionError(f"Unknown tool(s): {', '.join(unknown)} (built-in tools: "
                               f"{', '.join(by_name)})")
        active = [by_name[n] for n in dict.fromkeys(tool_names)]
    prompt_options = PromptOptions(
        cwd, agent_dir(environ) if agent_directory is None else agent_directory,
        system_prompt, append_system_prompt)
    settings = load_settings(prompt_options.agent_directory, cwd)
    directory = None
    if persist:
        env = os.environ if environ is None else environ
        directory = session_dir or (Path(env["OMP_SESSION_DIR"]).expanduser()
                                    if env.get("OMP_SESSION_DIR") else None) or sessions_dir(
            prompt_options.agent_directory or agent_dir(environ), cwd)
    session = AgentSession(registry=registry, model=chosen, configured_thinking=level, cwd=cwd,
                        settings=settings, auto_retry=settings.retry.enabled,
                        auto_compaction=settings.compaction.enabled,
                        sessions_directory=directory,
                        builtin_tools=active, tool_context=context,
                        prompt_options=prompt_options, system_prompt=prompt_options.build(active),
                        todos=todos)
    session.load_skills()
    if directory is not None:
        if session_path is None:
            _make_sessions_dir(directory)
        session.open_startup_file(session_path=session_path, resume=resume)
    return session


def _make_sessions_dir(directory: Path) -> None:
    """The directory new sessions go in, created (0700) when missing: the default one under the
    agent directory is the runtime's own, and ``--session-dir`` / ``$OMP_SESSION_DIR`` name a
    directory for the runtime to keep sessions in. (A ``--session`` file's directory, and one
    ``open_session`` names, must exist: nothing is created for them.)"""
    try:
        make_private_dirs(directory)
    except OSError as exc:
        raise SessionError(f"Cannot create the session directory {directory}: "
                           f"{exc.strerror or exc}") from None


def _choose(registry: ModelRegistry, provider: str | None, model: str | None) -> Model:
    if model and "/" in model and provider is None:
        provider, _, model = model.partition("/")
    if model:
        candidates = [m for m in registry.models
                      if m.id == model and (provider is None or m.provider == provider)]
        if not candidates:
            raise SessionError(f"Model not found: {provider + '/' if provider else ''}{model}")
        return candidates[0]
    assert provider is not None
    of_provider = [m for m in registry.models if m.provider == provider]
    if not of_provider:
        known = sorted({m.provider for m in registry.models})
        raise SessionError(f"Unknown provider: {provider} (known: {', '.join(known)})")
    return of_provider[0]
