"""OAuth 2.0 token endpoint exchanges (RFC 6749, RFC 8628, RFC 7636), over the caller's httpx
client, and the errors they end in.

Every exchange is a form-encoded POST (``application/x-www-form-urlencoded``, as RFC 6749 §4.1.3
and RFC 8628 §3.1 say) answered with JSON, bounded by ``REQUEST_SECONDS``. What can go wrong is
one ``LoginError`` with a message a user can act on; an error the server names (``error``,
``error_description``: RFC 6749 §5.2) is an ``OAuthError`` that keeps the code, so the device
flow can tell ``authorization_pending`` from ``access_denied``. Tokens are never part of an
error text: a body that does not parse is quoted only up to ``BODY_CHARS`` characters and only
from a failed reply, which carries no token.

A server is not trusted to be sane. A reply is read as it arrives, uncompressed (we ask for no
content coding and refuse one we did not ask for), up to ``MAX_BODY_BYTES``: an OAuth answer is
a few KB, a larger one is refused unread. The numbers it sends are clamped (``clamp_seconds``):
a device code lives at most ``MAX_DEVICE_SECONDS``, the polling interval is at least
``MIN_INTERVAL`` (RFC 8628's default) and at most ``MAX_INTERVAL``, and a token's lifetime is
read up to ``MAX_TOKEN_SECONDS``, so no value makes a login fail on arithmetic, wait forever or
poll in a loop.

Cancellation: each function is cancellable at any await; nothing is left behind (httpx closes
the response on the way out).
"""

from __future__ import annotations

import base64
import hashlib
import math
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from .config import OAuthConfig
from .store import NEVER_EXPIRES_MS, OAuthTokens

if TYPE_CHECKING:
    # httpx costs ~29 ms to import (omp/lazy.py): loaded with the first exchange.
    import httpx

REQUEST_SECONDS = 30.0
"""Bound of one exchange, the whole reply read."""
BODY_CHARS = 500
MAX_BODY_BYTES = 1 << 20
"""The largest reply read (tokens, even JWTs, are a few KB)."""
MIN_INTERVAL = 5.0
"""Seconds between two device-flow polls at least (RFC 8628 §3.2's default)."""
MAX_INTERVAL = 60.0
"""Seconds between two device-flow polls at most, whatever the server asks."""
SLOW_DOWN_SECONDS = 5.0
"""Added to the interval at every ``slow_down`` (RFC 8628 §3.5)."""
DEFAULT_DEVICE_SECONDS = 600.0
"""A device code's lifetime when the server does not say."""
MAX_DEVICE_SECONDS = 1800.0
"""A device code's lifetime at most: how long a device login may wait for the user."""
MAX_TOKEN_SECONDS = 365 * 24 * 3600.0
"""A token's lifetime at most (a longer one is renewed after a year, which costs nothing)."""
EXPIRY_MARGIN_MS = 5 * 60 * 1000
"""Subtracted from ``expires_in`` when a token is stored, so it is renewed before the server
would refuse it (the original's skew)."""


class LoginError(Exception):
    """A login or refresh failed; the message says why, for the user."""


class OAuthError(LoginError):
    """The server answered with an OAuth error (``error`` and optional ``error_description``)."""

    def __init__(self, message: str, code: str, description: str | None,
                 reply: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.code = code
        self.description = description
        self.reply = reply


class DeviceCode(msgspec.Struct, frozen=True, kw_only=True):
    """An RFC 8628 §3.2 device authorization response."""

    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None
    expires_in: float
    interval: float

    def __repr__(self) -> str:
        return f"DeviceCode(user_code={self.user_code!r})"  # the device code is a secret


def pkce_pair() -> tuple[str, str]:
    """A PKCE ``code_verifier`` (96 random bytes, base64url: 128 characters, RFC 7636 §4.1) and
    its S256 ``code_challenge``."""
    verifier = _b64url(secrets.token_bytes(96))
    return verifier, _b64url(hashlib.sha256(verifier.encode("ascii")).digest())


def new_state() -> str:
    """A fresh ``state``: 16 random bytes as 32 hex characters."""
    return secrets.token_hex(16)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


async def post_form(http: httpx.AsyncClient, provider: str, url: str,
                    form: Mapping[str, str]) -> dict[str, Any]:
    """POST ``form`` to ``url`` and return the JSON object of a 2xx reply.

    Raises ``OAuthError`` for a reply that names an OAuth error, ``LoginError`` for anything
    else (no answer, a timeout, a reply over ``MAX_BODY_BYTES`` or compressed, a reply that is
    not a JSON object). On cancellation the response is closed and ``Cancelled`` propagates
    (only the ``REQUEST_SECONDS`` bound becomes a ``LoginError``).
    """
    import httpx

    try:
        with trio.fail_after(REQUEST_SECONDS):
            async with http.stream("POST", url, data=dict(form), headers={
                    "accept": "application/json", "accept-encoding": "identity"}) as response:
                content = await _read_body(response, provider, url)
    except trio.TooSlowError:
        raise LoginError(f"{provider} request to {url} timed out after "
                         f"{REQUEST_SECONDS:g} s") from None
    except httpx.HTTPError as exc:
        raise LoginError(f"{provider} request to {url} failed: {exc}") from None
    try:
        body = msgspec.json.decode(content)
    except msgspec.DecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        description = body.get("error_description")
        description = description if isinstance(description, str) else None
        code = body["error"]
        text = f"{code}: {description}" if description else code
        raise OAuthError(f"{provider} authorization server said {text}", code, description,
                         body)
    if not response.is_success:
        snippet = content[:BODY_CHARS * 4].decode("utf-8", "replace")[:BODY_CHARS]
        raise LoginError(f"{provider} request to {url} failed: {response.status_code} {snippet}")
    if not isinstance(body, dict):
        raise LoginError(f"{provider} request to {url} did not answer with a JSON object")
    return body


async def _read_body(response: httpx.Response, provider: str, url: str) -> bytes:
    """The reply's bytes as they arrive; refused (the rest unread) past ``MAX_BODY_BYTES``, or
    with a content coding (a few KB of gzip can unpack to gigabytes)."""
    coding = response.headers.get("content-encoding", "identity").strip().lower()
    if coding != "identity":
        raise LoginError(f"{provider} request to {url} was answered with a {coding}-encoded "
                         "body; only uncompressed replies are accepted")
    content = bytearray()
    async for chunk in response.aiter_raw():
        content += chunk
        if len(content) > MAX_BODY_BYTES:
            raise LoginError(f"{provider} request to {url} was answered with more than "
                             f"{MAX_BODY_BYTES >> 20} MiB; an OAuth reply is a few KB")
    return bytes(content)


async def request_device_code(http: httpx.AsyncClient, provider: str,
                              config: OAuthConfig) -> DeviceCode:
    """RFC 8628 §3.1: ask for a device code and a user code. On cancellation as ``post_form``:
    the response is closed and ``Cancelled`` propagates."""
    assert config.deviceAuthorizationUrl is not None  # checked when models.yml was read
    form = {"client_id": config.clientId}
    if config.scopes:
        form["scope"] = " ".join(config.scopes)
    body = await post_form(http, provider, config.deviceAuthorizationUrl, form)
    missing = [f for f in ("device_code", "user_code", "verification_uri")
               if not isinstance(body.get(f), str) or not body[f]]
    if missing:
        raise LoginError(f"{provider} device authorization answer lacks "
                         f"{', '.join(missing)}")
    complete = body.get("verification_uri_complete")
    return DeviceCode(
        device_code=body["device_code"], user_code=body["user_code"],
        verification_uri=body["verification_uri"],
        verification_uri_complete=complete if isinstance(complete, str) and complete else None,
        expires_in=clamp_seconds(body.get("expires_in"), DEFAULT_DEVICE_SECONDS,
                                 high=MAX_DEVICE_SECONDS),
        interval=clamp_seconds(body.get("interval"), MIN_INTERVAL, low=MIN_INTERVAL,
                               high=MAX_INTERVAL))


def clamp_seconds(value: Any, default: float, *, low: float = 0.0, high: float) -> float:
    """Seconds a server sent (fractions allowed) brought into ``[low, high]``; ``default`` for
    anything but a positive number (infinity is ``high``)."""
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or (isinstance(value, float) and math.isnan(value)) or value <= 0):
        return default
    # Compared before the conversion: float() of a 400-digit integer would overflow.
    return float(min(max(value, low), high))


def tokens_from(body: Mapping[str, Any], provider: str, *, previous_refresh: str | None = None,
                now_ms: int | None = None) -> OAuthTokens:
    """The credential a token response (RFC 6749 §5.1) stands for: ``expires`` = now +
    ``expires_in`` (at most ``MAX_TOKEN_SECONDS``) - 5 min (never, without ``expires_in``); a
    reply without a new refresh token keeps ``previous_refresh`` (RFC 6749 §6)."""
    access = body.get("access_token")
    if not isinstance(access, str) or not access:
        raise LoginError(f"{provider} token answer lacks access_token")
    token_type = body.get("token_type", "Bearer")
    if not isinstance(token_type, str) or token_type.lower() != "bearer":
        raise LoginError(f"{provider} issued a {token_type!r} token; only Bearer tokens are "
                         "supported")
    refresh = body.get("refresh_token")
    now = int(time.time() * 1000) if now_ms is None else now_ms
    expires_in = body.get("expires_in")
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float):
        expires = NEVER_EXPIRES_MS
    else:
        # 0 or less (or NaN): expired already, renewed at the next call.
        seconds = clamp_seconds(expires_in, 0.0, high=MAX_TOKEN_SECONDS)
        expires = now + int(seconds * 1000) - EXPIRY_MARGIN_MS
    return OAuthTokens(access=access,
                       refresh=refresh if isinstance(refresh, str) and refresh
                       else previous_refresh, expires=expires)


async def refresh_tokens(http: httpx.AsyncClient, provider: str, config: OAuthConfig,
                         tokens: OAuthTokens) -> OAuthTokens:
    """RFC 6749 §6: new tokens for ``tokens``' refresh token. Raises LoginError. On
    cancellation the response is closed and ``Cancelled`` propagates; a refresh the server
    already made is lost (a server that rotates refresh tokens may then refuse
    ``tokens.refresh``)."""
    if tokens.refresh is None:
        raise LoginError(f"the {provider} login has no refresh token")
    form = {"grant_type": "refresh_token", "refresh_token": tokens.refresh,
            "client_id": config.clientId}
    if config.resource:
        form["resource"] = config.resource
    body = await post_form(http, provider, config.tokenUrl, form)
    return tokens_from(body, provider, previous_refresh=tokens.refresh)
