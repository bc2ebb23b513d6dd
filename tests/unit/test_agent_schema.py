"""Provider-safe schemas: rewritten where a rewrite means the same, refused otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.agent_fixtures import WeatherIn, manifest
from toolfleet.agent.catalog import RunCatalog
from toolfleet.agent.schema import provider_safe
from toolfleet.errors import ProviderSchemaError

pytestmark = pytest.mark.unit


def _object(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def test_optional_refs_and_single_allof_are_rewritten() -> None:
    schema = provider_safe("acme__weather", WeatherIn.model_json_schema())
    assert "$defs" not in schema
    assert schema["properties"]["units"]["type"] == ["string", "null"]
    address = schema["properties"]["address"]
    assert address["type"] == "object"
    assert address["properties"]["zip"]["type"] == ["string", "null"]
    merged = provider_safe(
        "t__x",
        _object(a={"allOf": [{"type": "integer", "minimum": 1}], "description": "count"}),
    )
    assert merged["properties"]["a"] == {"type": "integer", "minimum": 1, "description": "count"}


@pytest.mark.parametrize(
    ("schema", "path", "word"),
    [
        (
            _object(pet={"oneOf": [{"type": "string"}, {"type": "integer"}]}),
            "#/properties/pet/oneOf",
            "oneOf",
        ),
        (_object(x={"not": {"type": "null"}}), "#/properties/x/not", "not"),
        (_object(x={"type": "string", "if": {"minLength": 1}}), "#/properties/x/if", "if"),
        (
            _object(tags={"type": "object", "patternProperties": {"^a": {"type": "string"}}}),
            "#/properties/tags/patternProperties",
            "patternProperties",
        ),
        (
            _object(x={"allOf": [{"type": "string"}, {"minLength": 2}]}),
            "#/properties/x/allOf",
            "allOf",
        ),
        (
            _object(items={"type": "array", "items": {"oneOf": [{"type": "string"}]}}),
            "#/properties/items/items/oneOf",
            "oneOf",
        ),
    ],
)
def test_refused_constructs_name_the_tool_and_the_path(
    schema: dict[str, Any], path: str, word: str
) -> None:
    with pytest.raises(ProviderSchemaError) as caught:
        RunCatalog.compile([manifest("acme__pets", input_schema=schema)])
    assert caught.value.tool_id == "acme__pets"
    assert caught.value.path == path
    assert "'acme__pets'" in caught.value.message
    assert path in caught.value.message
    assert word in caught.value.message


def test_a_recursive_ref_is_refused() -> None:
    schema = {
        "type": "object",
        "properties": {"node": {"$ref": "#/$defs/Node"}},
        "$defs": {"Node": _object(child={"$ref": "#/$defs/Node"})},
    }
    with pytest.raises(ProviderSchemaError, match="recursive"):
        provider_safe("t__tree", schema)


def test_a_non_object_root_is_refused() -> None:
    with pytest.raises(ProviderSchemaError, match="must be an object"):
        provider_safe("t__x", {"type": "string"})


def test_the_catalog_keeps_the_newest_usable_version_and_drops_denied_effects() -> None:
    run = RunCatalog.compile(
        [
            manifest("core__echo", version="2.0.0"),
            manifest("core__echo", version="1.0.0"),
            manifest("acme__pay", effect="external_side_effect"),
        ],
        denied_effects=["external_side_effect"],
    )
    assert run.names == ["core__echo"]
    tool = run.get("core__echo")
    assert tool is not None
    assert tool.manifest.version == "2.0.0"
    assert "acme__pay" not in run


def test_unsafe_tools_can_be_left_out_of_the_run_instead() -> None:
    unsafe = manifest("acme__pets", input_schema=_object(pet={"oneOf": [{"type": "string"}]}))
    long_name = manifest("acme__" + "x" * 60)
    run = RunCatalog.compile([unsafe, long_name, manifest("core__echo")], skip_unsafe=True)
    assert run.names == ["core__echo"]
    assert sorted((e.tool_id, e.path) for e in run.refused) == [
        ("acme__pets", "#/properties/pet/oneOf"),
        ("acme__" + "x" * 60, "#"),
    ]
    with pytest.raises(ProviderSchemaError, match="longer than 64"):
        RunCatalog.compile([long_name])


def test_strict_schemas_keep_only_keywords_both_strict_modes_document() -> None:
    schema = {
        "type": "object",
        "title": "NoteIn",
        "properties": {
            "body": {"type": "string", "title": "Body", "maxLength": 10_000_000},
            "when": {"type": "string", "format": "date-time", "default": "now"},
            "site": {"type": "string", "format": "uri", "examples": ["https://x"]},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1},
            "count": {"type": "integer", "minimum": 0, "maximum": 9, "default": 1},
        },
        "required": ["body"],
    }
    strict = provider_safe("t__note", schema, strict=True)
    props = strict["properties"]
    assert props["body"] == {"type": "string"}
    assert props["when"] == {"type": ["string", "null"], "format": "date-time"}
    assert props["site"] == {"type": ["string", "null"]}
    assert props["tags"] == {"type": ["array", "null"], "items": {"type": "string"}, "minItems": 1}
    assert props["count"] == {"type": ["integer", "null"]}
    assert "title" not in strict
    # The properties keep their names (a property may be called "title" or "default").
    named = provider_safe("t__n", _object(title={"type": "string"}), strict=True)
    assert list(named["properties"]) == ["title"]
    # Outside strict mode nothing is dropped.
    loose = provider_safe("t__note", schema)
    assert loose["properties"]["body"]["maxLength"] == 10_000_000
