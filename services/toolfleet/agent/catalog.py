"""The catalog of one agent run: the tools it may show the model, compiled once.

Built from the manifests the fleet's catalog returns for the run's token
(``GET /v1/tools``: what the tenant's policy allows *and* the token's ``tool_id`` claim
grants, so a ``core__echo`` token's run is offered ``core__echo`` alone), minus the
effects the run denies itself (a read-only agent denies ``external_side_effect``).
Each input schema is made provider-safe and compiled once; a call to a tool outside
the catalog never reaches the fleet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from toolfleet.agent.schema import provider_safe
from toolfleet.contract.manifest import LifecycleState, ToolManifest
from toolfleet.errors import ProviderSchemaError
from toolfleet.events.models import Effect
from toolfleet.registry.schemas import CompiledSchemas

__all__ = ["MAX_TOOL_NAME", "CatalogTool", "RunCatalog"]

MAX_TOOL_NAME = 64
"""The longest tool name OpenAI accepts (Anthropic: 128); longer tool ids are refused."""


@dataclass(frozen=True, kw_only=True)
class CatalogTool:
    """One tool as the model sees it."""

    manifest: ToolManifest
    schema: dict[str, Any]
    """The provider-safe input schema."""

    @property
    def name(self) -> str:
        return self.manifest.tool_id

    @property
    def description(self) -> str:
        return self.manifest.description or self.manifest.tool_id


@dataclass(frozen=True, kw_only=True)
class RunCatalog:
    """The tools of one run, by name, in a stable order."""

    tools: tuple[CatalogTool, ...]
    denied_effects: frozenset[Effect] = frozenset()
    strict: bool = False
    refused: tuple[ProviderSchemaError, ...] = ()
    """Tools left out because their schema cannot be made provider-safe (``skip_unsafe``)."""
    _schemas: CompiledSchemas = field(default_factory=CompiledSchemas, repr=False)

    @classmethod
    def compile(
        cls,
        manifests: Iterable[ToolManifest],
        *,
        denied_effects: Iterable[Effect | str] = (),
        strict: bool = False,
        skip_unsafe: bool = False,
    ) -> RunCatalog:
        """Newest usable version of each tool.

        A schema strict modes refuse raises :class:`~toolfleet.errors.ProviderSchemaError`
        naming the tool and path; with ``skip_unsafe`` the tool is left out instead and
        the error kept in :attr:`refused`.
        """
        denied = frozenset(Effect(e) for e in denied_effects)
        newest: dict[str, ToolManifest] = {}
        for manifest in manifests:
            if manifest.lifecycle_state is LifecycleState.REMOVED or manifest.effect in denied:
                continue
            newest.setdefault(manifest.tool_id, manifest)  # the registry lists newest first
        tools: list[CatalogTool] = []
        refused: list[ProviderSchemaError] = []
        for _, m in sorted(newest.items()):
            try:
                if len(m.tool_id) > MAX_TOOL_NAME:
                    raise ProviderSchemaError(
                        m.tool_id, "#", f"a tool name longer than {MAX_TOOL_NAME} characters"
                    )
                schema = provider_safe(m.tool_id, m.input_schema, strict=strict)
            except ProviderSchemaError as exc:
                if not skip_unsafe:
                    raise
                refused.append(exc)
                continue
            tools.append(CatalogTool(manifest=m, schema=schema))
        return cls(tools=tuple(tools), denied_effects=denied, strict=strict, refused=tuple(refused))

    def get(self, name: str) -> CatalogTool | None:
        for tool in self.tools:
            if tool.name == name:
                return tool
        return None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tools]

    def argument_errors(self, name: str, arguments: dict[str, Any]) -> list[dict[str, str]]:
        """Errors of ``arguments`` against the tool's registry schema (values never quoted)."""
        tool = self.get(name)
        if tool is None:
            return [{"field": "/", "message": "no such tool", "keyword": "tool"}]
        return self._schemas.errors(tool.manifest.input_schema, arguments)
