"""Session settings (auto-compaction, auto-retry, trusted projects, the environment of
subprocesses), read from the original's ``config.yml``.

Files, lowest precedence first:

1. ``<agent dir>/config.yml`` (or ``config.yaml``): the global file, where the original keeps its
   settings. Only when neither exists, ``<agent dir>/settings.yml`` (or ``.yaml``), the name
   earlier versions of this project used, is read in its place, with a warning to rename it.
2. ``<cwd>/.omp/settings.json`` (the original's legacy JSON form), then ``<cwd>/.omp/config.yml``:
   the project's files, as the original's own (``.omp``) discovery reads them. A key set there
   overrides the global value of that key; the other keys keep theirs.
3. ``--config FILE`` overlays, in order (docs/design/command-line.md#config-overlays-config): the
   same shape as ``config.yml``, chosen by the user as the global file is (so ``trustedProjects``
   and the global-only keys apply). A missing file or one that is no mapping is an error. Unlike the
   shared global file, an overlay is written for this runtime's run by whoever launches it, so every
   key it sets that this runtime does not act on is named in ``Settings.notes`` (one ``notice`` at
   startup): nothing it asks for is dropped without a word. Beyond the sections below, an
   overlay (and the global file) may set the original's ``disabledProviders`` (context files:
   ``agents-md`` leaves out the ``AGENTS.md`` files, ``claude`` the ``CLAUDE.md`` files,
   ``native`` the agent directory's own; for MCP files also ``codex``, ``gemini``, ``cursor``,
   ``windsurf``, ``vscode``, ``mcp-json``), ``enabledProviders`` (other tools' user-level MCP
   files that are read: docs/guides/mcp.md#configuration; not from a project's file) and
   ``<tool>.enabled: false`` for a built-in tool (``read``, ``bash``, ``edit``, ``write``,
   ``grep`` / ``search``, ``find``, ``ls``, ``todo``): that tool is not offered. Tool approval
   (docs/guides/approval.md#modes-and-policies):
   ``tools.approvalMode`` (``always-ask``, ``write``, ``yolo``; another value is an error) and
   ``tools.approval.<tool>: allow | deny | prompt`` (another value is ignored with a warning,
   as the original ignores it); a project's own file cannot set either (a repository must not
   wave its own tool calls through). Todo reminders (docs/guides/approval.md#todo-reminders):
   ``todo.reminders`` (bool) and ``todo.remindersMax`` (a whole number). MCP tool exposure
   (docs/guides/mcp.md#xd-devices): ``tools.xdev`` (bool, default true: MCP tools are ``xd://``
   devices), ``tools.xdevDocs`` (``builtins``, ``inline`` or ``catalog``) and
   ``tools.xdevInlineDevices`` (a list of globs); ``mcp.notifications`` (bool, default false)
   and ``mcp.notificationDebounceMs`` (a whole number, default 500): resource updates;
   ``mcp.maxMessageBytes`` (a whole number, default 64 MiB): the longest line a stdio server
   may write. TTSR
   rules (docs/guides/approval.md#rule-settings): ``ttsr.enabled``, ``ttsr.contextMode``,
   ``ttsr.interruptMode``, ``ttsr.repeatMode``, ``ttsr.repeatGap``, ``ttsr.builtinRules``,
   ``ttsr.disabledRules``; a wrong value is an error naming the key.

The global file is shared with the original, which has many sections we do not model (``theme``,
``vault``, ...): they are ignored silently (``_ORIGINAL_TOP_LEVEL`` lists the original's top-level
keys). Any other top-level key, in any of the files (most likely a typo: ``compactoin``), is
ignored with a warning on stderr naming the file, ``$.key`` and the closest known key when one
is close; the start goes on. Inside the sections we do model (``compaction``, ``retry``,
``bash``, ``task``, ``async``, ``skills``, ``eval``; ``localModels`` and ``stream`` are ours)
the original has more keys than we use, and adds some between versions, so an unmodelled key is
never an error: a key the original defines (``_ORIGINAL_KEYS``) is ignored silently, any other
one (most likely a typo) is ignored with a warning on stderr naming the file and
``$.section.key``. A key we model
with a value of the wrong type or range IS an error naming the file and the key (the strict
converter of ``omp/config.py``), and nothing is applied. ``null`` for a key means "not set" (its
default), except ``reserveTokens``, where null is a value (the automatic reserve). A missing file
or an empty one means the defaults.

```yaml
compaction:
  enabled: true           # set_auto_compaction overrides it for a session
  reserveTokens: null     # null: max(15% of the window, 16384), see effective_reserve_tokens
  keepRecentTokens: 20000
  thresholdPercent: -1    # > 0: compact above this percentage of the window
  thresholdTokens: -1     # > 0: compact above this many tokens (wins over the percentage)
  autoContinue: true
  midTurnEnabled: true
retry:
  enabled: true           # set_auto_retry overrides it for a session
  maxRetries: 10
  baseDelayMs: 500
  maxDelayMs: 300000      # a longer wait asked for by the provider fails the retry at once
trustedProjects:          # global file only
  - ~/src/my-project
bash:
  autoBackground:         # a `bash` call's command still running after thresholdMs (or when
    enabled: true         # the user steers) becomes a background job, its output delivered
    thresholdMs: 60000    # when it ends (0: every command starts as a job)
  passProviderKeys: false # global file only; true: commands and ripgrep get the provider keys
shellEnvironmentPolicy:   # global file only; what every subprocess inherits (omp.subprocess_env)
  inherit: all            # all | core (HOME, PATH, USER...) | none
  ignoreDefaultExcludes: false  # true: names with KEY, SECRET, TOKEN, PASSWORD, CREDENTIAL stay
  exclude: []             # wildcard patterns (any case) of names to leave out
  set: {}                 # NAME: value, added or replaced
  includeOnly: []         # not empty: only the names matching one of these stay
task:
  maxConcurrency: 32      # children of one session running at once (<= 0: unlimited)
  maxRecursionDepth: 2    # -1: unlimited; 0: the main agent cannot spawn
  maxRuntimeMs: 0         # wall-clock cap per child (0: none)
  softRequestBudget: 200  # model requests per child before a wrap-up notice (0: none)
  disabledAgents: []
  agentModelOverrides: {} # agent name -> model pattern(s)
async:
  enabled: true           # background children and `bash` `async: true` (false: inline)
  maxJobs: 100            # background jobs at once (subagents and commands)
localModels:              # local model servers, asked after `ready` (omp.llm.local)
  enabled: true           # false (or OMP_LOCAL_MODELS=0): none is asked
  timeoutMs: 1000         # per server: connect and list its models
  servers: {}             # global file only; provider -> its OpenAI-compatible root, e.g.
                          # {ollama: "http://gpu-box:11434/v1"}; default loopback ports
skills:                   # omp.commands.skills: where skills are found, which load
  enabled: true
  enableSkillCommands: true   # skill:<name> commands and /skill:<name>
  enableClaudeUser: false     # ~/.claude/skills (enablePiProject, enablePiUser,
  enableCodexUser: false      # enableClaudeProject, enableAgents{Project,User}: true)
  customDirectories: []       # scanned first: their skills win
  includeSkills: []           # glob patterns on the name (empty: all)
  ignoredSkills: []
web:                      # omp.tools.web_settings: web_fetch, web_search, read of http(s) URLs
  enabled: false          # no network policy set: no web tools
  allowNetworks: []       # global only; CIDR networks reachable although not public
  maxBytes: 5242880       # the largest body read (after decompression)
  timeoutSeconds: 30      # one whole fetch (redirects included) or search
  maxRedirects: 5
  searchProvider: auto    # auto, brave, exa, tavily, kagi
  searchBaseUrls: {}      # global only; provider -> API root (a proxy, a test server)
  searchApiKeys: {}       # global only; provider -> key or the variable holding it
eval:                     # omp.tools.eval_settings: the eval tool's Python kernel
  py: true                # false: no eval tool
  timeout: 30             # seconds a cell may run when the call gives none (0: no deadline)
lsp:                      # omp.tools.lsp_settings: the lsp tool and its language servers
  enabled: false          # global only; --tools lsp turns it on for one launch
  timeoutSeconds: 20      # a call's default limit (its `timeout`: 5 to 300)
  startTimeoutSeconds: 30 # a server's start and `initialize`
  diagnosticsWaitMs: 3000 # how long `diagnostics` waits for a changed file's
  maxMessageBytes: 67108864   # the largest message read from a server
  servers: {}             # global only; language -> {command, args, fileTypes, rootMarkers,
                          # languageId, initOptions, settings, enabled}
stream:                   # bounds on what a provider may send (omp.llm.sse, omp.llm.builder)
  maxEventBytes: 16777216     # the largest server-sent event (16 MiB)
  maxMessageChars: 4194304    # the largest answer: text, thinking, tool arguments, signatures
  idleTimeoutMs: 120000       # the longest time without an event (the stall watchdog)
  maxResponseBytes: 268435456 # everything one response sends (256 MiB)
  maxSessionLineBytes: 66060288 # the longest session-file line (63 MiB; 64 KiB to 64 MiB)
  sendMaxTokens: true         # send the model's output limit (false: the provider's default)
```

``stream``: each bound fails the turn with an error naming its key, never retried (a stall,
the one transient failure among them, is); the defaults are far beyond what a real model sends.
``maxMessageChars`` may be at most 10,000,000, so that the message's session-file line stays
within the largest frame (``omp.llm.types.MAX_MESSAGE_CHARS_LIMIT``). ``maxSessionLineBytes``
bounds every line of the session file: the longest strings of a longer entry are kept in files
next to it (``omp.session.oversize``); it may be at most the largest frame.

``shellEnvironmentPolicy`` and ``bash.passProviderKeys``: what subprocesses (the ``bash`` tool,
RPC ``bash``, ripgrep, MCP servers) inherit, so that a command such as ``env`` cannot copy
secrets into results, frames and session files (``omp.subprocess_env`` has the steps;
``Settings.environment_policy`` makes the policy). Like ``trustedProjects`` they are read from
the global file and the overlays only: a repository's own file must not be able to ask for
secrets (nor set ``BASH_ENV`` for every command).

Defaults are omp's (docs/design/agent-loop.md#backoff,
docs/design/sessions.md#settings-and-threshold, docs/design/sessions.md#when-compaction-runs); key
names are the original's.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..commands.skills import SkillSettings
from ..config import (
    ConfigError,
    agent_dir,
    present,
    problem,
    read_json_mapping,
    read_yaml_mapping,
    structure,
    warn,
)
from ..llm.types import (
    MAX_EVENT_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_MESSAGE_CHARS_LIMIT,
    MAX_RESPONSE_BYTES,
)
from ..protocol.frames import MAX_REASSEMBLED_FRAME_BYTES
from ..protocol.framing import DEFAULT_MAX_LINE_BYTES
from ..subprocess_env import EnvironmentPolicy
from ..tools.eval_settings import EvalSettings
from ..tools.eval_settings import validate as _validate_eval
from ..tools.lsp_settings import GLOBAL_ONLY_KEYS as _LSP_GLOBAL_ONLY
from ..tools.lsp_settings import ORIGINAL_KEYS as _LSP_ORIGINAL_KEYS
from ..tools.lsp_settings import LspSettings
from ..tools.lsp_settings import validate as _validate_lsp
from ..tools.web_settings import GLOBAL_ONLY_KEYS as _WEB_GLOBAL_ONLY
from ..tools.web_settings import WebSettings
from ..tools.web_settings import validate as _validate_web

GLOBAL_FILES = ("config.yml", "config.yaml")
LEGACY_FILES = ("settings.yml", "settings.yaml")
PROJECT_DIR = ".omp"
_EXPECTED = "a mapping of settings sections (compaction, retry, ...)"


class CompactionSettings(msgspec.Struct, kw_only=True):
    """``compaction.*``, omp's defaults (docs/design/sessions.md#settings-and-threshold,
    docs/design/sessions.md#when-compaction-runs)."""

    enabled: bool = True
    reserveTokens: int | None = None
    """Tokens kept free for the reply. ``None`` (omp's default): ``max(15% of the window,
    16384)``, see ``compaction.effective_reserve_tokens``."""
    keepRecentTokens: int = 20000
    """Roughly how many tokens of the newest messages a compaction keeps verbatim."""
    thresholdPercent: float = -1.0
    """Compact above this percentage of the context window when > 0 (clamped to 1..99)."""
    thresholdTokens: int = -1
    """Compact above this many context tokens when > 0 (clamped to 1..window-1)."""
    autoContinue: bool = True
    """After a threshold compaction that interrupted work, continue it."""
    midTurnEnabled: bool = True
    """Compact between two turns of one run when the threshold is crossed."""


class RetrySettings(msgspec.Struct, kw_only=True):
    """``retry.*``, omp's defaults (docs/design/agent-loop.md#backoff)."""

    enabled: bool = True
    maxRetries: int = 10
    """Retries of one failed turn before giving up (``maxAttempts`` of ``auto_retry_start``)."""
    baseDelayMs: int = 500
    """Backoff of the first retry; doubled per retry up to 8 s, with up to 25% jitter off."""
    maxDelayMs: int = 300_000
    """Longest ``retry-after`` wait honoured; a provider asking for more fails the retry."""


MAX_SESSION_LINE_BYTES = MAX_REASSEMBLED_FRAME_BYTES
"""The most ``stream.maxSessionLineBytes`` may be: the largest frame the output path allows."""
MIN_SESSION_LINE_BYTES = 64 * 1024
"""The least it may be (an entry's ids, and the head and note of each string kept aside,
must fit)."""


class StreamSettings(msgspec.Struct, kw_only=True):
    """Bounds on what a provider may send (ours; ``StreamOptions`` carries them to a call)."""

    maxEventBytes: int = MAX_EVENT_BYTES
    maxMessageChars: int = MAX_MESSAGE_CHARS
    idleTimeoutMs: int = 120_000
    """Without an event for this long, the stream counts as stalled (a retryable failure)."""
    maxResponseBytes: int = MAX_RESPONSE_BYTES
    maxSessionLineBytes: int = MAX_SESSION_LINE_BYTES - 1024 * 1024
    """The longest line of the session file (``omp.session.oversize``): a little under the
    largest frame, so that a message that fits it fits a frame with its envelope too."""
    sendMaxTokens: bool = True
    """Send the model's output limit with each request (``max_completion_tokens``,
    ``max_output_tokens``, ``maxOutputTokens``); false leaves it to the provider's default
    (Anthropic requires one: it is sent there all the same)."""


class BashPattern(msgspec.Struct, kw_only=True):
    """One ``bash.patterns`` rule (docs/guides/approval.md#tiers)."""

    match: str
    """A whole-command glob where only ``*`` is special (whitespace normalised)."""
    approval: Literal["allow", "deny", "prompt"]


class AutoBackgroundSettings(msgspec.Struct, kw_only=True):
    """``bash.autoBackground``: a ``bash`` call's command still running after ``thresholdMs``
    becomes a background job (``omp.session.jobs``; 0: at once)."""

    enabled: bool = True
    thresholdMs: int = 60_000


class BashSettings(msgspec.Struct, kw_only=True):
    autoBackground: AutoBackgroundSettings = msgspec.field(
        default_factory=AutoBackgroundSettings)
    passProviderKeys: bool = False
    """Subprocesses get the provider key variables too (global file only)."""
    patterns: list[BashPattern] = msgspec.field(default_factory=list)
    """Tool approval's bash rules, in order (global file and overlays only)."""
    allowCompoundCommands: bool = False
    """``a && b``: allowed when every segment matches an ``allow`` pattern."""


class ShellEnvironmentSettings(msgspec.Struct, kw_only=True):
    """The ``shellEnvironmentPolicy`` section (Codex's ``shell_environment_policy``, in this
    file's camelCase); ``omp.subprocess_env`` applies it."""

    inherit: Literal["all", "core", "none"] = "all"
    ignoreDefaultExcludes: bool = False
    exclude: list[str] = msgspec.field(default_factory=list)
    includeOnly: list[str] = msgspec.field(default_factory=list)
    set: dict[str, str] = msgspec.field(default_factory=dict)


class LocalModelsSettings(msgspec.Struct, kw_only=True):
    """Local model servers (Ollama, llama.cpp, LM Studio, vLLM) asked for their models."""

    enabled: bool = True
    timeoutMs: int = 1000
    """How long one server may take to accept and list its models."""
    servers: dict[str, str] = msgspec.field(default_factory=dict)
    """Provider → the server's OpenAI-compatible root (global file only: a repository must
    not be able to send our prompts to an address of its choosing)."""


class TaskSettings(msgspec.Struct, kw_only=True):
    """The ``task`` tool and its subagents (docs/design/subagents.md#settings)."""

    batch: bool = True
    """The model-facing schema is ``{context, tasks[]}``; false: one flat item per call."""
    maxConcurrency: int = 32
    """Children of one session running at once; 0 or negative: unlimited."""
    maxRecursionDepth: int = 2
    """How deep children may spawn children; -1: unlimited, 0: the main agent cannot spawn."""
    maxRuntimeMs: int = 0
    """Wall-clock cap per child (0: none)."""
    softRequestBudget: int = 200
    """Model requests per child before it is told to wrap up (0: none)."""
    softRequestBudgetNotice: bool = True
    disabledAgents: list[str] = msgspec.field(default_factory=list)
    """Agent names hidden from the tool description and refused at spawn."""
    agentModelOverrides: dict[str, Any] = msgspec.field(default_factory=dict)
    """Agent name → model pattern or list of patterns (``provider/id`` or ``id``), over the
    agent's own (checked in ``_validate``: the converter has no string-or-list type)."""


class AsyncSettings(msgspec.Struct, kw_only=True):
    """Background jobs (``omp.session.jobs``): detached ``task`` children
    (docs/design/subagents.md#settings) and ``bash`` with ``async: true``."""

    enabled: bool = True
    maxJobs: int = 100
    """Background jobs running at once (clamped to 1..100)."""


ApprovalMode = Literal["always-ask", "write", "yolo"]
APPROVAL_MODES: tuple[ApprovalMode, ...] = ("always-ask", "write", "yolo")
ApprovalPolicy = Literal["allow", "deny", "prompt"]
APPROVAL_POLICIES: tuple[ApprovalPolicy, ...] = ("allow", "deny", "prompt")


class ApprovalSettings(msgspec.Struct, kw_only=True):
    """Tool approval (docs/guides/approval.md#modes-and-policies): ``tools.approvalMode`` and
    ``tools.approval``."""

    mode: ApprovalMode = "yolo"
    """Which tiers run without asking (``--approval-mode`` overrides it)."""
    policies: dict[str, ApprovalPolicy] = msgspec.field(default_factory=dict)
    """``tools.approval``: tool name → allow / deny / prompt, honoured in every mode."""
    auto_approve: bool = False
    """``--auto-approve`` / ``--yolo``: every mode acts as ``yolo``."""


class TodoReminderSettings(msgspec.Struct, kw_only=True):
    """``todo.reminders`` / ``todo.remindersMax`` (docs/guides/approval.md#todo-reminders)."""

    enabled: bool = True
    max: int = 3


class TtsrSettings(msgspec.Struct, kw_only=True):
    """``ttsr.*`` (docs/guides/approval.md#rule-settings), the original's names and defaults."""

    enabled: bool = True
    contextMode: Literal["discard", "keep"] = "discard"
    interruptMode: Literal["always", "prose-only", "tool-only", "never"] = "always"
    repeatMode: Literal["once", "after-gap"] = "once"
    repeatGap: int = 10
    builtinRules: bool = True
    """Accepted; this runtime bundles no rules."""
    disabledRules: list[str] = msgspec.field(default_factory=list)


_TTSR_CHOICES: dict[str, tuple[str, ...]] = {
    "contextMode": ("discard", "keep"),
    "interruptMode": ("always", "prose-only", "tool-only", "never"),
    "repeatMode": ("once", "after-gap")}


class Settings(msgspec.Struct, kw_only=True):
    compaction: CompactionSettings = msgspec.field(default_factory=CompactionSettings)
    retry: RetrySettings = msgspec.field(default_factory=RetrySettings)
    task: TaskSettings = msgspec.field(default_factory=TaskSettings)
    async_: AsyncSettings = msgspec.field(default_factory=AsyncSettings)
    """The ``async`` section (a Python keyword, hence the underscore)."""
    skills: SkillSettings = msgspec.field(default_factory=SkillSettings)
    web: WebSettings = msgspec.field(default_factory=WebSettings)
    """The network policy of the web tools (``omp.tools.web_settings``); off by default."""
    eval: EvalSettings = msgspec.field(default_factory=EvalSettings)
    """The ``eval`` tool's kernel (``omp.tools.eval_settings``)."""
    lsp: LspSettings = msgspec.field(default_factory=LspSettings)
    """The ``lsp`` tool and its language servers (``omp.tools.lsp_settings``); off by
    default."""
    trusted_projects: tuple[Path, ...] = ()
    """Directories whose own code (project extensions, project agents) may run: the global
    file's ``trustedProjects``, ``~`` expanded. Never set from a project's file: a repository
    must not be able to declare itself trusted."""
    bash: BashSettings = msgspec.field(default_factory=BashSettings)
    environment: ShellEnvironmentSettings = msgspec.field(default_factory=ShellEnvironmentSettings)
    """The ``shellEnvironmentPolicy`` section (global file and overlays only)."""
    local_models: LocalModelsSettings = msgspec.field(default_factory=LocalModelsSettings)
    """The ``localModels`` section."""
    stream: StreamSettings = msgspec.field(default_factory=StreamSettings)
    """The ``stream`` section: bounds on what a provider may send."""
    disabled_providers: frozenset[str] = frozenset()
    """The original's ``disabledProviders``: context-file, MCP and rule sources left out
    (``agents-md``, ``claude``, ``native``, ``cursor``, ...)."""
    disabled_tools: frozenset[str] = frozenset()
    """Built-in tools a ``<tool>.enabled: false`` turned off."""
    enabled_tools: frozenset[str] = frozenset()
    """Built-in tools off by default that a ``<tool>.enabled: true`` turned on
    (``OPT_IN_SWITCHES``)."""
    enabled_providers: frozenset[str] = frozenset()
    """The original's ``enabledProviders``: other tools' user-level MCP files and rules that
    are read (``claude``, ``codex``, ``gemini``, ``cursor``, ``windsurf``; ``*`` / ``all``:
    every one)."""
    notes: tuple[str, ...] = ()
    """What the ``--config`` overlays set that this runtime does not act on, one line per
    file (said once as a ``notice``)."""
    approval: ApprovalSettings = msgspec.field(default_factory=ApprovalSettings)
    """``tools.approvalMode`` / ``tools.approval`` (global file and overlays only)."""
    todo_reminders: TodoReminderSettings = msgspec.field(default_factory=TodoReminderSettings)
    ttsr: TtsrSettings = msgspec.field(default_factory=TtsrSettings)
    xdev: bool = True
    """``tools.xdev`` (docs/guides/mcp.md#xd-devices): MCP tools are ``xd://`` devices driven
    through ``read`` / ``write`` rather than function tools sent to the model."""
    xdev_docs: str = "builtins"
    """``tools.xdevDocs``: ``inline`` puts every device's docs and schema in the system
    prompt; ``builtins`` and ``catalog`` list the devices (docs on demand)."""
    xdev_inline_devices: tuple[str, ...] = ()
    """``tools.xdevInlineDevices``: globs of device names whose docs the system prompt
    carries in ``builtins`` mode."""
    mcp_notifications: bool = False
    """``mcp.notifications`` (docs/guides/mcp.md#resource-updates): subscribe to the servers'
    resources and tell the model when they change."""
    mcp_notification_debounce_ms: int = 500
    """``mcp.notificationDebounceMs``: updates within this window are told together."""
    mcp_max_message_bytes: int = DEFAULT_MAX_LINE_BYTES
    """``mcp.maxMessageBytes``: the longest line (one JSON-RPC message) a stdio MCP server
    may write; a longer answer fails its call naming this limit."""

    def use_skills(self, skills: SkillSettings) -> None:
        """The ``skills`` section read again (``/reload-plugins``): the next skills load and
        command list use it, in every session these settings are shared with (its subagents)."""
        self.skills = skills

    def use_task_sections(self, task: TaskSettings, async_: AsyncSettings) -> None:
        """The ``task`` and ``async`` sections read again at a spawn
        (docs/design/subagents.md#settings): that spawn and every later one use them, in every
        session these settings are shared with."""
        self.task = task
        self.async_ = async_

    def environment_policy(self, provider_variables: frozenset[str]) -> EnvironmentPolicy:
        """The policy every subprocess of a session is started with: ``shellEnvironmentPolicy``
        and ``bash.passProviderKeys``, keeping ``provider_variables`` (the model registry's
        ``key_variables()``) out unless that lets them through."""
        e = self.environment
        return EnvironmentPolicy(
            inherit=e.inherit, ignore_default_excludes=e.ignoreDefaultExcludes,
            exclude=tuple(e.exclude), include_only=tuple(e.includeOnly),
            set=tuple(e.set.items()), provider_variables=provider_variables,
            pass_provider_keys=self.bash.passProviderKeys)


TOOL_SWITCHES = {"read": "read", "bash": "bash", "edit": "edit", "write": "write",
                 "grep": "grep", "search": "grep", "glob": "glob", "find": "find", "ls": "ls",
                 "todo": "todo",
                 "fetch": "web_fetch", "web_search": "web_search"}
"""``<key>.enabled`` → the built-in tool it turns off (the original calls grep ``search``
and its URL reading ``fetch``). ``true`` never turns a web tool on: ``web.enabled`` does."""

OPT_IN_SWITCHES = {"astGrep": "ast_grep", "astEdit": "ast_edit"}
"""``<key>.enabled`` → the built-in tool, off by default as in the original, that ``true``
turns on (``false`` turns it off again, also against ``--tools``)."""


def opted_in(provider: str, enabled: Collection[str], environ: Mapping[str, str]) -> bool:
    """Whether another tool's user-level files (MCP servers, rules) of ``provider`` are read:
    ``enabledProviders`` names it (or ``*`` / ``all``); Claude's also when
    ``CLAUDE_CONFIG_DIR`` is set."""
    if "*" in enabled or "all" in enabled or provider in enabled:
        return True
    return provider == "claude" and bool(environ.get("CLAUDE_CONFIG_DIR"))


def _fields(cls: type[msgspec.Struct]) -> dict[str, msgspec.structs.FieldInfo]:
    """A settings section's fields by key."""
    return {f.name: f for f in msgspec.structs.fields(cls)}


_SECTIONS: dict[str, type[Any]] = {"compaction": CompactionSettings, "retry": RetrySettings,
                                   "bash": BashSettings, "task": TaskSettings,
                                   "async": AsyncSettings, "skills": SkillSettings,
                                   "web": WebSettings, "eval": EvalSettings, "lsp": LspSettings,
                                   "shellEnvironmentPolicy": ShellEnvironmentSettings,
                                   "localModels": LocalModelsSettings,
                                   "stream": StreamSettings}
_ATTRIBUTE = {"async": "async_", "localModels": "local_models"}
"""Sections whose attribute name differs from their key (a Python keyword, or two words)."""
_GLOBAL_ONLY = {"bash": frozenset({"passProviderKeys", "patterns", "allowCompoundCommands"}),
                "web": _WEB_GLOBAL_ONLY, "lsp": _LSP_GLOBAL_ONLY,
                "shellEnvironmentPolicy": frozenset(_fields(ShellEnvironmentSettings)),
                "localModels": frozenset({"servers"})}
"""Keys a project's own file may not set (they would let a repository ask for secrets, send a
search key elsewhere, point the model at the user's private network, send our prompts to a
server of its choosing, approve its own commands, or start language servers, which may run its
build scripts, or a program of its choosing as one)."""

_NESTED: dict[tuple[str, str], type[msgspec.Struct]] = {
    ("bash", "autoBackground"): AutoBackgroundSettings}
"""Keys of a section that are sections themselves."""

# Keys of these sections that the original omp defines (its settings schema, across recent
# versions) and we do not model: a user's file may hold them, so they are no mistake.
_ORIGINAL_KEYS = {
    "compaction": frozenset({
        "strategy", "mode", "model", "modelContextWindow", "methodOrder", "handoffSaveToDisk",
        "remoteEnabled", "remoteStreamingV2Enabled", "remoteEndpoint",
        "v2RetainedMessageBudget", "asyncEnabled", "idleEnabled", "idleThresholdTokens",
        "idleTimeoutSeconds", "supersedeReads", "dropUseless"}),
    "retry": frozenset({
        "modelFallback", "fallbackChains", "fallbackRevertPolicy", "waitForUsageReset",
        "usageAwareFallback", "usageReservePct", "usageReservePolicy"}),
    "bash": frozenset(),
    "task": frozenset({
        "agentIdleTtlMs", "eager", "enableEffort", "maxEffort", "enableLsp",
        "agentServiceTierOverrides", "agentPrewalk", "agentAdvisor", "prewalk", "isolation"}),
    "async": frozenset(),
    "skills": frozenset(),
    "web": frozenset(),
    "eval": frozenset({"js", "autoProvision", "tools", "workpool", "autoBackground"}),
    "lsp": _LSP_ORIGINAL_KEYS,
    "shellEnvironmentPolicy": frozenset(),
    "localModels": frozenset(),
    "stream": frozenset(),
}


# The top-level keys of the original omp's config.yml (its settings schema: the first part of
# each setting's path, across recent versions, and the older files' keys). A user's file may
# hold any of them; none is a misspelling. Ours are ``_OWN_TOP_LEVEL``.
_ORIGINAL_TOP_LEVEL = frozenset({
    "advisor", "ask", "astEdit", "astGrep", "async", "auth", "autoResume",
    "autocompleteMaxVisible", "autolearn", "bash", "bashInterceptor", "branchSummary",
    "browser", "checkpoint", "codexResets", "collab", "collapseChangelog", "colorBlindMode",
    "commands", "commit", "compaction", "completion", "composer", "computer",
    "contextPromotion", "cycleOrder", "debug", "defaultThinkingLevel", "dev",
    "disabledExtensions", "disabledProviders", "display", "doubleEscapeAction", "edit",
    "emojiAutocomplete", "enabledModels", "enabledProviders", "env", "error", "eval", "exa",
    "extendedContext", "extensionHandlers", "extensions", "externalThinking", "features",
    "fetch", "followUpMode", "gc", "generate_image", "git", "github", "glob", "goal", "grep",
    "hideThinkingBlock", "hindsight", "images", "includeModelInPrompt",
    "includeWorkspaceTree", "inlineToolDescriptors", "interruptMode", "irc", "isolation",
    "lastChangelogVersion", "launch", "live", "loop", "lsp", "magicKeywords", "marketplace",
    "mcp", "memories", "memory", "minP", "mnemopi", "model", "modelProviderOrder",
    "modelRoleStorage", "modelRoles", "modelTags", "notifications", "omitThinking", "paste",
    "personality", "plan", "power", "presencePenalty", "prewalk", "proseOnlyThinking",
    "provider", "providers", "python", "queueMode", "read", "readLineNumbers", "recap",
    "repetitionPenalty", "retry", "searxng", "secrets", "security", "setupVersion", "share",
    "sharpshooter", "shellMinimizer", "shellPath", "showHardwareCursor", "skillful", "skills",
    "snapcompact", "speech", "speechgen", "spelling", "startup", "statusLine", "steeringMode",
    "stt", "symbolPreset", "task", "tasks", "temperature", "terminal", "textVerbosity",
    "theme", "thinkingBudgets", "tier", "title", "todo", "todoCompletion", "tools", "topK",
    "topP", "treeFilterMode", "tts", "ttsr", "tui", "update", "vault", "voice", "web_search",
    "workspace", "worktree"})
_OWN_TOP_LEVEL = frozenset({*_SECTIONS, *TOOL_SWITCHES, *OPT_IN_SWITCHES, "trustedProjects",
                            "disabledProviders", "enabledProviders", "tools", "ttsr", "todo",
                            "mcp"})
"""The top-level keys this runtime reads (``_SECTIONS``, ``_Extras``)."""
_KNOWN_TOP_LEVEL_SET = _ORIGINAL_TOP_LEVEL | _OWN_TOP_LEVEL
_KNOWN_TOP_LEVEL = sorted(_KNOWN_TOP_LEVEL_SET)


class _File(msgspec.Struct, kw_only=True):
    """What one settings file says about the keys we model (key names as the file has them)."""

    compaction: CompactionSettings = msgspec.field(default_factory=CompactionSettings)
    retry: RetrySettings = msgspec.field(default_factory=RetrySettings)
    bash: BashSettings = msgspec.field(default_factory=BashSettings)
    task: TaskSettings = msgspec.field(default_factory=TaskSettings)
    async_: AsyncSettings = msgspec.field(default_factory=AsyncSettings)
    skills: SkillSettings = msgspec.field(default_factory=SkillSettings)
    web: WebSettings = msgspec.field(default_factory=WebSettings)
    eval: EvalSettings = msgspec.field(default_factory=EvalSettings)
    lsp: LspSettings = msgspec.field(default_factory=LspSettings)
    shellEnvironmentPolicy: ShellEnvironmentSettings = msgspec.field(
        default_factory=ShellEnvironmentSettings)
    local_models: LocalModelsSettings = msgspec.field(default_factory=LocalModelsSettings)
    stream: StreamSettings = msgspec.field(default_factory=StreamSettings)
    trustedProjects: list[str] | None = None


class _Layer(msgspec.Struct):
    file: _File
    keys: dict[str, list[str]]
    """Per section, the keys this file sets (the others are its defaults, not its choice)."""
    ignored: list[str] = msgspec.field(default_factory=list)
    """Keys of the modelled sections that this runtime does not use (``section.key``)."""


def load_settings(agent_directory: Path | None = None, cwd: Path | None = None,
                  overlays: Sequence[Path] = ()) -> Settings:
    """The settings for a session in ``cwd``: the global file of the agent directory
    (``$OMP_AGENT_DIR`` or ``~/.omp/agent`` when None) with the project's files of ``cwd`` over
    it (none read when ``cwd`` is None), then the ``overlays`` (``--config``).

    No file: the defaults. A wrong one raises ConfigError naming it (nothing half-applied).
    """
    directory = agent_dir() if agent_directory is None else agent_directory
    layers: list[_Layer] = []
    trusted: tuple[Path, ...] = ()
    global_path = present(directory, GLOBAL_FILES)
    if global_path is None and (global_path := present(directory, LEGACY_FILES)) is not None:
        warn(f"{global_path}: read because there is no {GLOBAL_FILES[0]}; rename it to "
             f"{GLOBAL_FILES[0]} (where the original omp keeps its settings)")
    extras = _Extras()
    if global_path is not None:
        raw = read_yaml_mapping(global_path, _EXPECTED) or {}
        extras.read(raw, global_path)
        layer = _layer(raw, global_path)
        trusted = _trusted(layer.file.trustedProjects or [], global_path)
        layers.append(layer)
    if cwd is not None:
        readers: tuple[tuple[str, Callable[[Path, str], dict[Any, Any] | None]], ...] = (
            ("settings.json", read_json_mapping), ("config.yml", read_yaml_mapping))
        for name, read in readers:
            path = cwd / PROJECT_DIR / name
            if not os.path.lexists(path) or _same_file(path, global_path):
                continue
            raw = read(path, _EXPECTED) or {}
            # trustedProjects comes from the global file alone: a repository's own file must
            # never be able to mark itself (or anything else) trusted.
            if raw.pop("trustedProjects", None) is not None:
                warn(f"{path}: $.trustedProjects: ignored; only the global "
                     f"{directory / GLOBAL_FILES[0]} can trust projects")
            for section, global_only in _GLOBAL_ONLY.items():
                chosen = raw.get(section)
                if not isinstance(chosen, dict):
                    continue
                for key in sorted(global_only & set(chosen)):
                    del chosen[key]
                    warn(f"{path}: $.{section}.{key}: ignored; only the global "
                         f"{directory / GLOBAL_FILES[0]} can set it")
            extras.read(raw, path, project=True)
            layers.append(_layer(raw, path))
    for given in overlays:
        path = Path(os.path.abspath(given))
        if not os.path.lexists(path):
            raise ConfigError(f"Config overlay not found: {path}")
        raw = read_yaml_mapping(path, _EXPECTED) or {}
        unused = extras.read(raw, path)
        layer = _layer(raw, path)
        if unused or layer.ignored:
            extras.notes.append(f"{path}: not used by this runtime: "
                                f"{', '.join([*layer.ignored, *unused])}")
        if layer.file.trustedProjects is not None:
            trusted = _trusted(layer.file.trustedProjects, path)
        layers.append(layer)
    merged: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
    for layer in layers:
        for section, keys in layer.keys.items():
            values = getattr(layer.file, _ATTRIBUTE.get(section, section))
            for key in keys:
                outer, _, inner = key.partition(".")
                if inner:  # a key of a nested section: merged key by key
                    merged[section].setdefault(outer, {})[inner] = getattr(
                        getattr(values, outer), inner)
                else:
                    merged[section][key] = getattr(values, key)
    bash = merged["bash"]
    bash["autoBackground"] = AutoBackgroundSettings(**bash.get("autoBackground", {}))
    settings = Settings(compaction=CompactionSettings(**merged["compaction"]),
                        retry=RetrySettings(**merged["retry"]), trusted_projects=trusted,
                        bash=BashSettings(**merged["bash"]),
                        task=TaskSettings(**merged["task"]),
                        async_=AsyncSettings(**merged["async"]),
                        skills=SkillSettings(**merged["skills"]),
                        web=WebSettings(**merged["web"]),
                        eval=EvalSettings(**merged["eval"]), lsp=LspSettings(**merged["lsp"]),
                        environment=ShellEnvironmentSettings(
                            **merged["shellEnvironmentPolicy"]),
                        local_models=LocalModelsSettings(**merged["localModels"]),
                        stream=StreamSettings(**merged["stream"]),
                        disabled_providers=frozenset(extras.disabled_providers),
                        enabled_providers=frozenset(extras.enabled_providers),
                        disabled_tools=frozenset(extras.disabled_tools),
                        enabled_tools=frozenset(extras.enabled_tools),
                        notes=tuple(extras.notes), approval=extras.approval,
                        todo_reminders=extras.todo_reminders, ttsr=extras.ttsr,
                        xdev=extras.xdev, xdev_docs=extras.xdev_docs,
                        xdev_inline_devices=tuple(extras.xdev_inline_devices),
                        mcp_notifications=extras.mcp_notifications,
                        mcp_notification_debounce_ms=extras.mcp_notification_debounce_ms,
                        mcp_max_message_bytes=extras.mcp_max_message_bytes)
    return settings


XDEV_DOCS = ("builtins", "inline", "catalog")


class _Extras(msgspec.Struct):
    """The top-level keys beyond the modelled sections, gathered over the files in order."""

    disabled_providers: list[str] = msgspec.field(default_factory=list)
    enabled_providers: list[str] = msgspec.field(default_factory=list)
    disabled_tools: set[str] = msgspec.field(default_factory=set)
    enabled_tools: set[str] = msgspec.field(default_factory=set)
    notes: list[str] = msgspec.field(default_factory=list)
    approval: ApprovalSettings = msgspec.field(default_factory=ApprovalSettings)
    todo_reminders: TodoReminderSettings = msgspec.field(default_factory=TodoReminderSettings)
    ttsr: TtsrSettings = msgspec.field(default_factory=TtsrSettings)
    xdev: bool = True
    xdev_docs: str = "builtins"
    xdev_inline_devices: list[str] = msgspec.field(default_factory=list)
    mcp_notifications: bool = False
    mcp_notification_debounce_ms: int = 500
    mcp_max_message_bytes: int = DEFAULT_MAX_LINE_BYTES

    def read(self, raw: dict[Any, Any], path: Path, *, project: bool = False) -> list[str]:
        """Take what ``raw`` (the file ``path``; ``project``: a project's own file) says;
        returns the other keys outside the modelled sections, as dotted paths."""
        unused: list[str] = []
        for key, value in raw.items():
            name = str(key)
            _check_top_level(name, path)
            if name in _SECTIONS or name == "trustedProjects":
                continue
            if name in ("disabledProviders", "enabledProviders"):
                if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                    raise problem(path, f"$.{name}", "must be a list of names")
                if name == "disabledProviders":
                    self.disabled_providers = list(value)
                elif project:
                    # A repository must not make us read the user's other tools' files.
                    warn(f"{path}: $.enabledProviders: ignored; set it in the global "
                         "config.yml or a --config file")
                else:
                    self.enabled_providers = list(value)
                continue
            for dotted, leaf in _leaves(name, value):
                if project and dotted.startswith(("tools.approval", "tools.approvalMode")):
                    # A repository must not be able to wave its own tool calls through.
                    warn(f"{path}: $.{dotted}: ignored; tool approval is set in the global "
                         "config.yml or a --config file only")
                    continue
                if not self._take(dotted, leaf, path):
                    unused.append(dotted)
        return unused

    def _take(self, dotted: str, value: Any, path: Path) -> bool:
        """Whether ``dotted`` = ``value`` is a key this runtime acts on (then it did)."""
        head, _, tail = dotted.partition(".")
        if dotted == "tools.approval" and value in ({}, None):
            return True
        if head == "tools" and tail.startswith("approval."):
            tool = tail.removeprefix("approval.")
            policy = value.strip().lower() if isinstance(value, str) else None
            if policy not in APPROVAL_POLICIES:
                # The original ignores such a value; we say so.
                warn(f"{path}: $.tools.approval.{tool}: ignored; expected allow, deny or "
                     f"prompt (got {value!r})")
                return True
            self.approval.policies[tool] = policy
            return True
        if head == "ttsr" and tail in _fields(TtsrSettings):
            self._ttsr(tail, value, path)
            return True
        if dotted == "ttsr.disabledRules" and value == {}:
            return True
        if dotted == "todo.reminders":
            if not isinstance(value, bool):
                raise problem(path, "$.todo.reminders", f"expected true or false (got {value!r})")
            self.todo_reminders.enabled = value
            return True
        if dotted == "tools.xdev":
            if not isinstance(value, bool):
                raise problem(path, "$.tools.xdev", f"expected true or false (got {value!r})")
            self.xdev = value
            return True
        if dotted == "tools.xdevDocs":
            if value not in XDEV_DOCS:
                raise problem(path, "$.tools.xdevDocs", f"expected one of "
                              f"{', '.join(XDEV_DOCS)} (got {value!r})")
            self.xdev_docs = value
            return True
        if dotted == "tools.xdevInlineDevices":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise problem(path, "$.tools.xdevInlineDevices",
                              f"expected a list of names or globs (got {value!r})")
            self.xdev_inline_devices = list(value)
            return True
        if dotted == "mcp.notifications":
            if not isinstance(value, bool):
                raise problem(path, "$.mcp.notifications", f"expected true or false (got "
                              f"{value!r})")
            self.mcp_notifications = value
            return True
        if dotted == "mcp.notificationDebounceMs":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise problem(path, "$.mcp.notificationDebounceMs",
                              f"expected a whole number of 0 or more (got {value!r})")
            self.mcp_notification_debounce_ms = value
            return True
        if dotted == "mcp.maxMessageBytes":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise problem(path, "$.mcp.maxMessageBytes",
                              f"expected a whole number of 1 or more (got {value!r})")
            self.mcp_max_message_bytes = value
            return True
        if dotted == "todo.remindersMax":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise problem(path, "$.todo.remindersMax",
                              f"expected a whole number of 0 or more (got {value!r})")
            self.todo_reminders.max = value
            return True
        if tail == "enabled" and head in TOOL_SWITCHES and isinstance(value, bool):
            tool = TOOL_SWITCHES[head]
            if value:
                self.disabled_tools.discard(tool)
            else:
                self.disabled_tools.add(tool)
            return True
        if tail == "enabled" and head in OPT_IN_SWITCHES:
            if not isinstance(value, bool):
                raise problem(path, f"$.{dotted}", f"expected true or false (got {value!r})")
            tool = OPT_IN_SWITCHES[head]
            (self.enabled_tools.add if value else self.enabled_tools.discard)(tool)
            (self.disabled_tools.discard if value else self.disabled_tools.add)(tool)
            return True
        if dotted == "tools.approvalMode":
            if value not in APPROVAL_MODES:
                raise problem(path, "$.tools.approvalMode", "must be one of always-ask, write, "
                              f"yolo (got {value!r})")
            self.approval.mode = value
            return True
        return False


    def _ttsr(self, key: str, value: Any, path: Path) -> None:
        where = f"$.ttsr.{key}"
        if key in ("enabled", "builtinRules"):
            if not isinstance(value, bool):
                raise problem(path, where, f"expected true or false (got {value!r})")
        elif key == "repeatGap":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise problem(path, where, f"expected a whole number of 1 or more (got {value!r})")
        elif key == "disabledRules":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise problem(path, where, "must be a list of rule names")
        elif value not in _TTSR_CHOICES[key]:
            raise problem(path, where, f"must be one of {', '.join(_TTSR_CHOICES[key])} "
                          f"(got {value!r})")
        setattr(self.ttsr, key, value)


def _check_top_level(name: str, path: Path) -> None:
    """Say on stderr that a top-level key neither we nor the original know is ignored (most
    likely a typo: ``compactoin``), naming the closest known key when one is close."""
    head = name.partition(".")[0]  # a dotted key counts as its parts
    if head in _KNOWN_TOP_LEVEL_SET:
        return
    import difflib  # only for a key that is wrong

    close = difflib.get_close_matches(head, _KNOWN_TOP_LEVEL, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    warn(f"{path}: $.{name}: unknown key ignored{hint}")


def _leaves(prefix: str, value: Any) -> list[tuple[str, Any]]:
    """``a: {b: {c: 1}}`` as ``[("a.b.c", 1)]``; a dotted key counts as its parts."""
    if isinstance(value, dict) and value:
        out: list[tuple[str, Any]] = []
        for key, inner in value.items():
            out += _leaves(f"{prefix}.{key}", inner)
        return out
    return [(prefix, value)]


def _layer(raw: dict[Any, Any], path: Path) -> _Layer:
    """One file's values for the keys we model, type-checked; unknown sections dropped."""
    known: dict[str, Any] = {}
    keys: dict[str, list[str]] = {}
    ignored: list[str] = []
    for section, cls in _SECTIONS.items():
        value = raw.get(section)
        if value is None:  # absent, or `retry:` with every key commented out
            continue
        if not isinstance(value, dict):
            # the converter names it: "expected a mapping"
            known[_ATTRIBUTE.get(section, section)] = value
            continue
        fields = _fields(cls)
        unknown = [str(k) for k in value if k not in fields and k not in _ORIGINAL_KEYS[section]]
        ignored += [f"{section}.{k}" for k in value if k not in fields]
        if unknown:
            warn(f"{path}: $.{section}: unknown key(s) ignored: {', '.join(sorted(unknown))}")
        chosen = {k: v for k, v in value.items()
                  if k in fields and (v is not None or fields[k].default is None)}
        known[_ATTRIBUTE.get(section, section)] = chosen
        keys[section] = []
        for key, inner in chosen.items():
            nested = _NESTED.get((section, key))
            if nested is None or not isinstance(inner, dict):
                keys[section].append(key)
                continue
            # A nested section's keys are merged one by one, like a section's.
            inner_fields = _fields(nested)
            stray = sorted(str(k) for k in inner if k not in inner_fields)
            if stray:
                warn(f"{path}: $.{section}.{key}: unknown key(s) ignored: {', '.join(stray)}")
            chosen[key] = {k: v for k, v in inner.items() if k in inner_fields and v is not None}
            keys[section] += [f"{key}.{k}" for k in chosen[key]]
    if "trustedProjects" in raw:
        known["trustedProjects"] = raw["trustedProjects"]
    file = structure(known, _File, path)
    _validate(file, path)
    return _Layer(file, keys, ignored)


def _trusted(entries: list[str], path: Path) -> tuple[Path, ...]:
    trusted = []
    for i, entry in enumerate(entries):
        expanded = Path(entry).expanduser() if entry else Path()
        if not expanded.is_absolute():
            raise problem(path, f"$.trustedProjects[{i}]", "must be an absolute path or start "
                          f"with ~ (got {entry!r})")
        trusted.append(Path(os.path.normpath(expanded)))
    return tuple(trusted)


def _same_file(path: Path, other: Path | None) -> bool:
    # An agent directory that is the project's .omp (OMP_AGENT_DIR=<cwd>/.omp): one file, one
    # layer, and the global one (it may trust projects).
    try:
        return other is not None and os.path.samefile(path, other)
    except OSError:
        return False


def _validate(file: _File, path: Path) -> None:
    c, r = file.compaction, file.retry
    if c.reserveTokens is not None and c.reserveTokens <= 0:
        raise problem(path, "$.compaction.reserveTokens", "must be greater than 0, got "
                      f"{c.reserveTokens} (or null for the automatic reserve)")
    checks: tuple[tuple[str, int], ...] = (
        ("compaction.keepRecentTokens", c.keepRecentTokens),
        ("retry.maxRetries", r.maxRetries), ("retry.baseDelayMs", r.baseDelayMs),
        ("retry.maxDelayMs", r.maxDelayMs))
    if file.task.maxRecursionDepth < -1:
        raise problem(path, "$.task.maxRecursionDepth",
                      f"must be -1 (unlimited) or more, got {file.task.maxRecursionDepth}")
    for name, patterns in file.task.agentModelOverrides.items():
        if not (isinstance(patterns, str) or (isinstance(patterns, list) and all(
                isinstance(p, str) for p in patterns))):
            raise problem(path, f"$.task.agentModelOverrides.{name}",
                          "must be a model pattern or a list of them")
    checks += (("task.maxRuntimeMs", file.task.maxRuntimeMs),
               ("bash.autoBackground.thresholdMs", file.bash.autoBackground.thresholdMs),
               ("task.softRequestBudget", file.task.softRequestBudget),
               ("localModels.timeoutMs", file.local_models.timeoutMs))
    for name, url in file.local_models.servers.items():
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise problem(path, f"$.localModels.servers.{name}",
                          f"must be an http(s) URL such as http://127.0.0.1:11434/v1, got {url!r}")
    for where, value in checks:
        if value < 0:
            raise problem(path, f"$.{where}", f"must not be negative, got {value}")
    for key in _fields(StreamSettings):
        if key != "sendMaxTokens" and (value := getattr(file.stream, key)) < 1:
            raise problem(path, f"$.stream.{key}", f"must be 1 or more, got {value}")
    line = file.stream.maxSessionLineBytes
    if not MIN_SESSION_LINE_BYTES <= line <= MAX_SESSION_LINE_BYTES:
        raise problem(path, "$.stream.maxSessionLineBytes",
                      f"must be from {MIN_SESSION_LINE_BYTES} to {MAX_SESSION_LINE_BYTES} (the "
                      f"largest frame), got {line}")
    if file.stream.maxMessageChars > MAX_MESSAGE_CHARS_LIMIT:
        raise problem(path, "$.stream.maxMessageChars",
                      f"must be at most {MAX_MESSAGE_CHARS_LIMIT} (its session-file line must "
                      f"fit the largest frame), got {file.stream.maxMessageChars}")
    for where, what in [*_validate_web(file.web), *_validate_eval(file.eval)]:
        raise problem(path, where, what)
    for where, what in _validate_lsp(file.lsp):
        raise problem(path, where, what)
    _validate_environment(file.shellEnvironmentPolicy, path)


def _validate_environment(policy: ShellEnvironmentSettings, path: Path) -> None:
    # What exec would refuse at every start (or take apart) is refused here, once, by name.
    for key in ("exclude", "includeOnly"):
        for i, pattern in enumerate(getattr(policy, key)):
            if not pattern or "\0" in pattern:
                raise problem(path, f"$.shellEnvironmentPolicy.{key}[{i}]",
                              f"must be a non-empty name pattern (got {pattern!r})")
    for name, value in policy.set.items():
        if not name or "=" in name or "\0" in name:
            raise problem(path, f"$.shellEnvironmentPolicy.set.{name}",
                          "a variable name must be non-empty, without '=' or NUL")
        if "\0" in value:
            raise problem(path, f"$.shellEnvironmentPolicy.set.{name}",
                          "a value must not contain NUL")

