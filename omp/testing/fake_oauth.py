"""A scripted fake OAuth 2.0 authorization server: real HTTP/1.1 on loopback, for tests and hosts.

``open_fake_oauth()`` serves, on an ephemeral port of 127.0.0.1 (trio + h11):

* ``POST /device/code`` — RFC 8628 §3.1/3.2: a device code, the user code ``user_code``, the
  ``/device`` verification URI (and its ``?user_code=`` complete form), ``expires_in`` =
  ``device_expires_in`` and ``interval`` (seconds; any number, a hostile one included: omp
  waits 5 to 60 s between two polls, whatever it says);
* ``GET /authorize`` — RFC 6749 §4.1.1 with PKCE (RFC 7636): checks ``client_id``,
  ``response_type=code``, a loopback ``redirect_uri``, ``code_challenge_method=S256`` and a
  ``state``, then redirects (302) to ``redirect_uri?code=...&state=...`` (or ``?error=...`` with
  ``authorize_error``) — what a browser does after the user approved;
* ``POST /token`` — the device grant (answers scripted per poll), the authorization code grant
  (the verifier must match the challenge, the redirect URI the one authorized), and the refresh
  grant (RFC 6749 §6; rotates the refresh token; ``refresh_delay``, ``refresh_error``).

Scripting the device flow: ``device_polls`` lists the answers to the successive polls of each
device code — ``"pending"`` (``authorization_pending``), ``"slow_down"`` (with ``interval`` =
``slow_down_interval`` when set, else RFC 8628's +5 s), ``"denied"`` (``access_denied``),
``"expired"`` (``expired_token``), ``"ok"`` (tokens); after the list, ``"pending"`` forever.
A poll sooner than the device's current interval after the previous one (or after the code was
issued) is counted in ``early_polls``, so a test sees a client that does not wait; every poll's
``trio.current_time()`` is in ``poll_times`` (virtual on a ``MockClock``).

Playing a hostile server: any number may be huge or tiny (``device_expires_in``, ``interval``,
``slow_down_interval``, ``token_expires_in``); ``response_padding`` streams that many spaces after
every JSON answer (still valid JSON, never held in memory, and with no ``content-length``: a
body whose size the client learns only by reading it), and ``content_encoding="gzip"``
compresses every answer and says so.

From the command line, ``python -m omp.testing.fake_oauth [--port N] [--device-polls
pending,ok] ...`` serves until Ctrl-C or SIGTERM (exit 0), after printing its address and the
``oauth:`` blocks of a ``models.yml`` provider that logs in to it (``--help`` lists the
settings).

Tokens are random (``at-``/``rt-`` + hex); every issued one is in ``issued``; ``access_tokens``
holds those still valid. Every request is recorded in ``requests``. ``wait_until`` lets a test
wait for a state instead of sleeping. On leaving ``open_fake_oauth`` the listener and every
connection are closed.
"""

from __future__ import annotations

import argparse
import base64
import functools
import gzip
import hashlib
import json
import secrets
import signal
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import attrs
import h11
import msgspec
import trio

from ..groups import unwrap
from .listen import accept_forever, one_listener

__all__ = ["FakeOAuth", "OAuthRequest", "open_fake_oauth", "serve_fake_oauth"]

_encode = msgspec.json.Encoder().encode
_RECEIVE_BYTES = 64 * 1024


@attrs.frozen
class OAuthRequest:
    """One request as the server received it (form fields or query parameters in ``params``)."""

    method: str
    path: str
    params: dict[str, str]
    headers: dict[str, str]


@attrs.define
class _Device:
    user_code: str
    interval: float
    answers: list[str]
    last: float
    """``trio.current_time()`` of the previous poll (or of the code's issue)."""


@attrs.define
class _Grant:
    client_id: str
    redirect_uri: str
    challenge: str


@attrs.define(eq=False, repr=False)
class FakeOAuth:
    """A running fake authorization server: its script, its address, what it saw."""

    base_url: str
    client_id: str = "omp-test-client"
    user_code: str = "WDJB-MJHT"
    interval: float = 0.05
    device_expires_in: float = 600.0
    device_polls: list[str] = attrs.field(factory=lambda: ["pending", "ok"])
    slow_down_interval: float | None = None
    token_expires_in: float = 3600
    refresh_delay: float = 0.0
    """Seconds a refresh takes (so concurrent refreshes would overlap)."""
    refresh_error: str | None = None
    """An OAuth error code every refresh fails with (e.g. ``invalid_grant``)."""
    authorize_error: str | None = None
    """An OAuth error code ``/authorize`` redirects with instead of a code (``access_denied``)."""
    response_padding: int = 0
    """Spaces streamed after every JSON answer (a megabyte at a time)."""
    content_encoding: str | None = None
    """``"gzip"``: every answer is compressed, with its ``content-encoding``."""
    requests: list[OAuthRequest] = attrs.field(factory=list)
    issued: list[str] = attrs.field(factory=list)
    access_tokens: set[str] = attrs.field(factory=set)
    polls: int = 0
    early_polls: int = 0
    poll_times: list[float] = attrs.field(factory=list)
    refreshes: int = 0
    _devices: dict[str, _Device] = attrs.field(factory=dict)
    _codes: dict[str, _Grant] = attrs.field(factory=dict)
    _refresh_tokens: set[str] = attrs.field(factory=set)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    @property
    def token_url(self) -> str:
        return f"{self.base_url}/token"

    @property
    def device_url(self) -> str:
        return f"{self.base_url}/device/code"

    @property
    def authorize_url(self) -> str:
        return f"{self.base_url}/authorize"

    def oauth_block(self, flow: str, *, redirect_port: int = 0,
                    scopes: tuple[str, ...] = ("openid", "offline_access")) -> dict[str, Any]:
        """The ``oauth:`` block of a models.yml provider that logs in here."""
        block: dict[str, Any] = {"flow": flow, "clientId": self.client_id,
                                 "tokenUrl": self.token_url, "scopes": list(scopes)}
        if flow == "device":
            block["deviceAuthorizationUrl"] = self.device_url
        else:
            block["authorizationUrl"] = self.authorize_url
            block["redirectPort"] = redirect_port
        return block

    def issue(self, *, refresh: bool = True) -> dict[str, Any]:
        """A token response with fresh tokens (also for tests that store a login directly)."""
        access = "at-" + secrets.token_hex(16)
        self.issued.append(access)
        self.access_tokens.add(access)
        body: dict[str, Any] = {"access_token": access, "token_type": "Bearer",
                                "expires_in": self.token_expires_in}
        if refresh:
            token = "rt-" + secrets.token_hex(16)
            self.issued.append(token)
            self._refresh_tokens.add(token)
            body["refresh_token"] = token
        return body

    async def wait_until(self, predicate: Callable[[FakeOAuth], bool]) -> None:
        """Return once ``predicate(self)`` holds. Cancellation just stops the waiting."""
        while not predicate(self):
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # -- endpoints -------------------------------------------------------------------------------

    async def _answer(self, request: OAuthRequest) -> tuple[int, dict[str, str], Any]:
        route = (request.method, request.path)
        if route == ("POST", "/device/code"):
            return self._device_code(request.params)
        if route == ("GET", "/authorize"):
            return self._authorize(request.params)
        if route == ("POST", "/token"):
            grant = request.params.get("grant_type")
            if grant == "urn:ietf:params:oauth:grant-type:device_code":
                return self._device_token(request.params)
            if grant == "authorization_code":
                return self._code_token(request.params)
            if grant == "refresh_token":
                return await self._refresh(request.params)
            return _error("unsupported_grant_type", f"grant_type {grant!r}")
        return 404, {}, {"error": "not_found"}

    def _device_code(self, params: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        if params.get("client_id") != self.client_id:
            return _error("invalid_client", "unknown client_id", 401)
        code = "dc-" + secrets.token_hex(16)
        self._devices[code] = _Device(self.user_code, self.interval, list(self.device_polls),
                                      trio.current_time())
        return 200, {}, {
            "device_code": code, "user_code": self.user_code,
            "verification_uri": f"{self.base_url}/device",
            "verification_uri_complete": f"{self.base_url}/device?user_code={self.user_code}",
            "expires_in": self.device_expires_in, "interval": self.interval}

    def _device_token(self, params: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        device = self._devices.get(params.get("device_code", ""))
        if device is None or params.get("client_id") != self.client_id:
            return _error("invalid_grant", "unknown device_code")
        now = trio.current_time()
        self.polls += 1
        self.poll_times.append(now)
        # A little slack for timer resolution; a client that does not wait is far below it.
        if now - device.last < device.interval * 0.9:
            self.early_polls += 1
        device.last = now
        answer = device.answers.pop(0) if device.answers else "pending"
        if answer == "ok":
            del self._devices[params["device_code"]]
            return 200, {}, self.issue()
        if answer == "slow_down":
            device.interval = (self.slow_down_interval if self.slow_down_interval is not None
                               else device.interval + 5)
            body: dict[str, Any] = {"error": "slow_down"}
            if self.slow_down_interval is not None:
                body["interval"] = self.slow_down_interval
            return 400, {}, body
        codes = {"pending": "authorization_pending", "denied": "access_denied",
                 "expired": "expired_token"}
        return _error(codes[answer], None)

    def _authorize(self, params: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        redirect = params.get("redirect_uri", "")
        host = urlsplit(redirect).hostname
        problems = [name for name, ok in (
            ("client_id", params.get("client_id") == self.client_id),
            ("response_type", params.get("response_type") == "code"),
            ("redirect_uri", host in ("127.0.0.1", "localhost", "::1")),
            ("code_challenge_method", params.get("code_challenge_method") == "S256"),
            ("code_challenge", len(params.get("code_challenge", "")) == 43),
            ("state", bool(params.get("state")))) if not ok]
        if problems:
            return 400, {}, f"fake OAuth: bad authorization request: {', '.join(problems)}"
        answer = {"state": params["state"]}
        if self.authorize_error is not None:
            answer["error"] = self.authorize_error
            answer["error_description"] = "The user said no"
        else:
            code = "ac-" + secrets.token_hex(16)
            self._codes[code] = _Grant(params["client_id"], redirect, params["code_challenge"])
            answer["code"] = code
        return 302, {"location": f"{redirect}?{urlencode(answer)}"}, ""

    def _code_token(self, params: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        grant = self._codes.pop(params.get("code", ""), None)
        if grant is None:
            return _error("invalid_grant", "unknown or used authorization code")
        verifier = params.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(
            hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if challenge != grant.challenge:
            return _error("invalid_grant", "code_verifier does not match the code_challenge")
        if params.get("redirect_uri") != grant.redirect_uri:
            return _error("invalid_grant", "redirect_uri differs from the authorized one")
        if params.get("client_id") != grant.client_id:
            return _error("invalid_client", "client_id differs")
        return 200, {}, self.issue()

    async def _refresh(self, params: dict[str, str]) -> tuple[int, dict[str, str], Any]:
        self.refreshes += 1
        self._notify()
        if self.refresh_delay:
            await trio.sleep(self.refresh_delay)
        if self.refresh_error is not None:
            return _error(self.refresh_error, "Refresh token expired")
        token = params.get("refresh_token", "")
        if token not in self._refresh_tokens or params.get("client_id") != self.client_id:
            return _error("invalid_grant", "unknown refresh token")
        self._refresh_tokens.discard(token)  # rotated: a refresh token works once
        return 200, {}, self.issue()

    # -- connections -----------------------------------------------------------------------------

    async def _handle_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await _receive(conn, stream)
                if request is None:
                    break
                self.requests.append(request)
                self._notify()
                status, headers, body = await self._answer(request)
                await _send(conn, stream, status, headers, body, padding=self.response_padding,
                            encoding=self.content_encoding)
                self._notify()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.RemoteProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)


def _error(code: str, description: str | None,
           status: int = 400) -> tuple[int, dict[str, str], Any]:
    body = {"error": code}
    if description is not None:
        body["error_description"] = description
    return status, {}, body


async def _receive(conn: h11.Connection, stream: trio.SocketStream) -> OAuthRequest | None:
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(_RECEIVE_BYTES))
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            target = urlsplit(head.target.decode("latin-1"))
            params = dict(parse_qsl(target.query, keep_blank_values=True))
            if head.method == b"POST":
                params.update(parse_qsl(body.decode("latin-1"), keep_blank_values=True))
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
            return OAuthRequest(method=head.method.decode("latin-1"), path=target.path,
                                params=params, headers=headers)
        else:
            return None


_PAD = b" " * (1 << 20)


async def _send(conn: h11.Connection, stream: trio.SocketStream, status: int,
                headers: dict[str, str], body: Any, *, padding: int = 0,
                encoding: str | None = None) -> None:
    if isinstance(body, str):
        data, kind = body.encode(), "text/plain; charset=utf-8"
    else:
        data, kind = _encode(body), "application/json"
    wire = [*headers.items(), ("content-type", kind), ("cache-control", "no-store")]
    if encoding == "gzip":
        data = gzip.compress(data)
        wire.append(("content-encoding", "gzip"))
    if not padding:  # else chunked: the client cannot tell the size up front
        wire.append(("content-length", str(len(data))))
    await stream.send_all(conn.send(h11.Response(status_code=status, headers=wire))
                          + conn.send(h11.Data(data=data)))
    while padding > 0:  # the client may stop reading: then sending fails and the connection ends
        piece = _PAD[:padding]
        padding -= len(piece)
        await stream.send_all(conn.send(h11.Data(data=piece)))
    await stream.send_all(conn.send(h11.EndOfMessage()))


async def serve_fake_oauth(*, host: str = "127.0.0.1", port: int = 0,
                           task_status: trio.TaskStatus[FakeOAuth] = trio.TASK_STATUS_IGNORED,
                           **script: Any) -> None:
    """Serve until cancelled; ``nursery.start`` returns the running ``FakeOAuth`` (``script``:
    its settings, e.g. ``device_polls=[...]``). On cancellation the listener and every
    connection close and ``Cancelled`` propagates."""
    async with one_listener(host, port) as (listener, authority):
        fake = FakeOAuth(base_url=f"http://{authority}", **script)
        task_status.started(fake)
        await accept_forever(listener, fake._handle_connection)


@asynccontextmanager
async def open_fake_oauth(**script: Any) -> AsyncIterator[FakeOAuth]:
    """``async with open_fake_oauth(device_polls=[...]) as fake``: the server lives for the
    block (its tasks in a nursery this manager owns); leaving the block, however, closes it.
    The block's own exception (a cancellation too) leaves as itself, not inside an exception
    group (``omp.groups``); cancelled on entry, it leaves nothing listening."""
    with unwrap():
        async with trio.open_nursery() as nursery:
            fake: FakeOAuth = await nursery.start(functools.partial(serve_fake_oauth, **script))
            try:
                yield fake
            finally:
                nursery.cancel_scope.cancel()  # the server's tasks run until cancelled


# --------------------------------------------------------------------------- command line

DEVICE_ANSWERS = ("pending", "slow_down", "denied", "expired", "ok")


def _device_polls(text: str) -> list[str]:
    answers = [a.strip() for a in text.split(",") if a.strip()]
    wrong = [a for a in answers if a not in DEVICE_ANSWERS]
    if wrong:
        choices = ", ".join(DEVICE_ANSWERS)
        raise argparse.ArgumentTypeError(
            f"{', '.join(map(repr, wrong))}: each answer must be one of {choices}")
    return answers


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m omp.testing.fake_oauth",
        description="Serve a scripted fake OAuth 2.0 server (device code, PKCE, refresh) until "
                    "Ctrl-C or SIGTERM. Prints its address, then the oauth: blocks of a "
                    "models.yml provider that logs in to it (one JSON line per flow).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument("--client-id", default="omp-test-client")
    parser.add_argument("--user-code", default="WDJB-MJHT")
    parser.add_argument("--interval", type=float, default=5.0,
                        help="seconds between device polls the server asks for (default 5)")
    parser.add_argument("--device-polls", type=_device_polls, default=["pending", "ok"],
                        metavar="ANSWER,...",
                        help="answers to a device code's successive polls ("
                             + ", ".join(DEVICE_ANSWERS)
                             + "); then pending forever (default pending,ok)")
    parser.add_argument("--token-expires-in", type=float, default=3600.0, metavar="SECONDS")
    parser.add_argument("--authorize-error", metavar="CODE",
                        help="an OAuth error /authorize redirects with (e.g. access_denied)")
    parser.add_argument("--refresh-error", metavar="CODE",
                        help="an OAuth error every refresh fails with (e.g. invalid_grant)")
    return parser.parse_args(argv)


async def _serve_until_signalled(args: argparse.Namespace) -> None:
    script = {"client_id": args.client_id, "user_code": args.user_code,
              "interval": args.interval, "device_polls": args.device_polls,
              "token_expires_in": args.token_expires_in,
              "authorize_error": args.authorize_error, "refresh_error": args.refresh_error}
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            fake: FakeOAuth = await nursery.start(functools.partial(
                serve_fake_oauth, host=args.host, port=args.port, **script))
            print(f"fake OAuth listening on {fake.base_url}", flush=True)
            for flow in ("device", "pkce"):
                print(json.dumps({"oauth": fake.oauth_block(flow)}), flush=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m omp.testing.fake_oauth``: 0 after Ctrl-C/SIGTERM, 2 for bad usage, 1 when
    it cannot listen."""
    args = _parse_args(argv)
    try:
        trio.run(_serve_until_signalled, args)
    except OSError as exc:
        print(f"fake OAuth: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
