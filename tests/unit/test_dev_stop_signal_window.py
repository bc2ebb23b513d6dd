"""``toolfleet dev`` and a stop signal that comes while its event loop is being set up.

Between the plan (the servers started) and the supervisor's own signal handlers there
is ``asyncio.run``'s setup. A Ctrl-C raised as ``KeyboardInterrupt`` there once left a
half-built event loop whose finalizer printed a traceback (a CI run of
``test_dev_tool_modules``). The signal now waits for the supervisor, which stops the
fleet as for any Ctrl-C. Run in a child process: the test sends it a real SIGINT.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = """
import asyncio, os, signal, sys
from pathlib import Path
from toolfleet.devstack import supervisor
from toolfleet.devstack.plan import DevPlan
from toolfleet.settings import FleetSettings

home = Path(sys.argv[1])

def build_plan(stack, *, home, say):
    return DevPlan(home=home, settings=FleetSettings(), fleet_env={}, services=(),
                   api_url="http://127.0.0.1:1", readiness_url="http://127.0.0.1:1")

async def bootstrap(settings):
    await asyncio.Event().wait()  # the supervisor's stop cancels it

real_run = asyncio.run

def run(main):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, in the window
    return real_run(main)

supervisor.build_plan = build_plan
supervisor.bootstrap = bootstrap
supervisor.asyncio.run = run
sys.exit(supervisor.run_dev(verbose=True))
"""


def test_a_ctrl_c_while_the_loop_is_set_up_stops_the_fleet_cleanly(tmp_path: Path) -> None:
    env = {
        "PATH": "/usr/bin:/bin",
        "TOOLFLEET_HOME": str(tmp_path / "home"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "services"),
    }
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "home")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert "SIGINT: stopping the fleet" in output, output
    assert "interrupted while starting" not in output, output
    assert "Traceback" not in output, output
    assert "stopped" in output, output
    assert done.returncode == 0, output
