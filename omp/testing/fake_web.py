"""A fake web for the web tools' tests: pages and four search APIs, real HTTP/1.1 on loopback.

``open_fake_web()`` serves, on an ephemeral port of 127.0.0.1 (trio + h11, one request per
connection):

* **pages**: ``fake.pages["/path"] = WebPage(...)``: a body with a status, a content type and
  headers (``redirect(location)`` makes a redirect). ``hang_after=N`` sends the head and the
  first ``N`` bytes of the body, then keeps the connection open and silent until the client
  goes away: a slow server to abort a download against. An unknown path is a 404.
* **search APIs**, each under its own prefix, speaking the provider's request and answer
  shapes: Brave (``/brave/res/v1/web/search``), Exa (``/exa/search``), Tavily
  (``/tavily/search``), Kagi (``/kagi/api/v0/search``). Point ``web.searchBaseUrls.<name>``
  at ``fake.search_base_url(name)``. They answer ``fake.search_results`` (``SearchHit``) in the
  provider's JSON, or ``fake.search_status`` with an error body; a request without the key
  ``fake.search_key`` in the provider's header gets 401.

``tls=`` (a server ``ssl.SSLContext``) serves the same over HTTPS.

Every request is recorded (``requests``); ``disconnects`` counts responses cut off because the
client went away, ``hanging`` the responses holding a connection open right now; a test waits
for either with ``wait_until`` instead of sleeping. Nothing in the client's path is mocked.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import attrs
import h11
import msgspec
import trio

from ..groups import unwrap
from .fake_llm import RecordedRequest
from .listen import accept_forever, one_listener

__all__ = ["FakeWeb", "SearchHit", "WebPage", "open_fake_web", "redirect", "serve_fake_web"]

SEARCH_PATHS = {"brave": "/res/v1/web/search", "exa": "/search", "tavily": "/search",
                "kagi": "/api/v0/search"}


@attrs.frozen
class WebPage:
    """One page the fake web serves."""

    body: bytes | str = b""
    status: int = 200
    content_type: str | None = "text/html; charset=utf-8"
    headers: dict[str, str] = attrs.field(factory=dict)
    hang_after: int | None = None
    """Send the head and this many bytes of the body, then hold the connection silently
    until the client leaves (the head then has no ``content-length``)."""

    @property
    def data(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else self.body


def redirect(location: str, status: int = 302) -> WebPage:
    """A redirect to ``location``."""
    return WebPage(status=status, content_type=None, headers={"location": location})


@attrs.frozen
class SearchHit:
    title: str
    url: str
    snippet: str = ""


@attrs.define(eq=False, repr=False)
class FakeWeb:
    """A running fake web: its address, its pages and search answers, what it saw."""

    base_url: str
    pages: dict[str, WebPage] = attrs.field(factory=dict)
    search_results: list[SearchHit] = attrs.field(factory=list)
    search_key: str | None = None
    """The key every search request must carry (None: any)."""
    search_status: int = 200
    requests: list[RecordedRequest] = attrs.field(factory=list)
    disconnects: int = 0
    hanging: int = 0
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _serial: int = 0

    @property
    def port(self) -> int:
        return int(self.base_url.rsplit(":", 1)[1])

    def url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    def search_base_url(self, provider: str) -> str:
        """The API root to give as ``web.searchBaseUrls.<provider>``."""
        return f"{self.base_url}/{provider}"

    async def wait_until(self, predicate: Callable[[FakeWeb], bool]) -> None:
        """Return once ``predicate(self)`` holds. Cancellation just stops the waiting."""
        while not predicate(self):
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _handle(self, raw: trio.SocketStream, tls: ssl.SSLContext | None) -> None:
        self._serial += 1
        conn = h11.Connection(h11.SERVER)
        stream: trio.abc.Stream = raw if tls is None else trio.SSLStream(
            raw, tls, server_side=True)
        try:
            request = await _receive_request(conn, stream, self._serial)
            if request is None:
                return
            self.requests.append(request)
            self._notify()
            provider = request.path.split("/")[1] if request.path.count("/") >= 2 else ""
            if provider in SEARCH_PATHS and request.path == f"/{provider}" + SEARCH_PATHS[
                    provider]:
                await self._send(conn, stream, *self._search(provider, request))
            else:
                page = self.pages.get(request.path)
                if page is None:
                    page = WebPage(f"no page at {request.path}", status=404,
                                   content_type="text/plain")
                if page.hang_after is None:
                    await self._send(conn, stream, page.status, page.content_type, page.headers,
                                     page.data)
                else:
                    await self._hang(conn, stream, page)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.disconnects += 1
            self._notify()
        except (h11.RemoteProtocolError, ssl.SSLError):
            pass  # a TLS handshake the client refused (a certificate it did not trust)
        finally:
            await trio.aclose_forcefully(stream)

    async def _send(self, conn: h11.Connection, stream: trio.abc.Stream, status: int,
                    content_type: str | None, headers: dict[str, str], data: bytes) -> None:
        wire = [(k, v) for k, v in headers.items()]
        if content_type is not None:
            wire.append(("content-type", content_type))
        wire += [("content-length", str(len(data))), ("connection", "close")]
        await stream.send_all(conn.send(h11.Response(status_code=status, headers=wire))
                              + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))

    async def _hang(self, conn: h11.Connection, stream: trio.abc.Stream, page: WebPage) -> None:
        wire = [(k, v) for k, v in page.headers.items()]
        if page.content_type is not None:
            wire.append(("content-type", page.content_type))
        wire.append(("connection", "close"))
        head = conn.send(h11.Response(status_code=page.status, headers=wire))
        await stream.send_all(head + conn.send(h11.Data(data=page.data[:page.hang_after])))
        self.hanging += 1
        self._notify()
        try:
            # Silent until the client leaves: EOF (or a reset) on the socket.
            while await stream.receive_some(65536):
                pass
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.hanging -= 1
            self.disconnects += 1
            self._notify()

    def _search(self, provider: str, request: RecordedRequest
                ) -> tuple[int, str, dict[str, str], bytes]:
        json = "application/json"
        if self.search_key is not None and _key_of(provider, request) != self.search_key:
            return 401, json, {}, msgspec.json.encode({"error": "invalid API key"})
        if self.search_status != 200:
            return self.search_status, json, {}, msgspec.json.encode(
                {"error": f"fake search error {self.search_status}"})
        hits = self.search_results
        body: dict[str, Any]
        if provider == "brave":
            body = {"type": "search", "web": {"results": [
                {"title": h.title, "url": h.url, "description": h.snippet} for h in hits]}}
        elif provider == "exa":
            body = {"requestId": "fake", "results": [
                {"title": h.title, "url": h.url, "text": h.snippet} for h in hits]}
        elif provider == "tavily":
            body = {"query": "", "results": [
                {"title": h.title, "url": h.url, "content": h.snippet, "score": 1.0}
                for h in hits]}
        else:
            body = {"meta": {"id": "fake"}, "data": [
                {"t": 0, "title": h.title, "url": h.url, "snippet": h.snippet} for h in hits]
                + [{"t": 1, "list": ["related"]}]}
        return 200, json, {}, msgspec.json.encode(body)


async def _receive_request(conn: h11.Connection, stream: trio.abc.Stream,
                           serial: int) -> RecordedRequest | None:
    head: h11.Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(bytes(await stream.receive_some(65536)))
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            target = head.target.decode("latin-1")
            parts = urlsplit(target)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
            return RecordedRequest(
                method=head.method.decode("latin-1"), target=target, path=parts.path,
                query=dict(parse_qsl(parts.query, keep_blank_values=True)),
                headers=headers, body=bytes(body), connection=serial)
        else:
            return None


def _key_of(provider: str, request: RecordedRequest) -> str | None:
    headers = {k.lower(): v for k, v in request.headers.items()}
    if provider == "brave":
        return headers.get("x-subscription-token")
    if provider == "exa":
        return headers.get("x-api-key")
    scheme = "Bearer " if provider == "tavily" else "Bot "
    value = headers.get("authorization", "")
    return value[len(scheme):] if value.startswith(scheme) else None


async def serve_fake_web(*, host: str = "127.0.0.1", port: int = 0,
                         tls: ssl.SSLContext | None = None,
                         task_status: trio.TaskStatus[FakeWeb] = trio.TASK_STATUS_IGNORED
                         ) -> None:
    """Serve until cancelled; ``nursery.start`` returns the running ``FakeWeb``. With ``tls``
    (a server context) it speaks HTTPS. On cancellation the listener closes and every
    connection is dropped."""
    async with one_listener(host, port) as (listener, authority):
        fake = FakeWeb(base_url=f"{'http' if tls is None else 'https'}://{authority}")
        task_status.started(fake)
        await accept_forever(listener, functools.partial(fake._handle, tls=tls))


@asynccontextmanager
async def open_fake_web(*, host: str = "127.0.0.1", port: int = 0,
                        tls: ssl.SSLContext | None = None) -> AsyncIterator[FakeWeb]:
    """``async with open_fake_web() as fake``: the running ``FakeWeb``, its tasks in a nursery
    the manager owns; leaving the block closes the listener and drops every connection. The
    block's own exception propagates unchanged (``omp.groups``). On cancellation, while it
    starts or in the block, the listener is closed and every connection dropped all the same,
    and ``Cancelled`` propagates."""
    with unwrap():
        async with trio.open_nursery() as nursery:
            fake: FakeWeb = await nursery.start(functools.partial(
                serve_fake_web, host=host, port=port, tls=tls))
            try:
                yield fake
            finally:
                nursery.cancel_scope.cancel()
