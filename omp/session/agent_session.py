"""The session a host drives.

The part of AgentSession that needs no agent loop yet: the model and thinking level a run will
use, the queue modes that later steer the loop, and the todo list. The run and the session file
attach here in later work. ``omp.rpc`` reads and changes the session only through this class; the
session never writes frames: it publishes events to its listeners.
"""

from __future__ import annotations

import random
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import msgspec
import trio

from ..agent.loop import Agent, TurnSetup, now_ms, to_llm, user_message
from ..llm import thinking
from ..llm.models import ModelRegistry
from ..llm.types import THINKING_LEVELS, Context, StreamOptions, ThinkingLevel
from ..protocol import messages as m
from ..protocol.commands import InterruptMode, QueueMode, RequestId, TodoPhase
from ..protocol.events import (
    AutoCompactionEnd,
    AutoCompactionStart,
    AutoRetryEnd,
    AutoRetryStart,
    MessageEnd,
    Notice,
    PromptError,
    PromptResult,
    SessionSettled,
    ThinkingLevelChanged,
)
from ..protocol.payloads import CompactionResult, Model
from ..tools.base import Tool, ToolContext
from ..tools.todo_state import TodoState
from .settings import Settings
from .system_prompt import PromptOptions

if TYPE_CHECKING:
    from ..tools.shell import ShellResult
    from .store import SessionFile

HANDOFF_PROMPT = (
    "Write a handoff document for another instance of yourself that will continue this work "
    "without this conversation. Give the exact technical state: file paths, symbols, commands, "
    "test results and the decisions taken and why. Use the imperative voice and never mention "
    "the handoff itself. Use these sections:\n\n## Goal\n## Constraints & Preferences\n"
    "## Progress\n### Done\n### In Progress\n### Pending\n## Key Decisions\n"
    "## Critical Context\n## Next Steps")

BUSY = ("Agent is already processing. Use steer() or followUp() to queue messages, or wait for "
        "completion.")


class SessionError(Exception):
    """A request the session refuses; the message is meant for the host as it is."""


class EventSink(Protocol):
    """Where the session's events go (the RPC server, or the one-shot CLI)."""

    def publish(self, event: Any) -> None:
        """Deliver at once (never blocks): state changes caused by a command."""

    async def publish_wait(self, event: Any) -> None:
        """Deliver, waiting while the consumer is far behind (streaming output)."""


class _NullSink:
    def publish(self, event: Any) -> None:
        pass

    async def publish_wait(self, event: Any) -> None:
        await trio.lowlevel.checkpoint()


@attrs.define(eq=False)
class PromptTicket:
    """An accepted prompt awaiting its one ``prompt_result``."""

    request_id: RequestId | None
    message: m.UserMessage


@attrs.define(eq=False)
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
    agent: Agent = attrs.field(init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _run_done: trio.Event | None = attrs.field(default=None, init=False)
    """Set when the current run (scheduled or going) has fully ended; None when idle."""
    _tickets: list[PromptTicket] = attrs.field(factory=list, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _unsettled: bool = attrs.field(default=False, init=False)
    _deferred: list[m.AgentMessage] = attrs.field(factory=list, init=False)
    settings: Settings = attrs.field(factory=Settings)
    file: SessionFile | None = None
    """The session on disk (None with ``--no-session``): every finished message, model and
    thinking-level change is appended and flushed as it happens."""
    persistence_failure: str | None = None
    """Why the session file stopped being written, once it did (the process then exits 1)."""
    sessions_directory: Path | None = None
    """Where new session files go."""
    _session_id: str = attrs.field(factory=lambda: str(uuid.uuid4()), init=False)
    _name: str | None = attrs.field(default=None, init=False)
    auto_retry: bool = True
    """``set_auto_retry``: False turns every automatic retry off."""
    auto_compaction: bool = True
    """``set_auto_compaction``: whether compaction may start on its own."""
    _retry_decision: tuple[float, m.AssistantMessage] | None = attrs.field(default=None,
                                                                            init=False)
    _retry_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _retry_scope_cancelled: bool = attrs.field(default=False, init=False)
    _saga_attempts: int = attrs.field(default=0, init=False)
    _rng: random.Random = attrs.field(factory=random.Random, init=False)
    _compaction_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _overflow_recovery: bool = attrs.field(default=False, init=False)
    """This run overflowed and will be compacted, then run again."""
    _overflow_done: bool = attrs.field(default=False, init=False)
    """The prompt's one overflow recovery was used."""

    def __attrs_post_init__(self) -> None:
        self.agent = Agent(emit=self._agent_event, setup=self._turn_setup)

    @property
    def tools(self) -> list[Tool]:
        """What the model sees: the built-in tools, then the host's."""
        return [*self.builtin_tools, *self.host_tools]

    def set_host_tools(self, tools: Sequence[Tool]) -> None:
        """Replace the host's tools; the next model call (and system prompt) has them."""
        self.host_tools = list(tools)
        self.system_prompt = self.prompt_options.build(self.tools)

    def subscribe(self, sink: EventSink) -> None:
        """Send every session event to ``sink`` (one sink: the RPC server or the CLI)."""
        self.sink = sink

    def _publish(self, event: Any) -> None:
        self.sink.publish(event)

    async def _agent_event(self, event: Any) -> None:
        if isinstance(event, MessageEnd) and self.file is not None:
            self._persist(lambda f: f.append_message(event.message))
        await self.sink.publish_wait(event)

    def _persist(self, write: Callable[[SessionFile], object]) -> None:
        """Append to the session file. A write failure is reported once as a notice and the
        session goes on in memory: the run is not lost because the disk is."""
        if self.file is None:
            return
        try:
            write(self.file)
        except OSError as exc:
            path = self.file.path
            self.file = None
            self.persistence_failure = f"the session file {path} could not be written: " + (
                f"{exc.strerror or exc}")
            self._publish(Notice(level="error", source="session-persistence",
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
        name = name.strip()
        if not name:
            raise SessionError("Session name cannot be empty")
        if self.file is not None:
            try:
                self.file.set_name(name)
            except (OSError, ValueError) as exc:
                raise SessionError(f"Session name cannot be saved: {exc}") from None
        else:
            self._name = name

    async def _reset(self) -> None:
        """Stop whatever runs and empty the live state (before a session change)."""
        await self.abort()
        for ticket in self._tickets:
            self._publish(PromptResult(id=ticket.request_id, agentInvoked=True,
                                       status="aborted", sessionSettled=True))
        self._tickets.clear()
        self.agent.messages.clear()
        self.agent.steering.clear()
        self.agent.follow_ups.clear()
        self._deferred.clear()
        self.todos.replace([])

    def _adopt(self, file: SessionFile | None) -> None:
        """Make ``file`` the session: its current branch becomes the live context, and the
        model it last used (when known and available) the current model."""
        self.file = file
        self._name = None
        if file is None:
            self._session_id = str(uuid.uuid4())
            return
        from .store import branch_settings, build_context

        self.agent.messages[:] = build_context(file)
        settings = branch_settings(file)
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
        from .store import SessionFile, newest_session

        assert self.sessions_directory is not None
        try:
            if session_path is not None:
                if session_path.exists():
                    self._adopt(SessionFile.open(session_path))
                    return
                self._adopt(SessionFile.create_at(session_path, cwd=str(self.cwd)))
            elif resume and (newest := newest_session(self.sessions_directory)) is not None:
                self._adopt(SessionFile.open(newest))
                return
            else:
                self._adopt(SessionFile.create(self.sessions_directory, cwd=str(self.cwd)))
        except (OSError, ValueError) as exc:
            raise SessionError(f"Cannot open the session file: {exc}") from None
        self.start_file()

    def start_file(self) -> None:
        """Record the model and thinking level a fresh file starts with."""
        self._record_model()
        self._record_thinking()

    async def new_session(self, parent_session: str | None = None) -> None:
        """Abort, clear, and continue in a new session file (or a fresh in-memory session)."""
        from .store import SessionFile

        await self._reset()
        if self.file is None or self.sessions_directory is None:
            self._adopt(None)
            return
        try:
            file = SessionFile.create(self.sessions_directory, cwd=str(self.cwd),
                                      parent_session=parent_session)
        except OSError as exc:
            raise SessionError(f"Cannot create a session file: {exc.strerror or exc}") from None
        self._adopt(file)
        self.start_file()

    async def switch_session(self, path: Path) -> bool:
        """Continue the session in ``path`` (a new empty one there when it does not exist).

        Returns False (nothing changed) for a session recorded in another working directory:
        RPC has no way to ask the user whether to change directories (rpc-behavior §11.2).
        """
        if self.file is None and self.sessions_directory is None:
            raise SessionError("switch_session requires session persistence (omit --no-session)")
        from .store import SessionFile

        if not await trio.Path(path.parent).is_dir():
            raise SessionError(f"File not found: {path}")
        try:
            file = (SessionFile.open(path) if await trio.Path(path).exists() else
                    SessionFile.create_at(path, cwd=str(self.cwd)))
        except (OSError, ValueError) as exc:
            raise SessionError(f"Cannot open session {path}: {exc}") from None
        if file.cwd and Path(file.cwd) != self.cwd:
            return False
        await self._reset()
        self._adopt(file)
        if not file.entries:
            self.start_file()
        return True

    async def open_session(self, directory: Path) -> tuple[bool, bool]:
        """The newest non-empty session in ``directory``, or a new one there.

        Returns (cancelled, resumed).
        """
        if self.file is None:
            raise SessionError("open_session requires session persistence (omit --no-session)")
        from .store import SessionFile, newest_session

        newest = newest_session(directory, non_empty=True)
        if newest is not None and self.file is not None and newest == self.file.path:
            return False, True
        if (newest is None and self.file is not None and self.file.path.parent == directory
                and not self.agent.messages):
            return False, False  # already the empty session of that directory
        await self._reset()
        if newest is not None:
            self._adopt(SessionFile.open(newest))
            return False, True
        self.sessions_directory = directory
        self._adopt(SessionFile.create(directory, cwd=str(self.cwd)))
        self.start_file()
        return False, False

    def branch(self, entry_id: str) -> str:
        """A new file with the conversation before user message ``entry_id``; returns its text.

        The run in progress (if any) is not interrupted.
        """
        if self.file is None:
            raise SessionError("branch requires session persistence (omit --no-session)")
        from .store import branch_file

        try:
            file, text = branch_file(self.file, entry_id)
        except ValueError:
            raise SessionError("Invalid entry ID for branching") from None
        self._adopt(file)
        return text

    def branch_messages(self) -> list[tuple[str, str]]:
        from .store import user_messages

        return [] if self.file is None else user_messages(self.file)


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
        return self._run_done is not None

    @property
    def is_compacting(self) -> bool:
        return self._compaction_scope is not None

    # -- compaction --------------------------------------------------------------------------

    async def compact(self, custom_instructions: str | None = None) -> CompactionResult:
        """Summarise the older part of the context with the current model (manual ``compact``).

        Aborts the run in progress first. Raises SessionError ("Nothing to compact (session too
        small)", "Compaction already in progress", "Compaction cancelled", the provider's
        error). On cancellation nothing was changed.
        """
        if self.is_compacting:
            raise SessionError("Compaction already in progress")
        await self.abort()
        result = await self._compact(custom_instructions)
        if result is None:
            raise SessionError("Nothing to compact (session too small)")
        return result

    async def _compact(self, custom_instructions: str | None) -> CompactionResult | None:
        from ..llm.errors import ProviderError
        from .compaction import compact

        setup = self._turn_setup()
        scope = self._compaction_scope = trio.CancelScope()
        try:
            with scope:
                plan = await compact(self.model, setup.options, list(self.agent.messages),
                                     self.settings.compaction,
                                     custom_instructions=custom_instructions)
        except ProviderError as exc:
            raise SessionError(f"Compaction failed: {exc.message}") from None
        finally:
            self._compaction_scope = None
        if scope.cancelled_caught:
            raise SessionError("Compaction cancelled")
        if plan is None:
            return None
        first_kept = plan.kept[0] if plan.kept else None
        entry_id = self._entry_id_of(first_kept) if first_kept is not None else None
        self.agent.messages[:] = plan.messages(now_ms())
        self._persist(lambda f: f.append_compaction(
            plan.summary, entry_id or (f.leaf_id or ""), plan.tokens_before, plan.details,
            tokens_after=plan.tokens_after))
        return plan.result(entry_id or "")

    async def handoff(self, custom_instructions: str | None = None) -> None:
        """Replace the older context by a handoff document the model writes (agent-core §6.7).

        One model call over the live context plus the handoff instructions; the document is
        committed as a compaction entry with ``method: "handoff"``. Refused while a run goes
        on. Raises SessionError with the spec's messages. On cancellation (``abort``) nothing
        was changed and "Handoff cancelled" is raised.
        """
        from ..llm.stream import ModelCall
        from .compaction import (
            estimate_context_tokens,
            estimate_tokens,
            file_operations,
            find_cut_point,
            with_file_lists,
        )

        if self.is_streaming:
            raise SessionError("Cannot hand off while a response is in progress")
        if self.is_compacting:
            raise SessionError("Compaction already in progress")
        messages = list(self.agent.messages)
        if sum(1 for msg in messages if isinstance(
                msg, m.UserMessage | m.AssistantMessage | m.ToolResultMessage)) < 2:
            raise SessionError("Nothing to hand off (no messages yet)")
        boundary = next((i + 1 for i in range(len(messages) - 1, -1, -1)
                         if isinstance(messages[i], m.CompactionSummaryMessage)), 0)
        cut = find_cut_point(messages[boundary:], self.settings.compaction.keepRecentTokens)
        if cut is None:
            raise SessionError("Nothing to hand off (already compacted)")
        cut += boundary
        setup = self._turn_setup()
        request = HANDOFF_PROMPT + (f"\n\nAdditional focus: {custom_instructions}"
                                    if custom_instructions else "")
        context = Context(system_prompt=setup.system_prompt,
                          messages=(*to_llm(messages), user_message(request)))
        call = ModelCall(self.model, context, setup.options)

        async def ignore(event: object) -> None:
            await trio.lowlevel.checkpoint()

        scope = self._compaction_scope = trio.CancelScope()
        try:
            with scope:
                final = await call.run(ignore)
        finally:
            self._compaction_scope = None
        if scope.cancelled_caught:
            raise SessionError("Handoff cancelled")
        if call.error is not None:
            raise SessionError(f"Handoff failed: {call.error.message}")
        document = "".join(b.text for b in final.content if isinstance(b, m.TextContent))
        if not document.strip():
            raise SessionError("Handoff generation produced no content")
        details = file_operations(messages[:cut])
        summary = with_file_lists(document.strip(), details)
        kept = messages[cut:]
        tokens_before = estimate_context_tokens(messages)
        summary_message = m.CompactionSummaryMessage(
            summary=summary, tokensBefore=tokens_before, timestamp=now_ms(), method="handoff")
        tokens_after = estimate_tokens(summary_message) + sum(estimate_tokens(x) for x in kept)
        entry_id = self._entry_id_of(kept[0]) if kept else None
        self.agent.messages[:] = [msgspec.structs.replace(summary_message,
                                                          tokensAfter=tokens_after), *kept]
        self._persist(lambda f: f.append_compaction(
            summary, entry_id or (f.leaf_id or ""), tokens_before, details,
            tokens_after=tokens_after, method="handoff"))

    def _entry_id_of(self, message: m.AgentMessage) -> str | None:
        """The session-file entry that holds ``message`` (the same object once loaded or
        appended)."""
        if self.file is None:
            return None
        for entry in self.file.branch_path():
            if getattr(entry, "message", None) is message:
                return str(entry.id)
        return None

    async def _auto_compact(self, reason: Literal["threshold", "overflow"]) -> bool:
        """Automatic compaction (agent-core §6.2); True when the context was compacted."""
        self._publish(AutoCompactionStart(reason=reason, action="context-full"))
        try:
            result = await self._compact(None)
        except SessionError as exc:
            self._publish(AutoCompactionEnd(action="context-full", aborted="cancelled" in str(
                exc), willRetry=False, errorMessage=str(exc)))
            return False
        compacted = result is not None
        self._publish(AutoCompactionEnd(
            action="context-full", aborted=False, willRetry=reason == "overflow" and compacted,
            result=result if result is not None else msgspec.UNSET,
            skipped=True if result is None else msgspec.UNSET))
        return compacted

    def _needs_compaction(self) -> bool:
        from .compaction import should_compact

        usage = self.context_usage()
        return (self.auto_compaction and usage is not None
                and should_compact(usage[0], usage[1], self.settings.compaction))

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
        return not self.is_streaming and not self.agent.queued_count

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
        from .compaction import estimate_context_tokens

        window = self.model.contextWindow
        if not window:
            return None
        return estimate_context_tokens(self.agent.messages), window

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

        Queued messages and tickets that never ran are reported aborted. On cancellation the
        nursery is torn down without waiting.
        """
        self._closing = True
        await self.abort()
        for ticket in self._tickets:
            self._publish(PromptResult(id=ticket.request_id, agentInvoked=True,
                                       status="aborted", sessionSettled=True))
        self._tickets.clear()
        if self._unsettled:
            self._unsettled = False
            self._publish(SessionSettled())
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _turn_setup(self) -> TurnSetup:
        model = self.model
        options = StreamOptions(api_key=self.registry.api_key(model.provider),
                                headers=self.registry.headers(model),
                                thinking=self.thinking_level)
        return TurnSetup(model=model, options=options, system_prompt=tuple(self.system_prompt),
                         tools=tuple(self.tools))

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
        if self.is_streaming:
            if streaming_behavior is None:
                raise SessionError(BUSY)
            steer = streaming_behavior == "steer"
            message = user_message(text, images, steering=steer)
            (self.agent.queue_steering if steer else self.agent.queue_follow_up)(message)
            self._tickets.append(PromptTicket(request_id, message))
            return
        message = user_message(text, images)
        self._tickets.append(PromptTicket(request_id, message))
        self._start_run([message])

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

    async def abort(self) -> None:
        """Abort the run and wait until it has ended (terminal events published).

        Returns at once when idle. On cancellation, stops waiting (the abort still happens).
        """
        if self._compaction_scope is not None:
            self._compaction_scope.cancel()
        done = self._run_done
        if done is None:
            return
        self.agent.abort()
        self.abort_retry()
        await done.wait()

    def _start_run(self, prompts: list[m.UserMessage]) -> None:
        if self._nursery is None or self._closing:
            raise SessionError("The session is closed")
        for message in self._deferred:
            self.agent.messages.append(message)
            self._persist(lambda f, msg=message: f.append_message(msg))  # type: ignore[misc]
        self._deferred.clear()
        done = self._run_done = trio.Event()
        self._unsettled = True
        self._nursery.start_soon(self._run, prompts, done)

    async def _run(self, prompts: list[m.UserMessage], done: trio.Event) -> None:
        """One prompt's work: the run, and the automatic retries of a failed model call.

        Retry saga (agent-core §5): a run that ends in a retryable error is followed by
        ``auto_retry_start``, a backoff (trio time; ``abort_retry`` / ``abort`` cancel it) and a
        new run from the same context without the failed message; ``auto_retry_end`` closes the
        saga. The prompt's ``prompt_result`` comes once, after the saga.
        """
        failure: BaseException | None = None
        added: list[m.AgentMessage] = []
        attempt = 0
        self._overflow_done = False
        try:
            while True:
                self._retry_decision = None
                self._saga_attempts = attempt
                try:
                    run_added = await self.agent.run(prompts, before_end=self._before_end)
                except Exception as exc:  # a bug in the loop: report it, keep the session alive
                    failure = exc
                    added += self.agent.run_messages
                    print(f"omp: internal error in the agent loop: {type(exc).__name__}: "
                          f"{exc}", file=sys.stderr)
                    break
                added += run_added
                last = _last_assistant(run_added)
                if last is not None and self._overflow_recovery:
                    # The prompt did not fit: compact, then run the turn again (§6.2), once.
                    self._overflow_recovery = False
                    self._overflow_done = True
                    self._drop_failed_turn(last)
                    if await self._auto_compact("overflow"):
                        prompts = []
                        continue
                decision = self._retry_decision
                if decision is None:
                    if attempt:
                        last = _last_assistant(run_added)
                        success = last is not None and last.stopReason != "error"
                        self._publish(AutoRetryEnd(
                            success=success, attempt=attempt,
                            finalError=msgspec.UNSET if success or last is None
                            else last.errorMessage or "unknown error"))
                    break
                attempt += 1
                delay, failed = decision
                self._publish(AutoRetryStart(
                    attempt=attempt, maxAttempts=self.settings.retry.maxRetries,
                    delayMs=round(delay * 1000, 1),
                    errorMessage=failed.errorMessage or "unknown error"))
                with trio.CancelScope() as self._retry_scope:
                    await trio.sleep(delay)  # trio time: MockClock tests run it instantly
                self._retry_scope = None
                if self._retry_scope_cancelled or self.agent.aborted:
                    self._retry_scope_cancelled = False
                    self._publish(AutoRetryEnd(success=False, attempt=attempt,
                                               finalError="Retry cancelled"))
                    break
                # The failed attempt leaves the live context (agent-core §5.3); the file
                # keeps it.
                self._drop_failed_turn(failed)
                prompts = []
        finally:
            aborted = self.agent.aborted
            resume = aborted and bool(self.agent.steering) and not self._closing
            self.agent.aborted = False  # the abort was for this run only
            self._run_done = None
            self._report(added, failure, resume, aborted)
            done.set()
        if resume:
            self._start_run([])

    def _overflowed(self) -> bool:
        call = self.agent.last_call
        return call is not None and call.error is not None and (
            call.error.kind == "context_overflow")

    async def _before_end(self) -> bool:
        """Called by the loop before ``agent_end``: plan a retry (or an overflow recovery), or
        run threshold compaction now (agent_end is held until it is done). Returns whether
        another run follows."""
        self._overflow_recovery = False
        if self._plan_retry():
            return True
        last = _last_assistant(self.agent.run_messages)
        if (last is not None and last.stopReason != "error" and not self.agent.aborted
                and not self._closing and self._needs_compaction()):
            await self._auto_compact("threshold")
        return False

    def _can_compact(self) -> bool:
        from .compaction import find_cut_point

        messages = self.agent.messages
        boundary = next((i + 1 for i in range(len(messages) - 1, -1, -1)
                         if isinstance(messages[i], m.CompactionSummaryMessage)), 0)
        return find_cut_point(messages[boundary:],
                              self.settings.compaction.keepRecentTokens) is not None

    def _plan_retry(self) -> bool:
        """Will the session run again after this run (a retry, or the turn after an overflow
        compaction)? Sets what ``_run`` then does."""
        from .retry import RetryWaitTooLong, backoff_delay, should_retry

        last = _last_assistant(self.agent.run_messages)
        if (last is None or last.stopReason != "error" or self.agent.aborted
                or self._closing):
            return False
        if self._overflowed():
            self._overflow_recovery = (self.auto_compaction and not self._overflow_done
                                       and self._can_compact())
            return self._overflow_recovery
        if not self.auto_retry:
            return False
        call = self.agent.last_call
        error = call.error if call is not None else None
        attempt = self._saga_attempts + 1
        if not should_retry(error, last, self.settings.retry, attempt):
            return False
        try:
            delay = backoff_delay(attempt, self.settings.retry,
                                  error.retry_after if error is not None else None, self._rng)
        except RetryWaitTooLong:
            return False
        self._retry_decision = (delay, last)
        return True

    def _drop_failed_turn(self, failed: m.AssistantMessage) -> None:
        messages = self.agent.messages
        if failed in messages:
            index = max(i for i, msg in enumerate(messages) if msg is failed)
            # Its synthetic "not executed" tool results go with it.
            del messages[index:]

    def abort_retry(self) -> bool:
        """Cancel a retry backoff in progress; False when none is."""
        scope = self._retry_scope
        if scope is None:
            return False
        self._retry_scope_cancelled = True
        scope.cancel()
        return True

    def _report(self, added: list[m.AgentMessage], failure: BaseException | None,
                resume: bool, aborted: bool) -> None:
        """prompt_result for the tickets this run served, then session_settled if settled."""
        consumed = {id(msg) for msg in added}
        served = [t for t in self._tickets if id(t.message) in consumed]
        self._tickets = [t for t in self._tickets if id(t.message) not in consumed]
        status: Literal["completed", "aborted", "error"] = "aborted"
        error: Any = msgspec.UNSET
        if not aborted or failure is not None:
            status, error = self._outcome(added, failure)
        settled = self.settled and not resume
        for ticket in served:
            self._publish(PromptResult(id=ticket.request_id, agentInvoked=True, status=status,
                                       sessionSettled=settled, error=error))
        if settled and self._unsettled:
            self._unsettled = False
            self._publish(SessionSettled())

    def _outcome(self, added: list[m.AgentMessage], failure: BaseException | None
                 ) -> tuple[Literal["completed", "aborted", "error"], Any]:
        if failure is not None:
            return "error", PromptError(message=f"{type(failure).__name__}: {failure}",
                                        retryable=False)
        last = next((msg for msg in reversed(added) if isinstance(msg, m.AssistantMessage)),
                    None)
        if last is None or last.stopReason in ("stop", "toolUse", "length"):
            return "completed", msgspec.UNSET
        if last.stopReason == "aborted":
            return "aborted", msgspec.UNSET
        call = self.agent.last_call
        problem = call.error if call is not None else None
        return "error", PromptError(
            message=last.errorMessage or "The model call failed",
            retryable=problem.retryable if problem else False,
            provider=last.provider, model=last.model,
            httpStatus=problem.http_status if problem and problem.http_status else msgspec.UNSET)

    # -- user shell commands -----------------------------------------------------------------

    def record_bash(self, result: ShellResult) -> None:
        """Add an RPC ``bash`` command to the context: now when idle, before the next prompt
        while a run streams (a run's context must not change under it)."""
        message = m.BashExecutionMessage(
            command=result.command, output=result.output,
            exitCode=result.exit_code if not (result.cancelled or result.timed_out) else None,
            cancelled=result.cancelled or result.timed_out,
            truncated=result.truncation.truncated, timestamp=now_ms())
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
        keys = [(m.provider, m.id) for m in candidates]
        current = (self.model.provider, self.model.id)
        index = keys.index(current) + 1 if current in keys else 0
        model = candidates[index % len(candidates)]
        self._switch(model)
        return model

    def _switch(self, model: Model) -> None:
        before = self.thinking_level
        self.model = model
        self._record_model()
        if self.thinking_level != before:
            self._announce_thinking()

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
        self._publish(ThinkingLevelChanged(
            thinkingLevel=level if self.model.reasoning else msgspec.UNSET,
            configured=self.configured_thinking, resolved=level))


def _last_assistant(messages: Sequence[m.AgentMessage]) -> m.AssistantMessage | None:
    return next((msg for msg in reversed(messages) if isinstance(msg, m.AssistantMessage)),
                None)
