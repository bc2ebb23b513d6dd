"""Resilience a tool declares on ``@tool``: retries, a circuit breaker, a result cache.

Plain frozen values: the executor reads them, nothing here does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Literal

from toolfleet.errors import RegistrationError


@dataclass(frozen=True, kw_only=True)
class Retry:
    """Retry a call whose error is retryable, with exponential backoff and full jitter.

    Attempt ``n`` (from 1) waits a random time in ``[0, min(max_backoff_s,
    initial_backoff_s * 2**(n-1))]`` before attempt ``n + 1``.
    """

    max_attempts: int = 1
    """Attempts in all, the first one included (1: no retries)."""
    initial_backoff_s: float = 0.2
    """Upper bound of the first wait."""
    max_backoff_s: float = 5.0
    """Upper bound of any wait."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise RegistrationError("Retry.max_attempts must be at least 1")
        if self.initial_backoff_s < 0 or self.max_backoff_s < self.initial_backoff_s:
            raise RegistrationError("Retry needs 0 <= initial_backoff_s <= max_backoff_s")


@dataclass(frozen=True, kw_only=True)
class Breaker:
    """A circuit breaker (closed, open, half-open) shared by every executor."""

    max_time_window_calls: ClassVar[int] = 1000
    """The most calls a time window keeps (the newest), to keep the shared state small."""

    name: str = ""
    """The circuit's name (empty: the tool id). Tools calling the same upstream may share
    one (``"api.github.com"``): letters, digits and ``._:-``."""

    window: Literal["count", "time"] = "count"
    """``count``: the rates are over the latest ``window_size`` calls; ``time``: over the
    calls of the last ``window_s`` seconds (at most ``max_time_window_calls`` of them)."""
    window_size: int = 20
    """How many of the latest calls a ``count`` window holds."""
    window_s: float = 60.0
    """How many seconds of calls a ``time`` window holds."""
    minimum_calls: int = 5
    """Calls the window must hold before the circuit may open."""
    failure_rate: float = 0.5
    """Failure rate (0-1] at or above which the circuit opens."""
    slow_call_s: float = 10.0
    """Calls slower than this count as slow."""
    slow_call_rate: float = 1.0
    """Slow-call rate (0-1] at or above which the circuit opens."""
    open_s: float = 30.0
    """How long the circuit stays open before it lets trial calls through."""
    half_open_calls: int = 3
    """Trial calls in half-open; ``half_open_strategy`` says how they are let through."""
    half_open_strategy: Literal["all_or_nothing", "canary"] = "all_or_nothing"
    """``all_or_nothing``: ``half_open_calls`` trials at once, all must succeed to close;
    ``canary``: one trial at a time, the next only after the previous succeeded, and
    ``half_open_calls`` successes in a row close. Either way any failure re-opens."""

    def __post_init__(self) -> None:
        if self.name and not re.fullmatch(r"[A-Za-z0-9._:-]{1,200}", self.name):
            raise RegistrationError(
                f"Breaker.name {self.name!r}: letters, digits and '._:-', at most 200"
            )
        if self.window not in ("count", "time"):
            raise RegistrationError("Breaker.window is 'count' or 'time'")
        if self.half_open_strategy not in ("all_or_nothing", "canary"):
            raise RegistrationError("Breaker.half_open_strategy is 'all_or_nothing' or 'canary'")
        if self.window == "count" and not 1 <= self.minimum_calls <= self.window_size:
            raise RegistrationError("Breaker needs 1 <= minimum_calls <= window_size")
        if self.window == "time" and not (
            self.window_s > 0 and 1 <= self.minimum_calls <= self.max_time_window_calls
        ):
            raise RegistrationError(
                "Breaker with a time window needs window_s > 0 and"
                f" 1 <= minimum_calls <= {self.max_time_window_calls}"
            )
        if not (0 < self.failure_rate <= 1 and 0 < self.slow_call_rate <= 1):
            raise RegistrationError("Breaker rates are in (0, 1]")
        if self.slow_call_s <= 0 or self.open_s <= 0 or self.half_open_calls < 1:
            raise RegistrationError(
                "Breaker needs slow_call_s > 0, open_s > 0, half_open_calls >= 1"
            )


@dataclass(frozen=True, kw_only=True)
class Cache:
    """Reuse a successful result of the same call (tool version, parameters, tenant)."""

    mode: Literal["ttl", "forever"] = "ttl"
    """``ttl``: entries expire after ``ttl_s``; ``forever``: they never expire."""
    ttl_s: int = 60
    """Lifetime of an entry in ``ttl`` mode, in seconds."""

    def __post_init__(self) -> None:
        if self.mode not in ("ttl", "forever"):
            raise RegistrationError("Cache.mode is 'ttl' or 'forever'")
        if self.mode == "ttl" and self.ttl_s < 1:
            raise RegistrationError("Cache.ttl_s must be at least 1")
