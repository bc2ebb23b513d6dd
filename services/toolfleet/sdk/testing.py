"""A testing kit for tool authors: run a tool locally the way the fleet runs it.

No broker, Redis or Postgres: :func:`run_tool` applies, in the fleet's order and with
the fleet's own code, what a call goes through between the producer and the client:

1. the parameters are checked against the tool's input JSON Schema
   (:func:`toolfleet.registry.enforcement.check_parameters`, as policy does);
2. the tool runs under its timeout (:func:`toolfleet.executor.runner.run_tool`, the
   executor's run step: typed errors keep their code, other exceptions become
   ``tool_execution_error`` naming the exception type only);
3. output carrying a declared credential is withheld (``redaction_failed``), by the
   executor's own check (:func:`toolfleet.secrets.capability.withheld_output`);
4. the tool's result rules run as the validator runs them
   (:class:`toolfleet.results.checks.ResultChecker`: limits, coercion, the output
   schema and allowlist, sanitization), with what they changed in ``warnings``.

Example::

    from toolfleet.sdk.testing import context_for, run_tool

    async def test_echo() -> None:
        run = await run_tool(echo, {"message": "hi"})
        assert run.result == {"message": "hi", "length": 2}

        ctx = context_for(echo, resume_state={"step": 3})
        assert (await echo(EchoIn(message="hi"), ctx)).length == 2
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolfleet.documents.pins import MemoryDocumentPins
from toolfleet.documents.reader import CallDocuments
from toolfleet.documents.source import MemoryDocumentSource
from toolfleet.errors import ErrorInfo, ToolfleetError
from toolfleet.events.models import DocumentContext, DocumentRef, InvocationStatus
from toolfleet.events.outcomes import status_for
from toolfleet.executor import runner
from toolfleet.registry.enforcement import check_parameters
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.results.checks import ResultChecker
from toolfleet.secrets.capability import CredentialCapability, LeakDetector, withheld_output
from toolfleet.secrets.store import Secret
from toolfleet.tools.context import CheckpointInput, CheckpointWriter, DocumentReader, ToolContext
from toolfleet.tools.spec import ToolFunction, ToolSpec, spec_of

# The document twins a test hands to ``context_for(documents=...)``, re-exported so a
# tool's tests import only the SDK.
__all__ = [
    "CallDocuments",
    "CheckpointRecorder",
    "DocumentContext",
    "DocumentRef",
    "LocalRun",
    "MemoryDocumentPins",
    "MemoryDocumentSource",
    "context_for",
    "run_tool",
]

#: One compiled-schema cache for every local run, as one policy worker has.
_SCHEMAS = CompiledSchemas()
_CHECKER = ResultChecker(_SCHEMAS)


class CheckpointRecorder:
    """A :class:`~toolfleet.tools.context.CheckpointWriter` that keeps checkpoints in a list."""

    def __init__(self) -> None:
        self.saved: list[CheckpointInput] = []
        """Every checkpoint the tool saved, oldest first."""

    async def save(self, checkpoint: CheckpointInput) -> str:
        self.saved.append(checkpoint)
        return f"checkpoint-{len(self.saved)}"

    @property
    def latest_state(self) -> dict[str, Any] | None:
        """The state of the last checkpoint (what a resumed run would get), or None."""
        return dict(self.saved[-1].state) if self.saved else None


def context_for(
    tool_fn: ToolFunction | ToolSpec,
    *,
    tenant_id: str = "tenant_test",
    agent_did: str = "did:agent:test",
    invocation_id: str | None = None,
    attempt: int = 1,
    resume_state: dict[str, Any] | None = None,
    credentials: Mapping[str, str] | None = None,
    connection_id: str | None = None,
    checkpoints: CheckpointWriter | None = None,
    cancel_event: asyncio.Event | None = None,
    documents: DocumentReader | None = None,
) -> ToolContext:
    """A :class:`ToolContext` for calling ``tool_fn`` in a test.

    Args:
        tool_fn: a ``@tool`` function (or its spec): names the tool and its version.
        resume_state: what ``ctx.resume_state()`` returns, as after a crash.
        credentials: values of the credentials the tool declared, by name; only
            declared names resolve, as in the fleet. ``connection_id`` defaults to
            ``"test"`` when credentials are given.
        checkpoints: where ``ctx.checkpoint()`` goes (default: a fresh
            :class:`CheckpointRecorder`; pass your own to read what was saved).
        cancel_event: set it to make ``ctx.cancelled`` true.
        documents: what ``ctx.documents`` reads, e.g. a :class:`CallDocuments` over a
            :class:`MemoryDocumentSource` with :class:`MemoryDocumentPins` (all three
            importable from here; default: none, every read is
            ``document_access_denied``).
    """
    spec = spec_of(tool_fn)
    capability = None
    if credentials is not None:
        undeclared = sorted(set(credentials) - set(spec.credentials))
        if undeclared:
            raise ValueError(f"{spec.tool_id} does not declare credentials {undeclared}")
        capability = CredentialCapability(
            {name: Secret(value) for name, value in credentials.items()}, tool_id=spec.tool_id
        )
        connection_id = connection_id or "test"
    elif spec.credentials:
        capability = CredentialCapability({}, tool_id=spec.tool_id)
    return ToolContext(
        tenant_id=tenant_id,
        agent_did=agent_did,
        invocation_id=invocation_id or str(uuid.uuid4()),
        tool_id=spec.tool_id,
        tool_version=spec.version,
        attempt=attempt,
        resume_state=resume_state,
        checkpoints=checkpoints if checkpoints is not None else CheckpointRecorder(),
        cancel_event=cancel_event,
        credentials=capability,
        connection_id=connection_id,
        documents=documents,
    )


@dataclass(frozen=True, kw_only=True)
class LocalRun:
    """What a local run of a tool produced, as a client of the fleet would see it."""

    status: InvocationStatus
    """``success``, or ``error``/``timeout``/``cancelled`` with :attr:`error` set."""
    result: dict[str, Any] | None = None
    """The redacted result (fields outside the allowlist are ``"[REDACTED]"``)."""
    error: ErrorInfo | None = None
    """The typed error, as in the outcome's ``error`` (``code``, ``message``, ...)."""
    raw_result: dict[str, Any] | None = None
    """The result before validation and redaction, for assertions on hidden fields."""
    checkpoints: list[CheckpointInput] = field(default_factory=list)
    """The checkpoints saved during the run (empty when a ``ctx`` of yours was given)."""
    warnings: list[str] = field(default_factory=list)
    """What the result rules changed (coercions, escaped or redacted findings)."""

    @property
    def ok(self) -> bool:
        return self.status is InvocationStatus.SUCCESS


async def run_tool(
    tool_fn: ToolFunction | ToolSpec,
    parameters: dict[str, Any],
    *,
    ctx: ToolContext | None = None,
    timeout_s: float | None = None,
    credentials: Mapping[str, str] | None = None,
    resume_state: dict[str, Any] | None = None,
) -> LocalRun:
    """Run ``tool_fn`` with ``parameters`` (JSON-like, as a producer sends them).

    Args:
        ctx: the context to run with (default: :func:`context_for` the tool, with
            ``credentials`` and ``resume_state``, recording checkpoints in the run).
        timeout_s: the run's time limit (default: the tool's ``timeout_seconds``).
        credentials: the declared credentials' values; output that carries one of them
            is withheld (``redaction_failed``), as the executor does.

    Returns:
        A :class:`LocalRun`; failures are data (``run.error``), never exceptions.
    """
    spec = spec_of(tool_fn)
    recorder = CheckpointRecorder()
    if ctx is None:
        ctx = context_for(
            spec, credentials=credentials, resume_state=resume_state, checkpoints=recorder
        )
    manifest = spec.manifest()
    try:
        check_parameters(_SCHEMAS, manifest, parameters)
    except ToolfleetError as exc:
        return _failed(exc.to_error_info(), recorder)
    limit = timeout_s if timeout_s is not None else spec.timeout_seconds
    run = await runner.run_tool(spec, parameters, ctx, timeout_s=limit)
    leaks = LeakDetector(Secret(value) for value in (credentials or {}).values())
    withheld = withheld_output(leaks, spec.tool_id, [run.result, run.error])
    if withheld is not None:
        return _failed(withheld.to_error_info(), recorder)
    if run.error is not None:
        return _failed(run.error, recorder)
    raw = run.result or {}
    try:
        checked = _CHECKER.check(manifest, raw)
    except ToolfleetError as exc:
        return LocalRun(
            status=InvocationStatus.ERROR,
            error=exc.to_error_info(),
            raw_result=raw,
            checkpoints=list(recorder.saved),
        )
    return LocalRun(
        status=InvocationStatus.SUCCESS,
        result=checked.result,
        raw_result=raw,
        checkpoints=list(recorder.saved),
        warnings=checked.warnings,
    )


def _failed(error: ErrorInfo, recorder: CheckpointRecorder) -> LocalRun:
    return LocalRun(status=status_for(error), error=error, checkpoints=list(recorder.saved))
