"""Provider adapters: each turns one API's streaming format into MessageBuilder calls.

``output_limit`` is the one place that decides the output limit a request carries
(docs/guides/models.md#output-limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...protocol.payloads import Model
    from ..types import StreamOptions

OPENAI_OUTPUT_CAP = 64_000
"""The most the original asks an OpenAI-style API for when it sends a model's limit itself."""


def output_limit(model: Model, options: StreamOptions, *,
                 cap: int | None = OPENAI_OUTPUT_CAP) -> int | None:
    """The output limit to send: ``options.max_tokens`` when asked for, else the model's own
    (``model.maxTokens``) unless the settings (``stream.sendMaxTokens``) or the model
    (``compat.sendMaxTokens: false``: a router whose upstreams have limits of their own) say
    not to; never above the model's limit or ``cap``. None: send no limit."""
    requested = options.max_tokens
    if requested is None:
        flags = model.compat if isinstance(model.compat, dict) else {}
        if not options.send_max_tokens or flags.get("sendMaxTokens") is False:
            return None
        requested = model.maxTokens
    if requested is None:
        return None
    value = min(requested, model.maxTokens or requested, cap or requested)
    return value if value > 0 else None
