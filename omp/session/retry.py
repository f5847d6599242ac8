"""Auto-retry policy (docs/design/agent-loop.md#retry): whether a failed turn is retried, and how
long to wait.

Pure functions. The session owns the saga (events, counters, the backoff sleep in its cancel
scope, removing the failed message, ``continue()``); this module only decides:

* ``should_retry``: retry iff auto-retry is on, the attempt is within ``maxRetries``, the turn
  ended in ``error`` (never ``aborted``), and the failure is transient: rate limits, overload,
  5xx and transport failures (a dropped or stalled stream included). Never a context overflow
  (compaction handles those, docs/design/sessions.md#when-compaction-runs), an auth failure, a
  request the provider rejected, a stream that did not parse or went over a ``stream`` bound (kind
  ``bad_response``), or a failure of our own (kind ``internal``).
* ``backoff_delay``: ``min(baseDelayMs · 2^(n-1), 8 s) · (1 - rand·0.25)`` for retry ``n``;
  a provider's ``retry-after`` wins when longer, and one longer than ``maxDelayMs`` ends the
  saga at once (``RetryWaitTooLong``).

What counts as an overflow or as transient is decided by the classifiers of ``omp.llm.errors``
(``is_overflow_text``, ``is_transient_text``), the same ones that give a live error its kind.

Delays are in seconds (trio time); ``auto_retry_start.delayMs`` is ``delay * 1000``.
"""

from __future__ import annotations

import random

import attrs

from ..llm.errors import ProviderError, is_overflow_text, is_transient_text
from ..protocol import messages as m
from .settings import RetrySettings

BACKOFF_CAP_MS = 8000
"""The exponential part stops growing here (omp: 0.5 s, 1 s, 2 s, 4 s, 8 s, 8 s, ...)."""
JITTER = 0.25
"""Each delay is shortened by up to this fraction, so clients that failed together spread out."""


def _stored(message: m.AssistantMessage) -> tuple[str, int | None]:
    """A stored message's error text and HTTP status: all there is once the ProviderError is
    gone (a reloaded session, an error from another layer)."""
    text = message.errorMessage if isinstance(message.errorMessage, str) else ""
    status = message.errorStatus if isinstance(message.errorStatus, int) else None
    return text, status


def is_context_overflow(error: ProviderError | None, message: m.AssistantMessage) -> bool:
    """The turn failed because the prompt no longer fits the model's window
    (docs/design/agent-loop.md#when-a-turn-is-retried,
    docs/design/sessions.md#when-compaction-runs)."""
    if error is not None:
        return error.kind == "context_overflow"
    return is_overflow_text(*_stored(message))


def is_transient(error: ProviderError | None, message: m.AssistantMessage) -> bool:
    """The failure may go away by waiting: the kinds of ``RETRYABLE``, or for a message without
    its ProviderError, what ``is_transient_text`` says of its text and status."""
    if error is not None:
        return error.retryable
    return is_transient_text(*_stored(message))


def should_retry(error: ProviderError | None, message: m.AssistantMessage,
                 settings: RetrySettings, attempt: int) -> bool:
    """Whether the run that ended with ``message`` gets retry number ``attempt`` (1-based: the
    first retry of a failed turn is 1; the saga's counter keeps growing while retries fail).

    ``error`` is the call's ProviderError when there is one (``ModelCall.error``); it is what
    decides. Without it the message's ``errorStatus`` and ``errorMessage`` do.
    """
    if not settings.enabled or attempt < 1 or attempt > settings.maxRetries:
        return False
    if message.stopReason != "error" or not message.errorMessage:
        return False
    return is_transient(error, message)


@attrs.define(eq=False, repr=False)
class RetryWaitTooLong(Exception):
    """The provider asked for a longer wait than ``retry.maxDelayMs``: the saga fails at once."""

    requested_ms: float
    max_ms: int

    def __attrs_post_init__(self) -> None:
        super().__init__(self.final_error(""))

    def final_error(self, original: str) -> str:
        """``auto_retry_end.finalError`` for a failure whose message was ``original``."""
        return (f"Provider requested {round(self.requested_ms)}ms wait, exceeds retry.maxDelayMs "
                f"({self.max_ms}ms). Original error: {original}")


def backoff_delay(attempt: int, settings: RetrySettings, retry_after: float | None,
                  rng: random.Random) -> float:
    """Seconds to wait before retry ``attempt`` (1-based).

    Exponential from ``baseDelayMs``, capped at 8 s, minus up to 25% jitter (one
    ``rng.random()`` per call, also when ``retry_after`` wins). ``retry_after`` (seconds, the
    provider's ``retry-after``) is a minimum. Raises RetryWaitTooLong when it exceeds
    ``maxDelayMs``.
    """
    if attempt < 1:
        raise ValueError(f"attempt is 1-based, got {attempt}")
    # A base above the cap is the user asking for longer waits: the cap never shortens it.
    cap = max(BACKOFF_CAP_MS, settings.baseDelayMs)
    # 2**(attempt-1) is an int: exact at any attempt, no float overflow.
    exponential: int = min(settings.baseDelayMs * 2 ** (attempt - 1), cap)
    delay_ms = exponential * (1 - rng.random() * JITTER)
    if retry_after is not None:
        requested_ms = retry_after * 1000
        if requested_ms > settings.maxDelayMs:
            raise RetryWaitTooLong(requested_ms, settings.maxDelayMs)
        delay_ms = max(delay_ms, requested_ms)
    return delay_ms / 1000
