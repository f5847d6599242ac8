"""The session a host drives: a façade over parts with one job each.

* ``store`` (``omp.session.store.SessionStore``): the session file, its identity, branching and
  the views of it;
* ``models`` (``omp.session.model_control.ModelControl``): the model, thinking level, fast mode;
* ``runs`` (``omp.session.coordinator.RunCoordinator``): the runs, their tickets and
  settlement, the background jobs' tasks; it owns the session nursery (``run_nursery``);
* ``jobs`` (``omp.session.jobs.Jobs``): the background jobs as ``/jobs`` lists them, their
  limit and their delivery (a main session's are its tools' too: ``ToolContext.jobs``);
* ``maintenance`` (``omp.session.maintenance.Maintenance``): compaction, handoff, the title;
* ``toolset`` (``omp.session.toolset.ToolSet``): the tools offered (own, extensions', MCP
  servers', host's) and the system prompt built from them (once per change of its inputs);
* ``between`` (``omp.session.interjections.Interjections``): what a run changes in the context
  between attempts (a failed turn dropped, TTSR rules, todo reminders).

The façade keeps what ties them together: the skills, the extensions, the agent (the live
context and the queues) and its event path. The session never writes frames: it publishes
typed events to its ``EventSink`` (``omp.session.sink``); every finished message is appended to
the session file as its ``message_end`` is published. Everything a part needs it gets in its
constructor.
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

from ..agent.loop import Agent, Input, ToolGate, TurnSetup, user_message
from ..commands import Problem, ReportOnce, Skill, load_skills
from ..config import agent_dir
from ..llm.builder import Pace
from ..llm.models import ModelRegistry
from ..llm.stream import HttpClient
from ..llm.types import ThinkingLevel
from ..protocol import messages as m
from ..protocol.commands import RequestId
from ..protocol.events import MessageEnd
from ..protocol.payloads import Model
from ..tools.base import Tool, ToolContext
from ..tools.todo_state import TodoState
from .aborts import AbortRegistry
from .coordinator import BUSY, RunCoordinator
from .errors import SessionError
from .file import SessionFile
from .interjections import Interjections
from .jobs import Jobs
from .maintenance import Maintenance
from .mcp_tools import McpTools
from .model_control import ModelControl
from .reminders import TodoReminders
from .settings import Settings
from .sink import EventSink, NullSink, Published, Update
from .store import Adopted, SessionStore
from .system_prompt import PromptOptions
from .toolset import ToolSet

if TYPE_CHECKING:
    # Annotations only: the extension machinery loads with the first extension (omp.lazy).
    from ..extensions.api import DeliverAs
    from ..extensions.runtime import Extensions
    from ..extensions.ui import ExtensionUI

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
    """Shared with the ``todo`` tool: the RPC ``set_todos`` and the model edit the same list."""
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
    auto_retry: bool = True
    auto_compaction: bool = True
    task_depth: int = 0
    """How deep this session is in a tree of subagents (the main session: 0)."""
    mcp: McpTools = attrs.field(factory=McpTools)
    """The MCP servers' tools and instructions (a subagent: its parent's)."""
    approval: ToolGate | None = None
    """Tool approval (``omp.session.approval``); a subagent gets its parent's, so it asks
    through the parent's host. None: every call runs."""
    extensions: Extensions | None = attrs.field(default=None, init=False)
    skills: list[Skill] = attrs.field(factory=list, init=False)
    reported: ReportOnce = attrs.field(factory=ReportOnce, init=False)
    """Problems in the user's markdown files already shown (each is shown once)."""
    _on_shutdown_request: Callable[[], None] | None = attrs.field(default=None, init=False)
    """What ``ctx.shutdown()`` calls (the RPC server: end after the current command)."""
    store: SessionStore = attrs.field(init=False)
    models: ModelControl = attrs.field(init=False)
    agent: Agent = attrs.field(init=False)
    runs: RunCoordinator = attrs.field(init=False)
    jobs: Jobs = attrs.field(init=False)
    maintenance: Maintenance = attrs.field(init=False)
    between: Interjections = attrs.field(init=False)
    """What a run changes in the context between attempts (rules, todo reminders)."""
    toolset: ToolSet = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.store = SessionStore(self.cwd, self.publish, self._sessions_directory,
                                  max_line_bytes=self.settings.stream.maxSessionLineBytes)
        self.models = ModelControl(self.registry, self._start_model, self.publish,
                                   self.store.persist, self.http, self._start_thinking,
                                   stream=self.settings.stream)
        self.agent = Agent(sink=_AgentEvents(self), setup=self._agent_turn_setup,
                           current_model=lambda: self.models.model, gate=self.approval)
        self.runs = RunCoordinator(self.agent, self, self.publish, self.aborts,
                                   self._record, self._agent_end_hook, self.store.written,
                                   random.Random())
        self.jobs = Jobs(self.runs, self.settings)
        if self.task_depth == 0:
            # A subagent runs its commands in their calls (its result must not wait for jobs).
            self.tool_context.use_jobs(self.jobs)
        self.maintenance = Maintenance(self.agent, self.models, self.store, self.runs,
                                       self.settings, self.http, self.aborts, self.turn_setup)
        self.between = Interjections(self.agent, self.publish, self._record, TodoReminders(
            self.todos, self.settings.todo_reminders,
            enabled="todo" not in self.settings.disabled_tools))
        own = list(self.builtin_tools)
        self.toolset = ToolSet(self.prompt_options, own, self._extension_tools, self.mcp,
                               self.settings.xdev, self.prompt_extra)
        if self.tools_from is not None:
            own += self.tools_from(self)
        if self._start_file is not None:
            self._adopt(self.store.adopt(self._start_file))

    # -- tools, skills, extensions and the system prompt -------------------------------------

    @property
    def tools(self) -> list[Tool]:
        """What the model is offered (``omp.session.toolset``)."""
        return self.toolset.offered()

    @property
    def system_prompt(self) -> list[str]:
        return self.toolset.system_prompt()

    def _extension_tools(self) -> Sequence[Tool]:
        return self.extensions.tools() if self.extensions is not None else ()

    def use_approval(self, gate: ToolGate | None) -> None:
        """Every later tool call passes ``gate`` (None: none)."""
        self.approval = gate
        self.agent.use_gate(gate)

    def set_host_tools(self, tools: Sequence[Tool]) -> None:
        """Replace the host's tools; the next model call (and system prompt) has them."""
        self.toolset.set_host(tools)

    def active_tool_names(self) -> list[str]:
        return [t.name for t in self.tools]

    def set_active_tools(self, names: Sequence[str]) -> None:
        self.toolset.set_active(names)

    def set_auto_retry(self, enabled: bool) -> None:
        """Whether a transient failure is retried, from the next one on (not a waiting retry)."""
        self.auto_retry = enabled

    def set_auto_compaction(self, enabled: bool) -> None:
        """Whether compaction may start on its own, from the next check on (``compact`` may)."""
        self.auto_compaction = enabled

    def load_skills(self) -> None:
        """(Re)discover the skills; a broken skill file is left out and said once on stderr."""
        directory = self.prompt_options.agent_directory or agent_dir()
        skills, problems = load_skills(directory, self.cwd, settings=self.settings.skills)
        self.skills = skills
        self.prompt_options.use_skills(skills)
        self.tool_context.use_skills(skills)
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
        self.agent.use_hooks(extensions if extensions is not None and extensions.active else None)

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
        RPC has no way to ask the user whether to change directories
        (docs/design/sessions.md#switch_session). On cancellation before the old run has ended
        the old session stays (a file just created stays on disk); after, the switch completes."""
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

    async def branch(self, entry_id: str | None) -> str:
        """A new file with the conversation before user message ``entry_id``, or with the whole
        current branch when None (pi's ``clone``); returns that message's text ("" for None).
        The run going on is not interrupted. In a worker thread; on cancellation nothing changed."""
        file, text, built = await (self.store.branch(entry_id) if entry_id is not None
                                   else self.store.clone())
        self.runs.cancel_jobs()  # they worked for the old transcript
        self._adopt(self.store.adopt(file, built))
        self.runs.settle()
        return text

    async def _reset(self) -> None:
        await self.runs.abort_all()
        self.agent.messages.clear()
        self.todos.replace([])
        await self.tool_context.session_changed()

    async def export_html(self, output_path: str | None) -> str:
        """The session as one HTML page (``SessionStore.export_html``; on cancellation as there)."""
        return await self.store.export_html(output_path, messages=list(self.agent.messages),
                                            model=f"{self.model.provider}/{self.model.id}")

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
                         http=self.http, unlisted=tuple(self.toolset.devices()),
                         alias=self.toolset.alias)

    def _agent_turn_setup(self) -> TurnSetup:
        """``turn_setup`` for the agent's model calls: a ``/force`` applies to one of them."""
        setup = self.turn_setup()
        forced = self.toolset.take_forced()
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

    # -- what extensions drive (omp.extensions.api.ExtensionHost) -------------------------

    def abort_nowait(self) -> None:
        """Abort the run without waiting for it (``ctx.abort()``)."""
        self.runs.abort_nowait()

    def request_shutdown(self) -> None:
        if self._on_shutdown_request is not None:
            self._on_shutdown_request()

    def use_shutdown_request(self, callback: Callable[[], None] | None) -> None:
        """``ctx.shutdown()`` calls ``callback`` from now on (None: it does nothing)."""
        self._on_shutdown_request = callback

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

    def append_entry(self, custom_type: str, data: Any = None) -> None:
        """A ``custom`` entry (extension state, not in the context); None: no ``data``."""
        self.store.persist(lambda f: f.append_custom(
            custom_type, msgspec.UNSET if data is None else data))

    def set_session_name(self, name: str) -> None:
        self.store.set_session_name(name)

    # -- the run's host (omp.session.run.RunHost) --------------------------------------------

    def can_compact(self) -> bool:
        return self.maintenance.can_compact()

    def needs_compaction(self) -> bool:
        return self.auto_compaction and self.maintenance.needs_compaction()

    async def summarize(self) -> Any:
        """``Maintenance.summarize`` for the run saga; on cancellation nothing was changed."""
        return await self.maintenance.summarize()

    # -- lifecycle ---------------------------------------------------------------------------

    async def run_nursery(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Own the session nursery until ``aclose()``. On cancellation the current run is
        cancelled with the nursery (no terminal frames)."""
        await self.runs.run_nursery(task_status=task_status)

    async def aclose(self) -> None:
        """Abort the run (its terminal events are still published), answer every open
        ticket, stop ``run_nursery``. On cancellation the nursery is torn down without waiting."""
        await self.runs.aclose()

    async def wait_for_idle(self) -> None:
        """Wait until no run is going. On cancellation, stops waiting."""
        await self.runs.wait_for_idle()


class _AgentEvents(msgspec.Struct, eq=False):
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

