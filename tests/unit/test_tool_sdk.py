"""``@tool`` refuses unusable definitions at import time, and the catalog refuses twins."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, Field

from toolfleet.errors import RegistrationError
from toolfleet.events.models import Effect
from toolfleet.registry.catalog import ToolCatalog, discover
from toolfleet.sdk import ToolContext, ToolSpec, spec_of, tool

pytestmark = pytest.mark.unit


class In(BaseModel):
    message: str = Field(max_length=10, description="what to echo")


class Nested(BaseModel):
    name: str


class Out(BaseModel):
    message: str
    length: int
    nested: Nested | None = None


def define(**overrides: Any) -> ToolSpec:
    options: dict[str, Any] = {
        "id": "acme__echo",
        "version": "1.0.0",
        "effect": "read_only",
        "redaction_allowlist": ["message", "length"],
        **overrides,
    }

    async def echo(params: In, ctx: ToolContext) -> Out:
        """Echoes."""
        return Out(message=params.message, length=len(params.message))

    return spec_of(tool(**options)(echo))


def test_a_valid_tool() -> None:
    spec = define(tags=["demo"], timeout_seconds=2)
    assert spec.key == ("acme__echo", "1.0.0")
    assert spec.effect is Effect.READ_ONLY
    assert spec.description == "Echoes."
    assert spec.redaction_allowlist == ("message", "length")
    assert spec.timeout_seconds == 2.0
    assert spec.manifest().tags == ["demo"]


def test_schemas_are_generated_from_the_models() -> None:
    spec = define()
    assert spec.input_schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert spec.input_schema["properties"]["message"]["maxLength"] == 10
    assert spec.input_schema["properties"]["message"]["description"] == "what to echo"
    assert spec.input_schema["required"] == ["message"]
    assert set(spec.output_schema["properties"]) == {"message", "length", "nested"}
    assert {k: v for k, v in spec.input_schema.items() if k != "$schema"} == (
        In.model_json_schema()
    )
    assert spec.manifest().input_schema == spec.input_schema


def test_redaction_allowlist_is_required() -> None:
    with pytest.raises(RegistrationError, match="redaction_allowlist is required"):
        define(redaction_allowlist=None)


def test_an_empty_allowlist_is_allowed() -> None:
    assert define(redaction_allowlist=[]).redaction_allowlist == ()


def test_allowlist_may_name_nested_paths_of_known_fields() -> None:
    assert define(redaction_allowlist=["nested.name"]).redaction_allowlist == ("nested.name",)


@pytest.mark.parametrize("allowlist", [["nope"], ["message", "secret.field"]])
def test_allowlist_naming_an_unknown_field(allowlist: list[str]) -> None:
    with pytest.raises(RegistrationError, match="the output does not have"):
        define(redaction_allowlist=allowlist)


@pytest.mark.parametrize(
    "tool_id", ["echo", "Acme__echo", "acme_echo", "acme__", "__echo", "acme__echo!", "a" * 130]
)
def test_bad_tool_id(tool_id: str) -> None:
    with pytest.raises(RegistrationError, match="tool ids are namespaced"):
        define(id=tool_id)


@pytest.mark.parametrize("version", ["1", "1.0", "v1.0.0", "latest", "^1.0.0", "01.0.0"])
def test_non_semver_version(version: str) -> None:
    with pytest.raises(RegistrationError, match="not a semantic version"):
        define(version=version)


def test_non_positive_timeout() -> None:
    with pytest.raises(RegistrationError, match="timeout_seconds"):
        define(timeout_seconds=0)


def test_unknown_effect() -> None:
    with pytest.raises(ValueError, match="launch_missiles"):
        define(effect="launch_missiles")


def test_sync_function_is_refused() -> None:
    def sync(params: In, ctx: ToolContext) -> Out:
        return Out(message="", length=0)

    with pytest.raises(RegistrationError, match="async function"):
        tool(id="acme__sync", version="1.0.0", effect="read_only", redaction_allowlist=[])(
            sync  # type: ignore[arg-type]
        )


def test_untyped_models_are_refused() -> None:
    async def untyped(params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {}

    with pytest.raises(RegistrationError, match="pydantic model"):
        tool(id="acme__untyped", version="1.0.0", effect="read_only", redaction_allowlist=[])(
            untyped
        )


@pytest.mark.parametrize("field", ["connection_id", "capability_token"])
def test_input_may_not_declare_credentials(field: str) -> None:
    Sneaky = type("Sneaky", (BaseModel,), {"__annotations__": {field: str | None}, field: None})

    async def sneaky(params: Sneaky, ctx: ToolContext) -> Out:  # type: ignore[valid-type]
        return Out(message="", length=0)

    sneaky.__annotations__["params"] = Sneaky
    with pytest.raises(RegistrationError, match="credentials reach tools through capabilities"):
        tool(id="acme__sneaky", version="1.0.0", effect="read_only", redaction_allowlist=[])(sneaky)


def test_catalog_collision_raises() -> None:
    catalog = ToolCatalog([define()])
    with pytest.raises(RegistrationError, match=r"acme__echo@1\.0\.0 is defined twice"):
        catalog.add(define())


def test_catalog_accepts_the_same_spec_twice_and_other_versions() -> None:
    spec = define()
    catalog = ToolCatalog([spec, spec, define(version="1.1.0")])
    assert len(catalog) == 2
    assert [s.version for s in catalog] == ["1.0.0", "1.1.0"]
    assert catalog.get("acme__echo", "1.1.0") is not None
    assert catalog.get("acme__echo", "9.9.9") is None


def test_discover_includes_the_builtins() -> None:
    ids = {(s.tool_id, s.version) for s in discover()}
    assert {
        ("core__get_current_time", "1.0.0"),
        ("core__echo", "1.0.0"),
        ("core__long_running", "1.0.0"),
    } <= ids


async def test_the_decorated_function_stays_callable_and_carries_its_spec() -> None:
    async def echo(params: In, ctx: ToolContext) -> Out:
        return Out(message=params.message, length=len(params.message))

    declared = tool(id="acme__echo", version="1.0.0", effect="read_only", redaction_allowlist=[])(
        echo
    )
    assert declared is echo
    assert spec_of(echo).fn is echo
    assert spec_of(echo) is echo.__toolfleet_spec__  # type: ignore[attr-defined]
    assert spec_of(spec_of(echo)) is spec_of(echo)
    ctx = ToolContext(
        tenant_id="t", agent_did="a", invocation_id="i", tool_id="acme__echo", tool_version="1.0.0"
    )
    assert await echo(In(message="hi"), ctx) == Out(message="hi", length=2)


def test_spec_of_a_plain_function_names_the_decorator() -> None:
    async def plain(params: In, ctx: ToolContext) -> Out:
        return Out(message="", length=0)

    with pytest.raises(RegistrationError, match=r"plain is not a tool: declare it with @tool"):
        spec_of(plain)


def test_catalog_takes_decorated_functions() -> None:
    async def echo(params: In, ctx: ToolContext) -> Out:
        return Out(message=params.message, length=len(params.message))

    tool(id="acme__echo", version="2.0.0", effect="read_only", redaction_allowlist=[])(echo)
    catalog = ToolCatalog([echo])
    assert catalog.get("acme__echo", "2.0.0") is spec_of(echo)
