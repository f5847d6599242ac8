"""A real MCP server (the SDK's FastMCP, stdio) for the restart tests (tests/test_mcp_restart.py).

Tools: ``echo`` (the text back, with the server's pid), ``crash`` (the process exits with
status 3 while answering), ``pid`` (its process id). ``MCP_RESTART_MARK`` names a file that
gets one line per start; with ``MCP_RESTART_STARTS=N`` a start that finds N lines there
already refuses to serve: it says why on stderr and exits with status 7 before reading a
message (a server that cannot come back); with ``MCP_RESTART_HANG_FROM=N`` such a start
writes its line and then never answers (a restart slower than any timeout).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.fastmcp import FastMCP

mark = os.environ.get("MCP_RESTART_MARK")
most = os.environ.get("MCP_RESTART_STARTS")
hang_from = os.environ.get("MCP_RESTART_HANG_FROM")
if mark:
    try:
        with open(mark) as f:
            starts = len(f.read().split())
    except FileNotFoundError:
        starts = 0
    if most is not None and starts >= int(most):
        print(f"restart server: started {starts} times already, refusing", file=sys.stderr)
        sys.exit(7)
    with open(mark, "a") as f:
        f.write(f"{os.getpid()}\n")
    if hang_from is not None and starts >= int(hang_from):
        time.sleep(3600)  # ended by the client (its process group is)

mcp = FastMCP("restart", log_level="WARNING")


@mcp.tool(structured_output=False)
def echo(text: str) -> str:
    """Echo the text back, with the server's pid."""
    return f"{text} from {os.getpid()}"


@mcp.tool()
def crash() -> str:
    """The server process exits while answering."""
    os._exit(3)


@mcp.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


if __name__ == "__main__":
    mcp.run()
