"""``-p key=value`` and ``--params-json``: tool parameters from the command line."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from toolfleet.cli.errors import CliError


def parse_value(text: str) -> Any:
    """JSON when ``text`` is valid JSON (``5``, ``true``, ``[1]``), the string otherwise."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_params(pairs: Sequence[str], params_json: str | None = None) -> dict[str, Any]:
    """Merge ``--params-json`` (an object) with ``-p key=value`` pairs; pairs win."""
    params: dict[str, Any] = {}
    if params_json:
        try:
            loaded = json.loads(params_json)
        except ValueError:
            raise CliError("--params-json is not valid JSON") from None
        if not isinstance(loaded, dict):
            raise CliError("--params-json must be a JSON object")
        params.update(loaded)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliError(f"-p expects key=value, got {pair!r}")
        params[key] = parse_value(value)
    return params
