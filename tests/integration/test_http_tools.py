"""HTTP tools against a real HTTP server (a Starlette app under uvicorn, in-process).

Operations are declared by hand and imported from an OpenAPI 3 document; credentials
travel from the connection into headers; status codes become typed errors; the call's
network permissions must grant the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.servers import free_port
from tests.support.tls import make_pki
from toolfleet.contract.manifest import SourceType
from toolfleet.errors import PermissionDenied
from toolfleet.executor.runner import RunResult, run_tool
from toolfleet.isolation.egress import IPAddress, StaticResolver
from toolfleet.policy.catalog import CatalogView
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.engine import PolicyQuery, decide_tenant
from toolfleet.registry.store import RegistryStore
from toolfleet.secrets.store import Secret
from toolfleet.sources import openapi
from toolfleet.sources.models import HttpOperation, SourceDefinition, SourceKind
from toolfleet.sources.provider import SourceCatalog, SourceToolProvider
from toolfleet.sources.store import SourceStore
from toolfleet.storage.postgres import create_pool
from toolfleet.tools.context import ToolContext

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-value"


async def get_pet(request: Request) -> Response:
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    pet_id = request.path_params["pet_id"]
    if pet_id == "missing":
        return JSONResponse({"error": "no such pet"}, status_code=404)
    return JSONResponse(
        {"id": pet_id, "name": "Rex", "verbose": request.query_params.get("verbose")}
    )


async def create_pet(request: Request) -> Response:
    body = await request.json()
    return JSONResponse({"id": "p-1", "name": body["name"], "owner": "hidden"}, status_code=201)


async def limited(request: Request) -> Response:
    return Response(status_code=429, headers={"Retry-After": "7"})


async def unavailable(request: Request) -> Response:
    return Response(status_code=503, headers={"Retry-After": "3"})


async def hello(request: Request) -> Response:
    return JSONResponse({"hello": request.query_params.get("name", "world")})


async def boom(request: Request) -> Response:
    return Response("stack trace with secrets", status_code=500)


async def host(request: Request) -> Response:
    return JSONResponse({"host": request.headers["host"]})


async def big(request: Request) -> Response:
    return JSONResponse({"blob": "x" * 2000})


async def endless(request: Request) -> Response:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(10_000):
            yield b"y" * 1024

    return StreamingResponse(chunks(), media_type="application/json")


APP = Starlette(
    routes=[
        Route("/pets/{pet_id}", get_pet),
        Route("/pets", create_pet, methods=["POST"]),
        Route("/limited", limited),
        Route("/unavailable", unavailable),
        Route("/boom", boom),
        Route("/hello", hello),
        Route("/host", host),
        Route("/big", big),
        Route("/endless", endless),
    ]
)

STRING = {"type": "string"}
SPEC = {
    "openapi": "3.0.3",
    "info": {"title": "pets", "version": "1"},
    "paths": {
        "/pets/{pet_id}": {
            "get": {
                "operationId": "getPet",
                "parameters": [
                    {
                        "name": "pet_id",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                    {"name": "verbose", "in": "query", "schema": {"type": "boolean"}},
                ],
                "responses": {
                    "200": {
                        "description": "a pet",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}
                        },
                    }
                },
            }
        },
        "/pets": {
            "post": {
                "operationId": "createPet",
                "requestBody": {
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"name": {"type": "string"}},
                                "required": ["name"],
                            }
                        }
                    }
                },
                "responses": {
                    "201": {
                        "description": "created",
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}
                        },
                    }
                },
            }
        },
    },
    "components": {
        "schemas": {
            "Pet": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
            }
        }
    },
}


class Credentials:
    def get(self, name: str) -> Secret:
        assert name == "api_token"
        return Secret(f"Bearer {TOKEN}")


@pytest.fixture(scope="module")
async def api() -> AsyncIterator[str]:
    async with serving(APP) as url:
        yield url


@contextlib.asynccontextmanager
async def serving(app: Starlette, *, tls: tuple[Path, Path] | None = None) -> AsyncIterator[str]:
    """``app`` under uvicorn on a free loopback port (HTTPS with ``tls``: certificate
    and key files), until the block ends."""
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="off",
        ssl_certfile=str(tls[0]) if tls else None,
        ssl_keyfile=str(tls[1]) if tls else None,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 (uvicorn has no started event to await)
        await asyncio.sleep(0.02)
    yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    server.should_exit = True
    await task


class Http:
    def __init__(
        self,
        store: SourceStore,
        registry: RegistryStore,
        granted: list[str],
        **provider: Any,
    ) -> None:
        self.store = store
        self.registry = registry
        self.granted = granted
        self.provider = SourceToolProvider(
            lookup=store, network_permissions=lambda ctx: granted, **provider
        )
        self.catalog = SourceCatalog(store=store, pool=self.provider.pool)

    async def add(self, source: SourceDefinition) -> None:
        await self.store.put(source)
        await self.catalog.refresh(source)

    async def call(self, tool_id: str, parameters: dict[str, Any]) -> RunResult:
        version = (await self.registry.versions(tool_id))[0].version
        spec = await self.provider.spec(tool_id, version)
        assert spec is not None
        ctx = ToolContext(
            tenant_id="tenant_a",
            agent_did="did:agent:test",
            invocation_id=str(uuid.uuid4()),
            tool_id=tool_id,
            tool_version=version,
            credentials=Credentials(),
            connection_id="pets_conn",
        )
        return await run_tool(spec, parameters, ctx, timeout_s=10)

    async def close(self) -> None:
        await self.provider.close()


@pytest.fixture
async def http(database_url: str) -> AsyncIterator[Http]:
    pool = await create_pool(database_url)
    made = Http(SourceStore(pool), RegistryStore(pool), ["127.0.0.1:*"])
    try:
        yield made
    finally:
        await made.provider.close()
        await pool.close()


def declared(base: str, name: str) -> SourceDefinition:
    return SourceDefinition(
        name=name,
        kind=SourceKind.HTTP,
        target=base,
        connection_id="pets_conn",
        credential_headers={"Authorization": "api_token"},
        operations=[
            HttpOperation(
                operation_id="get_pet",
                url="/pets/{pet_id}",
                path=["pet_id"],
                query=["verbose"],
                input_schema={
                    "type": "object",
                    "properties": {"pet_id": {"type": "string"}, "verbose": {"type": "boolean"}},
                    "required": ["pet_id"],
                },
                output_schema={"type": "object", "properties": {"name": {"type": "string"}}},
            ),
            *(
                HttpOperation(operation_id=op, url=f"/{op}")
                for op in ("limited", "unavailable", "boom")
            ),
        ],
    )


def error_of(result: RunResult) -> dict[str, Any]:
    assert result.error is not None, result.result
    return result.error.model_dump(mode="json")


async def test_a_declared_operation_sends_credentials_and_maps_the_input(
    http: Http, api: str
) -> None:
    name = f"pets{uuid.uuid4().hex[:6]}"
    await http.add(declared(api, name))
    result = await http.call(f"http__{name}__get_pet", {"pet_id": "rex 1", "verbose": True})
    assert result.error is None, result.error
    assert result.result == {"id": "rex 1", "name": "Rex", "verbose": "true"}
    [manifest] = await http.registry.versions(f"http__{name}__get_pet")
    assert manifest.redaction_allowlist == ["name"]  # the output schema's fields
    # A GET is a hint, not the operator's word: the effect stays the default.
    assert manifest.effect == "external_side_effect"

    missing = error_of(await http.call(f"http__{name}__get_pet", {"pet_id": "missing"}))
    assert (missing["code"], missing["retryable"]) == ("external_api_error", False)


async def test_status_codes_become_typed_errors(http: Http, api: str) -> None:
    name = f"pets{uuid.uuid4().hex[:6]}"
    await http.add(declared(api, name))
    limited = error_of(await http.call(f"http__{name}__limited", {}))
    assert (limited["code"], limited["retryable"], limited["retry_after_s"]) == (
        "external_api_error",
        True,
        7.0,
    )
    unavailable = error_of(await http.call(f"http__{name}__unavailable", {}))
    assert (unavailable["retryable"], unavailable["retry_after_s"]) == (True, 3.0)
    boom = error_of(await http.call(f"http__{name}__boom", {}))
    assert (boom["code"], boom["retryable"]) == ("external_api_error", True)
    assert "secrets" not in json.dumps(boom)


async def test_a_host_the_token_does_not_grant_is_refused(http: Http, api: str) -> None:
    name = f"pets{uuid.uuid4().hex[:6]}"
    await http.add(declared(api, name))
    http.granted[:] = ["api.example.com"]
    try:
        refused = error_of(await http.call(f"http__{name}__get_pet", {"pet_id": "rex"}))
    finally:
        http.granted[:] = ["127.0.0.1:*"]
    assert refused["code"] == "permission_denied"


async def test_operations_imported_from_openapi(http: Http, api: str) -> None:
    ops = openapi.operations(openapi.parse(json.dumps(SPEC)))
    assert [(o.operation_id, o.method, o.path, o.query, o.body) for o in ops] == [
        ("getpet", "GET", ["pet_id"], ["verbose"], []),
        ("createpet", "POST", [], [], ["name"]),
    ]
    name = f"pets{uuid.uuid4().hex[:6]}"
    source = SourceDefinition(
        name=name,
        kind=SourceKind.HTTP,
        target=api,
        connection_id="pets_conn",
        credential_headers={"Authorization": "api_token"},
        operations=ops,
    )
    await http.add(source)
    got = await http.call(f"http__{name}__getpet", {"pet_id": "7"})
    assert got.result is not None
    assert got.result["name"] == "Rex"
    created = await http.call(f"http__{name}__createpet", {"name": "Fido"})
    assert created.result == {"id": "p-1", "name": "Fido", "owner": "hidden"}
    [manifest] = await http.registry.versions(f"http__{name}__createpet")
    assert manifest.effect == "external_side_effect"
    assert manifest.redaction_allowlist == ["id", "name"]  # "owner" is redacted downstream
    refused = error_of(await http.call(f"http__{name}__createpet", {}))
    assert refused["code"] == "invalid_parameters"


class CountingResolver:
    """Names the system cannot resolve, answered from a table; counts the questions."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = StaticResolver(table=table)
        self.calls = 0

    async def resolve(self, name: str) -> tuple[IPAddress, ...]:
        self.calls += 1
        return await self.table.resolve(name)


def plain(base: str, name: str, **extra: Any) -> SourceDefinition:
    ops = [HttpOperation(operation_id=op, url=f"/{op}") for op in ("host", "big", "endless")]
    return SourceDefinition(name=name, kind=SourceKind.HTTP, target=base, operations=ops, **extra)


async def test_the_host_is_resolved_once_and_the_checked_address_is_the_one_used(
    database_url: str, api: str
) -> None:
    port = api.rsplit(":", 1)[1]
    resolver = CountingResolver({"pets.test": ["127.0.0.1"]})
    pool = await create_pool(database_url)
    http = Http(SourceStore(pool), RegistryStore(pool), ["pets.test:*"], resolver=resolver)
    try:
        name = f"pin{uuid.uuid4().hex[:6]}"
        await http.add(plain(f"http://pets.test:{port}", name))
        # A granted name alone never reaches loopback, whatever it resolves to.
        refused = error_of(await http.call(f"http__{name}__host", {}))
        assert refused["code"] == "permission_denied"
        http.granted.append("127.0.0.1:*")
        # pets.test exists in no DNS: the call reaches the address the check resolved,
        # and the server still sees the name.
        reached = await http.call(f"http__{name}__host", {})
        assert reached.result == {"host": f"pets.test:{port}"}
        assert resolver.calls == 2  # once per call, never again to connect
    finally:
        await http.close()
        await pool.close()


async def test_tls_is_checked_against_the_name_not_the_pinned_address(
    database_url: str, tmp_path: Path
) -> None:
    pki = make_pki(tmp_path)  # the server's certificate names localhost and 127.0.0.1
    context = ssl.create_default_context(cafile=str(pki.ca))
    resolver = CountingResolver({"localhost": ["127.0.0.1"], "pets.test": ["127.0.0.1"]})
    pool = await create_pool(database_url)
    granted = ["localhost:*", "pets.test:*", "127.0.0.1:*"]
    http = Http(
        SourceStore(pool), RegistryStore(pool), granted, resolver=resolver, ssl_context=context
    )
    try:
        async with serving(APP, tls=(pki.server_cert, pki.server_key)) as url:
            port = url.rsplit(":", 1)[1]
            good, bad = f"tls{uuid.uuid4().hex[:6]}", f"tls{uuid.uuid4().hex[:6]}"
            await http.add(plain(f"https://localhost:{port}", good))
            await http.add(plain(f"https://pets.test:{port}", bad))
            ok = await http.call(f"http__{good}__host", {})
            assert ok.result == {"host": f"localhost:{port}"}
            # Same address, but the certificate does not name pets.test: refused.
            wrong = error_of(await http.call(f"http__{bad}__host", {}))
            assert wrong["code"] == "external_api_error"
    finally:
        await http.close()
        await pool.close()


async def test_an_answer_over_the_sources_limit_is_result_too_large(http: Http, api: str) -> None:
    name = f"big{uuid.uuid4().hex[:6]}"
    await http.add(plain(api, name, max_response_bytes=1000))
    declared = error_of(await http.call(f"http__{name}__big", {}))
    assert (declared["code"], declared["retryable"]) == ("result_too_large", False)
    streamed = error_of(await http.call(f"http__{name}__endless", {}))
    assert streamed["code"] == "result_too_large"
    assert streamed["details"]["max"] == 1000


async def test_a_declared_tool_id_is_kept_allowed_only_by_name_and_runs(
    http: Http, api: str
) -> None:
    # Tool ids are global: a fresh namespace per run (``acme<hex>__get_pet``).
    namespace = f"acme{uuid.uuid4().hex[:6]}"
    tool_id = f"{namespace}__get_pet"
    source = declared(api, f"pets{uuid.uuid4().hex[:6]}")
    get_pet = source.operations[0].model_copy(update={"tool_id": tool_id})
    source = source.model_copy(update={"operations": [get_pet, *source.operations[1:]]})
    await http.add(source)

    [manifest] = await http.registry.versions(tool_id)
    assert manifest.source_type is SourceType.HTTP
    assert tool_id in await http.store.tool_ids()
    # The policy service's question: the registered source_type decides, not the name.
    ask = PolicyQuery(
        tenant_id="tenant_a",
        agent_did="did:agent:test",
        tool_id=manifest.tool_id,
        version=manifest.version,
        effect=manifest.effect,
        approval_requested=False,
        source_tool=manifest.source_type is not SourceType.NATIVE,
    )
    with pytest.raises(PermissionDenied):
        decide_tenant(TenantPolicy(allow_tools=[f"{namespace}__*"]), ask)
    named = TenantPolicy(allow_tools=[f"{namespace}__*", tool_id])
    assert decide_tenant(named, ask).reason == "allowed by policy"
    sources = await http.store.tool_ids()
    globbed = CatalogView(policy=TenantPolicy(allow_tools=["*"]), source_tools=sources)
    assert not globbed.shows(tool_id)
    assert CatalogView(policy=named, source_tools=sources).shows(tool_id)

    result = await http.call(tool_id, {"pet_id": "rex"})
    assert result.error is None, result.error
    assert result.result == {"id": "rex", "name": "Rex", "verbose": None}


async def test_a_source_stored_past_the_api_does_not_take_over_a_tool_id(
    http: Http, api: str
) -> None:
    tool_id = f"acme{uuid.uuid4().hex[:6]}__get_pet"
    first, second = (declared(api, f"pets{uuid.uuid4().hex[:6]}") for _ in range(2))
    for source in (first, second):
        ops = [source.operations[0].model_copy(update={"tool_id": tool_id})]
        await http.add(source.model_copy(update={"operations": ops}))
    assert [t.tool_id for t in await http.store.tools(second.name)] == []
    found = await http.store.tool(tool_id, (await http.registry.versions(tool_id))[0].version)
    assert found is not None
    assert found[1].name == first.name
