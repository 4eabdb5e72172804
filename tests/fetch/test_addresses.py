"""Which addresses a public server refuses to fetch from: a table of labelled cases."""
import ipaddress
import socket

import pytest

from appliance.fetch.addresses import first_refused, refusal, resolve


@pytest.mark.parametrize("address,reason", [
    ("8.8.8.8", None),
    ("93.184.216.34", None),
    ("2606:4700:4700::1111", None),
    ("::ffff:8.8.8.8", None),                       # mapped public IPv4 is public
    ("127.0.0.1", "a loopback address"),
    ("127.8.9.10", "a loopback address"),
    ("::1", "a loopback address"),
    ("10.0.0.5", "a private address"),
    ("172.16.0.1", "a private address"),
    ("192.168.1.1", "a private address"),
    ("fc00::1", "a private address"),
    ("fd12:3456::1", "a private address"),
    ("169.254.1.1", "a link-local address"),
    ("fe80::1", "a link-local address"),
    ("224.0.0.1", "a multicast address"),
    ("ff02::1", "a multicast address"),
    ("240.0.0.1", "a reserved address"),
    ("0.0.0.0", "an unspecified address"),
    ("::", "an unspecified address"),
    ("169.254.169.254", "a cloud metadata address"),
    ("fd00:ec2::254", "a cloud metadata address"),
    ("::ffff:169.254.169.254", "a cloud metadata address (as 169.254.169.254 inside IPv6)"),
    ("::ffff:127.0.0.1", "a loopback address (as 127.0.0.1 inside IPv6)"),
    ("::ffff:10.0.0.5", "a private address (as 10.0.0.5 inside IPv6)"),
    ("2002:7f00:1::", "a loopback address (as 127.0.0.1 inside IPv6)"),  # 6to4 wrapping 127.0.0.1
    ("2002:a9fe:a9fe::", "a cloud metadata address (as 169.254.169.254 inside IPv6)"),
    ("100.100.100.200", "a non-public address"),    # carrier-grade NAT range (Alibaba's metadata)
    ("192.0.2.1", "a private address"),             # documentation range
])
def test_refusal(address, reason):
    assert refusal(ipaddress.ip_address(address)) == reason


def test_resolve_keeps_order_drops_duplicates_and_other_families(monkeypatch):
    answers = [
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", 80)),
        (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("8.8.8.8", 80)),
        (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fe80::1%2", 80, 0, 2)),
    ]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answers)
    found = resolve("example.com", 80)
    assert [str(a.ip) for a in found] == ["8.8.8.8", "fe80::1"]
    assert found[1].sockaddr == ("fe80::1%2", 80, 0, 2)  # the scope id stays for connect()
    assert first_refused(found) == (ipaddress.ip_address("fe80::1"), "a link-local address")
    assert first_refused(found[:1]) is None


def test_resolve_of_a_literal_needs_no_dns():
    assert [str(a.ip) for a in resolve("127.0.0.1", 80)] == ["127.0.0.1"]
