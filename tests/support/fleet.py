"""Every service as its own OS process (``python -m toolfleet worker NAME``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.pipeline import Fleet, TeardownWatch
from tests.support.servers import kill_quietly
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.bus.admin import ensure_topics
from toolfleet.bus.producer import EventProducer
from toolfleet.client.publisher import KafkaPublisher
from toolfleet.devstack.bootstrap import bootstrap
from toolfleet.devstack.children import child_preexec
from toolfleet.events.models import InvocationStatus
from toolfleet.settings import FleetSettings

ALL_SERVICES = ("policy", "executor", "validator", "audit", "status")
READY_AGENT = "did:agent:ready"


def fleet_env(settings: FleetSettings, **extra: str) -> dict[str, str]:
    """The environment a worker process needs to join this fleet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    for name, value in settings.model_dump(exclude_unset=True).items():
        if value is not None:
            env[f"TOOLFLEET_{name.upper()}"] = str(value)
    env["TOOLFLEET_BROKER_PROFILE"] = settings.broker_profile  # the dev broker's, in tests
    env.update(extra)
    return env


@dataclass
class ProcessFleet:
    settings: FleetSettings
    log_dir: Path
    env: dict[str, str]
    procs: dict[str, list[subprocess.Popen[bytes]]] = field(default_factory=dict)

    def start(self, service: str) -> subprocess.Popen[bytes]:
        index = len(self.procs.get(service, []))
        log = (self.log_dir / f"{service}-{index}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolfleet", "worker", service],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_preexec,  # no orphaned worker outlives a killed session
        )
        self.procs.setdefault(service, []).append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # its log then shows where every task waits
            time.sleep(1)
            raise

    def dump_tasks(self) -> None:
        """SIGUSR1 to every live worker: each logs where every one of its tasks waits."""
        for proc in (p for ps in self.procs.values() for p in ps if p.poll() is None):
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGUSR1)
        time.sleep(1)

    def stop_all(self) -> None:
        running = [p for ps in self.procs.values() for p in ps if p.poll() is None]
        for proc in running:
            proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                kill_quietly(proc)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )


@contextlib.asynccontextmanager
async def process_fleet(
    settings: FleetSettings, home: Path, **env: str
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    """Every service as a process; yields once a real invocation made it through."""
    await ensure_topics(settings)
    await bootstrap(settings)
    procs = ProcessFleet(settings=settings, log_dir=home, env=fleet_env(settings, **env))
    assert settings.jwt_private_key_file
    assert settings.jwt_public_key_file
    issuer = TokenIssuer.from_files(
        settings.jwt_private_key_file,
        settings.jwt_public_key_file,
        issuer=settings.jwt_issuer,
        audience=settings.jwt_audience,
    )
    async with contextlib.AsyncExitStack() as stack:
        # Unwound last to first: the watch is armed before anything stops.
        watch = stack.enter_context(TeardownWatch("the process fleet's teardown"))
        stack.callback(procs.stop_all)
        for service in ALL_SERVICES:
            procs.start(service)
        producer = EventProducer(settings)
        await producer.start()
        stack.push_async_callback(producer.stop)
        client = await stack.enter_async_context(KafkaPublisher(settings))
        stack.callback(watch.arm)
        running = Fleet(settings=settings, issuer=issuer, client=client, producer=producer)
        first = await client.call(
            "core__echo",
            {"message": "ready?"},
            tenant_id="t1",
            agent_did=READY_AGENT,
            capability_token=running.token("t1", READY_AGENT),
            timeout=90,
        )
        assert first.status is InvocationStatus.SUCCESS, procs.logs()
        yield running, procs
