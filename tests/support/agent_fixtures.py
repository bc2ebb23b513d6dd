"""Manifests and a catalog for the agent runner's unit tests (schemas from pydantic)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from toolfleet.agent.catalog import RunCatalog
from toolfleet.contract.manifest import ToolManifest


class Address(BaseModel):
    city: str
    zip: str | None = None


class WeatherIn(BaseModel):
    """Where to look."""

    address: Address
    units: str | None = None
    days: int = 1


class EchoIn(BaseModel):
    message: str


class Out(BaseModel):
    value: str


def manifest(
    tool_id: str,
    model: type[BaseModel] = EchoIn,
    *,
    version: str = "1.0.0",
    effect: str = "read_only",
    description: str = "",
    input_schema: dict[str, Any] | None = None,
) -> ToolManifest:
    return ToolManifest(
        tool_id=tool_id,
        version=version,
        effect=effect,  # type: ignore[arg-type]
        description=description or f"The {tool_id} tool.",
        input_schema=input_schema or model.model_json_schema(),
        output_schema=Out.model_json_schema(),
        redaction_allowlist=["value"],
        timeout_seconds=10,
    )


def catalog(*, strict: bool = False) -> RunCatalog:
    return RunCatalog.compile(
        [manifest("acme__weather", WeatherIn), manifest("core__echo", EchoIn)], strict=strict
    )
