"""web_fetch (and ``read`` of an ``http(s)://`` URL): one page, as text the model can read.

One fetch, within ``web.timeoutSeconds`` as a whole:

1. The URL must be ``http`` or ``https`` without a user name or password (no credential is
   ever sent: the request carries no cookie, no ``authorization``, none of the client's
   headers; the provider keys never leave their own requests).
2. Its host is resolved (``trio.socket.getaddrinfo``) and every address checked against the
   ``AddressPolicy``; the request goes to the first address, with the name in ``Host`` and,
   for https, in TLS SNI and certificate verification (the certificate must match the name).
3. Redirects (301, 302, 303, 307, 308) are followed by us, each target checked as in 1 and 2,
   at most ``web.maxRedirects`` of them.
4. The body: ``Content-Length`` over ``web.maxBytes`` is refused before reading; otherwise it is
   read in pieces and refused once it passes the limit (counted after decompression, so a
   small gzip bomb is no way round it). Binary content (images, archives, PDFs, anything with
   NUL bytes or an unknown non-text type) is refused with its type named.
5. HTML becomes Markdown (``html-to-markdown``, a Rust core: see docs/guides/tools.md, "Web
   tools"; imported on the first HTML page); JSON, XML and plain text are kept as they are.

The text is head-truncated like ``read`` output (2000 lines or 50KB); when cut, the whole
text is written to a private temp file (``omp-web-<hex>.md``, 0600) that the notice names,
so a later ``read`` with ``offset`` gets the rest without fetching again.

Cancellation (``abort``) stops the fetch wherever it is: the DNS lookup, the connection, the
body download; the response is closed on the way out and ``Cancelled`` propagates.
"""

from __future__ import annotations

import codecs
import contextlib
import html as html_module
import os
import re
import secrets
import socket
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .specs import WEB_SPECS, SpecifiedTool
from .truncate import format_size, truncate_head
from .web_policy import AddressRefused, WebAccess

if TYPE_CHECKING:
    import httpx

USER_AGENT = "omp-trio-web-fetch"
"""Says what we are; no other client is impersonated (docs/guides/login.md#logging-in)."""
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TEXT_TYPES = frozenset({
    "application/json", "application/xml", "application/javascript", "application/ecmascript",
    "application/x-javascript", "application/yaml", "application/x-yaml", "application/toml",
    "application/x-sh", "application/sql", "application/graphql", "application/ld+json",
    "application/x-ndjson", "application/xhtml+xml", "image/svg+xml"})
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_TITLE = re.compile(r"<title[^>]*>(.*?)</title", re.IGNORECASE | re.DOTALL)


@attrs.frozen
class Page:
    """A fetched page as text."""

    url: str
    """The final URL, after redirects."""
    status: int
    content_type: str
    text: str
    """Markdown for HTML, else the body as it came."""
    converted: bool
    title: str | None = None
    redirects: tuple[str, ...] = ()
    """The URLs that redirected, in order."""


def _require_web(ctx: ToolContext) -> WebAccess:
    if ctx.web is None or not ctx.web.enabled:
        raise ToolError("Web access is off in this session: set `web: {enabled: true}` in "
                        "config.yml to let tools fetch URLs.")
    return ctx.web


def _parse(raw: str, base: httpx.URL | None = None) -> httpx.URL:
    import httpx

    try:
        url = base.join(raw) if base is not None else httpx.URL(raw)
    except (httpx.InvalidURL, ValueError) as exc:
        raise ToolError(f"Invalid URL {raw!r}: {exc}") from None
    if url.scheme not in ("http", "https"):
        raise ToolError(f"Cannot fetch {raw}: only http:// and https:// URLs are fetched")
    if not url.host:
        raise ToolError(f"Invalid URL {raw!r}: no host")
    if url.userinfo:
        raise ToolError(f"Cannot fetch {url.copy_with(username=None, password=None)}: URLs with "
                        "a user name or password are refused (no credential is sent)")
    return url


async def _resolve(access: WebAccess, url: httpx.URL) -> str:
    """The checked address to connect to for ``url``. Raises ToolError."""
    host = url.raw_host.decode("ascii")  # IDNA-encoded: what DNS and TLS are given
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ToolError(f"Cannot fetch {url}: cannot resolve {host} "
                        f"({exc.strerror or exc})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not addresses:
        raise ToolError(f"Cannot fetch {url}: {host} has no address")
    try:
        # Every address, not just the one used: a name that also points inward is refused.
        for address in addresses:
            access.policy.check(host, address)
    except AddressRefused as exc:
        raise ToolError(f"Refused to fetch {url}: {exc}") from None
    return addresses[0]


def _media_type(response: httpx.Response) -> str:
    value: str = response.headers.get("content-type", "")
    return value.partition(";")[0].strip().lower()


def _is_text(media_type: str) -> bool:
    return (media_type.startswith("text/") or media_type in _TEXT_TYPES
            or media_type.endswith(("+json", "+xml")))


async def _read_body(response: httpx.Response, url: httpx.URL, limit: int) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ToolError(f"Refused to fetch {url}: the body is {format_size(int(declared))}, "
                        f"over the {format_size(limit)} limit (web.maxBytes)")
    body = bytearray()
    async for piece in response.aiter_bytes():
        body += piece
        if len(body) > limit:
            raise ToolError(f"Refused to fetch {url}: the body is over the "
                            f"{format_size(limit)} limit (web.maxBytes)")
    return bytes(body)


async def fetch_page(access: WebAccess, raw_url: str) -> Page:
    """Fetch ``raw_url`` under ``access``'s policy and limits. Raises ToolError with what went
    wrong (refused address, too many redirects, too large, binary, timeout, HTTP error).

    On cancellation the response is closed and ``Cancelled`` propagates.
    """
    settings = access.settings
    try:
        with trio.fail_after(settings.timeoutSeconds):
            return await _fetch(access, raw_url)
    except trio.TooSlowError:
        raise ToolError(f"Fetching {raw_url} took longer than {settings.timeoutSeconds:g} s "
                        "(web.timeoutSeconds)") from None


async def _fetch(access: WebAccess, raw_url: str) -> Page:
    import httpx

    client = access.http.async_client()
    url = _parse(raw_url)
    redirects: list[str] = []
    while True:
        address = await _resolve(access, url)
        # Connect to the address just checked; the name goes in Host and TLS SNI (so the
        # certificate is verified against it), never to a second DNS lookup.
        target = url.copy_with(host=address)
        # "connection: close": the pool keys connections by address, so a kept TLS
        # connection, verified for one name, could otherwise carry the next request for
        # another name served from the same address.
        headers = {"host": url.netloc.decode("ascii"), "user-agent": USER_AGENT,
                   "accept": "text/html, text/markdown, text/plain, application/json;q=0.9, "
                             "*/*;q=0.5",
                   "accept-encoding": "gzip, deflate", "connection": "close"}
        # A bare Request: the client's cookies and default headers are not merged into it.
        request = httpx.Request("GET", target, headers=headers,
                                extensions={"sni_hostname": url.raw_host.decode("ascii")})
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise ToolError(f"Cannot fetch {url}: {describe_error(exc)}") from None
        try:
            _forget_cookies(client, address)
            if response.status_code in _REDIRECTS and "location" in response.headers:
                if len(redirects) >= access.settings.maxRedirects:
                    raise ToolError(f"Cannot fetch {raw_url}: more than "
                                    f"{access.settings.maxRedirects} redirects "
                                    "(web.maxRedirects)")
                redirects.append(str(url))
                url = _parse(response.headers["location"], base=url)
                continue
            if not 200 <= response.status_code < 300:
                status = response.status_code
                reason = response.reason_phrase or httpx.codes.get_reason_phrase(status)
                raise ToolError(f"Cannot fetch {url}: HTTP {status} {reason}".rstrip())
            media_type = _media_type(response)
            if media_type and not _is_text(media_type):
                raise ToolError(f"Refused to fetch {url}: binary content ({media_type}); "
                                "web_fetch reads text, HTML and JSON")
            try:
                body = await _read_body(response, url, access.settings.maxBytes)
            except httpx.HTTPError as exc:
                raise ToolError(f"Cannot fetch {url}: {describe_error(exc)}") from None
            encoding = response.charset_encoding
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + 1):
                await response.aclose()
        return await _page(url, response.status_code, media_type, body, encoding,
                           tuple(redirects))


def describe_error(exc: BaseException) -> str:
    """``exc``'s type and the first non-empty message along its chain: httpx's error for a
    refused certificate says nothing itself; the ``SSLError`` it came from does."""
    cause: BaseException | None = exc
    while cause is not None:
        if text := str(cause):
            return f"{type(exc).__name__}: {text}"
        cause = cause.__cause__ or cause.__context__
    return type(exc).__name__


def _forget_cookies(client: httpx.AsyncClient, address: str) -> None:
    # httpx keeps every Set-Cookie in the client's jar; the fetched site's cookies must not
    # ride along with anything else this client sends (model calls included). The jar files
    # them under the request's host, the address: "[::1].local" for an IPv6 one.
    shown = f"[{address}]" if ":" in address else address
    domains = {shown, f".{shown}", f"{shown}.local"}
    jar = client.cookies.jar
    for cookie in [c for c in jar if c.domain in domains]:
        with contextlib.suppress(KeyError):
            jar.clear(cookie.domain, cookie.path, cookie.name)


async def _page(url: httpx.URL, status: int, media_type: str, body: bytes,
                encoding: str | None, redirects: tuple[str, ...]) -> Page:
    if b"\x00" in body[:8192]:
        raise ToolError(f"Refused to fetch {url}: binary content "
                        f"({media_type or 'no content type'}, NUL bytes in the body)")
    if not media_type:
        media_type = "text/html" if body[:1024].lstrip()[:15].lower().startswith(
            (b"<!doctype html", b"<html")) else "text/plain"
    text = body.decode(_codec(encoding), "replace")
    if media_type in _HTML_TYPES:
        # In a thread: a few MB of HTML take a noticeable time, which the other tasks of the
        # server (frames, other tool calls) must not wait for. Abandoned on cancellation.
        markdown, title = await trio.to_thread.run_sync(html_to_markdown, text, str(url),
                                                        abandon_on_cancel=True)
        return Page(str(url), status, media_type, markdown, True, title, redirects)
    return Page(str(url), status, media_type, text, False, None, redirects)


def _codec(encoding: str | None) -> str:
    try:
        return codecs.lookup(encoding).name if encoding else "utf-8"
    except LookupError:
        return "utf-8"


def html_to_markdown(html: str, base_url: str | None = None) -> tuple[str, str | None]:
    """``html`` as Markdown (links made absolute against ``base_url``), and the document's
    title. Navigation, forms and scripts are left out; inline ``data:`` images are kept as
    their alt text only."""
    import html_to_markdown as h2m

    options = h2m.ConversionOptions(
        extract_metadata=False, base_url=base_url, inline_data_media="alt_text_only",
        preprocessing=h2m.PreprocessingOptions(enabled=True, preset="standard"))
    content = h2m.convert(html, options).content or ""
    match = _TITLE.search(html, 0, 65536)
    title = " ".join(html_module.unescape(match.group(1)).split()) if match else ""
    return content.strip() + "\n", title or None


def _spill(text: str) -> Path | None:
    """The whole text in a private temp file; None when no temp file can be made."""
    directory = Path(tempfile.gettempdir())
    for _ in range(8):
        path = directory / f"omp-web-{secrets.token_hex(8)}.md"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        except OSError:
            return None
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        return path
    return None


async def page_result(page: Page) -> ToolResult:
    """``page`` as the tool result the model reads: a header line, then the text,
    head-truncated, with the temp file of the whole text named when it was cut.

    On cancellation the temp file is still written whole (a quick local write in a thread,
    not abandoned half-way), then ``Cancelled`` propagates."""
    header = f"URL: {page.url}"
    if page.redirects:
        header += f" (redirected from {page.redirects[0]})"
    header += f"\nContent-Type: {page.content_type}"
    if page.converted:
        header += " (converted to Markdown)"
    if page.title:
        header += f"\nTitle: {page.title}"
    cut = truncate_head(page.text)
    details: dict[str, Any] = {"url": page.url, "status": page.status,
                               "contentType": page.content_type,
                               "redirects": list(page.redirects)}
    body = cut.content
    if cut.truncated or cut.first_line_exceeds_limit:
        path = await trio.to_thread.run_sync(_spill, page.text)
        where = (f" Full text: {path} (read it with offset={cut.output_lines + 1})"
                 if path is not None else "")
        body += (f"\n\n[Showing lines 1-{cut.output_lines} of {cut.total_lines} "
                 f"({format_size(cut.total_bytes)}).{where}]")
        details["truncation"] = cut.details()
        if path is not None:
            details["fullOutputPath"] = str(path)
    return ToolResult.text(f"{header}\n\n{body}", details)


class WebFetchTool(SpecifiedTool):
    """Fetch a URL: HTML as Markdown, JSON and text as they are."""

    spec = WEB_SPECS["web_fetch"]

    def __init__(self, ctx: ToolContext) -> None:
        self._ctx = ctx

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Fetch ``args["url"]``. On cancellation the download stops, the connection is
        closed and ``Cancelled`` propagates."""
        access = _require_web(self._ctx)
        return await page_result(await fetch_page(access, str(args["url"])))


async def read_url(ctx: ToolContext, url: str) -> ToolResult:
    """``read`` of an ``http(s)://`` URL: what ``web_fetch`` returns for it. Cancellation as
    ``fetch_page``."""
    access = _require_web(ctx)
    return await page_result(await fetch_page(access, url))
