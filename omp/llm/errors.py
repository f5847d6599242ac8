"""Provider failures, mapped once at the boundary (STYLE: httpcore's exceptions module).

Everything that can go wrong in a model call — an HTTP status with its body, a transport failure,
a stream that drops or stalls, an error event inside the stream, a bug of ours — becomes one
``ProviderError`` whose ``kind`` says what the user can do about it. Its ``message`` becomes the
assistant's ``errorMessage``, written the way the original omp writes it, because hosts match it:

* **HTTP error**: ``<status> <provider message>``, then, when the body carried one, a line with
  the provider's message and its machine fields: ``<message> (type=… param=… code=… status=…)``
  (string fields only; the line is left out when it would repeat the first). OpenAI:
  ``400 This model's maximum context length is …\\nThis model's maximum context length is …
  (type=invalid_request_error param=messages code=context_length_exceeded)``; an empty body:
  ``<status> status code (no body)``; a body without a message: ``<status> <body text>``.
* **In-stream error event**: ``<message> (type=… code=…)`` by the same rule (the Responses API
  keeps its own ``Error Code <code>: <message>`` form, built by that adapter).
* **Transport failure**: the system error's name first: ``ECONNRESET: <what happened>`` for a
  dropped connection, ``ECONNREFUSED``, ``ENOTFOUND``, ``ETIMEDOUT``.
* **A bug of ours** (any exception that is neither a transport error nor a ProviderError):
  ``Internal error: <ExceptionType>: <text>``, kind ``internal``, never retried: re-running the
  turn would only repeat the bug, and its tools with it.
* **A stream we will not read**, kind ``bad_response``, never retried (the same request gets the
  same answer; a malformed stream was retried ten times over 48 s before): one that does not
  parse, ``Malformed stream from <provider>: <what>; it sent: <the provider's text>``
  (``malformed_stream``), and one over a bound of the ``stream`` settings, ``Stream over a
  limit: <what> (stream.<setting> in config.yml)`` (``stream_over_limit``). A stall (no
  progress for ``stream.idleTimeoutMs``) is a transport failure, ``network``: retried.

One classifier per question, used by the live path (kinds) and by the retry policy for a stored
message that has no ProviderError any more: ``is_overflow_text`` (the prompt no longer fits the
window, docs/design/agent-loop.md#when-a-turn-is-retried,
docs/design/sessions.md#when-compaction-runs) and ``is_transient_text`` (waiting may help).

No secret leaves in an error text: every message is passed through ``redact`` with the call's
key and auth-header tokens (``secrets_of``), and URL userinfo (``https://user:pass@host``) is
always removed. Local paths a library put in an exception's text are replaced (``scrub``).
"""

from __future__ import annotations

import base64
import errno as errno_names
import re
import socket
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from ..groups import chain, unwrapped

if TYPE_CHECKING:
    import httpx

    from ..protocol.payloads import Model
    from .types import StreamOptions

ErrorKind = Literal[
    "auth", "rate_limit", "overloaded", "server", "context_overflow", "bad_request", "network",
    "internal", "bad_response",
]
RETRYABLE: frozenset[ErrorKind] = frozenset({"rate_limit", "overloaded", "server", "network"})

INTERNAL_PREFIX = "Internal error: "
"""How the message of a failure of our own begins (kind ``internal``)."""
MALFORMED_PREFIX = "Malformed stream"
"""How the message of a stream that does not parse begins (kind ``bad_response``)."""
OVER_LIMIT_PREFIX = "Stream over a limit: "
"""How the message of a stream over a ``stream.*`` bound begins (kind ``bad_response``)."""
SENT_CHARS = 300
"""How much of what a malformed stream sent is quoted."""
REDACTED = "[redacted]"
"""What a secret is replaced with in an error text."""

MAX_DETAIL_CHARS = 4096
"""Longest provider text kept per line (a proxy's HTML page is not a message)."""
BODY_LIMIT = 64 * 1024
"""Bytes of an error body read at most: the text is all we need from it."""
MIN_SECRET_CHARS = 4
"""Shorter values are not treated as secrets: replacing "x" everywhere would only garble text."""

# The classifiers' patterns are strings, compiled by ``re`` on first use (and kept in its
# cache): they are only needed once something failed, and compiling them cost every start about
# 1.5 ms.
# The prompt no longer fits the model's window (docs/design/agent-loop.md#when-a-turn-is-retried
# lists the families; matched case-insensitively anywhere in the text, so the
# ``code=context_length_exceeded`` suffix counts).
_OVERFLOW = (
    r"prompt is too long|exceeds (?:the |your |the model's )?context(?: window| length)?|"
    r"maximum context length|context[_ ]length[_ ]exceeded|context[_ ]window[_ ]exceeded|"
    r"too many tokens|token limit exceeded|input token count.*exceeds the maximum|"
    r"exceeds the maximum number of tokens|reduce the length of the messages|"
    r"input is too long|request too large for model"
)
# Waiting may help (docs/design/agent-loop.md#when-a-turn-is-retried: pi's families, omp's
# additions, and the texts of our own transport errors, old and new, for messages stored by earlier
# versions).
_TRANSIENT = (
    r"overloaded|rate.?limit|too many requests|\b(?:408|429|500|502|503|504|529)\b|"
    r"service.?unavailable|server.?error|internal.?error|connection.?(?:error|refused|dropped)|"
    r"connection closed|ended early|other side closed|fetch failed|upstream.?connect|"
    r"reset before headers|terminated|retry delay|timed? out|timeout|stream stall|"
    r"socket hang up|network.?error|no capacity|high demand|provider returned error|"
    r"retry your request|\bE(?:CONNRESET|CONNREFUSED|CONNABORTED|TIMEDOUT|PIPE|NOTFOUND|"
    r"HOSTUNREACH|NETUNREACH|AI_AGAIN)\b"
)
# Out of credit answers 429, but waiting does not help: it is a billing problem.
_QUOTA = r"insufficient_quota|exceeded your current quota"
# A stream we would not read, as our texts begin (the adapters' older "Malformed Anthropic
# stream event" and "Malformed Gemini stream chunk" included): the same answer next time.
_BAD_RESPONSE = r"Malformed\b|Stream over a limit\b"
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
_PATH = r"(?<![\w:/])(?:/[\w.\-]+){2,}"
_USERINFO = r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.\-]*://)[^/\s?#@]+@"
_SENSITIVE_HEADER = r"(?i)auth|key|token|secret|cookie|password"
# The machine fields of an error object shown after its message, in this order.
_EXTRAS = ("type", "param", "code", "status")


class ProviderError(Exception):
    # A plain exception, not attrs: this module is imported at every start, where attrs'
    # generated methods cost more than the class itself (omp/lazy.py).
    def __init__(self, kind: ErrorKind, message: str, provider: str = "", model: str = "",
                 http_status: int | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        """The text for ``errorMessage`` (module docstring), without local paths or secrets."""
        self.provider = provider
        self.model = model
        self.http_status = http_status
        self.retry_after = retry_after
        """Seconds the provider asked us to wait, when it said."""

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def __str__(self) -> str:
        return self.message

    def redact(self, secrets: Iterable[str]) -> ProviderError:
        """Remove ``secrets`` (and URL userinfo) from the message, in place; returns self."""
        self.message = redact(self.message, secrets)
        self.args = (self.message,)
        return self


# --- classifiers ------------------------------------------------------------------------------


def is_overflow_text(text: str, status: int | None = None) -> bool:
    """The failure says the prompt is larger than the model's window: HTTP 413, or the wording
    providers use for it. The one overflow classifier (live errors and stored messages)."""
    return status == 413 or bool(re.search(_OVERFLOW, text, re.IGNORECASE))


def is_transient_text(text: str, status: int | None = None) -> bool:
    """Waiting and sending the same request again may succeed. The one transient classifier.

    Never for an overflow (compaction handles it), an out-of-credit answer, a stream that did
    not parse or went over a bound, or a failure of our own. With an HTTP status, the status
    decides (408, 409, 425, 429, 5xx); without one, the wording does.
    """
    if (is_overflow_text(text, status) or text.startswith(INTERNAL_PREFIX)
            or re.match(_BAD_RESPONSE, text) or re.search(_QUOTA, text, re.IGNORECASE)):
        return False
    if status is not None:
        return status in _TRANSIENT_STATUS or status >= 500
    return bool(re.search(_TRANSIENT, text, re.IGNORECASE))


def kind_for_status(status: int, message: str) -> ErrorKind:
    """The kind of an HTTP error with this status and text."""
    if is_overflow_text(message, status):
        return "context_overflow"
    if status in (401, 403):
        return "auth"
    if not is_transient_text(message, status):
        return "bad_request"
    if status == 429:
        return "rate_limit"
    if status in (503, 529):
        return "overloaded"
    return "server"


# --- texts ------------------------------------------------------------------------------------


def scrub(text: str) -> str:
    """Drop absolute local paths a library may have put in an exception's text."""
    return re.sub(_PATH, "<path>", text)


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every secret, and the userinfo of every URL, replaced by ``[redacted]``."""
    # One pass, longest first: a key that contains another goes whole, and no replacement is
    # matched again inside the marker already written.
    wanted = sorted({s for s in secrets if len(s) >= MIN_SECRET_CHARS}, key=len, reverse=True)
    if wanted:
        text = re.sub("|".join(map(re.escape, wanted)), REDACTED, text)
    return re.sub(_USERINFO, rf"\g<scheme>{REDACTED}@", text)


def secrets_of(model: Model, options: StreamOptions) -> tuple[str, ...]:
    """What a call must never show in an error text: its API key, the tokens in its
    auth-like headers (the model's and the call's), and the password in its base URL."""
    found: list[str] = []
    if options.api_key:
        found.append(options.api_key)
    model_headers = model.headers if isinstance(model.headers, dict) else {}
    for headers in (model_headers, options.headers):
        for name, value in headers.items():
            if re.search(_SENSITIVE_HEADER, name):
                found.append(value.strip())
                # "Bearer <token>", "Basic <credentials>": the token alone may be echoed too.
                found.extend(value.split()[1:])
    url = urllib.parse.urlsplit(model.baseUrl)
    if url.password:
        # httpx sends URL userinfo as Basic auth: the header value may be echoed as well.
        found.append(url.password)
        found.append(base64.b64encode(f"{url.username or ''}:{url.password}".encode()).decode())
    # A server may echo a value URL-encoded (in a query string it quotes back).
    found.extend([urllib.parse.quote(s, safe="") for s in found])
    return tuple(dict.fromkeys(s for s in found if s))


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_DETAIL_CHARS else text[:MAX_DETAIL_CHARS] + "…"


def _payload(body: Any) -> dict[str, Any] | None:
    """The JSON object of an error body (Google's streaming endpoints wrap it in a list)."""
    if isinstance(body, list) and body:
        body = body[0]
    return body if isinstance(body, dict) else None


def _str_field(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return value if isinstance(value, str) and value.strip() else None


def describe_error(payload: Mapping[str, Any]) -> str | None:
    """``<message> (type=… param=… code=… status=…)`` for an error object, or None when it has
    no message. ``payload`` is a whole body (``{"error": {...}}``) or the error object itself;
    fields come from the error object, else from the body. Only string fields are shown (a
    numeric ``code`` repeats the HTTP status)."""
    inner = payload.get("error")
    error: Mapping[str, Any] = inner if isinstance(inner, dict) else payload
    message = (_str_field(error, "message") or _str_field(payload, "message")
               or _str_field(payload, "error"))
    if message is None:
        return None
    extras = []
    for key in _EXTRAS:
        value = _str_field(error, key) or _str_field(payload, key)
        # ``type: "error"`` is an envelope's event type (Anthropic), not the kind of error.
        if value is not None and not (key == "type" and value == "error"):
            extras.append(f"{key}={value}")
    message = _clip(message)
    return f"{message} ({' '.join(extras)})" if extras else message


def http_error_text(status: int, body: Any, raw: str) -> str:
    """The ``errorMessage`` of an HTTP error (module docstring): status and provider message,
    then the message with its machine fields when that adds anything."""
    payload = _payload(body)
    detail: str | None = None
    if payload is not None:
        inner = payload.get("error")
        error = inner if isinstance(inner, dict) else payload
        detail = (_str_field(error, "message") or _str_field(error, "msg")
                  or _str_field(payload, "message") or _str_field(payload, "error"))
    detail = _clip(detail or raw) or None
    first = f"{status} {detail}" if detail else f"{status} status code (no body)"
    described = (describe_error(payload) if payload is not None else None) or (
        _clip(raw) or None)
    if described is not None and described not in first:
        return f"{first}\n{described}"
    return first


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
            import email.utils  # lazy: omp.lazy says why

            try:
                when = email.utils.parsedate_to_datetime(value) if value else None
            except (TypeError, ValueError):
                when = None
            if when is not None:
                return max(0.0, when.timestamp() - time.time())
    for name in ("x-ratelimit-reset-requests", "x-ratelimit-reset-tokens",
                 "anthropic-ratelimit-requests-reset"):
        if (value := headers.get(name)) is not None and (secs := _duration(value)) is not None:
            return secs
    # Google puts it in the body: error.details[].retryDelay = "12s".
    payload = _payload(body)
    error = payload.get("error") if payload is not None else None
    details = error.get("details") if isinstance(error, dict) else None
    for detail in details if isinstance(details, list) else ():
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
        return max(0.0, datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
                   - time.time())
    except ValueError:
        return None


# --- constructors -----------------------------------------------------------------------------


async def from_response(response: httpx.Response, provider: str, model: str, *,
                        secrets: Iterable[str] = ()) -> ProviderError:
    """The error for a non-2xx response. Reads at most ``BODY_LIMIT`` bytes of the body.

    Cancelled: the read stops, ``Cancelled`` propagates; the caller closes the response.
    """
    raw = bytearray()
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) >= BODY_LIMIT:
            break
    text = bytes(raw[:BODY_LIMIT]).decode("utf-8", "replace")
    try:
        body: Any = msgspec.json.decode(text)
    except msgspec.DecodeError:
        body = text
    status = response.status_code
    message = redact(scrub(http_error_text(status, body, text)), secrets)
    return ProviderError(
        kind=kind_for_status(status, message), message=message, provider=provider,
        model=model, http_status=status, retry_after=parse_retry_after(response.headers, body))


def from_stream_error(message: str, provider: str, model: str, *,
                      error_type: str | None = None) -> ProviderError:
    """An error event inside a stream (Anthropic ``error``, Responses ``response.failed``...).

    ``message`` is the text to show (``describe_error`` of the event's error object); the kind
    comes from the overflow classifier first, then from the provider's ``error_type``. An
    untyped in-stream failure is a server hiccup (retryable).
    """
    t = (error_type or "").lower()
    kind: ErrorKind
    if is_overflow_text(message):
        kind = "context_overflow"
    elif "overloaded" in t:
        kind = "overloaded"
    elif "rate_limit" in t:
        kind = "rate_limit"
    elif t in ("invalid_request_error", "invalid_request"):
        kind = "bad_request"
    elif "auth" in t or "permission" in t:
        kind = "auth"
    elif re.search(_QUOTA, message, re.IGNORECASE):
        kind = "bad_request"
    else:
        kind = "server"
    return ProviderError(kind=kind, message=scrub(message), provider=provider, model=model)


def malformed_stream(what: str, sent: str | bytes, provider: str, model: str) -> ProviderError:
    """A stream that does not parse: ``what`` went wrong, ``sent`` is what the provider sent
    (quoted, at most ``SENT_CHARS`` of it). Kind ``bad_response``: never retried."""
    if isinstance(sent, bytes):
        sent = sent.decode("utf-8", "replace")
    quoted = sent if len(sent) <= SENT_CHARS else sent[:SENT_CHARS] + "…"
    return ProviderError(kind="bad_response", provider=provider, model=model,
                         message=f"{MALFORMED_PREFIX} from {provider}: {what}; it sent: "
                                 f"{quoted!r}")


def stream_over_limit(what: str, setting: str, provider: str, model: str) -> ProviderError:
    """A stream over one of the ``stream`` settings' bounds: ``what`` is over, ``setting``
    names the key. Kind ``bad_response``: never retried."""
    return ProviderError(kind="bad_response", provider=provider, model=model,
                         message=f"{OVER_LIMIT_PREFIX}{what} (stream.{setting} in config.yml)")


def _system_error_name(exc: BaseException, default: str) -> str:
    """``ECONNRESET``-style name of the OS error under ``exc`` (its cause chain, and the
    members of a group: trio raises one error per address it tried), or ``default`` when the
    library did not keep one."""
    for current in chain(exc):
        if isinstance(current, socket.gaierror):
            return "ENOTFOUND"
        code = current.errno if isinstance(current, OSError) else None
        if code is not None and code in errno_names.errorcode:
            return errno_names.errorcode[code]
    return default


def _transport_error(exc: Exception) -> tuple[ErrorKind, str] | None:
    """Kind and text of a transport failure, or None when ``exc`` is not one."""
    import httpx

    text = str(exc).strip()
    detail = text or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        return "network", f"ETIMEDOUT: {type(exc).__name__}" + (f": {text}" if text else "")
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL)):
        # The request itself cannot be sent: a configuration problem, the same next time.
        return "bad_request", f"Invalid request: {detail}"
    if isinstance(exc, httpx.ConnectError):
        return "network", f"{_system_error_name(exc, 'ECONNREFUSED')}: {detail}"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        # The peer closed or reset the connection before the response was complete.
        return "network", f"{_system_error_name(exc, 'ECONNRESET')}: {detail}"
    if isinstance(exc, httpx.HTTPError):  # other transport and decoding failures
        return "network", f"{_system_error_name(exc, 'ECONNRESET')}: {detail}"
    if isinstance(exc, (ConnectionError, TimeoutError)):  # an OS error httpx did not wrap
        return "network", f"{_system_error_name(exc, 'ECONNRESET')}: {detail}"
    return None


def from_exception(exc: BaseException, provider: str, model: str, *,
                   secrets: Iterable[str] = ()) -> ProviderError:
    """Any failure during a call, as a ProviderError.

    A ProviderError passes through (its provider and model filled in, ``secrets`` redacted); a
    transport error becomes ``network`` (or ``bad_request`` when the request cannot be sent);
    anything else is a bug of ours: ``internal``, never retried. A group holding one real error
    is that error.
    """
    secrets = tuple(secrets)
    exc = unwrapped(exc)
    if isinstance(exc, ProviderError):
        exc.provider = exc.provider or provider
        exc.model = exc.model or model
        return exc.redact(secrets)
    mapped = _transport_error(exc) if isinstance(exc, Exception) else None
    if mapped is not None:
        kind, text = mapped
    else:
        kind, text = "internal", f"{INTERNAL_PREFIX}{type(exc).__name__}: {exc}"
    return ProviderError(kind=kind, message=redact(scrub(text), secrets), provider=provider,
                         model=model)
