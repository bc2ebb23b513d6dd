"""The processes ``toolfleet dev`` starts: the default layout, audit and status in one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from toolfleet.devstack.plan import build_plan
from toolfleet.worker import DEFAULT_LAYOUT, SERVICES, process_name, worker_services

pytestmark = pytest.mark.unit


def test_the_default_layout_runs_every_pipeline_service_once() -> None:
    run = [service for worker in DEFAULT_LAYOUT for service in worker_services(worker)]
    assert sorted(run) == sorted(SERVICES)
    assert "audit+status" in DEFAULT_LAYOUT  # each lifecycle record read once
    assert process_name("audit+status") == "observers"
    assert process_name("executor") == "executor"


def test_dev_runs_audit_and_status_as_one_observers_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("TOOLFLEET_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no .env of the repository
    # Every server configured: the plan starts none (nothing is reached either).
    monkeypatch.setenv("TOOLFLEET_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TOOLFLEET_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("TOOLFLEET_DATABASE_URL", "postgresql://u@127.0.0.1:1/db")
    said: list[str] = []
    with contextlib.ExitStack() as stack:
        plan = build_plan(stack, home=tmp_path / "home", say=said.append)

    workers = {
        s.name: s.argv[s.argv.index("worker") + 1 :] for s in plan.services if "worker" in s.argv
    }
    assert workers["observers"] == ("audit+status",)
    assert not workers.keys() & {"audit", "status"}
    for worker in DEFAULT_LAYOUT:
        assert workers[process_name(worker)] == (worker,)
    assert [s.name for s in plan.services][: len(DEFAULT_LAYOUT)] == [
        "policy",
        "executor",
        "validator",
        "observers",
    ]
