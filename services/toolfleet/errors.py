"""Every error toolfleet reports, with its contract code and whether a retry can help.

Tool failures are data: handlers turn these into the outcome's ``error`` member
(:meth:`ToolfleetError.to_error_info`) instead of letting them escape a consumer loop.
The retry predicate reads the ``retryable`` class attribute, never the message.

    ToolfleetError                      internal_error
    ├── InvalidEvent                    invalid_event
    ├── InvalidParameters               invalid_parameters
    ├── ToolNotFound                    tool_not_found
    ├── ToolVersionNotFound             tool_version_not_found
    ├── ToolRemoved                     tool_removed
    ├── PermissionDenied                permission_denied
    ├── ApprovalDenied                  approval_denied
    ├── RateLimitExceeded               rate_limit_exceeded        (retryable)
    ├── IdempotencyConflict             idempotency_conflict
    ├── InvocationIdConflict            invocation_id_conflict     (the id is another call's)
    ├── ToolExecutionError              tool_execution_error
    │   ├── SandboxFailure              sandbox_failure
    │   └── ExternalApiError            external_api_error         (retryable)
    ├── CircuitBreakerOpen              circuit_breaker_open       (retryable)
    ├── ToolTimeout                     timeout                    (retryable)
    ├── ResourceExhausted               resource_exhausted         (retryable)
    ├── ResultValidationFailed          result_validation_failed   (schema violation)
    │   ├── ResultCoercionFailed        result_coercion_failed     (coerce mode: no safe coercion)
    │   ├── ResultSanitizationRejected  result_sanitization_rejected (a ``reject`` rule matched)
    │   └── ResultTooLarge              result_too_large           (bytes or nesting over the limit)
    ├── RedactionFailed                 redaction_failed
    ├── Cancelled                       cancelled
    ├── CheckpointFailed                checkpoint_failed          (retryable)
    ├── ResumeFailed                    resume_failed
    ├── StateConflict                   state_conflict
    ├── DocumentNotFound                document_not_found         (ctx.documents)
    ├── DocumentAccessDenied            document_access_denied     (ctx.documents)
    ├── DocumentVersionConflict         document_version_conflict  (ctx.documents)
    ├── DocumentSourceUnavailable       document_source_unavailable (retryable)
    ├── RegistrationError               internal_error (raised at start, never on the wire)
    │   └── ProviderSchemaError         internal_error (an agent run's catalog, never on the wire)
    └── KafkaSecurityError              internal_error (raised at start, never on the wire)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field


class ErrorCode(StrEnum):
    """The stable error codes of the contract; clients branch on them."""

    INVALID_EVENT = "invalid_event"
    INVALID_PARAMETERS = "invalid_parameters"
    TOOL_NOT_FOUND = "tool_not_found"
    TOOL_VERSION_NOT_FOUND = "tool_version_not_found"
    TOOL_REMOVED = "tool_removed"
    PERMISSION_DENIED = "permission_denied"
    APPROVAL_DENIED = "approval_denied"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    INVOCATION_ID_CONFLICT = "invocation_id_conflict"
    TOOL_EXECUTION_ERROR = "tool_execution_error"
    SANDBOX_FAILURE = "sandbox_failure"
    EXTERNAL_API_ERROR = "external_api_error"
    CIRCUIT_BREAKER_OPEN = "circuit_breaker_open"
    TIMEOUT = "timeout"
    RESOURCE_EXHAUSTED = "resource_exhausted"
    RESULT_VALIDATION_FAILED = "result_validation_failed"
    RESULT_COERCION_FAILED = "result_coercion_failed"
    RESULT_SANITIZATION_REJECTED = "result_sanitization_rejected"
    RESULT_TOO_LARGE = "result_too_large"
    REDACTION_FAILED = "redaction_failed"
    CANCELLED = "cancelled"
    CHECKPOINT_FAILED = "checkpoint_failed"
    RESUME_FAILED = "resume_failed"
    STATE_CONFLICT = "state_conflict"
    DOCUMENT_NOT_FOUND = "document_not_found"
    DOCUMENT_ACCESS_DENIED = "document_access_denied"
    DOCUMENT_VERSION_CONFLICT = "document_version_conflict"
    DOCUMENT_SOURCE_UNAVAILABLE = "document_source_unavailable"
    INTERNAL_ERROR = "internal_error"


class ErrorInfo(BaseModel):
    """The ``error`` member of an outcome: safe to show to the agent and its user."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    code: ErrorCode
    """One of the contract's error codes."""
    message: str
    """Human-readable and safe: never a secret, a token or a stack trace."""
    details: dict[str, Any] = Field(default_factory=dict)
    """Structured context, e.g. field-level validation errors."""
    retryable: bool = False
    """Whether the same request may succeed if sent again later."""
    retry_after_s: float | None = None
    """When known, how long to wait before retrying."""


class ToolfleetError(Exception):
    """Root of every toolfleet error."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL_ERROR
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or {}
        self.retry_after_s = retry_after_s

    def to_error_info(self) -> ErrorInfo:
        return ErrorInfo(
            code=self.code,
            message=self.message,
            details=self.details,
            retryable=self.retryable,
            retry_after_s=self.retry_after_s,
        )


class InvalidEvent(ToolfleetError):
    code = ErrorCode.INVALID_EVENT


class InvalidParameters(ToolfleetError):
    code = ErrorCode.INVALID_PARAMETERS


class ToolNotFound(ToolfleetError):
    code = ErrorCode.TOOL_NOT_FOUND


class ToolVersionNotFound(ToolfleetError):
    code = ErrorCode.TOOL_VERSION_NOT_FOUND


class ToolRemoved(ToolfleetError):
    code = ErrorCode.TOOL_REMOVED


class PermissionDenied(ToolfleetError):
    code = ErrorCode.PERMISSION_DENIED


class ApprovalDenied(ToolfleetError):
    code = ErrorCode.APPROVAL_DENIED


class RateLimitExceeded(ToolfleetError):
    code = ErrorCode.RATE_LIMIT_EXCEEDED
    retryable = True


class IdempotencyConflict(ToolfleetError):
    code = ErrorCode.IDEMPOTENCY_CONFLICT


class InvocationIdConflict(ToolfleetError):
    """The invocation id belongs to an earlier call of another tenant, agent, tool,
    version or parameters: the request is refused and the earlier call is untouched."""

    code = ErrorCode.INVOCATION_ID_CONFLICT


class ToolExecutionError(ToolfleetError):
    code = ErrorCode.TOOL_EXECUTION_ERROR


class SandboxFailure(ToolExecutionError):
    code = ErrorCode.SANDBOX_FAILURE


class ExternalApiError(ToolExecutionError):
    code = ErrorCode.EXTERNAL_API_ERROR
    retryable = True


class CircuitBreakerOpen(ToolfleetError):
    code = ErrorCode.CIRCUIT_BREAKER_OPEN
    retryable = True


class ToolTimeout(ToolfleetError):
    code = ErrorCode.TIMEOUT
    retryable = True


class ResourceExhausted(ToolfleetError):
    code = ErrorCode.RESOURCE_EXHAUSTED
    retryable = True


class ResultValidationFailed(ToolfleetError):
    """The result does not match the tool's output schema."""

    code = ErrorCode.RESULT_VALIDATION_FAILED


class ResultCoercionFailed(ResultValidationFailed):
    """A tool in ``coerce`` mode returned a value no listed coercion turns into the
    declared type (``"abc"`` for an integer, ``"2024-13-45"`` for a date)."""

    code = ErrorCode.RESULT_COERCION_FAILED


class ResultSanitizationRejected(ResultValidationFailed):
    """A string field matched a sanitization rule whose action is ``reject``; the
    details name the rule ids and field paths, never the value."""

    code = ErrorCode.RESULT_SANITIZATION_REJECTED


class ResultTooLarge(ResultValidationFailed):
    """The result is larger, or nested deeper, than the tool's limits allow. The same
    call would return the same result, so a retry does not help."""

    code = ErrorCode.RESULT_TOO_LARGE


class RedactionFailed(ToolfleetError):
    code = ErrorCode.REDACTION_FAILED


class Cancelled(ToolfleetError):
    """The call was cancelled; a tool raises it when it sees ``ctx.cancelled``."""

    code = ErrorCode.CANCELLED


class CheckpointFailed(ToolfleetError):
    code = ErrorCode.CHECKPOINT_FAILED
    retryable = True


class ResumeFailed(ToolfleetError):
    code = ErrorCode.RESUME_FAILED


class StateConflict(ToolfleetError):
    code = ErrorCode.STATE_CONFLICT


class DocumentNotFound(ToolfleetError):
    """The source has no such document, or not at the version asked for."""

    code = ErrorCode.DOCUMENT_NOT_FOUND


class DocumentAccessDenied(ToolfleetError):
    """The call may not read the document: its ``document_context`` does not name it."""

    code = ErrorCode.DOCUMENT_ACCESS_DENIED


class DocumentVersionConflict(ToolfleetError):
    """The version the call is pinned to (by the request or a first read) is not the
    one the source answered with."""

    code = ErrorCode.DOCUMENT_VERSION_CONFLICT


class DocumentSourceUnavailable(ToolfleetError):
    """The document source (an MCP server) did not answer, or answered malformed."""

    code = ErrorCode.DOCUMENT_SOURCE_UNAVAILABLE
    retryable = True


class RegistrationError(ToolfleetError):
    """A tool definition is unusable (raised at start-up, never sent on the wire)."""


class ProviderSchemaError(RegistrationError):
    """A tool's input schema uses a construct a model provider's strict mode refuses.

    Raised when an agent run compiles its catalog; the message names the tool and the
    JSON pointer of the construct, never a value.
    """

    def __init__(self, tool_id: str, path: str, problem: str) -> None:
        super().__init__(
            f"tool {tool_id!r}: {problem} at {path}",
            details={"tool_id": tool_id, "path": path},
        )
        self.tool_id = tool_id
        self.path = path


class KafkaSecurityError(ToolfleetError):
    """The Kafka TLS/SASL settings are unusable: a bad combination or an unreadable file.

    Raised when a Kafka client is built, before anything is sent; never on the wire.
    """


def is_retryable(exc: BaseException) -> bool:
    """The retry predicate: only errors whose class says so are retried."""
    return isinstance(exc, ToolfleetError) and exc.retryable


def _error_classes() -> dict[ErrorCode, type[ToolfleetError]]:
    found: dict[ErrorCode, type[ToolfleetError]] = {}
    pending: list[type[ToolfleetError]] = [ToolfleetError]
    while pending:
        cls = pending.pop()
        if cls is not RegistrationError:
            found.setdefault(cls.code, cls)
        pending.extend(cls.__subclasses__())
    return found


def error_from(info: ErrorInfo) -> ToolfleetError:
    """The error an ``ErrorInfo`` was made from (its class, so its ``retryable`` flag)."""
    cls = _error_classes().get(info.code, ToolfleetError)
    return cls(info.message, details=info.details, retry_after_s=info.retry_after_s)
