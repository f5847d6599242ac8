"""The network policy of the web tools (``web_fetch``, ``web_search``, ``read`` of a URL): the
``web`` section of ``config.yml``, and which addresses a fetch may reach.

Off unless ``web.enabled: true``: a session with no network policy offers no web tool, and
``read`` of an ``http(s)://`` URL says which setting turns it on.

The address rule (``AddressPolicy``): a URL chosen by the model may reach only public
addresses. Every address its host resolves to is checked, after DNS resolution and again for
every redirect, and the connection is made to the address that was checked (no second lookup
a rebinding DNS server could answer differently). Refused unless a network of
``web.allowNetworks`` contains it: loopback, private (RFC 1918, fc00::/7), link-local (with the
cloud metadata address 169.254.169.254), shared (100.64/10), multicast, unspecified and
reserved addresses, i.e. whatever ``ipaddress`` does not call global, IPv4-mapped IPv6
addresses judged as the IPv4 address they carry.

Importing this module costs nothing new at startup: attrs, ``ipaddress`` and
``omp.llm.models`` are loaded by then anyway.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from ..llm.models import resolve_config_value

if TYPE_CHECKING:
    from ..llm.stream import HttpClient

SearchProviderName = Literal["auto", "brave", "exa", "tavily", "kagi"]

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_MAX_REDIRECTS = 5


@attrs.define(kw_only=True)
class WebSettings:
    """The ``web`` section of ``config.yml`` (key names as the file has them)."""

    enabled: bool = False
    """Offer ``web_fetch`` and ``web_search``, and let ``read`` fetch ``http(s)://`` URLs."""
    allowNetworks: list[str] = attrs.field(factory=list)
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
    searchBaseUrls: dict[str, str] = attrs.field(factory=dict)
    """Provider → the API root to call instead of the provider's own (a proxy; the fake
    search server in tests). Global file only: it decides where the key is sent."""
    searchApiKeys: dict[str, str] = attrs.field(factory=dict)
    """Provider → its key, or the name of the environment variable holding it (as
    ``models.yml`` ``apiKey``). Global file only."""


GLOBAL_ONLY_KEYS = frozenset({"allowNetworks", "searchBaseUrls", "searchApiKeys"})


class AddressRefused(Exception):
    """A URL's host is, or resolves to, an address the policy does not allow."""


@attrs.frozen
class AddressPolicy:
    """Which addresses a model-chosen URL may reach."""

    allowed: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def from_settings(cls, networks: list[str]) -> AddressPolicy:
        """Raises ValueError naming a network that does not parse."""
        parsed = []
        for entry in networks:
            try:
                parsed.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"{entry!r} is not a network (e.g. 127.0.0.1/32, "
                                 "10.0.0.0/8, ::1/128)") from None
        return cls(tuple(parsed))

    def check(self, host: str, address: str) -> None:
        """Raises AddressRefused when ``address`` (what ``host`` resolved to) is not public
        and no allowed network contains it."""
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
            address.partition("%")[0])  # a scope id (fe80::1%eth0) is link-local anyway
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_global and not ip.is_multicast:
            return
        if any(ip.version == net.version and ip in net for net in self.allowed):
            return
        kind = ("loopback" if ip.is_loopback else "unspecified" if ip.is_unspecified
                else "link-local" if ip.is_link_local
                else "private" if ip.is_private else "multicast" if ip.is_multicast
                else "non-public")
        shown = host if host == str(ip) else f"{host} ({ip})"
        raise AddressRefused(
            f"{shown} is a {kind} address; web tools reach public addresses only "
            "(web.allowNetworks in the global config.yml can allow a network)")


@attrs.define(eq=False, repr=False)
class WebAccess:
    """What the web tools of one session share: the policy and the owner's HTTP client."""

    settings: WebSettings
    http: HttpClient
    """The ``serve()``'s client (connection reuse; closed by its owner)."""
    policy: AddressPolicy = attrs.field(factory=AddressPolicy)
    environ: Mapping[str, str] = attrs.field(factory=dict)
    """Where search keys are looked up by variable name."""
    stored_key: Callable[[str], str | None] = lambda _provider: None
    """A key stored for a provider in ``auth.json`` (``login``), or None."""

    @property
    def enabled(self) -> bool:
        return self.settings.enabled

    def search_key(self, provider: str, variables: tuple[str, ...]) -> str | None:
        """``provider``'s key: ``web.searchApiKeys``, then ``auth.json``, then ``variables``
        in the environment."""
        if configured := self.settings.searchApiKeys.get(provider):
            return resolve_config_value(configured, self.environ) or None
        if stored := self.stored_key(provider):
            return stored
        for name in variables:
            if value := self.environ.get(name):
                return value
        return None


def validate(settings: WebSettings) -> list[tuple[str, str]]:
    """The problems of ``settings`` as (``$.web.key``, what is wrong)."""
    problems: list[tuple[str, str]] = []
    try:
        AddressPolicy.from_settings(settings.allowNetworks)
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
