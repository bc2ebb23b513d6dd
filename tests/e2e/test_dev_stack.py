"""``toolfleet dev`` as a user runs it: fleet up, ``dev.env`` joins it, Ctrl-C leaves nothing.

The broker is embedded (started by ``toolfleet dev``); Redis and Postgres are the test
session's, with a database nobody created yet (``bootstrap`` creates it). The terminal
gets a short page (a line per service, the doctor's findings, the URLs); the services'
own output goes to their log files.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.eventually import eventually
from toolfleet.devstack.children import child_preexec
from toolfleet.worker import DEFAULT_LAYOUT, process_name

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]

DEV_ENV_KEYS = {
    "TOOLFLEET_HOME",
    "TOOLFLEET_KAFKA_BOOTSTRAP",
    "TOOLFLEET_REDIS_URL",
    "TOOLFLEET_DATABASE_URL",
    "TOOLFLEET_API_URL",
    "TOOLFLEET_JWT_PRIVATE_KEY_FILE",
    "TOOLFLEET_JWT_PUBLIC_KEY_FILE",
    "TOOLFLEET_POLICY_FILE",
    "TOOLFLEET_TOPIC_PREFIX",
}
#: The dev stack's processes: the default layout (audit and status in one, ``observers``),
#: maintenance, the API, and analytics where its extra is installed.
SERVICES = (
    tuple(map(process_name, DEFAULT_LAYOUT))
    + ("maintenance", "api")
    + (("analytics",) if importlib.util.find_spec("faust") is not None else ())
)
#: Lines a healthy start and stop may print (about 35 with embedded servers and analytics).
MOST_LINES = 40
UP_LINE = re.compile(r"up +(?P<name>\S+) +pid (?P<pid>\d+) +(?P<log>\S+)(?: +(?P<url>\S+))?")
PATH_KEYS = (
    "TOOLFLEET_HOME",
    "TOOLFLEET_JWT_PRIVATE_KEY_FILE",
    "TOOLFLEET_JWT_PUBLIC_KEY_FILE",
    "TOOLFLEET_POLICY_FILE",
)


def parse_dev_env(text: str) -> dict[str, str]:
    """What ``source dev.env`` would set, read with shell quoting rules."""
    words = shlex.split(text, comments=True)
    return dict(w.split("=", 1) for w in words if w != "export" and "=" in w)


def check_dev_env(env_file: Path, *, home: Path) -> dict[str, str]:
    """Parse ``dev.env``; check it names every setting, with absolute, existing paths."""
    values = parse_dev_env(env_file.read_text())
    assert values.keys() >= DEV_ENV_KEYS, sorted(values)
    assert values["TOOLFLEET_HOME"] == str(home.resolve())
    assert values["TOOLFLEET_API_URL"].startswith("http://")
    for key in PATH_KEYS:
        assert Path(values[key]).is_absolute(), key
        assert Path(values[key]).exists(), key
    assert "core__*" in Path(values["TOOLFLEET_POLICY_FILE"]).read_text()
    return values


def children_of(pid: int) -> dict[int, str]:
    """``{pid: command line as ps shows it}`` of the direct children of ``pid``."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue  # exited while we looked
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found[int(entry.name)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (zombies count as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def tail(path: Path, chars: int = 6000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no output)"


def check_terminal(text: str, *, api_url: str, cwd: Path, home: Path) -> dict[str, int]:
    """The banner, one ``up`` line per service (pid, log file; the API's URL) and none of
    the services' own output. Returns ``{service: pid}``."""
    rows = text.splitlines()
    assert "toolfleet dev is up" in rows, text
    assert f"  API      {api_url}   (OpenAPI: {api_url}/openapi.json)" in rows, text
    assert f"  console  {api_url}/console" in rows, text
    assert "  try      toolfleet invoke core__get_current_time --tenant t1 --wait" in rows, text
    assert any(row.startswith("doctor (dev profile): ") for row in rows), text
    up = {m["name"]: m for m in map(UP_LINE.fullmatch, rows) if m is not None}
    assert sorted(up) == sorted(SERVICES), text
    for name, match in up.items():
        assert cwd / match["log"] == home / "logs" / f"{name}.log", match[0]
    assert up["api"]["url"] == api_url
    for chatter in ("uvicorn", "faust", "toolfleet.worker", "Traceback"):
        assert chatter not in text, text
    return {name: int(match["pid"]) for name, match in up.items()}


async def test_dev_runs_a_fleet_that_dev_env_joins_and_ctrl_c_stops(
    tmp_path: Path, own_redis_url: str, unborn_database_url: str
) -> None:
    home = tmp_path / "home"
    output = tmp_path / "dev.out"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    prefix = f"dev{uuid.uuid4().hex[:6]}."
    dev_env = {
        **base_env,
        "TOOLFLEET_HOME": str(home),
        "TOOLFLEET_REDIS_URL": own_redis_url,
        "TOOLFLEET_DATABASE_URL": unborn_database_url,
        "TOOLFLEET_TOPIC_PREFIX": prefix,
    }
    with output.open("wb") as sink:
        # cwd=tmp_path: no .env of the repository may configure this fleet.
        supervisor = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "toolfleet", "dev",
            cwd=tmp_path, env=dev_env, stdin=asyncio.subprocess.DEVNULL,
            stdout=sink, stderr=asyncio.subprocess.STDOUT, preexec_fn=child_preexec,
        )  # fmt: skip
    try:
        # 1. dev.env appears once the fleet is up, with every setting, paths absolute.
        env_file = home / "dev.env"

        async def dev_env_written() -> bool:
            assert supervisor.returncode is None, f"toolfleet dev exited:\n{tail(output)}"
            return env_file.exists()

        await eventually(dev_env_written, timeout=150, interval=0.2)
        values = check_dev_env(env_file, home=home)
        assert values["TOOLFLEET_REDIS_URL"] == own_redis_url
        assert values["TOOLFLEET_DATABASE_URL"] == unborn_database_url
        assert values["TOOLFLEET_TOPIC_PREFIX"] == prefix

        # 1b. The terminal: a line per service, the doctor, the banner; no service chatter.
        async def banner_printed() -> str | None:
            text = output.read_text(errors="replace")
            return text if "  stop     Ctrl-C" in text.splitlines() else None

        terminal = await eventually(banner_printed, timeout=60, interval=0.2)
        pids = check_terminal(
            terminal, api_url=values["TOOLFLEET_API_URL"], cwd=tmp_path, home=home
        )

        # 2. Another shell that sourced dev.env invokes a tool and waits for it.
        invoke = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "toolfleet", "invoke", "core__get_current_time",
            "--tenant", "t1", "--wait", "--json",
            cwd=tmp_path, env={**base_env, **values},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(invoke.communicate(), 120)
        assert invoke.returncode == 0, f"{err.decode()}\n--- toolfleet dev:\n{tail(output)}"
        outcome = json.loads(out)
        assert outcome["status"] == "success"
        assert outcome["result"]["timezone"]

        # 3. Every process of the layout runs, titled as the contract says: audit and
        # status in one (each lifecycle record read once), no process of either alone.
        children = children_of(supervisor.pid)
        titles = list(children.values())
        for expected in (
            "toolfleet worker policy",
            "toolfleet worker executor",
            "toolfleet worker validator",
            "toolfleet worker audit+status",
            "toolfleet api",
        ):
            assert any(title.endswith(expected) for title in titles), titles
        for alone in ("toolfleet worker audit", "toolfleet worker status"):
            assert not any(title.endswith(alone) for title in titles), titles

        # 4. Each service's own output is in its log file, from the pid its line named.
        async def started_lines_logged() -> bool:
            for name, pid in pids.items():
                log = (home / "logs" / f"{name}.log").read_text(errors="replace")
                assert f"started pid {pid} ----" in log, f"{name}:\n{log}"
                assert "broker profile: " in log, f"{name}:\n{log}"  # its own start line
            return True

        await eventually(started_lines_logged, timeout=60, interval=0.5)
    finally:
        if supervisor.returncode is None:
            # 5. Ctrl-C: exit 0, no child left behind.
            children = children_of(supervisor.pid)
            supervisor.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(supervisor.wait(), 60)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    supervisor.kill()
                await supervisor.wait()
    assert supervisor.returncode == 0, tail(output)
    survivors = {pid: title for pid, title in children.items() if alive(pid)}
    assert not survivors, f"left behind: {survivors}\n{tail(output)}"
    printed = output.read_text(errors="replace").splitlines()
    assert printed[-1] == "stopped", printed
    assert len(printed) <= MOST_LINES, "\n".join(printed)
