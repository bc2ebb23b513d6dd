"""Kafka TLS/SASL settings and the one factory every Kafka client is built with."""

from __future__ import annotations

import ast
import logging
import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from tests.support.tls import Pki, make_pki
from toolfleet.bus.connection import connection_kwargs, kafka_connection
from toolfleet.bus.producer import producer_kwargs
from toolfleet.bus.profile import KafkaProfile
from toolfleet.bus.runtime import ConsumerSpec, consumer_kwargs, pacing_input
from toolfleet.cli.main import app
from toolfleet.errors import KafkaSecurityError
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr3t-Pa55word-for-scram"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "kafka.password"
    path.write_text(PASSWORD + "\n")
    return path


def test_plaintext_by_default_carries_only_the_brokers() -> None:
    kwargs = connection_kwargs(FleetSettings(kafka_bootstrap="k1:9092,k2:9092"))
    assert kwargs == {"bootstrap_servers": "k1:9092,k2:9092", "security_protocol": "PLAINTEXT"}


def test_ssl_trusts_the_ca_file_checks_hostnames_and_presents_the_client_cert(pki: Pki) -> None:
    settings = FleetSettings(
        kafka_security_protocol="SSL",
        kafka_ssl_ca_file=pki.ca,
        kafka_ssl_cert_file=pki.client_cert,
        kafka_ssl_key_file=pki.client_key,
    )
    kwargs = connection_kwargs(settings)
    context = kwargs["ssl_context"]
    assert kwargs["security_protocol"] == "SSL"
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in context.get_ca_certs()] == [
        ((("commonName", "toolfleet test CA"),),)
    ]
    assert "sasl_mechanism" not in kwargs


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_reads_the_password_from_its_file(
    pki: Pki, password_file: Path, mechanism: str
) -> None:
    settings = FleetSettings(
        kafka_security_protocol="SASL_SSL",
        kafka_sasl_mechanism=mechanism,  # type: ignore[arg-type]
        kafka_sasl_username="toolfleet-policy",
        kafka_sasl_password_file=password_file,
        kafka_ssl_ca_file=pki.ca,
    )
    kwargs = connection_kwargs(settings)
    assert kwargs["sasl_mechanism"] == mechanism
    assert kwargs["sasl_plain_username"] == "toolfleet-policy"
    assert kwargs["sasl_plain_password"] == PASSWORD  # the line ending is not part of it
    assert isinstance(kwargs["ssl_context"], ssl.SSLContext)


def test_sasl_plaintext_has_no_tls(password_file: Path) -> None:
    settings = FleetSettings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-512",
        kafka_sasl_username="u",
        kafka_sasl_password_file=password_file,
    )
    kwargs = connection_kwargs(settings)
    assert "ssl_context" not in kwargs
    assert kwargs["security_protocol"] == "SASL_PLAINTEXT"


def test_a_rotated_password_file_is_read_by_the_next_client(password_file: Path) -> None:
    settings = FleetSettings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="u",
        kafka_sasl_password_file=password_file,
    )
    assert connection_kwargs(settings)["sasl_plain_password"] == PASSWORD
    password_file.write_text("rotated\n")
    assert connection_kwargs(settings)["sasl_plain_password"] == "rotated"


def test_the_password_shows_in_no_repr_and_no_log(
    password_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = FleetSettings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_sasl_username="u",
        kafka_sasl_password_file=password_file,
    )
    connection = kafka_connection(settings)
    caplog.set_level(logging.DEBUG)
    logging.getLogger("test").info("connecting with %r and %s", connection, settings)
    for text in (repr(connection), str(connection), repr(settings), caplog.text):
        assert PASSWORD not in text
    assert connection.sasl_password == PASSWORD


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"kafka_security_protocol": "SASL_SSL"},
            "TOOLFLEET_KAFKA_SASL_MECHANISM is required with SASL_SSL",
        ),
        (
            {"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN"},
            "TOOLFLEET_KAFKA_SASL_USERNAME is required with SASL_PLAINTEXT",
        ),
        (
            {"kafka_sasl_username": "u"},
            "TOOLFLEET_KAFKA_SASL_USERNAME is set but TOOLFLEET_KAFKA_SECURITY_PROTOCOL=PLAINTEXT",
        ),
        (
            {"kafka_ssl_ca_file": "ca.pem"},
            "TOOLFLEET_KAFKA_SSL_CA_FILE is set but TOOLFLEET_KAFKA_SECURITY_PROTOCOL=PLAINTEXT",
        ),
        (
            {"kafka_security_protocol": "SSL", "kafka_ssl_ca_file": "/nonexistent/ca.pem"},
            "TOOLFLEET_KAFKA_SSL_CA_FILE: no such file: /nonexistent/ca.pem",
        ),
        (
            {
                "kafka_security_protocol": "SASL_PLAINTEXT",
                "kafka_sasl_mechanism": "PLAIN",
                "kafka_sasl_username": "u",
                "kafka_sasl_password_file": "/nonexistent/password",
            },
            "TOOLFLEET_KAFKA_SASL_PASSWORD_FILE: no such file: /nonexistent/password",
        ),
        ({"kafka_security_protocol": "TLS"}, "Input should be 'PLAINTEXT'"),
        ({"kafka_sasl_mechanism": "GSSAPI"}, "Input should be 'PLAIN'"),
    ],
)
def test_bad_combinations_and_missing_files_are_refused_by_name(
    overrides: dict[str, str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
        FleetSettings(**overrides)  # type: ignore[arg-type]


def test_a_certificate_needs_its_key(pki: Pki) -> None:
    with pytest.raises(ValidationError, match="CERT_FILE and TOOLFLEET_KAFKA_SSL_KEY_FILE go"):
        FleetSettings(kafka_security_protocol="SSL", kafka_ssl_cert_file=pki.client_cert)


def test_unusable_files_fail_when_a_client_is_built_naming_the_file_not_its_content(
    tmp_path: Path, pki: Pki
) -> None:
    not_a_ca = tmp_path / "ca.pem"
    not_a_ca.write_text(PASSWORD)
    settings = FleetSettings(kafka_security_protocol="SSL", kafka_ssl_ca_file=not_a_ca)
    with pytest.raises(KafkaSecurityError, match=r"cannot load .*ca\.pem") as caught:
        connection_kwargs(settings)
    assert PASSWORD not in str(caught.value)

    mismatched = FleetSettings(
        kafka_security_protocol="SSL",
        kafka_ssl_cert_file=pki.client_cert,
        kafka_ssl_key_file=pki.server_key,
    )
    with pytest.raises(KafkaSecurityError, match=r"cannot load .*client\.pem with key"):
        connection_kwargs(mismatched)

    empty = tmp_path / "empty"
    empty.write_text("\n")
    sasl = FleetSettings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="u",
        kafka_sasl_password_file=empty,
    )
    with pytest.raises(KafkaSecurityError, match="empty"):
        connection_kwargs(sasl)
    empty.unlink()  # gone after start: the next client says so
    with pytest.raises(KafkaSecurityError, match=r"no such file: .*empty"):
        connection_kwargs(sasl)


def test_the_cli_names_the_bad_variables_in_one_readable_message(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["init", "--check"],
        env={
            "TOOLFLEET_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TOOLFLEET_KAFKA_SSL_CA_FILE": str(tmp_path / "missing-ca.pem"),
        },
    )
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "invalid configuration" in out
    assert "TOOLFLEET_KAFKA_SASL_MECHANISM is required with SASL_SSL" in out
    assert "TOOLFLEET_KAFKA_SSL_CA_FILE: no such file" in out
    assert "TOOLFLEET_:" not in out
    assert "Traceback" not in out


def _client_calls(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text())
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient"}
    ]


FACTORIES = {"connection_kwargs", "_kafka", "consumer_kwargs", "producer_kwargs"}
"""``connection_kwargs`` and what spreads it: the runtime's consumer and producer
arguments (checked below), the bench's ``_kafka``."""


def test_the_client_argument_factories_spread_the_connection_factory() -> None:
    settings = FleetSettings(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username="u",
        kafka_sasl_password_file=Path(__file__),  # any readable file
    )
    spec = ConsumerSpec(service="s", source="/s", group_id="g", topics=["t"])
    pacing = KafkaProfile(settings).pacing(pacing_input(spec))
    for made in (producer_kwargs(settings), consumer_kwargs(settings, spec, pacing)):
        assert made["security_protocol"] == "SASL_PLAINTEXT"
        assert made["sasl_plain_username"] == "u"


def test_every_kafka_client_in_services_and_bench_is_built_through_the_factory() -> None:
    # A client built with bootstrap_servers= alone would talk plaintext on a TLS fleet.
    found = 0
    for path in [*(ROOT / "services").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for call in _client_calls(path):
            found += 1
            spread = [k.value for k in call.keywords if k.arg is None]
            assert spread, f"{path.relative_to(ROOT)}:{call.lineno} does not spread the factory"
            assert all(
                isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in FACTORIES
                for v in spread
            ), f"{path.relative_to(ROOT)}:{call.lineno}"
            assert "bootstrap_servers" not in {k.arg for k in call.keywords}
    assert found >= 8


def test_a_command_reports_an_unloadable_ca_in_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    result = CliRunner().invoke(
        app,
        ["init", "--check"],
        env={
            "TOOLFLEET_KAFKA_SECURITY_PROTOCOL": "SSL",
            "TOOLFLEET_KAFKA_SSL_CA_FILE": str(garbage),
        },
    )
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "unusable Kafka security settings: TOOLFLEET_KAFKA_SSL_CA_FILE: cannot load" in out
    assert "Traceback" not in out
