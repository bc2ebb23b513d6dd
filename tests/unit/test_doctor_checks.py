"""``toolfleet doctor``'s checks of Kafka security, broker APIs, Redis, migrations and
pools, on facts; and the lines and statuses they print."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, ResponseError

from toolfleet.doctor.kafka import (
    ALTER_CONFIGS,
    IDEMPOTENT_APIS,
    REQUIRED_APIS,
    SASL_APIS,
    bootstrap_hosts,
    check_api_versions,
    check_security,
    common_versions,
    is_loopback,
)
from toolfleet.doctor.results import CheckResult, CheckStatus, result_of
from toolfleet.doctor.stores import (
    RedisPersistence,
    check_migrations,
    check_persistence,
    check_pools,
    read_persistence,
)
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit

OK, WARN, FAIL = CheckStatus.OK, CheckStatus.WARN, CheckStatus.FAIL


# --- lines -------------------------------------------------------------------------


def test_a_line_has_fixed_columns_and_shouts_only_failures() -> None:
    ok = CheckResult(name="topics", status=OK, detail="8 topics match topics.yaml")
    fail = CheckResult(name="redis", status=FAIL, detail="persistence off")
    warn = CheckResult(name="redis", status=WARN, detail="could not be checked")
    assert ok.line() == "ok    topics          8 topics match topics.yaml"
    assert fail.line() == "FAIL  redis           persistence off"
    assert warn.line() == "warn  redis           could not be checked"
    assert fail.as_dict() == {"name": "redis", "status": "fail", "detail": "persistence off"}


def test_the_worst_problem_sets_the_status_and_comes_first() -> None:
    result = result_of("x", [(WARN, "meh"), (FAIL, "bad")], ok="fine")
    assert (result.status, result.detail) == (FAIL, "bad; meh")
    assert result_of("x", [], ok="fine").detail == "fine"


# --- kafka-security -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bootstrap", "hosts"),
    [
        ("127.0.0.1:9092", ["127.0.0.1"]),
        ("localhost:9092, [::1]:9093", ["localhost", "::1"]),
        ("b-1.msk.example:9096,b-2.msk.example:9096", ["b-1.msk.example", "b-2.msk.example"]),
    ],
)
def test_bootstrap_hosts(bootstrap: str, hosts: list[str]) -> None:
    assert bootstrap_hosts(bootstrap) == hosts


def test_only_loopback_addresses_and_localhost_count_as_loopback() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("10.0.0.5", "kafka", "0.0.0.0", "127.0.0.1.nip.io"))


def test_plaintext_to_a_remote_broker_fails_under_kafka_and_warns_under_dev() -> None:
    settings = FleetSettings(kafka_bootstrap="127.0.0.1:9092,kafka-1.internal:9092")
    result = check_security(settings, profile="kafka")
    assert result.status is FAIL
    assert result.detail.startswith("PLAINTEXT to kafka-1.internal: no TLS")
    assert "no client authentication" in result.detail
    assert check_security(settings, profile="dev").status is WARN


def test_plaintext_on_loopback_warns_under_either_profile() -> None:
    settings = FleetSettings(kafka_bootstrap="127.0.0.1:9092")
    for profile in ("kafka", "dev"):
        result = check_security(settings, profile=profile)  # type: ignore[arg-type]
        assert result.status is WARN
        assert result.detail.startswith("PLAINTEXT on loopback only")


def test_sasl_without_tls_fails_on_a_remote_broker(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("x\n")
    settings = FleetSettings(
        kafka_bootstrap="kafka:9092",
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="fleet",
        kafka_sasl_password_file=password,
    )
    result = check_security(settings, profile="kafka")
    assert result.status is FAIL
    assert "no TLS" in result.detail
    assert "client authentication" not in result.detail


def test_sasl_over_tls_and_mutual_tls_pass(tmp_path: Path) -> None:
    password, cert, key = tmp_path / "password", tmp_path / "c.pem", tmp_path / "k.pem"
    for path in (password, cert, key):
        path.write_text("x\n")
    sasl = FleetSettings(
        kafka_bootstrap="kafka:9092",
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="fleet",
        kafka_sasl_password_file=password,
    )
    assert check_security(sasl, profile="kafka") == CheckResult(
        name="kafka-security",
        status=OK,
        detail="SASL_SSL: TLS, authenticated with SASL SCRAM-SHA-512",
    )
    mtls = FleetSettings(
        kafka_bootstrap="kafka:9092",
        kafka_security_protocol="SSL",
        kafka_ssl_cert_file=cert,
        kafka_ssl_key_file=key,
    )
    assert check_security(mtls, profile="kafka").status is OK
    anonymous = FleetSettings(kafka_bootstrap="kafka:9092", kafka_security_protocol="SSL")
    result = check_security(anonymous, profile="kafka")
    assert result.status is FAIL
    assert result.detail == "SSL to kafka: no client authentication (SASL or a client certificate)"


# --- broker-api -----------------------------------------------------------------------

ALL = dict.fromkeys((*REQUIRED_APIS, *IDEMPOTENT_APIS, *SASL_APIS, ALTER_CONFIGS[0]), (0, 9))


def test_a_broker_with_every_api_passes() -> None:
    result = check_api_versions(ALL, settings=FleetSettings(broker_profile="kafka"))
    assert result.status is OK
    assert result.detail == f"{len(ALL)} APIs, all 15 the fleet's clients use"


def test_the_kafka_profile_needs_the_idempotent_producer() -> None:
    versions = {k: v for k, v in ALL.items() if k != 22}
    result = check_api_versions(versions, settings=FleetSettings(broker_profile="kafka"))
    assert result.status is FAIL
    assert result.detail == "the broker lacks InitProducerId (the idempotent producer)"
    dev = FleetSettings(broker_profile="dev")
    assert check_api_versions(versions, settings=dev).status is OK


def test_sasl_needs_the_sasl_apis(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("x\n")
    sasl = FleetSettings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="fleet",
        kafka_sasl_password_file=password,
    )
    versions = {k: v for k, v in ALL.items() if k != 36}
    assert "SaslAuthenticate" in check_api_versions(versions, settings=sasl).detail


def test_a_broker_without_alter_configs_only_warns() -> None:
    versions = {k: v for k, v in ALL.items() if k != ALTER_CONFIGS[0]}
    result = check_api_versions(versions, settings=FleetSettings(broker_profile="dev"))
    assert result.status is WARN
    assert "toolfleet init --apply" in result.detail


def test_only_apis_every_broker_supports_count() -> None:
    one = {0: (0, 9), 1: (0, 11), 22: (0, 5)}
    two = {0: (3, 7), 1: (12, 13)}
    assert common_versions([one, two]) == {0: (3, 7)}
    assert common_versions([]) == {}


# --- redis ----------------------------------------------------------------------------


def test_redis_persistence() -> None:
    aof = RedisPersistence(appendonly=True, save="", appendfsync="everysec")
    rdb = RedisPersistence(appendonly=False, save="3600 1 300 100")
    off = RedisPersistence(appendonly=False, save="")
    assert check_persistence(aof, profile="kafka") == CheckResult(
        name="redis", status=OK, detail="appendonly yes (appendfsync everysec)"
    )
    assert check_persistence(rdb, profile="kafka").status is OK
    assert "save 3600 1 300 100" in check_persistence(rdb, profile="kafka").detail
    result = check_persistence(off, profile="kafka")
    assert result.status is FAIL
    assert result.detail.startswith("persistence off (appendonly no, no save points)")
    assert check_persistence(off, profile="dev").status is WARN


class RefusingRedis:
    """A managed Redis: ``CONFIG`` refused; ``INFO`` answers, or is refused too."""

    def __init__(self, info: dict[str, Any] | None) -> None:
        self._info = info

    async def config_get(self, pattern: str) -> dict[str, str]:
        raise NoPermissionError("this user has no permissions to run the 'config' command")

    async def info(self, section: str) -> dict[str, Any]:
        if self._info is None:
            raise ResponseError("unknown command 'INFO'")
        return self._info


async def test_a_managed_redis_that_refuses_config_is_a_warning_unless_info_shows_aof() -> None:
    aof_on = await read_persistence(cast(Redis, RefusingRedis({"aof_enabled": 1})))
    assert check_persistence(aof_on, profile="kafka").status is OK
    aof_off = await read_persistence(cast(Redis, RefusingRedis({"aof_enabled": 0})))
    result = check_persistence(aof_off, profile="kafka")
    assert result.status is WARN
    assert "could not be checked (CONFIG refused, INFO shows appendonly off)" in result.detail
    mute = await read_persistence(cast(Redis, RefusingRedis(None)))
    assert check_persistence(mute, profile="kafka").status is WARN


# --- migrations -----------------------------------------------------------------------

SHIPPED = ["0001_init.sql", "0002_policies.sql", "0003_more.sql"]


def test_migrations() -> None:
    assert check_migrations(set(SHIPPED), SHIPPED) == CheckResult(
        name="migrations", status=OK, detail="3 applied, latest 0003_more.sql"
    )
    behind = check_migrations({"0001_init.sql"}, SHIPPED)
    assert behind.status is FAIL
    assert behind.detail.startswith("2 behind: 0002_policies.sql, 0003_more.sql")
    assert check_migrations(None, SHIPPED).status is FAIL
    ahead = check_migrations({*SHIPPED, "0004_future.sql"}, SHIPPED)
    assert ahead.status is WARN
    assert "0004_future.sql" in ahead.detail


# --- pools ----------------------------------------------------------------------------


def test_every_pool_in_use_needs_a_live_executor() -> None:
    served = check_pools({"default", "gpu"}, {"default": 2, "gpu": 1, "spare": 1})
    assert served == CheckResult(
        name="pools", status=OK, detail="default 2 executors, gpu 1 executor"
    )
    idle = check_pools({"default", "gpu"}, {"default": 2})
    assert idle.status is FAIL
    assert idle.detail.startswith("no live executor for pool gpu")
    assert "toolfleet worker executor --pool gpu" in idle.detail
