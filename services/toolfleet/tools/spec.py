"""``@tool``: declare a typed async function a registered, versioned tool.

The decorator returns the function itself, still callable as written (tests may await
it directly); the declaration travels with it as ``fn.__toolfleet_spec__``, read with
:func:`spec_of`.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

import semver
from pydantic import BaseModel

from toolfleet.contract.manifest import (
    CircuitSettings,
    ResourceDefaults,
    RetrySettings,
    SourceType,
    ToolCategory,
    ToolManifest,
    ToolPermissions,
)
from toolfleet.contract.result_rules import ResultRules
from toolfleet.errors import RegistrationError
from toolfleet.events.models import TOOL_ID_PATTERN, Effect
from toolfleet.events.types import DEFAULT_POOL, check_pool_name
from toolfleet.secrets.store import check_name
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import Isolation, ToolLimits
from toolfleet.tools.options import Resilience, Results, Sandbox
from toolfleet.tools.resilience import Breaker, Cache, Retry

ToolFunction = Callable[[Any, ToolContext], Awaitable[Any]]
F = TypeVar("F", bound=ToolFunction)

#: A tool module may set this to its tools' default isolation (``"none"``, ``"process"``).
MODULE_DEFAULT = "TOOLFLEET_ISOLATION"
#: A tool module may set this to its tools' default executor pool (``"gpu"``).
MODULE_POOL = "TOOLFLEET_POOL"

#: The attribute ``@tool`` sets on the function it declares.
SPEC_ATTRIBUTE = "__toolfleet_spec__"

#: Fields an input schema may not declare: credentials flow through capabilities.
_RESERVED_INPUT_FIELDS = frozenset({"connection_id", "capability_token"})


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool as the executor runs it and the registry records it (``spec_of(fn)``).

    ``@tool`` builds it from its arguments and option groups; tool sources build it
    from a registered source's tool. Read-only for tool authors: :meth:`manifest` is what
    the registry stores.
    """

    tool_id: str
    version: str
    effect: Effect
    fn: ToolFunction
    """The decorated function itself."""
    input_model: type[BaseModel]
    output_model: type[BaseModel]
    redaction_allowlist: tuple[str, ...]
    timeout_seconds: float
    description: str = ""
    category: str = "general"
    tags: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    """Search words beyond the name and description (the manifest's ``keywords``)."""
    credentials: tuple[str, ...] = ()
    """Named credentials the tool reads with ``ctx.credential(name)`` (``@tool``: its
    ``Sandbox.permissions.credentials``)."""
    input_schema: dict[str, Any] = field(default_factory=dict)
    output_schema: dict[str, Any] = field(default_factory=dict)
    retry: Retry = field(default_factory=Retry)
    """Retries of retryable errors (default: none; ``Resilience.retry``)."""
    circuit: str = ""
    """Name of the circuit breaker the tool's calls go through (default: the tool id;
    ``Resilience.circuit.name``)."""
    circuit_breaker: Breaker = field(default_factory=Breaker)
    """Thresholds of that circuit breaker (``Resilience.circuit``)."""
    cache: Cache | None = None
    """Result cache (default: none; ``Resilience.cache``)."""
    result_rules: ResultRules = field(default_factory=ResultRules)
    """Result validation mode, sanitization and limits the validator applies
    (``Results``)."""
    requires_approval: bool = False
    """Every call waits for an approver, whatever the tenant's policy says."""
    permissions: ToolPermissions = field(default_factory=ToolPermissions)
    """What the tool reaches outside its process: files, hosts, credentials
    (``Sandbox.permissions``)."""
    resource_defaults: ResourceDefaults = field(default_factory=ResourceDefaults)
    """The manifest's ``resource_defaults``: CPU and memory a call runs under unless its
    request asks for less. ``@tool`` leaves it empty: a tool states its limits once,
    in ``Sandbox.limits`` (:attr:`limits`)."""
    source_type: SourceType = SourceType.NATIVE
    """Where the code lives: ``@tool`` functions run in the executor's process."""
    isolation: Isolation = Isolation.SANDBOX
    """Where it runs: ``none`` (the executor's loop), ``process`` or ``sandbox``
    (``Sandbox.isolation``)."""
    limits: ToolLimits = field(default_factory=ToolLimits)
    """What it needs (memory, CPU, processes, files), within its agent's limits
    (``Sandbox.limits``)."""
    command: tuple[str, ...] = ()
    """A command tool's executable and arguments (:func:`toolfleet.sdk.command_tool`)."""
    pool: str = DEFAULT_POOL
    """The executor pool that runs it (executors started with ``--pool <pool>``)."""

    @property
    def target(self) -> str:
        """``module:qualname``, how an isolated worker imports the tool."""
        return f"{self.fn.__module__}:{self.fn.__qualname__}"

    @property
    def circuit_name(self) -> str:
        return self.circuit or self.tool_id

    @property
    def key(self) -> tuple[str, str]:
        return (self.tool_id, self.version)

    def manifest(self) -> ToolManifest:
        return ToolManifest(
            tool_id=self.tool_id,
            version=self.version,
            effect=self.effect,
            description=self.description,
            category=self.category,
            tags=list(self.tags),
            keywords=list(self.keywords),
            source_type=self.source_type,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            redaction_allowlist=list(self.redaction_allowlist),
            timeout_seconds=self.timeout_seconds,
            credentials=list(self.credentials),
            permissions=self.permissions,
            requires_approval=self.requires_approval,
            resource_defaults=self.resource_defaults,
            retry_policy=RetrySettings(
                max_attempts=self.retry.max_attempts,
                initial_backoff_s=self.retry.initial_backoff_s,
                max_backoff_s=self.retry.max_backoff_s,
            ),
            circuit=CircuitSettings(
                name=self.circuit_name,
                failure_rate=self.circuit_breaker.failure_rate,
                minimum_calls=self.circuit_breaker.minimum_calls,
                window_size=self.circuit_breaker.window_size,
                slow_call_s=self.circuit_breaker.slow_call_s,
                open_s=self.circuit_breaker.open_s,
                half_open_calls=self.circuit_breaker.half_open_calls,
            ),
            result_rules=self.result_rules,
            isolation=self.isolation.value,
            command=list(self.command),
            pool=self.pool,
        )


def tool(
    *,
    id: str,
    version: str,
    effect: Effect | str,
    redaction_allowlist: list[str] | tuple[str, ...] | None = None,
    timeout_seconds: float = 30.0,
    description: str | None = None,
    category: str = "general",
    tags: list[str] | tuple[str, ...] = (),
    keywords: list[str] | tuple[str, ...] = (),
    requires_approval: bool = False,
    pool: str | None = None,
    results: Results | None = None,
    resilience: Resilience | None = None,
    sandbox: Sandbox | None = None,
) -> Callable[[F], F]:
    """Declare a tool; the decorated function is returned unchanged, still callable.

    Example::

        from pydantic import BaseModel
        from toolfleet.sdk import ToolContext, tool

        class EchoIn(BaseModel):
            message: str

        class EchoOut(BaseModel):
            message: str
            length: int

        @tool(id="acme__echo", version="1.0.0", effect="read_only",
              redaction_allowlist=["message", "length"])
        async def echo(params: EchoIn, ctx: ToolContext) -> EchoOut:
            return EchoOut(message=params.message, length=len(params.message))

    Input and output JSON Schemas are generated from the pydantic models. The
    redaction allowlist names the result fields clients may see (dotted paths);
    every other field is redacted. It is required: a tool without one is refused.
    ``requires_approval=True`` parks every call until an approver decides, whatever the
    tenant's policy says. ``pool="gpu"`` puts the tool in the executor pool ``gpu``
    (lower-case letters, digits, ``-``, ``_``): only executors started with ``--pool gpu``
    run it; a module's ``TOOLFLEET_POOL = "gpu"`` sets the default of its tools.

    Everything else comes in three groups (:mod:`toolfleet.tools.options`), each concept
    in one place::

        @tool(id="acme__repos", version="1.0.0", effect="read_only",
              redaction_allowlist=["count"],
              results=Results(validation="coerce", sanitize={"*": "escape"},
                              max_bytes=100_000),
              resilience=Resilience(retry=Retry(max_attempts=3),
                                    circuit=Breaker(name="api.github.com")),
              sandbox=Sandbox(isolation="process", limits=ToolLimits(memory_mb=256),
                              permissions=ToolPermissions(network=["api.github.com"],
                                                          credentials=["api_key"])))

    - :class:`Results`: the validator's mode, sanitization by field path and size limit
      (the manifest's ``result_rules``);
    - :class:`Resilience`: retries of retryable errors, the circuit breaker (named by
      ``circuit.name``, default the tool id) and a result cache;
    - :class:`Sandbox`: the isolation (``none``, ``process``, ``sandbox``; default: the
      module's ``TOOLFLEET_ISOLATION``, else ``none`` for toolfleet's own tools and
      ``sandbox`` for others), what a call needs (``ToolLimits``; a call whose agent has
      less is refused) and what the tool reaches (``ToolPermissions``: files, hosts and
      the credentials it reads with ``ctx.credential(name)``; a call must then name a
      ``connection_id``, and an input model may not declare it).

    Raises:
        RegistrationError: when the declaration is refused, naming why.
    """

    def decorate(fn: F) -> F:
        declared = fn  # returned as is (the coroutine check below narrows ``fn``)
        if not inspect.iscoroutinefunction(fn):
            raise RegistrationError(f"{id}: a tool must be an async function")
        if not re.fullmatch(TOOL_ID_PATTERN, id) or len(id) > 128:
            raise RegistrationError(
                f"{id!r}: tool ids are namespaced lower-case identifiers, like 'acme__get_weather'"
            )
        try:
            semver.Version.parse(version)
        except ValueError:
            raise RegistrationError(f"{id}: {version!r} is not a semantic version") from None
        if redaction_allowlist is None:
            raise RegistrationError(
                f"{id}: redaction_allowlist is required (list the result fields clients may see)"
            )
        if timeout_seconds <= 0:
            raise RegistrationError(f"{id}: timeout_seconds must be positive")
        if category not in set(ToolCategory):
            raise RegistrationError(
                f"{id}: category {category!r} is not one of {sorted(ToolCategory)}; "
                "use tags for free-form grouping"
            )
        for name, value, kind in (
            ("results", results, Results),
            ("resilience", resilience, Resilience),
            ("sandbox", sandbox, Sandbox),
        ):
            if value is not None and not isinstance(value, kind):
                raise RegistrationError(
                    f"{id}: {name}= takes a {kind.__name__} (from toolfleet.sdk), "
                    f"not {type(value).__name__}"
                )
        rules, guards, runs = results or Results(), resilience or Resilience(), sandbox or Sandbox()
        input_model, output_model = _models_of(id, fn)
        input_schema = input_model.model_json_schema()
        output_schema = output_model.model_json_schema()
        reserved = _RESERVED_INPUT_FIELDS & set(input_schema.get("properties", {}))
        if reserved:
            raise RegistrationError(
                f"{id}: input may not declare {sorted(reserved)}; "
                "credentials reach tools through capabilities"
            )
        _check_allowlist(id, list(redaction_allowlist), output_schema)
        credentials = tuple(runs.permissions.credentials)
        _check_credentials(id, credentials)
        if guards.cache is not None and credentials:
            raise RegistrationError(f"{id}: a tool that uses credentials cannot be cached")
        spec = ToolSpec(
            tool_id=id,
            version=version,
            effect=Effect(effect),
            fn=fn,
            input_model=input_model,
            output_model=output_model,
            redaction_allowlist=tuple(redaction_allowlist),
            timeout_seconds=float(timeout_seconds),
            description=description if description is not None else inspect.getdoc(fn) or "",
            category=category,
            tags=tuple(tags),
            keywords=tuple(keywords),
            credentials=credentials,
            permissions=runs.permissions.model_copy(update={"credentials": sorted(credentials)}),
            requires_approval=requires_approval,
            retry=guards.retry,
            circuit=guards.circuit.name,
            circuit_breaker=guards.circuit,
            cache=guards.cache,
            result_rules=rules.rules(),
            isolation=_isolation_of(fn, runs.isolation),
            limits=runs.limits,
            resource_defaults=runs.defaults,
            pool=_pool_of(id, fn, pool),
            input_schema={
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                **input_schema,
            },
            output_schema={
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                **output_schema,
            },
        )
        setattr(declared, SPEC_ATTRIBUTE, spec)
        return declared

    return decorate


def _isolation_of(fn: ToolFunction, isolation: Isolation | str | None) -> Isolation:
    """The declared runtime; undeclared: the module's ``TOOLFLEET_ISOLATION`` if it sets
    one, else ``none`` for toolfleet's own tools and ``sandbox`` for every other."""
    if isolation is None:
        isolation = getattr(sys.modules.get(fn.__module__), MODULE_DEFAULT, None)
    if isolation is not None:
        try:
            return Isolation(isolation)
        except ValueError:
            raise RegistrationError(
                f"isolation must be one of {[i.value for i in Isolation]}"
            ) from None
    trusted = fn.__module__.startswith("toolfleet.")
    return Isolation.NONE if trusted else Isolation.SANDBOX


def _pool_of(tool_id: str, fn: ToolFunction, pool: str | None) -> str:
    """The declared pool; undeclared: the module's ``TOOLFLEET_POOL`` if it sets one, else
    ``default``."""
    if pool is None:
        pool = getattr(sys.modules.get(fn.__module__), MODULE_POOL, None)
    if pool is None:
        return DEFAULT_POOL
    try:
        return check_pool_name(pool)
    except ValueError as exc:
        raise RegistrationError(f"{tool_id}: {exc}") from None


def spec_of(tool_fn: ToolFunction | ToolSpec) -> ToolSpec:
    """The :class:`ToolSpec` ``@tool`` attached to ``tool_fn`` (a spec is returned as is).

    Raises:
        RegistrationError: ``tool_fn`` was not declared with ``@tool``.
    """
    if isinstance(tool_fn, ToolSpec):
        return tool_fn
    spec = getattr(tool_fn, SPEC_ATTRIBUTE, None)
    if not isinstance(spec, ToolSpec):
        name = getattr(tool_fn, "__qualname__", type(tool_fn).__name__)
        raise RegistrationError(f"{name} is not a tool: declare it with @tool(...)")
    return spec


def is_tool(value: object) -> bool:
    """Whether ``value`` is a function declared with ``@tool``."""
    return callable(value) and isinstance(getattr(value, SPEC_ATTRIBUTE, None), ToolSpec)


def _models_of(tool_id: str, fn: ToolFunction) -> tuple[type[BaseModel], type[BaseModel]]:
    hints = get_type_hints(fn)
    params = list(inspect.signature(fn).parameters)
    if len(params) != 2:
        raise RegistrationError(f"{tool_id}: a tool takes (params: InputModel, ctx: ToolContext)")
    input_model = hints.get(params[0])
    output_model = hints.get("return")
    for what, model in (("input", input_model), ("output", output_model)):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise RegistrationError(f"{tool_id}: the {what} type must be a pydantic model")
    assert isinstance(input_model, type)
    assert isinstance(output_model, type)
    return input_model, output_model


def _check_allowlist(tool_id: str, allowlist: list[str], output_schema: dict[str, Any]) -> None:
    top_level = set(output_schema.get("properties", {}))
    unknown = [path for path in allowlist if path.split(".", 1)[0] not in top_level]
    if unknown:
        raise RegistrationError(
            f"{tool_id}: redaction_allowlist names fields the output does not have: {unknown}"
        )


def _check_credentials(tool_id: str, credentials: list[str] | tuple[str, ...]) -> None:
    if isinstance(credentials, str):
        raise RegistrationError(f"{tool_id}: credentials is a list of names, not one string")
    for name in credentials:
        try:
            check_name(name)
        except (ValueError, TypeError) as exc:
            raise RegistrationError(f"{tool_id}: {exc}") from None
    if len(set(credentials)) != len(credentials):
        raise RegistrationError(f"{tool_id}: credentials names a credential twice")
