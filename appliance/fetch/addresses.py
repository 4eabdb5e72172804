"""Resolve a host once and say which of its addresses a public server must not fetch from.

Pure functions: `resolve` is getaddrinfo reshaped, `refusal` judges one address. The caller connects
to the addresses `resolve` returned, never to a second lookup, so a DNS answer that changes between
the check and the connect (DNS rebinding) cannot move the request to a refused address.
"""
from __future__ import annotations

import ipaddress
import socket
from typing import NamedTuple, Optional, Sequence, Union

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]

# Cloud instance metadata (AWS, GCP, Azure, OpenStack on 169.254.169.254; AWS's IPv6 endpoint). Named
# apart from link-local / private so the message says why the address matters.
METADATA_ADDRESSES = frozenset({ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")})


class Address(NamedTuple):
    family: int          # socket.AF_INET or AF_INET6
    sockaddr: tuple      # what socket.connect takes
    ip: IPAddress


def resolve(host: str, port: int) -> list[Address]:
    """Every TCP address `host` resolves to, in getaddrinfo's order. Raises socket.gaierror."""
    found = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                       proto=socket.IPPROTO_TCP):
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        address = Address(family, sockaddr, ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
        if address not in found:
            found.append(address)
    if not found:
        raise socket.gaierror(socket.EAI_NONAME, "no IPv4 or IPv6 address")
    return found


def refusal(ip: IPAddress) -> Optional[str]:
    """Why a public server must not connect to `ip` ("a loopback address", ...), or None if it is public.

    IPv4 addresses carried inside IPv6 (::ffff:a.b.c.d, 6to4 2002:a.b.c.d::) are judged as the IPv4
    address, so ::ffff:127.0.0.1 is loopback and ::ffff:8.8.8.8 is fine.
    """
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour
        if inner is not None:
            reason = refusal(inner)
            return None if reason is None else f"{reason} (as {inner} inside IPv6)"
    for flag, reason in (("is_unspecified", "an unspecified address"), ("is_loopback", "a loopback address"),
                         ("is_link_local", "a link-local address"), ("is_multicast", "a multicast address"),
                         ("is_reserved", "a reserved address"), ("is_private", "a private address")):
        if getattr(ip, flag):
            return reason
    if not ip.is_global:  # e.g. 100.64.0.0/10 (carrier-grade NAT; Alibaba's metadata is 100.100.100.200)
        return "a non-public address"
    return None


def first_refused(addresses: Sequence[Address]) -> Optional[tuple[IPAddress, str]]:
    """The first address that is refused, with the reason; None when all are public."""
    for address in addresses:
        reason = refusal(address.ip)
        if reason is not None:
            return address.ip, reason
    return None
