"""The grouped options of ``@tool``: each concept spelled once.

- :class:`Results`: what the validator checks in a result (``validation``,
  ``sanitize``, ``max_bytes``), stored as the manifest's ``result_rules``;
- :class:`Resilience`: how the executor protects the tool and its upstream
  (``retry``, ``circuit`` with its name inside, ``cache``);
- :class:`Sandbox`: where it runs and what it reaches (``isolation``, ``limits``,
  ``permissions``: files, hosts and the credentials it reads).

Plain frozen values checked when built: a bad value raises
:class:`~toolfleet.errors.RegistrationError` naming the option, before any tool is
declared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from toolfleet.contract.manifest import ResourceDefaults, ToolPermissions
from toolfleet.contract.result_rules import ResultRules, SanitizeRule
from toolfleet.errors import RegistrationError
from toolfleet.tools.limits import Isolation, ToolLimits
from toolfleet.tools.resilience import Breaker, Cache, Retry


@dataclass(frozen=True, kw_only=True)
class Results:
    """What the validator does with the tool's results, besides the output schema and
    the redaction allowlist (the manifest's ``result_rules``)."""

    validation: Literal["strict", "coerce"] = "strict"
    """``strict``: the result must match the output schema as is; ``coerce``: listed safe
    coercions first, each reported in the outcome's ``warnings``."""
    sanitize: Mapping[str, str | SanitizeRule | Mapping[str, Any]] = field(default_factory=dict)
    """Field path (``$.body``, ``$.items[*].title``) or ``*`` to an action (``allow``,
    ``escape``, ``redact``, ``reject``) or a :class:`SanitizeRule`; empty: no sanitizing."""
    max_bytes: int | None = None
    """Largest result (compact JSON) the tool may return; None: the fleet's limit."""

    def __post_init__(self) -> None:
        self.rules()  # refuse a bad value where it is written, not at ``@tool``

    def rules(self) -> ResultRules:
        """These options as the manifest stores them.

        Raises:
            RegistrationError: naming every invalid value.
        """
        if not isinstance(self.sanitize, Mapping):
            raise RegistrationError(
                "Results.sanitize maps field paths to actions, like {'$.body': 'escape'}"
            )
        try:
            return ResultRules.model_validate(
                {
                    "mode": self.validation,
                    "sanitize": dict(self.sanitize),
                    "max_bytes": self.max_bytes,
                }
            )
        except ValidationError as exc:
            problems = "; ".join(
                f"{_option(error['loc'])}: {error['msg']}" for error in exc.errors()
            )
            raise RegistrationError(f"invalid result rules: {problems}") from None


_RESULT_OPTIONS = {"mode": "validation", "sanitize": "sanitize", "max_bytes": "max_bytes"}


def _option(loc: tuple[int | str, ...]) -> str:
    """A validation error's location, spelled as ``Results``' options."""
    head, *rest = loc or ("?",)
    return ".".join([_RESULT_OPTIONS.get(str(head), str(head)), *map(str, rest)])


@dataclass(frozen=True, kw_only=True)
class Resilience:
    """How the executor protects the tool and its upstream (all optional)."""

    retry: Retry = field(default_factory=Retry)
    """Retries of retryable errors (default: none)."""
    circuit: Breaker = field(default_factory=Breaker)
    """The circuit breaker the calls go through; ``circuit.name`` empty: the tool id."""
    cache: Cache | None = None
    """Result cache (default: none). A tool that reads credentials cannot have one."""

    def __post_init__(self) -> None:
        for name, value, kind in (
            ("retry", self.retry, Retry),
            ("circuit", self.circuit, Breaker),
            ("cache", self.cache, Cache | None),
        ):
            if not isinstance(value, kind):
                raise RegistrationError(
                    f"Resilience.{name} takes a {_names(kind)}, not {type(value).__name__}"
                )


@dataclass(frozen=True, kw_only=True)
class Sandbox:
    """Where the tool runs and what it reaches outside its process."""

    isolation: Isolation | str | None = None
    """``none`` (the executor's loop), ``process`` or ``sandbox``; None: the module's
    ``TOOLFLEET_ISOLATION``, else ``none`` for toolfleet's own tools and ``sandbox`` for
    every other. A string (``"process"``) is accepted and kept as :class:`Isolation`."""
    limits: ToolLimits = field(default_factory=ToolLimits)
    """What a call needs (memory, CPU, processes, files): the one place a tool states its
    limits; a call whose agent has less is refused before it runs."""
    permissions: ToolPermissions = field(default_factory=ToolPermissions)
    """Files and hosts it reaches, and the named credentials it reads with
    ``ctx.credential(name)`` (a call must then name a ``connection_id``)."""
    defaults: ResourceDefaults = field(default_factory=ResourceDefaults)
    """What a call runs under when its agent states less or nothing (the manifest's
    ``resource_defaults``): a ceiling the executor applies, where :attr:`limits` is what
    the tool needs and refuses to run without."""

    def __post_init__(self) -> None:
        if self.isolation is not None:
            try:
                object.__setattr__(self, "isolation", Isolation(self.isolation))
            except ValueError:
                raise RegistrationError(
                    f"Sandbox.isolation must be one of {[i.value for i in Isolation]}, "
                    f"not {self.isolation!r}"
                ) from None
        if not isinstance(self.limits, ToolLimits):
            raise RegistrationError(
                f"Sandbox.limits takes a ToolLimits, not {type(self.limits).__name__}"
            )
        if not isinstance(self.defaults, ResourceDefaults):
            kind = type(self.defaults).__name__
            raise RegistrationError(f"Sandbox.defaults takes a ResourceDefaults, not {kind}")
        if not isinstance(self.permissions, ToolPermissions):
            kind = type(self.permissions).__name__
            raise RegistrationError(f"Sandbox.permissions takes a ToolPermissions, not {kind}")


def _names(kind: Any) -> str:
    args = getattr(kind, "__args__", (kind,))
    return " or ".join("None" if a is type(None) else a.__name__ for a in args)
