"""How every Kafka client of toolfleet connects: brokers, TLS and SASL, in one place.

Every producer, consumer and admin client is built as
``AIOKafkaProducer(**connection_kwargs(settings), acks=...)``, so a fleet configured
for ``SASL_SSL`` never has one client that quietly talks plaintext. The SASL password
is read from ``TOOLFLEET_KAFKA_SASL_PASSWORD_FILE`` when a client is built (a rotated
file is picked up by the next client) and is never logged: :class:`KafkaConnection`
hides it from ``repr``, and the errors here name files, never their contents.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolfleet.errors import KafkaSecurityError
from toolfleet.settings import FleetSettings, kafka_security_problems


@dataclass(frozen=True, kw_only=True)
class KafkaConnection:
    """What aiokafka needs to reach the brokers, built from the settings."""

    bootstrap_servers: str
    security_protocol: str
    ssl_context: ssl.SSLContext | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    """Read from the password file; ``repr`` leaves it out."""

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by ``AIOKafkaProducer``, ``AIOKafkaConsumer`` and
        ``AIOKafkaAdminClient``."""
        found: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "security_protocol": self.security_protocol,
        }
        if self.ssl_context is not None:
            found["ssl_context"] = self.ssl_context
        if self.sasl_mechanism is not None:
            found["sasl_mechanism"] = self.sasl_mechanism
            found["sasl_plain_username"] = self.sasl_username
            found["sasl_plain_password"] = self.sasl_password
        return found


def kafka_connection(settings: FleetSettings) -> KafkaConnection:
    """The connection the settings describe; :class:`KafkaSecurityError` if unusable."""
    problems = kafka_security_problems(settings)
    if problems:
        raise KafkaSecurityError("; ".join(problems))
    protocol = settings.kafka_security_protocol
    context = ssl_context(settings) if protocol in {"SSL", "SASL_SSL"} else None
    if not protocol.startswith("SASL_"):
        return KafkaConnection(
            bootstrap_servers=settings.kafka_bootstrap,
            security_protocol=protocol,
            ssl_context=context,
        )
    assert settings.kafka_sasl_password_file is not None  # kafka_security_problems checked
    return KafkaConnection(
        bootstrap_servers=settings.kafka_bootstrap,
        security_protocol=protocol,
        ssl_context=context,
        sasl_mechanism=settings.kafka_sasl_mechanism,
        sasl_username=settings.kafka_sasl_username,
        sasl_password=read_password(settings.kafka_sasl_password_file),
    )


def connection_kwargs(settings: FleetSettings) -> dict[str, Any]:
    """``kafka_connection(settings).kwargs()``: what every client construction spreads."""
    return kafka_connection(settings).kwargs()


def ssl_context(settings: FleetSettings) -> ssl.SSLContext:
    """A client TLS context: hostname checked, the CA file (or the system's CAs) trusted,
    the client certificate loaded when one is configured."""
    ca = settings.kafka_ssl_ca_file
    try:
        context = ssl.create_default_context(
            ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca is not None else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise KafkaSecurityError(
            f"TOOLFLEET_KAFKA_SSL_CA_FILE: cannot load {ca} as PEM CA certificates "
            f"({type(exc).__name__})"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = settings.kafka_ssl_cert_file, settings.kafka_ssl_key_file
    if cert is not None and key is not None:
        try:
            context.load_cert_chain(certfile=str(cert), keyfile=str(key))
        except (OSError, ssl.SSLError) as exc:
            raise KafkaSecurityError(
                f"TOOLFLEET_KAFKA_SSL_CERT_FILE/KEY_FILE: cannot load {cert} with key {key} "
                f"({type(exc).__name__}; the key must be unencrypted PEM)"
            ) from None
    return context


def read_password(path: Path) -> str:
    """The first line of ``path``, without its line ending; errors never quote the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise KafkaSecurityError(
            f"TOOLFLEET_KAFKA_SASL_PASSWORD_FILE: cannot read {path} ({type(exc).__name__})"
        ) from None
    lines = text.splitlines()
    password = lines[0] if lines else ""
    if not password:
        raise KafkaSecurityError(f"TOOLFLEET_KAFKA_SASL_PASSWORD_FILE: {path} is empty")
    return password
