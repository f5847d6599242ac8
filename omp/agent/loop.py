"""The agent loop: runs → turns → one model call, then the tool calls of that message.

Rules, in one place (agent-core §2.4 to §4; DESIGN.md §2):

* A run starts with ``agent_start`` and ends with exactly one ``agent_end`` carrying the messages
  the run added. A turn is ``turn_start``, its input messages (the prompt, or dequeued steering /
  follow-ups), one assistant message, the results of its tool calls, ``turn_end``.
* Steering is dequeued at every turn boundary; follow-ups only when the agent would stop. Both
  feed more turns of the same run. ``one-at-a-time`` dequeues one message, ``all`` the queue.
* Tool calls: arguments are validated against the tool's schema first; read-only calls that
  follow each other run concurrently, any other call runs alone, in call order. Frames of a call
  (``tool_execution_end``, its toolResult ``message_start``/``message_end``) are written as it
  completes; results enter the context in call order. With ``interruptMode: immediate``, once
  steering is queued the calls not started yet are skipped.
* Abort is cancellation: ``abort()`` cancels the scope of whatever is running (the model call or
  each running tool) and pre-cancels what would start next. The loop then finishes the run in
  protocol terms: the partial assistant message ends ``aborted`` (half-streamed tool calls
  dropped), cancelled and unstarted calls get error results, then ``turn_end`` and
  ``agent_end``. Queued messages are not dequeued once aborted.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

import attrs
import msgspec
import trio

from ..llm.stream import ModelCall, StreamEvent
from ..llm.types import Context, LlmMessage, StreamOptions, ToolSpec
from ..protocol import events as ev
from ..protocol import messages as m
from ..protocol.payloads import Model
from ..tools.base import Tool, ToolError, ToolResult

ABORT_REASON = "Interrupted by user"
NOT_EXECUTED_ABORTED = "Tool was not executed because the run was aborted."
SKIPPED_FOR_STEERING = "Skipped due to queued user message."
LENGTH_NOT_EXECUTED = (
    "Tool call was not executed because the assistant hit its output token limit (stop_reason: "
    "length) before the arguments could complete; the recorded arguments are truncated and "
    "unsafe to run. Do NOT retry by re-emitting the same large payload — split the work into "
    "several smaller tool calls.")
ERROR_NOT_EXECUTED = ("Tool call was not executed because the provider stream ended with an "
                      "error before the tool could run: {error}")

Emit = Callable[[Any], Awaitable[None]]
"""Receives session events (frame Structs) and ``AssistantUpdate``s, in order."""
QueueMode = Literal["all", "one-at-a-time"]


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


def now_ms() -> int:
    return int(time.time() * 1000)


def user_message(text: str, images: Sequence[m.ImageContent] = (), *,
                 steering: bool = False) -> m.UserMessage:
    content: str | list[m.UserContent] = (
        [m.TextContent(text=text), *images] if images else text)
    return m.UserMessage(content=content, timestamp=now_ms(), attribution="user",
                         steering=steering)


COMPACTION_WRAPPER = ("Prior model work/tool state available.\nMUST build on prior work; "
                      "NEVER duplicate prior work.\n\n<summary>\n{summary}\n</summary>")
HANDOFF_WRAPPER = ("Context replaced. The <handoff> below is a handoff document a prior instance "
                   "of you wrote for you; continue the work from it.\n\n<handoff>\n{summary}\n"
                   "</handoff>")
BRANCH_WRAPPER = "Branch-return summary:\n\n<summary>\n{summary}\n</summary>"


def to_llm(messages: Sequence[m.AgentMessage]) -> tuple[LlmMessage, ...]:
    """``convertToLlm`` (agent-core §1.6): the agent's own kinds as messages a model reads."""
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
            elif message.exitCode not in (0, None):
                text += f"\n\nCommand exited with code {message.exitCode}"
            out.append(m.UserMessage(content=text, timestamp=message.timestamp,
                                     attribution="user"))
    return tuple(out)


@attrs.define(eq=False)
class Agent:
    """Holds the live context and the queues, and runs one run at a time."""

    emit: Emit
    setup: Callable[[], TurnSetup]
    messages: list[m.AgentMessage] = attrs.field(factory=list)
    steering: deque[m.UserMessage] = attrs.field(factory=deque)
    follow_ups: deque[m.UserMessage] = attrs.field(factory=deque)
    steering_mode: QueueMode = "one-at-a-time"
    follow_up_mode: QueueMode = "one-at-a-time"
    interrupt_mode: Literal["immediate", "wait"] = "immediate"
    running: bool = False
    aborted: bool = False
    last_call: ModelCall | None = None
    """The latest model call (its ``error`` explains an ``error`` outcome)."""
    consumed: list[m.UserMessage] = attrs.field(factory=list)
    run_messages: list[m.AgentMessage] = attrs.field(factory=list)
    """The messages the current (or last) run added, kept even when the run failed."""
    """Queued messages the current run has taken in (for prompt tickets)."""
    _scopes: set[trio.CancelScope] = attrs.field(factory=set)
    _emit_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _steering_arrived: trio.Event = attrs.field(factory=trio.Event)

    # -- queues ------------------------------------------------------------------------------

    def queue_steering(self, message: m.UserMessage) -> None:
        self.steering.append(message)
        self._steering_arrived.set()

    def queue_follow_up(self, message: m.UserMessage) -> None:
        self.follow_ups.append(message)

    def _dequeue(self, queue: deque[m.UserMessage], mode: QueueMode) -> list[m.UserMessage]:
        if not queue:
            return []
        taken = list(queue) if mode == "all" else [queue[0]]
        for _ in taken:
            queue.popleft()
        self.consumed.extend(taken)
        return taken

    @property
    def queued_count(self) -> int:
        return len(self.steering) + len(self.follow_ups)

    # -- abort -------------------------------------------------------------------------------

    def abort(self) -> None:
        """Stop the current run as soon as possible (it still ends with its terminal events).

        Also valid between scheduling a run and its start: that run then ends at once.
        """
        self.aborted = True
        for scope in list(self._scopes):
            scope.cancel()

    def _scope(self) -> trio.CancelScope:
        scope = trio.CancelScope()
        if self.aborted:
            scope.cancel()
        return scope

    # -- the run -----------------------------------------------------------------------------

    async def run(self, prompts: Sequence[m.UserMessage], *,
                  before_end: Callable[[], Awaitable[bool]] | None = None
                  ) -> list[m.AgentMessage]:
        """One run: returns the messages it added (what ``agent_end`` carries).

        Abort (``abort()``) ends it early but still in protocol order. If the task running it is
        cancelled from outside, the events that could not be written are lost with the host.
        """
        if self.running:
            raise RuntimeError("a run is already in progress")
        self.running = True
        self.consumed = []
        added = self.run_messages = []
        try:
            await self.emit(ev.AgentStart())
            pending: list[m.UserMessage] = list(prompts)
            pending += self._dequeue(self.steering, self.steering_mode)
            while True:
                more = await self._turn(pending, added)
                pending = []
                if self.aborted:
                    break
                pending = self._dequeue(self.steering, self.steering_mode)
                if more or pending:
                    continue
                pending = self._dequeue(self.follow_ups, self.follow_up_mode)
                if not pending:
                    break
            return added
        finally:
            self.running = False
            # ``before_end``: the session's maintenance (compaction) runs before agent_end, which
            # is held until then (rpc-behavior §4.4); it says whether more work follows (a retry)
            # so that this agent_end is not terminal.
            more = before_end is not None and await before_end()
            with trio.CancelScope(shield=True):
                await self.emit(ev.AgentEnd(messages=list(added),
                                            isTerminal=False if more else msgspec.UNSET))

    async def _add(self, message: m.AgentMessage, added: list[m.AgentMessage]) -> None:
        self.messages.append(message)
        added.append(message)

    async def _turn(self, inputs: list[m.UserMessage], added: list[m.AgentMessage]) -> bool:
        """One turn; returns whether another turn must follow (tool results to answer)."""
        await self.emit(ev.TurnStart())
        for message in inputs:
            await self._add(message, added)
            await self.emit(ev.MessageStart(message=message))
            await self.emit(ev.MessageEnd(message=message))
        setup = self.setup()
        assistant = await self._model_call(setup)
        await self._add(assistant, added)
        calls = [b for b in assistant.content if isinstance(b, m.ToolCall)]
        results: list[m.ToolResultMessage]
        more = False
        if assistant.stopReason == "aborted":
            results = await self._synthetic(calls, NOT_EXECUTED_ABORTED, "assistant_stop_aborted")
        elif assistant.stopReason == "error":
            text = ERROR_NOT_EXECUTED.format(error=assistant.errorMessage or "unknown error")
            results = await self._synthetic(calls, text, "assistant_stop_error")
        elif assistant.stopReason == "length" and calls:
            results = await self._synthetic(calls, LENGTH_NOT_EXECUTED, "assistant_stop_length")
            more = True
        elif calls:
            results = await self._execute(calls, setup.tools)
            more = True
        else:
            results = []
        for result in results:
            await self._add(result, added)
        await self.emit(ev.TurnEnd(message=assistant, toolResults=results))
        return more and not self.aborted

    # -- model call --------------------------------------------------------------------------

    async def _model_call(self, setup: TurnSetup) -> m.AssistantMessage:
        context = Context(
            system_prompt=setup.system_prompt, messages=to_llm(self.messages),
            tools=tuple(ToolSpec(t.name, t.description, t.parameters) for t in setup.tools))
        call = self.last_call = ModelCall(setup.model, context, setup.options)
        started = False
        ended_tool_calls: set[int] = set()

        async def on_event(event: StreamEvent) -> None:
            nonlocal started
            if event.type == "start":
                await self.emit(ev.MessageStart(message=event.partial))
                started = True  # only once written: an abort can land in the emit itself
            elif event.type in ("done", "error"):
                return
            else:
                if event.type == "toolcall_end":
                    ended_tool_calls.add(event.content_index)
                await self.emit(AssistantUpdate(event))

        scope = self._scope()
        self._scopes.add(scope)
        try:
            with scope:
                await call.run(on_event)
        finally:
            self._scopes.discard(scope)
        final = call.final
        assert final is not None
        if final.stopReason == "aborted":
            # Half-streamed tool calls are unsafe to run or to show as complete: drop them.
            content = [b for i, b in enumerate(final.content)
                       if not isinstance(b, m.ToolCall) or i in ended_tool_calls]
            final = msgspec.structs.replace(final, content=content, errorMessage=ABORT_REASON)
        if not started:
            await self.emit(ev.MessageStart(message=final))
        await self.emit(ev.MessageEnd(message=final))
        return final

    # -- tools -------------------------------------------------------------------------------

    async def _synthetic(self, calls: Sequence[m.ToolCall], text: str, source: str
                         ) -> list[m.ToolResultMessage]:
        results = []
        for call in calls:
            await self.emit(ev.ToolExecutionStart(toolCallId=call.id, toolName=call.name,
                                                  args=call.arguments))
            results.append(await self._finish(call, ToolResult.text(
                text, {"__synthetic": True, "source": source, "executed": False}), True))
        return results

    async def _finish(self, call: m.ToolCall, result: ToolResult, is_error: bool
                      ) -> m.ToolResultMessage:
        details = {} if result.details is None else result.details
        message = m.ToolResultMessage(toolCallId=call.id, toolName=call.name,
                                      content=list(result.content), isError=is_error,
                                      timestamp=now_ms(), details=details)
        # One call's end and result message are written together (message ids nest).
        async with self._emit_lock:
            await self.emit(ev.ToolExecutionEnd(
                toolCallId=call.id, toolName=call.name, isError=is_error,
                result=ev.ToolExecutionResult(content=list(result.content), details=details)))
            await self.emit(ev.MessageStart(message=message))
            await self.emit(ev.MessageEnd(message=message))
        return message

    async def _execute(self, calls: Sequence[m.ToolCall], tools: Sequence[Tool]
                       ) -> list[m.ToolResultMessage]:
        by_name = {t.name: t for t in tools}
        results: dict[str, m.ToolResultMessage] = {}
        self._steering_arrived = trio.Event()
        if self.steering:
            self._steering_arrived.set()
        # Consecutive read-only calls form one concurrent group; any other call is alone.
        groups: list[list[m.ToolCall]] = []
        for call in calls:
            tool = by_name.get(call.name)
            if tool is not None and tool.read_only and groups and all(
                    (t := by_name.get(c.name)) is not None and t.read_only for c in groups[-1]):
                groups[-1].append(call)
            else:
                groups.append([call])
        for group in groups:
            skip = None
            if self.aborted:
                skip = (NOT_EXECUTED_ABORTED, "not_executed_aborted")
            elif self.interrupt_mode == "immediate" and self._steering_arrived.is_set():
                skip = (SKIPPED_FOR_STEERING, "interrupt_skipped")
            if skip is not None:
                for result in await self._synthetic(group, *skip):
                    results[result.toolCallId] = result
                continue
            async with trio.open_nursery() as nursery:
                for call in group:
                    nursery.start_soon(self._run_tool, call, by_name.get(call.name), results)
        return [results[c.id] for c in calls]

    async def _run_tool(self, call: m.ToolCall, tool: Tool | None,
                        results: dict[str, m.ToolResultMessage]) -> None:
        # A tool may accept older argument forms: it rewrites them before validation, and
        # hosts see the arguments as prepared (rpc-behavior §4.1).
        prepare = getattr(tool, "prepare_arguments", None)
        args = call.arguments
        if prepare is not None:
            try:
                args = prepare(dict(call.arguments))
            except Exception:
                args = call.arguments  # validation below reports what is wrong
        problem = None
        if tool is None:
            problem = f"Tool {call.name} not found"
        else:
            problem = validate_arguments(tool, args)
            # A tool run by the host writes its request before the call is announced.
            if problem is None and (opener := getattr(tool, "open_call", None)) is not None:
                opener(call.id, args)
        await self.emit(ev.ToolExecutionStart(toolCallId=call.id, toolName=call.name,
                                              args=args))
        if tool is None or problem is not None:
            results[call.id] = await self._finish(call, ToolResult.text(problem or ""), True)
            return

        async def on_update(partial: ToolResult) -> None:
            await self.emit(ev.ToolExecutionUpdate(
                toolCallId=call.id, toolName=call.name, args=args,
                partialResult=ev.ToolExecutionResult(
                    content=list(partial.content),
                    details={} if partial.details is None else partial.details)))

        scope = self._scope()
        self._scopes.add(scope)
        result: ToolResult | None = None
        is_error = False
        try:
            with scope:
                result = await tool.execute(call.id, dict(args), on_update=on_update)
        except ToolError as exc:
            result, is_error = ToolResult.text(str(exc) or "Tool failed with no output.",
                                               exc.details), True
        except Exception as exc:
            result, is_error = ToolResult.text(f"{type(exc).__name__}: {exc}"), True
        finally:
            self._scopes.discard(scope)
        if result is None:  # cancelled by abort
            result, is_error = ToolResult.text(
                f"Tool execution was aborted: {ABORT_REASON}",
                {"__synthetic": True, "source": "aborted", "executed": True}), True
        elif not result.content and is_error:
            result = ToolResult.text("Tool failed with no output.", result.details)
        results[call.id] = await self._finish(call, result, is_error)


def validate_arguments(tool: Tool, args: dict[str, Any]) -> str | None:
    """The error text the model gets for arguments that break the tool's schema, else None."""
    import jsonschema  # first tool call only: startup does not pay for it

    validator_cls = jsonschema.validators.validator_for(tool.parameters)
    validator = validator_cls(tool.parameters)
    problems = sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))
    if not problems:
        return None
    lines = []
    for problem in problems:
        where = "/".join(str(p) for p in problem.absolute_path) or "arguments"
        lines.append(f"  - {where}: {problem.message}")
    received = json.dumps(args, indent=2, ensure_ascii=False)
    return (f'Validation failed for tool "{tool.name}":\n' + "\n".join(lines)
            + f"\n\nReceived arguments:\n{received}")
