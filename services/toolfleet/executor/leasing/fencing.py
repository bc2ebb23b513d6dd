"""Fencing tokens of execution leases: the names every fenced write checks.

An executor that runs an invocation holds its lease (:mod:`toolfleet.executor.leasing.leases`)
under an *epoch*: ``INCR lease:tool:{<tenant_id>}:<invocation_id>:epoch`` at every acquisition, so a
later owner always holds a larger number. A new counter starts at the current time in
milliseconds rather than at 1, so epochs keep growing across a Redis that lost its data
(restart, failover, or the counter's expiry): Postgres, which keeps the epochs of
durable checkpoints, never sees a later owner with a smaller number. A write on behalf
of the invocation (a checkpoint, the outcome) carries the writer's epoch and the store
applies it only while that epoch is still the newest one issued: a worker that was
paused past its lease and wakes up finds its epoch stale and its write refused,
atomically, at the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolfleet.errors import StateConflict
from toolfleet.events.identity import CallKey
from toolfleet.storage.call_keys import call_key


def lease_key(call: CallKey) -> str:
    """Hash ``{owner, epoch}`` of the live lease, with the lease TTL."""
    return call_key("lease:tool", call)


def epoch_key(call: CallKey) -> str:
    """The newest epoch issued for the call (the fencing token's source of truth)."""
    return call_key("lease:tool", call, "epoch")


#: Lua prelude of a fenced write: ``KEYS[1]`` is :func:`epoch_key`, ``ARGV[1]`` the
#: writer's epoch. Returns ``0`` from the script when the epoch is stale.
FENCE_CHECK_LUA = """
local newest = tonumber(redis.call('GET', KEYS[1]) or '0')
if newest ~= tonumber(ARGV[1]) then
  return 0
end
"""


def runs_key(call: CallKey) -> str:
    """How many times the call's lease was taken: its run number."""
    return call_key("lease:tool", call, "runs")


def checkpoint_key(call: CallKey) -> str:
    """The call's hot checkpoint: written fenced, read with the lease as it is taken."""
    return call_key("checkpoint:tool", call, "latest")


@dataclass(frozen=True, slots=True)
class Fence:
    """The epoch a worker writes under, for one call."""

    call: CallKey
    epoch: int
    run: int = 1
    """Which run of the invocation this is (1: the first; more after takeovers)."""

    @property
    def invocation_id(self) -> str:
        return self.call.invocation_id


class StaleLease(StateConflict):
    """A write under an epoch older than the newest one: another worker owns the call."""

    def __init__(self, fence: Fence) -> None:
        super().__init__(
            f"lease epoch {fence.epoch} is stale: another worker took the invocation over",
            details={"epoch": fence.epoch},
        )
        self.fence = fence
