"""What ``toolfleet dev`` puts on the terminal: a line per service, crashes with their last
lines, and nothing of a healthy service's chatter (that goes to its log file)."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest

from tests.support.eventually import eventually
from toolfleet.devstack.console import (
    TAIL_LINE_CHARS,
    DevConsole,
    banner,
    death_lines,
    doctor_lines,
    up_line,
)
from toolfleet.devstack.processes import (
    TAIL_LINES,
    RestartPolicy,
    ServiceSpec,
    SupervisedProcess,
    stop_all,
)
from toolfleet.devstack.supervisor import verbose_from_env
from toolfleet.doctor.results import CheckResult, CheckStatus

pytestmark = pytest.mark.unit

FAST_RESTARTS = RestartPolicy(initial_delay_s=0.01, max_delay_s=0.05)


def _child(code: str, name: str = "child") -> ServiceSpec:
    return ServiceSpec(name=name, argv=(sys.executable, "-c", code), env={"PATH": "/bin"})


def _chatty_crash(lines: int, code: int = 3) -> ServiceSpec:
    """A child that prints ``line 0`` .. ``line N-1`` and exits with ``code``."""
    return _child(f"for i in range({lines}): print(f'line {{i}}')\nraise SystemExit({code})")


async def _crash(process: SupervisedProcess, times: int) -> None:
    task = asyncio.create_task(process.run())

    async def crashed_enough() -> bool:
        return process.restarts >= times

    await eventually(crashed_enough, timeout=30)
    assert await stop_all([process], [task], grace_s=5) == []


def test_up_line_names_the_pid_the_log_file_relative_to_here_and_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    log = tmp_path / ".toolfleet" / "logs" / "api.log"
    line = up_line("api", pid=4242, log_path=log, url="http://127.0.0.1:8080")
    assert line.split() == ["up", "api", "pid", "4242", ".toolfleet/logs/api.log", line.split()[-1]]
    assert line.endswith("http://127.0.0.1:8080")
    assert up_line("policy", pid=7, log_path=Path("/elsewhere/policy.log")).endswith(
        "pid 7       /elsewhere/policy.log"
    )


def test_a_death_says_how_it_ended_its_last_lines_then_what_comes_next() -> None:
    lines = death_lines(
        "executor",
        pid=42,
        reason="exit code 1",
        tail=["Traceback (most recent call last):", "ValueError: boom"],
        log_path=Path("/x/executor.log"),
        next_step="restarting executor in 1s",
    )
    assert lines == [
        "executor died: exit code 1 (pid 42); its last 2 lines (/x/executor.log):",
        "  executor | Traceback (most recent call last):",
        "  executor | ValueError: boom",
        "restarting executor in 1s",
    ]


def test_a_death_clips_long_lines_and_says_when_nothing_was_printed() -> None:
    (_, clipped, _) = death_lines(
        "api",
        pid=1,
        reason="exit code 1",
        tail=["x" * 10_000],
        log_path=Path("/x/api.log"),
        next_step="restarting api in 1s",
    )
    assert len(clipped) == len("  api | ") + TAIL_LINE_CHARS
    assert clipped.endswith("…")
    silent = death_lines(
        "api", pid=1, reason="killed by SIGKILL", tail=[], log_path=Path("/x/api.log"),
        next_step="restarting api in 1s",
    )  # fmt: skip
    assert silent == ["api died: killed by SIGKILL (pid 1); it printed nothing (/x/api.log)",
                      "restarting api in 1s"]  # fmt: skip
    never = death_lines(
        "api", pid=None, reason="could not start: No such file or directory", tail=[],
        log_path=Path("/x/api.log"), next_step="restarting api in 1s",
    )  # fmt: skip
    assert never[0].startswith("api could not start: No such file or directory")


def test_doctor_summary_counts_every_check_and_lists_only_the_ones_not_ok() -> None:
    results = [
        CheckResult(name="keys", status=CheckStatus.OK, detail="present"),
        CheckResult(name="replication", status=CheckStatus.WARN, detail="1 < 3"),
        CheckResult(name="topics", status=CheckStatus.FAIL, detail="missing toolfleet.audit"),
        CheckResult(name="pools", status=CheckStatus.OK, detail="default 1 executor"),
    ]
    summary, findings = doctor_lines(results, log_path=Path("/h/logs/dev.log"))
    assert summary == "doctor (dev profile): 2 ok, 1 warn, 1 fail; every check in /h/logs/dev.log"
    assert [f.split()[:2] for f in findings] == [["warn", "replication"], ["FAIL", "topics"]]


def test_banner_gives_the_api_the_console_and_a_command_to_try() -> None:
    text = banner(
        api_url="http://127.0.0.1:8080", env_file=Path("/h/dev.env"), log_dir=Path("/h/logs")
    )
    rows = [row.split() for row in text.splitlines() if row.strip()]
    assert rows[1][:2] == ["API", "http://127.0.0.1:8080"]
    assert ["console", "http://127.0.0.1:8080/console"] in rows
    assert [
        "try",
        "toolfleet",
        "invoke",
        "core__get_current_time",
        "--tenant",
        "t1",
        "--wait",
    ] in rows
    assert len(text.splitlines()) <= 12


def test_each_run_starts_fresh_logs_and_keeps_the_previous_one(tmp_path: Path) -> None:
    for run in ("first", "second", "third"):
        console = DevConsole(tmp_path, stream=io.StringIO())
        console.line("executor", f"{run} run")
        console.say(f"{run} supervisor")
        console.close()
    assert (tmp_path / "executor.log").read_text() == "third run\n"
    assert (tmp_path / "executor.log.1").read_text() == "second run\n"
    assert (tmp_path / "dev.log.1").read_text() == "second supervisor\n"
    assert not list(tmp_path.glob("*.log.2"))


def test_children_reach_the_terminal_only_when_verbose(tmp_path: Path) -> None:
    quiet, loud = io.StringIO(), io.StringIO()
    for stream, verbose in ((quiet, False), (loud, True)):
        console = DevConsole(tmp_path / str(verbose), stream=stream, color=False, verbose=verbose)
        console.line("analytics", "[^Worker]: Starting...")
        console.say("up  analytics")
        console.record("ok    keys")
        console.close()
        log = (tmp_path / str(verbose) / "analytics.log").read_text()
        assert log == "[^Worker]: Starting...\n"
        assert (tmp_path / str(verbose) / "dev.log").read_text() == "up  analytics\nok    keys\n"
    assert quiet.getvalue() == "up  analytics\n"
    assert loud.getvalue().splitlines() == [
        "analytics   | [^Worker]: Starting...",
        "dev         | up  analytics",
    ]


async def test_a_dying_child_shows_its_last_lines_once_and_none_of_its_chatter_before(
    tmp_path: Path,
) -> None:
    terminal = io.StringIO()
    console = DevConsole(tmp_path, stream=terminal, color=False)
    process = SupervisedProcess(_chatty_crash(TAIL_LINES + 10), console=console,
                                restart=FAST_RESTARTS)  # fmt: skip
    await _crash(process, times=2)
    console.close()
    shown = terminal.getvalue().splitlines()

    first_death = next(i for i, row in enumerate(shown) if row.startswith("child died"))
    assert shown[first_death] == (
        f"child died: exit code 3 (pid {process.pids[0]}); "
        f"its last {TAIL_LINES} lines ({tmp_path / 'child.log'}):"
    )
    tail = shown[first_death + 1 : first_death + 1 + TAIL_LINES]
    assert tail == [f"  child | line {i}" for i in range(10, TAIL_LINES + 10)]
    assert shown[first_death + 1 + TAIL_LINES] == "restarting child in 0.01s"
    assert shown[:first_death] == []  # nothing of the child before it died
    # The same crash again: one line, not the same 20 lines twice.
    assert sum(row == "  child | line 10" for row in shown) == 1
    again = (
        f"child died: exit code 3 (pid {process.pids[1]}); its last lines as at its previous crash"
    )
    assert any(row.startswith(again) and "crash 2 in a row" in row for row in shown), shown
    assert f"child restarted: pid {process.pids[1]}" in shown
    # The log file has every line of every run that got to print.
    log = (tmp_path / "child.log").read_text()
    assert log.count(f"line {TAIL_LINES + 9}\n") >= 2
    assert f"started pid {process.pids[1]}" in log


async def test_a_verbose_death_does_not_repeat_what_streamed_by(tmp_path: Path) -> None:
    terminal = io.StringIO()
    console = DevConsole(tmp_path, stream=terminal, color=False, verbose=True)
    process = SupervisedProcess(_chatty_crash(3), console=console, restart=FAST_RESTARTS)
    await _crash(process, times=1)
    console.close()
    shown = terminal.getvalue().splitlines()
    assert shown[:3] == ["child       | line 0", "child       | line 1", "child       | line 2"]
    assert shown[3] == f"dev         | child died: exit code 3 (pid {process.pids[0]}); " + (
        f"log: {tmp_path / 'child.log'}"
    )
    assert shown[4] == "dev         | restarting child in 0.01s"


@pytest.mark.parametrize(
    ("on_sigterm", "said"),
    [("raise SystemExit(0)", False), ("raise SystemExit(4)", True)],
)
async def test_a_child_that_stops_badly_gets_a_line_one_that_drains_none(
    tmp_path: Path, on_sigterm: str, said: bool
) -> None:
    terminal = io.StringIO()
    console = DevConsole(tmp_path, stream=terminal, color=False)
    code = (
        "import signal, sys, time\n"
        f"def stop(*_):\n    {on_sigterm}\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)"
    )
    process = SupervisedProcess(_child(code), console=console)
    task = asyncio.create_task(process.run())

    async def ready() -> bool:
        log = tmp_path / "child.log"
        return log.exists() and "ready" in log.read_text()

    await eventually(ready, timeout=30)
    assert await stop_all([process], [task], grace_s=5) == []
    console.close()
    expected = f"child ended badly while stopping: exit code 4 ({tmp_path / 'child.log'})"
    assert terminal.getvalue().splitlines() == ([expected] if said else [])


@pytest.mark.parametrize(
    ("value", "verbose"),
    [("", False), ("0", False), ("no", False), ("1", True), ("true", True), (" Yes ", True)],
)
def test_toolfleet_dev_verbose_reads_like_a_switch(
    monkeypatch: pytest.MonkeyPatch, value: str, verbose: bool
) -> None:
    monkeypatch.setenv("TOOLFLEET_DEV_VERBOSE", value)
    assert verbose_from_env() is verbose
