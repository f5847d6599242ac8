"""The Tool protocol: what the agent loop runs when the model calls a tool.

A tool is an instance of a ``Tool`` subclass: a name, a label for humans, a description and a
JSON-schema ``parameters`` object for the model, and ``execute``; and, with defaults, what a tool
may add to how the loop handles its calls (``concurrency``, ``lenient_arguments``,
``abort_text``, ``prepare_arguments``, ``open_call``, ``approval_tier``).

``concurrency`` is the original's scheduling mode of a call (``omp.agent.loop`` applies it):
``shared`` (the default) runs beside the other calls of its batch; ``exclusive`` waits for every
call before it and holds back every call after it. A tool declares it per call, from the call's
arguments (``bash`` is exclusive only with ``pty``).

The loop validates the arguments against ``parameters`` before ``execute`` runs, so a tool gets
a dict that matches its schema. A tool reports failure by raising ``ToolError`` (its message is
what the model reads, as an error result); any other exception is a bug and is reported the
same way with its type name. Cancellation is the abort: ``execute`` must let ``trio.Cancelled``
propagate and clean up on the way out (subprocesses killed and waited for).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

import msgspec
import trio

from ..protocol.messages import ImageContent, TextContent
from ..subprocess_env import DEFAULT_POLICY, EnvironmentPolicy

if TYPE_CHECKING:
    from ..commands.skills import Skill
    from .eval_settings import EvalSettings
    from .lsp_settings import LspSettings
    from .web_policy import WebAccess

ResultContent = TextContent | ImageContent


class ToolResult(msgspec.Struct, frozen=True):
    content: list[ResultContent]
    details: Any = None
    """Metadata for hosts (diffs, truncation, paths); never sent to the model."""

    @classmethod
    def text(cls, text: str, details: Any = None) -> ToolResult:
        return cls([TextContent(text=text)], details)


class ToolError(Exception):
    """A failure the model should read; ``details`` goes to hosts with the error result."""

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.details = details


OnUpdate = Callable[[ToolResult], Awaitable[None]]
"""Streams a partial result (``tool_execution_update``); awaiting it may wait for the host."""


Concurrency = Literal["shared", "exclusive"]
"""How a call runs beside the other calls of its batch (``Tool.concurrency``)."""
ConcurrencyRule = Concurrency | Callable[[dict[str, Any]], Concurrency]
"""A tool's declared mode: one for every call, or a function of the call's arguments."""


def concurrency_of(rule: ConcurrencyRule, args: dict[str, Any]) -> Concurrency:
    """The mode ``rule`` gives a call with ``args`` (a rule's exception propagates: the loop
    then runs the call ``exclusive``, the safe mode, as the original does)."""
    return rule(args) if callable(rule) else rule


Tier = Literal["read", "write", "exec"]
"""How much a call may change (docs/guides/approval.md#tiers): which approval mode runs it without
asking (``always-ask``: ``read``; ``write``: ``read`` and ``write``; ``yolo``: all)."""
TierRule = Tier | Callable[[dict[str, Any]], Tier]
"""A tool's declared tier: one for every call, or a function of the call's arguments."""


def tier_of(rule: TierRule, args: dict[str, Any]) -> Tier:
    """The tier ``rule`` gives a call with ``args``."""
    return rule(args) if callable(rule) else rule


class Tool(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]: ...

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Run the call. Raises ToolError for failures the model should see.

        ``steered`` is set once the user steers while the call's batch runs (``interruptMode:
        immediate``): a tool that can hand its work to the background without losing it
        (``bash``: its command becomes a background job) returns early; any other ignores it.

        On cancellation (abort), stops at once, cleans up (kills and waits for any subprocess)
        and lets ``Cancelled`` propagate.
        """
        ...

    # What a tool may add to the loop's handling of its calls. Every tool class subclasses
    # ``Tool`` and so has these defaults; a tool that needs one overrides it.

    def concurrency(self, args: dict[str, Any]) -> Concurrency:
        """How the call with ``args`` (as prepared) runs beside the other calls of its batch;
        undeclared: ``shared``."""
        return "shared"

    lenient_arguments: bool = False
    """True: the loop does not hold the call to ``parameters`` (the tool checks its own
    arguments, with its own texts)."""

    @property
    def abort_text(self) -> str | None:
        """The aborted call's result text in the tool's own words; None: the loop's."""
        return None

    def prepare_arguments(self, args: dict[str, Any]) -> dict[str, Any]:
        """Rewrite older argument forms before validation (hosts see the result)."""
        return args

    def approval_tier(self, args: dict[str, Any]) -> Tier:
        """The call's approval tier (``omp.session.approval``); undeclared: ``exec``."""
        return "exec"

    def command_rules(self) -> bool:
        """True for the built-in ``bash`` only: its ``command`` is judged by ``bash.patterns``
        and the critical-command list. A tool of another origin named ``bash`` (an
        extension's, a host's) is judged by its own tier, as in the original
        (docs/guides/approval.md#tiers)."""
        return False

    def open_call(self, call_id: str, args: dict[str, Any]) -> None:
        """Called once the arguments are valid, before ``tool_execution_start`` (a host tool
        writes its request here)."""
        return None


class UriResource(msgspec.Struct, frozen=True, kw_only=True):
    """What a host returned for a read of one of its URLs."""

    content: str
    content_type: str = "text/plain"
    notes: tuple[str, ...] = ()
    immutable: bool = False


class UriHandler(Protocol):
    """Serves ``scheme://`` URLs a host owns (``set_host_uri_schemes``)."""

    def owns(self, url: str) -> bool:
        """Whether ``url`` belongs to a registered scheme."""
        ...

    def writable(self, url: str) -> bool: ...

    async def read(self, url: str) -> UriResource:
        """Raises ToolError with the host's message on failure. On cancellation the host is
        told (``host_uri_cancel``) and ``Cancelled`` propagates."""
        ...

    async def write(self, url: str, content: str) -> None:
        """As ``read``. On cancellation the host is told (``host_uri_cancel``) and
        ``Cancelled`` propagates; the host may have written ``content`` already."""
        ...


class Devices(Protocol):
    """Serves ``xd://`` device paths (docs/guides/mcp.md#xd-devices: MCP tools mounted as devices):
    ``read`` gives a device's docs (or the list), ``write`` of a JSON object executes it."""

    def for_subagent(self) -> Devices:
        """The devices as a subagent of this session drives them."""
        ...

    def approval(self, url: str, content: object) -> tuple[Tier, str | None]:
        """What the approval gate weighs for writing ``content`` to ``url``
        (docs/guides/approval.md#tiers): the device's own tier on the parsed arguments and its name
        as the user policy's key; ``("exec", None)`` for content that is no JSON object or a device
        not mounted."""
        ...

    async def read(self, url: str) -> ToolResult:
        """Raises ToolError naming what is wrong. Answered from what is mounted, without
        waiting (``McpDevices``: not even a checkpoint), so there is nothing for cancellation
        to cut short; an implementation that waits must let ``Cancelled`` propagate."""
        ...

    async def write(self, call_id: str, url: str, content: str, *,
                    on_update: OnUpdate) -> ToolResult:
        """Execute the device with ``content`` (a JSON object) as its arguments. Raises
        ToolError (bad arguments, unknown device, the tool's failure). On cancellation the
        call is cancelled as a direct call would be and ``Cancelled`` propagates."""
        ...


DEVICE_SCHEME = "xd://"


class EditorFiles(Protocol):
    """Files as an editor has them (ACP ``fs/read_text_file`` / ``fs/write_text_file``:
    unsaved buffers included); ``read`` and ``write`` use it for text files when the session
    has one."""

    async def read_text(self, path: Path) -> str:
        """The whole text of ``path`` (absolute). Raises ToolError with the editor's message.
        On cancellation the question is abandoned."""
        ...

    async def write_text(self, path: Path, content: str) -> None:
        """As ``read_text``. On cancellation the question is abandoned (a late answer is
        ignored; the editor may still write the file) and ``Cancelled`` propagates."""
        ...


class TerminalOutput(msgspec.Struct, frozen=True):
    """What an editor's terminal printed so far (ACP ``terminal/output``)."""

    output: str
    truncated: bool
    """The editor dropped the beginning (over ``outputByteLimit``)."""


class TerminalExit(msgspec.Struct, frozen=True):
    """How an editor's terminal command ended (ACP ``terminal/wait_for_exit``)."""

    exit_code: int | None
    signal: str | None
    """The signal's name (``SIGTERM``) when a signal ended it."""


class EditorTerminals(Protocol):
    """Commands run in the editor's terminals (ACP ``terminal/*``); ``bash`` uses them when
    the session has them. Each method raises ToolError with the editor's message; on
    cancellation the question is abandoned (a late answer is ignored)."""

    async def create(self, command: str, args: list[str], cwd: Path,
                     output_byte_limit: int) -> str:
        """Start ``command args`` in ``cwd``; the terminal's id. On cancellation the question
        is abandoned and ``Cancelled`` propagates; a terminal the editor creates anyway must
        not be left running: the implementation releases it once its id arrives (nobody else
        knows it)."""
        ...

    async def output(self, terminal_id: str) -> TerminalOutput:
        """What the terminal printed so far. On cancellation the question is abandoned (a
        late answer is ignored) and ``Cancelled`` propagates."""
        ...

    async def wait_for_exit(self, terminal_id: str) -> TerminalExit:
        """Until the terminal's command exits; its exit status. On cancellation the wait is
        abandoned, the command keeps running (``kill`` / ``release`` end it) and
        ``Cancelled`` propagates."""
        ...

    async def kill(self, terminal_id: str) -> None:
        """End the command; the terminal stays until ``release``. On cancellation the
        question is abandoned (the editor may still kill it) and ``Cancelled`` propagates;
        ``bash`` sends its cleanup ``kill`` and ``release`` shielded, with a deadline."""
        ...

    async def release(self, terminal_id: str) -> None:
        """Kill the command if it still runs and free the terminal. On cancellation the
        question is abandoned (the editor may still release it) and ``Cancelled``
        propagates."""
        ...


class RulebookRule(msgspec.Struct, frozen=True):
    """A rule the model reads on demand (docs/guides/approval.md#rulebook-rules, the original's
    "rulebook": a rule file with a ``description`` and no condition): listed in the system prompt,
    served by ``read rule://<name>``."""

    name: str
    description: str
    content: str
    """The body, without its frontmatter."""
    path: Path


RULE_URI_SCHEME = "rule://"

_URL_LIKE = r"^[A-Za-z][A-Za-z0-9+.-]*://"


def url_like(path: str) -> bool:
    """``path`` is a URL (``scheme://...``): served by the host or refused, never a local file."""
    return re.match(_URL_LIKE, path) is not None


JobStatus = Literal["completed", "failed", "cancelled"]
T = TypeVar("T")
T_in = TypeVar("T_in", contravariant=True)


class JobRefused(Exception):
    """Nothing could become a background job: ``async.maxJobs`` jobs run, or the session is
    closing. The message says which (the original's words for the limit)."""


class Settled(msgspec.Struct, frozen=True):
    """How a background job ended: what the model is told of it."""

    text: str
    status: JobStatus = "completed"
    duration_ms: float = 0.0
    output_file: Path | None = None
    """The file that keeps the job's whole output (a command's): the delivery names it."""


class HandOff(Protocol[T_in]):
    """How work started with ``BackgroundJobs.hand_off`` decides, once, where it ends."""

    def finish(self, value: T_in) -> None:
        """It ended inside the call: ``hand_off`` returns ``value``; the work returns now."""

    def background(self, type: str, label: str, value: Callable[[str], T_in]) -> bool:
        """It leaves the call as a new job: ``hand_off`` returns ``value(job id)``, and the
        work goes on as the job (what it returns is delivered). False, and nothing changed,
        when no job can start now (``JobRefused``)."""
        ...


class BackgroundJobs(Protocol):
    """A session's background jobs as a tool uses them (``omp.session.jobs.Jobs``): each job
    outlives the call that started it (not an ``abort``; a session change and the close cancel
    it) and what it returns is delivered to the model once, when it ends."""

    @property
    def async_enabled(self) -> bool:
        """``async.enabled``: a call may ask for a job outright (``bash`` ``async: true``)."""
        ...

    def auto_background_after(self) -> float | None:
        """``bash.autoBackground``: seconds a command may run in its call before it becomes a
        job (0: at once); None when off."""
        ...

    @property
    def at_capacity(self) -> bool:
        """``async.maxJobs`` jobs run: no other can start now."""
        ...

    def launch(self, type: str, label: str,
               work: Callable[[], Awaitable[Settled | None]]) -> str:
        """Run ``work`` as a new job now; returns its id. ``work`` must not raise. Raises
        JobRefused."""
        ...

    async def hand_off(self, work: Callable[[HandOff[T]], Awaitable[Settled | None]]) -> T:
        """Run ``work`` under the caller until it calls ``finish`` or ``background`` (see
        ``HandOff``) and return the value it gave. Its exception before that is raised here;
        it must not raise after ``background``. Raises JobRefused when the session is closing.

        On cancellation before ``background`` the work is cancelled with the caller;
        afterwards it is not."""
        ...


class ToolContext(msgspec.Struct, eq=False):
    """What built-in tools share: where relative paths resolve, who serves host URLs, and
    the web tools' network access."""

    cwd: Path
    uris: UriHandler | None = None
    skills: Sequence[Skill] = ()
    """The session's skills: ``read`` serves their ``skill://`` URIs."""
    rulebook: Sequence[RulebookRule] = ()
    """The session's rulebook rules: ``read`` serves their ``rule://`` URIs."""
    environment: EnvironmentPolicy = DEFAULT_POLICY
    """What the subprocesses of the tools inherit (``Settings.environment_policy``)."""
    web: WebAccess | None = None
    """The network policy and HTTP client of the web tools; None or disabled: no web tools,
    and ``read`` refuses ``http(s)://`` URLs naming the setting."""
    files: EditorFiles | None = None
    """The editor's files (ACP mode, when the client offers ``fs``); None: the disk."""
    devices: Devices | None = None
    """``xd://`` devices (MCP tools, ``tools.xdev``); None: no device is mounted."""
    terminals: EditorTerminals | None = None
    """The editor's terminals (ACP mode, when the client offers ``terminal``): ``bash`` runs
    its commands there; None: local processes."""
    jobs: BackgroundJobs | None = None
    """The session's background jobs (a main session's, set by the session): ``bash`` moves
    long commands there; None (a subagent): every command runs in its call."""
    eval: EvalSettings | None = None
    """The ``eval`` section of the settings; None: no ``eval`` tool (a subagent's context)."""
    services: trio.Nursery | None = None
    """The nursery of the session's helper processes (the eval kernel, the language servers of
    ``lsp``), set when the session starts serving and cancelled when it closes
    (``omp.rpc.lifecycle.Runtime.services``); None: no helper process can start."""
    shared: dict[str, Any] = msgspec.field(default_factory=dict)
    """What the tools make on first use and keep for the session and its subagents (the
    ``lsp`` tool's language servers, under ``"lsp"``)."""
    lsp: LspSettings | None = None
    """The ``lsp`` section of ``config.yml``; None: its defaults."""
    on_session_change: list[Callable[[], Awaitable[None]]] = msgspec.field(
        default_factory=list)
    """What the session awaits, in order, when it changes to another transcript
    (``new_session``, ``switch_session``, ``open_session``): the tools that keep state of the
    old one there (the ``eval`` tool's kernel) register here. Each must end in bounded time and
    leave no process behind."""

    async def session_changed(self) -> None:
        """End what the tools keep of the old transcript (``on_session_change``, in order).
        Each is bounded and not cut short by cancellation (the eval kernel's stop is
        shielded), so no process of the old session is left running."""
        for end in list(self.on_session_change):
            await end()

    def use_skills(self, skills: Sequence[Skill]) -> None:
        """``read`` serves these skills' ``skill://`` URIs from now on."""
        self.skills = skills

    def use_rulebook(self, rulebook: Sequence[RulebookRule]) -> None:
        """``read`` serves these rules' ``rule://`` URIs from now on."""
        self.rulebook = rulebook

    def use_jobs(self, jobs: BackgroundJobs) -> None:
        """``bash`` may move long commands to these background jobs (a main session's)."""
        self.jobs = jobs

    def use_services(self, services: trio.Nursery) -> None:
        """Helper processes (the eval kernel, language servers) start in ``services``."""
        self.services = services

    def use_uris(self, uris: UriHandler | None) -> None:
        """``read`` asks ``uris`` for the URLs it owns (it wraps the earlier handler)."""
        self.uris = uris

    def mount_devices(self, devices: Devices) -> None:
        """``read`` and ``write`` reach ``xd://`` devices through ``devices``."""
        self.devices = devices

    def use_editor(self, files: EditorFiles | None, terminals: EditorTerminals | None) -> None:
        """The tools read and write through the editor's ``files`` and run ``bash`` in its
        ``terminals`` (None: the disk, local processes)."""
        self.files = files
        self.terminals = terminals

    def resolve(self, path: str) -> Path:
        """``path`` against the session cwd, with ``~`` expanded."""
        p = Path(path).expanduser()
        return p if p.is_absolute() else self.cwd / p

    def host_url(self, path: str) -> str | None:
        """``path`` itself when it is a URL of a host-registered scheme, else None."""
        if self.uris is not None and "://" in path and self.uris.owns(path):
            return path
        return None
