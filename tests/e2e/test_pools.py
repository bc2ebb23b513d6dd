"""Executor pools through the whole fleet, every service a process (one fleet for all).

- The README's "run an executor with your own tools": a second executor started with
  ``TOOLFLEET_TOOL_MODULES`` beside the standard one serves its tool to every tenant,
  whichever executor's partition a tenant's calls land on.
- ``toolfleet worker executor --pool acme``: the tools of pool ``acme`` run there, for
  every tenant.
- A call for a pool with no live executor is ``queued`` (with its pool) in the status
  API, and runs once an executor of the pool starts; one whose pool never gets an
  executor ends ``timeout`` at its deadline.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from tests.support.api import asgi_client, bearer, running_app
from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet, fleet_env, process_fleet
from tests.support.pipeline import Fleet, fleet_settings
from toolfleet.api import ApiSettings
from toolfleet.client.handles import InvocationHandle
from toolfleet.devstack.children import child_preexec
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.settings import FleetSettings
from toolfleet.storage.pools import ExecutorPresence, RedisPoolPresence

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TENANTS = [f"t_pool{i}" for i in range(8)]
AGENT = "did:agent:pools-e2e"
POLICY = {
    "tenants": {"*": {"allow_tools": ["core__*", "test__*", "acme__*", "extra__*", "idle__*"]}}
}
POOL_TOOLS = "tests.support.pool_tools"


@dataclass
class PoolFleet:
    running: Fleet
    procs: ProcessFleet
    http: httpx.AsyncClient
    redis: Redis
    started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def executor(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """``toolfleet worker executor ARGS`` loading the pool tools, started once."""
        if name not in self.started:
            log = (self.procs.log_dir / f"executor-{name}.log").open("wb")
            env = fleet_env(self.procs.settings, TOOLFLEET_TOOL_MODULES=POOL_TOOLS)
            proc = subprocess.Popen(
                [sys.executable, "-m", "toolfleet", "worker", "executor", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=child_preexec,
            )
            self.procs.procs.setdefault("executor", []).append(proc)
            self.started[name] = proc
        return self.started[name]

    async def queued(
        self, tool: str, params: dict[str, Any], tenant: str
    ) -> tuple[InvocationHandle, dict[str, Any]]:
        """Invoke ``tool`` and wait until status shows the call ``queued``."""
        handle = await self.running.client.invoke(
            tool,
            params,
            tenant_id=tenant,
            agent_did=AGENT,
            capability_token=self.running.token(tenant, AGENT),
        )

        async def queued() -> dict[str, Any] | None:
            view = await self.status(tenant, handle.invocation_id)
            return view if view.get("status") == "queued" else None

        return handle, await eventually(queued, timeout=30)

    async def serving(self, proc: subprocess.Popen[bytes], pool: str) -> None:
        """Return once ``proc`` announces partitions of ``pool``'s topic."""
        presence = RedisPoolPresence(self.redis, topic_prefix=self.procs.settings.topic_prefix)

        async def announced() -> list[ExecutorPresence]:
            if proc.poll() is not None:
                raise RuntimeError(f"the executor exited: {self.procs.logs()}")
            return [
                e
                for e in await presence.live()
                if e.worker_id.endswith(f"-{proc.pid}") and e.partitions.get(pool)
            ]

        await eventually(announced, timeout=60)

    async def status(self, tenant: str, invocation_id: str) -> dict[str, Any]:
        token = self.running.token(tenant, AGENT)
        response = await self.http.get(f"/v1/invocations/{invocation_id}", headers=bearer(token))
        return response.json() if response.status_code == 200 else {}

    async def call(self, tool_id: str, params: dict[str, Any], tenant: str) -> ToolOutcome:
        return await self.running.client.call(
            tool_id,
            params,
            tenant_id=tenant,
            agent_did=AGENT,
            capability_token=self.running.token(tenant, AGENT),
            timeout=90,
        )


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[PoolFleet]:
    home: Path = tmp_path_factory.mktemp("e2e-pools")
    local = fleet_settings(settings, home, policy=POLICY)
    async with process_fleet(local, home) as (running, procs):
        redis = Redis.from_url(local.redis_url)
        async with running_app(ApiSettings(**local.model_dump())) as app, asgi_client(app) as http:
            pools = PoolFleet(running=running, procs=procs, http=http, redis=redis)
            try:
                yield pools
            finally:
                await redis.aclose()


@pytest.fixture(scope="module")
async def extra_executor(fleet: PoolFleet) -> PoolFleet:
    """The README's way, beside the standard executor (which has the sample tools only):
    ``TOOLFLEET_TOOL_MODULES=tests.support.pool_tools toolfleet worker executor``."""
    await fleet.serving(fleet.executor("extra"), "default")
    return fleet


def _pid(outcome: ToolOutcome) -> int:
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    return int(outcome.result["pid"])


async def test_the_readme_extra_executor_serves_its_tool_to_every_tenant(
    extra_executor: PoolFleet,
) -> None:
    fleet = extra_executor
    outcomes = await asyncio.gather(
        *(fleet.call("extra__shout", {"text": f"hi {t}"}, t) for t in TENANTS)
    )
    assert [o.result["text"] if o.result else o.error for o in outcomes] == [
        f"HI {t}".upper() for t in TENANTS
    ], fleet.procs.logs()
    # Only the extra executor has the tool: calls that landed on the standard one's
    # partitions were handed over, none failed with tool_not_found.
    assert {_pid(o) for o in outcomes} == {fleet.started["extra"].pid}


async def test_a_call_for_a_pool_without_executor_is_queued_until_one_starts(
    extra_executor: PoolFleet,
) -> None:
    fleet = extra_executor
    tenant = TENANTS[0]
    handle, view = await fleet.queued("acme__weather", {"city": "Lyon"}, tenant)
    assert view["execution_metadata"]["pool"] == "acme"

    acme = fleet.executor("acme", "--pool", "acme")
    outcome = await fleet.running.client.wait(handle, timeout=60)
    assert _pid(outcome) == acme.pid, fleet.procs.logs()
    assert outcome.result == {
        "city": "Lyon",
        "forecast": "sunny",
        "tenant": tenant,
        "pid": acme.pid,
    }

    async def succeeded() -> dict[str, Any] | None:
        view = await fleet.status(tenant, handle.invocation_id)
        return view if view.get("status") == "success" else None

    done = await eventually(succeeded, timeout=30)
    assert done["execution_metadata"]["pool"] == "acme"  # the pool it waited for stays


async def test_an_executor_started_with_pool_serves_every_tenant(
    extra_executor: PoolFleet,
) -> None:
    fleet = extra_executor
    acme = fleet.executor("acme", "--pool", "acme")
    await fleet.serving(acme, "acme")
    outcomes = await asyncio.gather(*(fleet.call("acme__weather", {"city": t}, t) for t in TENANTS))
    assert [o.result["tenant"] if o.result else o.error for o in outcomes] == TENANTS
    assert {_pid(o) for o in outcomes} == {acme.pid}


async def test_a_call_whose_pool_never_gets_an_executor_times_out_at_its_deadline(
    extra_executor: PoolFleet,
) -> None:
    fleet = extra_executor
    tenant = TENANTS[1]
    handle, view = await fleet.queued("idle__wait", {"text": "anyone?"}, tenant)
    assert view["execution_metadata"]["pool"] == "nobody"
    outcome = await fleet.running.client.wait(handle, timeout=60)
    assert outcome.status is InvocationStatus.TIMEOUT
    assert outcome.error is not None
    assert outcome.error.details == {"pool": "nobody"}
    assert outcome.execution_metadata.attempts == 0  # it never ran
