"""The status API: HTTP over the status projection and the registry, publishing to Kafka."""

from toolfleet.api.app import create_app
from toolfleet.api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]
