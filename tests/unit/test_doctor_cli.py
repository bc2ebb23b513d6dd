"""``toolfleet doctor`` when nothing answers: every check still gets its line, failures
say why, the command exits 1 and shows no secret. Offline: the ports are closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.servers import free_port
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.cli.main import app

pytestmark = pytest.mark.unit

NAMES = [
    "keys",
    "kafka-security",
    "broker-api",
    "topics",
    "retention",
    "replication",
    "redis",
    "migrations",
    "pools",
]


@pytest.fixture
def nothing_listens(tmp_path: Path) -> dict[str, str]:
    grant = tmp_path / "grant.key"
    ensure_grant_key(grant)
    return {
        "TOOLFLEET_BROKER_PROFILE": "kafka",
        "TOOLFLEET_KAFKA_BOOTSTRAP": f"127.0.0.1:{free_port()}",
        "TOOLFLEET_REDIS_URL": f"redis://:redis-secret-pw@127.0.0.1:{free_port()}/0",
        "TOOLFLEET_DATABASE_URL": f"postgresql://fleet:pg-secret-pw@127.0.0.1:{free_port()}/fleet",
        "TOOLFLEET_GRANT_KEY_FILE": str(grant),
        "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(tmp_path / "absent.pem"),
    }


def test_unreachable_services_fail_with_their_reason_and_no_secret(
    nothing_listens: dict[str, str],
) -> None:
    done = CliRunner().invoke(app, ["doctor", "--timeout", "3"], env=nothing_listens)
    assert done.exit_code == 1, done.output
    lines = done.stdout.splitlines()
    assert [line.split()[1] for line in lines] == NAMES
    by_name = {line.split()[1]: line for line in lines}
    assert by_name["broker-api"].startswith("FAIL  broker-api      Kafka unreachable at 127.0.0.1:")
    assert by_name["topics"] == "FAIL  topics          not checked: Kafka is unreachable"
    assert by_name["redis"].startswith("FAIL  redis           Redis unreachable at 127.0.0.1:")
    assert "Postgres unreachable at 127.0.0.1:" in by_name["migrations"]
    assert "absent.pem: no such file" in by_name["keys"]
    assert "pg-secret-pw" not in done.output
    assert "redis-secret-pw" not in done.output
    assert "fleet@" not in done.output


def test_json_output_is_one_document(nothing_listens: dict[str, str]) -> None:
    done = CliRunner().invoke(app, ["doctor", "--json", "--timeout", "3"], env=nothing_listens)
    assert done.exit_code == 1
    report = json.loads(done.stdout)
    assert report["profile"] == "kafka"
    assert report["ok"] is False
    assert [check["name"] for check in report["checks"]] == NAMES
    assert {check["status"] for check in report["checks"]} <= {"ok", "warn", "fail"}
