"""The address this host is reached by from another: the source address of its route to that host.

Used where a process must advertise itself to peers on other hosts (the trainer's torchrun rendezvous,
a rollout worker's weight relay): the host name may not resolve elsewhere, and a bind address of
0.0.0.0 is no address at all."""

from __future__ import annotations

import socket


def address_toward(host: str, port: int = 9) -> str:
    """This host's IPv4 address on the route to `host` (a UDP connect: no packet is sent); the host name
    when there is no route."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), port))
            return s.getsockname()[0]
    except OSError:
        return socket.gethostname()
