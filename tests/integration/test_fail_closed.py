"""Started the documented way but without ``TOOLFLEET_GRANT_KEY_FILE``, the services that
sign or check calls refuse to start: exit 1 and one line saying how to create the key.

Before, policy minted no grants, the executor ran calls without checking any, stored raw
results in plaintext and let HTTP tools skip host pinning, and the API answered
approvals that policy would never honour; each started and kept running (here: until
the timeout).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fleet import fleet_env
from tests.support.pipeline import fleet_settings
from toolfleet.auth.grants import MISSING_GRANT_KEY
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def keyless_env(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """A fleet's environment (broker, Redis, Postgres, token keys, policy) but the grant key."""
    local = fleet_settings(settings, tmp_path_factory.mktemp("keyless"))
    env = fleet_env(local)
    del env["TOOLFLEET_GRANT_KEY_FILE"]
    env["COLUMNS"] = "1000"  # a wide terminal: rich wraps errors at 80 columns otherwise
    return env


@pytest.mark.parametrize(
    "command",
    [
        ["worker", "policy"],
        ["worker", "executor"],
        ["worker", "validator"],
        ["worker", "status"],
        ["api", "--port", "0"],
    ],
    ids=lambda command: command[-1] if command[0] == "worker" else "api",
)
def test_a_service_without_the_grant_key_exits_with_one_line(
    keyless_env: dict[str, str], command: list[str], tmp_path: Path
) -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "toolfleet", *command],
            env=keyless_env,
            capture_output=True,
            timeout=30,
            cwd=tmp_path,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`toolfleet {' '.join(command)}` started without the grant key")
    assert done.returncode == 1, done.stderr
    lines = done.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines == [f"Error: {MISSING_GRANT_KEY}"]
