"""Building the session a server starts with, from the command line's choices."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ..config import agent_dir
from ..llm.models import OFFLINE_PROVIDER, ModelRegistry
from ..llm.stream import HttpClient
from ..llm.thinking import clamp, efforts
from ..llm.types import THINKING_LEVELS, ThinkingLevel
from ..protocol.payloads import Model
from ..tools import default_tools, missing_dependency
from ..tools.base import Tool, ToolContext, UriHandler
from ..tools.eval_settings import unavailable as eval_unavailable
from ..tools.specs import EVAL_SPECS, WEB_SPECS
from ..tools.todo_state import TodoState
from .aborts import AbortRegistry
from .agent_session import AgentSession, SessionError
from .file import make_private_dirs
from .locations import find_sessions, looks_like_session_path, recent_sessions, sessions_dir
from .settings import Settings, load_settings
from .sink import EventSink, NullSink
from .system_prompt import PromptOptions, read_context_files

if TYPE_CHECKING:
    from ..tools.web_policy import WebAccess


def create_session(*, provider: str | None = None, model: str | None = None,
                   api_key: str | None = None, thinking: str | None = None,
                   agent_directory: Path | None = None,
                   environ: Mapping[str, str] | None = None,
                   system_prompt: str | None = None, append_system_prompt: str | None = None,
                   cwd: Path | None = None, tools: Sequence[Tool] | None = None,
                   tool_names: Sequence[str] | None = None,
                   persist: bool = True, session_dir: Path | None = None,
                   session_path: Path | None = None, resume: bool = False,
                   resume_session: str | None = None, models: Sequence[str] | None = None,
                   config_files: Sequence[Path] = (), skill_dirs: Sequence[Path] = (),
                   skills: Sequence[str] | bool | None = None,
                   require_credentials: bool = True, announce_offline: bool = True,
                   sink: EventSink | None = None,
                   http: HttpClient | None = None, aborts: AbortRegistry | None = None,
                   uris: UriHandler | None = None,
                   tools_from: Callable[[AgentSession], Sequence[Tool]] | None = None
                   ) -> AgentSession:
    """The startup session. Raises ``SessionError`` / ``ConfigError`` with a message for the user.

    What its owner (``serve()``) gives it: ``sink`` (where its events go), ``http`` (the client
    of its model calls), ``aborts`` (the registry of its abortable work), ``uris`` (the host's
    URL schemes for ``read`` / ``write``), ``tools_from`` (tools that need the session itself).

    ``model`` is ``provider/id`` or an id, with an optional ``:<thinking level>``; ``provider``
    alone picks that provider's first model; ``models`` (``--models``): the first of them found,
    when ``model`` is not given. ``api_key`` is for the chosen provider. With nothing chosen and
    no credentials anywhere, the offline model is used and (``announce_offline``) said so once on
    stderr, after whatever the settings files had to say. ``thinking`` ``auto``: the model's
    default effort (``high`` clamped to it; ``off`` for a model without reasoning).

    ``require_credentials`` False: a chosen model whose provider has no credential yet is
    taken all the same (rpc: the host can still ``login``; a prompt fails with the hint until
    then).

    ``resume_session`` (``-r``): a path (as ``session_path``), or a session id or a unique prefix
    of one, looked up in this project's sessions, then in every project's; a session recorded
    for another directory that still exists continues there. ``config_files``: settings
    overlays (``--config``); ``skill_dirs`` are searched for skills first (``--plugin-dir``);
    ``skills`` False loads none, a list of glob patterns only those (``--no-skills``,
    ``--skills``).
    """
    if thinking is not None and thinking not in (*THINKING_LEVELS, "auto"):
        raise SessionError(f"Unknown thinking level: {thinking} (expected one of "
                           f"{', '.join(THINKING_LEVELS)} or auto)")
    probe = ModelRegistry.load(agent_directory, environ=environ)
    if model and ":" in model and probe_model(probe, provider, model) is None:
        model, _, suffix = model.rpartition(":")
        if suffix not in THINKING_LEVELS:
            raise SessionError(f"Model not found: {model}:{suffix}")
        thinking = thinking or suffix
    if model is None and models:
        model = next((pattern for pattern in models
                      if probe_model(probe, provider, pattern) is not None), models[0])
    chosen = _choose(probe, provider, model) if (provider or model) else None
    if api_key is not None:
        if chosen is None:
            raise SessionError("--api-key needs --provider or --model to say which provider "
                               "it is for")
        cli_keys = {chosen.provider: api_key}
        registry = ModelRegistry.load(agent_directory, environ=environ, cli_keys=cli_keys)
        if (chosen.provider, chosen.id) in probe.discovered:
            registry.local_model(chosen.provider, chosen.id)
    else:
        registry = probe
    offline_notice: str | None = None
    if chosen is None:
        chosen = registry.default_model()
        if chosen.provider == OFFLINE_PROVIDER and announce_offline:
            unset = registry.unset_key_variables()
            why = "; ".join(f"models.yml provider {name}: its apiKey names {variable}, which "
                            "is not set" for name, variable in unset.items()) or (
                "no API key configured (set ANTHROPIC_API_KEY, OPENAI_API_KEY, "
                "GEMINI_API_KEY or another provider's key: `omp models --all` lists them; or "
                "add a provider to models.yml)")
            offline_notice = f"omp: {why}; using the offline model {chosen.provider}/{chosen.id}"
    elif require_credentials and not registry.has_credentials(chosen.provider):
        raise SessionError(f"No API key for {chosen.provider}/{chosen.id}: "
                           f"{registry.missing_key_hint(chosen.provider)}")
    level: ThinkingLevel = "off"
    if thinking == "auto":
        supported = efforts(chosen)
        level = clamp(chosen, "high") if supported else "off"
    for known in THINKING_LEVELS:
        if thinking == known:
            level = known
    cwd = Path.cwd() if cwd is None else cwd
    agent_directory = agent_dir(environ) if agent_directory is None else agent_directory
    env = os.environ if environ is None else environ
    if resume_session is not None:
        session_path, cwd = _resume_target(resume_session, cwd, agent_directory, session_dir,
                                           env)
    settings = _with_skill_choices(
        load_settings(agent_directory, cwd, config_files), skill_dirs, skills)
    if offline_notice is not None:
        # Said after the settings were read: a mistake in config.yml (an error that stops the
        # start, or a warning) is the first thing the user reads, not this line.
        print(offline_notice, file=sys.stderr)
    registry.use_local_servers(settings.local_models.servers)
    if (chosen.provider, chosen.id) in registry.discovered:
        # A local model named before its server was asked: at the server the settings name.
        chosen = registry.find(chosen.provider, chosen.id) or chosen
    todos = TodoState()
    http = http or HttpClient()
    secret_variables = registry.key_variables()
    if settings.web.enabled:
        from ..tools.web_search import KEY_VARIABLES

        # The search keys' variables are kept from subprocesses like the model providers'.
        secret_variables |= frozenset(KEY_VARIABLES)
    context = ToolContext(cwd, uris=uris, web=web_access(settings, http, registry, env),
                          environment=settings.environment_policy(secret_variables),
                          eval=settings.eval, lsp=settings.lsp)
    opted_in = settings.enabled_tools | ({"lsp"} if settings.lsp.enabled else frozenset())
    wanted = opted_in | frozenset(tool_names or ())
    active = (list(default_tools(context, todos, background=settings.async_.enabled,
                                 enable=wanted))
              if tools is None else list(tools))
    if tools is None and tool_names is None:
        for name in sorted(opted_in):
            if (missing := missing_dependency(name)) is not None:  # config.yml turned it on
                print(f"omp: not offered: {missing}", file=sys.stderr)
    if tool_names is not None:
        by_name = {t.name: t for t in active}
        unknown = [n for n in tool_names if n not in by_name]
        not_installed = [m for n in unknown if (m := missing_dependency(n)) is not None]
        if not_installed:
            raise SessionError("; ".join(not_installed))
        web_off = [n for n in unknown if n in WEB_SPECS]
        if web_off:
            raise SessionError(f"{', '.join(web_off)}: web tools are off; set `web: "
                               "{enabled: true}` in config.yml to offer them")
        if any(n in EVAL_SPECS for n in unknown):
            raise SessionError(eval_unavailable(settings.eval) or "eval: not offered")
        if unknown:
            raise SessionError(f"Unknown tool(s): {', '.join(unknown)} (built-in tools: "
                               f"{', '.join(by_name)})")
        active = [by_name[n] for n in dict.fromkeys(tool_names)]
    active = [t for t in active if t.name not in settings.disabled_tools]
    prompt_options = PromptOptions(cwd, agent_directory, system_prompt, append_system_prompt,
                                   disabled_context=settings.disabled_providers)
    # Read now, before ``ready`` (a FIFO is refused, never waited on): the server says which
    # were left out right after ``ready``, and no model call reads them again.
    prompt_options.use_context(*read_context_files(cwd, prompt_options.directory,
                                                   prompt_options.disabled_context))
    directory = None
    if persist:
        directory = session_dir or (Path(env["OMP_SESSION_DIR"]).expanduser()
                                    if env.get("OMP_SESSION_DIR") else None) or sessions_dir(
            prompt_options.agent_directory or agent_dir(environ), cwd)
    session = AgentSession(registry=registry, model=chosen, configured_thinking=level, cwd=cwd,
                           settings=settings, auto_retry=settings.retry.enabled,
                           auto_compaction=settings.compaction.enabled,
                           sessions_directory=directory, builtin_tools=active,
                           tool_context=context, prompt_options=prompt_options, todos=todos,
                           sink=sink or NullSink(), http=http,
                           aborts=aborts or AbortRegistry(), tools_from=tools_from)
    session.load_skills()
    if directory is not None:
        if session_path is None:
            _make_sessions_dir(directory)
        session.open_startup_file(session_path=session_path, resume=resume)
    return session


def web_access(settings: Settings, http: HttpClient, registry: ModelRegistry,
               environ: Mapping[str, str]) -> WebAccess | None:
    """The web tools' access for a session with ``settings``; None unless ``web.enabled``
    (then no web tool is offered, and the policy's module is never imported)."""
    if not settings.web.enabled:
        return None
    from ..tools.web_policy import AddressPolicy, WebAccess

    def stored_key(provider: str) -> str | None:
        entry = registry.credentials.entries.get(provider)
        key = getattr(entry, "key", None)
        return key if isinstance(key, str) and key else None

    return WebAccess(settings.web, http,
                     policy=AddressPolicy.from_settings(settings.web.allowNetworks),
                     environ=environ, stored_key=stored_key)


def _resume_target(value: str, cwd: Path, agent_directory: Path, session_dir: Path | None,
                   env: Mapping[str, str]) -> tuple[Path, Path]:
    """``-r VALUE``: (the session file, the directory to work in). Raises SessionError for an
    id that matches no session or several (naming them)."""
    if looks_like_session_path(value):
        return cwd / Path(value).expanduser(), cwd
    here = session_dir or (Path(env["OMP_SESSION_DIR"]).expanduser()
                           if env.get("OMP_SESSION_DIR") else None) or sessions_dir(
        agent_directory, cwd)
    matches = find_sessions(value, [here, agent_directory / "sessions"])
    if len(matches) > 1:
        listed = "; ".join(f"{m.session_id} ({m.path})" for m in matches[:10])
        more = f" and {len(matches) - 10} more" if len(matches) > 10 else ""
        raise SessionError(f'Session "{value}" is ambiguous: it starts {len(matches)} session '
                           f"ids: {listed}{more}. Give more of the id.")
    if not matches:
        recent = recent_sessions(here)
        listed = ("; recent sessions here: " + "; ".join(
            f"{m.session_id} ({m.path.name})" for m in recent)) if recent else ""
        raise SessionError(f'Session "{value}" not found{listed}. Run `omp -c` to continue the '
                           "newest session, or omp without -r to start a new one.")
    match = matches[0]
    recorded = Path(match.cwd) if match.cwd else cwd
    if recorded != cwd and not recorded.is_dir():
        print(f"omp: Could not switch to resumed project {recorded}; staying in {cwd}.",
              file=sys.stderr)
        recorded = cwd
    return match.path, recorded


def _with_skill_choices(settings: Settings, skill_dirs: Sequence[Path],
                        skills: Sequence[str] | bool | None) -> Settings:
    """The settings with the command line's skill choices over them."""
    chosen = settings.skills
    if skill_dirs:
        chosen = msgspec.structs.replace(chosen, customDirectories=[
            *map(str, skill_dirs), *chosen.customDirectories])
    if skills is False:
        chosen = msgspec.structs.replace(chosen, enabled=False)
    elif isinstance(skills, Sequence) and not isinstance(skills, str):
        chosen = msgspec.structs.replace(chosen, includeSkills=list(skills))
    return msgspec.structs.replace(settings, skills=chosen)


def probe_model(registry: ModelRegistry, provider: str | None, model: str) -> Model | None:
    """The model ``provider`` / ``model`` names, or None."""
    try:
        return _choose(registry, provider, model)
    except SessionError:
        return None


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
        candidates = [m for m in (registry.all_models() if provider is None
                                  else registry.models_of(provider)) if m.id == model]
        # A local server's model may be named before the server was asked (it is asked after
        # ``ready``); ``model:high`` is still a thinking level, ``qwen3:8b`` an Ollama tag.
        if (not candidates and provider is not None
                and model.rpartition(":")[2] not in THINKING_LEVELS
                and (local := registry.local_model(provider, model)) is not None):
            candidates = [local]
        if not candidates:
            raise SessionError(f"Model not found: {provider + '/' if provider else ''}{model}")
        return candidates[0]
    assert provider is not None
    first = registry.provider_default(provider)
    if first is None and provider in {s.provider for s in registry.local_servers()}:
        raise SessionError(f"{provider} is a local server whose models are found after the "
                           f"start: name one with --model {provider}/<id>")
    if first is None:
        known = sorted({m.provider for m in registry.all_models()})
        raise SessionError(f"Unknown provider: {provider} (known: {', '.join(known)})")
    return first
