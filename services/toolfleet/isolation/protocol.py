"""The RPC between the executor and an isolated worker: length-prefixed JSON frames.

One ``AF_UNIX`` stream socket pair per worker (the worker's end is its fd 3). Each frame
is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON (one object).

    worker -> executor   {"kind": "ready", "cpu_s": float}            started, waiting
                         {"kind": "call", "id": n, "method": "checkpoint" | "credential"
                                          | "documents.get" | "documents.metadata"
                                          | "documents.search" | "documents.overlaps",
                                          "args": {...}}
                         {"kind": "done", "result": {...}} | {"kind": "done", "error": {...}}
    executor -> worker   {"kind": "run", ...job...}
                         {"kind": "reply", "id": n, "value": ...} | {..., "error": {...}}
                         {"kind": "cancel"}

A frame larger than :data:`MAX_FRAME_BYTES` ends the run (``resource_exhausted``).
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

#: Largest frame either side accepts (a result travels in one frame).
MAX_FRAME_BYTES = 64 * 1024 * 1024

_HEADER = struct.Struct(">I")


class ProtocolError(ValueError):
    """A frame that cannot be read: too large, not JSON, or not an object."""


def encode(message: dict[str, Any]) -> bytes:
    """One frame holding ``message``."""
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(body)} bytes is over {MAX_FRAME_BYTES}")
    return _HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("frame is not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


def body_length(header: bytes) -> int:
    """The body length a 4-byte header announces (checked against the maximum)."""
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {length} bytes is over {MAX_FRAME_BYTES}")
    return int(length)


HEADER_BYTES = _HEADER.size


class FrameDecoder:
    """Incremental decoder: feed it bytes as they arrive, get whole frames back."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        frames: list[dict[str, Any]] = []
        while len(self._buffer) >= HEADER_BYTES:
            length = body_length(bytes(self._buffer[:HEADER_BYTES]))
            end = HEADER_BYTES + length
            if len(self._buffer) < end:
                break
            frames.append(decode_body(bytes(self._buffer[HEADER_BYTES:end])))
            del self._buffer[:end]
        return frames


def read_frame(fd: int) -> dict[str, Any] | None:
    """Blocking read of one frame from ``fd`` (the worker's side); None at end of file."""
    header = _read_exact(fd, HEADER_BYTES)
    if header is None:
        return None
    body = _read_exact(fd, body_length(header))
    if body is None:
        raise ProtocolError("connection closed inside a frame")
    return decode_body(body)


def write_frame(fd: int, message: dict[str, Any]) -> None:
    """Blocking write of one frame to ``fd`` (the worker's side)."""
    data = memoryview(encode(message))
    while data:
        written = os.write(fd, data)
        data = data[written:]


def _read_exact(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, min(size - len(chunks), 1 << 20))
        if not chunk:
            if chunks:
                raise ProtocolError("connection closed inside a frame")
            return None
        chunks += chunk
    return bytes(chunks)
