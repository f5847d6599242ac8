"""The ``oauth:`` block of a ``models.yml`` provider: how to log in to it with OAuth 2.0.

Only the standard, open flows are offered (docs/guides/login.md#logging-in): the device
authorization grant (RFC 8628) and the authorization code grant with PKCE and a loopback redirect
(RFC 7636, RFC 8252). ``omp/llm/models_file.py`` reads the block into this class and checks it.
"""

from __future__ import annotations

from typing import Literal

import msgspec


class OAuthConfig(msgspec.Struct, kw_only=True):
    """One provider's OAuth client registration (a public client: no secret)."""

    flow: Literal["device", "pkce"]
    clientId: str
    tokenUrl: str
    deviceAuthorizationUrl: str | None = None
    """``flow: device``: where the device code is requested."""
    authorizationUrl: str | None = None
    """``flow: pkce``: where the browser is sent."""
    scopes: list[str] = msgspec.field(default_factory=list)
    redirectPort: int = 0
    """``flow: pkce``: the loopback port of the redirect; 0 = any free port."""
    resource: str | None = None
    """The RFC 8707 resource indicator sent with the authorization, token and refresh
    requests (an MCP server's URL: the MCP authorization spec requires it)."""
