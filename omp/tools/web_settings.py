"""The ``web`` section of ``config.yml``: the settings of the web tools (``web_fetch``,
``web_search``, ``read`` of a URL), and their checks.

Apart from ``omp.tools.web_policy`` (the address rule and the session's access): every start
reads the settings, and only a session with ``web.enabled`` needs the policy, so that module
is imported then (``omp.session.setup.web_access``).
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal

import msgspec

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

SearchProviderName = Literal["auto", "brave", "exa", "tavily", "kagi"]

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_REDIRECTS = 5


class WebSettings(msgspec.Struct, kw_only=True):
    """The ``web`` section of ``config.yml`` (key names as the file has them)."""

    enabled: bool = False
    """Offer ``web_fetch`` and ``web_search``, and let ``read`` fetch ``http(s)://`` URLs."""
    allowNetworks: list[str] = msgspec.field(default_factory=list)
    """Networks (CIDR, e.g. ``127.0.0.1/32``, ``10.0.0.0/8``) a fetch may reach although they
    are not public. Global file (or ``--config``) only: a repository must not be able to
    point the model at the user's private network."""
    maxBytes: int = DEFAULT_MAX_BYTES
    """The largest response body read (after decompression); a larger one is refused."""
    timeoutSeconds: float = DEFAULT_TIMEOUT_SECONDS
    """The whole fetch (every redirect, the body) or search must end within this time."""
    maxRedirects: int = DEFAULT_MAX_REDIRECTS
    searchProvider: SearchProviderName = "auto"
    """``auto``: the first of brave, exa, tavily, kagi that has a key."""
    searchBaseUrls: dict[str, str] = msgspec.field(default_factory=dict)
    """Provider → the API root to call instead of the provider's own (a proxy; the fake
    search server in tests). Global file only: it decides where the key is sent."""
    searchApiKeys: dict[str, str] = msgspec.field(default_factory=dict)
    """Provider → its key, or the name of the environment variable holding it (as
    ``models.yml`` ``apiKey``). Global file only."""


GLOBAL_ONLY_KEYS = frozenset({"allowNetworks", "searchBaseUrls", "searchApiKeys"})


def parse_networks(entries: list[str]) -> tuple[Network, ...]:
    """``web.allowNetworks`` as networks; raises ValueError naming an entry that does not
    parse."""
    parsed: list[Network] = []
    for entry in entries:
        try:
            parsed.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not a network (e.g. 127.0.0.1/32, "
                             "10.0.0.0/8, ::1/128)") from None
    return tuple(parsed)


def validate(settings: WebSettings) -> list[tuple[str, str]]:
    """The problems of ``settings`` as (``$.web.key``, what is wrong)."""
    problems: list[tuple[str, str]] = []
    try:
        parse_networks(settings.allowNetworks)
    except ValueError as exc:
        problems.append(("$.web.allowNetworks", str(exc)))
    if settings.maxBytes <= 0:
        problems.append(("$.web.maxBytes", f"must be greater than 0, got {settings.maxBytes}"))
    if settings.timeoutSeconds <= 0:
        problems.append(("$.web.timeoutSeconds",
                         f"must be greater than 0, got {settings.timeoutSeconds:g}"))
    if settings.maxRedirects < 0:
        problems.append(("$.web.maxRedirects",
                         f"must not be negative, got {settings.maxRedirects}"))
    known = ("brave", "exa", "tavily", "kagi")
    for key in ("searchBaseUrls", "searchApiKeys"):
        mapping: dict[str, Any] = getattr(settings, key)
        for name in mapping:
            if name not in known:
                problems.append((f"$.web.{key}.{name}", "unknown search provider (known: "
                                 f"{', '.join(known)})"))
    return problems
