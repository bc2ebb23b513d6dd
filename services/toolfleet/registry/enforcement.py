"""What the fleet enforces of a tool's manifest, at either end of a call (pure logic).

Policy checks parameters against the input schema before a call is authorized; the
validator checks the result against the output schema and redacts it to the allowlist
before clients see it. ``toolfleet.sdk.testing`` runs the same two functions, so a
tool author's local run is refused or redacted exactly as the fleet would.
"""

from __future__ import annotations

from typing import Any

from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import InvalidParameters, RedactionFailed, ResultValidationFailed
from toolfleet.registry.redaction import redact
from toolfleet.registry.schemas import CompiledSchemas


def check_parameters(
    schemas: CompiledSchemas, manifest: ToolManifest, parameters: dict[str, Any]
) -> None:
    """Refuse parameters that do not match the tool's input schema.

    Raises:
        InvalidParameters: with the field-level errors in ``details["errors"]``.
    """
    errors = schemas.errors(manifest.input_schema, parameters)
    if errors:
        raise InvalidParameters(
            f"parameters do not match the input schema of {manifest.tool_id}@{manifest.version}",
            details={"errors": errors},
        )


def visible_result(
    schemas: CompiledSchemas, manifest: ToolManifest, result: dict[str, Any]
) -> dict[str, Any]:
    """``result`` as clients see it: checked against the output schema, then redacted.

    Raises:
        ResultValidationFailed: the result does not match the output schema, or is
            nested too deeply to validate.
        RedactionFailed: the result is nested too deeply to redact.
    """
    try:
        errors = schemas.errors(manifest.output_schema, result)
    except ValueError:
        # jsonschema-rs refuses to walk an instance nested deeper than it recurses.
        raise ResultValidationFailed(
            f"{manifest.tool_id}@{manifest.version} returned a result nested too deeply to validate"
        ) from None
    if errors:
        raise ResultValidationFailed(
            f"{manifest.tool_id}@{manifest.version} returned a result that does not "
            "match its output schema",
            details={"errors": errors},
        )
    try:
        redacted: dict[str, Any] = redact(result, manifest.redaction_allowlist)
    except RecursionError:
        raise RedactionFailed("result is nested too deeply to redact") from None
    return redacted
