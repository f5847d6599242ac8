"""The session a host drives: identity and file, model and thinking level, prompts and runs.

Who owns what:

* ``AgentSession`` owns the session nursery (``serve``); each accepted prompt's run is a
  ``Run`` (``omp.session.run``: the saga and its cancel scope) driven by one task in it. At most
  one run exists at a time; ``abort`` cancels it and waits until its terminal frames are out.
* The live context and the queues are the ``Agent``'s (``omp.agent.loop``); the session is the
  agent's sink: every finished message is appended to the session file as its ``message_end``
  is published.
* Manual ``compact`` / ``handoff`` run in a maintenance cancel scope that ``abort`` cancels;
  automatic compaction runs inside the run's scope.
* The session never writes frames: it publishes events to its ``EventSink`` (the RPC server or
  the one-shot CLI). Every event is published at once, the streaming updates too; the streaming
  producers wait for a slow host through the sink's ``pace``.

After a run the session writes, in this order and without waiting: the one terminal
``agent_end``, a ``prompt_result`` for each accepted prompt the run served, and
``session_settled`` when nothing is left to do (rpc-behavior §3.3, §4.4, §4.7).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import msgspec
import trio

from ..agent.loop import (
    ABORT_REASON,
    Agent,
    Input,
    NoHooks,
    TurnSetup,
    now_ms,
    user_message,
)
from ..commands import Problem, ReportOnce, Skill, load_skills
from ..config import agent_dir
from ..files import UnusableFile
from ..llm import thinking
from ..llm.builder import NO_PACE, Pace, discard
from ..llm.errors import ProviderError
from ..llm.models import ModelRegistry, fast_service_tier
from ..llm.stream import HttpClient, ModelCall
from ..llm.types import THINKING_LEVELS, Context, StreamOptions, ThinkingLevel
from ..protocol import messages as m
from ..protocol.commands import InterruptMode, QueueMode, RequestId, TodoPhase
from ..protocol.events import (
    AgentEnd,
    MessageEnd,
    ModelChanged,
    Notice,
    PromptError,
    PromptResult,
    SessionSettled,
    ThinkingLevelChanged,
)
from ..protocol.payloads import CompactionResult, Model
from ..tools.base import Tool, ToolContext
from ..tools.todo_state import TodoState
from .compaction import (
    CompactionPlan,
    HandoffError,
    compact,
    estimate_context_tokens,
    find_cut_point,
    handoff,
    should_compact,
)
from .context import (
    BranchSettings,
    branch_settings,
    build_context,
    entries_since,
    entry_tree,
    user_messages,
)
from .errors import InvalidRequest, SessionError
from .file import SessionFile, branch_file
from .locations import newest_session
from .run import Run, RunReport
from .settings import Settings
from .system_prompt import PromptOptions
from .writer import on_loop

if TYPE_CHECKING:
    # Annotations only: the extension machinery loads with the first extension (omp.lazy).
    from ..extensions.api import DeliverAs
    from ..extensions.runtime import Extensions
    from ..extensions.ui import ExtensionUI
    from ..tools.shell import ShellResult
    from .compaction import CompactionPlan

__all__ = ["BUSY", "AgentSession", "EventSink", "SessionError"]

BUSY = ("Agent is already processing. Use steer() or followUp() to queue messages, or wait for "
        "completion.")
SHUTDOWN_REASON = "Request was aborted"
"""The aborted message's ``errorMessage`` when the session closes (rpc-behavior §1.9)."""
ASYNC_RESULT = "async-result"
"""``customType`` of the message that delivers background job results."""
MAX_SESSION_NAME_CHARS = 1000
TITLE_SYSTEM_PROMPT = ("You name conversations. Answer with a title of at most six words for "
                       "the conversation the user shows you, and nothing else.")
TITLE_SOURCE_CHARS = 4000
"""How much of the first user messages the title call sees."""
TITLE_MAX_TOKENS = 64
TITLE_MAX_CHARS = 80
"""Longest session name ``set_session_name`` accepts."""


class EventSink(Protocol):
    """Where the session's events go (the RPC server, or the one-shot CLI)."""

    def publish(self, event: Any) -> None:
        """Deliver at once; never blocks."""

    def publish_update(self, event: Any) -> None:
        """Deliver a streaming update (``message_update``, ``tool_execution_update``) at once;
        never blocks. Called once per streamed token."""

    @property
    def pace(self) -> Pace:
        """The consumer's backpressure: the streaming producers wait on it while the consumer
        is far behind (``behind`` is checked after every streamed token)."""


class _NullSink:
    pace: Pace = NO_PACE

    def publish(self, event: Any) -> None:
        pass

    def publish_update(self, event: Any) -> None:
        pass


@attrs.define(eq=False, repr=False)
class PromptTicket:
    """An accepted prompt awaiting its one ``prompt_result``."""

    request_id: RequestId | None
    message: Input | None
    run: Run | None = None
    """For a run started without a new message (``/retry``): that run serves the ticket."""


@attrs.define(eq=False, repr=False)
class AgentSession:
    registry: ModelRegistry
    model: Model
    configured_thinking: ThinkingLevel = "off"
    """What the host asked for; the model may support less (see ``thinking_level``)."""
    cwd: Path = attrs.field(factory=Path.cwd)
    builtin_tools: list[Tool] = attrs.field(factory=list)
    """The built-in tools this session offers (``--tools`` chose them)."""
    tool_context: ToolContext = attrs.field(factory=lambda: ToolContext(Path.cwd()))
    prompt_options: PromptOptions = attrs.field(factory=lambda: PromptOptions(Path.cwd()))
    system_prompt: list[str] = attrs.field(factory=list)
    host_tools: list[Tool] = attrs.field(factory=list)
    todos: TodoState = attrs.field(factory=TodoState)
    """Shared with the ``todo`` tool: ``set_todos`` and the model edit the same list."""
    sink: EventSink = attrs.field(factory=_NullSink)
    settings: Settings = attrs.field(factory=Settings)
    file: SessionFile | None = None
    """The session on disk (None with ``--no-session``): every finished message, model and
    thinking-level change is appended as it happens (written by the file's writer thread)."""
    persistence_failure: str | None = None
    """Why the session file stopped being written, once it did (the process then exits 1)."""
    sessions_directory: Path | None = None
    """Where new session files go."""
    auto_retry: bool = True
    """``set_auto_retry``: False turns every automatic retry off."""
    auto_compaction: bool = True
    """``set_auto_compaction``: whether compaction may start on its own."""
    fast_mode: bool = False
    """``set_fast_mode``: ask for the model's priority tier when it has one."""
    http: HttpClient = attrs.field(factory=HttpClient)
    """The HTTP client of the owner (``serve()``), which closes it."""
    extensions: Extensions | None = None
    """The loaded extensions (their hooks, tools and commands); None: none."""
    on_shutdown_request: Callable[[], None] | None = None
    """What ``ctx.shutdown()`` calls (the server: end after the current command)."""
    skills: list[Skill] = attrs.field(factory=list)
    """The skills found for this cwd (``load_skills``): listed in the system prompt, served by
    ``read`` as ``skill://<name>``, run by ``/skill:<name>``."""
    reported: ReportOnce = attrs.field(factory=ReportOnce, init=False)
    """Problems in the user's markdown files already shown (each is shown once)."""
    forced_tool: str | None = attrs.field(default=None, init=False)
    """``/force``: the tool the model must call in the next turn (cleared once used)."""
    runs_started: int = attrs.field(default=0, init=False)
    """How many runs this session started (what an extension command set off)."""
    subagents: object | None = None
    """The subagent support of this session (``omp.subagents.SubagentHost``) when it offers
    the ``task`` tool; None: no subagents."""
    task_depth: int = 0
    """How deep this session is in a tree of subagents (the main session: 0)."""
    job_epoch: int = attrs.field(default=0, init=False)
    """Bumped whenever the background jobs are cancelled (a session change, ``close``): what
    belonged to an older epoch is dropped."""
    _jobs: dict[int, trio.CancelScope] = attrs.field(factory=dict, init=False)
    """Background jobs running in the session nursery (detached subagents, their delivery)."""
    _job_counter: int = attrs.field(default=0, init=False)
    _last_report: RunReport | None = attrs.field(default=None, init=False)
    _active_tools: set[str] | None = attrs.field(default=None, init=False)
    """``set_active_tools``: the names the model sees; None: every tool."""
    agent: Agent = attrs.field(init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _run: Run | None = attrs.field(default=None, init=False)
    """The run scheduled or going; None when idle."""
    _maintenance: trio.CancelScope | None = attrs.field(default=None, init=False)
    """The scope of a manual ``compact`` / ``handoff`` in progress."""
    _tickets: list[PromptTicket] = attrs.field(factory=list, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _unsettled: bool = attrs.field(default=False, init=False)
    _deferred: list[m.AgentMessage] = attrs.field(factory=list, init=False)
    _session_id: str = attrs.field(factory=lambda: str(uuid.uuid4()), init=False)
    _name: str | None = attrs.field(default=None, init=False)
    _rng: random.Random = attrs.field(factory=random.Random, init=False)

    def __attrs_post_init__(self) -> None:
        self.agent = Agent(sink=_AgentEvents(self), setup=self._agent_turn_setup)

    def load_skills(self) -> None:
        """(Re)discover the skills; the system prompt and ``read`` use the new list. A broken
        skill file is left out and said once on stderr."""
        directory = self.prompt_options.agent_directory or agent_dir()
        skills, problems = load_skills(directory, self.cwd, settings=self.settings.skills)
        self.skills = self.prompt_options.skills = self.tool_context.skills = skills
        self.system_prompt = self.prompt_options.build(self.tools)
        self.report_problems(problems)

    def report_problems(self, problems: Sequence[Problem]) -> None:
        """Say each problem of a user's markdown file once, on stderr (never fatal)."""
        for problem in self.reported.new(problems):
            print(f"omp: {problem}", file=sys.stderr)

    def use_extensions(self, extensions: Extensions | None,
                       ui: ExtensionUI | None = None) -> None:
        """Start ``extensions`` in place of any earlier ones (None: no more extensions): their
        hooks join the loop, their tools the tool list."""
        self.extensions = extensions
        if extensions is not None:
            extensions.start(self, ui)
        self.agent.hooks = extensions if extensions is not None and extensions.active \
            else NoHooks()
        self.system_prompt = self.prompt_options.build(self.tools)

    @property
    def all_tools(self) -> list[Tool]:
        """Every tool: the built-ins (an extension tool of the same name replaces one), the
        extensions' tools, then the host's."""
        extension_tools: list[Tool] = (list(self.extensions.tools())
                                       if self.extensions is not None else [])
        replaced = {t.name for t in extension_tools}
        return [*(t for t in self.builtin_tools if t.name not in replaced), *extension_tools,
                *self.host_tools]

    @property
    def tools(self) -> list[Tool]:
        """What the model sees: ``all_tools``, less those ``set_active_tools`` left out."""
        active = self._active_tools
        return [t for t in self.all_tools if active is None or t.name in active]

    def set_host_tools(self, tools: Sequence[Tool]) -> None:
        """Replace the host's tools; the next model call (and system prompt) has them."""
        self.host_tools = list(tools)
        self.system_prompt = self.prompt_options.build(self.tools)

    # -- what extensions drive (omp.extensions.api.ExtensionHost) -------------------------

    def active_tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def set_active_tools(self, names: Sequence[str]) -> None:
        """Only these tools (unknown names are ignored) from the next model call on."""
        known = {t.name for t in self.all_tools}
        self._active_tools = {n for n in names if n in known}
        self.system_prompt = self.prompt_options.build(self.tools)

    def request_abort(self) -> None:
        """Abort the run without waiting for it (``ctx.abort()``)."""
        if self._nursery is not None and self._run is not None:
            self._nursery.start_soon(self.abort)

    def request_shutdown(self) -> None:
        if self.on_shutdown_request is not None:
            self.on_shutdown_request()

    def send_user_message(self, text: str, images: Sequence[m.ImageContent] = (), *,
                          deliver_as: DeliverAs | None = None) -> None:
        """A prompt from an extension: idle, it starts a run; during one it is queued
        (steering unless ``deliver_as="followUp"``). No ``prompt_result``: no host asked."""
        self._check_can_prompt(images)
        message = user_message(text, images, steering=deliver_as != "followUp"
                               and self.is_streaming)
        self._deliver(message, trigger_turn=True, deliver_as=deliver_as)

    def send_custom_message(self, message: m.CustomMessage, *, trigger_turn: bool,
                            deliver_as: DeliverAs | None) -> None:
        """An extension's ``custom`` message: queued during a run; idle, it starts a run
        (``trigger_turn``) or is just added to the context."""
        self._deliver(message, trigger_turn=trigger_turn, deliver_as=deliver_as)

    def _deliver(self, message: Input, *, trigger_turn: bool,
                 deliver_as: DeliverAs | None) -> None:
        if self.is_streaming:
            if deliver_as == "followUp":
                self.agent.queue_follow_up(message)
            else:
                self.agent.queue_steering(message)
        elif trigger_turn:
            self._start_run([message])
        else:
            self.agent.messages.append(message)
            self._persist(lambda f: f.append_message(message))

    def subscribe(self, sink: EventSink) -> None:
        """Send every session event to ``sink`` (one sink: the RPC server or the CLI)."""
        self.sink = sink

    def publish(self, event: Any) -> None:
        """Publish a session event now (finished messages are persisted first)."""
        if isinstance(event, MessageEnd) and self.file is not None:
            message = event.message
            self._persist(lambda f: f.append_message(message))
        self.sink.publish(event)

    def _persist(self, write: Callable[[SessionFile], object]) -> None:
        """Append to the session file. A write failure is reported once as a notice and the
        session goes on in memory: the run is not lost because the disk is."""
        if self.file is None:
            return
        try:
            write(self.file)
        except OSError as exc:
            self._file_failed(self.file, exc)

    async def _file_written(self) -> None:
        """Wait until the session file's writer thread has written every line appended so far.
        On cancellation it stops waiting (the thread goes on writing)."""
        if (file := self.file) is not None and file.pending:
            try:
                await trio.to_thread.run_sync(file.flush, abandon_on_cancel=True)
            except OSError as exc:
                self._file_failed(file, exc)

    def _file_failed(self, file: SessionFile, exc: OSError) -> None:
        """``file`` could not be written (an append, or its writer thread; once per file)."""
        if file is self.file:  # in memory from now on, under the same id and name
            self.file = None
            self._session_id, self._name = file.session_id, file.name
        path = file.path
        self.persistence_failure = f"the session file {path} could not be written: " + (
            f"{exc.strerror or exc}")
        self.sink.publish(Notice(level="error", source="session-persistence",
                                 message=f"Could not write the session file {path.name}: "
                                         f"{exc.strerror or exc}; continuing in memory"))

    # -- the session's identity and file -----------------------------------------------------

    @property
    def session_id(self) -> str:
        return self.file.session_id if self.file is not None else self._session_id

    @property
    def session_file(self) -> str | None:
        return None if self.file is None else str(self.file.path)

    @property
    def session_name(self) -> str | None:
        return self.file.name if self.file is not None else self._name

    def set_session_name(self, name: str) -> None:
        """Name the session. Raises SessionError for an empty name, one longer than
        ``MAX_SESSION_NAME_CHARS`` (it is in every ``get_state``, which must stay far below the
        frame limit) or one the file cannot take."""
        name = name.strip()
        if not name:
            raise InvalidRequest("Session name cannot be empty")
        if len(name) > MAX_SESSION_NAME_CHARS:
            raise InvalidRequest(f"Session name is too long: {len(name):,} characters (the limit "
                               f"is {MAX_SESSION_NAME_CHARS:,})")
        if self.file is not None:
            try:
                self.file.set_name(name)
            except (OSError, ValueError) as exc:
                raise SessionError(f"Session name cannot be saved: {exc}") from None
        else:
            self._name = name

    async def _reset(self) -> None:
        """Stop whatever runs and empty the live state (before a session change).

        Prompts still waiting for their result are answered ``aborted``; background jobs are
        cancelled and their results dropped.
        """
        self.cancel_jobs()
        await self.abort()
        self._abort_tickets()
        self._settle_if_idle()
        self.agent.messages.clear()
        self.agent.steering.clear()
        self.agent.follow_ups.clear()
        self._deferred.clear()
        self.todos.replace([])

    def _abort_tickets(self) -> None:
        for ticket in self._tickets:
            self.sink.publish(PromptResult(id=ticket.request_id, agentInvoked=True,
                                           status="aborted", sessionSettled=True))
        self._tickets.clear()

    def _adopt(self, file: SessionFile | None,
               built: tuple[list[m.AgentMessage], BranchSettings] | None = None) -> None:
        """Make ``file`` the session: its current branch becomes the live context (``built``:
        as already built from it, off the loop), and the model it last used (when known and
        available) the current model. Its appends are written behind the loop from now on."""
        self.file = file
        self._name = None
        if file is None:
            self._session_id = str(uuid.uuid4())
            return
        file.write_behind(on_loop(functools.partial(self._file_failed, file)))
        messages, settings = built or (build_context(file), branch_settings(file))
        self.agent.messages[:] = messages
        ref = settings.models.get("default") if isinstance(settings.models, dict) else None
        if isinstance(ref, str) and "/" in ref:
            provider, _, model_id = ref.partition("/")
            model = self.registry.find(provider, model_id)
            if model is not None and self.registry.has_credentials(provider):
                self.model = model
        if isinstance(settings.thinking_level, str) and settings.thinking_level in THINKING_LEVELS:
            self.configured_thinking = settings.thinking_level

    def _record_model(self) -> None:
        self._persist(lambda f: f.append_model_change(self.model.provider, self.model.id))

    def _record_thinking(self) -> None:
        self._persist(lambda f: f.append_thinking_level(
            self.thinking_level if self.model.reasoning else None,
            configured=self.configured_thinking))

    def open_startup_file(self, *, session_path: Path | None, resume: bool) -> None:
        """The file a process starts with: ``--session FILE`` (opened, or created there),
        ``--continue`` (the newest session of this cwd), else a new one. Raises SessionError
        naming the file when it cannot be read or created."""
        assert self.sessions_directory is not None
        try:
            if session_path is not None:
                if session_path.exists():
                    self._adopt(_open_file(session_path))
                    return
                self._adopt(SessionFile.create_at(session_path, cwd=str(self.cwd)))
            elif resume and (newest := newest_session(self.sessions_directory)) is not None:
                self._adopt(_open_file(newest))
                return
            else:
                self._adopt(SessionFile.create(self.sessions_directory, cwd=str(self.cwd)))
        except (OSError, ValueError, RecursionError) as exc:
            raise SessionError(f"Cannot open the session file: {_reason(exc)}") from None
        self.start_file()

    def start_file(self) -> None:
        """Record the model and thinking level a fresh file starts with."""
        self._record_model()
        self._record_thinking()

    async def new_session(self, parent_session: str | None = None) -> None:
        """Abort, clear, and continue in a new session file (or a fresh in-memory session).

        The file is created (in a worker thread) before anything else changes: a file that
        cannot be created changes nothing (SessionError). On cancellation before the file
        exists nothing was changed.
        """
        if self.file is None or self.sessions_directory is None:
            await self._reset()
            self._adopt(None)
            return
        create = functools.partial(SessionFile.create, self.sessions_directory,
                                   cwd=str(self.cwd), parent_session=parent_session)
        try:
            file = await trio.to_thread.run_sync(create)
        except OSError as exc:
            raise SessionError(f"Cannot create a session file: {exc.strerror or exc}") from None
        await self._reset()
        self._adopt(file)
        self.start_file()

    async def switch_session(self, path: Path) -> bool:
        """Continue the session in ``path`` (a new empty one there when it does not exist).

        Returns False (nothing changed) for a session recorded in another working directory:
        RPC has no way to ask the user whether to change directories (rpc-behavior §11.2).
        A file that cannot be read changes nothing (SessionError). The file is read in a
        worker thread; on cancellation nothing was changed.
        """
        if self.file is None and self.sessions_directory is None:
            raise SessionError("switch_session requires session persistence (omit --no-session)")
        if not await trio.Path(path.parent).is_dir():
            raise SessionError(f"File not found: {path}")
        create = functools.partial(SessionFile.create_at, path, cwd=str(self.cwd))
        try:
            file = (await _load_file(path) if await trio.Path(path).exists() else
                    await trio.to_thread.run_sync(create))
        except (OSError, ValueError, RecursionError) as exc:
            raise SessionError(f"Cannot open session {path}: {_reason(exc)}") from None
        if file.cwd and Path(file.cwd) != self.cwd:
            return False
        await self._reset()
        self._adopt(file)
        if not file.entries:
            self.start_file()
        return True

    async def open_session(self, directory: Path) -> tuple[bool, bool]:
        """The newest non-empty session in ``directory``, or a new one there.

        Returns (cancelled, resumed). The session is found and loaded (or created) in worker
        threads before anything else changes: one that cannot be read or created changes
        nothing (SessionError), nor does a cancellation before it is loaded.
        """
        if self.file is None:
            raise SessionError("open_session requires session persistence (omit --no-session)")
        newest = await trio.to_thread.run_sync(
            lambda: newest_session(directory, non_empty=True), abandon_on_cancel=True)
        if newest is not None and self.file is not None and newest == self.file.path:
            return False, True
        if (newest is None and self.file is not None and self.file.path.parent == directory
                and not self.agent.messages):
            return False, False  # already the empty session of that directory
        create = functools.partial(SessionFile.create, directory, cwd=str(self.cwd))
        try:
            file = (await _load_file(newest) if newest is not None
                    else await trio.to_thread.run_sync(create))
        except (OSError, ValueError, RecursionError) as exc:
            raise SessionError(f"Cannot open a session in {directory}: {_reason(exc)}") from None
        await self._reset()
        if newest is None:
            self.sessions_directory = directory
        self._adopt(file)
        if newest is None:
            self.start_file()
        return False, newest is not None

    async def branch(self, entry_id: str) -> str:
        """A new file with the conversation before user message ``entry_id``; returns its text.

        The run in progress (if any) is not interrupted. The file is written and read, and its
        context built, in a worker thread (a long session must not stop the loop). On
        cancellation the thread is abandoned (the new file may still appear) and nothing changed.
        """
        if self.file is None:
            raise SessionError("branch requires session persistence (omit --no-session)")
        try:
            file, text, built = await trio.to_thread.run_sync(
                _branch_and_build, self.file, entry_id, abandon_on_cancel=True)
        except ValueError:
            raise SessionError("Invalid entry ID for branching") from None
        self.cancel_jobs()  # they worked for the old transcript
        self._adopt(file, built)
        self._settle_if_idle()
        return text

    def branch_messages(self) -> list[tuple[str, str]]:
        return [] if self.file is None else user_messages(self.file)

    # -- read-only views of the file (get_entries, get_tree, paging, export) ----------------

    @property
    def leaf_id(self) -> str | None:
        """The current entry of the session file (None in memory or before any entry)."""
        return None if self.file is None else self.file.leaf_id

    def entries_json(self, since: str | None = None) -> list[dict[str, Any]]:
        """The file's entries (after entry ``since``) as JSON objects; KeyError for an unknown
        ``since``. Empty for an in-memory session."""
        file = self.file
        return [] if file is None else [file.entry_json(e) for e in entries_since(file, since)]

    def entry_tree(self) -> list[dict[str, Any]]:
        """The file's entries as a tree (``get_tree``); empty for an in-memory session."""
        return [] if self.file is None else entry_tree(self.file)

    async def export_html(self, output_path: str | None) -> str:
        """Write the session as one self-contained HTML page, private (0600) like the session;
        returns the path as shown to the host. Only a regular file is replaced (a FIFO, a
        device or a directory at ``output_path`` is refused). Rendering and writing run in a
        worker thread. Raises SessionError. On cancellation the thread is abandoned and may
        still write the page (never half: it is replaced atomically)."""
        from .export_html import default_export_name, render_html, write_html

        file = self.file
        if file is None:
            raise SessionError("Cannot export in-memory session to HTML")
        shown = output_path if output_path is not None else default_export_name(file.path)
        entries = [file.entry_json(e) for e in file.entries]
        messages = list(self.agent.messages)
        title = self.session_name or file.path.name
        model = f"{self.model.provider}/{self.model.id}"

        def render_and_write() -> None:
            target = self.cwd / Path(os.path.expanduser(shown))  # an absolute path stays as is
            write_html(target, render_html(title=title, session_id=self.session_id,
                                           messages=messages, entries=entries, model=model))

        try:
            await trio.to_thread.run_sync(render_and_write, abandon_on_cancel=True)
        except UnusableFile as exc:
            raise SessionError(f"Cannot write {shown}: {exc}") from None
        except OSError as exc:
            raise SessionError(f"Cannot write {shown}: {exc.strerror or exc}") from None
        return shown

    # -- queue modes (stored on the agent, which applies them) -------------------------------

    @property
    def steering_mode(self) -> QueueMode:
        return self.agent.steering_mode

    @steering_mode.setter
    def steering_mode(self, mode: QueueMode) -> None:
        self.agent.steering_mode = mode

    @property
    def follow_up_mode(self) -> QueueMode:
        return self.agent.follow_up_mode

    @follow_up_mode.setter
    def follow_up_mode(self, mode: QueueMode) -> None:
        self.agent.follow_up_mode = mode

    @property
    def interrupt_mode(self) -> InterruptMode:
        return self.agent.interrupt_mode

    @interrupt_mode.setter
    def interrupt_mode(self, mode: InterruptMode) -> None:
        self.agent.interrupt_mode = mode

    # -- run state ---------------------------------------------------------------------------

    @property
    def is_streaming(self) -> bool:
        """True from the moment a prompt is accepted until its run has fully ended."""
        return self._run is not None

    @property
    def is_compacting(self) -> bool:
        return self._maintenance is not None or (self._run is not None
                                                 and self._run.compacting)

    @property
    def messages(self) -> list[m.AgentMessage]:
        return self.agent.messages

    @property
    def message_count(self) -> int:
        return len(self.agent.messages)

    @property
    def queued_message_count(self) -> int:
        return self.agent.queued_count

    @property
    def settled(self) -> bool:
        return not self.is_streaming and not self.agent.queued_count and not self._jobs

    def last_assistant_text(self) -> str | None:
        for message in reversed(self.agent.messages):
            if isinstance(message, m.AssistantMessage):
                if message.stopReason == "aborted" and not message.content:
                    continue
                text = "".join(b.text for b in message.content
                               if isinstance(b, m.TextContent)).strip()
                return text or None
        return None

    def context_usage(self) -> tuple[int, int] | None:
        """(tokens, context window): the last prompt size the provider reported after the
        latest compaction, plus an estimate of what came after it (agent-core §8.3)."""
        window = self.model.contextWindow
        if not window:
            return None
        return estimate_context_tokens(self.agent.messages), window

    # -- prompting ---------------------------------------------------------------------------

    def _check_can_prompt(self, images: Sequence[m.ImageContent]) -> None:
        model = self.model
        if not self.registry.has_credentials(model.provider):
            raise SessionError(f"No API key for {model.provider}/{model.id}: "
                               f"{self.registry.missing_key_hint(model.provider)}")
        if images and "image" not in model.input:
            raise SessionError(f"Model {model.provider}/{model.id} does not accept images")

    def prompt(self, text: str, images: Sequence[m.ImageContent] = (), *,
               streaming_behavior: str | None = None,
               request_id: RequestId | None = None) -> None:
        """Accept a prompt: start a run, or queue it while one is going. Raises SessionError
        (nothing was accepted) when busy without ``streaming_behavior``, or when the model
        cannot take it. Exactly one ``prompt_result`` follows an accepted prompt."""
        self._check_can_prompt(images)
        steer = self.is_streaming and streaming_behavior == "steer"
        self.prompt_message(user_message(text, images, steering=steer),
                            streaming_behavior=streaming_behavior, request_id=request_id)

    def prompt_message(self, message: Input, *, streaming_behavior: str | None = None,
                       request_id: RequestId | None = None) -> None:
        """``prompt`` for a message already built (a skill's ``skill-prompt``), with the same
        rules and the same one ``prompt_result``; the caller checked the images."""
        if not self.registry.has_credentials(self.model.provider):
            self._check_can_prompt(())
        if self.is_streaming:
            if streaming_behavior is None:
                raise SessionError(BUSY)
            steer = streaming_behavior == "steer"
            (self.agent.queue_steering if steer else self.agent.queue_follow_up)(message)
            self._tickets.append(PromptTicket(request_id, message))
            return
        self._start_run([message])
        self._tickets.append(PromptTicket(request_id, message))

    def steer(self, text: str, images: Sequence[m.ImageContent] = ()) -> None:
        """Queue a steering message; on an idle session it starts a run."""
        self._queue(user_message(text, images, steering=True), steer=True)

    def follow_up(self, text: str, images: Sequence[m.ImageContent] = ()) -> None:
        """Queue a follow-up; on an idle session it starts a run."""
        self._queue(user_message(text, images), steer=False)

    def _queue(self, message: m.UserMessage, *, steer: bool) -> None:
        self._check_can_prompt([b for b in (message.content if isinstance(
            message.content, list) else []) if isinstance(b, m.ImageContent)])
        if self.is_streaming:
            (self.agent.queue_steering if steer else self.agent.queue_follow_up)(message)
        else:
            self._start_run([message])

    async def abort(self, reason: str = ABORT_REASON) -> None:
        """Abort the run (and a manual compaction) and wait until its terminal frames are out.

        Returns at once when idle. On cancellation, stops waiting (the abort still happens).
        """
        if self._maintenance is not None:
            self._maintenance.cancel()
        run = self._run
        if run is None:
            return
        run.abort(reason)
        await run.done.wait()

    async def wait_for_idle(self) -> tuple[Literal["completed", "aborted", "error"], Any]:
        """Wait until no run is going; the last run's ``prompt_result`` status and error.

        On cancellation, stops waiting."""
        while (run := self._run) is not None:
            await run.done.wait()
        return _outcome(self._last_report)

    def abort_retry(self) -> bool:
        """Cancel a retry backoff in progress; False when none is."""
        return self._run is not None and self._run.abort_retry()

    def _start_run(self, prompts: list[Input]) -> None:
        if self._nursery is None or self._closing:
            raise SessionError("The session is closed")
        # RPC bash records made while the last run streamed enter the context now.
        for message in self._deferred:
            self.agent.messages.append(message)
            self._persist(lambda f, msg=message: f.append_message(msg))  # type: ignore[misc]
        self._deferred.clear()
        run = self._run = Run(self, prompts, self._rng)
        self.runs_started += 1
        self._unsettled = True
        self._nursery.start_soon(self._drive, run)

    async def _drive(self, run: Run) -> None:
        """The run's task: the saga, then its terminal frames (none when it never started)."""
        report = await run.execute()
        with run.tail:
            # A host that sees the run end finds the whole run in the file (waiting for the
            # writer thread, not blocking the loop; ``abort`` does not wait for the disk).
            await self._file_written()
            if report is not None and self.extensions is not None and self.extensions.listens(
                    "agent_end"):
                # Extensions hear of the run's end before the host does (extensions.md §1.7).
                await self.extensions.agent_end(report.messages)
        self._run = None
        self._last_report = report
        # A background result that arrived after the run's last step boundary is still queued:
        # it starts the next run (subagents-login.md A.10).
        undelivered = not self._closing and any(
            isinstance(x, m.CustomMessage) and x.customType == ASYNC_RESULT
            for x in self.agent.steering)
        if report is not None:
            # isStreaming is already false when a host sees the terminal agent_end (§4.4).
            # While background work is pending the run only pauses (isTerminal false, §4.4).
            awaiting = undelivered or bool(self._jobs)
            self.sink.publish(AgentEnd(
                messages=report.messages, isTerminal=not awaiting,
                awaitingAsyncWork=True if awaiting else msgspec.UNSET))
        # After an abort a queued steer starts the next run at once (rpc-behavior §5.5).
        resume = ((report is None or report.outcome == "aborted") and bool(
            self.agent.steering) and not self._closing) or undelivered
        self._report(run, report, resume)
        run.done.set()
        if resume:
            self._start_run([])

    # -- background jobs (detached subagents) --------------------------------------------------

    @property
    def has_jobs(self) -> bool:
        return bool(self._jobs)

    def start_job(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` as a background job in the session nursery. A plain ``abort`` does not
        stop it; a session change and ``close`` cancel it (``cancel_jobs``). While any job runs
        the session is not settled. ``work`` must not raise (it reports its own failures).
        Raises SessionError when the session is closed."""
        if self._nursery is None or self._closing:
            raise SessionError("The session is closed")
        self._job_counter += 1
        key = self._job_counter
        scope = self._jobs[key] = trio.CancelScope()
        self._unsettled = True
        self._nursery.start_soon(self._run_job, key, scope, work)

    async def _run_job(self, key: int, scope: trio.CancelScope,
                       work: Callable[[], Awaitable[None]]) -> None:
        with scope:
            await work()
        # Cancelled by cancel_jobs, the job is already forgotten; otherwise it ends here.
        if self._jobs.get(key) is scope:
            del self._jobs[key]
            self._settle_if_idle()

    def cancel_jobs(self) -> None:
        """Cancel every background job now (a session change, ``close``): whatever they
        would have delivered is dropped."""
        self.job_epoch += 1
        for scope in self._jobs.values():
            scope.cancel()
        self._jobs.clear()

    def _settle_if_idle(self) -> None:
        if self._unsettled and self.settled and not self._closing:
            self._unsettled = False
            self.sink.publish(SessionSettled())

    def deliver_async_result(self, message: m.CustomMessage) -> None:
        """A background job's result for the model (subagents-login.md A.10): during a run it
        joins at the next step boundary without interrupting tool calls in flight; idle, it
        starts a run (no ``prompt_result``: no host asked)."""
        if self._closing:
            return
        if self.is_streaming:
            self.agent.steering.append(message)  # not queue_steering: an aside, no interrupt
        elif self._nursery is not None:
            self._start_run([message])

    def stop_run(self, reason: str) -> None:
        """Cancel the run now without waiting for it (a subagent's terminal ``yield``)."""
        if self._run is not None:
            self._run.abort(reason)

    def _report(self, run: Run, report: RunReport | None, resume: bool) -> None:
        """prompt_result for the tickets this run served, then session_settled if settled."""
        taken = {id(msg) for msg in (report.taken if report is not None else run.prompts)}
        served = [t for t in self._tickets if id(t.message) in taken or t.run is run]
        self._tickets = [t for t in self._tickets if t not in served]
        settled = self.settled and not resume
        status, error = _outcome(report)
        for ticket in served:
            self.sink.publish(PromptResult(id=ticket.request_id, agentInvoked=True,
                                           status=status, sessionSettled=settled, error=error))
        if settled and self._unsettled:
            self._unsettled = False
            self.sink.publish(SessionSettled())

    # -- the run's host (omp.session.run.RunHost) --------------------------------------------

    def drop_failed_turn(self, failed: m.AssistantMessage) -> None:
        """Remove a failed attempt's last turn from the live context (the file keeps it)."""
        messages = self.agent.messages
        if any(msg is failed for msg in messages):
            index = max(i for i, msg in enumerate(messages) if msg is failed)
            # Its synthetic "not executed" tool results go with it.
            del messages[index:]

    def retry_failed_turn(self, request_id: RequestId | None = None) -> bool:
        """``/retry``: when the last turn failed (an error, not an abort), run it again from
        the context before it; False when idle with nothing to retry. One ``prompt_result``
        for ``request_id`` follows the run."""
        messages = self.agent.messages
        last = messages[-1] if messages else None
        if self.is_streaming or not (isinstance(last, m.AssistantMessage)
                                     and last.stopReason == "error"):
            return False
        self._check_can_prompt(())
        self.drop_failed_turn(last)
        self._start_run([])
        self._tickets.append(PromptTicket(request_id, None, self._run))
        return True

    async def generate_title(self) -> str:
        """A short title for the conversation, written by the current model from its first
        user messages. Raises SessionError when there is nothing to name or the call fails.
        On cancellation the call is closed and nothing changes."""
        texts = [text for msg in self.agent.messages if isinstance(msg, m.UserMessage)
                 for text in [_plain_text(msg.content)] if text.strip()]
        if not texts:
            raise SessionError("Nothing to name yet: send a message first")
        request = Context(system_prompt=(TITLE_SYSTEM_PROMPT,), messages=(m.UserMessage(
            content=[m.TextContent(text="\n\n".join(texts)[:TITLE_SOURCE_CHARS])],
            timestamp=now_ms()),))
        setup = self._turn_setup()
        options = attrs.evolve(setup.options, thinking="off", max_tokens=TITLE_MAX_TOKENS)
        call = ModelCall(self.model, request, options)
        final = await call.run(discard, http=self.http.get() if self.model.api != "offline"
                               else None)
        if final.stopReason == "error":
            raise SessionError(call.error.message if call.error else "the model call failed")
        title = _plain_text(final.content).strip().splitlines()
        name = title[0].strip().strip('"\'*#').strip() if title else ""
        if not name:
            raise SessionError("the model answered with no title")
        return name[:TITLE_MAX_CHARS]

    def can_compact(self) -> bool:
        messages = self.agent.messages
        boundary = next((i + 1 for i in range(len(messages) - 1, -1, -1)
                         if isinstance(messages[i], m.CompactionSummaryMessage)), 0)
        return find_cut_point(messages[boundary:],
                              self.settings.compaction.keepRecentTokens) is not None

    def needs_compaction(self) -> bool:
        usage = self.context_usage()
        return (self.auto_compaction and usage is not None
                and should_compact(usage[0], usage[1], self.settings.compaction))

    async def summarize(self, custom_instructions: str | None = None
                        ) -> CompactionResult | None:
        """Compact the live context with the current model; None when there is nothing to
        compact. Raises SessionError when the model call fails. On cancellation nothing was
        changed."""
        setup = self._turn_setup()
        try:
            plan = await compact(self.model, setup.options, list(self.agent.messages),
                                 self.settings.compaction,
                                 custom_instructions=custom_instructions,
                                 http=self.http.get() if self.model.api != "offline" else None)
        except ProviderError as exc:
            raise SessionError(f"Compaction failed: {exc.message}") from None
        if plan is None:
            return None
        return self._apply(plan)

    def _apply(self, plan: CompactionPlan) -> CompactionResult:
        """Replace the older context by the plan's summary and record it in the file."""
        first_kept = plan.kept[0] if plan.kept else None
        entry_id = self._entry_id_of(first_kept) if first_kept is not None else None
        self.agent.messages[:] = plan.messages(now_ms())
        self._persist(lambda f: f.append_compaction(
            plan.summary, entry_id or (f.leaf_id or ""), plan.tokens_before, plan.details,
            tokens_after=plan.tokens_after, method=plan.method,
            short_summary=plan.short_summary))
        return plan.result(entry_id or "")

    def _entry_id_of(self, message: m.AgentMessage) -> str | None:
        """The session-file entry that holds ``message`` (the same object once loaded or
        appended)."""
        if self.file is None:
            return None
        for entry in self.file.branch_path():
            if getattr(entry, "message", None) is message:
                return str(entry.id)
        return None

    # -- manual maintenance ------------------------------------------------------------------

    async def compact(self, custom_instructions: str | None = None) -> CompactionResult:
        """Summarise the older part of the context with the current model (manual ``compact``).

        Aborts the run in progress first. Raises SessionError ("Nothing to compact (session too
        small)", "Compaction already in progress", "Compaction cancelled", the provider's
        error). On cancellation (``abort``) nothing was changed.
        """
        if self.is_compacting:
            raise SessionError("Compaction already in progress")
        await self.abort()
        result = None
        with self._maintenance_scope() as scope:
            result = await self.summarize(custom_instructions)
        if scope.cancelled_caught:
            raise SessionError("Compaction cancelled")
        if result is None:
            raise SessionError("Nothing to compact (session too small)")
        return result

    async def handoff(self, custom_instructions: str | None = None) -> None:
        """Replace the older context by a handoff document the model writes (agent-core §6.7).

        Refused while a run goes on. Raises SessionError with the spec's messages. On
        cancellation (``abort``) nothing was changed and "Handoff cancelled" is raised.
        """
        if self.is_streaming:
            raise SessionError("Cannot hand off while a response is in progress")
        if self.is_compacting:
            raise SessionError("Compaction already in progress")
        setup = self._turn_setup()
        plan = None
        with self._maintenance_scope() as scope:
            try:
                plan = await handoff(
                    self.model, setup.options, setup.system_prompt, list(self.agent.messages),
                    self.settings.compaction, custom_instructions=custom_instructions,
                    http=self.http.get() if self.model.api != "offline" else None)
            except HandoffError as exc:
                raise SessionError(str(exc)) from None
        if scope.cancelled_caught or plan is None:
            raise SessionError("Handoff cancelled")
        self._apply(plan)

    @contextlib.contextmanager
    def _maintenance_scope(self) -> Iterator[trio.CancelScope]:
        """The scope of a manual compaction or handoff, which ``abort`` cancels."""
        scope = self._maintenance = trio.CancelScope()
        try:
            with scope:
                yield scope
        finally:
            self._maintenance = None

    # -- user shell commands -----------------------------------------------------------------

    def record_bash(self, result: ShellResult) -> None:
        """Add an RPC ``bash`` command to the context: now when idle, before the next prompt
        while a run streams (a run's context must not change under it)."""
        cancelled = result.cancelled or result.timed_out
        message = m.BashExecutionMessage(
            command=result.command, output=result.output,
            exitCode=msgspec.UNSET if cancelled or result.exit_code is None
            else result.exit_code,
            cancelled=cancelled, truncated=result.truncation.truncated, timestamp=now_ms())
        if self.is_streaming:
            self._deferred.append(message)
        else:
            self.agent.messages.append(message)
            self._persist(lambda f: f.append_message(message))

    # -- todos -------------------------------------------------------------------------------

    def set_todos(self, phases: list[TodoPhase]) -> list[TodoPhase]:
        """Replace the todo list; phases and tasks keep the ids the host gave them."""
        self.todos.replace(phases)
        return self.todos.phases

    @property
    def todo_phases(self) -> list[TodoPhase]:
        return self.todos.phases

    # -- model and thinking ------------------------------------------------------------------

    @property
    def thinking_level(self) -> ThinkingLevel:
        """The effective level: the configured one clamped to what the model supports."""
        return thinking.clamp(self.model, self.configured_thinking)

    def set_model(self, provider: str, model_id: str) -> Model:
        """Switch models (the next model call uses it); the thinking level is re-clamped."""
        model = self.registry.find(provider, model_id)
        if model is None:
            raise SessionError(f"Model not found: {provider}/{model_id}")
        if not self.registry.has_credentials(provider):
            raise SessionError(f"No API key for {provider}/{model_id}: "
                               f"{self.registry.missing_key_hint(provider)}")
        self._switch(model)
        return model

    def cycle_model(self) -> Model | None:
        """The next available model (wrapping); ``None`` when there is no other one."""
        candidates = self.registry.available()
        if len(candidates) < 2:
            return None
        keys = [(x.provider, x.id) for x in candidates]
        current = (self.model.provider, self.model.id)
        index = keys.index(current) + 1 if current in keys else 0
        model = candidates[index % len(candidates)]
        self._switch(model)
        return model

    def _switch(self, model: Model) -> None:
        before = self.thinking_level
        self.model = model
        self._record_model()
        self.sink.publish(ModelChanged())
        if self.thinking_level != before:
            self._announce_thinking()

    @property
    def fast_mode_active(self) -> bool:
        """Fast mode is on and the current model has a faster tier to ask for."""
        return self.fast_mode and fast_service_tier(self.model) is not None

    def set_fast_mode(self, enabled: bool) -> None:
        """Turn fast mode on or off; on is refused for a model without a faster tier."""
        if enabled and fast_service_tier(self.model) is None:
            raise SessionError("Fast mode is unavailable for the current model.")
        self.fast_mode = enabled

    def set_thinking_level(self, level: ThinkingLevel) -> ThinkingLevel:
        """Ask for ``level``; returns the effective (clamped) level."""
        before = self.thinking_level
        self.configured_thinking = level
        if self.thinking_level != before:
            self._announce_thinking()
        return self.thinking_level

    def cycle_thinking_level(self) -> ThinkingLevel | None:
        """The next level the model supports; ``None`` for a model without reasoning."""
        level = thinking.cycle(self.model, self.thinking_level)
        if level is not None:
            self.set_thinking_level(level)
        return level

    def available_thinking_levels(self) -> list[ThinkingLevel]:
        return thinking.available_levels(self.model)

    def _announce_thinking(self) -> None:
        self._record_thinking()
        level = self.thinking_level
        self.sink.publish(ThinkingLevelChanged(
            thinkingLevel=level if self.model.reasoning else msgspec.UNSET,
            configured=self.configured_thinking, resolved=level))

    # -- running -----------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Own the session nursery (runs live in it) until ``close()``.

        On cancellation the current run is cancelled with the nursery (no terminal frames).
        """
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    async def close(self) -> None:
        """Abort the run (its terminal events are still published) and stop ``serve``.

        Queued messages and tickets that never ran are reported aborted, and the lines still on
        their way to the session file are waited for (a failed one is the persistence failure).
        On cancellation the nursery is torn down without waiting (the file's writer thread still
        writes what it holds).
        """
        self._closing = True
        self.cancel_jobs()
        await self.abort(SHUTDOWN_REASON)
        self._abort_tickets()
        if self._unsettled:
            self._unsettled = False
            self.sink.publish(SessionSettled())
        await self._file_written()  # its last lines, before the exit status is known
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _turn_setup(self) -> TurnSetup:
        model = self.model
        oauth = self.registry.oauth_tokens(model.provider) is not None
        options = StreamOptions(api_key=self.registry.api_key(model.provider),
                                headers=self.registry.headers(model),
                                prepare=functools.partial(self._fresh_headers, model)
                                if oauth else None,
                                thinking=self.thinking_level,
                                service_tier=fast_service_tier(model) if self.fast_mode
                                else None)
        return TurnSetup(model=model, options=options, system_prompt=tuple(self.system_prompt),
                         tools=tuple(self.tools), http=self.http)

    async def _fresh_headers(self, model: Model) -> dict[str, str]:
        """The request headers of ``model`` with its OAuth login renewed first when it is
        about to expire (once per provider, however many calls need it). Raises ProviderError
        (``auth``) when the renewal fails. On cancellation nothing is renewed, or the renewal
        already being written completes."""
        await self.registry.refresh_if_due(model.provider, self.http.get())
        return self.registry.headers(model)

    def _agent_turn_setup(self) -> TurnSetup:
        """``_turn_setup`` for the agent's model calls: a ``/force`` applies to one of them."""
        setup = self._turn_setup()
        forced, self.forced_tool = self.forced_tool, None
        if forced is None or not any(t.name == forced for t in setup.tools):
            return setup
        return msgspec.structs.replace(
            setup, options=attrs.evolve(setup.options, tool_choice=forced))


@attrs.define(eq=False, repr=False)
class _AgentEvents:
    """The agent's sink: the session (which persists finished messages) then its host."""

    session: AgentSession

    def publish(self, event: Any) -> None:
        self.session.publish(event)

    @property
    def publish_update(self) -> Callable[[Any], None]:
        """The host's own, looked up on each use (the sink can be replaced; the agent looks it
        up once per model call): called once per streamed token, so no call of ours in
        between. (Streamed updates are not persisted.)"""
        return self.session.sink.publish_update

    @property
    def pace(self) -> Pace:
        """The host's own backpressure, looked up on each use like ``publish_update``."""
        return self.session.sink.pace


def _outcome(report: RunReport | None
             ) -> tuple[Literal["completed", "aborted", "error"], Any]:
    """``prompt_result``'s status and error for a run's report (None: never started)."""
    if report is None or report.outcome == "aborted":
        return "aborted", msgspec.UNSET
    if report.outcome == "completed":
        return "completed", msgspec.UNSET
    if report.failure is not None:
        return "error", PromptError(message=report.failure, retryable=False)
    last, problem = report.last, report.error
    return "error", PromptError(
        message=(last.errorMessage if last is not None and last.errorMessage
                 else "The model call failed"),
        retryable=problem.retryable if problem else False,
        provider=last.provider if last is not None else msgspec.UNSET,
        model=last.model if last is not None else msgspec.UNSET,
        httpStatus=problem.http_status if problem and problem.http_status else msgspec.UNSET)


def _branch_and_build(file: SessionFile, entry_id: str
                      ) -> tuple[SessionFile, str, tuple[list[m.AgentMessage], BranchSettings]]:
    """``branch_file`` and the new file's context and settings (blocking, for a worker thread:
    the new file is nobody else's yet)."""
    new, text = branch_file(file, entry_id)
    return new, text, (build_context(new), branch_settings(new))


def _open_file(path: Path) -> SessionFile:
    """Load a session file (blocking). ``SessionFile.open`` refuses anything but a regular file
    of at most ``MAX_SESSION_FILE_BYTES`` (``omp.files.UnusableFile``, a ValueError) before
    reading it: a FIFO could block forever and a device never end."""
    return SessionFile.open(path)


async def _load_file(path: Path) -> SessionFile:
    """Read a whole session file in a worker thread (a large file never blocks the loop).

    On cancellation the read is abandoned (its thread finishes on its own) and nothing changed.
    """
    return await trio.to_thread.run_sync(_open_file, path, abandon_on_cancel=True)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it is nested too deeply to be read"
    if isinstance(exc, OSError):
        return str(exc.strerror or exc)
    return str(exc)


def _plain_text(content: object) -> str:
    """The text blocks of a message's content (or the string itself)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(b.text for b in content if isinstance(b, m.TextContent))
