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

The job (:class:`RunJob`) and the worker's answer (:class:`Done`) are typed: the executor
builds and the worker validates the one, the worker builds and the executor validates
the other. Their JSON is the frames above, key for key.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolfleet.errors import ErrorInfo

#: Largest frame either side accepts (a result travels in one frame).
MAX_FRAME_BYTES = 64 * 1024 * 1024

_HEADER = struct.Struct(">I")


class ProtocolError(ValueError):
    """A frame that cannot be read: too large, not JSON, or not an object."""


class JobLimits(BaseModel):
    """The limits the worker sets with ``setrlimit`` before the tool runs."""

    model_config = ConfigDict(frozen=True)

    cpu_seconds: int
    memory_mb: int
    max_processes: int
    max_file_mb: int
    max_open_files: int
    max_output_bytes: int


class RunJob(BaseModel):
    """``{"kind": "run", ...}``: the one job a worker runs (executor -> worker)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["run"] = "run"
    tool_id: str
    target: str = ""
    """``module:qualname`` of a Python tool."""
    command: list[str] = Field(default_factory=list)
    """The executable and its arguments, for a command tool."""
    parameters: dict[str, Any]
    limits: JobLimits
    env: dict[str, str] = Field(default_factory=dict)
    """The tool's whole environment."""
    sys_path: list[str]
    """The worker's import path once the limits are set."""
    egress_socket: str | None = None
    """The egress proxy's socket inside the sandbox (None: no network)."""
    tenant_id: str
    agent_did: str
    invocation_id: str
    tool_version: str
    attempt: int = 1
    resume_state: dict[str, Any] | None = None
    checkpointing: bool = False
    """Whether ``ctx.checkpoint()`` saves (else it is a no-op in the worker)."""
    credentials: bool = False
    """Whether ``ctx.credential()`` may ask the executor."""
    connection_id: str | None = None


class ReportedUsage(BaseModel):
    """What the worker measured of itself (``getrusage``) just before it answered."""

    model_config = ConfigDict(frozen=True)

    cpu_s: float = 0.0
    maxrss_kb: int = 0


class Done(BaseModel):
    """``{"kind": "done", "usage": ..., "result" | "error": ...}`` (worker -> executor).

    ``usage`` is None in a frame a worker did not finish (it answered, then died): the
    executor reaps it and measures it itself."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["done"] = "done"
    usage: ReportedUsage | None = None
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None

    @model_validator(mode="after")
    def _one_answer(self) -> Done:
        if (self.result is None) == (self.error is None):
            raise ValueError("a done frame holds a result or an error")
        return self

    def frame(self) -> dict[str, Any]:
        """The frame's JSON object: ``usage`` and ``result`` or ``error`` only when set."""
        frame: dict[str, Any] = {"kind": self.kind}
        if self.usage is not None:
            frame["usage"] = self.usage.model_dump(mode="json")
        if self.result is not None:
            frame["result"] = self.result
        if self.error is not None:
            frame["error"] = self.error.model_dump(mode="json")
        return frame


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
