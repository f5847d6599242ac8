"""OAuth for HTTP MCP servers (docs/guides/mcp.md#oauth-http-and-sse-servers, the MCP authorization
spec) through the real ``omp --mode rpc`` process: an MCP server written with the SDK that requires
a bearer token issued for it (``tests/data/mcp_probe_server.py --auth``), the fake OAuth server
(``omp.testing.fake_oauth``: metadata, dynamic client registration, PKCE, introspection), and
the test playing the user's browser on the ``open_url`` the host is sent."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import trio
from agent_helpers import Frame, of_type, text_reply, tool_call, tools_reply
from test_abort_registry import fake_agent
from test_mcp import (
    LIMIT,
    Host,
    free_port,
    open_host,
    result_text,
    start_http_probe,
    stdio_entry,
    write_mcp,
)

from omp.process import kill_process_group
from omp.testing.fake_oauth import open_fake_oauth


async def browser(host: Host) -> str:
    """Wait for the ``open_url`` frame and do what the user's browser does: follow the URL
    (the fake server approves at once and redirects to omp's loopback callback). Returns
    the authorization URL."""
    frame = (await host.until(lambda f: f["type"] == "extension_ui_request"
                              and f["method"] == "open_url"))[-1]
    async with httpx.AsyncClient(follow_redirects=True) as client:
        answer = await client.get(frame["url"])
    assert answer.status_code == 200, answer.text
    assert "Login complete" in answer.text
    return str(frame["url"])


def session_files(directory: Path) -> str:
    """Everything the session files under ``directory`` hold."""
    return "".join(p.read_text() for p in directory.rglob("*.jsonl"))


def notices(host: Host, level: str | None = None) -> list[str]:
    return [f["message"] for f in host.frames if f["type"] == "notice"
            and f.get("source") == "mcp" and (level is None or f["level"] == level)]


async def test_a_server_that_requires_oauth(tmp_path: Path, isolated_agent_dir: Path) -> None:
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    write_mcp(isolated_agent_dir / "mcp.json", {"remote": {"url": url}})
    script = [tools_reply(tool_call("c1", "mcp__remote_echo", {"text": "authorized"})),
              text_reply("done")]
    async with open_fake_oauth() as oauth:
        server = await start_http_probe(port, extra=["--auth", oauth.base_url])
        try:
            with trio.fail_after(LIMIT):
                async with open_host(cwd, isolated_agent_dir, script) as host:
                    # The 401 is said once; the flow starts by itself: the host is asked to
                    # open the authorization URL.
                    first = await browser(host)
                    await host.mounted("mcp__remote_echo")
                    frames = await host.prompt("call it")
                    # /mcp reauth runs the flow again (a new login, new tokens).
                    said = await host.command_output("/mcp reauth remote")
                    second = await browser(host)
                    await host.until(lambda f: f["type"] == "notice"
                                     and f["message"] == 'MCP server "remote" authorized.'
                                     and len(notices(host, "info")) == 2)
                    stdio = await host.command_output("/mcp reauth nope")
                    state = (await host.client.request({"type": "get_state"})).data
        finally:
            await kill_process_group(server)
    assert notices(host, "warning") == [
        'MCP server "remote": requires OAuth authorization: run /mcp reauth remote']
    assert notices(host, "info") == ['MCP server "remote" authorized.'] * 2
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is False
    assert result_text(end).startswith("authorized")
    assert said == 'Authorizing "remote": complete the login in your browser.'
    assert stdio == 'Server "nope" is not running. Run /mcp list to see configured servers.'
    # The standard flow: a registered client, PKCE, the server's URL as the resource.
    for authorize_url in (first, second):
        query = dict(httpx.URL(authorize_url).params)
        assert query["client_id"] in oauth.registered
        assert query["resource"] == url
        assert query["code_challenge_method"] == "S256"
    paths = [r.path for r in oauth.requests]
    assert paths[:3] == ["/.well-known/oauth-authorization-server", "/register", "/authorize"]
    # The tokens are stored where the original stores them, and nowhere else.
    stored = json.loads((isolated_agent_dir / "auth.json").read_text())
    entry = stored[f"mcp_oauth:profile:default:{url}"]
    assert entry["access"] == oauth.issued[-2]
    assert entry["refresh"] == oauth.issued[-1]
    assert entry["tokenUrl"] == oauth.token_url
    assert entry["resource"] == url
    assert (isolated_agent_dir / "auth.json").stat().st_mode & 0o077 == 0
    assert state["sessionFile"]
    written = json.dumps(host.frames) + session_files(isolated_agent_dir)
    assert not [t for t in oauth.issued if t in written]


async def test_a_stored_token_is_refreshed(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """A stored login whose access token expired: refreshed before the first request, no
    browser."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    write_mcp(isolated_agent_dir / "mcp.json", {"remote": {"url": url}})
    async with open_fake_oauth() as oauth:
        tokens = oauth.issue(resource=url)
        (isolated_agent_dir / "auth.json").write_text(json.dumps({
            f"mcp_oauth:profile:default:{url}": {
                "type": "oauth", "access": "at-expired", "refresh": tokens["refresh_token"],
                "expires": 0, "clientId": oauth.client_id, "tokenUrl": oauth.token_url,
                "resource": url}}))
        server = await start_http_probe(port, extra=["--auth", oauth.base_url])
        try:
            with trio.fail_after(LIMIT):
                async with open_host(cwd, isolated_agent_dir) as host:
                    await host.mounted("mcp__remote_echo")
        finally:
            await kill_process_group(server)
    assert oauth.refreshes == 1
    assert not of_type(host.frames, "extension_ui_request")
    assert notices(host, "warning") == []
    stored = json.loads((isolated_agent_dir / "auth.json").read_text())
    assert stored[f"mcp_oauth:profile:default:{url}"]["access"] == oauth.issued[-2]


def is_notice(message: str) -> Callable[[Frame], bool]:
    return lambda f: f["type"] == "notice" and f.get("message") == message


def is_open_url(f: Frame) -> bool:
    return f["type"] == "extension_ui_request" and f.get("method") == "open_url"


async def test_abort_cancels_an_oauth_flow(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``abort`` cancels a flow in progress (the ``login`` family of the abort registry):
    the one a server's first 401 started, and one started by ``/mcp reauth`` written in the
    same write as the ``abort``. Nothing is stored; a later ``/mcp reauth`` starts anew."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    write_mcp(isolated_agent_dir / "mcp.json", {"remote": {"url": url}})
    cancelled = 'MCP server "remote": authorization cancelled'
    async with open_fake_oauth() as oauth:
        server = await start_http_probe(port, extra=["--auth", oauth.base_url])
        try:
            with trio.fail_after(LIMIT):
                async with fake_agent(cwd, isolated_agent_dir) as (host, _fake):
                    # The flow the first 401 started waits for the browser: abort ends it.
                    await host.until(is_open_url)
                    await host.write({"id": "a1", "type": "abort"})
                    await host.until(is_notice(cancelled))
                    # The trigger and the abort in one write: the flow is registered when
                    # its line is read, so the abort finds it before it asks anything.
                    await host.write({"id": "r1", "type": "prompt",
                                      "message": "/mcp reauth remote"},
                                     {"id": "a2", "type": "abort"})
                    started = await host.until(is_notice(cancelled))
                    # Not left "in progress": a new flow starts and reaches the browser.
                    await host.write({"id": "r2", "type": "prompt",
                                      "message": "/mcp reauth remote"})
                    again = await host.until(is_open_url)
                    await host.write({"id": "a3", "type": "abort"})
                    await host.until(is_notice(cancelled))
        finally:
            await kill_process_group(server)
    outputs = [f["text"] for f in host.frames if f["type"] == "command_output"]
    assert outputs == ['Authorizing "remote": complete the login in your browser.'] * 2
    responses = {f["id"]: f for f in host.frames if f["type"] == "response"}
    assert all(responses[i]["success"] for i in ("r1", "a2", "r2", "a3"))
    # The flow started with the abort behind it never asked the host to open a URL.
    assert not [f for f in started if is_open_url(f)]
    assert [f for f in again if is_open_url(f)]
    assert len([f for f in host.frames if is_open_url(f)]) == 2
    assert oauth.issued == []
    assert "mcp_oauth" not in ((isolated_agent_dir / "auth.json").read_text()
                               if (isolated_agent_dir / "auth.json").exists() else "")


async def test_unauth_forgets_the_tokens(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``/mcp unauth``: the stored tokens leave ``auth.json`` (the other entries stay), the
    server is reconnected without them and refuses us; no flow starts by itself."""
    cwd = tmp_path / "project"
    cwd.mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    write_mcp(isolated_agent_dir / "mcp.json", {"remote": {"url": url},
                                                "local": stdio_entry()})
    async with open_fake_oauth() as oauth:
        tokens = oauth.issue(resource=url)
        (isolated_agent_dir / "auth.json").write_text(json.dumps({
            "other": {"type": "api_key", "key": "sk-other"},
            f"mcp_oauth:profile:default:{url}": {
                "type": "oauth", "access": tokens["access_token"],
                "refresh": tokens["refresh_token"], "expires": 2**41,
                "clientId": oauth.client_id, "tokenUrl": oauth.token_url, "resource": url}}))
        server = await start_http_probe(port, extra=["--auth", oauth.base_url])
        try:
            with trio.fail_after(LIMIT):
                async with open_host(cwd, isolated_agent_dir) as host:
                    await host.mounted("mcp__remote_echo", "mcp__local_echo")
                    mark = host.mark()
                    said = [await host.command_output(c) for c in (
                        "/mcp unauth remote", "/mcp unauth remote", "/mcp unauth local",
                        "/mcp unauth nope", "/mcp unauth")]
                    await host.seen(lambda f: f["type"] == "notice"
                                    and "requires OAuth authorization" in f["message"],
                                    since=mark)
                    listed = await host.command_output("/mcp list")
        finally:
            await kill_process_group(server)
    assert said == ['Removed the OAuth credentials of "remote".',
                    'No OAuth credentials stored for "remote".',
                    'Server "local" is a stdio server: OAuth applies to HTTP and SSE servers.',
                    'Server "nope" not found. Run /mcp list to see configured servers.',
                    "Server name required. Usage: /mcp unauth <name>"]
    assert json.loads((isolated_agent_dir / "auth.json").read_text()) == {
        "other": {"type": "api_key", "key": "sk-other"}}
    assert "remote | http | enabled" in listed
    assert not [f for f in host.frames if is_open_url(f)]
    assert notices(host, "warning") == [
        'MCP server "remote": requires OAuth authorization: run /mcp reauth remote']
