"""HTTP operations from an OpenAPI 3 document (pure logic; JSON or YAML text in).

Every operation with an ``operationId`` becomes one :class:`HttpOperation`: its path
and query parameters and the members of its JSON request body form the input schema
(each mapped back to where it goes), its first 2xx JSON response schema the output
schema. Local ``$ref``s (``#/components/...``) are inlined; the base URL is the first
``servers`` entry unless the operator gives one. An operation's
``x-toolfleet-tool-id`` extension is its tool id (kept as written); without one the
tool is ``http__{source}__{operationId}``.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml

from toolfleet.sources.models import HttpOperation
from toolfleet.sources.naming import id_part

_METHODS = ("get", "post", "put", "patch", "delete")
_MAX_REF_DEPTH = 32


class OpenApiError(ValueError):
    """The document is not an OpenAPI 3 document this importer can read."""


def parse(text: str) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise OpenApiError(f"not JSON or YAML: {exc}") from None
    if not isinstance(doc, dict) or not str(doc.get("openapi", "")).startswith("3."):
        raise OpenApiError("not an OpenAPI 3 document (no `openapi: 3.x`)")
    return doc


def base_url(doc: dict[str, Any]) -> str | None:
    servers = doc.get("servers") or []
    if servers and isinstance(servers[0], dict) and isinstance(servers[0].get("url"), str):
        url: str = servers[0]["url"]
        return url
    return None


def operations(doc: dict[str, Any]) -> list[HttpOperation]:
    """Every operation of ``doc`` that has an ``operationId``."""
    found: list[HttpOperation] = []
    for path, item in (doc.get("paths") or {}).items():
        if not isinstance(item, dict):
            continue
        shared = item.get("parameters") or []
        for method in _METHODS:
            op = item.get(method)
            if not isinstance(op, dict) or not op.get("operationId"):
                continue
            found.append(_operation(doc, path, method, op, shared))
    return found


def _operation(
    doc: dict[str, Any], path: str, method: str, op: dict[str, Any], shared: list[Any]
) -> HttpOperation:
    properties: dict[str, Any] = {}
    required: list[str] = []
    where: dict[str, list[str]] = {"path": [], "query": [], "body": []}
    for raw in [*shared, *(op.get("parameters") or [])]:
        param = _resolve(doc, raw)
        place = param.get("in")
        if place not in ("path", "query") or not isinstance(param.get("name"), str):
            continue  # headers and cookies are the source's, not the caller's
        name = param["name"]
        properties[name] = _resolve(doc, param.get("schema") or {})
        where[place].append(name)
        if param.get("required") or place == "path":
            required.append(name)
    body = _json_schema(doc, (op.get("requestBody") or {}))
    if body is not None:
        for name, schema in (body.get("properties") or {}).items():
            properties[name] = schema
            where["body"].append(name)
        required.extend(body.get("required") or [])
    output: dict[str, Any] = {"type": "object"}
    for status, response in sorted((op.get("responses") or {}).items()):
        if str(status).startswith("2"):
            schema = _json_schema(doc, _resolve(doc, response))
            if schema is not None:
                output = schema
            break
    if output.get("type") not in (None, "object"):
        output = {"type": "object", "properties": {"value": output}}
    input_schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        input_schema["required"] = sorted(set(required))
    declared = op.get("x-toolfleet-tool-id")
    return HttpOperation(
        operation_id=id_part(op["operationId"])[:64],
        tool_id=str(declared) if declared else None,
        method=method.upper(),
        url=path,
        description=str(op.get("summary") or op.get("description") or ""),
        path=where["path"],
        query=where["query"],
        body=where["body"],
        input_schema=input_schema,
        output_schema=output,
    )


def _json_schema(doc: dict[str, Any], holder: dict[str, Any]) -> dict[str, Any] | None:
    holder = _resolve(doc, holder)
    media = (holder.get("content") or {}).get("application/json")
    if not isinstance(media, dict) or not isinstance(media.get("schema"), dict):
        return None
    schema = _inline(doc, media["schema"], 0)
    return schema if isinstance(schema, dict) else None


def _resolve(doc: dict[str, Any], node: Any) -> dict[str, Any]:
    for _ in range(_MAX_REF_DEPTH):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            break
        node = _pointer(doc, node["$ref"])
    return node if isinstance(node, dict) else {}


def _inline(doc: dict[str, Any], node: Any, depth: int) -> Any:
    if depth > _MAX_REF_DEPTH:
        raise OpenApiError("schema references nest too deep (recursive schema?)")
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            return _inline(doc, _pointer(doc, node["$ref"]), depth + 1)
        return {k: _inline(doc, v, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(doc, v, depth + 1) for v in node]
    return node


def _pointer(doc: dict[str, Any], ref: str) -> Any:
    if not ref.startswith("#/"):
        raise OpenApiError(f"only local references are supported: {ref}")
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise OpenApiError(f"unresolved reference {ref}")
        node = node[part]
    return copy.deepcopy(node)
