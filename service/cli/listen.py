"""The gateway's listening sockets, bound before anything else happens.

``serve`` and ``quickstart`` bind (and listen on) their address first and hand the sockets
to uvicorn: a busy port is one ``error:`` line before any model loads or any banner says
"serving on", and no other process can take the port while the model loads.
"""

from __future__ import annotations

import errno
import socket
from typing import Callable

from service.cli.app import CliError

BACKLOG = 2048  # uvicorn's default


def display(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _bind(family: int, kind: int, proto: int, address: tuple) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a port whose previous server's connections linger in TIME_WAIT
        # is free; one with a listening socket is not (Linux refuses the bind).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _open(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on every address ``host`` resolves to (as asyncio's create_server,
    which uvicorn would otherwise call); an address family the machine lacks is skipped."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            try:
                sockets.append(_bind(family, kind, proto, address))
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL and len(infos) > 1:
                    continue
                raise
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    if not sockets:
        raise OSError(errno.EADDRNOTAVAIL, "no usable address")
    return sockets


def _free_port_near(host: str, port: int) -> int | None:
    for candidate in range(port + 1, min(port + 50, 65535) + 1):
        try:
            for sock in _open(host, candidate):
                sock.close()
            return candidate
        except OSError:
            continue
    return None


def listen(host: str, port: int, *, how_to_pick: Callable[[int | None], str]) -> list[socket.socket]:
    """Listening sockets for ``host:port``, or :class:`CliError` saying why not and how to
    choose another port (``how_to_pick(a free port nearby, or None)``)."""
    where = display(host, port)
    try:
        return _open(host, port)
    except socket.gaierror as exc:
        raise CliError(f"cannot listen on {host!r}: {exc.strerror}; give an address of this machine "
                       f"(--host 127.0.0.1, or 0.0.0.0 for every interface)") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CliError(f"{where} is already in use (another server listens there, perhaps a Hallmark "
                           f"started earlier); {how_to_pick(_free_port_near(host, port))}") from None
        if exc.errno == errno.EACCES:
            raise CliError(f"cannot listen on {where}: permission denied (ports below 1024 need privileges); "
                           f"{how_to_pick(_free_port_near(host, max(port, 1024)))}") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise CliError(f"cannot listen on {where}: {host} is not an address of this machine; "
                           f"use --host 127.0.0.1 (or 0.0.0.0 for every interface)") from None
        raise CliError(f"cannot listen on {where}: {exc.strerror or exc}") from None
