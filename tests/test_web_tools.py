"""web_fetch, web_search and ``read`` of a URL, against loopback servers the tests start
(``omp.testing.fake_web``): real HTTP through the session's httpx client, real DNS for
``localhost``, the address policy on every hop, the limits, and the search providers' wire
formats. The abort of a download mid-body goes through the real ``omp --mode rpc`` process.
"""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import (
    index_of,
    of_type,
    open_agent,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
)

from omp.config import ConfigError
from omp.llm.stream import HttpClient
from omp.protocol.messages import TextContent
from omp.session.agent_session import SessionError
from omp.session.settings import load_settings
from omp.session.setup import create_session
from omp.testing.fake_web import FakeWeb, SearchHit, WebPage, open_fake_web, redirect
from omp.tools import default_tools
from omp.tools.base import ToolContext, ToolError, ToolResult
from omp.tools.read import ReadTool
from omp.tools.web_fetch import WebFetchTool
from omp.tools.web_policy import AddressPolicy, AddressRefused, WebAccess
from omp.tools.web_search import WebSearchTool
from omp.tools.web_settings import WebSettings

LOOPBACK = ["127.0.0.1/32"]


async def _no_update(_: ToolResult) -> None:
    return None


@pytest.fixture
async def web() -> AsyncIterator[FakeWeb]:
    async with open_fake_web() as fake:
        yield fake


@pytest.fixture
async def http() -> AsyncIterator[HttpClient]:
    client = HttpClient()
    try:
        yield client
    finally:
        await client.aclose()


def context(tmp_path: Path, http: HttpClient, *, environ: dict[str, str] | None = None,
            **settings: Any) -> ToolContext:
    fields: dict[str, Any] = {"enabled": True, "allowNetworks": LOOPBACK, **settings}
    web_settings = WebSettings(**fields)
    access = WebAccess(web_settings, http,
                       policy=AddressPolicy.from_settings(web_settings.allowNetworks),
                       environ=environ or {})
    return ToolContext(tmp_path, web=access)


async def fetch(ctx: ToolContext, url: str) -> ToolResult:
    return await WebFetchTool(ctx).execute("c1", {"url": url}, on_update=_no_update)


def text_of(result: ToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextContent)
    return block.text


# --- pages -------------------------------------------------------------------------------------

PAGE = """<!DOCTYPE html><html><head><title>Tokio &amp; trio</title>
<script>var secret = "never shown";</script><style>body {color: red}</style></head>
<body><nav><a href="/home">Home</a> | <a href="/about">About</a></nav>
<h1>Structured concurrency</h1>
<p>Read <a href="/docs/nurseries.html">the nursery docs</a> and <code>trio.run</code>.</p>
<ul><li>one</li><li>two</li></ul>
<pre><code class="language-python">async with trio.open_nursery() as n:
    n.start_soon(f)</code></pre>
</body></html>"""


async def test_html_page_becomes_markdown(tmp_path: Path, web: FakeWeb,
                                          http: HttpClient) -> None:
    web.pages["/guide/index.html"] = WebPage(PAGE)
    result = await fetch(context(tmp_path, http), web.url("/guide/index.html"))
    text = text_of(result)
    header, _, body = text.partition("\n\n")
    assert header == (f"URL: {web.url('/guide/index.html')}\nContent-Type: text/html "
                      "(converted to Markdown)\nTitle: Tokio & trio")
    assert "# Structured concurrency" in body
    # Links are made absolute against the page, so the model can fetch them next.
    assert f"[the nursery docs]({web.url('/docs/nurseries.html')})" in body
    assert "`trio.run`" in body
    assert "- one\n- two" in body
    assert "```python\nasync with trio.open_nursery() as n:\n    n.start_soon(f)\n```" in body
    assert "never shown" not in body
    assert "color: red" not in body
    assert "<" not in body.replace("<-", "")
    assert result.details["status"] == 200
    assert result.details["contentType"] == "text/html"


async def test_json_and_plain_text_are_kept_as_they_are(tmp_path: Path, web: FakeWeb,
                                                        http: HttpClient) -> None:
    document = {"name": "omp", "tags": ["<b>not html</b>", "x"], "n": 1}
    raw = json.dumps(document, indent=2)
    web.pages["/api.json"] = WebPage(raw, content_type="application/json")
    web.pages["/notes.txt"] = WebPage("line <1>\nline 2\n", content_type="text/plain")
    ctx = context(tmp_path, http)
    text = text_of(await fetch(ctx, web.url("/api.json")))
    assert text == f"URL: {web.url('/api.json')}\nContent-Type: application/json\n\n{raw}"
    assert json.loads(text.partition("\n\n")[2]) == document
    text = text_of(await fetch(ctx, web.url("/notes.txt")))
    assert text.endswith("\n\nline <1>\nline 2\n")


async def test_a_redirect_chain_is_followed(tmp_path: Path, web: FakeWeb,
                                            http: HttpClient) -> None:
    web.pages["/a"] = redirect("/b", 301)
    web.pages["/b"] = redirect(web.url("/c"), 307)
    web.pages["/c"] = redirect("d?x=1", 308)  # relative to /c
    web.pages["/d"] = WebPage("arrived", content_type="text/plain")
    result = await fetch(context(tmp_path, http), web.url("/a"))
    assert text_of(result).startswith(
        f"URL: {web.url('/d?x=1')} (redirected from {web.url('/a')})\n")
    assert text_of(result).endswith("\n\narrived")
    assert result.details["redirects"] == [web.url(p) for p in ("/a", "/b", "/c")]
    assert [r.target for r in web.requests] == ["/a", "/b", "/c", "/d?x=1"]


async def test_too_many_redirects(tmp_path: Path, web: FakeWeb, http: HttpClient) -> None:
    web.pages["/loop"] = redirect("/loop")
    with pytest.raises(ToolError, match=r"more than 3 redirects \(web.maxRedirects\)"):
        await fetch(context(tmp_path, http, maxRedirects=3), web.url("/loop"))
    assert len(web.requests) == 4


@pytest.mark.parametrize(("target", "kind"), [
    ("http://169.254.169.254/latest/meta-data/", "link-local"),
    ("http://10.1.2.3/admin", "private"),
    ("http://192.168.1.1/", "private"),
    ("http://[::1]:{port}/secret", "loopback"),
    ("http://[::ffff:127.0.0.2]:{port}/secret", "loopback"),
    # IPv6 forms that carry an IPv4 address (IPv4-compatible, NAT64, 6to4, Teredo).
    ("http://[::127.0.0.2]:{port}/secret", "loopback"),
    ("http://[64:ff9b::7f00:2]:{port}/secret", "loopback"),
    ("http://[64:ff9b:1::a01:203]:{port}/secret", "private"),
    ("http://[2002:7f00:2::]:{port}/secret", "loopback"),
    ("http://[2001:0:4136:e378:8000:63bf:80ff:fffd]:{port}/secret", "loopback"),
    ("http://127.0.0.2:{port}/secret", "loopback"),
    ("http://0.0.0.0:{port}/secret", "unspecified"),
    ("http://100.64.0.1/", "non-public"),
    ("http://224.0.0.1/", "multicast"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[fd12::1]/", "private"),
])
async def test_a_redirect_to_a_private_address_is_refused(
        tmp_path: Path, web: FakeWeb, http: HttpClient, target: str, kind: str) -> None:
    # 127.0.0.1 is allowed (the test server), nothing else that is not public.
    web.pages["/start"] = redirect(target.format(port=web.port))
    with pytest.raises(ToolError, match=rf"Refused to fetch .*: .* is a {kind} address; web "
                                        r"tools reach public addresses only"):
        await fetch(context(tmp_path, http), web.url("/start"))
    assert [r.target for r in web.requests] == ["/start"]  # the target was never contacted


@pytest.mark.parametrize(("address", "carried", "public"), [
    ("::ffff:127.0.0.1", "127.0.0.1", "::ffff:8.8.8.8"),  # IPv4-mapped
    ("::127.0.0.1", "127.0.0.1", "::8.8.8.8"),  # IPv4-compatible
    ("64:ff9b::7f00:1", "127.0.0.1", "64:ff9b::808:808"),  # NAT64, the well-known prefix
    ("64:ff9b:1::7f00:1", "127.0.0.1", "64:ff9b:1::808:808"),  # NAT64 local-use (/96)
    ("64:ff9b:1::a9fe:a9fe", "169.254.169.254", "64:ff9b:1::808:808"),
    ("2002:7f00:1::", "127.0.0.1", "2002:808:808::"),  # 6to4
    ("2002:a00:1:1::1", "10.0.0.1", "2002:808:808:1::1"),
    # Teredo: the client address is the bitwise NOT of the last 32 bits.
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1",
     "2001:0:4136:e378:8000:63bf:f7f7:f7f7"),
])
def test_ipv6_forms_that_carry_an_ipv4_address_are_judged_as_it(address: str, carried: str,
                                                                 public: str) -> None:
    with pytest.raises(AddressRefused, match=rf"^example\.com \({carried}\) is a "):
        AddressPolicy().check("example.com", address)
    # The same form of a public address passes; an allowed network lets its own forms through.
    AddressPolicy().check("example.com", public)
    AddressPolicy.from_settings([f"{carried}/32"]).check("example.com", address)


def test_ipv6_addresses_of_their_own_are_judged_as_themselves() -> None:
    policy = AddressPolicy()
    for address, kind in (("::1", "loopback"), ("::", "unspecified"), ("fd12::1", "private")):
        with pytest.raises(AddressRefused, match=f"is a {kind} address"):
            policy.check(address, address)
    policy.check("example.com", "2606:4700::1111")
    # A local-use NAT64 address: every place its IPv4 address could sit (/96, /64, /56, /48)
    # that holds one must hold a public one (0.0.0.0/8 is what an unused place holds).
    with pytest.raises(AddressRefused, match=r"\(127\.0\.0\.1\) is a loopback address"):
        policy.check("example.com", "64:ff9b:1:7f00:0:100::")  # /48
    with pytest.raises(AddressRefused, match=r"\(10\.0\.0\.1\) is a private address"):
        policy.check("example.com", "64:ff9b:1:808:8:808:a00:1")  # /48 public, /96 private
    with pytest.raises(AddressRefused, match=r"\(0\.0\.0\.0\) is a unspecified address"):
        policy.check("example.com", "64:ff9b:1::")
    policy.check("example.com", "64:ff9b:1:808:8:808:808:808")


async def test_private_addresses_are_refused_after_dns_resolution(
        tmp_path: Path, web: FakeWeb, http: HttpClient) -> None:
    web.pages["/x"] = WebPage("secret", content_type="text/plain")
    strict = context(tmp_path, http, allowNetworks=[])
    for url in (web.url("/x"), f"http://localhost:{web.port}/x"):
        with pytest.raises(ToolError, match=r"is a loopback address; .*web.allowNetworks"):
            await fetch(strict, url)
    assert web.requests == []
    # localhost resolves to the allowed address: reached, by that address, with its name.
    text = text_of(await fetch(context(tmp_path, http), f"http://localhost:{web.port}/x"))
    assert text.endswith("\n\nsecret")
    assert web.requests[-1].headers["host"] == f"localhost:{web.port}"


async def test_urls_that_cannot_be_fetched(tmp_path: Path, web: FakeWeb,
                                           http: HttpClient) -> None:
    ctx = context(tmp_path, http)
    with pytest.raises(ToolError, match="only http:// and https:// URLs"):
        await fetch(ctx, "ftp://example.com/file")
    with pytest.raises(ToolError, match="user name or password are refused"):
        await fetch(ctx, f"http://user:hunter2@127.0.0.1:{web.port}/")
    with pytest.raises(ToolError, match="cannot resolve"):
        await fetch(ctx, "http://no-such-host.invalid/")
    with pytest.raises(ToolError, match=r"HTTP 404 Not Found"):
        await fetch(ctx, web.url("/missing"))
    assert [r.target for r in web.requests] == ["/missing"]


async def test_no_credential_or_cookie_is_sent(tmp_path: Path, web: FakeWeb,
                                               http: HttpClient) -> None:
    web.pages["/set"] = WebPage("set", content_type="text/plain",
                                headers={"set-cookie": "session=abc; Path=/"})
    web.pages["/get"] = WebPage("get", content_type="text/plain")
    ctx = context(tmp_path, http)
    await fetch(ctx, web.url("/set"))
    await fetch(ctx, web.url("/get"))
    for request in web.requests:
        names = {name.lower() for name in request.headers}
        assert not names & {"cookie", "authorization", "proxy-authorization", "x-api-key"}
    assert not list(http.async_client().cookies.jar)


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
async def test_cookies_of_an_ipv6_site_are_dropped_too(tmp_path: Path, http: HttpClient) -> None:
    async with open_fake_web(host="::1") as web:
        web.pages["/set"] = WebPage("set", content_type="text/plain",
                                    headers={"set-cookie": "session=abc; Path=/"})
        ctx = context(tmp_path, http, allowNetworks=["::1/128"])
        assert text_of(await fetch(ctx, web.url("/set"))).endswith("\n\nset")
        assert not list(http.async_client().cookies.jar)


def make_certificate(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for the DNS name ``name`` and its key (openssl)."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_https_connects_to_the_checked_address_and_verifies_the_name(
        tmp_path: Path) -> None:
    import httpx

    good, good_key = make_certificate(tmp_path, "localhost")
    other, other_key = make_certificate(tmp_path, "other.example")
    names: list[str | None] = []
    trusting = ssl.create_default_context(cafile=str(good))
    trusting.load_verify_locations(cafile=str(other))
    http = HttpClient(httpx.AsyncClient(verify=trusting, trust_env=False))
    try:
        for cert, key in ((good, good_key), (other, other_key)):
            server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server.load_cert_chain(cert, key)
            server.sni_callback = lambda _s, name, _c: names.append(name)
            async with open_fake_web(tls=server) as web:
                web.pages["/p"] = WebPage("secure", content_type="text/plain")
                url = f"https://localhost:{web.port}/p"
                ctx = context(tmp_path, http)
                if cert == good:
                    # Connected to 127.0.0.1 (checked), the name in SNI, the certificate
                    # verified for the name.
                    assert text_of(await fetch(ctx, url)).endswith("\n\nsecure")
                    assert web.requests[-1].headers["host"] == f"localhost:{web.port}"
                    # Never kept for a request to another name on the same address.
                    assert web.requests[-1].headers["connection"] == "close"
                else:
                    # A certificate for another name is refused although the address is
                    # the one checked: verification is against the URL's name.
                    with pytest.raises(ToolError, match=r"Cannot fetch .*: ConnectError: "
                                                        r".*(certificate|hostname)"):
                        await fetch(ctx, url)
                    assert web.requests == []
    finally:
        await http.aclose()
    assert names == ["localhost", "localhost"]


async def test_a_body_over_the_limit_is_refused(tmp_path: Path, web: FakeWeb,
                                                http: HttpClient) -> None:
    ctx = context(tmp_path, http, maxBytes=1000)
    web.pages["/big"] = WebPage("x" * 1001, content_type="text/plain")
    with pytest.raises(ToolError, match=r"the body is 1001B, over the 1000B limit "
                                        r"\(web.maxBytes\)"):
        await fetch(ctx, web.url("/big"))
    # Without a length the body is counted as it comes and refused once past the limit,
    # without waiting for the rest (this server never sends the rest).
    web.pages["/stream"] = WebPage("y" * 5000, content_type="text/plain", hang_after=2000)
    with pytest.raises(ToolError, match=r"over the 1000B limit \(web.maxBytes\)"):
        await fetch(ctx, web.url("/stream"))
    with trio.fail_after(5):
        await web.wait_until(lambda w: w.hanging == 0 and w.disconnects == 1)
    web.pages["/fits"] = WebPage("z" * 1000, content_type="text/plain")
    assert text_of(await fetch(ctx, web.url("/fits"))).endswith("z" * 1000)


@pytest.mark.parametrize(("content_type", "body"), [
    ("image/png", b"\x89PNG\r\n\x1a\n\x00\x00"),
    ("application/octet-stream", b"\x7fELF\x02\x01"),
    ("application/pdf", b"%PDF-1.7"),
    ("application/zip", b"PK\x03\x04"),
    ("text/plain", b"looks like text\x00\x01\x02"),
    (None, b"\x00\x01\x02\x03"),
])
async def test_binary_content_is_refused(tmp_path: Path, web: FakeWeb, http: HttpClient,
                                         content_type: str | None, body: bytes) -> None:
    web.pages["/file"] = WebPage(body, content_type=content_type)
    with pytest.raises(ToolError, match=r"Refused to fetch .*/file: binary content \("
                                        + (content_type or "no content type")):
        await fetch(context(tmp_path, http), web.url("/file"))


async def test_a_slow_server_hits_the_time_limit(tmp_path: Path, web: FakeWeb,
                                                 http: HttpClient) -> None:
    web.pages["/slow"] = WebPage("partial body", content_type="text/plain", hang_after=7)
    # Real time: the server is real and never sends the rest, so the limit is what ends it.
    with trio.fail_after(10), pytest.raises(
            ToolError, match=r"took longer than 1 s \(web.timeoutSeconds\)"):
        await fetch(context(tmp_path, http, timeoutSeconds=1), web.url("/slow"))
    with trio.fail_after(5):
        await web.wait_until(lambda w: w.disconnects == 1)


async def test_cancellation_stops_the_download(tmp_path: Path, web: FakeWeb,
                                               http: HttpClient) -> None:
    web.pages["/slow"] = WebPage("partial body", content_type="text/plain", hang_after=7)
    ctx = context(tmp_path, http)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fetch, ctx, web.url("/slow"))
            with trio.fail_after(10):
                await web.wait_until(lambda w: w.hanging == 1)
            scope.cancel()
    assert scope.cancelled_caught
    with trio.fail_after(5):
        await web.wait_until(lambda w: w.hanging == 0 and w.disconnects == 1)


async def test_long_text_is_truncated_with_the_whole_in_a_temp_file(
        tmp_path: Path, web: FakeWeb, http: HttpClient) -> None:
    lines = [f"line {i}" for i in range(1, 3001)]
    web.pages["/long.txt"] = WebPage("\n".join(lines), content_type="text/plain")
    result = await fetch(context(tmp_path, http), web.url("/long.txt"))
    text = text_of(result)
    path = trio.Path(result.details["fullOutputPath"])
    try:
        assert "line 2000\n\n[Showing lines 1-2000 of 3000 (" in text
        assert f"Full text: {path} (read it with offset=2001)]" in text
        assert "line 2001" not in text
        assert await path.read_text() == "\n".join(lines)
        assert stat.S_IMODE((await path.stat()).st_mode) == 0o600
        # A later read continues where the fetch stopped.
        rest = await ReadTool(ToolContext(tmp_path)).execute(
            "r", {"path": str(path), "offset": 2001, "limit": 2}, on_update=_no_update)
        assert text_of(rest).startswith("line 2001\nline 2002\n")
    finally:
        await path.unlink()


# --- read of a URL -----------------------------------------------------------------------------


async def test_read_of_a_url(tmp_path: Path, web: FakeWeb, http: HttpClient) -> None:
    web.pages["/p"] = WebPage("<h2>Hi</h2><p>there</p>")
    on = await ReadTool(context(tmp_path, http)).execute(
        "r", {"path": web.url("/p")}, on_update=_no_update)
    assert text_of(on).endswith("\n\n## Hi\n\nthere\n")
    with pytest.raises(ToolError, match=r"Web access is off .*`web: \{enabled: true\}`"):
        await ReadTool(ToolContext(tmp_path)).execute(
            "r", {"path": web.url("/p")}, on_update=_no_update)
    assert len(web.requests) == 1


# --- the tool set and the settings -------------------------------------------------------------


def test_web_tools_are_offered_only_when_turned_on(tmp_path: Path) -> None:
    http = HttpClient()
    off = [t.name for t in default_tools(ToolContext(tmp_path))]
    assert "web_fetch" not in off
    assert "web_search" not in off
    disabled = ToolContext(tmp_path, web=WebAccess(WebSettings(), http))
    assert [t.name for t in default_tools(disabled)] == off
    on = [t.name for t in default_tools(context(tmp_path, http))]
    assert on == [*off, "web_fetch", "web_search"]


def test_choosing_web_tools_by_name(tmp_path: Path, isolated_agent_dir: Path) -> None:
    with pytest.raises(SessionError, match=r"^web_fetch: web tools are off; set `web: "
                                           r"\{enabled: true\}` in config.yml"):
        create_session(tool_names=["read", "web_fetch"], agent_directory=isolated_agent_dir,
                       cwd=tmp_path, persist=False, environ={}, announce_offline=False)
    (isolated_agent_dir / "config.yml").write_text("web: {enabled: true}\nfetch:\n  enabled: "
                                                    "false\n")
    session = create_session(tool_names=["read", "web_search"], cwd=tmp_path, persist=False,
                             agent_directory=isolated_agent_dir, environ={},
                             announce_offline=False)
    assert [t.name for t in session.tools] == ["read", "web_search"]
    # The original's fetch.enabled: false turns web_fetch off again.
    session = create_session(agent_directory=isolated_agent_dir, cwd=tmp_path, persist=False,
                             environ={}, announce_offline=False)
    names = [t.name for t in session.tools]
    assert "web_search" in names
    assert "web_fetch" not in names


def test_search_keys_of_a_session(tmp_path: Path, isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text(
        "web:\n  enabled: true\n  searchApiKeys: {kagi: MY_KAGI}\n")
    (isolated_agent_dir / "auth.json").write_text(json.dumps(
        {"tavily": {"type": "api_key", "key": "tv-stored"}, "exa": "exa-stored"}))
    (isolated_agent_dir / "auth.json").chmod(0o600)
    session = create_session(agent_directory=isolated_agent_dir, cwd=tmp_path, persist=False,
                             announce_offline=False,
                             environ={"TAVILY_API_KEY": "tv-env", "BRAVE_API_KEY": "br-env",
                                      "MY_KAGI": "kg-env"})
    web = session.tool_context.web
    assert web is not None
    assert web.search_key("tavily", ("TAVILY_API_KEY",)) == "tv-stored"  # auth.json first
    assert web.search_key("exa", ("EXA_API_KEY",)) == "exa-stored"
    assert web.search_key("brave", ("BRAVE_API_KEY",)) == "br-env"
    assert web.search_key("kagi", ("KAGI_API_KEY",)) == "kg-env"  # the settings' variable


def test_web_settings(tmp_path: Path, isolated_agent_dir: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    assert load_settings(isolated_agent_dir, tmp_path).web == WebSettings()
    (isolated_agent_dir / "config.yml").write_text(
        "web:\n  enabled: true\n  allowNetworks: [127.0.0.1/32, 'fd00::/8']\n"
        "  timeoutSeconds: 5\n  searchProvider: tavily\n"
        "  searchBaseUrls: {tavily: 'http://127.0.0.1:1'}\n")
    project = tmp_path / ".omp"
    project.mkdir()
    # A repository may not open the user's private network nor redirect the search key.
    (project / "config.yml").write_text(
        "web:\n  maxBytes: 1000\n  allowNetworks: ['0.0.0.0/0']\n"
        "  searchBaseUrls: {tavily: 'http://evil.example'}\n")
    web = load_settings(isolated_agent_dir, tmp_path).web
    assert web == WebSettings(enabled=True, allowNetworks=["127.0.0.1/32", "fd00::/8"],
                              timeoutSeconds=5, maxBytes=1000, searchProvider="tavily",
                              searchBaseUrls={"tavily": "http://127.0.0.1:1"})
    err = capsys.readouterr().err
    assert "$.web.allowNetworks: ignored; only the global" in err
    assert "$.web.searchBaseUrls: ignored; only the global" in err
    for bad, message in [
            ("allowNetworks: [localhost]", r"\$.web.allowNetworks: 'localhost' is not a "
                                           "network"),
            ("maxBytes: 0", r"\$.web.maxBytes: must be greater than 0"),
            ("searchProvider: google", r"\$.web.searchProvider: must be one of"),
            ("searchApiKeys: {bing: x}", r"\$.web.searchApiKeys.bing: unknown search "
                                         "provider"),
            ("enabled: 'yes'", r"\$.web.enabled: expected true or false")]:
        (isolated_agent_dir / "config.yml").write_text(f"web:\n  {bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_settings(isolated_agent_dir, tmp_path)


# --- web_search --------------------------------------------------------------------------------

HITS = [SearchHit("Trio docs", "https://trio.readthedocs.io/", "Trio: a friendly library"),
        SearchHit("h11", "https://h11.readthedocs.io/en/latest/", "A pure-Python HTTP/1.1")]


async def search(ctx: ToolContext, **args: Any) -> ToolResult:
    return await WebSearchTool(ctx).execute("s1", args, on_update=_no_update)


@pytest.mark.parametrize(("provider", "variable"), [
    ("brave", "BRAVE_API_KEY"), ("exa", "EXA_API_KEY"), ("tavily", "TAVILY_API_KEY"),
    ("kagi", "KAGI_API_KEY")])
async def test_search_against_the_fake_search_server(
        tmp_path: Path, web: FakeWeb, http: HttpClient, provider: str, variable: str) -> None:
    web.search_results = HITS
    web.search_key = "k-123"
    ctx = context(tmp_path, http, environ={variable: "k-123"},
                  searchBaseUrls={provider: web.search_base_url(provider)})
    result = await search(ctx, query="structured concurrency", limit=5, recency="week")
    assert text_of(result) == (
        "[1] Trio docs\n    https://trio.readthedocs.io/\n    Trio: a friendly library\n"
        "[2] h11\n    https://h11.readthedocs.io/en/latest/\n    A pure-Python HTTP/1.1")
    assert result.details == {"provider": provider, "results": [
        {"title": h.title, "url": h.url, "snippet": h.snippet} for h in HITS]}
    (request,) = web.requests
    asked = request.query if request.method == "GET" else json.loads(request.body)
    assert "structured concurrency" in asked.values()
    if provider == "brave":
        assert (asked["count"], asked["freshness"]) == ("5", "pw")
    elif provider == "tavily":
        assert (asked["max_results"], asked["time_range"]) == (5, "week")
    elif provider == "exa":
        assert asked["numResults"] == 5
        assert asked["startPublishedDate"].endswith("Z")


async def test_search_provider_choice_and_keys(tmp_path: Path, web: FakeWeb,
                                               http: HttpClient) -> None:
    web.search_results = HITS[:1]
    bases = {p: web.search_base_url(p) for p in ("brave", "exa", "tavily", "kagi")}
    # auto: the first provider, in order, that has a key.
    ctx = context(tmp_path, http, environ={"KAGI_API_KEY": "a", "EXA_API_KEY": "b"},
                  searchBaseUrls=bases)
    assert (await search(ctx, query="q")).details["provider"] == "exa"
    assert (await search(ctx, query="q", provider="kagi")).details["provider"] == "kagi"
    # A key from the settings: a variable's name, or the key itself.
    ctx = context(tmp_path, http, environ={"MY_TAVILY": "t-key"}, searchBaseUrls=bases,
                  searchApiKeys={"tavily": "MY_TAVILY", "brave": "literal-key"},
                  searchProvider="tavily")
    assert (await search(ctx, query="q")).details["provider"] == "tavily"
    assert web.requests[-1].headers["authorization"] == "Bearer t-key"
    await search(ctx, query="q", provider="brave")
    assert web.requests[-1].headers["x-subscription-token"] == "literal-key"


async def test_search_with_no_provider_configured(tmp_path: Path, web: FakeWeb,
                                                  http: HttpClient) -> None:
    ctx = context(tmp_path, http)
    with pytest.raises(ToolError) as caught:
        await search(ctx, query="anything")
    assert str(caught.value) == (
        "No web search provider is configured: set BRAVE_API_KEY, EXA_API_KEY, TAVILY_API_KEY "
        "or KAGI_API_KEY (or web.searchApiKeys in the global config.yml; web.searchProvider "
        "picks one)")
    with pytest.raises(ToolError, match=r"The Kagi search provider has no key: set "
                                        r"KAGI_API_KEY \(or web.searchApiKeys.kagi"):
        await search(context(tmp_path, http, environ={"EXA_API_KEY": "x"}), query="q",
                     provider="kagi")
    with pytest.raises(ToolError, match=r"Web access is off"):
        await search(ToolContext(tmp_path), query="q")
    assert web.requests == []


async def test_search_failures_name_the_cause_without_the_key(
        tmp_path: Path, web: FakeWeb, http: HttpClient) -> None:
    web.search_key = "right"
    ctx = context(tmp_path, http, environ={"BRAVE_API_KEY": "wrong-key-9"},
                  searchBaseUrls={"brave": web.search_base_url("brave")})
    with pytest.raises(ToolError) as caught:
        await search(ctx, query="q")
    assert str(caught.value) == ("Brave refused the key (HTTP 401): check BRAVE_API_KEY or "
                                 "web.searchApiKeys.brave")
    web.search_key, web.search_status = None, 503
    with pytest.raises(ToolError, match=r"Brave search failed: HTTP 503: .*fake search error"):
        await search(ctx, query="q")
    web.search_status = 200
    assert text_of(await search(ctx, query="q")) == "No results from Brave for 'q'."
    dead = context(tmp_path, http, environ={"BRAVE_API_KEY": "wrong-key-9"},
                   searchBaseUrls={"brave": "http://127.0.0.1:9"})
    with pytest.raises(ToolError, match=r"Brave search failed: ConnectError") as caught:
        await search(dead, query="q")
    assert "wrong-key-9" not in str(caught.value)


# --- through the real process ------------------------------------------------------------------


def write_web_config(agent_dir: Path, web: FakeWeb, **extra: Any) -> None:
    settings = {"enabled": True, "allowNetworks": LOOPBACK, **extra}
    (agent_dir / "config.yml").write_text(json.dumps({"web": settings}))


async def test_web_tools_through_the_rpc_process(tmp_path: Path, isolated_agent_dir: Path,
                                                 web: FakeWeb,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    web.pages["/doc"] = WebPage("<h1>Doc</h1><p>body</p>")
    web.search_results = HITS[:1]
    monkeypatch.setenv("TAVILY_API_KEY", "tv-secret")
    write_web_config(isolated_agent_dir, web,
                     searchBaseUrls={"tavily": web.search_base_url("tavily")})
    script = [tools_reply(tool_call("f1", "web_fetch", {"url": web.url("/doc")}),
                          tool_call("s1", "web_search", {"query": "trio"})),
              text_reply("done")]
    with trio.fail_after(60):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            state = await agent.data("get_state")
            names = [t["name"] for t in state["dumpTools"]]
            assert names.index("web_fetch") + 1 == names.index("web_search")
            await agent.send("prompt", message="Look it up", id="p1")
            frames = await agent.until_settled()
    (turn_end, _) = of_type(frames, "turn_end")
    # (shared calls: their results come in the order they ended)
    results = {r["toolCallId"]: r for r in turn_end["toolResults"]}
    fetched, searched = results["f1"], results["s1"]
    assert not fetched["isError"]
    assert not searched["isError"]
    assert tool_result_text(fetched).endswith("\n\n# Doc\n\nbody\n")
    assert tool_result_text(searched).startswith("[1] Trio docs\n")
    assert "tv-secret" not in json.dumps(frames)


async def test_abort_stops_a_download_mid_body(tmp_path: Path, isolated_agent_dir: Path,
                                               web: FakeWeb) -> None:
    web.pages["/slow"] = WebPage("x" * 100_000, content_type="text/plain", hang_after=50_000)
    write_web_config(isolated_agent_dir, web)
    script = [tools_reply(tool_call("f1", "web_fetch", {"url": web.url("/slow")}))]
    with trio.fail_after(60):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Fetch", id="p1")
            await web.wait_until(lambda w: w.hanging == 1)
            abort_id = await agent.send("abort")
            await agent.until_response(abort_id)
            # The connection is closed by the time the abort is answered, or just after.
            await web.wait_until(lambda w: w.hanging == 0 and w.disconnects == 1)
            assert len(agent.fake.requests) == 1  # no model call after the abort
            frames = agent.frames
    end = frames[index_of(frames, lambda f: f["type"] == "tool_execution_end")]
    assert end["toolCallId"] == "f1"
    assert end["isError"] is True
    assert "aborted" in json.dumps(end["result"]).lower()
    (result,) = [f for f in of_type(frames, "prompt_result") if f.get("id") == "p1"]
    assert result["status"] == "aborted"
