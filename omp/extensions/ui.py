"""``ctx.ui``: what an extension may ask or show the user (docs/design/extending.md#ctxui).

Dialogs (``select``, ``confirm``, ``input``, ``editor``) are coroutines that return the user's
answer, or the method's default (``None``, ``False``) when there is no UI, the optional
``timeout`` (milliseconds) passes, or the host cancels. Presentation calls (``notify``,
``set_status``, ``set_widget``, ``set_title``, ``set_editor_text``) are plain calls that return at
once. Over RPC the host answers (``omp.rpc.bridges.HostUI``); without a host every dialog returns
its default at once (``HeadlessUI``).

Cancellation: a dialog cancelled with its handler (an abort, the handler's timeout) tells the host
(a ``cancel`` request) and lets ``Cancelled`` propagate. When the host is gone (stdin closed), a
pending or new dialog raises ``UiDisconnected``.

Time spent in a dialog does not count against a ``tool_call`` handler's timeout
(``paused_handler_clock``): a user thinking about a confirmation is not a stuck handler.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Literal, Protocol

import trio

NotifyType = Literal["info", "warning", "error"]
Option = str | dict[str, Any]
"""A select option: its label, or ``{"label": ..., "description": ...}``."""


class UiDisconnected(RuntimeError):
    """The host went away before answering a dialog."""


class ExtensionUI(Protocol):
    @property
    def has_ui(self) -> bool:
        """Whether dialogs reach a user (False: they return their default at once)."""
        ...

    async def select(self, title: str, options: Sequence[Option], *,
                     timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The label of the option the user picked, or None. On cancellation an implementation
        withdraws the question where its protocol can (RPC: a ``cancel`` request) and abandons
        it otherwise (a late answer is ignored), and lets ``Cancelled`` propagate: a
        cancellation never returns the default."""
        ...

    async def confirm(self, title: str, message: str, *, timeout: int | None = None) -> bool:  # noqa: ASYNC109
        """The user's yes or no (False by default). On cancellation as ``select``: the question
        is withdrawn or abandoned and ``Cancelled`` propagates."""
        ...

    async def input(self, title: str, placeholder: str | None = None, *,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The text the user typed, or None. On cancellation as ``select``: the question is
        withdrawn or abandoned and ``Cancelled`` propagates."""
        ...

    async def editor(self, title: str, prefill: str | None = None) -> str | None:
        """The text the user edited (from ``prefill``), or None. On cancellation as
        ``select``: the question is withdrawn or abandoned and ``Cancelled`` propagates."""
        ...

    def notify(self, message: str, type: NotifyType | None = None) -> None: ...

    def set_status(self, key: str, text: str | None = None) -> None: ...

    def set_widget(self, key: str, lines: Sequence[str] | None = None, *,
                   placement: Literal["aboveEditor", "belowEditor"] | None = None) -> None: ...

    def set_title(self, title: str) -> None: ...

    def set_editor_text(self, text: str) -> None: ...


class HeadlessUI:
    """No user to ask: dialogs return their defaults, presentation calls do nothing."""

    @property
    def has_ui(self) -> bool:
        return False

    async def select(self, title: str, options: Sequence[Option], *,
                     timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """None, after a checkpoint. On cancellation ``Cancelled`` propagates from that
        checkpoint (nothing was asked)."""
        await trio.lowlevel.checkpoint()
        return None

    async def confirm(self, title: str, message: str, *, timeout: int | None = None) -> bool:  # noqa: ASYNC109
        """False, after a checkpoint. On cancellation ``Cancelled`` propagates from that
        checkpoint (nothing was asked)."""
        await trio.lowlevel.checkpoint()
        return False

    async def input(self, title: str, placeholder: str | None = None, *,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """None, after a checkpoint. On cancellation ``Cancelled`` propagates from that
        checkpoint (nothing was asked)."""
        await trio.lowlevel.checkpoint()
        return None

    async def editor(self, title: str, prefill: str | None = None) -> str | None:
        """None, after a checkpoint. On cancellation ``Cancelled`` propagates from that
        checkpoint (nothing was asked)."""
        await trio.lowlevel.checkpoint()
        return None

    def notify(self, message: str, type: NotifyType | None = None) -> None:
        pass

    def set_status(self, key: str, text: str | None = None) -> None:
        pass

    def set_widget(self, key: str, lines: Sequence[str] | None = None, *,
                   placement: Literal["aboveEditor", "belowEditor"] | None = None) -> None:
        pass

    def set_title(self, title: str) -> None:
        pass

    def set_editor_text(self, text: str) -> None:
        pass


HANDLER_SCOPE: ContextVar[trio.CancelScope | None] = ContextVar("omp_handler_scope",
                                                                 default=None)
"""The timeout scope of the ``tool_call`` handler running in this task, if any."""


@contextlib.contextmanager
def paused_handler_clock() -> Iterator[None]:
    """Stop the running ``tool_call`` handler's timeout while a dialog waits for the user."""
    scope = HANDLER_SCOPE.get()
    if scope is None or scope.deadline == math.inf:
        yield
        return
    remaining = scope.deadline - trio.current_time()
    scope.deadline = math.inf
    try:
        yield
    finally:
        scope.deadline = trio.current_time() + remaining
