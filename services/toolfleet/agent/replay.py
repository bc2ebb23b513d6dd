"""Replay bundles: one file per run, re-run later with no model and no fleet.

A bundle is JSON Lines: a header (run id, adapter, limits, the catalog's manifests),
then one line per model turn (the decoded turn and the envelopes of its calls, with
their invocation and trace ids). :func:`replay` runs the same loop again: the model's
turns come from the bundle, the fleet answers from the recorded outcomes, and the
catalog is the recorded one or the one you pass (a changed tool, a changed policy).
Every call whose id, version or outcome then differs is a :class:`Divergence`.
"""

from __future__ import annotations

import fnmatch
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.agent.adapters import ProviderAdapter
from toolfleet.agent.catalog import RunCatalog
from toolfleet.agent.loop import ModelRequest, run_agent
from toolfleet.agent.port import OnFleetEvent, Submission, Submitted
from toolfleet.agent.providers import adapter_named
from toolfleet.agent.records import ModelTurn, ToolEnvelope
from toolfleet.agent.runner import AgentRunLimits, ToolRunner
from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events.models import (
    Attachment,
    Effect,
    ExecutionMetadata,
    InvocationStatus,
    ToolOutcome,
)

__all__ = [
    "BUNDLE_VERSION",
    "BundleHeader",
    "BundleWriter",
    "Divergence",
    "ReplayBundle",
    "ReplayFleet",
    "ReplayReport",
    "TurnRecord",
    "read_bundle",
    "replay",
]

BUNDLE_VERSION = 1


class BundleHeader(BaseModel):
    """The first line of a bundle: the run, its adapter, guard rails and catalog."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["header"] = "header"
    version: int = BUNDLE_VERSION
    run_id: str
    adapter: str
    strict: bool = False
    max_iterations: int
    max_tool_calls: int
    max_runtime_ms: int | None = None
    max_result_bytes: int | None = None
    denied_effects: list[Effect] = Field(default_factory=list)
    manifests: list[ToolManifest]

    @classmethod
    def of(cls, runner: ToolRunner, adapter: ProviderAdapter) -> BundleHeader:
        """The header of ``runner``'s run, talking ``adapter``'s wire format."""
        limits = runner.limits
        return cls(
            run_id=runner.run_id,
            adapter=adapter.name,
            strict=runner.catalog.strict,
            max_iterations=limits.max_iterations,
            max_tool_calls=limits.max_tool_calls,
            max_runtime_ms=limits.max_runtime_ms,
            max_result_bytes=limits.max_result_bytes,
            denied_effects=sorted(limits.denied_effects),
            manifests=[tool.manifest for tool in runner.catalog.tools],
        )


class TurnRecord(BaseModel):
    """One model turn of a bundle, with the envelopes of its calls."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["turn"] = "turn"
    turn: int
    model: ModelTurn
    envelopes: list[ToolEnvelope]


@dataclass(frozen=True, kw_only=True)
class ReplayBundle:
    """A bundle as read back."""

    header: BundleHeader
    turns: list[TurnRecord]


class BundleWriter:
    """Writes a run's bundle as it goes: a crash leaves every finished turn on disk.

    ``with BundleWriter(path, header) as recorder:`` closes the file however the run ends.
    """

    def __init__(self, path: Path, header: BundleHeader) -> None:
        self.path = path
        self._file: IO[str] = path.open("w", encoding="utf-8")
        self._write(header.model_dump_json())

    def turn(self, turn: int, model: ModelTurn, envelopes: Iterable[ToolEnvelope]) -> None:
        self._write(TurnRecord(turn=turn, model=model, envelopes=list(envelopes)).model_dump_json())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _write(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()


def read_bundle(path: Path) -> ReplayBundle:
    """A bundle file; ``ValueError`` when it is not one."""
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if not lines or lines[0].get("kind") != "header":
        raise ValueError("not a replay bundle (no header line)")
    header = BundleHeader.model_validate(lines[0])
    turns = [TurnRecord.model_validate(line) for line in lines[1:]]
    return ReplayBundle(header=header, turns=turns)


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """Where the replayed run differs from the recorded one."""

    turn: int
    index: int
    tool: str
    reason: str

    def __str__(self) -> str:
        return f"turn {self.turn} call {self.index} ({self.tool}): {self.reason}"


@dataclass(kw_only=True)
class ReplayReport:
    """What :func:`replay` found."""

    turns: int
    calls: int
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return not self.divergences


class ReplayFleet:
    """A fleet that answers from a bundle's recorded outcomes, by call id."""

    def __init__(self, envelopes: Iterable[ToolEnvelope], manifests: Iterable[ToolManifest]):
        self._recorded = {e.call_id: e for e in envelopes}
        self._manifests = list(manifests)
        self._submitted: dict[str, Submission] = {}
        self.notes: dict[str, str] = {}
        """Call id to why the fleet could not reproduce that call."""

    async def catalog(self) -> list[ToolManifest]:
        return list(self._manifests)

    async def submit(self, submission: Submission) -> Submitted:
        invocation_id = str(uuid.uuid4())
        self._submitted[invocation_id] = submission
        return Submitted(invocation_id=invocation_id)

    async def outcome(
        self, submitted: Submitted, *, on_event: OnFleetEvent | None = None, timeout: float
    ) -> ToolOutcome:
        sub = self._submitted[submitted.invocation_id]
        recorded = self._recorded.get(sub.idempotency_key)
        if recorded is None or recorded.invocation_id is None:
            self.notes[sub.idempotency_key] = "the recorded run never sent this call to the fleet"
            return _outcome(
                submitted.invocation_id,
                sub.tool_id,
                None,
                "error",
                None,
                ErrorInfo(code=ErrorCode.INTERNAL_ERROR, message="not in the bundle"),
            )
        if recorded.version is not None and sub.tool_version != recorded.version:
            self.notes[sub.idempotency_key] = (
                f"would run version {sub.tool_version}, the recording ran {recorded.version}"
            )
        return _outcome(
            submitted.invocation_id,
            sub.tool_id,
            recorded,
            recorded.status,
            recorded.output,
            recorded.error,
        )


def _outcome(
    invocation_id: str,
    tool_id: str,
    recorded: ToolEnvelope | None,
    status: str,
    result: dict[str, Any] | None,
    error: ErrorInfo | None,
) -> ToolOutcome:
    meta = ExecutionMetadata()
    if recorded is not None:
        meta = ExecutionMetadata(
            duration_ms=recorded.runtime_ms,
            started_at=recorded.started_at,
            completed_at=recorded.ended_at,
            cached=recorded.cached,
            truncated=recorded.truncated,
            attachments=[
                Attachment(url=u, content_type="application/json", bytes=0)
                for u in recorded.attachments
            ],
        )
    return ToolOutcome(
        invocation_id=uuid.UUID(invocation_id),
        status=InvocationStatus(status),
        agent_did="did:agent:replay",
        tenant_id="replay",
        tool_id=tool_id,
        tool_version=recorded.version if recorded else None,
        result=result,
        error=error,
        execution_metadata=meta,
    )


async def replay(
    bundle: ReplayBundle,
    *,
    manifests: Iterable[ToolManifest] | None = None,
    allow_tools: Iterable[str] | None = None,
    denied_effects: Iterable[Effect | str] | None = None,
) -> ReplayReport:
    """Re-run a recorded loop with no model and no fleet; report where it diverges.

    ``manifests`` replaces the recorded catalog (a changed or removed tool),
    ``allow_tools`` (globs) and ``denied_effects`` a changed policy.
    """
    head = bundle.header
    current = list(manifests) if manifests is not None else list(head.manifests)
    if allow_tools is not None:
        globs = list(allow_tools)
        current = [m for m in current if any(fnmatch.fnmatchcase(m.tool_id, g) for g in globs)]
    denied = frozenset(Effect(e) for e in (denied_effects or head.denied_effects))
    limits = AgentRunLimits(
        max_iterations=head.max_iterations,
        max_tool_calls=head.max_tool_calls,
        max_runtime_ms=head.max_runtime_ms,
        max_result_bytes=head.max_result_bytes,
        denied_effects=denied,
    )
    recorded = [e for t in bundle.turns for e in t.envelopes]
    fleet = ReplayFleet(recorded, current)
    runner = ToolRunner(
        fleet=fleet,
        catalog=RunCatalog.compile(current, denied_effects=denied, strict=head.strict),
        run_id=head.run_id,
        limits=limits,
    )
    turns = {t.turn: t.model for t in bundle.turns}

    async def model_fn(request: ModelRequest) -> ModelTurn:
        return turns.get(request.turn, ModelTurn())

    await run_agent(model_fn, runner=runner, adapter=adapter_named(head.adapter), messages=[])
    report = ReplayReport(turns=len(bundle.turns), calls=len(recorded))
    replayed = list(runner.tools_by_id.values())
    by_position = {(e.turn, e.index): e for e in replayed}
    for old in recorded:
        new = by_position.get((old.turn, old.index))
        reason = _difference(old, new, fleet.notes)
        if reason:
            report.divergences.append(
                Divergence(turn=old.turn, index=old.index, tool=old.tool, reason=reason)
            )
    return report


def _difference(old: ToolEnvelope, new: ToolEnvelope | None, notes: dict[str, str]) -> str:
    if new is None:
        return "the replayed run never made this call"
    if new.call_id != old.call_id:
        return "the call's id differs (tool or arguments changed)"
    if new.call_id in notes:
        return notes[new.call_id]
    if new.status != old.status:
        why = f": {new.error.message}" if new.error else ""
        return f"recorded {old.status}, replay {new.status}{why}"
    if (old.error and old.error.code) != (new.error and new.error.code):
        return "the error differs"
    if new.output != old.output:
        return "the output differs"
    return ""
