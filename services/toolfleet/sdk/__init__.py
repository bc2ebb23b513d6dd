"""toolfleet's SDK for tool authors: declare tools (``@tool``), test them (``.testing``).

A core install (``pip install toolfleet``) is enough: importing the SDK pulls in no
broker, database or web-server client. Publishing invocations is the producer's side,
:mod:`toolfleet.client`.
"""

from toolfleet.events.models import Effect
from toolfleet.registry.manifest import FilesystemAccess, ResourceDefaults, ToolPermissions
from toolfleet.sdk.context import ToolContext
from toolfleet.sdk.policies import CachePolicy, CircuitPolicy, RetryPolicy
from toolfleet.sdk.tool import ToolSpec, spec_of, tool

__all__ = [
    "CachePolicy",
    "CircuitPolicy",
    "Effect",
    "FilesystemAccess",
    "ResourceDefaults",
    "RetryPolicy",
    "ToolContext",
    "ToolPermissions",
    "ToolSpec",
    "spec_of",
    "tool",
]
