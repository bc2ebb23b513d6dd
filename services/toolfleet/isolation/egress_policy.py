"""Egress policy, pure: which hosts a token grants, which addresses are public, and
where a proxy request asks to go. No I/O; :mod:`toolfleet.isolation.egress` applies it.

Grant entries (a token's ``network_permissions``), case-insensitive::

    api.example.com           ports 80 and 443
    api.example.com:8443      that port only (``:*``: any port)
    *.example.com             any name under example.com, not example.com itself
    *                         any public host (private addresses stay refused)
    93.184.216.34, [2001:db8::1]:443, 10.0.0.0/8:5432   addresses and networks

A non-public address (private, loopback, link-local, multicast, reserved, metadata,
or any IPv6 form carrying such an IPv4 address) is reachable only when an address entry
names it: granting a name alone never reaches loopback or the cloud metadata service.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from toolfleet.errors import PermissionDenied

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Host = str | IPAddress
"""A normalized target host: a lower-case name without trailing dot, or an address."""

WEB_PORTS = frozenset({80, 443})
"""The ports a grant entry without a port admits."""
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
"""Cloud metadata services (also covered by the link-local / private checks)."""

_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")


class InvalidNetworkPermission(PermissionDenied):
    """A ``network_permissions`` entry of the token cannot be read: nothing is granted."""


# --- grants ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRule:
    """One parsed ``network_permissions`` entry."""

    kind: Literal["name", "suffix", "any", "address"]
    name: str = ""
    """``name``: the host; ``suffix``: ``.example.com`` for ``*.example.com``."""
    network: IPNetwork | None = None
    """``address``: the address or network granted."""
    ports: frozenset[int] | None = WEB_PORTS
    """Ports admitted; ``None``: any."""

    def admits(self, host: Host, port: int) -> bool:
        if self.ports is not None and port not in self.ports:
            return False
        if self.kind == "any":
            return True
        if self.kind == "name":
            return host == self.name
        if self.kind == "suffix":
            return isinstance(host, str) and host.endswith(self.name)
        return not isinstance(host, str) and self.network is not None and host in self.network

    def unlocks(self, address: IPAddress, port: int) -> bool:
        """Whether this entry names ``address`` literally (so it may be non-public)."""
        return (
            self.network is not None
            and address in self.network
            and (self.ports is None or port in self.ports)
        )


def parse_permission(entry: str) -> HostRule:
    """One grant entry (see the module docstring), or :class:`ValueError`."""
    text = entry.strip().lower()
    host_text, port_text = _split_host_port(text)
    if port_text is None:
        ports: frozenset[int] | None = WEB_PORTS
    elif port_text == "*":
        ports = None
    else:
        ports = frozenset({_port(port_text)})
    if host_text == "*":
        return HostRule(kind="any", ports=ports)
    if host_text.startswith("*."):
        return HostRule(kind="suffix", name="." + _name(host_text[2:]), ports=ports)
    try:
        network = ipaddress.ip_network(host_text, strict=True)
    except ValueError:
        return HostRule(kind="name", name=_name(host_text), ports=ports)
    return HostRule(kind="address", network=network, ports=ports)


@dataclass(frozen=True, slots=True, kw_only=True)
class EgressGrant:
    """What one invocation may reach: the token's ``network_permissions``, parsed."""

    invocation_id: str
    tenant_id: str
    rules: tuple[HostRule, ...] = ()
    """Empty: no network at all."""

    @classmethod
    def from_permissions(
        cls, *, invocation_id: str, tenant_id: str, network_permissions: Iterable[str]
    ) -> EgressGrant:
        """Parse the token's entries; one unreadable entry refuses the whole grant.

        Raises :class:`InvalidNetworkPermission` naming the entry's position (not its text).
        """
        rules = []
        for index, entry in enumerate(network_permissions):
            try:
                rules.append(parse_permission(entry))
            except ValueError:
                raise InvalidNetworkPermission(
                    f"network_permissions entry {index} is malformed"
                ) from None
        return cls(invocation_id=invocation_id, tenant_id=tenant_id, rules=tuple(rules))

    @property
    def allows_network(self) -> bool:
        """False when the token names no host: run the sandbox without any session."""
        return bool(self.rules)

    def admits(self, host: Host, port: int) -> bool:
        """Whether an entry names this host (or address) and port."""
        return any(rule.admits(host, port) for rule in self.rules)

    def reachable(self, addresses: Sequence[IPAddress], port: int) -> tuple[IPAddress, ...]:
        """Of a name's addresses, those it may connect to: public ones, and non-public
        ones an address entry names literally."""
        return tuple(
            a
            for a in addresses
            if is_public_address(a) or any(r.unlocks(a, port) for r in self.rules)
        )


def is_public_address(address: IPAddress) -> bool:
    """False for private, loopback, link-local, multicast, reserved and metadata
    addresses, including IPv4 ones embedded in IPv6 (:func:`embedded_ipv4`), and for
    the local-use NAT64 prefix ``64:ff9b:1::/48``."""
    candidates: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address in _LOCAL_NAT64:
            return False
        candidates += embedded_ipv4(address)
    return not any(a.is_multicast or not a.is_global or a in METADATA_ADDRESSES for a in candidates)


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """The IPv4 addresses an IPv6 address carries, in every form that may deliver to
    them: IPv4-compatible (``::127.0.0.1``, deprecated but still routed by some stacks),
    IPv4-mapped (``::ffff:127.0.0.1``), IPv4-translated (``::ffff:0:127.0.0.1``), NAT64
    (``64:ff9b::7f00:1``), 6to4 (``2002:7f00:1::``), Teredo (server and client) and an
    ISATAP interface id (``...:0:5efe:7f00:1``). An address is judged as each of them too.
    """
    value = int(address)
    low32 = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    found: list[ipaddress.IPv4Address] = []
    if value >> 32 == 0 or value >> 32 == 0xFFFF or value >> 32 == 0xFFFF0000:
        found.append(low32)  # compatible (``::`` and ``::1`` included), mapped, translated
    if address in _NAT64:
        found.append(low32)
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found += address.teredo
    if (value >> 32) & 0xFDFFFFFF == 0x5EFE:
        found.append(low32)  # ISATAP: ``0000:5efe`` or ``0200:5efe`` before the IPv4
    return tuple(found)


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")
"""RFC 8215: NAT64 inside one network, the IPv4 anywhere from bit 48 on; never public."""


def parse_host(text: str) -> Host:
    """A target host as sent (``Example.COM.``, ``[::1]``, ``10.0.0.1``), normalized;
    :class:`ValueError` when it is neither a DNS name nor an address."""
    if text.startswith("[") and text.endswith("]"):
        address = ipaddress.ip_address(text[1:-1])
        if not isinstance(address, ipaddress.IPv6Address):
            raise ValueError("brackets hold IPv6 addresses only")
        return address
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return _name(text)


def _name(text: str) -> str:
    name = text.lower().removesuffix(".")
    labels = name.split(".")
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError("not a DNS name")
    # 127.1, 0x7f.1 or 2130706433 are addresses to some resolvers: never names here.
    if labels[-1].isdigit() or labels[-1].startswith("0x"):
        raise ValueError("numeric top-level label")
    return name


def _split_host_port(text: str) -> tuple[str, str | None]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("unclosed bracket")
        rest = text[end + 1 :]
        if (rest and not rest.startswith(":")) or ":" not in text[:end]:
            raise ValueError("brackets hold IPv6 addresses only")
        return text[1:end], (rest[1:] if rest else None)
    if text.count(":") > 1:  # a bare IPv6 address (or network): no port
        return text, None
    host, sep, port = text.partition(":")
    return host, (port if sep else None)


def _port(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 5:
        raise ValueError("bad port")
    port = int(text)
    if not 0 < port < 65536:
        raise ValueError("port out of range")
    return port


# --- request targets ------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where a proxy request goes."""

    host: Host
    port: int
    path: str = ""
    """Origin-form path and query to forward; empty for ``CONNECT``."""

    @property
    def host_text(self) -> str:
        return str(self.host)

    @property
    def authority(self) -> str:
        """``host[:port]`` for the forwarded ``Host`` field (port 80 left out)."""
        host = f"[{self.host}]" if isinstance(self.host, ipaddress.IPv6Address) else self.host_text
        return host if self.port == 80 else f"{host}:{self.port}"


def parse_target(method: str, target: str) -> Target:
    """The request-target of ``CONNECT host:port`` or of an absolute ``http://`` URI
    (userinfo refused, fragment dropped); :class:`ValueError` for anything else."""
    if method == "CONNECT":
        host_text, port_text = _split_host_port(target)
        if port_text is None:
            raise ValueError("CONNECT needs host:port")
        return Target(host=parse_host(host_text), port=_port(port_text))
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        raise ValueError("only absolute http:// URIs are forwarded (use CONNECT)")
    rest = rest.partition("#")[0]
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        raise ValueError("credentials in the URI are not forwarded")
    host_text, port_text = _split_host_port(authority)
    port = 80 if port_text is None else _port(port_text)
    return Target(
        host=parse_host(host_text), port=port, path=path if path[:1] == "/" else "/" + path
    )
