"""MCP servers: their tools, prompts and resources in the session (docs/guides/mcp.md#mcp-servers).

``config`` reads the definitions (no SDK import), ``manager`` owns the connections of one
``serve()``, ``connection`` is one server's connection over the official SDK (``mcp``),
``transport`` starts a stdio server as our own process group or opens streamable HTTP,
``auth`` is OAuth for HTTP servers (stored tokens, the standard flow), ``devices`` mounts the
tools as ``xd://`` devices (``tools.xdev``), ``resources`` serves ``read mcp://<uri>``,
``commands`` answers ``/mcp``. The SDK is imported only once a server is configured, after
``ready``.
"""

from .config import LoadedServers as LoadedServers
from .config import ServerConfig as ServerConfig
from .config import load_servers as load_servers
from .config import parse_entry as parse_entry
