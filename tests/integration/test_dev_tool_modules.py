"""``toolfleet dev`` with ``TOOLFLEET_TOOL_MODULES``: a module that is missing or fails
to import is one line naming the module and the cause (the user's ``file:line``, not
toolfleet's frames), a non-zero exit, and nothing started; a good module goes on, and
Ctrl-C stops it, at any step, leaving nothing running."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from tests.support.databases import advisory_lock_awaited, alone_in_database
from tests.support.eventually import eventually
from toolfleet.devstack.bootstrap import ensure_database
from toolfleet.storage.postgres import MIGRATION_LOCK

pytestmark = pytest.mark.integration

GOOD = '''\
from pydantic import BaseModel

from toolfleet.sdk import ToolContext, tool


class Text(BaseModel):
    text: str


@tool(id="acme__shout", version="{version}", effect="read_only", redaction_allowlist=["text"])
async def shout(params: Text, ctx: ToolContext) -> Text:
    """Shout."""
    return Text(text=params.text.upper())
'''

BROKEN = {
    # module source, then what the one line must say after "file:line: "
    "syntax": ("def shout(:\n    pass\n", "1: SyntaxError: invalid syntax"),
    "bad_tool": (
        GOOD.format(version="not-a-version"),
        "10: RegistrationError: acme__shout: 'not-a-version' is not a semantic version",
    ),
    "raises": (
        "import os\n\nraise RuntimeError('no ACME_KEY set')\n",
        "3: RuntimeError: no ACME_KEY set",
    ),
    "bad_dependency": (
        "import acme_sdk_not_installed\n",
        "1: ModuleNotFoundError: No module named 'acme_sdk_not_installed'",
    ),
}


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _dev_env(tmp_path: Path, module: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    return {
        **base,
        "TOOLFLEET_HOME": str(tmp_path / "home"),
        "TOOLFLEET_TOOL_MODULES": module,
        "TOOLFLEET_REDIS_URL": os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "TOOLFLEET_DATABASE_URL": os.environ.get(
            "TOOLFLEET_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    }


def _dev(tmp_path: Path, module: str) -> subprocess.CompletedProcess[str]:
    # cwd=tmp_path: the user's modules sit in the working directory, as `python -m` finds them.
    return subprocess.run(
        [sys.executable, "-m", "toolfleet", "dev"],
        cwd=tmp_path,
        env=_dev_env(tmp_path, module),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    text = (done.stdout + done.stderr).strip()
    assert len(text.splitlines()) == 1, text
    assert "Traceback" not in text, text
    assert "/toolfleet/" not in text, text  # no frame of toolfleet's own code
    return text


def test_a_missing_module_is_one_line_and_nothing_starts(tmp_path: Path) -> None:
    done = _dev(tmp_path, "acme_tools")
    assert done.returncode != 0
    line = _one_line(done)
    assert line.startswith(
        "toolfleet dev: tool module 'acme_tools' (TOOLFLEET_TOOL_MODULES) not found; searched "
        f"{tmp_path}"
    ), line
    assert not (tmp_path / "home").exists()  # no logs, no embedded servers' data


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_module_that_fails_to_import_names_the_users_file_and_line(
    tmp_path: Path, case: str
) -> None:
    source, cause = BROKEN[case]
    (tmp_path / "acme_tools.py").write_text(source)
    done = _dev(tmp_path, "acme_tools")
    assert done.returncode != 0
    line = _one_line(done)
    assert line == (
        "toolfleet dev: tool module 'acme_tools' (TOOLFLEET_TOOL_MODULES) could not be "
        f"imported: {tmp_path / 'acme_tools.py'}:{cause}"
    ), line
    assert not (tmp_path / "home").exists()


def test_a_good_module_passes_the_check_and_ctrl_c_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    (tmp_path / "acme_tools.py").write_text(GOOD.format(version="1.0.0"))
    out = tmp_path / "dev.out"
    with out.open("w") as sink:
        dev = subprocess.Popen(
            [sys.executable, "-m", "toolfleet", "dev"],
            cwd=tmp_path,
            env=_dev_env(tmp_path, "acme_tools"),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        # Past the module check, the supervisor starts its first server or service.
        while not (children := _descendants(dev.pid)):
            assert dev.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)  # polling the effect, not timing it
        assert (tmp_path / "home" / "logs").is_dir()
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(timeout=90)
        except subprocess.TimeoutExpired:
            # The supervisor prints every thread's stack past its drain: show where.
            pytest.fail(f"toolfleet dev did not stop after Ctrl-C:\n{out.read_text()}")
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
    text = out.read_text()
    assert "tool module" not in text, text
    assert "Traceback" not in text, text
    assert dev.returncode == 0, text
    deadline = time.monotonic() + 10
    while _alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling the effect, not timing it
    assert not _alive(children), f"left running: {_alive(children)}\n{text}"


async def test_ctrl_c_while_the_database_is_prepared_stops_at_once(
    tmp_path: Path, unborn_database_url: str
) -> None:
    """Ctrl-C lands while the bootstrap's migration waits on a lock another process
    holds: ``toolfleet dev`` cancels the bootstrap, waits for it to end (asyncpg takes the
    cancelled query's connection back through a task of its own, which asyncio.run's
    final sweep would cancel and so leave the pool waiting forever: CI saw this hang)
    and exits 0 with none of its connections left."""
    (tmp_path / "acme_tools.py").write_text(GOOD.format(version="1.0.0"))
    await ensure_database(unborn_database_url)
    holder = await asyncpg.connect(unborn_database_url)
    out = tmp_path / "dev.out"
    try:
        # Advisory locks are per database: this one is the dev fleet's migration lock.
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        with out.open("w") as sink:
            dev = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "toolfleet",
                "dev",
                cwd=tmp_path,
                env={
                    **_dev_env(tmp_path, "acme_tools"),
                    "TOOLFLEET_DATABASE_URL": unborn_database_url,
                },
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:

            async def migration_waits() -> bool:
                assert dev.returncode is None, out.read_text()
                return await advisory_lock_awaited(holder)

            await eventually(migration_waits, timeout=60)
            dev.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(dev.wait(), timeout=60)
            except TimeoutError:
                pytest.fail(f"toolfleet dev did not stop after Ctrl-C:\n{out.read_text()}")
        finally:
            if dev.returncode is None:
                dev.kill()
                await dev.wait()
        text = out.read_text()
        assert dev.returncode == 0, text
        assert "Traceback" not in text, text
        assert "stopped" in text.splitlines()[-1], text

        # The server ends a closed connection's backend a moment after the client goes.
        await eventually(lambda: alone_in_database(holder), timeout=5)
    finally:
        await holder.close()
