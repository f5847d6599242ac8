"""Running the loaded extensions' handlers, tools and commands
(docs/design/extending.md#extension-tools, docs/design/extending.md#events,
docs/design/extending.md#how-handlers-run).

Rules, in one place:

* Handlers run in the order their extensions loaded, and within one extension in ``on()`` order;
  each is awaited before the next (``session_shutdown``: all at once, each capped at 2 s).
* Each handler gets ``HANDLER_TIMEOUT`` seconds (trio time); for ``tool_call`` the time spent in
  ``ctx.ui`` dialogs does not count. A handler that raises or times out writes
  ``extension_error {extensionPath, event, error}`` and the chain goes on, except for
  ``tool_call``, where a failure blocks the call (the safe default) with the original's texts.
* ``tool_call``: the first block wins, replacement input is last-wins, every handler sees the
  original input. ``tool_result`` and ``context`` chain: each handler sees the previous output.
* A handler runs in the task of whatever fired it: inside a run, an abort cancels it (an open
  dialog then tells the host ``cancel``); its timeout cancels it the same way.
* Extension commands run without a timeout; one that raises writes ``extension_error`` with
  ``extensionPath: "command:<name>"`` and ``event: "command"``.
* What an extension cannot do to the server (``contained``): whatever a handler, command or tool
  raises is its failure, ``SystemExit``, ``KeyboardInterrupt`` and a stray ``trio.Cancelled``
  (one it kept from a scope of its own and raised where nothing is being cancelled) included;
  only trio's own cancellation of the task (an abort, a timeout, shutdown) goes through. A
  handler, command or tool that holds the event loop for ``SLOW_STEP`` seconds or more in one
  go (``time.sleep`` in an ``async def``: every command waits meanwhile) is named in a
  ``notice`` once it returns (``_LoopWatch``, a trio instrument present only while extension
  code runs). Threads an extension leaves running do not keep the process alive
  (``omp.cli.entry``).

``Extensions`` is the agent's ``AgentHooks``: the loop calls it at each point, and skips all of
it when no extension listens (``active``), so a session without extensions pays nothing.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import attrs
import msgspec
import trio

from ..agent.loop import CallDecision
from ..groups import only_cancelled
from ..protocol import events as ev
from ..protocol import messages as m
from ..tools.base import (
    Concurrency,
    OnUpdate,
    Tier,
    Tool,
    ToolError,
    ToolResult,
    concurrency_of,
)
from .api import (
    Extension,
    ExtensionAPI,
    ExtensionContext,
    ExtensionHost,
    Handler,
    RegisteredCommand,
    RegisteredTool,
    custom_message,
)
from .events import (
    AgentEndEvent,
    AgentStartEvent,
    BeforeAgentStartEvent,
    ContextEvent,
    MessageEndEvent,
    SessionShutdownEvent,
    SessionStartEvent,
    ToolApprovalRequestedEvent,
    ToolApprovalResolvedEvent,
    ToolCallEvent,
    ToolResultEvent,
    TurnEndEvent,
    TurnStartEvent,
    field,
)
from .ui import HANDLER_SCOPE, ExtensionUI, HeadlessUI

HANDLER_TIMEOUT = 30.0
SHUTDOWN_TIMEOUT = 2.0
SLOW_STEP = 1.0
"""Seconds of extension code between two checkpoints that earn it a ``notice``."""
LOOP_EVENTS = frozenset({"agent_start", "before_agent_start", "context", "turn_start",
                         "turn_end", "message_end", "tool_call", "tool_result"})
"""Events fired inside a run (the loop's hooks)."""

Emit = Callable[[msgspec.Struct], None] | None
"""Queues a frame for the host; None: no host (nothing is written)."""


@attrs.frozen
class _Outcome:
    status: Literal["ok", "error", "timeout"]
    value: Any = None
    error: str = ""


def contained(exc: BaseException) -> str:
    """What extension code raised, as its failure's text; re-raises ``exc`` when it is trio's
    own cancellation of this task (which must reach its scope). A ``Cancelled`` raised where
    nothing cancels the task is the extension's doing, like ``SystemExit`` or
    ``KeyboardInterrupt``: reported, never let through (it would end the process, or leave a
    scope waiting for a cancellation that never came)."""
    if only_cancelled(exc) and _cancelling():
        raise exc
    if isinstance(exc, Exception):
        return _message(exc)
    if isinstance(exc, trio.Cancelled):
        return "raised trio.Cancelled while nothing was cancelling it"
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r}); an extension cannot end the server"
    detail = str(exc)
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _cancelling() -> bool:
    """Whether trio is cancelling the current task (False outside a trio run)."""
    try:
        return trio.current_effective_deadline() == -math.inf
    except RuntimeError:
        return False


class _LoopWatch(trio.abc.Instrument):
    """Times the steps of the tasks running extension code (``watching``); the rest of the
    time it is not installed, so a session pays nothing between handlers."""

    def __init__(self) -> None:
        self.longest: dict[trio.lowlevel.Task, float] = {}
        self.step_start = 0.0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.step_start = time.perf_counter()

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task in self.longest:
            took = time.perf_counter() - self.step_start
            if took > self.longest[task]:
                self.longest[task] = took


@attrs.define(eq=False, repr=False)
class Extensions:
    """The loaded extensions of one session."""

    extensions: list[Extension]
    apis: list[ExtensionAPI] = attrs.field(factory=list)
    emit: Emit = None
    """Queues a frame for the host (``extension_error``)."""
    handler_timeout: float = HANDLER_TIMEOUT
    shutdown_timeout: float = SHUTDOWN_TIMEOUT
    ctx: ExtensionContext | None = None
    _handlers: dict[str, list[tuple[Extension, Handler]]] = attrs.field(factory=dict,
                                                                      init=False)
    _watch: _LoopWatch = attrs.field(factory=_LoopWatch, init=False)

    def __attrs_post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Take the extensions' handlers again (after an extension host ended: its
        extensions have none left)."""
        self._handlers = {}
        for extension in self.extensions:
            for event, handlers in extension.handlers.items():
                self._handlers.setdefault(event, []).extend(
                    (extension, handler) for handler in handlers)

    @property
    def active(self) -> bool:
        """Whether any extension listens to an event of the loop."""
        return any(self._handlers.get(name) for name in LOOP_EVENTS)

    def start(self, host: ExtensionHost, ui: ExtensionUI | None = None) -> None:
        """The session runs: bind the ``omp`` objects and make ``ctx``."""
        self.ctx = ExtensionContext(host, ui or HeadlessUI())
        for api in self.apis:
            api.bind(host)

    # -- tools and commands ------------------------------------------------------------------

    def tools(self) -> list[ExtensionTool]:
        """The extensions' tools; between extensions the later one wins a name."""
        by_name: dict[str, ExtensionTool] = {}
        for extension in self.extensions:
            for tool in extension.tools.values():
                by_name[tool.name] = ExtensionTool(tool, self)
        return list(by_name.values())

    def commands(self) -> dict[str, RegisteredCommand]:
        """Slash commands by name; between extensions the later one wins."""
        found: dict[str, RegisteredCommand] = {}
        for extension in self.extensions:
            found.update(extension.commands)
        return found

    async def run_command(self, name: str, args: str) -> bool:
        """Run ``/name args``; False when the handler raised (``extension_error`` written).

        No timeout. On cancellation (the session closing) the handler is cancelled."""
        command = self.commands()[name]
        try:
            with self.watching(f"command:{name}", "command"):
                result = command.handler(args, self._ctx())
                if inspect.isawaitable(result):
                    await result
        except BaseException as exc:
            self._report(f"command:{name}", "command", contained(exc))
            return False
        return True

    @contextlib.contextmanager
    def watching(self, path: str, event: str) -> Iterator[None]:
        """Extension code runs in this task meanwhile: a step of it that holds the event loop
        for ``SLOW_STEP`` seconds or more is named in a ``notice`` when it ends."""
        task = trio.lowlevel.current_task()
        watch = self._watch
        if task in watch.longest:  # extension code calling back into extension code
            yield
            return
        if not watch.longest:
            trio.lowlevel.add_instrument(watch)
        watch.longest[task] = 0.0
        # The step running now began before this watch: its extension code starts here. Left
        # as it was, ``step_start`` is the start of whatever step the instrument saw last
        # (a handler's, minutes ago), and the first ``after_task_step`` would count the idle
        # time between them as this handler's.
        watch.step_start = time.perf_counter()
        try:
            yield
        finally:
            # The step running now (the last one) is not over: count it up to here.
            current = time.perf_counter() - watch.step_start
            longest = max(watch.longest.pop(task), current)
            if not watch.longest:
                trio.lowlevel.remove_instrument(watch)
            if longest >= SLOW_STEP and self.emit is not None:
                self.emit(ev.Notice(level="warning", source="extension", message=(
                    f"Extension {path} held the event loop for {longest:.1f} s in one go "
                    f"(its {event} handler; every command waited meanwhile): blocking work "
                    "belongs in trio.to_thread.run_sync, waiting in await trio.sleep")))

    # -- dispatch ----------------------------------------------------------------------------

    def _ctx(self) -> ExtensionContext:
        assert self.ctx is not None, "Extensions.start() was not called"
        return self.ctx

    def listens(self, event: str) -> bool:
        return bool(self._handlers.get(event))

    async def _call(self, extension: Extension, handler: Handler, event: Any, *,
                    limit: float | None = None, dialogs_paused: bool = False) -> _Outcome:
        """One handler, with its timeout; failures are reported here."""
        limit = self.handler_timeout if limit is None else limit
        with trio.move_on_after(limit) as scope:
            token = HANDLER_SCOPE.set(scope) if dialogs_paused else None
            try:
                with self.watching(extension.path, event.type):
                    value = handler(event, self._ctx())
                    if inspect.isawaitable(value):
                        value = await value
                return _Outcome("ok", value)
            except BaseException as exc:
                message = contained(exc)  # trio's own cancellation goes on to its scope
                self._report(extension.path, event.type, message)
                return _Outcome("error", error=message)
            finally:
                if token is not None:
                    HANDLER_SCOPE.reset(token)
        ms = round(limit * 1000)
        self._report(extension.path, event.type, f"handler timed out after {ms}ms")
        return _Outcome("timeout", error=f"timed out after {ms}ms")

    def _report(self, path: str, event: str, error: str) -> None:
        if self.emit is not None:
            self.emit(ev.ExtensionError(extensionPath=path, event=event, error=error))

    async def notify(self, event: Any) -> None:
        """Every handler of ``event``, in order; results are ignored. A checkpoint only where a
        handler awaits. On cancellation the handler running is cancelled with the caller (no
        ``extension_error`` for it), the later ones do not run, and ``Cancelled`` propagates; a
        handler's own timeout is not one (it is reported and the chain goes on)."""
        for extension, handler in self._handlers.get(event.type, ()):
            await self._call(extension, handler, event)

    # -- session events ----------------------------------------------------------------------

    async def session_start(self) -> None:
        """Every ``session_start`` handler, in order. On cancellation as ``notify``."""
        await self.notify(SessionStartEvent())

    async def session_shutdown(self) -> None:
        """All ``session_shutdown`` handlers at once, each capped at ``shutdown_timeout``.
        Nothing is shielded: on cancellation every handler still running is cancelled with the
        nursery (no ``extension_error`` for them) and ``Cancelled`` propagates."""
        handlers = self._handlers.get("session_shutdown", ())
        if not handlers:
            return
        event = SessionShutdownEvent()

        async def call(extension: Extension, handler: Handler) -> None:
            await self._call(extension, handler, event, limit=self.shutdown_timeout)

        async with trio.open_nursery() as nursery:
            for extension, handler in handlers:
                nursery.start_soon(call, extension, handler)

    async def agent_end(self, messages: list[m.AgentMessage]) -> None:
        """Every ``agent_end`` handler, in order. On cancellation as ``notify`` (the session
        runs it in the run's ``tail`` scope, which an ``abort`` cancels too)."""
        await self.notify(AgentEndEvent(messages=messages))

    # -- the loop's hooks (omp.agent.loop.AgentHooks) ----------------------------------------

    async def agent_start(self) -> None:
        """Every ``agent_start`` handler, in order. On cancellation (an abort of the run) as
        ``notify``."""
        await self.notify(AgentStartEvent())

    async def before_agent_start(self, inputs: Sequence[m.UserMessage],
                                 system_prompt: Sequence[str]
                                 ) -> tuple[list[m.AgentMessage], list[str] | None]:
        """The ``before_agent_start`` handlers, in order: the messages they add and the system
        prompt as the last one that changed it left it (None: unchanged). On cancellation (an
        abort of the run) the handler running is cancelled, the later ones do not run and
        ``Cancelled`` propagates: what the earlier ones returned is dropped."""
        handlers = self._handlers.get("before_agent_start", ())
        if not handlers:
            return [], None
        texts, images = [], []
        for message in inputs:
            content = message.content
            blocks = [m.TextContent(text=content)] if isinstance(content, str) else content
            texts.append("".join(b.text for b in blocks if isinstance(b, m.TextContent)))
            images += [b for b in blocks if isinstance(b, m.ImageContent)]
        prompt: list[str] = list(system_prompt)
        changed = False
        extra: list[m.AgentMessage] = []
        for extension, handler in handlers:
            outcome = await self._call(extension, handler, BeforeAgentStartEvent(
                prompt="\n\n".join(texts), images=images, system_prompt=list(prompt)))
            if outcome.status != "ok":
                continue
            message = field(outcome.value, "message")
            if isinstance(message, str | dict):
                extra.append(custom_message(message))
            new_prompt = field(outcome.value, "systemPrompt", "system_prompt")
            if isinstance(new_prompt, list) and all(isinstance(p, str) for p in new_prompt):
                prompt, changed = list(new_prompt), True
        return extra, prompt if changed else None

    async def context(self, messages: list[m.AgentMessage]) -> list[m.AgentMessage]:
        """``messages`` through the ``context`` handlers, each given the previous one's list.
        On cancellation (an abort of the run) the handler running is cancelled, the later ones
        do not run and ``Cancelled`` propagates: no list is returned (``messages`` itself is
        never replaced; each handler gets a copy of the list)."""
        for extension, handler in self._handlers.get("context", ()):
            outcome = await self._call(extension, handler, ContextEvent(messages=list(messages)))
            replaced = field(outcome.value, "messages") if outcome.status == "ok" else None
            if isinstance(replaced, list):
                try:
                    messages = msgspec.convert(replaced, list[m.AgentMessage], from_attributes=True)
                except msgspec.ValidationError as exc:
                    self._report(extension.path, "context", f"invalid messages: {exc}")
        return messages

    async def turn_start(self, turn_index: int) -> None:
        """Every ``turn_start`` handler, in order. On cancellation (an abort of the run) as
        ``notify``."""
        if self.listens("turn_start"):
            await self.notify(TurnStartEvent(turn_index=turn_index,
                                             timestamp=int(time.time() * 1000)))

    async def turn_end(self, turn_index: int, message: m.AssistantMessage,
                       results: Sequence[m.ToolResultMessage]) -> None:
        """Every ``turn_end`` handler, in order. On cancellation (an abort of the run) as
        ``notify``."""
        if self.listens("turn_end"):
            await self.notify(TurnEndEvent(turn_index=turn_index, message=message,
                                           tool_results=list(results)))

    async def message_end(self, message: m.AgentMessage) -> None:
        """Every ``message_end`` handler, in order. On cancellation (an abort of the run) as
        ``notify``."""
        if self.listens("message_end"):
            await self.notify(MessageEndEvent(message=message))

    async def tool_call(self, call_id: str, tool_name: str,
                        arguments: dict[str, Any]) -> CallDecision:
        """The ``tool_call`` handlers, in order, each timed without its dialogs: the first
        block (or failure, or timeout) blocks the call, the last replacement input wins. On
        cancellation (an abort of the run) the handler running is cancelled (over RPC a
        dialog it has open sends the host ``cancel``), the later ones do not run and ``Cancelled``
        propagates: no decision is made, the call neither blocked nor let through."""
        handlers = self._handlers.get("tool_call", ())
        replacement: dict[str, Any] | None = None
        for extension, handler in handlers:
            event = ToolCallEvent(tool_call_id=call_id, tool_name=tool_name,
                                  input=dict(arguments))
            outcome = await self._call(extension, handler, event, dialogs_paused=True)
            if outcome.status == "error":
                return CallDecision(block=f"Extension {extension.path} failed: "
                                          f"{outcome.error}")
            if outcome.status == "timeout":
                return CallDecision(block=f"Extension {extension.path} {outcome.error}")
            if field(outcome.value, "block"):
                reason = field(outcome.value, "reason")
                return CallDecision(block=str(reason) if reason else "")
            new_input = field(outcome.value, "input")
            if isinstance(new_input, dict):
                replacement = new_input
        return CallDecision(arguments=replacement)

    # -- tool approval (omp.session.approval.ApprovalObserver) -------------------------------

    async def tool_approval_requested(self, *, session_id: str, tool_call_id: str,
                                      tool_name: str, approval_mode: str,
                                      reason: str | None) -> None:
        """Every ``tool_approval_requested`` handler, in order. On cancellation as
        ``notify``."""
        if self.listens("tool_approval_requested"):
            await self.notify(ToolApprovalRequestedEvent(
                session_id=session_id, tool_call_id=tool_call_id, tool_name=tool_name,
                approval_mode=approval_mode, reason=reason))

    async def tool_approval_resolved(self, *, session_id: str, tool_call_id: str,
                                     tool_name: str, approval_mode: str, approved: bool,
                                     reason: str | None) -> None:
        """Every ``tool_approval_resolved`` handler, in order. On cancellation as
        ``notify``."""
        if self.listens("tool_approval_resolved"):
            await self.notify(ToolApprovalResolvedEvent(
                session_id=session_id, tool_call_id=tool_call_id, tool_name=tool_name,
                approval_mode=approval_mode, approved=approved, reason=reason))

    async def tool_result(self, call_id: str, tool_name: str, arguments: dict[str, Any],
                          result: ToolResult, is_error: bool) -> tuple[ToolResult, bool]:
        """``result`` through the ``tool_result`` handlers, each seeing the previous one's
        output. On cancellation (an abort of the run) the handler running is cancelled, the
        later ones do not run and ``Cancelled`` propagates: no result is returned."""
        for extension, handler in self._handlers.get("tool_result", ()):
            event = ToolResultEvent(
                tool_call_id=call_id, tool_name=tool_name, input=dict(arguments),
                content=msgspec.to_builtins(result.content), details=result.details,
                is_error=is_error)
            outcome = await self._call(extension, handler, event)
            if outcome.status != "ok" or outcome.value is None:
                continue
            content = field(outcome.value, "content")
            details = field(outcome.value, "details")
            error = field(outcome.value, "isError", "is_error")
            try:
                blocks = (result.content if content is None else
                          msgspec.convert(content, list[m.TextContent | m.ImageContent]))
            except msgspec.ValidationError as exc:
                self._report(extension.path, "tool_result", f"invalid content: {exc}")
                continue
            result = ToolResult(blocks, result.details if details is None else details)
            if isinstance(error, bool):
                is_error = error
        return result, is_error


@attrs.define(eq=False, repr=False)
class ExtensionTool(Tool):
    """An extension's tool as the agent runs it."""

    registered: RegisteredTool
    extensions: Extensions

    @property
    def name(self) -> str:
        return self.registered.name

    @property
    def label(self) -> str:
        return self.registered.label

    @property
    def description(self) -> str:
        return self.registered.description

    @property
    def parameters(self) -> dict[str, Any]:
        return self.registered.parameters

    def approval_tier(self, args: dict[str, Any]) -> Tier:
        return self.registered.approval

    def concurrency(self, args: dict[str, Any]) -> Concurrency:
        """What the extension declared (a rule that raises: the loop runs the call alone)."""
        return concurrency_of(self.registered.concurrency, args)

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Run the extension's ``execute``; its exception is the error result. On cancellation
        the extension's code is cancelled with it."""
        try:
            with self.extensions.watching(f"tool:{self.name}", "execute"):
                value = await self.registered.execute(call_id, args, self.extensions._ctx(),
                                                      on_update)
        except ToolError:
            raise
        except BaseException as exc:
            raise ToolError(contained(exc)) from exc
        result, is_error = tool_result(value)
        if is_error:
            raise ToolError("\n".join(b.text for b in result.content
                                      if isinstance(b, m.TextContent)), result.details)
        return result


def tool_result(value: Any) -> tuple[ToolResult, bool]:
    """An extension tool's return value as a result: a ``ToolResult``, a string, a list of
    content blocks, or ``{"content", "details"?, "isError"?}``."""
    if isinstance(value, ToolResult):
        return value, False
    if value is None:
        return ToolResult([]), False
    if isinstance(value, str):
        return ToolResult.text(value), False
    if isinstance(value, list):
        value = {"content": value}
    content = field(value, "content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    blocks = msgspec.convert(content or [], list[m.TextContent | m.ImageContent])
    details = field(value, "details")
    error = field(value, "isError", "is_error")
    return ToolResult(blocks, details), bool(error)


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
