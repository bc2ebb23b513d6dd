"""How a worker process runs: on uvloop when installed (or the loop
``TOOLFLEET_EVENT_LOOP`` names), Redis replies parsed in C, a settled heap."""

from __future__ import annotations

import asyncio
import gc
import importlib.util

import pytest
import redis.utils
import uvloop
from pydantic import ValidationError

from toolfleet.settings import FleetSettings
from toolfleet.worker import (
    GC_YOUNG_THRESHOLD,
    GC_YOUNG_THRESHOLD_OWN_CODE,
    loop_factory,
    settle_heap,
    young_gc_threshold,
)


def _loop_type(choice: str) -> type[asyncio.AbstractEventLoop]:
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return type(runner.get_loop())


def test_auto_and_uvloop_run_on_uvloop_and_asyncio_on_the_standard_loop() -> None:
    assert _loop_type(FleetSettings().event_loop) is uvloop.Loop
    assert _loop_type("uvloop") is uvloop.Loop
    assert not issubclass(_loop_type("asyncio"), uvloop.Loop)


def test_asking_for_uvloop_where_it_is_missing_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    with pytest.raises(ValidationError, match="uvloop is not installed"):
        FleetSettings(event_loop="uvloop")
    assert FleetSettings(event_loop="auto").event_loop == "auto"  # auto falls back quietly


def test_the_fleet_install_parses_redis_replies_in_c() -> None:
    assert redis.utils.HIREDIS_AVAILABLE


def test_a_built_worker_freezes_its_startup_objects_and_collects_young_ones_less_often() -> None:
    before = gc.get_threshold()
    try:
        settle_heap()
        assert gc.get_freeze_count() > 10_000  # the imports and whatever startup built
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *before[1:])
        garbage: list[object] = []
        garbage.append(garbage)  # a cycle: only the collector frees it
        del garbage
        assert gc.collect() >= 1  # collection still works on what came after
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_worker_running_tools_collects_young_garbage_more_often_than_the_others() -> None:
    assert GC_YOUNG_THRESHOLD < GC_YOUNG_THRESHOLD_OWN_CODE
    for service in ("executor", "executor+audit"):
        assert young_gc_threshold(service) == GC_YOUNG_THRESHOLD, service
    for service in ("policy", "validator", "audit", "status", "audit+status", "maintenance"):
        assert young_gc_threshold(service) == GC_YOUNG_THRESHOLD_OWN_CODE, service
    before = gc.get_threshold()
    try:
        settle_heap(young_threshold=young_gc_threshold("audit+status"))
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD_OWN_CODE, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
