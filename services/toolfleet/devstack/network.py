"""Choosing local TCP ports: the conventional one when free, any free one otherwise."""

from __future__ import annotations

import socket


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind ``host:port`` right now."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel considers free (races are possible but rare on a laptop)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def preferred_port(port: int, host: str = "127.0.0.1") -> int:
    """``port`` if it is free, else any free port."""
    return port if port_is_free(port, host) else free_port(host)
