"""The analytics app's own knobs."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from toolfleet.analytics.detectors import DetectorSettings
from toolfleet.settings import FleetSettings


class AnalyticsSettings(FleetSettings):
    analytics_snapshot_interval_s: float = Field(default=2.0, gt=0)
    """How often the analytics app writes changed tenants' snapshots for the API and
    Prometheus; an idle app writes nothing."""
    analytics_data_dir: Path | None = None
    """Where the faust app keeps its local files; unset: a temporary directory (tables
    live in memory and are restored from their changelog topics at start)."""
    analytics_denial_spike: int = Field(default=10, ge=1)
    """``permission_denied``/``approval_denied`` outcomes of one agent in one minute that
    make a denial spike."""
    analytics_error_rate: float = Field(default=0.5, gt=0, le=1)
    """A tool's error rate (``error``+``timeout`` outcomes) in one minute that is high ..."""
    analytics_error_rate_jump: float = Field(default=0.3, gt=0, le=1)
    """... when it is also this much above the tool's rate over the rest of the hour."""
    analytics_error_rate_min_outcomes: int = Field(default=10, ge=1)
    """Outcomes of a tool in one minute before its error rate is judged."""
    analytics_novel_tools: int = Field(default=5, ge=1)
    """Tools an agent never called before, called in one minute, that make a finding."""
    analytics_novel_warmup_s: float = Field(default=600.0, ge=0)
    """A new agent explores freely for this long before novel-tool findings apply."""
    analytics_metrics_max_tenants: int = Field(default=50, ge=1)
    """Tenants with a label of their own in the Prometheus metrics (the busiest ones);
    the rest are summed under ``tenant="other"`` so label cardinality stays bounded."""

    def detectors(self) -> DetectorSettings:
        return DetectorSettings(
            denial_spike=self.analytics_denial_spike,
            error_rate_min_outcomes=self.analytics_error_rate_min_outcomes,
            error_rate=self.analytics_error_rate,
            error_rate_jump=self.analytics_error_rate_jump,
            novel_tools=self.analytics_novel_tools,
            novel_warmup_s=self.analytics_novel_warmup_s,
        )
