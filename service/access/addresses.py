"""Who a public caller is: the client address, and the groups budgets and families count.

The client is the TCP peer, unless the peer is one of the operator's trusted proxies
(``trusted_proxies``; none by default): then ``X-Forwarded-For`` is read from the right, and
the first address that is not itself a trusted proxy is the client (everything left of it
was written by the client and proves nothing). ``hallmark serve`` turns uvicorn's own
proxy-header handling off (by default uvicorn believes ``X-Forwarded-For`` from 127.0.0.1,
so every new value was a fresh public principal: issue 31).

An address counts as its **group** (an IPv4 address; an IPv6 /64 by default: one
subscriber's network holds 2^64 addresses) and its **wide group** (an IPv4 /24, an IPv6
/48): budgets are charged to both, and probe families are kept per wide group, so walking
the addresses of one network buys neither budget nor families.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(value: str | Iterable[str] | None) -> tuple[Network, ...]:
    """``10.0.0.5, 10.1.0.0/16, ::1`` -> networks (ValueError naming a bad one)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"{item!r} is not an IP address or network (e.g. 10.0.0.5 or 10.1.0.0/16)") from None
    return tuple(out)


def _address(value: str | None):
    if not value:
        return None
    value = value.strip()
    if value.startswith("[") and "]" in value:  # [v6]:port
        value = value[1:value.index("]")]
    elif value.count(":") == 1:  # v4:port
        value = value.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _trusted(address, proxies: tuple[Network, ...]) -> bool:
    return address is not None and any(address.version == net.version and address in net for net in proxies)


def client_address(peer: str | None, forwarded_for: str | None, proxies: tuple[Network, ...]) -> str | None:
    """The client's address: the peer's, or through trusted proxies ``X-Forwarded-For``'s
    rightmost address that is not a trusted proxy (None: unknown)."""
    address = _address(peer)
    if not _trusted(address, proxies) or not forwarded_for:
        return str(address) if address is not None else None
    for hop in reversed(forwarded_for.split(",")):
        found = _address(hop)
        if found is None:
            return str(address)  # a malformed hop: stop believing the chain at the last proxy
        if not _trusted(found, proxies):
            return str(found)
        address = found
    return str(address)


@dataclass(frozen=True)
class Groups:
    group: str
    """What one caller is: ``198.51.100.7/32``, ``2001:db8:1:2::/64``."""
    wide: str
    """What one network is: ``198.51.100.0/24``, ``2001:db8:1::/48``."""


def groups(address: str | None, *, ipv6_group: int = 64, ipv4_wide: int = 24, ipv6_wide: int = 48) -> Groups:
    found = _address(address)
    if found is None:
        return Groups("unknown", "unknown")
    if found.version == 4:
        return Groups(f"{found}/32", str(ipaddress.ip_network(f"{found}/{ipv4_wide}", strict=False)))
    return Groups(str(ipaddress.ip_network(f"{found}/{ipv6_group}", strict=False)),
                  str(ipaddress.ip_network(f"{found}/{min(ipv6_wide, ipv6_group)}", strict=False)))
