"""The status API: HTTP over the status projection and the registry, publishing to Kafka.

Exports load on first use: :mod:`toolfleet.api.settings` is read on installs without the
``api`` extra (FastAPI, uvicorn). The bodies the API and its clients share are
:mod:`toolfleet.contract.http`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolfleet.api.app import create_app
    from toolfleet.api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from toolfleet.api.app import create_app

        return create_app
    if name == "ApiSettings":
        from toolfleet.api.settings import ApiSettings

        return ApiSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
