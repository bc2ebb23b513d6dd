"""Pure parts of isolation: the seccomp program, limits (BC-1), permissions, framing,
the bwrap command line, ``@tool(isolation=...)`` and grants carrying permissions."""

from __future__ import annotations

import errno
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from toolfleet.auth.grants import GrantSigner, GrantVerifier
from toolfleet.errors import ErrorCode, PermissionDenied, RegistrationError
from toolfleet.events.identity import CallRef
from toolfleet.isolation import seccomp
from toolfleet.isolation.protocol import (
    MAX_FRAME_BYTES,
    FrameDecoder,
    ProtocolError,
    body_length,
    encode,
)
from toolfleet.isolation.sandbox import (
    EGRESS_SOCKET,
    Bind,
    HostSupport,
    SandboxPlan,
    bwrap_argv,
    parse_filesystem_permissions,
)
from toolfleet.sdk import Sandbox, ToolContext, tool
from toolfleet.sdk.builtin import TOOLS
from toolfleet.tools.limits import (
    AgentLimitExceeded,
    AgentLimits,
    FleetLimits,
    Isolation,
    ManifestDefaults,
    ToolLimits,
    bound_limits,
)
from toolfleet.tools.spec import spec_of

pytestmark = pytest.mark.unit

# -- seccomp: a small classic-BPF interpreter runs the compiled filter ----------------


def evaluate(program: bytes, *, nr: int, arch: int, arg0: int = 0) -> int:
    """Run a seccomp filter over one ``struct seccomp_data`` (only the opcodes we use)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    insns = [struct.unpack_from("<HBBI", program, i) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:  # ret k
            return k
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        pc += 1


X86 = seccomp.ARCHES["x86_64"]
PROGRAM = seccomp.compile_filter(X86)
EPERM = seccomp.ret_errno(errno.EPERM)


@pytest.mark.parametrize("name", seccomp.DENIED)
def test_every_denied_syscall_gets_eperm(name: str) -> None:
    assert evaluate(PROGRAM, nr=X86.numbers[name], arch=X86.audit_arch) == EPERM


@pytest.mark.parametrize("nr", [0, 1, 2, 3, 9, 57, 59, 60, 231])  # read ... exit_group
def test_ordinary_syscalls_are_allowed(nr: int) -> None:
    assert evaluate(PROGRAM, nr=nr, arch=X86.audit_arch) == seccomp.RET_ALLOW


def test_clone_with_a_namespace_flag_is_denied_and_plain_clone_allowed() -> None:
    clone = X86.numbers["clone"]
    threads = 0x3D0F00  # CLONE_VM | CLONE_FS | CLONE_FILES | CLONE_SIGHAND | CLONE_THREAD ...
    assert evaluate(PROGRAM, nr=clone, arch=X86.audit_arch, arg0=threads) == seccomp.RET_ALLOW
    new_user = 0x10000000
    assert evaluate(PROGRAM, nr=clone, arch=X86.audit_arch, arg0=new_user) == EPERM
    clone3 = X86.numbers["clone3"]
    assert evaluate(PROGRAM, nr=clone3, arch=X86.audit_arch) == seccomp.ret_errno(errno.ENOSYS)


def test_another_architecture_or_the_x32_abi_is_refused() -> None:
    assert evaluate(PROGRAM, nr=0, arch=0x40000003) == seccomp.RET_KILL_PROCESS  # i386
    assert evaluate(PROGRAM, nr=0x40000000, arch=X86.audit_arch) == EPERM


def test_every_architecture_table_names_every_denied_syscall() -> None:
    for arch in seccomp.ARCHES.values():
        x86_only = set() if arch.x32_bit else seccomp.X86_ONLY
        assert set(seccomp.DENIED) - x86_only <= set(arch.numbers), arch.name
        assert len(seccomp.compile_filter(arch)) % 8 == 0


@pytest.mark.parametrize("arch", seccomp.ARCHES.values(), ids=lambda a: a.name)
def test_io_uring_ldt_fanotify_and_page_migration_get_eperm_on_every_architecture(
    arch: seccomp.Arch,
) -> None:
    program = seccomp.compile_filter(arch)
    names = ["io_uring_setup", "io_uring_enter", "io_uring_register", "fanotify_init"]
    names += ["mbind", "migrate_pages", "move_pages", "set_mempolicy", "pidfd_getfd"]
    names += ["modify_ldt"] if arch.x32_bit else []
    for name in names:
        verdict = evaluate(program, nr=arch.numbers[name], arch=arch.audit_arch)
        assert verdict == seccomp.ret_errno(errno.EPERM), (arch.name, name)
    getpid = 39 if arch.x32_bit else 172
    assert evaluate(program, nr=getpid, arch=arch.audit_arch) == seccomp.RET_ALLOW


# -- limits (BC-1) ----------------------------------------------------------------------


def test_a_tool_asking_more_than_its_agent_is_refused_with_a_clear_message() -> None:
    with pytest.raises(AgentLimitExceeded) as refused:
        bound_limits(
            tool_id="acme__big",
            tool=ToolLimits(memory_mb=1024),
            agent=AgentLimits(memory_mb=256),
            fleet=FleetLimits(),
            timeout_s=10,
        )
    assert refused.value.code == ErrorCode.RESOURCE_EXHAUSTED
    assert not refused.value.retryable
    assert "memory_mb=1024" in refused.value.message
    assert "agent's limit is 256" in refused.value.message


def test_limits_fall_back_from_tool_to_agent_to_fleet() -> None:
    fleet = FleetLimits(memory_mb=512, cpu_millicores=1000, max_processes=64)
    own = bound_limits(
        tool_id="t", tool=ToolLimits(memory_mb=128), agent=AgentLimits(memory_mb=256),
        fleet=fleet, timeout_s=10,
    )  # fmt: skip
    assert own.memory_mb == 128
    agents = bound_limits(
        tool_id="t", tool=ToolLimits(), agent=AgentLimits(memory_mb=256, cpu_millicores=500),
        fleet=fleet, timeout_s=10,
    )  # fmt: skip
    assert agents.memory_mb == 256
    assert agents.cpu_seconds == 5  # 0.5 CPU for 10 s
    default = bound_limits(
        tool_id="t", tool=ToolLimits(max_processes=1000), agent=AgentLimits(), fleet=fleet,
        timeout_s=0.2,
    )  # fmt: skip
    assert default.memory_mb == 512
    assert default.cpu_seconds == 1  # at least a second
    assert default.max_processes == 64  # the fleet's ceiling


def test_manifest_defaults_apply_below_the_agents_limits() -> None:
    fleet = FleetLimits(memory_mb=512, cpu_millicores=1000)
    defaults = ManifestDefaults(memory_mb=128, cpu_millicores=2000)
    run = bound_limits(
        tool_id="t", tool=ToolLimits(), agent=AgentLimits(cpu_millicores=500), fleet=fleet,
        timeout_s=10, defaults=defaults,
    )  # fmt: skip
    assert run.memory_mb == 128  # the manifest's default, the agent set none
    assert run.cpu_seconds == 5  # the agent's 500 mc, lower than the default's 2000
    unbounded = bound_limits(
        tool_id="t", tool=ToolLimits(), agent=AgentLimits(), fleet=fleet, timeout_s=10,
        defaults=defaults,
    )  # fmt: skip
    assert unbounded.cpu_seconds == 20  # the manifest's 2 CPUs, not the fleet's 1
    asked = bound_limits(
        tool_id="t", tool=ToolLimits(memory_mb=300), agent=AgentLimits(memory_mb=400),
        fleet=fleet, timeout_s=10, defaults=defaults,
    )  # fmt: skip
    assert asked.memory_mb == 300  # what the tool needs wins over a default


# -- filesystem permissions -------------------------------------------------------------


def test_filesystem_permissions_parse_to_read_only_and_writable_binds() -> None:
    assert parse_filesystem_permissions(["/data/a", "ro:/data/b", "rw:/data/c"]) == (
        Bind(path="/data/a"),
        Bind(path="/data/b"),
        Bind(path="/data/c", writable=True),
    )


@pytest.mark.parametrize("entry", ["data", "/data/../etc", "/", "rw:relative", "/a//b", "/x\x00"])
def test_unreadable_filesystem_permissions_refuse_the_grant(entry: str) -> None:
    with pytest.raises(PermissionDenied, match="entry 1 is malformed"):
        parse_filesystem_permissions(["/ok", entry])


# -- framing ----------------------------------------------------------------------------


@given(st.lists(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=20))))
def test_frames_decode_whatever_the_chunking(messages: list[dict[str, Any]]) -> None:
    stream = b"".join(encode(m) for m in messages)
    decoder, decoded = FrameDecoder(), []
    for start in range(0, len(stream), 3):
        decoded.extend(decoder.feed(stream[start : start + 3]))
    assert decoded == messages


def test_oversized_or_non_object_frames_are_refused() -> None:
    with pytest.raises(ProtocolError):
        body_length(struct.pack(">I", MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(struct.pack(">I", 2) + b"[]")


# -- the bwrap command line -------------------------------------------------------------

ROOT = HostSupport(bwrap="/usr/bin/bwrap", user_namespaces=True, root=True)
USER = HostSupport(bwrap="/usr/bin/bwrap", user_namespaces=True, root=False)


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_the_sandbox_gets_new_namespaces_and_only_what_is_granted() -> None:
    plan = SandboxPlan(
        binds=(Bind(path="/data/a"), Bind(path="/data/b", writable=True)),
        egress_socket="/run/x.sock",
        import_paths=("/opt/venv",),
    )
    argv = bwrap_argv(support=ROOT, plan=plan, worker=["python", "-m", "w"])
    for flag in ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--die-with-parent"):
        assert flag in argv
    assert "--unshare-user" not in argv  # root: a uid of its own instead (see sandbox.py)
    assert ("/data/a", "/data/a") in pairs(argv, "--ro-bind")
    assert ("/data/b", "/data/b") in pairs(argv, "--bind")
    assert ("/opt/venv", "/opt/venv") in pairs(argv, "--ro-bind")
    assert ("/run/x.sock", EGRESS_SOCKET) in pairs(argv, "--bind")
    assert not any(src == "/" for src, _ in pairs(argv, "--ro-bind") + pairs(argv, "--bind"))
    assert argv[argv.index("--seccomp") + 1] == "4"
    assert argv[-3:] == ["python", "-m", "w"]
    assert "--unshare-user" in bwrap_argv(support=USER, plan=SandboxPlan(), worker=["w"])


def test_the_ca_bundle_is_bound_read_only_and_reachable_but_no_private_key_dir() -> None:
    argv = bwrap_argv(support=ROOT, plan=SandboxPlan(), worker=["w"])
    bound = [src for src, _ in pairs(argv, "--ro-bind")]
    assert "/etc/ssl/certs" in bound
    assert not any(path in ("/etc", "/etc/ssl") or "private" in path for path in bound)
    assert ("/etc/ssl/certs", "/etc/ssl/certs") not in pairs(argv, "--bind")
    made = {
        argv[i + 3] for i in range(len(argv) - 3) if argv[i : i + 3 : 2] == ["--perms", "--dir"]
    }
    assert {"/etc", "/etc/ssl"} <= made  # traversable by the tool's own uid
    assert argv.index("/etc/ssl") < argv.index("/etc/ssl/certs")


def test_no_egress_socket_without_network_permissions() -> None:
    argv = bwrap_argv(support=ROOT, plan=SandboxPlan(), worker=["w"])
    assert EGRESS_SOCKET not in argv


# -- @tool(isolation=...) ---------------------------------------------------------------


class In(BaseModel):
    x: int = 0


class Out(BaseModel):
    x: int


def declare(**options: Any) -> Any:
    async def fn(params: In, ctx: ToolContext) -> Out:
        return Out(x=params.x)

    return tool(id="acme__fn", version="1.0.0", effect="read_only", redaction_allowlist=["x"],
                **options)(fn)  # fmt: skip


def test_tools_from_outside_toolfleet_are_sandboxed_by_default() -> None:
    assert spec_of(declare()).isolation is Isolation.SANDBOX
    assert spec_of(declare(sandbox=Sandbox(isolation="process"))).isolation is Isolation.PROCESS
    assert spec_of(declare()).manifest().isolation == "sandbox"
    with pytest.raises(RegistrationError, match="isolation must be one of"):
        declare(sandbox=Sandbox(isolation="vm"))


def test_built_ins_run_in_the_loop_except_run_python() -> None:
    isolation = {spec_of(t).tool_id: spec_of(t).isolation for t in TOOLS}
    assert isolation == {
        "core__get_current_time": Isolation.NONE,
        "core__echo": Isolation.NONE,
        "core__long_running": Isolation.NONE,
        "core__run_python": Isolation.SANDBOX,
    }
    assert spec_of(TOOLS[-1]).effect == "external_side_effect"


# -- grants carry the token's filesystem and network permissions -------------------------


def test_the_grant_binds_filesystem_and_network_permissions() -> None:
    key = b"k" * 32
    call: dict[str, Any] = {
        "call": CallRef(
            invocation_id="i",
            tenant_id="t",
            agent_did="a",
            tool_id="acme__fn",
            tool_version="1.0.0",
        ),
        "parameters": {"x": 1},
    }
    signed = GrantSigner(key).sign(
        **call,
        capability_jti="j",
        timeout_s=5,
        filesystem_permissions=["/data/t"],
        network_permissions=["api.example.com"],
    )
    grant = GrantVerifier([key]).decode(signed, **call)
    assert grant.filesystem_permissions == ("/data/t",)
    assert grant.network_permissions == ("api.example.com",)
    bare = GrantVerifier([key]).decode(
        GrantSigner(key).sign(**call, capability_jti="j", timeout_s=5), **call
    )
    assert bare.filesystem_permissions == ()
    assert bare.network_permissions == ()


def test_a_module_may_set_its_tools_default_isolation() -> None:
    from tests.support import chaos_tools, sample_tools

    assert spec_of(sample_tools.cached).isolation is Isolation.NONE
    assert all(spec_of(t).isolation is Isolation.NONE for t in chaos_tools.TOOLS)
