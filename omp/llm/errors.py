"""Provider failures, mapped once at the boundary (STYLE: httpcore's exceptions module).

Everything that can go wrong in a model call — an HTTP status with its body, a transport failure,
a stream that drops or stalls, an error event inside the stream — becomes one ``ProviderError``
whose ``kind`` says what the user can do about it. The provider's own message is kept; local paths
never appear in it (we never put any there, and ``scrub`` removes those a library adds).
"""

from __future__ import annotations

import email.utils
import re
import time
from typing import TYPE_CHECKING, Any, Literal

import attrs
import msgspec

if TYPE_CHECKING:
    import httpx

ErrorKind = Literal[
    "auth", "rate_limit", "overloaded", "server", "context_overflow", "bad_request", "network",
]
RETRYABLE: frozenset[ErrorKind] = frozenset({"rate_limit", "overloaded", "server", "network"})

# Messages providers use for a prompt longer than the context window (agent-core §6.2 lists the
# families; matched case-insensitively against the provider's message).
_OVERFLOW = re.compile(
    r"prompt is too long|context[_ ]length[_ ]exceeded|maximum context length|"
    r"context window|too many tokens|exceeds the context|input is too long|"
    r"reduce the length of the messages|request too large for model|"
    r"input token count.*exceeds|exceeds the maximum number of tokens|context_window_exceeded",
    re.IGNORECASE,
)
_PATH = re.compile(r"(?<![\w:/])(?:/[\w.\-]+){2,}")


@attrs.define(eq=False)
class ProviderError(Exception):
    kind: ErrorKind
    message: str
    """The provider's own message (or ours for transport failures), without local paths."""
    provider: str = ""
    model: str = ""
    http_status: int | None = None
    retry_after: float | None = None
    """Seconds the provider asked us to wait, when it said."""

    def __attrs_post_init__(self) -> None:
        super().__init__(self.message)

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def __str__(self) -> str:
        return self.message


def scrub(text: str) -> str:
    """Drop absolute local paths a library may have put in an exception's text."""
    return _PATH.sub("<path>", text)


def kind_for_status(status: int, message: str) -> ErrorKind:
    if _OVERFLOW.search(message) or status == 413:
        return "context_overflow"
    if status in (401, 403):
        return "auth"
    if status == 429:
        # Out of credit is a billing problem, not a rate: waiting does not help.
        lowered = message.lower()
        if "insufficient_quota" in lowered or "exceeded your current quota" in lowered:
            return "bad_request"
        return "rate_limit"
    if status in (503, 529):
        return "overloaded"
    if status >= 500 or status in (408, 409, 425):
        return "server"
    return "bad_request"


def parse_retry_after(headers: httpx.Headers, body: Any = None) -> float | None:
    """Seconds to wait, from ``retry-after`` / ``retry-after-ms`` / provider headers and bodies."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    if (value := headers.get("retry-after")) is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value) if value else None
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens",
                 "anthropic-ratelimit-requests-reset"):
        if (value := headers.get(name)) is not None and (secs := _duration(value)) is not None:
            return secs
    # Google puts it in the body: error.details[].retryDelay = "12s".
    if isinstance(body, dict):
        details = (body.get("error") or {}).get("details") if isinstance(
            body.get("error"), dict) else None
        for detail in details or ():
            if isinstance(detail, dict) and isinstance(detail.get("retryDelay"), str):
                return _duration(detail["retryDelay"])
    return None


def _duration(text: str) -> float | None:
    """'1.5s', '20ms', '2m3s', or an absolute RFC 3339 time."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if parts and "".join(n + u for n, u in parts) == text.strip():
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        return sum(float(n) * scale[u] for n, u in parts)
    try:
        from datetime import datetime

        return max(0.0, datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
                   - time.time())
    except ValueError:
        return None


def message_from_body(body: Any, fallback: str) -> str:
    """The provider's message from an error body of any of the four APIs."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("msg")
            if isinstance(msg, str) and msg:
                return msg
        if isinstance(err, str) and err:
            return err
        if isinstance(body.get("message"), str):
            return str(body["message"])
    if isinstance(body, list) and body:
        return message_from_body(body[0], fallback)
    if isinstance(body, str) and body.strip():
        return body.strip()[:2000]
    return fallback


async def from_response(response: httpx.Response, provider: str, model: str) -> ProviderError:
    """The error for a non-2xx response (reads the body)."""
    raw = await response.aread()
    try:
        body: Any = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        body = raw.decode("utf-8", "replace")
    reason = response.reason_phrase or "error"
    message = message_from_body(body, f"{response.status_code} {reason}")
    return ProviderError(
        kind=kind_for_status(response.status_code, message), message=scrub(message),
        provider=provider, model=model, http_status=response.status_code,
        retry_after=parse_retry_after(response.headers, body))


def from_stream_error(message: str, provider: str, model: str, *,
                      error_type: str | None = None) -> ProviderError:
    """An error event inside a stream (Anthropic ``error``, Responses ``response.failed``...)."""
    t = (error_type or "").lower()
    if _OVERFLOW.search(message):
        kind: ErrorKind = "context_overflow"
    elif "overloaded" in t or "overloaded" in message.lower():
        kind = "overloaded"
    elif "rate_limit" in t or "rate limit" in message.lower():
        kind = "rate_limit"
    elif t in ("invalid_request_error", "invalid_request"):
        kind = "bad_request"
    elif "auth" in t or "permission" in t:
        kind = "auth"
    else:
        kind = "server"
    return ProviderError(kind=kind, message=scrub(message), provider=provider, model=model)


def from_exception(exc: BaseException, provider: str, model: str) -> ProviderError:
    """Any failure during a call, as a ProviderError (a ProviderError passes through)."""
    if isinstance(exc, ProviderError):
        if not exc.provider or not exc.model:
            exc.provider = exc.provider or provider
            exc.model = exc.model or model
        return exc
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return ProviderError(kind="network", message=f"Request timed out ({type(exc).__name__})",
                             provider=provider, model=model)
    if isinstance(exc, httpx.RemoteProtocolError):
        return ProviderError(kind="network", message="Connection dropped before the response "
                             f"was complete: {scrub(str(exc))}", provider=provider, model=model)
    if isinstance(exc, httpx.TransportError):
        detail = scrub(str(exc)) or type(exc).__name__
        return ProviderError(kind="network", message=f"Network error: {detail}",
                             provider=provider, model=model)
    return ProviderError(kind="server", message=f"{type(exc).__name__}: {scrub(str(exc))}",
                         provider=provider, model=model)
