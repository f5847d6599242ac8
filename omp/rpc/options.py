"""``ServeOptions``: how one ``serve()`` behaves (``omp --mode rpc``'s flags, for embedding)."""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..protocol.framing import DEFAULT_MAX_LINE_BYTES
from ..session.aborts import AbortRegistry
from ..session.approval import ApprovePolicy
from ..session.settings import ApprovalMode
from .commands import CustomHandler
from .output import DEFAULT_SPILL_LIMIT


# A Struct: defining it costs nothing at startup, where an attrs class compiles an __init__ and
# a __repr__ of every field (omp.lazy). eq=False: options hold callables and handlers, whose
# equality means nothing.
class ServeOptions(msgspec.Struct, eq=False):
    """How ``serve`` behaves; every field has the default ``omp --mode rpc`` uses."""

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    """Longest accepted input line; a longer one is answered with an error and skipped."""
    output_high_water_bytes: int = 1024 * 1024
    """Unsent output above which streaming producers wait for the host to read."""
    output_memory_bytes: int = 8 * 1024 * 1024
    """Unsent output kept in memory; more (a host that writes but does not read) goes to a
    private temp file until the host catches up."""
    output_spill_bytes: int = DEFAULT_SPILL_LIMIT
    """Largest size of that temp file (1 GiB). Reaching it ends ``serve`` like a broken stdout
    (``OutputClosedError``; ``omp`` exits 1 with one line on stderr): frames are never
    dropped silently."""
    provider: str | None = None
    """Provider to start with (``--provider``); default: the first one with a key."""
    model: str | None = None
    """Model to start with, ``provider/id`` or ``id``, with an optional ``:<thinking level>``
    (``--model``)."""
    models: Sequence[str] | None = None
    """``--models``: the first of these found is the model to start with when ``model`` is
    not given."""
    api_key: str | None = None
    """Key for the chosen provider (``--api-key``); never written anywhere."""
    thinking: str | None = None
    """Thinking level to start with (``--thinking``); ``auto``: the model's default effort."""
    agent_dir: Path | None = None
    """Where models.yml and auth.json live; default ``$OMP_AGENT_DIR`` or ``~/.omp/agent``."""
    system_prompt: str | None = None
    """Replaces the built-in instructions (``--system-prompt``)."""
    append_system_prompt: str | None = None
    """Added to the system prompt (``--append-system-prompt``)."""
    persist: bool = True
    """Keep the session in a file (``--no-session``: False)."""
    session: Path | None = None
    """``--session FILE``: continue (or start) the session in that file."""
    resume: bool = False
    """``--continue``: continue the newest session of the cwd."""
    resume_session: str | None = None
    """``-r/--resume``: a session file path (created when missing), or a session id or a unique
    prefix of one, looked up in this project's sessions, then in every project's."""
    session_dir: Path | None = None
    """``--session-dir``: where session files go."""
    tools: list[str] | None = None
    """Built-in tools to offer, by name (``--tools``); None: all, ``[]``: none."""
    cwd: Path | None = None
    """Where tools work and context files are looked up; default: the process's cwd."""
    announce_offline: bool = True
    """Say once on stderr when no key exists and the offline model is used."""
    commands: Mapping[str, CustomHandler] = msgspec.field(default_factory=dict)
    """Extra commands for embedding hosts: ``type`` → async handler of the command (a
    ``CustomCommand``: ``type``, ``id``, ``params`` the whole JSON object as sent); its return
    value becomes the response's ``data``, an exception its ``error``. They run in the
    serial lane like built-in commands. Built-in names cannot be replaced."""
    extensions: Sequence[Path] = ()
    """Extension modules, packages or folders to load (``--extension`` / ``-e``)."""
    extension_objects: Sequence[Callable[[Any], Any] | types.ModuleType] = ()
    """Extensions as Python objects (embedding hosts): ``setup`` functions or modules."""
    discover_extensions: bool = True
    """Load the user's, the project's and installed extensions (``--no-extensions``: False)."""
    trust_project: bool = False
    """Run code from the project in ``cwd`` (its ``.omp/extensions``) (``--trust-project``); the
    global config.yml's ``trustedProjects`` trusts projects too."""
    ui: bool = True
    """Extension dialogs reach the host (``--no-ui``: False, dialogs return defaults)."""
    ask_tool: bool = False
    """Offer the model the ``ask`` tool, whose questions go to the host (``--mode rpc-ui``)."""
    config_files: Sequence[Path] = ()
    """Settings files merged over ``config.yml``, later ones winning (``--config``)."""
    plugin_dirs: Sequence[Path] = ()
    """Plugin directories (``--plugin-dir``): their ``extensions`` folder loads like ``-e``,
    their ``skills`` folder is searched first for skills; TypeScript code elsewhere in them is
    skipped."""
    skills: Sequence[str] | bool | None = None
    """``--no-skills`` (False: none), ``--skills`` (glob patterns: only those), None: as the
    settings say."""
    mcp_servers: Mapping[str, Mapping[str, Any]] = msgspec.field(default_factory=dict)
    """MCP servers given by an embedding host, ``name`` → an entry as in ``mcp.json``
    (``{"command": ..., "args": [...]}`` or ``{"url": ...}``); they win over the files'."""
    rules: bool = True
    """Rules (``omp.session.rule_sources``: ``<agent dir>/rules`` and ``RULES.md``, a trusted
    project's ``.omp/rules``, ``RULES.md`` and other tools' rule folders) watch the model's
    stream or join the system prompt (``--no-rules``: False)."""
    approval_mode: ApprovalMode | None = None
    """``--approval-mode``: over ``tools.approvalMode`` for this process
    (docs/guides/approval.md#modes-and-policies)."""
    auto_approve: bool = False
    """``--auto-approve`` / ``--yolo``: every tool runs without asking, whatever the mode
    (``tools.approval.<tool>: deny`` / ``prompt`` still apply)."""
    approve: ApprovePolicy | None = None
    """Embedding: an async ``(ApprovalRequest) -> bool`` asked in place of the host's
    ``Approve`` / ``Deny`` dialog when a call needs approval."""
    deadline: float | None = None
    """``--max-time``: the ``time.monotonic()`` at which the run going is aborted (``Deadline
    exceeded``) and no other one starts."""
    on_ready: Callable[[], object] | None = None
    """Called once ``ready`` has reached the host (or after at most half a second of a host
    that does not read), before the start's work that follows it: the ``omp`` command turns
    the garbage collector on there (``omp.cli``)."""
    aborts: AbortRegistry | None = None
    """The registry of this ``serve()``'s abortable work (what ``abort``, ``abort_bash`` and
    shutdown cancel); None: a new one. A test or an embedding program may pass its own to see
    what is in flight (``AbortRegistry.in_flight``). One registry serves one ``serve()``."""
