"""Runtimes and limits of isolated tool runs, and how BC-1 nests them in the agent's.

A tool declares what it needs (:class:`ToolLimits`, its manifest's ``limits``); the
request's ``resource_limits`` are what its agent has. A tool asking more than the agent
has is refused before it runs (:class:`AgentLimitExceeded`); what the tool leaves unset
is its manifest's ``resource_defaults`` or the agent's, whichever is lower (a default
applies below the agent's limit, never above it), then the fleet's default.
:func:`bound_limits` is the one place that computes this. Without cgroups a CPU *rate* cannot be
enforced, so ``cpu_millicores`` bounds CPU *time*: ``millicores / 1000 x timeout``
seconds of CPU (``RLIMIT_CPU``), at least one second.

Limits only go down: a request's ``resource_limits`` may lower what a call runs under
(:class:`CallCeiling`: the manifest's ``resource_defaults`` and ``timeout_seconds``,
else the fleet's), never raise it. Policy refuses a higher ask before the call is
authorized (:func:`refuse_raised`, :class:`LimitRaised`); the executor, whatever an
authorized event says, clamps the agent's limits to the same ceiling (:func:`clamp`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from toolfleet.errors import RegistrationError, ResourceExhausted


class Isolation(StrEnum):
    """Where a tool runs."""

    NONE = "none"
    """In the executor's event loop: trusted built-ins that only await."""
    PROCESS = "process"
    """A pre-forked worker process: a blocking or crashing tool cannot stall the executor."""
    SANDBOX = "sandbox"
    """A worker process under bubblewrap and seccomp, with the token's files and hosts only."""


class AgentLimitExceeded(ResourceExhausted):
    """The tool asks more than its agent's ``resource_limits`` grant (BC-1); no retry helps."""

    retryable = False


class LimitRaised(ResourceExhausted):
    """A request's ``resource_limits`` ask more than the manifest and the fleet allow;
    ``details`` name the ``limit``, what was ``asked`` and what is ``allowed``."""

    retryable = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolLimits:
    """What a tool declares it needs (``@tool(sandbox=Sandbox(limits=...))``); None: the
    agent's or the fleet's default."""

    memory_mb: int | None = None
    """Address space (``RLIMIT_AS``); a call whose agent has less is refused."""
    cpu_millicores: int | None = None
    """CPU share, enforced as CPU time: ``millicores / 1000 x timeout`` seconds."""
    max_processes: int | None = None
    max_file_mb: int | None = None
    max_open_files: int | None = None

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise RegistrationError(f"ToolLimits.{name} is a positive integer, not {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentLimits:
    """The request's ``resource_limits``: what the calling agent has."""

    memory_mb: int | None = None
    cpu_millicores: int | None = None
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestDefaults:
    """The manifest's ``resource_defaults``: what a call runs under unless its agent has less."""

    memory_mb: int | None = None
    cpu_millicores: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetLimits:
    """The executor's defaults and ceilings (``TOOLFLEET_ISOLATION_*``)."""

    memory_mb: int = 512
    cpu_millicores: int = 1000
    max_processes: int = 64
    max_file_mb: int = 64
    max_open_files: int = 256
    max_output_bytes: int = 4 * 1024 * 1024
    kill_grace_s: float = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimits:
    """What the kernel enforces on one run (``setrlimit`` in the worker, wall clock here)."""

    timeout_s: float
    """Wall clock; then SIGTERM to the process group and SIGKILL after ``kill_grace_s``."""
    kill_grace_s: float
    cpu_seconds: int
    """RLIMIT_CPU, counted from the moment the tool starts."""
    memory_mb: int
    """RLIMIT_AS (address space)."""
    max_processes: int
    """RLIMIT_NPROC of the sandbox's own uid: a fork bomb stops there."""
    max_file_mb: int
    """RLIMIT_FSIZE: the largest file the tool may write."""
    max_open_files: int
    """RLIMIT_NOFILE."""
    max_output_bytes: int
    """Bytes the worker may write to stdout and stderr together before it is killed."""


def bound_limits(
    *,
    tool_id: str,
    tool: ToolLimits,
    agent: AgentLimits,
    fleet: FleetLimits,
    timeout_s: float,
    defaults: ManifestDefaults | None = None,
) -> RunLimits:
    """The limits of one run, nested in the agent's (BC-1), the manifest's defaults below.

    The agent's limits are first clamped to the call's ceiling (limits only go down):
    an authorized event asking more than policy allows still runs under no more.

    Raises:
        AgentLimitExceeded: the tool asks more memory or CPU than the agent has.
    """
    defaults = defaults or ManifestDefaults()
    agent = clamp(agent, CallCeiling.of(defaults=defaults, fleet=fleet, tool=tool))
    memory = _nested(
        tool_id, "memory_mb", tool.memory_mb, agent.memory_mb, defaults.memory_mb, fleet.memory_mb
    )
    cpu = _nested(
        tool_id,
        "cpu_millicores",
        tool.cpu_millicores,
        agent.cpu_millicores,
        defaults.cpu_millicores,
        fleet.cpu_millicores,
    )
    return RunLimits(
        timeout_s=timeout_s,
        kill_grace_s=fleet.kill_grace_s,
        cpu_seconds=max(1, math.ceil(cpu / 1000 * timeout_s)),
        memory_mb=memory,
        max_processes=min(tool.max_processes or fleet.max_processes, fleet.max_processes),
        max_file_mb=min(tool.max_file_mb or fleet.max_file_mb, fleet.max_file_mb),
        max_open_files=min(tool.max_open_files or fleet.max_open_files, fleet.max_open_files),
        max_output_bytes=fleet.max_output_bytes,
    )


def _nested(
    tool_id: str,
    name: str,
    asks: int | None,
    has: int | None,
    manifest: int | None,
    fleet: int,
) -> int:
    if asks is not None and has is not None and asks > has:
        raise AgentLimitExceeded(
            f"{tool_id} needs {name}={asks} but the calling agent's limit is {has}",
            details={"limit": name, "tool": asks, "agent": has},
        )
    if asks is not None:
        return asks
    below = [value for value in (has, manifest) if value is not None]
    return min(below) if below else fleet


@dataclass(frozen=True, slots=True, kw_only=True)
class CallCeiling:
    """The most a request's ``resource_limits`` may ask: what the call runs under when
    it asks nothing (the manifest's ``resource_defaults``, else the fleet's; in the
    executor, what the tool itself declares it needs comes first)."""

    memory_mb: int
    cpu_millicores: int
    timeout_s: float | None = None
    """The manifest's ``timeout_seconds``; None: not checked here (the executor has the
    authorized timeout, already the lower of the two)."""

    @classmethod
    def of(
        cls,
        *,
        defaults: ManifestDefaults,
        fleet: FleetLimits,
        timeout_s: float | None = None,
        tool: ToolLimits | None = None,
    ) -> CallCeiling:
        tool = tool or ToolLimits()
        return cls(
            memory_mb=tool.memory_mb or defaults.memory_mb or fleet.memory_mb,
            cpu_millicores=tool.cpu_millicores or defaults.cpu_millicores or fleet.cpu_millicores,
            timeout_s=timeout_s,
        )


def refuse_raised(asked: AgentLimits, ceiling: CallCeiling) -> None:
    """Refuse a request that asks any limit above its ceiling (BC-1: limits only go down).

    Raises:
        LimitRaised: naming the first such limit by its request field.
    """
    for name, asks, allowed in (
        ("memory_mb_limit", asked.memory_mb, ceiling.memory_mb),
        ("cpu_millicore_limit", asked.cpu_millicores, ceiling.cpu_millicores),
        ("timeout_seconds", asked.timeout_s, ceiling.timeout_s),
    ):
        if asks is not None and allowed is not None and asks > allowed:
            raise LimitRaised(
                f"resource_limits.{name}={asks:g} is above the allowed {allowed:g}: "
                "a request may lower the tool's and the fleet's limits, never raise them",
                details={"limit": name, "asked": asks, "allowed": allowed},
            )


def clamp(asked: AgentLimits, ceiling: CallCeiling) -> AgentLimits:
    """``asked`` with every limit at most its ceiling (the executor's defence in depth)."""

    def lower(asks: int | None, allowed: int) -> int | None:
        return None if asks is None else min(asks, allowed)

    timeout = asked.timeout_s
    if timeout is not None and ceiling.timeout_s is not None:
        timeout = min(timeout, ceiling.timeout_s)
    return AgentLimits(
        memory_mb=lower(asked.memory_mb, ceiling.memory_mb),
        cpu_millicores=lower(asked.cpu_millicores, ceiling.cpu_millicores),
        timeout_s=timeout,
    )
