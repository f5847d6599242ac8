"""The agent loop: an attempt → turns → one model call, then the tool calls of that message.

Rules, in one place (docs/design/agent-loop.md#the-loop; docs/internals.md#the-run-saga):

* ``Agent.run`` is one attempt of a run: ``agent_start``, then turns until the agent stops (or
  a tool set ``stop_requested``: a child's terminal ``yield`` ends it after that turn). It
  returns a ``RunResult`` (completed / error / overflow) and never writes ``agent_end``: the run
  saga (``omp.session.run``) owns the run's end, which may come after a retry or a compaction.
* A turn is ``turn_start``, its input messages (the prompt, or dequeued steering / follow-ups),
  one assistant message, the results of its tool calls, ``turn_end``.
* Steering is dequeued at every turn boundary; follow-ups only when the agent would stop. Both
  feed more turns of the same attempt. ``one-at-a-time`` dequeues one message, ``all`` the queue.
  A turn whose model call failed ends the attempt (the saga decides what follows).
* Tool calls: a call the approval ``gate`` denies by policy is refused before the extensions'
  ``tool_call`` hooks; arguments are validated against the tool's schema, then the gate decides
  (it may ask the user) before the call is announced.
* The calls of one assistant message are one batch, scheduled by the original's rule: each
  call is ``shared`` or ``exclusive`` (``Tool.concurrency`` of its prepared arguments; a rule
  that raises counts as ``exclusive``). A shared call starts once every exclusive call before
  it has ended; an exclusive call starts once every call before it has ended, and every call
  after it waits for it. So consecutive shared calls run together, in one nursery owned by the
  turn; each call runs in its own cancel scope, entered in the turn's ledger before its task
  starts. ``tool_execution_start`` is written when a call starts; its ``tool_execution_end``
  and toolResult ``message_start``/``message_end`` when it ends, so in the order the calls
  end, which is also the order the results enter the context and ``turn_end.toolResults``;
  the next model call has every result of the batch.
* Steering during a batch (``interruptMode: immediate``): every call of the batch is given the
  batch's ``steered`` event, set once a steering message is queued (asides, such as a
  background job's delivered result, do not count). No call is skipped or cut for it: a tool
  that can step aside does (``bash`` moves its running command to a background job and
  answers at once), the others finish, and the message enters at the next turn boundary.
  ``wait``: ``steered`` is never set.
* A ``watch`` (TTSR rules) sees every streamed event as it is published; when it says so the
  model call is cut (a cancel scope of its own): the message ends ``aborted`` without its tool
  calls, its turn ends, the attempt ends, and the result's ``cut`` tells the run saga why.
* Output: every frame is published at once; nothing publishing waits. The streaming producers
  (the model call, a tool's updates) wait on ``AgentSink.pace`` while the host is far behind
  (the model call before each network read, and between events only while behind; a tool
  after each output chunk): a slow host slows the stream, and ending something never depends
  on a host that reads.
* Abort is cancellation of the run's cancel scope, which the caller owns: nothing here catches
  ``Cancelled``. The loop keeps a ledger of what is open (the turn, the streaming message, the
  tool calls started and ended); after the scope has caught the cancellation, the caller calls
  ``close_open``, which writes the frames that close it, synchronously: the partial assistant
  message ends ``aborted`` (half-streamed tool calls dropped), each call of the batch that had
  not ended gets exactly one end (a running one its abort result, one not yet started the
  original's "not executed" result), ``turn_end``; an abort during tools adds a turn with an
  empty aborted assistant message, so the run always ends with the aborted assistant message
  (docs/design/protocol.md#how-an-aborted-run-ends).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

import msgspec
import trio

from ..llm.builder import Pace, StreamEvent
from ..llm.errors import ProviderError
from ..llm.stream import HttpClient, ModelCall
from ..llm.types import Context, LlmMessage, StreamOptions, ToolDefinition
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol.payloads import Model
from ..tools.base import Concurrency, Tool, ToolError, ToolResult

ABORT_REASON = "Interrupted by user"
NOT_EXECUTED_ABORTED = "Tool was not executed because the run was aborted."
NOT_STARTED_ABORTED = "Tool was not executed because the run was aborted: {reason}."
"""A call of the batch that had not started when the run was aborted (the original's text)."""
LENGTH_NOT_EXECUTED = (
    "Tool call was not executed because the assistant hit its output token limit (stop_reason: "
    "length) before the arguments could complete; the recorded arguments are truncated and "
    "unsafe to run. Do NOT retry by re-emitting the same large payload — split the work into "
    "several smaller tool calls.")
GATE_CANCELLED = "Tool execution was cancelled while an extension handler was pending"
BLOCKED_BY_EXTENSION = "Tool execution was blocked by an extension"
ERROR_NOT_EXECUTED = ("Tool call was not executed because the provider stream ended with an "
                      "error before the tool could run: {error}")

QueueMode = Literal["all", "one-at-a-time"]
Input = m.UserMessage | m.CustomMessage
"""What a turn takes in: a user prompt, or an extension's message that triggers a turn."""
Outcome = Literal["completed", "error", "overflow", "aborted"]


class AgentSink(Protocol):
    """Where the loop's events go (the session, which persists and forwards them)."""

    def publish(self, event: ev.SessionEvent) -> None:
        """Deliver at once; never waits."""

    @property
    def publish_update(self) -> Callable[[AssistantUpdate | ev.ToolExecutionUpdate], None]:
        """Deliver a streaming update (``AssistantUpdate``, ``ToolExecutionUpdate``) at once;
        never waits. (A callable attribute rather than a method: a sink may hand over its
        host's own, as it is called once per streamed token.)"""

    @property
    def pace(self) -> Pace:
        """The host's backpressure, for the streaming producers."""


class CallDecision(msgspec.Struct, frozen=True):
    """What the ``tool_call`` hooks decided about one call."""

    block: str | None = None
    """Why the call is blocked (its error result's text); None: it runs."""
    arguments: dict[str, Any] | None = None
    """Replacement arguments (validated again); None: as called."""


class AgentHooks(Protocol):
    """Points where extensions take part in a run (``omp.extensions``). Each is awaited in the
    run's task, so an abort cancels a hook like everything else in the run."""

    @property
    def active(self) -> bool:
        """False: no extension listens (the loop skips the calls)."""
        ...

    async def agent_start(self) -> None:
        """The attempt starts (before its ``agent_start`` frame). On cancellation (abort)
        ``Cancelled`` must propagate (``Extensions`` absorbs only a handler's own timeout);
        ``close_open`` then writes the attempt: ``agent_start``, a turn that takes its inputs
        in, and an empty aborted assistant message."""
        ...

    async def before_agent_start(self, inputs: Sequence[m.UserMessage],
                                 system_prompt: Sequence[str]
                                 ) -> tuple[list[m.AgentMessage], list[str] | None]:
        """Messages to add after ``inputs``, and a system prompt for the rest of the run.
        On cancellation ``Cancelled`` must propagate: nothing is added, the system prompt is
        unchanged, and ``close_open`` ends the turn (its inputs stay in the context)."""
        ...

    async def context(self, messages: list[m.AgentMessage]) -> list[m.AgentMessage]:
        """The messages one model call sends (the history itself is unchanged). On
        cancellation ``Cancelled`` must propagate: no model call is made, and ``close_open``
        ends the turn with an empty aborted assistant message."""
        ...

    async def turn_start(self, turn_index: int) -> None:
        """A turn starts (before its ``turn_start`` frame). On cancellation ``Cancelled`` must
        propagate; the turn is already in the loop's ledger, so ``close_open`` writes its
        ``turn_start``, takes its inputs in, then an empty aborted assistant message and its
        ``turn_end``."""
        ...

    async def turn_end(self, turn_index: int, message: m.AssistantMessage,
                       results: Sequence[m.ToolResultMessage]) -> None:
        """A turn ended (before its ``turn_end`` frame). On cancellation ``Cancelled`` must
        propagate; ``close_open`` then writes the turn's ``turn_end`` (every call keeps the
        result it ended with: all of them have ended) and the empty aborted turn."""
        ...

    async def message_end(self, message: m.AgentMessage) -> None:
        """A message ended (before its ``message_end`` frame; a tool result's, before its
        ``tool_execution_end``). On cancellation ``Cancelled`` must propagate; ``close_open``
        ends an assistant message ``aborted``, a tool call that ran with its abort result, a
        refused one with its refusal, and an input message of the turn with its
        ``message_end`` (the inputs after it are taken in)."""
        ...

    async def tool_call(self, call_id: str, tool_name: str,
                        arguments: dict[str, Any]) -> CallDecision:
        """Whether the call runs, and with which arguments (before it is announced). On
        cancellation ``Cancelled`` must propagate: the call does not run, and ``close_open``
        ends it blocked (``GATE_CANCELLED``)."""
        ...

    async def tool_result(self, call_id: str, tool_name: str, arguments: dict[str, Any],
                          result: ToolResult, is_error: bool) -> tuple[ToolResult, bool]:
        """The result of a call that ran, as the model will see it, and whether it is an
        error. On cancellation ``Cancelled`` must propagate: ``result`` is dropped and
        ``close_open`` ends the call with its abort result (what the tool did stays done)."""
        ...


class ToolGate(Protocol):
    """Tool approval (``omp.session.approval``): asked about every call before it runs."""

    def precheck(self, tool: Tool, args: dict[str, Any]) -> str | None:
        """The error text of a call denied without asking (before the ``tool_call`` hooks);
        None otherwise."""
        ...

    async def check(self, call_id: str, tool: Tool, args: dict[str, Any]) -> str | None:
        """None: the call runs; else its error text. May ask the user (a dialog awaited in
        the call's task: an abort cancels it, and the call counts as not started)."""
        ...


class StreamCut(Protocol):
    """What a ``StreamWatch`` found that stops the stream."""

    @property
    def reason(self) -> str:
        """The cut message's ``errorMessage``."""
        ...


class StreamWatch(Protocol):
    """Watches the model's stream as it arrives (``omp.session.rules``: TTSR)."""

    @property
    def active(self) -> bool: ...

    def begin(self) -> None:
        """A model call starts."""

    def observe(self, event: StreamEvent) -> StreamCut | None:
        """One event (after it was published); a cut when the stream must stop here."""
        ...

    def tool_result(self, call_id: str, result: ToolResult) -> ToolResult:
        """The result of a call that ran, with what the watch has to add to it."""
        ...

    def message_done(self, message: m.AssistantMessage) -> m.CustomMessage | None:
        """The model call's message ended: a message to queue as a follow-up, if any."""
        ...


class NoHooks:
    """No extension: every hook is skipped (``active`` is False)."""

    active = False

    async def agent_start(self) -> None:
        pass

    async def before_agent_start(self, inputs: Sequence[m.UserMessage],
                                 system_prompt: Sequence[str]
                                 ) -> tuple[list[m.AgentMessage], list[str] | None]:
        return [], None

    async def context(self, messages: list[m.AgentMessage]) -> list[m.AgentMessage]:
        return messages

    async def turn_start(self, turn_index: int) -> None:
        pass

    async def turn_end(self, turn_index: int, message: m.AssistantMessage,
                       results: Sequence[m.ToolResultMessage]) -> None:
        pass

    async def message_end(self, message: m.AgentMessage) -> None:
        pass

    async def tool_call(self, call_id: str, tool_name: str,
                        arguments: dict[str, Any]) -> CallDecision:
        return CallDecision()

    async def tool_result(self, call_id: str, tool_name: str, arguments: dict[str, Any],
                          result: ToolResult, is_error: bool) -> tuple[ToolResult, bool]:
        return result, is_error


class AssistantUpdate(msgspec.Struct, frozen=True):
    """A streaming update of the assistant message (becomes a ``message_update`` frame).

    Kept as the provider's event so the consumer decides what to build: the snapshot the
    protocol sends by default, or only the delta.
    """

    event: StreamEvent


class TurnSetup(msgspec.Struct, frozen=True, kw_only=True):
    """What one model call uses, read from the session before every call (it may change)."""

    model: Model
    options: StreamOptions
    system_prompt: tuple[str, ...]
    tools: tuple[Tool, ...]
    http: HttpClient | None = None
    """The owner's HTTP client (connection reuse); None: each call opens its own."""
    unlisted: tuple[Tool, ...] = ()
    """Tools the model may call by name that are not offered to it (MCP tools mounted as
    ``xd://`` devices)."""
    alias: Callable[[str], Tool | None] | None = None
    """The tool a name that is none of the tools' stands for (the MCP tools' aliases,
    ``mcp__<server>__<tool>``), or None; asked once per such call."""


class RunResult(msgspec.Struct, eq=False):
    """How an attempt ended, and what it added (``agent_end.messages``)."""

    outcome: Outcome
    messages: list[m.AgentMessage]
    last: m.AssistantMessage | None = None
    """The attempt's last assistant message."""
    error: ProviderError | None = None
    """The failed model call's error (outcome ``error`` / ``overflow``)."""
    cut: StreamCut | None = None
    """The stream watch stopped the last model call (``last`` ended ``aborted`` with its
    reason): the attempt ended after that turn."""


def now_ms() -> int:
    return int(time.time() * 1000)


def user_message(text: str, images: Sequence[m.ImageContent] = (), *,
                 steering: bool = False) -> m.UserMessage:
    """A user message as the original writes it: content blocks, the text first, then images."""
    content: list[m.UserContent] = [m.TextContent(text=text), *images]
    return m.UserMessage(content=content, timestamp=now_ms(), attribution="user",
                         steering=steering)


def aborted_message(model: Model | m.AssistantMessage, reason: str) -> m.AssistantMessage:
    """An empty assistant message that says the run was aborted (no model call made it)."""
    if isinstance(model, m.AssistantMessage):
        api, provider, model_id = model.api, model.provider, model.model
    else:
        api, provider, model_id = model.api, model.provider, model.id
    return m.AssistantMessage(content=[], api=api, provider=provider, model=model_id,
                              usage=m.Usage.zero(), stopReason="aborted", timestamp=now_ms(),
                              errorMessage=reason)


COMPACTION_WRAPPER = ("Prior model work/tool state available.\nMUST build on prior work; "
                      "NEVER duplicate prior work.\n\n<summary>\n{summary}\n</summary>")
HANDOFF_WRAPPER = ("Context replaced. The <handoff> below is a handoff document a prior instance "
                   "of you wrote for you; continue the work from it.\n\n<handoff>\n{summary}\n"
                   "</handoff>")
BRANCH_WRAPPER = "Branch-return summary:\n\n<summary>\n{summary}\n</summary>"


def to_llm(messages: Sequence[m.AgentMessage]) -> tuple[LlmMessage, ...]:
    """``convertToLlm`` (docs/design/agent-loop.md#what-the-model-is-sent): the agent's own kinds as
    messages a model reads."""
    out: list[LlmMessage] = []
    for message in messages:
        if isinstance(message, m.UserMessage | m.AssistantMessage | m.ToolResultMessage):
            out.append(message)
        elif isinstance(message, m.CompactionSummaryMessage):
            wrapper = HANDOFF_WRAPPER if message.method == "handoff" else COMPACTION_WRAPPER
            out.append(m.UserMessage(content=wrapper.format(summary=message.summary),
                                     timestamp=message.timestamp, attribution="agent"))
        elif isinstance(message, m.BranchSummaryMessage):
            out.append(m.UserMessage(content=BRANCH_WRAPPER.format(summary=message.summary),
                                     timestamp=message.timestamp, attribution="agent"))
        elif isinstance(message, m.CustomMessage | m.DeveloperMessage):
            # No provider adapter has a developer role: harness messages reach the model as
            # user messages (pi's conversion).
            out.append(m.UserMessage(content=message.content, timestamp=message.timestamp,
                                     attribution="agent"))
        elif isinstance(message, m.BashExecutionMessage):
            if message.excludeFromContext:
                continue
            text = f"Ran `{message.command}`\n```\n{message.output or '(no output)'}\n```"
            if message.cancelled:
                text += "\n\n(command cancelled)"
            elif message.exitCode not in (0, None, msgspec.UNSET):
                text += f"\n\nCommand exited with code {message.exitCode}"
            out.append(m.UserMessage(content=text, timestamp=message.timestamp,
                                     attribution="user"))
    return tuple(out)


class _Turn(msgspec.Struct, eq=False):
    """The ledger of one open turn: what ``close_open`` must close if the run is cancelled."""

    model: Model
    tools: dict[str, Tool] = msgspec.field(default_factory=dict)
    alias: Callable[[str], Tool | None] | None = None
    """``TurnSetup.alias``."""
    opened: bool = False
    """``turn_start`` was written (an abort in the ``turn_start`` hook comes before it)."""
    taking_in: m.AgentMessage | None = None
    """An input message whose ``message_start`` was written and whose ``message_end`` was not
    (its ``message_end`` hook is running)."""
    refusing: dict[str, ToolResult] = msgspec.field(default_factory=dict)
    """Refused calls (denied, blocked) that were announced, with the result they end with."""
    call: ModelCall | None = None
    """The model call while it streams."""
    message_started: bool = False
    """``message_start`` of the streaming assistant message was written."""
    ended_tool_calls: set[int] = msgspec.field(default_factory=set)
    """Content indexes of tool calls whose ``toolcall_end`` was streamed."""
    assistant: m.AssistantMessage | None = None
    """The turn's assistant message once it ended."""
    started: dict[str, Tool | None] = msgspec.field(default_factory=dict)
    """Tool calls whose ``tool_execution_start`` was written, with the tool running them."""
    results: dict[str, m.ToolResultMessage] = msgspec.field(default_factory=dict)
    """Tool calls that ended, with their result, in the order they ended."""
    gating: set[str] = msgspec.field(default_factory=set)
    """Tool calls whose ``tool_call`` hooks are deciding (not started yet)."""
    scopes: dict[str, trio.CancelScope] = msgspec.field(default_factory=dict)
    """Each call's cancel scope, entered here before its task is started."""

    def abort_result(self, call: m.ToolCall, reason: str) -> tuple[ToolResult, bool]:
        """How a call of this turn that has not ended ends when the run is aborted: its
        result, and whether its ``tool_execution_start`` is still to be written."""
        if call.id in self.refusing:  # extensions were seeing its refusal: it ends refused
            return self.refusing[call.id], False
        if call.id in self.gating:  # an extension was deciding about it: reported as blocked
            return _not_run(GATE_CANCELLED, "blocked"), True
        if call.id in self.started:
            # A tool may say in its own words that it was aborted (host tools do).
            tool = self.started[call.id]
            text = (tool.abort_text if tool is not None else None) or (
                f"Tool execution was aborted: {reason}")
            return ToolResult.text(text, {"__synthetic": True, "source": "aborted",
                                          "executed": True}), False
        return _not_run(NOT_STARTED_ABORTED.format(reason=reason), "not_executed_aborted"), True


class Agent(msgspec.Struct, eq=False):
    """Holds the live context and the queues, and runs one attempt at a time."""

    sink: AgentSink
    setup: Callable[[], TurnSetup]
    current_model: Callable[[], Model]
    """The session's model now, read without ``setup``'s side effects: an attempt aborted
    before its first turn ends with an aborted message of this model."""
    hooks: AgentHooks = msgspec.field(default_factory=NoHooks)
    messages: list[m.AgentMessage] = msgspec.field(default_factory=list)
    steering: deque[Input] = msgspec.field(default_factory=deque)
    follow_ups: deque[Input] = msgspec.field(default_factory=deque)
    stop_requested: bool = False
    """A tool asked to end the attempt after its turn (a child's terminal ``yield``): the turn
    ends as it is and no other starts; nothing is aborted."""
    steering_mode: QueueMode = "one-at-a-time"
    follow_up_mode: QueueMode = "one-at-a-time"
    interrupt_mode: Literal["immediate", "wait"] = "immediate"
    last_call: ModelCall | None = None
    """The latest model call (its ``error`` explains an ``error`` outcome)."""
    gate: ToolGate | None = None
    """Tool approval; None: every call runs."""
    watch: StreamWatch | None = None
    """Watches each model call's stream and may cut it (TTSR); None: nothing watches."""
    _cut: StreamCut | None = None
    _added: list[m.AgentMessage] = msgspec.field(default_factory=list)
    """What the current (or last) attempt added: ``agent_end.messages``."""
    _turn: _Turn | None = None
    _opened: bool = False
    """The current attempt's ``agent_start`` was written (its hook came first)."""
    _untaken: list[Input] = msgspec.field(default_factory=list)
    """The inputs handed to the attempt or to its current turn that are not in the context
    yet: an abort before they are takes them in (``close_open``)."""
    _turn_index: int = 0
    _system_prompt: list[str] | None = None
    """The system prompt a ``before_agent_start`` hook set for the rest of the attempt."""
    _steered: trio.Event = msgspec.field(default_factory=trio.Event)
    """The current batch's ``steered`` event (``_execute``)."""
    _asides: set[int] = msgspec.field(default_factory=set)
    """Identities of the queued steering messages that are asides (``queue_aside``)."""

    def use_gate(self, gate: ToolGate | None) -> None:
        """Every later tool call passes ``gate`` (None: every call runs)."""
        self.gate = gate

    def use_hooks(self, hooks: AgentHooks | None) -> None:
        """Every later attempt, turn and tool call goes through ``hooks`` (None: none)."""
        self.hooks = hooks if hooks is not None else NoHooks()

    def use_watch(self, watch: StreamWatch | None) -> None:
        """Every later model call's stream is watched by ``watch`` (None: nothing watches)."""
        self.watch = watch

    def set_modes(self, *, steering: QueueMode | None = None, follow_up: QueueMode | None = None,
                  interrupt: Literal["immediate", "wait"] | None = None) -> None:
        """How many steering messages / follow-ups a turn takes, whether steering cuts a tool
        batch short (``immediate``): from the next one on; None: unchanged."""
        self.steering_mode = steering or self.steering_mode
        self.follow_up_mode = follow_up or self.follow_up_mode
        self.interrupt_mode = interrupt or self.interrupt_mode

    def request_stop(self) -> None:
        """End the attempt once the current turn is done (``stop_requested``)."""
        self.stop_requested = True

    # -- queues ------------------------------------------------------------------------------

    def queue_steering(self, message: Input) -> None:
        """Queue a steering message: it enters at the next turn boundary; during a tool batch
        in ``immediate`` mode it sets the batch's ``steered`` event."""
        self.steering.append(message)
        if self.interrupt_mode == "immediate":
            self._steered.set()

    def queue_aside(self, message: Input) -> None:
        """Queue a message that joins at the next turn boundary like steering but interrupts
        nothing (a background job's delivered result)."""
        self.steering.append(message)
        self._asides.add(id(message))

    def clear_queues(self) -> None:
        """Drop every queued steering message, aside and follow-up."""
        self.steering.clear()
        self.follow_ups.clear()
        self._asides.clear()

    def take_queued(self) -> tuple[list[Input], list[Input]]:
        """Remove and return the queued steering and follow-up messages (``clear_queue``);
        asides (a background job's result, nobody's input) stay."""
        steering = [x for x in self.steering if id(x) not in self._asides]
        follow_ups = list(self.follow_ups)
        self.steering = deque(x for x in self.steering if id(x) in self._asides)
        self.follow_ups.clear()
        return steering, follow_ups

    def _interrupting(self) -> bool:
        """Whether a steering message that is no aside is queued."""
        return any(id(x) not in self._asides for x in self.steering)

    def queue_follow_up(self, message: Input) -> None:
        self.follow_ups.append(message)

    def _dequeue(self, queue: deque[Input], mode: QueueMode) -> list[Input]:
        if not queue:
            return []
        taken = list(queue) if mode == "all" else [queue[0]]
        for message in taken:
            queue.popleft()
            self._asides.discard(id(message))
        return taken

    @property
    def queued_count(self) -> int:
        return len(self.steering) + len(self.follow_ups)

    # -- one attempt -------------------------------------------------------------------------

    async def run(self, prompts: Sequence[Input]) -> RunResult:
        """One attempt: ``agent_start``, then turns until the agent stops.

        On cancellation (abort) the frames written so far stay open; the caller closes them with
        ``close_open`` once its scope has caught the cancellation.
        """
        self._added = []
        self._turn = None
        self._turn_index = 0
        self._system_prompt = None
        self.stop_requested = False
        self._cut = None
        self._opened = False
        self._untaken = list(prompts)
        if self.hooks.active:
            await self.hooks.agent_start()
        self.sink.publish(ev.AgentStart())
        self._opened = True
        pending: list[Input] = [*prompts, *self._dequeue(self.steering, self.steering_mode)]
        while True:
            assistant, more = await self._run_turn(pending)
            if assistant.stopReason == "error" or self.stop_requested or self._cut is not None:
                break
            pending = self._dequeue(self.steering, self.steering_mode)
            if more or pending:
                continue
            pending = self._dequeue(self.follow_ups, self.follow_up_mode)
            if not pending:
                break
        return self._result()

    def _result(self, outcome: Outcome | None = None) -> RunResult:
        last = next((x for x in reversed(self._added) if isinstance(x, m.AssistantMessage)),
                    None)
        error = None
        if outcome is None:
            outcome = "completed"
            if last is not None and last.stopReason == "error":
                call = self.last_call
                error = call.error if call is not None else None
                overflow = error is not None and error.kind == "context_overflow"
                outcome = "overflow" if overflow else "error"
        return RunResult(outcome, list(self._added), last, error, self._cut)

    def close_open(self, reason: str) -> RunResult:
        """Close whatever the cancelled attempt left open, in protocol order; never waits.
        Inputs handed to it that were not taken in yet are taken in (the run served them),
        and an attempt cancelled before its ``agent_start`` is written whole.

        ``reason`` becomes the aborted assistant message's ``errorMessage``. Returns the
        attempt's result with outcome ``aborted``.
        """
        turn, self._turn = self._turn, None
        untaken, self._untaken = self._untaken, []
        if turn is None:
            if self._opened:
                return self._result("aborted")
            # Cancelled in the agent_start hook: the attempt is written now, whole.
            self.sink.publish(ev.AgentStart())
            self._opened = True
            turn = _Turn(self.current_model())
        if not turn.opened:
            self.sink.publish(ev.TurnStart())
        if turn.taking_in is not None:
            self.sink.publish(ev.MessageEnd(message=turn.taking_in))
        for message in untaken:  # taken in (the run served them), as a turn takes them
            self._add(message)
            self.sink.publish(ev.MessageStart(message=message))
            self.sink.publish(ev.MessageEnd(message=message))
        if turn.assistant is None:
            # The model call was streaming: its partial message ends aborted.
            streaming = turn.call
            final = streaming.final if streaming is not None else None
            if final is None:
                final = aborted_message(turn.model, reason)
            # Half-streamed tool calls are unsafe to run or to show as complete: drop them.
            content = [b for i, b in enumerate(final.content)
                       if not isinstance(b, m.ToolCall) or i in turn.ended_tool_calls]
            final = msgspec.structs.replace(final, content=content, stopReason="aborted",
                                            errorMessage=reason)
            self._end_assistant(turn, final)
            calls = _tool_calls(final)
            results = [_synthetic(self.sink, c, NOT_EXECUTED_ABORTED, "assistant_stop_aborted")
                       for c in calls]
            self._end_turn(final, results)
            return self._result("aborted")
        assistant = turn.assistant
        # The calls that ended keep their results, in the order they ended; the others end
        # now, once each, in call order.
        results = list(turn.results.values())
        for call in _tool_calls(assistant):
            if call.id not in turn.results:
                result, announce = turn.abort_result(call, reason)
                if announce:
                    _announce(self.sink, call)
                results.append(_finish(self.sink, call, result, True))
        self._end_turn(assistant, results)
        # The run ends the way an abort while streaming ends it: with an aborted assistant
        # message, so hosts that look at the last assistant message show "aborted".
        self.sink.publish(ev.TurnStart())
        final = aborted_message(assistant, reason)
        self.sink.publish(ev.MessageStart(message=final))
        self.sink.publish(ev.MessageEnd(message=final))
        self._add(final)
        self.sink.publish(ev.TurnEnd(message=final, toolResults=[]))
        return self._result("aborted")

    def _add(self, message: m.AgentMessage) -> None:
        self.messages.append(message)
        self._added.append(message)

    def _end_assistant(self, turn: _Turn, final: m.AssistantMessage) -> None:
        if not turn.message_started:
            self.sink.publish(ev.MessageStart(message=final))
        self.sink.publish(ev.MessageEnd(message=final))
        self._add(final)
        turn.call = None
        turn.assistant = final

    def _end_turn(self, assistant: m.AssistantMessage,
                  results: list[m.ToolResultMessage]) -> None:
        for result in results:
            self._add(result)
        self._turn = None
        self.sink.publish(ev.TurnEnd(message=assistant, toolResults=results))

    async def _run_turn(self, inputs: list[Input]) -> tuple[m.AssistantMessage, bool]:
        """One turn; returns its assistant message and whether another turn must follow."""
        setup = self.setup()
        hooks = self.hooks
        turn = self._turn = _Turn(setup.model, {t.name: t for t in (*setup.unlisted,
                                                                   *setup.tools)},
                                  setup.alias)
        self._untaken = list(inputs)
        index = self._turn_index
        self._turn_index += 1
        if hooks.active:
            await hooks.turn_start(index)
        self.sink.publish(ev.TurnStart())
        turn.opened = True
        for message in inputs:
            await self._take_in(turn, message)
        prompts = [x for x in inputs if isinstance(x, m.UserMessage)]
        if prompts and hooks.active:
            extra, prompt = await hooks.before_agent_start(
                prompts, self._system_prompt or setup.system_prompt)
            for added in extra:
                await self._take_in(turn, added)
            if prompt is not None:
                self._system_prompt = prompt
        assistant = await self._model_call(setup, turn)
        if self.watch is not None and (
                follow_up := self.watch.message_done(assistant)) is not None:
            self.queue_follow_up(follow_up)  # rules its text matched without cutting it
        calls = _tool_calls(assistant)
        results: list[m.ToolResultMessage]
        more = False
        if assistant.stopReason == "error":
            text = ERROR_NOT_EXECUTED.format(error=assistant.errorMessage or "unknown error")
            results = [_synthetic(self.sink, c, text, "assistant_stop_error") for c in calls]
        elif assistant.stopReason == "length" and calls:
            results = [_synthetic(self.sink, c, LENGTH_NOT_EXECUTED, "assistant_stop_length")
                       for c in calls]
            more = True
        elif calls:
            results = await self._execute(turn, calls)
            more = True
        else:
            results = []
        for result in results:  # ended: an abort in the turn_end hook must not end them again
            turn.results[result.toolCallId] = result
        if hooks.active:
            await hooks.turn_end(index, assistant, results)
        self._end_turn(assistant, results)
        return assistant, more

    async def _take_in(self, turn: _Turn, message: m.AgentMessage) -> None:
        """An input message of the turn: into the context, then its frames (the ledger keeps
        it while its ``message_end`` hook runs, so an abort there still ends it)."""
        if self._untaken and self._untaken[0] is message:
            del self._untaken[0]
        self._add(message)
        self.sink.publish(ev.MessageStart(message=message))
        if self.hooks.active:
            turn.taking_in = message
            await self.hooks.message_end(message)
            turn.taking_in = None
        self.sink.publish(ev.MessageEnd(message=message))

    # -- model call --------------------------------------------------------------------------

    async def _model_call(self, setup: TurnSetup, turn: _Turn) -> m.AssistantMessage:
        messages = self.messages
        if self.hooks.active:
            messages = await self.hooks.context(list(messages))
        system_prompt = (tuple(self._system_prompt) if self._system_prompt is not None
                         else setup.system_prompt)
        context = Context(
            system_prompt=system_prompt, messages=to_llm(messages),
            tools=tuple(ToolDefinition(t.name, t.description, t.parameters) for t in setup.tools))
        call = self.last_call = turn.call = ModelCall(setup.model, context, setup.options)

        publish_update = self.sink.publish_update
        watch = self.watch if self.watch is not None and self.watch.active else None
        if watch is not None:
            watch.begin()
        cut = trio.CancelScope()
        cut_at: list[m.AssistantMessage] = []

        def on_event(event: StreamEvent) -> None:
            # ``cut_at`` is filled exactly when ``cut`` is cancelled (below), and costs nothing
            # to test: ``cut.cancel_called`` reads the clock (0.6 µs, for every delta).
            if cut_at:
                return  # cut: nothing after the event that matched reaches the host
            if event.type == "start":
                self.sink.publish(ev.MessageStart(message=event.partial))
                turn.message_started = True
            elif event.type in ("done", "error"):
                return
            else:
                if event.type == "toolcall_end":
                    turn.ended_tool_calls.add(event.content_index)
                publish_update(AssistantUpdate(event))
                if watch is not None and (found := watch.observe(event)) is not None:
                    self._cut = found
                    # The message as the host saw it last: events the same network read
                    # still brings are neither published nor kept.
                    cut_at.append(event.partial)
                    cut.cancel()

        with cut:
            await call.run(on_event, pace=self.sink.pace, http=setup.http)
        final = cut_at[0] if cut_at else call.final
        assert final is not None
        if self._cut is not None:
            # Cut by the watch (the HTTP stream is closed; or the stream ended before the cut
            # took effect): the message so far ends aborted, without its tool calls (none of
            # them runs; the turn is run again).
            final = msgspec.structs.replace(
                final, stopReason="aborted", errorMessage=self._cut.reason,
                content=[b for b in final.content if not isinstance(b, m.ToolCall)])
        if self.hooks.active:
            await self.hooks.message_end(final)
        self._end_assistant(turn, final)
        return final

    # -- tools -------------------------------------------------------------------------------

    async def _finish_notified(self, call: m.ToolCall, result: ToolResult, is_error: bool
                               ) -> m.ToolResultMessage:
        """``_finish`` in a running turn: extensions see the result message before its end."""
        message = _result_message(call, result, is_error)
        if self.hooks.active:
            # The end frame and the result message are written together, after the hook.
            await self.hooks.message_end(message)
        _publish_result(self.sink, call, message)
        return message

    async def _execute(self, turn: _Turn, calls: Sequence[m.ToolCall]
                       ) -> list[m.ToolResultMessage]:
        """Run the batch by the scheduling rule (module docstring); the results in the order
        the calls ended. On cancellation (abort) every call of the batch is cancelled with it
        and the ledger says which had ended, were running or had not started."""
        by_name = turn.tools
        for call in calls:
            # A name the model made up for a tool (an alias) runs that tool under the name
            # it used (hosts see the call as made).
            if call.name not in by_name and turn.alias is not None and (
                    aliased := turn.alias(call.name)) is not None:
                by_name[call.name] = aliased
        steered = self._steered = trio.Event()
        if self.interrupt_mode == "immediate" and self._interrupting():
            steered.set()
        async with trio.open_nursery() as batch:
            last_exclusive: list[trio.Event] = []
            shared_since: list[trio.Event] = []
            for call in calls:
                tool = by_name.get(call.name)
                args = _prepared(tool, call)
                done = trio.Event()
                if _concurrency(tool, args) == "exclusive":
                    after = [*last_exclusive, *shared_since]
                    last_exclusive, shared_since = [done], []
                else:
                    after = list(last_exclusive)
                    shared_since.append(done)
                scope = turn.scopes[call.id] = trio.CancelScope()
                batch.start_soon(self._scheduled, turn, call, args, after, scope, done, steered)
        return list(turn.results.values())

    async def _scheduled(self, turn: _Turn, call: m.ToolCall, args: dict[str, Any],
                         after: list[trio.Event], scope: trio.CancelScope, done: trio.Event,
                         steered: trio.Event) -> None:
        """One call of the batch: it waits for the calls it must follow, then runs in its
        scope; ``done`` releases the calls that wait for it (also when it is cancelled)."""
        try:
            for event in after:
                await event.wait()
            with scope:
                await self._run_tool(turn, call, args, steered)
        finally:
            done.set()

    async def _run_tool(self, turn: _Turn, call: m.ToolCall, args: dict[str, Any],
                        steered: trio.Event) -> None:
        tool = turn.tools.get(call.name)
        hooks = self.hooks
        gate = self.gate if tool is not None else None
        if gate is not None and tool is not None and (
                denied := gate.precheck(tool, dict(args))) is not None:
            # Denied by policy: the extensions never hear of the call
            # (docs/design/extending.md#events).
            await self._refuse(turn, call, args, ToolResult.text(denied, {}))
            return
        if tool is not None and hooks.active:
            # Extensions decide before the call is announced (and before a host tool's
            # request is written): block it, or change its arguments.
            turn.gating.add(call.id)
            decision = await hooks.tool_call(call.id, call.name, dict(args))
            turn.gating.discard(call.id)
            if decision.block is not None:
                await self._refuse(turn, call, args, ToolResult.text(
                    decision.block or BLOCKED_BY_EXTENSION, {"blocked": True}))
                return
            if decision.arguments is not None:
                args = decision.arguments
        problem = None
        if tool is None:
            problem = f"Tool {call.name} not found"
        else:
            # A tool that repairs and checks its own arguments (``task``, with the original's
            # texts) is not held to its schema here.
            if not tool.lenient_arguments:
                problem = validate_arguments(tool, args)
            if problem is None and gate is not None and (
                    denied := await gate.check(call.id, tool, dict(args))) is not None:
                await self._refuse(turn, call, args, ToolResult.text(denied, {}))
                return
            # A tool run by the host writes its request before the call is announced.
            if problem is None:
                tool.open_call(call.id, args)
        self.sink.publish(ev.ToolExecutionStart(toolCallId=call.id, toolName=call.name,
                                                args=args))
        turn.started[call.id] = tool
        if tool is None or problem is not None:
            turn.results[call.id] = await self._finish_notified(
                call, ToolResult.text(problem or ""), True)
            return

        async def on_update(partial: ToolResult) -> None:
            self.sink.publish_update(ev.ToolExecutionUpdate(
                toolCallId=call.id, toolName=call.name, args=args,
                partialResult=ev.ToolExecutionResult(
                    content=list(partial.content),
                    details={} if partial.details is None else partial.details)))
            await self.sink.pace.wait_if_behind()

        is_error = False
        try:
            result = await tool.execute(call.id, dict(args), on_update=on_update,
                                        steered=steered)
        except ToolError as exc:
            result, is_error = ToolResult.text(str(exc) or "Tool failed with no output.",
                                               exc.details), True
        except Exception as exc:
            result, is_error = ToolResult.text(f"{type(exc).__name__}: {exc}"), True
        if self.watch is not None:
            result = self.watch.tool_result(call.id, result)  # a rule its arguments matched
        if hooks.active:
            result, is_error = await hooks.tool_result(call.id, call.name, dict(args), result,
                                                       is_error)
        if not result.content and is_error:
            result = ToolResult.text("Tool failed with no output.", result.details)
        turn.results[call.id] = await self._finish_notified(call, result, is_error)


    async def _refuse(self, turn: _Turn, call: m.ToolCall, args: dict[str, Any],
                      result: ToolResult) -> None:
        """A call that does not run (denied, blocked): announced, then its error result."""
        self.sink.publish(ev.ToolExecutionStart(toolCallId=call.id, toolName=call.name,
                                                args=args))
        turn.refusing[call.id] = result
        turn.results[call.id] = await self._finish_notified(call, result, True)


def _not_run(text: str, source: str) -> ToolResult:
    """The result of a call that did not run (``source`` says why)."""
    return ToolResult.text(text, {"__synthetic": True, "source": source, "executed": False})


def _announce(sink: AgentSink, call: m.ToolCall) -> None:
    sink.publish(ev.ToolExecutionStart(toolCallId=call.id, toolName=call.name,
                                       args=call.arguments))


def _synthetic(sink: AgentSink, call: m.ToolCall, text: str, source: str
               ) -> m.ToolResultMessage:
    """Start and end a call that is not run."""
    _announce(sink, call)
    return _finish(sink, call, _not_run(text, source), True)


def _finish(sink: AgentSink, call: m.ToolCall, result: ToolResult, is_error: bool
            ) -> m.ToolResultMessage:
    message = _result_message(call, result, is_error)
    _publish_result(sink, call, message)
    return message


def _publish_result(sink: AgentSink, call: m.ToolCall, message: m.ToolResultMessage) -> None:
    # Written together, with no checkpoint between them (message ids nest).
    sink.publish(ev.ToolExecutionEnd(
        toolCallId=call.id, toolName=call.name, isError=message.isError,
        result=ev.ToolExecutionResult(content=list(message.content), details=message.details)))
    sink.publish(ev.MessageStart(message=message))
    sink.publish(ev.MessageEnd(message=message))


def _result_message(call: m.ToolCall, result: ToolResult, is_error: bool
                    ) -> m.ToolResultMessage:
    details = {} if result.details is None else result.details
    return m.ToolResultMessage(toolCallId=call.id, toolName=call.name,
                               content=list(result.content), isError=is_error,
                               timestamp=now_ms(), details=details)


def _prepared(tool: Tool | None, call: m.ToolCall) -> dict[str, Any]:
    """The call's arguments as its tool prepares them: older forms rewritten before
    validation, and hosts see the arguments as prepared (docs/design/protocol.md#run-events)."""
    if tool is None:
        return call.arguments
    try:
        return tool.prepare_arguments(dict(call.arguments))
    except Exception:
        return call.arguments  # validation reports what is wrong


def _concurrency(tool: Tool | None, args: dict[str, Any]) -> Concurrency:
    """The call's scheduling mode; ``exclusive`` (the safe one) when its tool's rule fails,
    as in the original. A call of no known tool fails at once, beside the others."""
    if tool is None:
        return "shared"
    try:
        mode = tool.concurrency(args)
    except Exception:
        return "exclusive"
    return "exclusive" if mode == "exclusive" else "shared"


def _tool_calls(message: m.AssistantMessage) -> list[m.ToolCall]:
    return [b for b in message.content if isinstance(b, m.ToolCall)]


def validate_arguments(tool: Tool, args: dict[str, Any]) -> str | None:
    """The error text the model gets for arguments that break the tool's schema, else None."""
    import json  # lazy: omp.lazy says why

    import jsonschema  # first tool call only: startup does not pay for it

    validator_cls = jsonschema.validators.validator_for(tool.parameters)
    validator = validator_cls(tool.parameters)
    try:
        problems = sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        received = json.dumps(args, indent=2, ensure_ascii=False)
    except RecursionError:
        # Arguments nested deeper than the validator can walk are not arguments any schema
        # of ours accepts; say so instead of failing the run.
        return (f'Validation failed for tool "{tool.name}": the arguments are nested too '
                "deeply to be checked.")
    if not problems:
        return None
    lines = []
    for problem in problems:
        where = "/".join(str(p) for p in problem.absolute_path) or "arguments"
        lines.append(f"  - {where}: {problem.message}")
    return (f'Validation failed for tool "{tool.name}":\n' + "\n".join(lines)
            + f"\n\nReceived arguments:\n{received}")
