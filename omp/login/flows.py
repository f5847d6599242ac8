"""The interactive logins: OAuth device code (RFC 8628), OAuth authorization code with PKCE and
a loopback redirect (RFC 7636, RFC 8252), and pasting an API key.

A flow talks to the user through a ``LoginUI`` (over RPC: ``extension_ui_request`` frames,
docs/design/protocol.md#extension-ui, in the original's order, docs/design/protocol.md#login) and to
the authorization server through ``omp.login.oauth``. It returns the credential; storing it is the
caller's job.

The PKCE flow races three things in one nursery it owns: the loopback server on 127.0.0.1 (the
browser's redirect), a paste prompt that is asked again until it yields a code (for a browser
that cannot reach this machine), and the ``CALLBACK_SECONDS`` deadline. The first outcome wins
and the nursery is cancelled: the listener closes and a paste prompt still open is cancelled
(its ``cancel`` frame goes to the host). Both sides hand the answer that decides the login (a
code, or a ``LoginError``) over a channel; a failure of either side itself (the prompt's when
the host is gone, a bug) ends the race and leaves the flow as itself, not in an exception group
(``omp.groups``), as it would from the other flows. A ``state`` that does not match ends the
login.

Cancellation (``abort``, the host going away): every flow is cancellable at each await; the
listener is closed on the way out and nothing is stored.
"""

from __future__ import annotations

import math
import secrets
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, Protocol

import attrs
import msgspec
import trio

from ..groups import unwrap
from ..protocol.events import ExtensionUiRequest
from .config import OAuthConfig
from .oauth import (
    MAX_INTERVAL,
    SLOW_DOWN_SECONDS,
    LoginError,
    OAuthError,
    clamp_seconds,
    new_state,
    pkce_pair,
    post_form,
    request_device_code,
    tokens_from,
)
from .store import ApiKey, Credential, OAuthTokens

if TYPE_CHECKING:
    import httpx

PROMPT_TIMEOUT_MS = 600_000
"""How long one ``input`` prompt of a login waits (the original's value)."""
CALLBACK_SECONDS = 300.0
"""How long a PKCE login waits for the redirect or a pasted code."""
DEVICE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
PASTE_TITLE = "Paste the authorization code (or full redirect URL):"
_HEAD_LIMIT = 16 * 1024
_HEAD_SECONDS = 10.0


class LoginUI(Protocol):
    """What a login shows the user and asks of them."""

    def open_url(self, url: str, *, launch_url: str | None = None,
                 instructions: str | None = None) -> None: ...

    def notify(self, message: str) -> None: ...

    async def input(self, title: str, *, placeholder: str | None = None,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The user's answer; None when they cancelled or it timed out. Raises when the user
        is gone (the host closed its input)."""


class Dialogs(Protocol):
    """The part of ``omp.rpc.bridges.HostUI`` a login uses."""

    def notify(self, message: str,
               type: Literal["info", "warning", "error"] | None = None) -> None: ...

    async def input(self, title: str, placeholder: str | None = None, *,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The user's answer; None when they dismissed it or ``timeout`` (ms) passed. Raises
        when the host is gone. On cancellation the dialog is withdrawn (``HostUI`` writes a
        ``cancel`` request to the host) and ``Cancelled`` propagates."""
        ...


@attrs.define(eq=False, repr=False)
class FrameLoginUI:
    """``LoginUI`` over the extension UI sub-protocol: dialogs and notices through the host's
    UI bridge, ``open_url`` (no answer expected) written as its frame."""

    dialogs: Dialogs
    emit: Callable[[msgspec.Struct], None]

    def open_url(self, url: str, *, launch_url: str | None = None,
                 instructions: str | None = None) -> None:
        self.emit(ExtensionUiRequest(
            id=secrets.token_hex(8), method="open_url", url=url,
            launchUrl=msgspec.UNSET if launch_url is None else launch_url,
            instructions=msgspec.UNSET if instructions is None else instructions))

    def notify(self, message: str) -> None:
        self.dialogs.notify(message, "info")

    async def input(self, title: str, *, placeholder: str | None = None,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The answer to the host's ``input`` dialog (``Dialogs.input``). On cancellation the
        dialog is withdrawn (``HostUI`` writes its ``cancel``) and ``Cancelled`` propagates."""
        return await self.dialogs.input(title, placeholder, timeout=timeout)


class LoginTarget(msgspec.Struct, frozen=True):
    """A provider one can log in to: with OAuth (``oauth``) or by pasting an API key."""

    id: str
    name: str
    oauth: OAuthConfig | None = None


async def run_login(target: LoginTarget, ui: LoginUI, http: httpx.AsyncClient) -> Credential:
    """Log in to ``target`` with its flow and return the credential (not stored).

    Raises LoginError with a message for the user; what ``ui.input`` raises when the user is
    gone passes through. On cancellation nothing is left open.
    """
    config = target.oauth
    if config is None:
        return ApiKey(await api_key_login(ui, target.name))
    if config.flow == "device":
        return await device_login(ui, http, target, config)
    return await pkce_login(ui, http, target, config)


# --- API key ------------------------------------------------------------------------------------


async def api_key_login(ui: LoginUI, name: str) -> str:
    """Ask for the key (one prompt); a pasted ``Bearer`` prefix is dropped. On cancellation
    the prompt is withdrawn (``ui.input``: over RPC a ``cancel`` frame, in a terminal its
    reader thread abandoned) and ``Cancelled`` propagates."""
    value = await ui.input(f"Paste your {name} API key", timeout=PROMPT_TIMEOUT_MS)
    key = (value or "").strip()
    if key[:7].lower() == "bearer ":
        key = key[7:].strip()
    if not key:
        raise LoginError("API key is required")
    return key


# --- device code (RFC 8628) ---------------------------------------------------------------------


async def device_login(ui: LoginUI, http: httpx.AsyncClient, target: LoginTarget,
                       config: OAuthConfig) -> OAuthTokens:
    """Show the user code, then poll the token endpoint every ``interval`` seconds (as the
    server says, within ``MIN_INTERVAL`` and ``MAX_INTERVAL`` of ``omp.login.oauth``;
    ``slow_down`` adds 5 s, or takes the server's new ``interval`` when that is longer) until
    the user approved, denied, or the code expired (``expires_in``, at most
    ``MAX_DEVICE_SECONDS``). On cancellation the polling stops (an exchange in flight has its
    response closed) and ``Cancelled`` propagates; the device code is left to expire."""
    ui.notify("Requesting device authorization...")
    device = await request_device_code(http, target.id, config)
    ui.open_url(device.verification_uri_complete or device.verification_uri,
                instructions=f"Open the page and enter the code {device.user_code} to sign in "
                             f"to {target.name}")
    ui.notify("Waiting for device authorization...")
    expired = f"{target.name} device code expired; restart the login"
    interval = device.interval
    deadline = trio.current_time() + device.expires_in
    form = {"grant_type": DEVICE_GRANT, "device_code": device.device_code,
            "client_id": config.clientId}
    while True:
        if trio.current_time() + interval > deadline:
            raise LoginError(expired)
        await trio.sleep(interval)
        try:
            body = await post_form(http, target.id, config.tokenUrl, form)
        except OAuthError as exc:
            if exc.code == "authorization_pending":
                continue
            if exc.code == "slow_down":
                named = clamp_seconds(exc.reply.get("interval"), 0.0, high=MAX_INTERVAL)
                interval = min(max(interval + SLOW_DOWN_SECONDS, named), MAX_INTERVAL)
                continue
            if exc.code == "access_denied":
                raise LoginError(f"{target.name} device authorization was denied") from None
            if exc.code == "expired_token":
                raise LoginError(expired) from None
            raise
        return tokens_from(body, target.id)


# --- authorization code + PKCE, loopback redirect (RFC 7636, RFC 8252) --------------------------


Outcome = str | LoginError
"""What one side of the PKCE race hands over: the authorization code, or why the
authorization failed (an error answer, a ``state`` that does not match)."""


async def pkce_login(ui: LoginUI, http: httpx.AsyncClient, target: LoginTarget,
                     config: OAuthConfig, *, wait_seconds: float = CALLBACK_SECONDS
                     ) -> OAuthTokens:
    """Send the user to the authorization URL and take the code from the loopback redirect
    or from a pasted redirect URL / code, whichever comes first; then exchange it. On
    cancellation the loopback listener is closed, a paste prompt still open is withdrawn, an
    exchange in flight has its response closed, and ``Cancelled`` propagates."""
    assert config.authorizationUrl is not None  # checked when models.yml was read
    verifier, challenge = pkce_pair()
    state = new_state()
    listener = await _listen(config.redirectPort)
    port = listener.socket.getsockname()[1]
    redirect_uri = f"http://127.0.0.1:{port}/callback"
    params = {"response_type": "code", "client_id": config.clientId,
              "redirect_uri": redirect_uri, "code_challenge": challenge,
              "code_challenge_method": "S256", "state": state}
    if config.scopes:
        params["scope"] = " ".join(config.scopes)
    if config.resource:
        params["resource"] = config.resource
    base = config.authorizationUrl
    auth_url = base + ("&" if urllib.parse.urlsplit(base).query else "?") + \
        urllib.parse.urlencode(params, quote_via=urllib.parse.quote)
    send, receive = trio.open_memory_channel[Outcome](math.inf)
    outcome: Outcome | None = None
    # A side that fails (the paste prompt raises when the host is gone: UiDisconnected over
    # RPC) cancels the race, and its error leaves as itself, as it does from the other flows.
    with unwrap():
        async with trio.open_nursery() as nursery:
            loopback = _Loopback(state, auth_url, send)
            nursery.start_soon(loopback.serve, listener)
            ui.open_url(auth_url, launch_url=f"http://127.0.0.1:{port}/launch",
                        instructions="Complete login in your browser. If the browser cannot "
                                     "reach this machine, paste the final redirect URL or "
                                     "authorization code when prompted.")
            ui.notify("Waiting for browser authentication...")
            nursery.start_soon(_paste_loop, ui, state, send)
            with trio.move_on_after(wait_seconds):
                outcome = await receive.receive()
            loopback.done = True
            nursery.cancel_scope.cancel()
    if outcome is None:
        raise LoginError(f"Login timed out: no authorization arrived within "
                         f"{wait_seconds:g} s; log in again")
    if isinstance(outcome, LoginError):
        raise outcome
    ui.notify("Exchanging authorization code for tokens...")
    form = {"grant_type": "authorization_code", "code": outcome, "redirect_uri": redirect_uri,
            "client_id": config.clientId, "code_verifier": verifier}
    if config.resource:
        form["resource"] = config.resource
    body = await post_form(http, target.id, config.tokenUrl, form)
    return tokens_from(body, target.id)


async def _listen(port: int) -> trio.SocketListener:
    try:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
    except OSError as exc:
        raise LoginError(f"OAuth callback port {port} is in use ({exc.strerror or exc}); set "
                         "`redirectPort` to a free port, or to 0 for any") from None
    for extra in listeners[1:]:
        await trio.aclose_forcefully(extra)
    return listeners[0]


STATE_MISMATCH = ("OAuth state mismatch: the redirect does not belong to this login (a stale or "
                  "forged URL); log in again")


def _answer(code: str | None, state: str | None, error: str | None, description: str | None,
            expected_state: str, *, require_state: bool = True) -> Outcome | None:
    """The outcome of a redirect's parameters; None when they hold no code (keep waiting).

    A redirect always carries the ``state`` it was sent with (RFC 6749 §4.1.2); only a bare
    pasted code may come without one."""
    if (state is not None or require_state) and state != expected_state:
        return LoginError(STATE_MISMATCH)
    if error is not None:
        return LoginError(f"Authorization failed: {description or error}")
    return code or None


def parse_pasted(text: str, expected_state: str) -> Outcome | None:
    """A pasted redirect URL, query string, ``code#state`` or bare code; None: no code in it."""
    text = text.strip()
    if not text:
        return None
    if "://" in text or "code=" in text or "error=" in text:
        query = urllib.parse.urlsplit(text).query if "://" in text else text.lstrip("?")
        found = dict(urllib.parse.parse_qsl(query))
        return _answer(found.get("code"), found.get("state"), found.get("error"),
                       found.get("error_description"), expected_state)
    code, _, state = text.partition("#")
    return _answer(code.strip(), state.strip() or None, None, None, expected_state,
                   require_state=False)


async def _paste_loop(ui: LoginUI, state: str, send: trio.MemorySendChannel[Outcome]) -> None:
    """Ask for the redirect URL or code until an answer decides the login. What ``ui.input``
    raises (the host is gone) propagates: the race ends with it."""
    while True:
        value = await ui.input(PASTE_TITLE, timeout=PROMPT_TIMEOUT_MS)
        if value is not None and (outcome := parse_pasted(value, state)) is not None:
            send.send_nowait(outcome)
            return


@attrs.define(eq=False, repr=False)
class _Loopback:
    """The redirect target: ``/callback`` takes the code, ``/launch`` sends the browser to the
    authorization URL (while the login waits), anything else is 404."""

    state: str
    auth_url: str
    send: trio.MemorySendChannel[Outcome]
    done: bool = False

    async def serve(self, listener: trio.SocketListener) -> None:
        """Accept until cancelled; the listener is closed on the way out."""
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    stream = await listener.accept()
                    nursery.start_soon(self._connection, stream)
        finally:
            await trio.aclose_forcefully(listener)

    async def _connection(self, stream: trio.SocketStream) -> None:
        try:
            with trio.move_on_after(_HEAD_SECONDS):
                target = await _read_target(stream)
                if target is not None:
                    await stream.send_all(self._respond(target))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the browser went away
        finally:
            await trio.aclose_forcefully(stream)

    def _respond(self, target: str) -> bytes:
        parts = urllib.parse.urlsplit(target)
        if parts.path == "/launch":
            if self.done:
                return _response(503, "This login is over.")
            return _response(302, "Redirecting...", location=self.auth_url)
        if parts.path != "/callback":
            return _response(404, "Not found.")
        found = dict(urllib.parse.parse_qsl(parts.query))
        outcome = _answer(found.get("code"), found.get("state"), found.get("error"),
                          found.get("error_description"), self.state)
        if outcome is None:
            return _response(400, "No authorization code in this redirect.")
        if self.done:
            return _response(503, "This login is over.")
        self.done = True
        self.send.send_nowait(outcome)
        if isinstance(outcome, LoginError):
            return _response(400, str(outcome))
        return _response(200, "Login complete. You can close this window.")


async def _read_target(stream: trio.SocketStream) -> str | None:
    """The request target of a GET, once its head arrived; None for anything else."""
    head = bytearray()
    while b"\r\n\r\n" not in head and b"\n\n" not in head:
        chunk = await stream.receive_some(4096)
        if not chunk or len(head) > _HEAD_LIMIT:
            return None
        head += chunk
    request_line = bytes(head).split(b"\n", 1)[0].decode("latin-1").strip().split(" ")
    if len(request_line) != 3 or request_line[0] != "GET":
        return None
    return request_line[1]


_REASONS = {200: "OK", 302: "Found", 400: "Bad Request", 404: "Not Found",
            503: "Service Unavailable"}


def _response(status: int, text: str, *, location: str | None = None) -> bytes:
    body = (f"<!doctype html><meta charset=utf-8><title>omp login</title>"
            f"<p>{_html_escape(text)}</p>\n").encode()
    head = [f"HTTP/1.1 {status} {_REASONS[status]}", "content-type: text/html; charset=utf-8",
            f"content-length: {len(body)}", "cache-control: no-store", "connection: close"]
    if location is not None:
        head.append(f"location: {location}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
