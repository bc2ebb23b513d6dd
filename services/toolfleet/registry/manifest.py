"""What the registry stores about one tool version (no I/O)."""

from __future__ import annotations

import hashlib
import json
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.events.models import TOOL_ID_PATTERN, Effect
from toolfleet.results.rules import ResultRules


class LifecycleState(StrEnum):
    ACTIVE = "active"
    DEPRECATED = "deprecated"
    REMOVED = "removed"


class ToolManifest(BaseModel):
    """One version of one tool, as executors register it and policy resolves it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    tool_id: str = Field(pattern=TOOL_ID_PATTERN, max_length=128)
    version: str
    effect: Effect
    description: str = ""
    category: str = "general"
    tags: list[str] = Field(default_factory=list)
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    redaction_allowlist: list[str]
    timeout_seconds: float = Field(gt=0)
    credentials: list[str] = Field(default_factory=list)
    """Named credentials the tool needs; a call must then carry a ``connection_id``."""
    lifecycle_state: LifecycleState = LifecycleState.ACTIVE
    deprecation_message: str | None = None
    result_rules: ResultRules = Field(default_factory=ResultRules)
    """What the validator checks besides the output schema: mode, sanitization, limits."""

    @property
    def namespace(self) -> str:
        return self.tool_id.split("__", 1)[0]

    @property
    def schema_hash(self) -> str:
        """Identity of the contract of this version: same id+version must keep it."""
        return schema_hash(self.input_schema, self.output_schema, self.effect)


def schema_hash(input_schema: dict[str, Any], output_schema: dict[str, Any], effect: str) -> str:
    canonical = json.dumps(
        {"in": input_schema, "out": output_schema, "effect": str(effect)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
