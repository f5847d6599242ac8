"""OAuth for HTTP and SSE MCP servers (docs/guides/mcp.md#oauth-http-and-sse-servers; the MCP
authorization spec).

Tokens are kept where the original keeps them: the credential store (``auth.json`` of the agent
directory, ``omp.login.store``) under ``mcp_oauth:profile:default:<server url>``, with what a
refresh needs (the client id, the token endpoint, the RFC 8707 resource). They never reach a
frame, a log or a session file: a connection's messages are redacted (``Bearer ...``).

``BearerAuth`` is the ``httpx.Auth`` of a server's HTTP client: each request carries the stored
access token (refreshed first when it expired); a 401 or 403 with a token forces one refresh and
one retry; a 401 left over is the server's challenge, handed to ``on_challenge`` (the connection
fails at once with a sentence that says to run ``/mcp reauth``). A configured ``Authorization``
header turns this off (the original's rule).

``McpOAuth.authorize`` is the standard flow, over the login module's PKCE flow
(``omp.login.flows.pkce_login``: loopback redirect or pasted code, ``open_url`` and the paste
dialog through the host's UI): the protected resource metadata (RFC 9728: the challenge's
``resource_metadata``, else the well-known URLs of the server), the authorization server's
metadata (RFC 8414, else OpenID discovery), a client (the entry's ``oauth.clientId``, else
dynamic registration, RFC 7591), then PKCE with the ``resource`` indicator. Differences from the
original: the flow runs in RPC mode too (the original's needs its TUI): once by itself when a
server first challenges, and on ``/mcp reauth <server>``; a stdio server gets no
``OAUTH_ACCESS_TOKEN``.

Cancellation: every await is cancellable; nothing is stored unless the flow completed.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable, Generator
from typing import Any
from urllib.parse import urlsplit

import httpx
import trio

from ..login.config import OAuthConfig
from ..login.flows import LoginTarget, LoginUI, pkce_login
from ..login.oauth import LoginError, refresh_tokens
from ..login.store import Credentials, OAuthTokens
from .config import ServerConfig

PROFILE = "default"
REQUEST_SECONDS = 30.0
"""Bound of one discovery or registration request."""
_RESOURCE_METADATA = re.compile(r'resource_metadata="([^"]+)"')


def credential_id(config: ServerConfig) -> str:
    """Where a server's tokens are stored (the original's id): ``auth.credentialId``, else
    under the server's URL."""
    return config.credential_id or f"mcp_oauth:profile:{PROFILE}:{config.url}"


def wants_oauth(config: ServerConfig) -> bool:
    """HTTP and SSE servers without a configured ``Authorization`` header."""
    return config.transport != "stdio" and not any(
        k.lower() == "authorization" for k in config.headers)


class BearerAuth(httpx.Auth):
    """The stored token on every request of one server's client (see the module)."""

    def __init__(self, oauth: McpOAuth, key: str, on_challenge: Callable[[str], None]) -> None:
        self.oauth, self.key, self.on_challenge = oauth, key, on_challenge

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request,
                                                                  httpx.Response, None]:
        raise RuntimeError("MCP HTTP clients are async")

    async def async_auth_flow(self, request: httpx.Request) -> Any:
        """The stored token on ``request`` (renewed first when it expired); after a 401 or 403,
        one refresh and one retry; a 401 left over goes to ``on_challenge``. On cancellation
        while a token is renewed ``Cancelled`` propagates through httpx, which closes the
        response it holds; the stored tokens are as ``McpOAuth.bearer`` leaves them."""
        token = await self.oauth.bearer(self.key)
        if token is not None:
            request.headers["Authorization"] = f"Bearer {token}"
        response = yield request
        if response.status_code in (401, 403) and token is not None:
            fresh = await self.oauth.bearer(self.key, refresh=True)
            if fresh is not None and fresh != token:
                request.headers["Authorization"] = f"Bearer {fresh}"
                response = yield request
        if response.status_code == 401:
            self.on_challenge(response.headers.get("www-authenticate", ""))


class McpOAuth:
    """The OAuth credentials of the MCP servers of one ``serve()``."""

    def __init__(self, credentials: Credentials, http: Callable[[], httpx.AsyncClient]) -> None:
        self.credentials = credentials
        self.http = http

    def tokens(self, key: str) -> OAuthTokens | None:
        found = self.credentials.entries.get(key)
        return found if isinstance(found, OAuthTokens) else None

    async def bearer(self, key: str, *, refresh: bool = False) -> str | None:
        """The access token to send (None: none stored, or it expired and cannot be
        refreshed). ``refresh``: the server refused the current one, get a new one. On
        cancellation during the refresh the lock is released and ``Cancelled`` propagates, the
        stored tokens unchanged (a refresh the server already made is lost: ``refresh_tokens``);
        once the new tokens are being written, that write completes and they are returned."""
        tokens = self.tokens(key)
        if tokens is None:
            return None
        if not refresh and tokens.expires > time.time() * 1000:
            return tokens.access
        async with self.credentials.lock(key):
            current = self.tokens(key)
            if current is not None and current.access != tokens.access:
                return current.access  # refreshed meanwhile by another request
            if not (tokens.refresh and tokens.token_url and tokens.client_id):
                return None
            config = OAuthConfig(flow="pkce", clientId=tokens.client_id,
                                 tokenUrl=tokens.token_url, resource=tokens.resource)
            try:
                fresh = await refresh_tokens(self.http(), key, config, tokens)
            except LoginError:
                return None  # the server's challenge follows: /mcp reauth
            await self.credentials.store(key, OAuthTokens(
                fresh.access, fresh.refresh, fresh.expires, client_id=tokens.client_id,
                token_url=tokens.token_url, resource=tokens.resource))
            return fresh.access

    async def authorize(self, config: ServerConfig, ui: LoginUI, challenge: str) -> None:
        """The standard OAuth flow for ``config`` (see the module); the tokens are stored.
        Raises LoginError naming what failed; what ``ui`` raises when the host is gone passes
        through. On cancellation nothing is stored."""
        assert config.url is not None
        http = self.http()
        prm = await self._protected_resource(config.url, challenge)
        issuer = _first(prm.get("authorization_servers")) if prm else None
        parts = urlsplit(config.url)
        issuer = issuer or f"{parts.scheme}://{parts.netloc}"
        resource = prm.get("resource") if prm and isinstance(prm.get("resource"), str) \
            else config.url
        meta = await self._server_metadata(issuer)
        authorize_url, token_url = (meta.get("authorization_endpoint"),
                                    meta.get("token_endpoint"))
        if not isinstance(authorize_url, str) or not isinstance(token_url, str):
            raise LoginError(f"the authorization server {issuer} names no authorization or "
                             "token endpoint")
        scopes = config.oauth_scope.split() if config.oauth_scope else [
            s for s in (prm or {}).get("scopes_supported") or () if isinstance(s, str)]
        port = config.oauth_callback_port or _free_port()
        client_id = config.oauth_client_id or await self._register(
            meta, f"http://127.0.0.1:{port}/callback", issuer)
        oauth = OAuthConfig(flow="pkce", clientId=client_id, tokenUrl=token_url,
                            authorizationUrl=authorize_url, scopes=scopes, redirectPort=port,
                            resource=resource)
        key = credential_id(config)
        tokens = await pkce_login(_PasteOnce(ui), http, LoginTarget(id=key, name=config.name),
                                  oauth)
        await self.credentials.store(key, OAuthTokens(
            tokens.access, tokens.refresh, tokens.expires, client_id=client_id,
            token_url=token_url, resource=resource))

    async def _protected_resource(self, url: str, challenge: str) -> dict[str, Any] | None:
        parts = urlsplit(url)
        origin = f"{parts.scheme}://{parts.netloc}"
        path = parts.path.rstrip("/")
        found = _RESOURCE_METADATA.search(challenge)
        candidates = [found.group(1)] if found else []
        candidates += [f"{origin}/.well-known/oauth-protected-resource{path}",
                       f"{origin}/.well-known/oauth-protected-resource"]
        for candidate in dict.fromkeys(candidates):
            body = await self._get_json(candidate)
            if body is not None and body.get("authorization_servers"):
                return body
        return None  # an older server: its origin is the authorization server

    async def _server_metadata(self, issuer: str) -> dict[str, Any]:
        parts = urlsplit(issuer)
        origin, path = f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/")
        for candidate in dict.fromkeys([
                f"{origin}/.well-known/oauth-authorization-server{path}",
                f"{origin}/.well-known/openid-configuration{path}",
                f"{issuer.rstrip('/')}/.well-known/openid-configuration"]):
            body = await self._get_json(candidate)
            if body is not None:
                return body
        raise LoginError(f"no authorization server metadata found for {issuer}")

    async def _register(self, meta: dict[str, Any], redirect_uri: str, issuer: str) -> str:
        endpoint = meta.get("registration_endpoint")
        if not isinstance(endpoint, str):
            raise LoginError(f"the authorization server {issuer} offers no client "
                             "registration: set oauth.clientId for this server")
        try:
            with trio.fail_after(REQUEST_SECONDS):
                response = await self.http().post(endpoint, json={
                    "client_name": "omp-coding-agent", "redirect_uris": [redirect_uri],
                    "grant_types": ["authorization_code", "refresh_token"],
                    "response_types": ["code"], "token_endpoint_auth_method": "none"})
            body = response.json()
        except (trio.TooSlowError, httpx.HTTPError, ValueError) as exc:
            raise LoginError(f"client registration at {endpoint} failed: "
                             f"{type(exc).__name__}") from None
        client_id = body.get("client_id") if isinstance(body, dict) else None
        if not response.is_success or not isinstance(client_id, str):
            raise LoginError(f"client registration at {endpoint} failed: HTTP "
                             f"{response.status_code}")
        return client_id

    async def _get_json(self, url: str) -> dict[str, Any] | None:
        try:
            with trio.fail_after(REQUEST_SECONDS):
                response = await self.http().get(url, headers={"accept": "application/json"})
            body = response.json() if response.is_success else None
        except (trio.TooSlowError, httpx.HTTPError, ValueError):
            return None
        return body if isinstance(body, dict) else None


class _PasteOnce:
    """The host's UI, except that a paste dialog the user cancelled is not asked again: a
    flow that started by itself (a server's first 401) must not keep a host that declines
    dialogs busy. The browser's redirect, or the flow's deadline, ends the login then."""

    def __init__(self, ui: LoginUI) -> None:
        self.ui = ui

    def open_url(self, url: str, *, launch_url: str | None = None,
                 instructions: str | None = None) -> None:
        self.ui.open_url(url, launch_url=launch_url, instructions=instructions)

    def notify(self, message: str) -> None:
        self.ui.notify(message)

    async def input(self, title: str, *, placeholder: str | None = None,
                    timeout: int | None = None) -> str | None:  # noqa: ASYNC109
        """The user's answer; when they cancelled, waits until the flow ends (cancelled
        then with it)."""
        value = await self.ui.input(title, placeholder=placeholder, timeout=timeout)
        if value is None:
            await trio.sleep_forever()
        return value


def _first(value: Any) -> str | None:
    return value[0] if isinstance(value, list) and value and isinstance(value[0], str) else None


def _free_port() -> int:
    """A free loopback port for the redirect, known before the client is registered (its
    redirect URI names it). Another program could take it before the login listens: the
    login then says the port is in use, and /mcp reauth tries again."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
