"""Window arithmetic on event time (epoch seconds). Pure.

A window is ``(start, end)``, start inclusive, end exclusive. Tumbling windows are
hopping windows whose step is their size, so one rule serves both: a fact at ``t``
belongs to every window ``[k·step, k·step + size)`` that contains ``t``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

Window = tuple[float, float]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowSpec:
    """The shape of one family of windows."""

    name: str
    """Label of the family in snapshots and metrics (``1m``, ``1h``)."""
    size_s: float
    step_s: float

    def __post_init__(self) -> None:
        if self.size_s <= 0 or self.step_s <= 0 or self.step_s > self.size_s:
            raise ValueError(f"window {self.name}: need 0 < step <= size")

    def ranges(self, at: float) -> list[Window]:
        """Every window containing ``at``, oldest first."""
        latest = math.floor(at / self.step_s) * self.step_s
        starts: list[float] = []
        start = latest
        while start + self.size_s > at:
            starts.append(start)
            start -= self.step_s
        return [(s, s + self.size_s) for s in reversed(starts)]

    def current(self, at: float) -> Window:
        """The newest window containing ``at`` (the one that just started)."""
        return self.ranges(at)[-1]

    def earliest(self, at: float) -> Window:
        """The oldest window containing ``at``: the one that has seen the most."""
        return self.ranges(at)[0]

    def closed(self, window: Window, now: float) -> bool:
        return window[1] <= now


def tumbling(name: str, size_s: float) -> WindowSpec:
    return WindowSpec(name=name, size_s=size_s, step_s=size_s)


def hopping(name: str, size_s: float, step_s: float) -> WindowSpec:
    return WindowSpec(name=name, size_s=size_s, step_s=step_s)


MINUTE: Final = tumbling("1m", 60.0)
"""1 minute tumbling windows."""
HOUR_STEP_S: Final = 900.0
HOUR: Final = hopping("1h", 3600.0, HOUR_STEP_S)
"""1 hour windows, a new one every 15 minutes (a fact lands in 4 of them)."""
