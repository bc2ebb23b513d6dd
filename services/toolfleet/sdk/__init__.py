"""toolfleet's SDK for tool authors: declare tools (``@tool``), test them (``.testing``).

A core install (``pip install toolfleet``) is enough: importing the SDK pulls in no
broker, database or web-server client. Publishing invocations is the producer's side,
:mod:`toolfleet.client`.

The definitions live one floor down, in :mod:`toolfleet.tools`, where the isolation
runtime, the sources and the executor build on them; this package is their face for tool
authors, with the testing kit (which runs the executor's own run step) and the built-in
tools.
"""

from toolfleet.contract.manifest import FilesystemAccess, ResourceDefaults, ToolPermissions
from toolfleet.events.models import Effect
from toolfleet.tools.context import ToolContext
from toolfleet.tools.policies import CachePolicy, CircuitPolicy, RetryPolicy
from toolfleet.tools.spec import ToolSpec, spec_of, tool

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
