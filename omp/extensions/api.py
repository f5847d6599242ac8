"""The object an extension's ``setup(omp)`` gets, and the ``ctx`` its handlers get.

An extension is a Python module with ``def setup(omp: ExtensionAPI) -> None``. During ``setup``
only registration works (``on``, ``register_tool``, ``register_command``); the action methods
(sending messages, changing tools, the model or the thinking level) raise until the session is
running, as in the original (docs/design/extending.md#extension-modules). A ``setup`` that raises
is a load error: the extension's registrations are dropped.

``ctx`` (``ExtensionContext``) is given to every handler, tool and command: the working
directory, ``ui``, a read-only view of the session, ``abort()`` and ``shutdown()``. A handler that
runs inside a run (``tool_call``, ``context``, ``turn_end``...) runs in the run's task: an abort
cancels it with the run.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import attrs
import msgspec

from ..protocol import messages as m
from ..protocol.payloads import Model
from .events import EVENT_TYPES
from .ui import ExtensionUI

if TYPE_CHECKING:
    from ..tools.base import ConcurrencyRule, OnUpdate, Tier, Tool

NOT_INITIALIZED = ("Extension runtime not initialized. Action methods cannot be called during "
                   "extension loading.")

Handler = Callable[[Any, "ExtensionContext"], Awaitable[Any] | Any]
"""``async def handler(event, ctx)`` (a plain function works too)."""
ToolExecute = Callable[[str, dict[str, Any], "ExtensionContext", "OnUpdate"], Awaitable[Any]]
"""``async def execute(call_id, params, ctx, on_update)``."""
CommandHandler = Callable[[str, "ExtensionContext"], Awaitable[Any]]
"""``async def handler(args, ctx)``: ``args`` is the text after ``/name``."""
DeliverAs = Literal["steer", "followUp"]


class SessionView(Protocol):
    """What an extension may read of the session (read-only)."""

    @property
    def cwd(self) -> Path: ...

    @property
    def model(self) -> Model: ...

    @property
    def messages(self) -> list[m.AgentMessage]: ...

    @property
    def session_id(self) -> str: ...

    @property
    def session_file(self) -> str | None: ...

    @property
    def session_name(self) -> str | None: ...

    @property
    def is_streaming(self) -> bool: ...

    @property
    def queued_message_count(self) -> int: ...

    @property
    def system_prompt(self) -> list[str]: ...

    def entries_json(self, since: str | None = None) -> list[dict[str, Any]]: ...


class ExtensionHost(SessionView, Protocol):
    """The session as the extension runtime drives it."""

    def abort_nowait(self) -> None:
        """Abort the run in progress, without waiting (``ctx.abort()``)."""

    def request_shutdown(self) -> None:
        """Finish the current command, answer nothing queued after it, end
        (docs/design/protocol.md#shutdown-asked-by-an-extension)."""

    def send_user_message(self, text: str, images: Sequence[m.ImageContent] = (), *,
                          deliver_as: DeliverAs | None = None) -> None: ...

    def send_custom_message(self, message: m.CustomMessage, *, trigger_turn: bool,
                            deliver_as: DeliverAs | None) -> None: ...

    def active_tool_names(self) -> list[str]: ...

    def set_active_tools(self, names: Sequence[str]) -> None: ...

    def set_model(self, provider: str, model_id: str) -> Model: ...

    @property
    def thinking_level(self) -> str: ...

    def set_thinking_level(self, level: Any) -> Any: ...

    @property
    def tools(self) -> list[Tool]:
        """The tools the model is offered."""
        ...

    def append_entry(self, custom_type: str, data: Any = None) -> None:
        """A ``custom`` session entry (extension state; never sent to the model)."""

    def set_session_name(self, name: str) -> None: ...

    async def wait_for_idle(self) -> None:
        """Wait until no run is going (a JavaScript extension's ``waitForIdle``). On
        cancellation an implementation stops waiting and nothing else: the run goes on,
        nothing is aborted."""


@attrs.define(eq=False, repr=False)
class RegisteredTool:
    name: str
    label: str
    description: str
    parameters: dict[str, Any]
    execute: ToolExecute
    approval: Tier = "exec"
    """The tool's approval tier (docs/guides/approval.md#tiers): ``read``, ``write`` or ``exec``."""
    concurrency: ConcurrencyRule = "shared"
    """How its calls run beside the other calls of a batch (``omp.tools.base.Concurrency``)."""


@attrs.define(eq=False, repr=False)
class RegisteredCommand:
    name: str
    description: str
    handler: CommandHandler


@attrs.define(eq=False, repr=False)
class Extension:
    """One loaded extension: where it came from and what it registered."""

    path: str
    """As discovered (a file, a package folder, ``entry-point:<name>``, ``<inline-N>``)."""
    name: str
    handlers: dict[str, list[Handler]] = attrs.field(factory=dict)
    tools: dict[str, RegisteredTool] = attrs.field(factory=dict)
    commands: dict[str, RegisteredCommand] = attrs.field(factory=dict)


@attrs.define(eq=False, repr=False)
class ExtensionContext:
    """``ctx``: what a handler, tool or command may use."""

    host: ExtensionHost
    ui: ExtensionUI

    @property
    def cwd(self) -> Path:
        return self.host.cwd

    @property
    def has_ui(self) -> bool:
        return self.ui.has_ui

    @property
    def session(self) -> SessionView:
        """The session, read-only: ``messages``, ``entries_json()``, ``model``, ids..."""
        return self.host

    @property
    def model(self) -> Model:
        return self.host.model

    def is_idle(self) -> bool:
        return not self.host.is_streaming

    def has_pending_messages(self) -> bool:
        return self.host.queued_message_count > 0

    def abort(self) -> None:
        """Abort the run in progress, like the RPC ``abort`` (not awaited)."""
        self.host.abort_nowait()

    def shutdown(self) -> None:
        """End the session once the current command is answered; commands queued after it
        are neither run nor answered (docs/design/protocol.md#shutdown-asked-by-an-extension)."""
        self.host.request_shutdown()


@attrs.define(eq=False, repr=False)
class ExtensionAPI:
    """``omp`` in ``setup(omp)``: registration now, actions once the session runs."""

    extension: Extension
    _host: ExtensionHost | None = None

    def bind(self, host: ExtensionHost) -> None:
        """The session runs: action methods work from now on."""
        self._host = host

    def _running(self) -> ExtensionHost:
        if self._host is None:
            raise RuntimeError(NOT_INITIALIZED)
        return self._host

    # -- registration ------------------------------------------------------------------------

    def on(self, event: str, handler: Handler) -> None:
        """Call ``handler(event, ctx)`` for every ``event`` (see ``omp.extensions.events``)."""
        if event not in EVENT_TYPES:
            raise ValueError(f"Unknown extension event: {event!r} (known: "
                             f"{', '.join(sorted(EVENT_TYPES))})")
        self.extension.handlers.setdefault(event, []).append(handler)

    def register_tool(self, name: str, label: str, description: str,
                      parameters: dict[str, Any], execute: ToolExecute, *,
                      approval: Tier = "exec", concurrency: ConcurrencyRule = "shared") -> None:
        """A tool the model can call: ``parameters`` is a JSON schema of type object;
        ``execute(call_id, params, ctx, on_update)`` returns the result (a string, a list of
        content blocks, or ``{"content": [...], "details": ..., "isError": bool}``); raising
        makes an error result with the exception's message. ``approval``: its tier for tool
        approval (``read``, ``write``, ``exec``; the original's default ``exec``).
        ``concurrency``: ``shared`` (the default: its calls run beside the other calls of the
        same message), ``exclusive`` (a call waits for every call before it, and every call
        after it waits for it), or a function of the call's arguments returning one of them."""
        if approval not in ("read", "write", "exec"):
            raise ValueError(f'Tool "{name}" approval must be "read", "write" or "exec" '
                             f"(got {approval!r})")
        if not callable(concurrency) and concurrency not in ("shared", "exclusive"):
            raise ValueError(f'Tool "{name}" concurrency must be "shared", "exclusive" or a '
                             f"function of the arguments (got {concurrency!r})")
        if not name or not isinstance(name, str):
            raise ValueError("register_tool needs a name")
        if parameters.get("type", "object") != "object":
            raise ValueError(f'Tool "{name}" parameters must be a JSON schema of type "object"')
        self.extension.tools[name] = RegisteredTool(name, label or name, description,
                                                    parameters, execute, approval, concurrency)

    def register_command(self, name: str, description: str, handler: CommandHandler) -> None:
        """A slash command ``/name``: ``handler(args, ctx)`` runs when a prompt starts with it."""
        name = name.removeprefix("/")
        if not name or any(ch.isspace() for ch in name):
            raise ValueError(f"Invalid command name: {name!r}")
        self.extension.commands[name] = RegisteredCommand(name, description, handler)

    # -- actions -----------------------------------------------------------------------------

    def send_user_message(self, text: str, *, deliver_as: DeliverAs | None = None) -> None:
        """A user prompt, as the host's ``prompt`` but without command processing: idle, it
        starts a run; during one, it is queued (steering unless ``deliver_as="followUp"``)."""
        self._running().send_user_message(text, deliver_as=deliver_as)

    def send_message(self, payload: str | dict[str, Any], *, trigger_turn: bool = False,
                     deliver_as: DeliverAs | None = None) -> None:
        """A ``custom`` message: a string, or ``{customType?, content, display?, details?}``.
        Idle, it is added to the context (``trigger_turn``: and a run starts); during a run it
        is queued (steering unless ``deliver_as="followUp"``)."""
        host = self._running()
        host.send_custom_message(custom_message(payload), trigger_turn=trigger_turn,
                                 deliver_as=deliver_as)

    def append_entry(self, custom_type: str, data: Any = None) -> None:
        """A ``custom`` session entry: extension state kept in the session file, never sent
        to the model."""
        self._running().append_entry(custom_type, data)

    def get_active_tools(self) -> list[str]:
        return self._running().active_tool_names()

    def set_active_tools(self, names: Sequence[str]) -> None:
        self._running().set_active_tools(names)

    @property
    def model(self) -> Model:
        return self._running().model

    def set_model(self, provider: str, model_id: str) -> bool:
        """Switch models; False when the model is unknown or has no credentials."""
        try:
            self._running().set_model(provider, model_id)
        except Exception:
            return False
        return True

    def get_thinking_level(self) -> str:
        return self._running().thinking_level

    def set_thinking_level(self, level: str) -> None:
        self._running().set_thinking_level(level)


def custom_message(payload: str | dict[str, Any]) -> m.CustomMessage:
    """The original's rules: a string is a displayed ``custom-message``; an object is hidden
    unless it says ``display``."""
    now = int(time.time() * 1000)
    if isinstance(payload, str):
        return m.CustomMessage(customType="custom-message", content=payload, display=True,
                               timestamp=now, attribution="agent")
    content = payload.get("content", "")
    if not isinstance(content, str):
        content = [m.TextContent(text=str(b.get("text", ""))) if isinstance(b, dict) else
                   m.TextContent(text=str(b)) for b in content]
    return m.CustomMessage(
        customType=str(payload.get("customType") or "custom-message"), content=content,
        display=bool(payload.get("display", False)), timestamp=now,
        details=payload.get("details", msgspec.UNSET),
        attribution="agent")
