"""The sandbox's seccomp filter, assembled as classic BPF in pure Python.

``bwrap --seccomp FD`` reads a compiled ``struct sock_fprog`` body (an array of
``struct sock_filter``) from ``FD`` and loads it just before it executes the worker.
The filter:

1. kills the process when the syscall's architecture is not the executor's (no 32-bit
   or x32 syscall ABI to slip through);
2. answers ``EPERM`` to every syscall in :data:`DENIED` (tracing other processes,
   mounting, kernel modules and keys, BPF, namespaces, swap, reboot, clock changes,
   ``userfaultfd``, ``perf_event_open``, io_uring (a second syscall path the filter
   cannot see into), ``modify_ldt``, fanotify, NUMA placement and page migration,
   another process's memory or fds, ...); a name the architecture lacks is skipped;
3. answers ``EPERM`` to ``clone`` with any ``CLONE_NEW*`` flag, and ``ENOSYS`` to
   ``clone3`` (its flags live in memory a filter cannot read; libc falls back to
   ``clone``);
4. allows everything else.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from dataclasses import dataclass

#: Syscalls a tool has no business making, by name.
DENIED: tuple[str, ...] = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
    "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen",
    "fsconfig", "fsmount", "fspick", "mount_setattr",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key",
    "unshare", "setns",
    "reboot", "swapon", "swapoff", "acct", "quotactl",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
    "sethostname", "setdomainname", "syslog", "vhangup", "personality",
    "open_by_handle_at", "name_to_handle_at", "lookup_dcookie",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "modify_ldt", "iopl", "ioperm", "uselib",
    "fanotify_init", "fanotify_mark",
    "mbind", "migrate_pages", "move_pages", "set_mempolicy", "set_mempolicy_home_node",
    "process_madvise", "pidfd_getfd", "quotactl_fd",
)  # fmt: skip

#: Names of :data:`DENIED` that only x86 has (aarch64 never had them).
X86_ONLY = frozenset({"modify_ldt", "iopl", "ioperm", "uselib"})

#: Namespace flags ``clone`` may not carry (CLONE_NEWNS ... CLONE_NEWTIME).
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NEW_FLAGS |= 0x20000000 | 0x40000000 | 0x00000080

_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "move_mount": 429,
    "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
    "finit_module": 313, "delete_module": 176, "bpf": 321, "perf_event_open": 298,
    "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "unshare": 272, "setns": 308, "reboot": 169, "swapon": 167, "swapoff": 168,
    "acct": 163, "quotactl": 179, "settimeofday": 164, "clock_settime": 227,
    "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170, "setdomainname": 171,
    "syslog": 103, "vhangup": 153, "personality": 135, "open_by_handle_at": 304,
    "name_to_handle_at": 303, "lookup_dcookie": 212, "clone": 56, "clone3": 435,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "modify_ldt": 154, "iopl": 172, "ioperm": 173, "uselib": 134,
    "fanotify_init": 300, "fanotify_mark": 301, "mbind": 237, "migrate_pages": 256,
    "move_pages": 279, "set_mempolicy": 238, "set_mempolicy_home_node": 450,
    "process_madvise": 440, "pidfd_getfd": 438, "quotactl_fd": 443,
}  # fmt: skip
_AARCH64 = {
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "move_mount": 429,
    "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
    "finit_module": 273, "delete_module": 106, "bpf": 280, "perf_event_open": 241,
    "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
    "unshare": 97, "setns": 268, "reboot": 142, "swapon": 224, "swapoff": 225,
    "acct": 89, "quotactl": 60, "settimeofday": 170, "clock_settime": 112,
    "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161, "setdomainname": 162,
    "syslog": 116, "vhangup": 58, "personality": 92, "open_by_handle_at": 265,
    "name_to_handle_at": 264, "lookup_dcookie": 18, "clone": 220, "clone3": 435,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "fanotify_init": 262, "fanotify_mark": 263, "mbind": 235, "migrate_pages": 238,
    "move_pages": 239, "set_mempolicy": 237, "set_mempolicy_home_node": 450,
    "process_madvise": 440, "pidfd_getfd": 438, "quotactl_fd": 443,
}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class Arch:
    """One architecture's audit id and syscall numbers."""

    name: str
    audit_arch: int
    numbers: dict[str, int]
    x32_bit: bool = False
    """x86_64 only: syscall numbers with bit 30 set are the x32 ABI (refused)."""


ARCHES = {
    "x86_64": Arch(name="x86_64", audit_arch=0xC000003E, numbers=_X86_64, x32_bit=True),
    "aarch64": Arch(name="aarch64", audit_arch=0xC00000B7, numbers=_AARCH64),
}

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
RET_KILL_PROCESS = 0x80000000
RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
# struct seccomp_data: nr at 0, arch at 4, args[0] (low 32 bits, little endian) at 16.
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

_INSN = struct.Struct("<HBBI")


def ret_errno(code: int) -> int:
    return _RET_ERRNO | (code & 0xFFFF)


def host_arch() -> Arch:
    """The architecture the executor runs on; unsupported ones raise ``LookupError``."""
    machine = platform.machine()
    try:
        return ARCHES[machine]
    except KeyError:
        raise LookupError(f"no seccomp syscall table for {machine}") from None


def program(arch: Arch) -> list[tuple[int, int, int, int]]:
    """The filter as ``(code, jt, jf, k)`` instructions."""
    denied = [arch.numbers[name] for name in DENIED if name in arch.numbers]
    eperm, enosys = ret_errno(errno.EPERM), ret_errno(errno.ENOSYS)
    insns: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ_K, 1, 0, arch.audit_arch),
        (_RET_K, 0, 0, RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _NR),
    ]
    if arch.x32_bit:
        insns += [(_JGE_K, 0, 1, 0x40000000), (_RET_K, 0, 0, eperm)]
    # Denied numbers: each jumps to the shared EPERM return after the list.
    count = len(denied)
    tail = 4  # clone3 check (2) and clone check (2) sit between the list and EPERM
    for index, number in enumerate(denied):
        insns.append((_JEQ_K, count - index - 1 + tail + 3, 0, number))
    insns += [
        (_JEQ_K, 0, 1, arch.numbers["clone3"]),
        (_RET_K, 0, 0, enosys),
        (_JEQ_K, 0, 3, arch.numbers["clone"]),
        (_LD_W_ABS, 0, 0, _ARG0_LOW),
        (_JSET_K, 2, 0, CLONE_NEW_FLAGS),
        (_RET_K, 0, 0, RET_ALLOW),
        (_RET_K, 0, 0, RET_ALLOW),
        (_RET_K, 0, 0, eperm),
    ]
    return insns


def compile_filter(arch: Arch | None = None) -> bytes:
    """The filter as the bytes ``bwrap --seccomp`` reads."""
    return b"".join(_INSN.pack(*insn) for insn in program(arch or host_arch()))


def filter_fd(data: bytes) -> int:
    """A readable fd holding a compiled filter (an anonymous memory file).

    One per sandbox: bwrap reads it to the end, and dup'ed fds share that offset."""
    fd = os.memfd_create("toolfleet-seccomp", os.MFD_CLOEXEC)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
