"""The original's TypeScript / JavaScript extensions on the session's side: what the JavaScript
host (``omp.extensions.jshost``) loaded becomes ``Extension`` objects like a Python extension's,
whose handlers, tools and commands are requests to the host, so the extension runtime
(``omp.extensions.runtime``) orders, times and contains them exactly as it does Python ones:
same timeouts, same ``extension_error`` frames, ``tool_call`` failures block. What the
extensions ask of the session (``ctx.ui`` dialogs, ``pi.sendMessage``, ``pi.setActiveTools``,
...) comes back as the host's calls, served here on the same ``ctx`` a Python extension gets;
``ctx.ui`` thus writes the same extension-UI frames, and a dialog opened in a handler runs in
that handler's task (an abort or a timeout cancels it, a ``tool_call`` handler's clock stops).

Before each request what changed of the session's state (cwd, tools, model, ...) goes to the
host, for the API's synchronous getters (``pi.getActiveTools()``, ``ctx.model``).

A host that ends on its own (a crash) is one ``extension_error`` per extension it ran (event
``host``) and one ``notice``; their handlers, tools and commands are gone from then on, and
the session goes on. ``/reload-plugins`` starts a new host.

Events the original fires in RPC mode that this runtime does not (``message_update``,
``session_stop``, ...) are accepted by ``pi.on`` so the extension loads; a notice names them
(``JsExtensions.notices``), since their handlers never run.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import msgspec
import trio

from ..protocol import events as ev
from ..protocol import messages as m
from .api import (
    CommandHandler,
    Extension,
    ExtensionContext,
    Handler,
    RegisteredCommand,
    RegisteredTool,
    ToolExecute,
    custom_message,
)
from .discovery import TS_SUFFIXES, Source
from .events import EVENT_TYPES
from .jshost import HostGone, JsHost, JsHostError, JsRuntime, find_js_runtime, serve_js_host
from .runtime import Emit, tool_result

if TYPE_CHECKING:
    from ..tools.base import OnUpdate
    from .runtime import Extensions

LOAD_SECONDS = 10.0
"""The host's share of a load, beside ``FACTORY_SECONDS`` per extension."""
FACTORY_SECONDS = 35.0
"""Per extension: the host gives a factory 30 s, importing it some more."""
FIRED_IN_RPC_ELSEWHERE = frozenset({
    "session_before_switch", "session_switch", "session_before_branch", "session_branch",
    "session_before_compact", "session.compacting", "session_compact", "session_stop",
    "before_provider_request", "after_provider_response", "message_start", "message_update",
    "tool_execution_start", "tool_execution_update", "tool_execution_end",
    "auto_compaction_start", "auto_compaction_end", "auto_retry_start", "auto_retry_end",
    "retry_fallback_applied", "retry_fallback_succeeded", "ttsr_triggered", "todo_reminder",
    "goal_updated", "credential_disabled", "mcp_notification", "user_bash"})
"""Events the original fires in RPC mode that this runtime does not fire to extensions
(events it never fires there either, like ``input``, pass without a word)."""
HOT_EVENTS = frozenset({"tool_call", "tool_result", "context", "turn_start", "turn_end",
                        "message_end"})
"""Events fired at every tool call or model call: their state leaves the system prompt out."""


class HostSpec(msgspec.Struct, kw_only=True):
    """Where and how a session's host runs, and the nursery it runs in."""

    nursery: trio.Nursery
    """The session's: the host is a task of it, killed with it at the latest."""
    cwd: Path
    env: dict[str, str]
    """Its environment: the session's subprocess policy applied (``omp.subprocess_env``)."""
    mode: str
    """``ctx.mode``: ``rpc``, ``json`` or ``print``."""
    trusted: bool
    """``ctx.isProjectTrusted()``."""
    agent_dir: Path


def unrunnable(source: Source, runtime: JsRuntime | None) -> str | None:
    """Why ``runtime`` cannot run ``source``, if it cannot."""
    if source.problem is not None:
        return source.problem
    assert source.location is not None
    if not source.location.is_file():
        return f"Extension path not found: {source.location}"
    typescript = source.location.suffix in TS_SUFFIXES
    if runtime is None:
        return ("it needs bun or node to run, and neither is on PATH (install bun, or node "
                f">= 22.6{' for TypeScript' if typescript else ''})")
    if typescript and not runtime.typescript:
        return (f"TypeScript needs bun or node >= 22.6 to run; bun is not on PATH and "
                f"{runtime.describe()} cannot strip types")
    return None


async def load_js(sources: Sequence[tuple[int, Source]], spec: HostSpec, emit: Emit,
                  extensions: Extensions) -> tuple[JsExtensions | None, dict[int, str]]:
    """Start the host and load ``sources`` (``(index, source)``: the index is the source's
    place in the load order) in it, as part of the session's ``extensions`` (both kinds, which
    the caller fills). Returns the loaded extensions (None when none loaded, and then no host
    runs), which serve the host's calls from then on, and the errors by index. On
    cancellation the host is killed with the nursery it runs in."""
    runtime = await find_js_runtime(spec.env)
    errors: dict[int, str] = {}
    runnable = []
    for index, source in sources:
        problem = unrunnable(source, runtime)
        if problem is None:
            runnable.append((index, source))
        else:
            errors[index] = problem
    if not runnable or runtime is None:
        return None, errors
    host: JsHost | None = None
    try:
        host = await spec.nursery.start(functools.partial(
            serve_js_host, runtime, cwd=spec.cwd, env=spec.env))
        with trio.fail_after(LOAD_SECONDS + FACTORY_SECONDS * len(runnable)):
            answer = await host.request({
                "type": "load",
                "extensions": [{"index": i, "path": str(s.location), "name": s.name}
                               for i, s in runnable],
                "config": {"mode": spec.mode, "trusted": spec.trusted,
                           "agentDir": str(spec.agent_dir)}})
    except (OSError, HostGone, JsHostError, trio.TooSlowError) as exc:
        if host is not None:
            await host.aclose()
        why = (f"the extension host ({runtime.describe()}) did not finish loading in time"
               if isinstance(exc, trio.TooSlowError) else
               f"the extension host could not run it: {exc}")
        return None, {**errors, **{i: why for i, _ in runnable}}
    bridge = JsExtensions(host, emit, extensions)
    by_index = dict(runnable)
    for item in answer.get("extensions", []) if isinstance(answer, dict) else []:
        index = item.get("index")
        if index not in by_index:
            continue
        if "error" in item:
            errors[index] = str(item["error"])
        else:
            bridge.add(index, by_index[index], item)
    if not bridge.loaded:
        await host.aclose()
        return None, errors
    host.use_server(bridge)
    return bridge, errors


def event_json(event: Any) -> dict[str, Any]:
    """An event object as the original's extensions see it: its fields in camelCase."""
    out: dict[str, Any] = {"type": event.type}
    for field in attrs.fields(type(event)):
        head, *rest = field.name.split("_")
        out[head + "".join(part.title() for part in rest)] = getattr(event, field.name)
    return out


@attrs.define(eq=False, repr=False)
class JsExtensions:
    """The host's extensions in one session, and the calls it makes (``CallServer``)."""

    host: JsHost
    emit: Emit
    runtime: Extensions
    """The session's extensions (both kinds): their commands and ``ctx`` once started."""
    loaded: dict[int, Extension] = attrs.field(factory=dict)
    """By load-order index."""
    notices: list[str] = attrs.field(factory=list)
    """Warnings of the load: events an extension listens to that this runtime does not fire,
    what it asked for in vain (``registerProvider``)."""
    _sent: dict[str, bytes] = attrs.field(factory=dict)
    """The state's parts as last sent (``_sync``)."""
    _tools_key: tuple[int, ...] = ()

    def add(self, index: int, source: Source, item: dict[str, Any]) -> None:
        extension = Extension(path=str(source.location), name=source.name)
        events = [str(e) for e in item.get("events", [])]
        for position, event in enumerate(events):
            if event in EVENT_TYPES:
                extension.handlers.setdefault(event, []).append(self._handler(index, position))
        self.notices += [str(w) for w in item.get("warnings", [])]
        missed = sorted({e for e in events if e in FIRED_IN_RPC_ELSEWHERE})
        if missed:
            self.notices.append(
                f"Extension {extension.path} listens to {', '.join(missed)}, which this "
                "runtime does not fire to extensions: those handlers never run")
        self._register(index, extension, item)
        self.loaded[index] = extension

    def _register(self, index: int, extension: Extension, item: dict[str, Any]) -> None:
        for tool in item.get("tools", []):
            name = str(tool["name"])
            extension.tools[name] = RegisteredTool(
                name, str(tool.get("label") or name), str(tool.get("description", "")),
                dict(tool.get("parameters") or {"type": "object"}), self._tool(index, name),
                tool.get("approval", "exec"))
        for command in item.get("commands", []):
            name = str(command["name"])
            extension.commands[name] = RegisteredCommand(
                name, str(command.get("description", "")), self._command(index, name))

    # -- requests ----------------------------------------------------------------------------

    def _handler(self, index: int, position: int) -> Handler:
        async def handle(event: Any, ctx: ExtensionContext) -> Any:
            self._sync(ctx, full=event.type not in HOT_EVENTS)
            return await self.host.request({"type": "event", "ext": index, "handler": position,
                                            "event": event_json(event)})
        return handle

    def _tool(self, index: int, name: str) -> ToolExecute:
        async def execute(call_id: str, params: dict[str, Any], ctx: ExtensionContext,
                          on_update: OnUpdate) -> Any:
            self._sync(ctx)

            async def update(value: Any) -> None:
                try:
                    partial, _ = tool_result(value)
                except (msgspec.ValidationError, TypeError):
                    return  # an update that is no result: nothing to show
                await on_update(partial)

            return await self.host.request(
                {"type": "tool", "ext": index, "name": name, "toolCallId": call_id,
                 "params": params}, on_update=update)
        return execute

    def _command(self, index: int, name: str) -> CommandHandler:
        async def run(args: str, ctx: ExtensionContext) -> Any:
            self._sync(ctx)
            return await self.host.request({"type": "command", "ext": index, "name": name,
                                            "args": args})
        return run

    def _sync(self, ctx: ExtensionContext, *, full: bool = True) -> None:
        """Send what changed of the session's state since the last request, in three parts:
        the small facts always; the tools when the tool objects changed; the system prompt
        (some work to build) except before the handlers that run at every model call or tool
        call (``HOT_EVENTS``), which see the one of the request before."""
        host = ctx.host
        tools = host.tools
        commands = self.runtime.commands()
        parts: dict[str, Any] = {"facts": {
            "cwd": str(host.cwd), "hasUI": ctx.has_ui, "activeTools": [t.name for t in tools],
            "commands": [{"name": n, "description": c.description, "source": "extension"}
                         for n, c in commands.items()],
            "model": host.model, "thinkingLevel": host.thinking_level,
            "sessionId": host.session_id, "sessionFile": host.session_file,
            "sessionName": host.session_name, "isIdle": not host.is_streaming,
            "pendingMessages": host.queued_message_count}}
        key = tuple(map(id, tools))
        if key != self._tools_key:
            self._tools_key = key
            parts["tools"] = {"allTools": [{"name": t.name, "description": t.description,
                                            "parameters": t.parameters} for t in tools]}
        if full:
            parts["prompt"] = {"systemPrompt": host.system_prompt}
        changed = b""
        for part, fields in parts.items():
            encoded = msgspec.json.encode(fields)
            if self._sent.get(part) != encoded:
                self._sent[part] = encoded
                changed += (b"," if changed else b"") + encoded[1:-1]
        if changed:
            self.host.send_encoded(b'{"type":"state","state":{' + changed + b"}}")

    # -- the host's calls (omp.extensions.jshost.CallServer) ---------------------------------

    def _ctx(self) -> ExtensionContext:
        ctx = self.runtime.ctx
        if ctx is None:
            raise RuntimeError("the session has not started its extensions yet")
        return ctx

    def _path(self, call: dict[str, Any]) -> str:
        extension = self.loaded.get(call.get("ext"))  # type: ignore[arg-type]
        return extension.path if extension is not None else "<host>"

    def told(self, call: dict[str, Any]) -> None:
        """Serve a call that wants no answer; its failure is an ``extension_error``."""
        method = str(call.get("method"))
        params = call.get("params") or {}
        try:
            self._tell(method, params, call)
        except Exception as exc:
            self._report(self._path(call), method, str(exc) or type(exc).__name__)

    def _tell(self, method: str, params: dict[str, Any], call: dict[str, Any]) -> None:
        if method == "error":
            self._report(str(params.get("extensionPath", "<host>")), str(params.get("event")),
                         str(params.get("error")))
            return
        if method == "warn":
            self._notice("warning", str(params.get("message")))
            return
        if method == "register":
            extension = self.loaded.get(call.get("ext"))  # type: ignore[arg-type]
            if extension is not None:
                self._register(call["ext"], extension, params)
            return
        ctx = self._ctx()
        ui, host = ctx.ui, ctx.host
        if method == "ui.notify":
            kind = params.get("notifyType")
            ui.notify(str(params.get("message", "")),
                      kind if kind in ("info", "warning", "error") else None)
        elif method == "ui.setStatus":
            ui.set_status(str(params.get("key")), _text(params.get("text")))
        elif method == "ui.setWidget":
            lines = params.get("lines")
            placement = params.get("placement")
            ui.set_widget(str(params.get("key")),
                          [str(x) for x in lines] if isinstance(lines, list) else None,
                          placement=placement if placement in ("aboveEditor", "belowEditor")
                          else None)
        elif method == "ui.setTitle":
            ui.set_title(str(params.get("title", "")))
        elif method == "ui.setEditorText":
            ui.set_editor_text(str(params.get("text", "")))
        elif method == "sendMessage":
            host.send_custom_message(custom_message(params.get("message") or ""),
                                     trigger_turn=bool(params.get("triggerTurn")),
                                     deliver_as=_deliver_as(params.get("deliverAs")))
        elif method == "sendUserMessage":
            text, images = _user_content(params.get("content"))
            host.send_user_message(text, images, deliver_as=_deliver_as(params.get("deliverAs")))
        elif method == "appendEntry":
            host.append_entry(str(params.get("customType")), params.get("data"))
        elif method == "setThinkingLevel":
            host.set_thinking_level(params.get("level"))
        elif method == "abort":
            host.abort_nowait()
        elif method == "shutdown":
            host.request_shutdown()
        else:
            raise ValueError(f"unknown call {method!r}")

    async def asked(self, call: dict[str, Any]) -> Any:
        """Serve a call that waits for its answer (a dialog, ``setActiveTools`` ...). On
        cancellation (the request it was made in ended, the extension gave up on it) a
        dialog is cancelled as a Python extension's is (the host is told ``cancel``)."""
        method = str(call.get("method"))
        params = call.get("params") or {}
        ctx = self._ctx()
        ui, host = ctx.ui, ctx.host
        timeout = params.get("timeout")
        timeout = timeout if isinstance(timeout, int) and timeout > 0 else None
        if method == "ui.select":
            return await ui.select(str(params.get("title", "")), list(params.get("options", [])),
                                   timeout=timeout)
        if method == "ui.confirm":
            return await ui.confirm(str(params.get("title", "")),
                                    str(params.get("message", "")), timeout=timeout)
        if method == "ui.input":
            return await ui.input(str(params.get("title", "")), _text(params.get("placeholder")),
                                  timeout=timeout)
        if method == "ui.editor":
            return await ui.editor(str(params.get("title", "")), _text(params.get("prefill")))
        await trio.lowlevel.checkpoint()
        if method == "setActiveTools":
            host.set_active_tools([str(n) for n in params.get("names", [])])
            return None
        if method == "setModel":
            try:
                host.set_model(str(params.get("provider")), str(params.get("id")))
            except Exception:
                return False
            return True
        if method == "setSessionName":
            host.set_session_name(str(params.get("name", "")))
            return None
        if method == "waitForIdle":
            await host.wait_for_idle()
            return None
        raise ValueError(f"unknown call {method!r}")

    # -- reports -----------------------------------------------------------------------------

    def _report(self, path: str, event: str, error: str) -> None:
        if self.emit is not None:
            self.emit(ev.ExtensionError(extensionPath=path, event=event, error=error))

    def _notice(self, level: str, message: str) -> None:
        if self.emit is not None:
            self.emit(ev.Notice(level=level, source="extensions",  # type: ignore[arg-type]
                                message=message))

    def host_exited(self, why: str) -> None:
        """The host ended on its own: say so, and the session goes on without its
        extensions (their handlers, tools and commands are gone)."""
        runtime = self.host.runtime.describe()
        paths = [extension.path for extension in self.loaded.values()]
        for path in paths:
            self._report(path, "host", f"the extension host ({runtime}) {why}; this "
                                       "extension no longer runs")
        self._notice("error", f"The extension host ({runtime}) {why}: {', '.join(paths)} no "
                              "longer run (/reload-plugins starts them again)")
        for extension in self.loaded.values():
            extension.handlers.clear()
            extension.tools.clear()
            extension.commands.clear()
        self.runtime.refresh()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _deliver_as(value: Any) -> Any:
    return "followUp" if value in ("followUp", "nextTurn") else (
        "steer" if value == "steer" else None)


def _user_content(content: Any) -> tuple[str, list[m.ImageContent]]:
    """``sendUserMessage``'s content: a string, or text and image blocks."""
    if isinstance(content, str):
        return content, []
    texts, images = [], []
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "image":
            images.append(msgspec.convert(block, m.ImageContent))
        elif isinstance(block, dict):
            texts.append(str(block.get("text", "")))
    return "\n".join(texts), images
