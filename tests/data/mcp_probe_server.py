"""A real MCP server (the SDK's FastMCP) for the MCP tests: stdio by default, streamable HTTP
on 127.0.0.1 with ``--http PORT``, the legacy SSE transport with ``--sse PORT``.

Tools: ``echo``, ``Add-Numbers2`` (structured result), ``fail`` (an ``isError`` result),
``crash`` (the process exits mid-call), ``hang`` (never answers), ``was_cancelled`` (whether a
``hang`` call was cancelled by the client), ``add_late`` (adds a tool ``late`` and sends
``tools/list_changed``), ``env`` (reads a variable), ``pid`` (its process id), ``spawn_child``
(starts a grandchild that ignores SIGTERM; its pid), ``big`` (a text result of ``mib`` MiB
of ``x``, not repeated as structured content: one line of that size and a few bytes more);
a prompt ``greet``; a resource
``probe://doc/1``. ``--http PORT --auth ISSUER`` requires a bearer token that ISSUER (the
fake OAuth server) issued for this server. ``MCP_PROBE_NAME`` renames the server;
``MCP_PROBE_MARK`` names a file that gets one line per start (reconnect tests). Resources can
be subscribed to; ``touch_doc`` sends ``resources/updated`` for ``probe://doc/1``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import anyio
from mcp.server.fastmcp import Context, FastMCP

mcp = FastMCP(os.environ.get("MCP_PROBE_NAME", "probe"), instructions="Probe server.",
              log_level="WARNING")

if mark := os.environ.get("MCP_PROBE_MARK"):
    with open(mark, "a") as f:
        f.write(f"{os.getpid()}\n")


@mcp.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return text


@mcp.tool(name="Add-Numbers2")
def add_numbers(a: int, b: int) -> dict[str, int]:
    """Add two numbers."""
    return {"sum": a + b}


@mcp.tool()
def fail() -> str:
    """Always fails."""
    raise ValueError("it broke")


@mcp.tool()
def crash() -> str:
    """The server process exits while answering."""
    os._exit(3)


_hang_cancelled = anyio.Event()


@mcp.tool()
async def hang() -> str:
    """Never answers (a cancellation from the client ends it)."""
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        _hang_cancelled.set()
        raise
    return "unreachable"


@mcp.tool()
async def was_cancelled() -> str:
    """Whether a ``hang`` call was cancelled by the client (waits up to 20 s for it)."""
    with anyio.move_on_after(20):
        await _hang_cancelled.wait()
    return "yes" if _hang_cancelled.is_set() else "no"


@mcp.tool()
async def add_late(ctx: Context) -> str:  # type: ignore[type-arg]
    """Adds the tool ``late`` and tells the client that the tool list changed."""
    mcp.add_tool(lambda: "late answer", name="late", description="Added later.")
    await ctx.session.send_tool_list_changed()
    return "added"


@mcp.tool()
def env(name: str) -> str:
    """The value of an environment variable of the server process."""
    return os.environ.get(name, "<unset>")


@mcp.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@mcp.tool()
def spawn_child() -> int:
    """Start a grandchild that ignores SIGTERM; its pid."""
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return child.pid


@mcp.tool(structured_output=False)
def big(mib: float) -> str:
    """A text of ``mib`` MiB."""
    return "x" * int(mib * 1024 * 1024)


@mcp.prompt()
def greet(who: str) -> str:
    """Greet someone."""
    return f"Please greet {who}"


@mcp.resource("probe://doc/1", description="A document")
def doc() -> str:
    return "resource body"


_subscribed: set[str] = set()


async def _subscribe(uri: object) -> None:
    _subscribed.add(str(uri))


# The SDK's decorator is untyped: registered by a call.
mcp._mcp_server.subscribe_resource()(_subscribe)  # type: ignore[no-untyped-call]


_capabilities = mcp._mcp_server.get_capabilities


def _with_subscribe(*args: object, **kwargs: object) -> object:
    """The SDK never advertises ``resources.subscribe``; this server can (a test's choice)."""
    caps = _capabilities(*args, **kwargs)  # type: ignore[arg-type]
    if caps.resources is not None:
        caps.resources.subscribe = True
    return caps


mcp._mcp_server.get_capabilities = _with_subscribe  # type: ignore[method-assign,assignment]


@mcp.tool()
async def touch_doc(ctx: Context) -> str:  # type: ignore[type-arg]
    """Says that ``probe://doc/1`` changed (to a client that subscribed to it)."""
    from pydantic import AnyUrl

    if "probe://doc/1" in _subscribed:
        await ctx.session.send_resource_updated(AnyUrl("probe://doc/1"))
        return "told"
    return "not subscribed"


class IntrospectionVerifier:
    """Bearer tokens checked at the authorization server (RFC 7662), as the SDK's own
    examples do: active, and issued for this server (``aud``, RFC 8707)."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def verify_token(self, token: str) -> object:
        import httpx
        from mcp.server.auth.provider import AccessToken

        async with httpx.AsyncClient() as client:
            answer = (await client.post(self.endpoint, data={"token": token})).json()
        if not answer.get("active"):
            return None
        return AccessToken(token=token, client_id=answer["client_id"], scopes=[],
                           resource=answer.get("aud"))


def require_bearer(issuer: str, port: int) -> None:
    """``--auth ISSUER``: every request needs a token of ISSUER (tests/test_mcp_oauth.py)."""
    from mcp.server.auth.settings import AuthSettings

    mcp.settings.auth = AuthSettings(
        issuer_url=issuer, resource_server_url=f"http://127.0.0.1:{port}/mcp",  # type: ignore[arg-type]
        validate_token_resource=True)
    mcp._token_verifier = IntrospectionVerifier(f"{issuer}/introspect")  # type: ignore[assignment]


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in ("--http", "--sse"):
        mcp.settings.port = int(sys.argv[2])
        mcp.settings.host = "127.0.0.1"
        if len(sys.argv) > 4 and sys.argv[3] == "--auth":
            require_bearer(sys.argv[4], mcp.settings.port)
        mcp.run(transport="streamable-http" if sys.argv[1] == "--http" else "sse")
    else:
        mcp.run()
