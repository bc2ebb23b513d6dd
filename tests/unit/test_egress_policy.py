"""The egress allowlist, the SSRF address checks and request targets: pure.

How the proxy reads HTTP (h11, and what it refuses on top) is tested through the proxy
in ``tests/integration/test_egress_proxy.py``."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.errors import ErrorCode, PermissionDenied
from toolfleet.isolation.egress_policy import (
    EgressGrant,
    InvalidNetworkPermission,
    Target,
    is_public_address,
    parse_host,
    parse_permission,
    parse_target,
)

pytestmark = pytest.mark.unit


def grant(*entries: str) -> EgressGrant:
    return EgressGrant.from_permissions(
        invocation_id="inv-1", tenant_id="t1", network_permissions=entries
    )


def ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


# --- grant entries ---------------------------------------------------------------------


def test_an_empty_grant_admits_nothing() -> None:
    g = grant()
    assert not g.allows_network
    assert grant("example.com").allows_network
    assert not g.admits("example.com", 443)
    assert not g.admits(ip("93.184.216.34"), 443)


@pytest.mark.parametrize(
    ("entry", "host", "port", "admitted"),
    [
        ("api.example.com", "api.example.com", 443, True),
        ("api.example.com", "api.example.com", 80, True),
        ("api.example.com", "api.example.com", 8443, False),
        ("API.Example.COM.", "api.example.com", 443, True),
        ("api.example.com", "example.com", 443, False),
        ("api.example.com", "x.api.example.com", 443, False),
        ("api.example.com:8443", "api.example.com", 8443, True),
        ("api.example.com:8443", "api.example.com", 443, False),
        ("api.example.com:*", "api.example.com", 22, True),
        ("*.example.com", "a.example.com", 443, True),
        ("*.example.com", "a.b.example.com", 443, True),
        ("*.example.com", "example.com", 443, False),
        ("*.example.com", "badexample.com", 443, False),
        ("*.example.com", "a.example.com.evil.net", 443, False),
        ("*.example.com", "a.example.com", 22, False),
        ("*.example.com:*", "a.example.com", 22, True),
        ("*", "anything.net", 443, True),
        ("*", "anything.net", 22, False),
        ("*:*", "anything.net", 22, True),
    ],
)
def test_name_entries(entry: str, host: str, port: int, admitted: bool) -> None:
    assert grant(entry).admits(parse_host(host), port) is admitted


@pytest.mark.parametrize(
    ("entry", "host", "port", "admitted"),
    [
        ("93.184.216.34", "93.184.216.34", 443, True),
        ("93.184.216.34", "93.184.216.35", 443, False),
        ("127.0.0.1:8080", "127.0.0.1", 8080, True),
        ("127.0.0.1:8080", "127.0.0.1", 8081, False),
        ("10.0.0.0/8:5432", "10.20.30.40", 5432, True),
        ("10.0.0.0/8:5432", "11.0.0.1", 5432, False),
        ("[2001:db8::1]:443", "[2001:db8::1]", 443, True),
        ("2001:db8::1", "[2001:db8::1]", 80, True),
        ("[::1]:*", "[::1]", 9, True),
    ],
)
def test_address_entries(entry: str, host: str, port: int, admitted: bool) -> None:
    assert grant(entry).admits(parse_host(host), port) is admitted


def test_an_address_entry_admits_no_name_and_a_name_entry_no_address() -> None:
    assert not grant("127.0.0.1:8080").admits("localhost", 8080)
    assert not grant("127.0.0.1").admits("example.com", 443)
    assert not grant("localhost:8080").admits(ip("127.0.0.1"), 8080)
    assert not grant("*.example.com").admits(ip("93.184.216.34"), 443)


@pytest.mark.parametrize(
    "entry",
    [
        "",
        ":443",
        "example.com:0",
        "example.com:65536",
        "example.com:+80",
        "example.com:http",
        "ex ample.com",
        "exa_mple..com",
        "*.*.example.com",
        "a.*.example.com",
        "*example.com",
        "bücher.de",
        "10.0.0.1/8",
        "[example.com]:443",
        "[::1",
        "[::1]x",
        "127.1",
        "2130706433",
        "0x7f.0.0.1",
        "http://example.com",
        "example.com/path",
    ],
)
def test_malformed_entries_are_refused(entry: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the parser says only "malformed"
        parse_permission(entry)


def test_one_malformed_entry_refuses_the_grant_without_quoting_it() -> None:
    with pytest.raises(InvalidNetworkPermission) as info:
        grant("api.example.com", "sk-live-not-a-host!")
    assert isinstance(info.value, PermissionDenied)
    assert info.value.code is ErrorCode.PERMISSION_DENIED
    assert "entry 1" in str(info.value)
    assert "sk-live" not in str(info.value)


@given(st.text(max_size=80))
def test_any_entry_parses_or_raises_value_error(entry: str) -> None:
    try:
        rule = parse_permission(entry)
    except ValueError:
        return
    assert rule.kind in {"name", "suffix", "any", "address"}


# --- SSRF: which addresses are public ---------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "0.0.0.0",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",  # cloud metadata
        "100.100.100.200",  # Alibaba metadata
        "169.254.1.1",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "::",
        "::1",
        "fe80::1",
        "fc00::1",
        "fd00:ec2::254",  # AWS metadata over IPv6
        "ff02::1",
        "ff0e::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::",  # 6to4 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "::127.0.0.1",  # IPv4-compatible of 127.0.0.1 (issue 32)
        "::7f00:1",
        "::a9fe:a9fe",  # IPv4-compatible of 169.254.169.254
        "::ffff:0:7f00:1",  # IPv4-translated (SIIT) of 127.0.0.1
        "64:ff9b:1::7f00:1",  # local-use NAT64
        "64:ff9b:1:2:3::",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1
        "2001:db8::5efe:7f00:1",  # ISATAP interface id of 127.0.0.1
        "2a00:1450::200:5efe:a9fe:a9fe",  # ISATAP (global prefix) of the metadata service
    ],
)
def test_non_public_addresses(address: str) -> None:
    assert not is_public_address(ip(address))


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34",
        "8.8.8.8",
        "1.1.1.1",
        "2606:4700:4700::1111",
        "64:ff9b::808:808",
        "::ffff:8.8.8.8",
        "2002:808:808::1",
    ],
)
def test_public_addresses(address: str) -> None:
    assert is_public_address(ip(address))


_NON_PUBLIC_V4 = st.sampled_from(
    ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
     "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"]
).flatmap(
    lambda net: st.integers(
        int(ipaddress.IPv4Network(net).network_address),
        int(ipaddress.IPv4Network(net).broadcast_address),
    )
)  # fmt: skip


def _embeddings(v4: int) -> list[ipaddress.IPv6Address]:
    """Every IPv6 form that carries ``v4``, in a public-looking prefix where one is needed."""
    teredo_client = v4 ^ 0xFFFFFFFF  # Teredo stores the client's address inverted
    return [
        ipaddress.IPv6Address(v4),  # ::a.b.c.d
        ipaddress.IPv6Address((0xFFFF << 32) | v4),  # ::ffff:a.b.c.d
        ipaddress.IPv6Address((0xFFFF0000 << 32) | v4),  # ::ffff:0:a.b.c.d
        ipaddress.IPv6Address((0x0064FF9B << 96) | v4),  # 64:ff9b::a.b.c.d
        ipaddress.IPv6Address((0x2002 << 112) | (v4 << 80)),  # 2002:ab:cd::
        ipaddress.IPv6Address((0x20010000 << 96) | (0x08080808 << 64) | teredo_client),
        ipaddress.IPv6Address((0x2A001450 << 96) | (0x5EFE << 32) | v4),  # ISATAP
    ]


@given(_NON_PUBLIC_V4)
def test_no_ipv6_form_of_a_non_public_ipv4_address_is_public(v4: int) -> None:
    for address in _embeddings(v4):
        assert not is_public_address(address), address
    assert grant("*:*").reachable(_embeddings(v4), 443) == ()


@given(st.integers(0, 2**32 - 1))
def test_an_embedded_address_is_never_more_public_than_the_ipv4_it_carries(v4: int) -> None:
    if not is_public_address(ipaddress.IPv4Address(v4)):
        assert not any(is_public_address(a) for a in _embeddings(v4))


def test_a_name_grant_never_reaches_loopback_or_metadata() -> None:
    g = grant("api.example.com", "*.example.com", "*")
    assert g.reachable([ip("127.0.0.1")], 443) == ()
    assert g.reachable([ip("169.254.169.254")], 80) == ()
    assert g.reachable([ip("::1"), ip("10.0.0.1")], 443) == ()


def test_a_non_public_address_is_reachable_when_the_grant_names_it() -> None:
    g = grant("svc.internal:8080", "127.0.0.1:8080", "10.0.0.0/8:5432")
    assert g.reachable([ip("127.0.0.1")], 8080) == (ip("127.0.0.1"),)
    assert g.reachable([ip("127.0.0.1")], 8081) == ()
    assert g.reachable([ip("10.9.9.9")], 5432) == (ip("10.9.9.9"),)
    assert g.reachable([ip("::1")], 8080) == ()


def test_only_checked_addresses_are_kept_in_order() -> None:
    g = grant("api.example.com")
    found = [ip("127.0.0.1"), ip("93.184.216.34"), ip("169.254.169.254"), ip("8.8.8.8")]
    assert g.reachable(found, 443) == (ip("93.184.216.34"), ip("8.8.8.8"))


# --- targets ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Example.COM", "example.com"),
        ("example.com.", "example.com"),
        ("xn--bcher-kva.de", "xn--bcher-kva.de"),
        ("127.0.0.1", ip("127.0.0.1")),
        ("[::1]", ip("::1")),
        ("::1", ip("::1")),
    ],
)
def test_hosts_are_normalized(text: str, expected: object) -> None:
    assert parse_host(text) == expected


@pytest.mark.parametrize(
    "text", ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "[127.0.0.1]", "a..b", "", "a b"]
)
def test_ambiguous_hosts_are_refused(text: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        parse_host(text)


# --- request targets -----------------------------------------------------------------------


def test_connect_target() -> None:
    assert parse_target("CONNECT", "API.example.com:443") == Target(
        host="api.example.com", port=443
    )
    v6 = parse_target("CONNECT", "[2001:db8::1]:8443")
    assert (v6.host, v6.port, v6.path) == (ip("2001:db8::1"), 8443, "")


def test_absolute_uri_target() -> None:
    target = parse_target("GET", "http://example.com/a/b?c=d#frag")
    assert (target.host, target.port, target.path, target.authority) == (
        "example.com",
        80,
        "/a/b?c=d",
        "example.com",
    )
    assert parse_target("GET", "http://example.com").path == "/"
    assert parse_target("GET", "http://example.com?x=1").path == "/?x=1"
    other = parse_target("POST", "HTTP://[::1]:8080/x")
    assert (other.host, other.port, other.authority) == (ip("::1"), 8080, "[::1]:8080")


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/relative"),
        ("GET", "https://example.com/"),
        ("GET", "ftp://example.com/"),
        ("GET", "http://user:pw@example.com/"),
        ("GET", "http://exa\x01mple.com/"),
        ("GET", "http://127.1/"),
        ("GET", "http://example.com:0/"),
        ("GET", "http:///path"),
        ("CONNECT", "example.com"),
        ("CONNECT", "example.com:99999"),
        ("CONNECT", "127.1:80"),
        ("CONNECT", "[::1:80"),
        ("CONNECT", "http://example.com:80/"),
    ],
)
def test_malformed_targets(method: str, target: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - the proxy answers 400 with the message
        parse_target(method, target)


@given(st.sampled_from(["GET", "CONNECT"]), st.text(max_size=120))
def test_any_target_parses_or_raises_value_error(method: str, text: str) -> None:
    try:
        target = parse_target(method, text)
    except ValueError:
        return
    assert 0 < target.port < 65536
    assert target.path == "" if method == "CONNECT" else target.path.startswith("/")
