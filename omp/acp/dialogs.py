"""Extension and tool dialogs as ACP elicitations (docs/guides/acp.md#dialogs-as-elicitations): the
``ctx.ui`` of a session's extensions and the tool-approval gate's generic questions
(``omp.extensions.ui.ExtensionUI``).

When the editor declared ``elicitation.form`` at ``initialize``, ``select``, ``confirm`` and
``input`` become ``elicitation/create {mode: "form", sessionId, message, requestedSchema}`` whose
schema has one required property ``value``: a string from the option labels (``select``), a
boolean (``confirm``; the message is the title and the text below it), a string described by the
placeholder (``input``). Only an ``accept`` with content counts; a decline, a cancel, an error
of the editor or the dialog's ``timeout`` give the dialog's default (``None``, ``False``), as
without the capability. ``editor`` always gives its default, and ``notify``, status, widget,
title and editor-text calls are dropped: the original maps neither.

Cancellation (the turn aborted): the question is abandoned (a late answer is ignored; the
protocol has no way to withdraw a form elicitation) and ``Cancelled`` propagates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import msgspec
import trio

from ..extensions.ui import HeadlessUI, Option
from . import wire as w
from .client import ClientChannel, ClientError


@attrs.define(eq=False, repr=False)
class ElicitationUI(HeadlessUI):
    """One session's dialogs, asked of the editor (``editor`` and the presentation calls are
    the headless ones: the original maps neither)."""

    channel: ClientChannel
    session_id: str
    form: bool
    """The editor declared ``elicitation.form``."""

    @property
    def has_ui(self) -> bool:
        return self.form

    async def _ask(self, message: str, value: dict[str, Any],
                   timeout: int | None) -> Any:  # noqa: ASYNC109 (the dialog's own field, ms)
        """The accepted ``value``, or None."""
        if not self.form:
            await trio.lowlevel.checkpoint()
            return None
        schema = {"type": "object", "properties": {"value": value}, "required": ["value"]}
        with trio.move_on_after(math.inf if timeout is None else timeout / 1000):
            try:
                raw = await self.channel.ask("elicitation/create", w.CreateElicitationParams(
                    mode="form", sessionId=self.session_id, message=message,
                    requestedSchema=schema))
                answer = msgspec.json.decode(raw, type=w.ElicitationResponse)
            except (ClientError, msgspec.ValidationError):
                return None
            if answer.action == "accept" and answer.content is not None:
                return answer.content.get("value")
        return None

    async def select(self, title: str, options: Sequence[Option], *,
                     timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The label the user picked of ``options`` (a form whose ``value`` is one of them),
        or None. On cancellation the question is abandoned (a late answer is ignored) and
        ``Cancelled`` propagates; only the dialog's own ``timeout`` gives the default."""
        labels = [o if isinstance(o, str) else str(o.get("label", "")) for o in options]
        value = await self._ask(title, {"type": "string", "enum": labels}, timeout)
        return value if isinstance(value, str) else None

    async def confirm(self, title: str, message: str, *,
                      timeout: int | None = None) -> bool:  # noqa: ASYNC109
        """The user's yes or no (a form with a boolean ``value``); False unless accepted. On
        cancellation the question is abandoned (a late answer is ignored) and ``Cancelled``
        propagates; only the dialog's own ``timeout`` gives the default."""
        text = f"{title}\n\n{message}" if message.strip() else title
        value = await self._ask(text, {"type": "boolean"}, timeout)
        return value if isinstance(value, bool) else False

    async def input(self, title: str, placeholder: str | None = None, *,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The text the user entered (a form with a string ``value``, the placeholder as its
        description), or None. On cancellation the question is abandoned (a late answer is
        ignored) and ``Cancelled`` propagates; only the dialog's own ``timeout`` gives the
        default."""
        schema: dict[str, Any] = {"type": "string"}
        if placeholder is not None and placeholder.strip():
            schema["description"] = placeholder  # a form has no placeholder; the nearest
        value = await self._ask(title, schema, timeout)
        return value if isinstance(value, str) else None
