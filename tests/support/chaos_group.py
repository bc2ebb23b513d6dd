"""A member of one consumer group as a process of its own, to be killed mid-rebalance.

``python -m tests.support.chaos_group GROUP TOPIC RUN`` runs one
:class:`~toolfleet.bus.runtime.EventConsumer` of ``TOPIC`` in ``GROUP`` under the dev
broker profile, with the settings of the environment (``TOOLFLEET_*``, as a worker reads
them). Each record it is given takes :data:`HOLD_S` (a call in progress when the member
dies), then is recorded in Redis: :func:`handled_key` maps the record's event id to the
pid that handled it. :func:`started_key` holds the pids whose consumer has started
(joining its group), :func:`owned_key` each pid's partitions after every assignment.

:class:`GroupMembers` starts them and kills them (``SIGKILL``: no drain, no commit, no
goodbye to the group), and reads those keys back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from redis.asyncio import Redis

from tests.support.fleet import fleet_env
from tests.support.servers import kill_quietly
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Inbound
from toolfleet.devstack.broker_profile import DevBrokerProfile
from toolfleet.devstack.children import child_preexec
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis

#: How long a member holds each record before it counts as handled.
HOLD_S = 0.3
#: How long revoked records may finish before they are cancelled and left to the next
#: owner (short: a member that dies does not wait for it anyway).
REVOKE_GRACE_S = 0.5


def handled_key(run: str) -> str:
    return f"chaos-group:{run}:handled"


def started_key(run: str) -> str:
    return f"chaos-group:{run}:started"


def owned_key(run: str) -> str:
    return f"chaos-group:{run}:owned"


async def serve(group: str, topic: str, run: str) -> None:
    """Consume ``topic`` in ``group`` until SIGTERM (or SIGKILL)."""
    settings = FleetSettings()
    redis = connect_redis(settings.redis_url)
    producer = EventProducer(settings, client_id="chaos-group")
    profile = DevBrokerProfile.open(settings, doorbell=False)
    pid = str(os.getpid())
    writes: set[asyncio.Task[None]] = set()

    async def handle(event: Inbound) -> Sequence[Outbound]:
        await asyncio.sleep(HOLD_S)
        await redis.hset(handled_key(run), event.envelope.id, pid)
        return []

    async def record_owned(parts: list[int]) -> None:
        await redis.hset(owned_key(run), pid, json.dumps(parts))

    def on_assign(parts: Sequence[Partition]) -> None:
        write = asyncio.get_running_loop().create_task(
            record_owned(sorted(p.partition for p in parts))
        )
        writes.add(write)
        write.add_done_callback(writes.discard)

    consumer = EventConsumer(
        ConsumerSpec(
            service="chaos-group",
            source="/toolfleet/tests/chaos-group",
            group_id=group,
            topics=[topic],
            revoke_grace_s=REVOKE_GRACE_S,
            on_assign=on_assign,
        ),
        handle,
        settings=settings,
        producer=producer,
        processed=None,
        dlq_topic=f"{topic}.dlq",
        profile=profile,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await producer.start()
    try:
        await redis.sadd(started_key(run), pid)
        await consumer.run(stop)
    finally:
        await producer.stop()
        await profile.aclose()
        await redis.aclose()


@dataclass
class GroupMembers:
    """Member processes of one group; their logs go to ``log_dir``."""

    settings: FleetSettings
    group: str
    topic: str
    run: str
    log_dir: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"member-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.chaos_group", self.group, self.topic, self.run],
            env=fleet_env(self.settings),
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_preexec,  # no orphaned member outlives a killed session
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    @property
    def live_pids(self) -> set[str]:
        return {str(p.pid) for p in self.procs if p.poll() is None}

    async def started(self, redis: Redis) -> set[str]:
        return {_text(m) for m in await redis.smembers(started_key(self.run))}

    async def handled(self, redis: Redis) -> dict[str, str]:
        """Event id -> pid of the member that handled it (the last one, if several)."""
        raw = await redis.hgetall(handled_key(self.run))
        return {_text(k): _text(v) for k, v in raw.items()}

    async def owned(self, redis: Redis) -> dict[str, list[int]]:
        """Pid -> partitions of its last assignment (dead members' included)."""
        raw = await redis.hgetall(owned_key(self.run))
        return {_text(k): [int(p) for p in json.loads(_text(v))] for k, v in raw.items()}

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2500:]}"
            for path in sorted(self.log_dir.glob("member-*.log"))
        )

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(15)
            kill_quietly(proc)


@contextlib.contextmanager
def group_members(
    settings: FleetSettings, *, group: str, topic: str, run: str, log_dir: Path
) -> Iterator[GroupMembers]:
    members = GroupMembers(settings=settings, group=group, topic=topic, run=run, log_dir=log_dir)
    try:
        yield members
    finally:
        members.stop_all()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


if __name__ == "__main__":
    asyncio.run(serve(*sys.argv[1:4]))
