"""toolfleet's SDK for tool authors: declare tools (``@tool``), test them (``.testing``).

Everything a tool module needs is importable from here::

    from toolfleet.sdk import Resilience, Retry, ToolContext, tool

A core install (``pip install toolfleet``) is enough: importing the SDK pulls in no
broker, database or web-server client. Publishing invocations is the producer's side,
:mod:`toolfleet.client`.

The definitions live lower floors down (:mod:`toolfleet.tools`, where the isolation
runtime, the sources and the executor build on them; the manifest's parts in
:mod:`toolfleet.contract`; command tools in :mod:`toolfleet.isolation.command`); this
package is their one face for tool authors, with the testing kit (which runs the
executor's own run step) and the built-in tools.
"""

from toolfleet.contract.manifest import FilesystemAccess, ResourceDefaults, ToolPermissions
from toolfleet.contract.result_rules import SanitizeRule
from toolfleet.errors import Cancelled
from toolfleet.events.models import Effect
from toolfleet.isolation.command import command_tool
from toolfleet.tools.context import ToolContext
from toolfleet.tools.documents import Document, DocumentMetadata, SearchHit
from toolfleet.tools.limits import Isolation, ToolLimits
from toolfleet.tools.options import Resilience, Results, Sandbox
from toolfleet.tools.resilience import Breaker, Cache, Retry
from toolfleet.tools.spec import ToolSpec, spec_of, tool

__all__ = [
    "Breaker",
    "Cache",
    "Cancelled",
    "Document",
    "DocumentMetadata",
    "Effect",
    "FilesystemAccess",
    "Isolation",
    "Resilience",
    "ResourceDefaults",
    "Results",
    "Retry",
    "Sandbox",
    "SanitizeRule",
    "SearchHit",
    "ToolContext",
    "ToolLimits",
    "ToolPermissions",
    "ToolSpec",
    "command_tool",
    "spec_of",
    "tool",
]
