"""The session a host drives: a façade over parts with one job each.

* ``store`` (``omp.session.store.SessionStore``): the session file, its identity, branching and
  the views of it;
* ``models`` (``omp.session.model_control.ModelControl``): the model, thinking level, fast mode;
* ``runs`` (``omp.session.coordinator.RunCoordinator``): the runs, their tickets and
  settlement, the background jobs; it owns the session nursery (``serve``);
* ``maintenance`` (``omp.session.maintenance.Maintenance``): compaction, handoff, the title.

The façade keeps what ties them together: the tools and the system prompt built from them (once
per change of its inputs), the extensions, the agent (the live context and the queues) and its
event path. The session never writes frames: it publishes typed events to its ``EventSink``
(``omp.session.sink``); every finished message is appended to the session file as its
``message_end`` is published. Everything a part needs it gets in its constructor.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio

from ..agent.loop import Agent, Input, NoHooks, RunResult, ToolGate, TurnSetup, user_message
from ..commands import Problem, ReportOnce, Skill, load_skills
from ..config import agent_dir
from ..llm.builder import Pace
from ..llm.models import ModelRegistry
from ..llm.stream import HttpClient
from ..llm.types import ThinkingLevel
from ..protocol import messages as m
from ..protocol.commands import RequestId, TodoPhase
from ..protocol.events import MessageEnd
from ..protocol.payloads import Model
from ..tools.base import Tool, ToolContext
from ..tools.todo_state import TodoState
from .aborts import AbortRegistry
from .coordinator import BUSY, RunCoordinator
from .errors import SessionError
from .file import SessionFile
from .maintenance import Maintenance
from .model_control import ModelControl
from .reminders import TodoReminders
from .settings import Settings
from .sink import EventSink, NullSink, Published, Update
from .store import Adopted, SessionStore
from .system_prompt import PromptOptions

if TYPE_CHECKING:
    # Annotations only: the extension machinery loads with the first extension (omp.lazy),
    # the rules machinery with the first rules folder.
    from ..extensions.api import DeliverAs
    from ..extensions.runtime import Extensions
    from ..extensions.ui import ExtensionUI
    from .rules import RuleWatch

__all__ = ["BUSY", "AgentSession", "EventSink", "SessionError"]


@attrs.define(eq=False, repr=False)
class AgentSession:
    registry: ModelRegistry
    _start_model: Model = attrs.field(alias="model")
    _start_thinking: ThinkingLevel = attrs.field(default="off", alias="configured_thinking")
    """What the host asked for; the model may support less (see ``thinking_level``)."""
    cwd: Path = attrs.field(factory=Path.cwd)
    builtin_tools: Sequence[Tool] = ()
    """The built-in tools this session offers (``--tools`` chose them)."""
    tool_context: ToolContext = attrs.field(factory=lambda: ToolContext(Path.cwd()))
    prompt_options: PromptOptions = attrs.field(factory=lambda: PromptOptions(Path.cwd()))
    prompt_extra: str | None = None
    """A block the system prompt carries before its last one (a subagent's assignment)."""
    todos: TodoState = attrs.field(factory=TodoState)
    """Shared with the ``todo`` tool: ``set_todos`` and the model edit the same list."""
    sink: EventSink = attrs.field(factory=NullSink)
    settings: Settings = attrs.field(factory=Settings)
    _sessions_directory: Path | None = attrs.field(default=None, alias="sessions_directory")
    """Where new session files go (None: in memory)."""
    _start_file: SessionFile | None = attrs.field(default=None, alias="file")
    """A file to start in (a subagent's); ``open_startup_file`` picks one otherwise."""
    http: HttpClient = attrs.field(factory=HttpClient)
    """The HTTP client of the owner (``serve()``), which closes it."""
    aborts: AbortRegistry = attrs.field(factory=AbortRegistry)
    """The owner's abort registry: runs, retries and maintenance register here."""
    tools_from: Callable[[AgentSession], Sequence[Tool]] | None = None
    """Tools that need the session itself (the ``task`` tool, a subagent's ``yield``)."""
    on_shutdown_request: Callable[[], None] | None = None
    """What ``ctx.shutdown()`` calls (the server: end after the current command)."""
    auto_retry: bool = True
    """``set_auto_retry``: False turns every automatic retry off."""
    auto_compaction: bool = True
    """``set_auto_compaction``: whether compaction may start on its own."""
    task_depth: int = 0
    """How deep this session is in a tree of subagents (the main session: 0)."""
    approval: ToolGate | None = None
    """Tool approval (``omp.session.approval``); a subagent gets its parent's, so it asks
    through the parent's host. None: every call runs."""
    extensions: Extensions | None = attrs.field(default=None, init=False)
    skills: list[Skill] = attrs.field(factory=list, init=False)
    reported: ReportOnce = attrs.field(factory=ReportOnce, init=False)
    """Problems in the user's markdown files already shown (each is shown once)."""
    forced_tool: str | None = attrs.field(default=None, init=False)
    """``/force``: the tool the model must call in the next turn (cleared once used)."""
    host_tools: list[Tool] = attrs.field(factory=list, init=False)
    mcp_tools: list[Tool] = attrs.field(factory=list, init=False)
    """The tools of the connected MCP servers (``omp.mcp``), replaced as they change."""
    mcp_instructions: str | None = attrs.field(default=None, init=False)
    """The ``## MCP Server Instructions`` block (servers' ``instructions``), if any."""
    store: SessionStore = attrs.field(init=False)
    models: ModelControl = attrs.field(init=False)
    agent: Agent = attrs.field(init=False)
    runs: RunCoordinator = attrs.field(init=False)
    maintenance: Maintenance = attrs.field(init=False)
    reminders: TodoReminders = attrs.field(init=False)
    rules: RuleWatch | None = attrs.field(default=None, init=False)
    """TTSR rules (``use_rules``); None: none."""
    own_tools: list[Tool] = attrs.field(factory=list, init=False)
    """The built-in tools and those that need the session (``tools_from``)."""
    _active_tools: set[str] | None = attrs.field(default=None, init=False)
    _prompt: tuple[tuple[object, ...], list[str]] | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.store = SessionStore(self.cwd, self.publish, self._sessions_directory)
        self.models = ModelControl(self.registry, self._start_model, self.publish,
                                   self.store.persist, self.http, self._start_thinking)
        self.agent = Agent(sink=_AgentEvents(self), setup=self._agent_turn_setup,
                           gate=self.approval)
        self.runs = RunCoordinator(self.agent, self, self.publish, self.aborts,
                                   self._record, self._agent_end_hook, self.store.written,
                                   random.Random())
        self.maintenance = Maintenance(self.agent, self.models, self.store, self.runs,
                                       self.settings, self.http, self.aborts, self.turn_setup)
        self.reminders = TodoReminders(
            self.todos, self.settings.todo_reminders,
            enabled="todo" not in self.settings.disabled_tools)
        self.own_tools = list(self.builtin_tools)
        if self.tools_from is not None:
            self.own_tools += self.tools_from(self)
        if self._start_file is not None:
            self._adopt(self.store.adopt(self._start_file))

    # -- tools, skills, extensions and the system prompt -------------------------------------

    @property
    def all_tools(self) -> list[Tool]:
        """Every tool: the built-ins (an extension tool of the same name replaces one), the
        extensions' tools, the MCP servers', then the host's."""
        extension_tools: list[Tool] = (list(self.extensions.tools())
                                       if self.extensions is not None else [])
        replaced = {t.name for t in extension_tools}
        return [*(t for t in self.own_tools if t.name not in replaced), *extension_tools,
                *self.mcp_tools, *self.host_tools]

    @property
    def tools(self) -> list[Tool]:
        """What the model sees: ``all_tools``, less those ``set_active_tools`` left out."""
        active = self._active_tools
        return [t for t in self.all_tools if active is None or t.name in active]

    @property
    def system_prompt(self) -> list[str]:
        """The system prompt blocks, built once per change of what they are built from (the
        tools, the skills, the options): context files are not read again per model call."""
        tools = self.tools
        options = self.prompt_options
        key = (*((t.name, t.description) for t in tools), id(self.skills), self.prompt_extra,
               options.custom, options.append, id(options.context), self.mcp_instructions)
        if self._prompt is None or self._prompt[0] != key:
            blocks = self.prompt_options.build(tools)
            extra = [b for b in (self.mcp_instructions, self.prompt_extra) if b is not None]
            if extra:
                blocks = [*blocks[:-1], *extra, *blocks[-1:]]
            self._prompt = (key, blocks)
        return self._prompt[1]

    def use_approval(self, gate: ToolGate | None) -> None:
        """Every later tool call passes ``gate`` (None: none)."""
        self.approval = self.agent.gate = gate

    def set_host_tools(self, tools: Sequence[Tool]) -> None:
        """Replace the host's tools; the next model call (and system prompt) has them."""
        self.host_tools = list(tools)

    def set_mcp_tools(self, tools: Sequence[Tool]) -> None:
        """Replace the MCP servers' tools; the next model call (and system prompt) has them.
        A tool ``set_active_tools`` left out stays out; a new one is active."""
        if self._active_tools is not None:
            old = {t.name for t in self.mcp_tools}
            self._active_tools |= {t.name for t in tools if t.name not in old}
        self.mcp_tools = list(tools)

    def active_tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def set_active_tools(self, names: Sequence[str]) -> None:
        """Only these tools (unknown names are ignored) from the next model call on."""
        known = {t.name for t in self.all_tools}
        self._active_tools = {n for n in names if n in known}

    def load_skills(self) -> None:
        """(Re)discover the skills; the system prompt and ``read`` use the new list. A broken
        skill file is left out and said once on stderr."""
        directory = self.prompt_options.agent_directory or agent_dir()
        skills, problems = load_skills(directory, self.cwd, settings=self.settings.skills)
        self.skills = self.prompt_options.skills = self.tool_context.skills = skills
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

    def _agent_end_hook(self) -> Callable[[list[m.AgentMessage]], Awaitable[None]] | None:
        extensions = self.extensions
        if extensions is not None and extensions.listens("agent_end"):
            return extensions.agent_end
        return None

    # -- the event path ----------------------------------------------------------------------

    def publish(self, event: Published) -> None:
        """Publish a session event now (finished messages are persisted first)."""
        if isinstance(event, MessageEnd):
            self.store.append_message(event.message)
        self.sink.publish(event)

    def _record(self, message: m.AgentMessage) -> None:
        self.agent.messages.append(message)
        self.store.append_message(message)

    # -- identity, files and views (the store) -----------------------------------------------

    @property
    def session_id(self) -> str:
        return self.store.session_id

    @property
    def session_file(self) -> str | None:
        return self.store.session_file

    @property
    def session_name(self) -> str | None:
        return self.store.session_name

    def entries_json(self, since: str | None = None) -> list[dict[str, Any]]:
        return self.store.entries_json(since)

    def _adopt(self, adopted: Adopted) -> None:
        self.agent.messages[:] = adopted.messages
        if adopted.settings is not None:
            self.models.adopt(adopted.settings)
        if adopted.fresh:
            self.models.record_model()
            self.models.record_thinking()

    def open_startup_file(self, *, session_path: Path | None, resume: bool) -> None:
        """``--session FILE`` / ``--continue`` / a new file (see ``SessionStore``)."""
        self._adopt(self.store.open_startup(session_path=session_path, resume=resume))

    async def new_session(self, parent_session: str | None = None) -> None:
        """Abort, clear, and continue in a new session file (or a fresh in-memory session).
        A file that cannot be created changes nothing (SessionError); on cancellation before
        the file exists nothing was changed."""
        file = await self.store.load_new(parent_session)
        await self._reset()
        self._adopt(self.store.adopt(file))

    async def switch_session(self, path: Path) -> bool:
        """Continue the session in ``path`` (a new empty one there when it does not exist).
        Returns False (nothing changed) for a session recorded in another working directory:
        RPC has no way to ask the user whether to change directories (rpc-behavior §11.2)."""
        file = await self.store.load_switch(path)
        if file.cwd and Path(file.cwd) != self.cwd:
            return False
        await self._reset()
        self._adopt(self.store.adopt(file))
        return True

    async def open_session(self, directory: Path) -> tuple[bool, bool]:
        """The newest non-empty session in ``directory``, or a new one there; returns
        (cancelled, resumed)."""
        file, resumed = await self.store.load_open(directory, empty=not self.agent.messages)
        if file is not None:
            await self._reset()
            self._adopt(self.store.adopt(file))
        return False, resumed

    async def branch(self, entry_id: str) -> str:
        """A new file with the conversation before user message ``entry_id``; returns its
        text. The run in progress (if any) is not interrupted. Written in a worker thread; on
        cancellation nothing changed."""
        file, text, built = await self.store.branch(entry_id)
        self.runs.cancel_jobs()  # they worked for the old transcript
        self._adopt(self.store.adopt(file, built))
        self.runs.settle()
        return text

    async def _reset(self) -> None:
        await self.runs.reset()
        self.agent.messages.clear()
        self.todos.replace([])

    async def export_html(self, output_path: str | None) -> str:
        model = self.models.model
        return await self.store.export_html(output_path, messages=list(self.agent.messages),
                                            model=f"{model.provider}/{model.id}")

    # -- model and thinking (ModelControl) ---------------------------------------------------

    @property
    def model(self) -> Model:
        return self.models.model

    @property
    def thinking_level(self) -> ThinkingLevel:
        return self.models.thinking_level

    def set_model(self, provider: str, model_id: str) -> Model:
        return self.models.set_model(provider, model_id)

    def set_thinking_level(self, level: ThinkingLevel) -> ThinkingLevel:
        return self.models.set_thinking_level(level)

    def turn_setup(self) -> TurnSetup:
        """What the next model call of this session is made with."""
        return TurnSetup(model=self.models.model, options=self.models.stream_options(),
                         system_prompt=tuple(self.system_prompt), tools=tuple(self.tools),
                         http=self.http)

    def _agent_turn_setup(self) -> TurnSetup:
        """``turn_setup`` for the agent's model calls: a ``/force`` applies to one of them."""
        setup = self.turn_setup()
        forced, self.forced_tool = self.forced_tool, None
        if forced is None or not any(t.name == forced for t in setup.tools):
            return setup
        return msgspec.structs.replace(
            setup, options=msgspec.structs.replace(setup.options, tool_choice=forced))

    # -- state -------------------------------------------------------------------------------

    @property
    def is_streaming(self) -> bool:
        """True from the moment a prompt is accepted until its run has fully ended."""
        return self.runs.run is not None

    @property
    def is_compacting(self) -> bool:
        return self.maintenance.compacting

    @property
    def messages(self) -> list[m.AgentMessage]:
        return self.agent.messages

    @property
    def queued_message_count(self) -> int:
        return self.agent.queued_count

    # -- prompting ---------------------------------------------------------------------------

    def check_can_prompt(self, images: Sequence[m.ImageContent] = ()) -> None:
        """Raises SessionError when the current model cannot take a prompt (no key, images
        it does not accept)."""
        self.models.check_credentials()
        model = self.models.model
        if images and "image" not in model.input:
            raise SessionError(f"Model {model.provider}/{model.id} does not accept images")

    def prompt(self, text: str, images: Sequence[m.ImageContent] = (), *,
               streaming_behavior: str | None = None, request_id: RequestId | None = None,
               scope: trio.CancelScope | None = None) -> None:
        """Accept a prompt: start a run, or queue it while one is going. Raises SessionError
        (nothing was accepted) when busy without ``streaming_behavior``, or when the model
        cannot take it. Exactly one ``prompt_result`` follows an accepted prompt. ``scope``:
        the cancel scope the reader registered for it (an abort read after it aborts it)."""
        self.check_can_prompt(images)
        steer = self.is_streaming and streaming_behavior == "steer"
        self.runs.prompt(user_message(text, images, steering=steer),
                         streaming_behavior=streaming_behavior, request_id=request_id,
                         scope=scope)

    def prompt_message(self, message: Input, *, streaming_behavior: str | None = None,
                       request_id: RequestId | None = None,
                       scope: trio.CancelScope | None = None) -> None:
        """``prompt`` for a message already built (a skill's); the caller checked images."""
        self.models.check_credentials()
        self.runs.prompt(message, streaming_behavior=streaming_behavior,
                         request_id=request_id, scope=scope)

    def steer(self, text: str, images: Sequence[m.ImageContent] = ()) -> None:
        """Queue a steering message; on an idle session it starts a run."""
        self.check_can_prompt(images)
        self.runs.queue(user_message(text, images, steering=True), steer=True)

    def follow_up(self, text: str, images: Sequence[m.ImageContent] = ()) -> None:
        """Queue a follow-up; on an idle session it starts a run."""
        self.check_can_prompt(images)
        self.runs.queue(user_message(text, images), steer=False)

    def retry_failed_turn(self, request_id: RequestId | None = None) -> bool:
        """``/retry``: run the last failed turn again; False when there is nothing to retry."""
        if not self.is_streaming:
            self.models.check_credentials()
        return self.runs.retry(request_id)

    def set_todos(self, phases: list[TodoPhase]) -> list[TodoPhase]:
        """Replace the todo list; phases and tasks keep the ids the host gave them."""
        self.todos.replace(phases)
        return self.todos.phases

    # -- what extensions drive (omp.extensions.api.ExtensionHost) -------------------------

    def request_abort(self) -> None:
        """Abort the run without waiting for it (``ctx.abort()``)."""
        self.runs.request_abort()

    def request_shutdown(self) -> None:
        if self.on_shutdown_request is not None:
            self.on_shutdown_request()

    def send_user_message(self, text: str, images: Sequence[m.ImageContent] = (), *,
                          deliver_as: DeliverAs | None = None) -> None:
        """A prompt from an extension: idle, it starts a run; during one it is queued
        (steering unless ``deliver_as="followUp"``). No ticket of its own: no host asked (an
        extension command's ticket takes the run it starts)."""
        self.check_can_prompt(images)
        message = user_message(text, images, steering=deliver_as != "followUp"
                               and self.is_streaming)
        self.runs.deliver(message, trigger_turn=True, follow_up=deliver_as == "followUp")

    def send_custom_message(self, message: m.CustomMessage, *, trigger_turn: bool,
                            deliver_as: DeliverAs | None) -> None:
        """An extension's ``custom`` message: queued during a run; idle, it starts a run
        (``trigger_turn``) or is just added to the context."""
        self.runs.deliver(message, trigger_turn=trigger_turn,
                          follow_up=deliver_as == "followUp")

    # -- the run's host (omp.session.run.RunHost) --------------------------------------------

    def drop_failed_turn(self, failed: m.AssistantMessage) -> None:
        """Remove a failed attempt's last turn from the live context (the file keeps it)."""
        messages = self.agent.messages
        if any(msg is failed for msg in messages):
            index = max(i for i, msg in enumerate(messages) if msg is failed)
            del messages[index:]  # its synthetic "not executed" tool results go with it

    def use_rules(self, watch: RuleWatch | None) -> None:
        """TTSR rules watch every later model call (None: none)."""
        self.rules = self.agent.watch = watch

    def inject_rules(self, result: RunResult) -> bool:
        watch = self.rules
        if watch is None:
            return False
        from .rules import Interrupt  # loaded already: ``watch`` is one of its objects

        interrupt = result.cut
        if interrupt is not None:
            assert isinstance(interrupt, Interrupt)
            cut = result.last
            if watch.settings.contextMode == "discard" and cut is not None:
                self.drop_failed_turn(cut)  # the cut message leaves the context
        else:
            interrupt = watch.take_pending()
            if interrupt is None or result.outcome != "completed":
                return False
        self._record(watch.injection(interrupt))  # hidden: no message frames
        return True

    def remind_todos(self, last: m.AssistantMessage | None) -> bool:
        if self.agent.stop_requested:
            return False
        due = self.reminders.due(last)
        if due is None:
            return False
        event, message = due
        self.publish(event)
        self._record(message)  # hidden: in the context and the file, no message frames
        return True

    def can_compact(self) -> bool:
        return self.maintenance.can_compact()

    def needs_compaction(self) -> bool:
        return self.auto_compaction and self.maintenance.needs_compaction()

    async def summarize(self) -> Any:
        return await self.maintenance.summarize()

    # -- lifecycle ---------------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Own the session nursery until ``close()``. On cancellation the current run is
        cancelled with the nursery (no terminal frames)."""
        await self.runs.serve(task_status=task_status)

    async def close(self) -> None:
        """Abort the run (its terminal events are still published), answer every open
        ticket, stop ``serve``. On cancellation the nursery is torn down without waiting."""
        await self.runs.close()

    async def wait_for_idle(self) -> None:
        """Wait until no run is going. On cancellation, stops waiting."""
        await self.runs.wait_for_idle()


@attrs.define(eq=False, repr=False)
class _AgentEvents:
    """The agent's sink: the session (which persists finished messages) then its host."""

    session: AgentSession

    def publish(self, event: Published) -> None:
        self.session.publish(event)

    @property
    def publish_update(self) -> Callable[[Update], None]:
        """The host's own, looked up on each use (the sink can be replaced; the agent looks it
        up once per model call): called once per streamed token, so no call of ours in
        between. (Streamed updates are not persisted.)"""
        return self.session.sink.publish_update

    @property
    def pace(self) -> Pace:
        """The host's own backpressure, looked up on each use like ``publish_update``."""
        return self.session.sink.pace
