"""The network policy of the web tools (``web_fetch``, ``web_search``, ``read`` of a URL):
which addresses a fetch may reach, and what one session's web tools share (``WebAccess``). The
settings (the ``web`` section of ``config.yml``) are ``omp.tools.web_settings``.

Off unless ``web.enabled: true``: a session with no network policy offers no web tool, and
``read`` of an ``http(s)://`` URL says which setting turns it on.

The address rule (``AddressPolicy``): a URL chosen by the model may reach only public
addresses. Every address its host resolves to is checked, after DNS resolution and again for
every redirect, and the connection is made to the address that was checked (no second lookup
a rebinding DNS server could answer differently). Refused unless a network of
``web.allowNetworks`` contains it: loopback, private (RFC 1918, fc00::/7), link-local (with the
cloud metadata address 169.254.169.254), shared (100.64/10), multicast, unspecified and
reserved addresses, i.e. whatever ``ipaddress`` does not call global. An IPv6 address that
carries an IPv4 address is judged as that IPv4 address (``embedded_ipv4``): IPv4-mapped
(``::ffff:0:0/96``), IPv4-compatible (``::/96``), NAT64 (the well-known ``64:ff9b::/96`` and the
local-use ``64:ff9b:1::/48``), 6to4 (``2002::/16``) and Teredo (``2001::/32``, its client
address); ``::7f00:1`` reaches 127.0.0.1 through a translator or a tunnel as surely as
``127.0.0.1`` does.

Imported only for a session with ``web.enabled`` (``omp.session.setup.web_access``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from ..llm.models import resolve_config_value
from .web_settings import Network, WebSettings, parse_networks

if TYPE_CHECKING:
    from ..llm.stream import HttpClient

_COMPATIBLE = ipaddress.IPv6Network("::/96")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses ``ip`` carries, by every IPv6 form that carries one (none: an IPv6
    address of its own).

    The local-use NAT64 prefix (RFC 8215) may be used at any RFC 6052 prefix length from /48 to
    /96, and nothing in the address says which: each place the IPv4 address could sit gives a
    candidate (the common /96 first), and the policy wants every one of them allowed. A place
    holding an address of 0.0.0.0/8 ("this network", never a destination: what the zeros of
    an unused place read as) is no candidate, unless every place holds one.
    """
    if (mapped := ip.ipv4_mapped) is not None:
        return (mapped,)
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _COMPATIBLE:
        # :: and ::1 are IPv6's own unspecified and loopback addresses, judged as themselves.
        return (low,) if int(ip) > 1 else ()
    if ip in _NAT64:
        return (low,)
    if ip in _NAT64_LOCAL:
        b = ip.packed  # RFC 6052 §2.2: byte 8 (bits 64-71) is always skipped
        places = dict.fromkeys(ipaddress.IPv4Address(part) for part in (
            b[12:16], b[9:13], b[7:8] + b[9:12], b[6:8] + b[9:11]))
        return tuple(a for a in places if a.packed[0]) or (low,)
    if (sixtofour := ip.sixtofour) is not None:
        return (sixtofour,)
    if (teredo := ip.teredo) is not None:
        return (teredo[1],)  # the client: the bitwise NOT of the last 32 bits, undone
    return ()


class AddressRefused(Exception):
    """A URL's host is, or resolves to, an address the policy does not allow."""


@attrs.frozen
class AddressPolicy:
    """Which addresses a model-chosen URL may reach."""

    allowed: tuple[Network, ...] = ()

    @classmethod
    def from_settings(cls, networks: list[str]) -> AddressPolicy:
        """Raises ValueError naming a network that does not parse."""
        return cls(parse_networks(networks))

    def check(self, host: str, address: str) -> None:
        """Raises AddressRefused when ``address`` (what ``host`` resolved to) is not public
        and no allowed network contains it."""
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
            address.partition("%")[0])  # a scope id (fe80::1%eth0) is link-local anyway
        carried = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else ()
        for ipv4 in carried or (ip,):
            self._check(host, ipv4)

    def _check(self, host: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
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
