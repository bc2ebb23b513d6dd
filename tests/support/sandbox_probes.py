"""Tools that probe the sandbox's boundary from inside (syscalls, the CA bundle), for
the isolation tests. Their syscall numbers are the kernel's own tables, kept apart from
the filter's so a wrong number there shows here."""

from __future__ import annotations

import ctypes
import json
import os
import platform

from pydantic import BaseModel

from toolfleet.sdk import Sandbox, ToolContext, tool

#: name -> (x86_64, aarch64) number, from ``asm/unistd_64.h`` and ``asm-generic/unistd.h``;
#: None where the architecture has no such call.
SYSCALLS: dict[str, tuple[int, int | None]] = {
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "modify_ldt": (154, None),
    "fanotify_init": (300, 262),
    "mbind": (237, 235),
    "migrate_pages": (256, 238),
    "move_pages": (279, 239),
    "set_mempolicy": (238, 237),
    "process_madvise": (440, 440),
    "pidfd_getfd": (438, 438),
    "userfaultfd": (323, 282),
    "perf_event_open": (298, 241),
    "bpf": (321, 280),
    "open_by_handle_at": (304, 265),
    "process_vm_readv": (310, 270),
    "getpid": (39, 172),
}

#: Arguments the kernel answers with something other than EPERM when no filter stands in
#: the way (an invalid fd, zero lengths, an unprivileged fanotify group), each harmless.
_ARGS: dict[str, tuple[int, ...]] = {
    "io_uring_setup": (1, 0),
    "io_uring_enter": (2**31 - 1, 0, 0, 0, 0, 0),
    "io_uring_register": (2**31 - 1, 0, 0, 0),
    "modify_ldt": (0, 0, 0),
    "fanotify_init": (0x200, 0),  # FAN_CLASS_NOTIF | FAN_REPORT_FID: allowed unprivileged
    "pidfd_getfd": (2**31 - 1, 0, 0),
    "process_madvise": (2**31 - 1, 0, 0, 0, 0),
    "userfaultfd": (0x7FFFFFFF,),  # invalid flags
    "bpf": (2**31 - 1, 0, 0),
    "open_by_handle_at": (2**31 - 1, 0, 0),
}


class Names(BaseModel):
    names: list[str]


class Text(BaseModel):
    text: str = ""


class Empty(BaseModel):
    pass


@tool(
    id="probe__syscalls",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["text"],
    timeout_seconds=10,
    sandbox=Sandbox(isolation="sandbox"),
)
async def syscalls(params: Names, ctx: ToolContext) -> Text:
    """``{name: [return value, errno]}`` of each syscall made with harmless arguments."""
    libc = ctypes.CDLL(None, use_errno=True)
    column = 0 if platform.machine() == "x86_64" else 1
    answers: dict[str, list[int]] = {}
    for name in params.names:
        number = SYSCALLS[name][column]
        if number is None:
            continue
        ctypes.set_errno(0)
        args = [ctypes.c_long(a) for a in _ARGS.get(name, (0, 0, 0, 0, 0, 0))]
        result = int(libc.syscall(ctypes.c_long(number), *args))
        answers[name] = [result, ctypes.get_errno()]
        if result > 2 and name in {"io_uring_setup", "fanotify_init", "userfaultfd"}:
            os.close(result)
    return Text(text=json.dumps(answers))


@tool(
    id="probe__ca_bundle",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["text"],
    timeout_seconds=10,
    sandbox=Sandbox(isolation="sandbox"),
)
async def ca_bundle(params: Empty, ctx: ToolContext) -> Text:
    """How many CA certificates the default TLS context trusts (0: none could be read)."""
    import ssl

    context = ssl.create_default_context()
    return Text(text=str(context.cert_store_stats()["x509_ca"]))


@tool(
    id="probe__address_space",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["text"],
    timeout_seconds=10,
    sandbox=Sandbox(isolation="sandbox"),
)
async def address_space(params: Empty, ctx: ToolContext) -> Text:
    """The address-space limit it runs under, in MB (no manifest default of its own)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return Text(text=str(soft // (1024 * 1024)))
