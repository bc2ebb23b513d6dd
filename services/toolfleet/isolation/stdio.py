"""stdio MCP servers under the sandbox: the namespaces, seccomp filter and limits of a
sandboxed tool, for a process that lives as long as its session.

The ``mcp`` SDK starts the server's process itself (no fds beyond stdin/stdout/stderr
reach it), so the command it starts is a chain of small trusted launchers:

    python -I -m toolfleet.isolation.stdio --seccomp FILE -- \\
        bwrap ... --seccomp 4 -- \\
        python -I -m toolfleet.isolation.stdio --inner --limits JSON [--uid U] \\
            [--egress SOCKET] -- SERVER ARGV

The outer launcher opens the compiled filter as fd 4 and becomes ``bwrap``. Inside the
sandbox the inner one drops to its own uid (when the executor is root), sets
no-new-privileges and the kernel limits (address space, processes, file size, open
files; no CPU-time limit, the process is long-lived: each call has its own timeout),
starts the egress bridge when the source grants hosts, and becomes the server. The
environment the SDK hands the process (its safe defaults plus the source's
``credential_env``) passes through bwrap to the server only; it never appears on a
command line.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

from toolfleet.errors import SandboxFailure
from toolfleet.isolation import seccomp
from toolfleet.isolation.bridge import PROXY_URL
from toolfleet.isolation.egress import EgressGrant, EgressProxy
from toolfleet.isolation.sandbox import (
    EGRESS_SOCKET,
    SECCOMP_FD,
    WORKDIR,
    HostSupport,
    SandboxPlan,
    bwrap_argv,
    import_paths,
    parse_filesystem_permissions,
)
from toolfleet.tools.limits import FleetLimits

_MODULE = "toolfleet.isolation.stdio"


@dataclass(frozen=True, slots=True, kw_only=True)
class StdioServer:
    """One stdio server to start: its command and what its source grants it."""

    key: str
    """Names its egress session (``source:{tenant}:{name}``)."""
    tenant_id: str
    argv: Sequence[str]
    filesystem_permissions: Sequence[str] = ()
    """``/path`` (read-only) or ``rw:/path`` entries bound into its sandbox."""
    network_permissions: Sequence[str] = ()
    """Hosts it may reach through the egress proxy; none: no network at all."""


@dataclass(kw_only=True)
class StdioSandbox:
    """Starts stdio servers sandboxed (the ``launcher`` of a ``SessionPool``)."""

    support: HostSupport
    limits: FleetLimits = field(default_factory=FleetLimits)
    egress: EgressProxy | None = None
    uid: int | None = None
    """When root: the uid the servers run as (one that owns nothing on the host)."""
    workdir_mb: int = 64
    use_seccomp: bool = True
    _dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="toolfleet-stdio-"))
    _filter: str | None = None

    @asynccontextmanager
    async def launch(self, server: StdioServer) -> AsyncIterator[list[str]]:
        """The command that starts ``server`` sandboxed; its egress session lives until exit.

        Raises:
            SandboxFailure: this host cannot run sandboxes, or hosts are granted and the
                executor runs no egress proxy.
            PermissionDenied: an unreadable filesystem or network entry.
        """
        if not self.support.sandboxes:
            raise SandboxFailure(f"no sandbox on this host: {self.support.problem}")
        binds = parse_filesystem_permissions(server.filesystem_permissions)
        async with contextlib.AsyncExitStack() as stack:
            socket_path: str | None = None
            if server.network_permissions:
                if self.egress is None:
                    raise SandboxFailure("hosts granted but the executor runs no egress proxy")
                grant = EgressGrant.from_permissions(
                    invocation_id=server.key,
                    tenant_id=server.tenant_id,
                    network_permissions=server.network_permissions,
                )
                name = hashlib.sha256(server.key.encode()).hexdigest()[:24]
                socket_path = os.path.join(self._dir, f"{name}.sock")
                await stack.enter_async_context(
                    self.egress.session(grant, unix_path=Path(socket_path))
                )
                if self.uid is not None and self.support.root:
                    os.chown(socket_path, self.uid, self.uid)  # the server's uid may connect
            cwd = os.getcwd()
            paths = import_paths()
            inner = [sys.executable, "-I", "-m", _MODULE, "--inner"]
            inner += ["--limits", json.dumps(self._limits())]
            if self.uid is not None and self.support.root:
                inner += ["--uid", str(self.uid)]
            if socket_path is not None:
                inner += ["--egress", EGRESS_SOCKET]
            argv = bwrap_argv(
                support=self.support,
                plan=SandboxPlan(
                    binds=binds,
                    egress_socket=socket_path,
                    workdir_mb=self.workdir_mb,
                    import_paths=paths,
                ),
                worker=[*inner, "--", *server.argv],
                seccomp=self.use_seccomp,
                inherit_env=True,
                # The executor's working dir when it is bound read-only (a server run as
                # ``python -m package``), else its private work dir.
                chdir=cwd if any(cwd == p or cwd.startswith(p + "/") for p in paths) else WORKDIR,
            )
            if socket_path is not None:
                argv = _with_proxy_env(argv)
            outer = [sys.executable, "-I", "-m", _MODULE]
            if self.use_seccomp:
                outer += ["--seccomp", self._filter_file()]
            yield [*outer, "--", *argv]

    def _limits(self) -> dict[str, int]:
        return {
            "memory_mb": self.limits.memory_mb,
            "max_processes": self.limits.max_processes,
            "max_file_mb": self.limits.max_file_mb,
            "max_open_files": self.limits.max_open_files,
        }

    def _filter_file(self) -> str:
        if self._filter is None:
            path = os.path.join(self._dir, "seccomp.bpf")
            with open(path, "wb") as f:
                f.write(seccomp.compile_filter())
            self._filter = path
        return self._filter


def _with_proxy_env(argv: list[str]) -> list[str]:
    at = argv.index("--")
    extra: list[str] = []
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
        extra += ["--setenv", name, PROXY_URL]
    return [*argv[:at], *extra, *argv[at:]]


# --- the launchers (run as programs) ---------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    at = args.index("--")
    parser = argparse.ArgumentParser(prog=_MODULE)
    parser.add_argument("--seccomp", default=None)
    parser.add_argument("--inner", action="store_true")
    parser.add_argument("--limits", default="{}")
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--egress", default=None)
    options, command = parser.parse_args(args[:at]), args[at + 1 :]
    if not command:
        return 2
    if not options.inner:
        if options.seccomp:
            fd = os.open(options.seccomp, os.O_RDONLY)
            if fd != SECCOMP_FD:
                os.dup2(fd, SECCOMP_FD)
                os.close(fd)
            os.set_inheritable(SECCOMP_FD, True)
        os.execvp(command[0], command)  # noqa: S606 (a launcher becomes the next program)
    from toolfleet.isolation.child import _drop_privileges, _no_new_privs

    if options.uid is not None and os.geteuid() == 0:
        _drop_privileges(options.uid, WORKDIR)
    _no_new_privs()
    _apply_limits(json.loads(options.limits))
    if options.egress:
        _start_bridge(options.egress)
    os.execvp(command[0], command)  # noqa: S606
    return 1  # pragma: no cover (exec does not return)


def _apply_limits(limits: dict[str, int]) -> None:
    import resource

    mib = 1024 * 1024
    for name, value in (
        (resource.RLIMIT_AS, limits.get("memory_mb", 0) * mib),
        (resource.RLIMIT_NPROC, limits.get("max_processes", 0)),
        (resource.RLIMIT_FSIZE, limits.get("max_file_mb", 0) * mib),
        (resource.RLIMIT_NOFILE, limits.get("max_open_files", 0)),
        (resource.RLIMIT_CORE, 0),
    ):
        if value or name == resource.RLIMIT_CORE:
            resource.setrlimit(name, (value, value))


def _start_bridge(socket_path: str) -> None:
    """A forked relay ``127.0.0.1:3128`` -> the egress socket; it ends with the sandbox."""
    if os.fork() != 0:
        return
    import asyncio

    from toolfleet.isolation.bridge import _listen

    os.setsid()
    loop = asyncio.new_event_loop()
    loop.run_until_complete(_listen(socket_path))
    loop.run_forever()


if __name__ == "__main__":
    sys.exit(main())
