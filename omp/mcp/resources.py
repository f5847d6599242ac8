"""MCP resources as ``read mcp://<resource uri>`` (docs/guides/mcp.md#prompts-and-resources), over
the host's URL schemes.

``McpUris`` is the session's ``UriHandler`` once MCP servers are configured: ``mcp://`` URLs
are its own (``resources/read`` on the server that lists the URI, waiting for its restart when
it is down; the texts of the result are what ``read`` shows), and so is a resource's own URI
(``read note://hello``) when a connected server lists it and the host's schemes do not take it;
everything else goes to the
host's schemes as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ..tools.base import ToolError, UriHandler, UriResource

if TYPE_CHECKING:
    from .manager import McpManager

SCHEME = "mcp://"


@attrs.define(eq=False, repr=False)
class McpUris:
    inner: UriHandler | None
    manager: McpManager

    def owns(self, url: str) -> bool:
        return url.startswith(SCHEME) or self._host_owns(url) or self._listed(url)

    def _host_owns(self, url: str) -> bool:
        return self.inner is not None and self.inner.owns(url)

    def _listed(self, uri: str) -> bool:
        """A connected server lists ``uri`` as one of its resources."""
        return any(c.state == "connected" and any(str(r.uri) == uri for r in c.resources)
                   for c in self.manager.connections.values())

    def writable(self, url: str) -> bool:
        return not url.startswith(SCHEME) and self._host_owns(url) and self.inner is not None \
            and self.inner.writable(url)

    async def read(self, url: str) -> UriResource:
        """``resources/read``; raises ToolError naming what is wrong. On cancellation the
        request is abandoned."""
        if not url.startswith(SCHEME) and self._host_owns(url):
            assert self.inner is not None
            return await self.inner.read(url)
        uri = url[len(SCHEME):] if url.startswith(SCHEME) else url
        for connection in self.manager.connections.values():
            if connection.listed and any(
                    str(r.uri) == uri for r in connection.resources):
                try:
                    text, mime = await connection.resource_text(uri)
                except Exception as exc:  # the server's failure is the model's to read
                    raise ToolError(f'MCP server "{connection.name}" could not read {uri}: '
                                    f"{connection.redact(str(exc) or type(exc).__name__)}"
                                    ) from None
                return UriResource(content=text, content_type=mime)
        known = [f"{SCHEME}{r.uri}" for c in self.manager.connections.values()
                 if c.listed for r in c.resources]
        raise ToolError(f'No MCP server has resource "{uri}". Resources: '
                        f"{', '.join(known) or '(none)'}")

    async def write(self, url: str, content: str) -> None:
        """Write ``content`` through the host's schemes (``inner``); an ``mcp://`` URL or a
        server's resource raises ToolError (resources are read-only). On cancellation as the
        host's ``write``: the host is told (``host_uri_cancel``) and ``Cancelled`` propagates."""
        if url.startswith(SCHEME) or not self._host_owns(url) or self.inner is None:
            raise ToolError(f"Cannot write {url}: MCP resources are read-only")
        await self.inner.write(url, content)
