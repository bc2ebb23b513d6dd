"""A worker loads only what its service uses: each service's process, started fresh,
imports exactly what ``toolfleet worker NAME`` imports (:mod:`toolfleet.worker` and the
build of NAME, through :func:`~toolfleet.worker.load_build`), and none of the heavy
packages it never needs is among its modules.

Every package left out here is tens of MB of resident memory per worker process (issue
36: a worker stays within 80 MB). The code paths that do need one import it there: an MCP
tool source or document source (the MCP SDK, with starlette, uvicorn and httpx2 under
it), Vault secrets (hvac, requests), a JWKS URL or an HTTP tool source (httpx), creating
or rotating key files (cryptography's primitives, for the services that sign with HMAC
only), sealing or opening a large or cached result (cryptography's compiled core, for
the executor and the validator), the first JSON Schema checked (jsonschema-rs), a topic
for a new executor pool (policy's admin client). Those paths are checked here too: each
one still finds what it imports. redis-py's probe for the OpenTelemetry metrics SDK finds
it absent in a worker, whose Redis client works without it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from toolfleet.worker import AUXILIARY, SERVICES

pytestmark = pytest.mark.unit

NEVER_IN_A_WORKER = ("fastapi", "faust", "wordllama", "numpy", "uvicorn", "starlette")
"""The API's web stack and the analytics and search stacks: no pipeline worker runs them."""
MCP_SDK = ("mcp", "mcp_types", "httpx2", "sse_starlette", "anyio")
"""Loaded when an MCP session opens (a tool source, the document source), not before."""
ON_DEMAND = ("hvac", "requests", "httpx")
"""Vault secrets; a JWKS URL or an HTTP tool source: loaded by the path that uses them."""
KEY_FILES = ("cryptography.hazmat.primitives", "toolfleet.auth.keys")
"""RSA keys: policy checks tokens; no other worker verifies or signs with them (grants
and outcomes are HMAC)."""
PYJWT = ("jwt",)
"""No worker: policy verifies tokens with cryptography alone (1.2 MB less,
:mod:`toolfleet.auth.tokens`); PyJWT is the tests' reference."""
CRYPTOGRAPHY = ("cryptography.hazmat.bindings._rust",)
"""cryptography's compiled core (its own OpenSSL, about 6 MB): policy's token checks load
it; the executor and the validator at the first large or cached result they seal or open
(AES-GCM at rest). redis imports the bare ``cryptography`` package, which is not it."""
SCHEMAS = ("jsonschema_rs",)
"""About 6 MB once used: loaded at the first schema compiled (policy: a request's
parameters, the validator: a result), never by an executor without source tools."""
POLICY_FILES = ("yaml",)
"""YAML policy documents are read by the command line; policy reads its policies from
Postgres as JSON (the executor loads yaml with its pools' topic admin)."""
POOL_ADMIN = ("toolfleet.bus.admin", "aiokafka.admin")
"""Policy creates a pool's topic at the first call of a pool other than the default."""
REDIS_METRICS = ("opentelemetry.sdk.metrics",)
"""The OpenTelemetry metrics SDK (with ctypes under it, about 1.1 MB) that redis-py
imports only to learn whether it is installed: no worker turns redis-py's metrics on
(:mod:`toolfleet.observability.redis_metrics`)."""

TRACING_SDK = ("opentelemetry.sdk", "psutil")
"""The OpenTelemetry SDK (with its resources and psutil under them, about 1.6 MB): loaded
when spans are exported (``TOOLFLEET_OTEL_EXPORTER``), by ``tracing_sdk``."""

ANYWHERE = (
    *NEVER_IN_A_WORKER,
    *MCP_SDK,
    *ON_DEMAND,
    *SCHEMAS,
    *REDIS_METRICS,
    *TRACING_SDK,
    *PYJWT,
)
"""Absent from every worker once loaded, before its first call."""
NO_RSA = (*ANYWHERE, *KEY_FILES, *CRYPTOGRAPHY)

ABSENT: dict[str, tuple[str, ...]] = {
    "policy": (*ANYWHERE, *POOL_ADMIN, *POLICY_FILES),
    "executor": NO_RSA,
    "validator": NO_RSA,
    "audit": NO_RSA,
    "status": NO_RSA,
    "audit+status": NO_RSA,
    "maintenance": NO_RSA,
}


def run_fresh(code: str) -> object:
    """What ``code`` (run in a new interpreter) prints as JSON on its last line."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def loaded_by_worker(service: str, packages: tuple[str, ...]) -> list[str]:
    """Those of ``packages`` in ``sys.modules`` once a worker of ``service`` is loaded."""
    return run_fresh(  # type: ignore[return-value]
        f"""
        import json, sys
        from toolfleet.worker import load_build
        load_build({service!r})
        print(json.dumps([p for p in {list(packages)!r} if p in sys.modules]))
        """
    )


def test_every_worker_is_covered() -> None:
    assert set(ABSENT) >= {*SERVICES, *AUXILIARY, "audit+status"}


@pytest.mark.parametrize("service", sorted(ABSENT))
def test_a_worker_loads_no_package_its_service_does_not_use(service: str) -> None:
    assert loaded_by_worker(service, ABSENT[service]) == []


def test_the_paths_that_need_a_heavy_package_still_load_it() -> None:
    """Once a worker is loaded, each lazy path finds what it imports (no ImportError, no
    NameError at the first MCP session, Vault read, JWKS fetch or key file)."""
    found = run_fresh(
        """
        import json, sys
        from pathlib import Path
        from tempfile import mkdtemp

        from toolfleet.worker import load_build

        load_build("executor")
        load_build("policy")

        from toolfleet.auth.grants import ensure_grant_key, load_grant_keys, rotate_grant_key
        from toolfleet.auth.keyring import UrlJwksSource
        from toolfleet.executor.handler import secret_store
        from toolfleet.executor.settings import ExecutorSettings
        from toolfleet.sources.models import SourceDefinition, SourceKind
        from toolfleet.sources.pool import server_of

        out = {}
        home = Path(mkdtemp())
        (home / "token").write_text("t")
        vault = secret_store(ExecutorSettings(
            secret_backend="vault", vault_addr="http://127.0.0.1:1", vault_token_file=home / "token"
        ))
        out["vault"] = [type(vault).__name__, "hvac" in sys.modules]
        key = home / "grant.key"
        created = ensure_grant_key(key)
        rotate_grant_key(key)
        out["grant_keys"] = [created, len(load_grant_keys(key))]
        stdio = SourceDefinition(
            tenant_id="t", name="s", kind=SourceKind.MCP_STDIO, target="server --flag"
        )
        out["stdio"] = type(server_of(stdio)).__name__
        out["mcp"] = "mcp" in sys.modules
        import asyncio
        from toolfleet.auth.keyring import KeySourceError
        try:  # nothing listens on port 1: httpx is imported, then refused
            asyncio.run(UrlJwksSource(url="http://127.0.0.1:1/jwks.json", timeout_s=2).fetch())
        except KeySourceError as exc:
            out["jwks"] = str(exc)
        print(json.dumps(out))
        """
    )
    assert found == {
        "vault": ["VaultSecretStore", True],
        "grant_keys": [True, 2],
        "stdio": "StdioServerParameters",
        "mcp": True,
        "jwks": "cannot fetch JWKS URL http://127.0.0.1:1/jwks.json (ConnectError)",
    }


def test_what_the_validator_loads_late_it_loads_when_a_result_needs_it() -> None:
    """The at-rest cipher (a result past the inline limit) and the schema check (every
    result) load cryptography and jsonschema-rs at first use, and work as before."""
    found = run_fresh(
        f"""
        import json, sys

        from toolfleet.worker import load_build

        load_build("validator")

        from toolfleet.registry.schemas import CompiledSchemas
        from toolfleet.storage.at_rest import TRANSFER_BLOB, AtRestCipher

        def loaded():
            return [p in sys.modules for p in {[*CRYPTOGRAPHY, *SCHEMAS]!r}]

        out = {{"built": loaded()}}
        old, new = b"o" * 32, b"n" * 32
        sealed = AtRestCipher([old], purpose=TRANSFER_BLOB).seal(b"raw", aad=b"here")
        rotated = AtRestCipher([new, old], purpose=TRANSFER_BLOB)
        out["opened"] = [
            rotated.open(sealed, aad=b"here").decode(),
            rotated.open(sealed, aad=b"elsewhere"),
            AtRestCipher([new], purpose=TRANSFER_BLOB).open(sealed, aad=b"here"),
        ]
        schema = {{"type": "object", "required": ["message"]}}
        out["errors"] = [e["keyword"] for e in CompiledSchemas().errors(schema, {{}})]
        out["used"] = loaded()
        print(json.dumps(out))
        """
    )
    assert found == {
        "built": [False, False],
        "opened": ["raw", None, None],
        "errors": ["required"],
        "used": [True, True],
    }


def test_the_worker_command_loads_no_other_command() -> None:
    """``toolfleet worker NAME`` runs on an app of that one command: the other commands'
    modules (and httpx, jwt, the agent runner under them) stay out of a worker process."""
    loaded = run_fresh(
        """
        import json, sys
        sys.argv = ["toolfleet", "worker", "no-such-service"]
        from toolfleet.cli.main import main
        try:
            main()
        except SystemExit:
            pass
        print(json.dumps(sorted(sys.modules)))
        """
    )
    assert isinstance(loaded, list)
    assert "toolfleet.cli.fleet" in loaded  # the command did run (and refused the name)
    others = ("agent", "audit", "doctor", "invoke", "keys", "policy", "remote", "tokens")
    present = [m for m in loaded if m in {f"toolfleet.cli.{o}" for o in others}]
    assert present == []
    assert not {"httpx", "jwt", "toolfleet.agent"} & set(loaded)


COMMAND_LINE = ("typer", "click", "typer._click", "toolfleet.cli.fleet", "rich", "yaml")
"""What parses the other commands (typer, its click, rich's output) and reads the topics
file: a well-formed ``toolfleet worker`` command line runs without them (2.5 MB per
worker, :mod:`toolfleet.cli.worker_command`)."""


def loaded_by_worker_command(argv: list[str], packages: tuple[str, ...]) -> object:
    """What ``toolfleet worker ...`` (``argv`` after ``worker``) has loaded of
    ``packages`` when the worker would run, its service built; the worker itself stands
    in for :func:`~toolfleet.worker.run_worker` (no broker here), keys unchecked."""
    return run_fresh(
        f"""
        import json, os, sys
        import toolfleet.worker as worker

        def run_worker(name, settings):
            worker.load_build(name)
            loaded = [p for p in {list(packages)!r} if p in sys.modules]
            print(json.dumps([name, os.environ.get("TOOLFLEET_EXECUTOR_POOLS"), loaded]))

        worker.run_worker = run_worker
        worker.require_keys = lambda name, settings: None
        sys.argv = ["toolfleet", "worker", *{argv!r}]
        from toolfleet.cli.main import main
        main()
        """
    )


@pytest.mark.parametrize("service", sorted(ABSENT))
def test_the_worker_command_runs_a_worker_without_the_command_line_framework(
    service: str,
) -> None:
    absent = (*ABSENT[service], *COMMAND_LINE)
    assert loaded_by_worker_command([service], absent) == [service, None, []]


def test_a_worker_command_line_with_pools_runs_without_it_too() -> None:
    loaded = loaded_by_worker_command(
        ["executor", "--pool", "gpu", "--pool=default", "--pool", "gpu"], COMMAND_LINE
    )
    assert loaded == ["executor", "gpu,default", []]


@pytest.mark.parametrize(
    ("argv", "code", "said"),
    [
        (["bogus"], 2, "unknown or repeated service"),
        (["executor", "--pool", "Not A Pool"], 2, "--pool"),
        (["policy", "--pool", "gpu"], 2, "only an executor serves pools"),
        (["policy", "validator"], 2, "unexpected extra argument"),
        (["--help"], 0, "NAME[+NAME...]"),
    ],
)
def test_any_other_worker_command_line_gets_typer_s_answer(
    argv: list[str], code: int, said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "toolfleet", "worker", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == code, done.stderr
    assert said in " ".join((done.stdout + done.stderr).split())


def test_a_worker_interrupted_before_its_loop_runs_ends_as_a_command_does() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                """
                import sys
                import toolfleet.worker as worker

                def run_worker(name, settings):
                    raise KeyboardInterrupt

                worker.run_worker = run_worker
                worker.require_keys = lambda name, settings: None
                sys.argv = ["toolfleet", "worker", "validator"]
                from toolfleet.cli.main import main
                main()
                """
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stderr.strip()) == (1, "Aborted!")


def test_every_other_command_line_gets_every_command() -> None:
    from typer.main import get_command

    from toolfleet.cli.main import app, full_app, worker_app

    assert app is full_app()
    everything = get_command(full_app()).commands  # type: ignore[attr-defined]
    assert {"dev", "worker", "tools", "token", "agent", "doctor"} <= set(everything)
    assert set(get_command(worker_app()).commands) == {"worker"}  # type: ignore[attr-defined]


def test_redis_works_in_a_worker_without_the_metrics_sdk_which_still_imports() -> None:
    """redis-py is imported without the OpenTelemetry metrics SDK in a worker: its client
    still connects (here, to a closed port: redis-py's own ``ConnectionError``, not an
    ``ImportError``), and the SDK still imports for whoever needs it later."""
    found = run_fresh(
        """
        import asyncio, json, sys

        from toolfleet.worker import load_build

        load_build("policy")
        out = {"sdk_at_start": "opentelemetry.sdk.metrics" in sys.modules}

        from redis.exceptions import ConnectionError
        from toolfleet.storage.redis import connect_redis

        async def ping():
            client = connect_redis("redis://127.0.0.1:1/0", wait_s=1)
            try:
                await client.ping()
            except ConnectionError:
                return "refused"
            finally:
                await client.aclose()

        out["ping"] = asyncio.run(ping())
        from opentelemetry.sdk.metrics import MeterProvider

        out["sdk_later"] = MeterProvider.__name__
        print(json.dumps(out))
        """
    )
    assert found == {"sdk_at_start": False, "ping": "refused", "sdk_later": "MeterProvider"}


def test_the_worker_command_prints_with_rich_only_when_it_prints() -> None:
    """rich (2-3 MB) stays out of a running worker, which prints nothing for people; an
    error the command line reports still comes out escaped, through rich."""
    found = run_fresh(
        """
        import contextlib, io, json, sys

        import toolfleet.cli.fleet
        from toolfleet.cli.main import worker_app
        from toolfleet.worker import load_build

        worker_app()
        load_build("policy")
        out = {"rich_at_start": "rich" in sys.modules}
        from toolfleet.cli import output

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            output.err_console.print("[bold red]Error:[/] " + output.escape("[not markup]"))
        out["printed"] = err.getvalue().strip()
        out["rich_later"] = "rich" in sys.modules
        print(json.dumps(out))
        """
    )
    assert found == {
        "rich_at_start": False,
        "printed": "Error: [not markup]",
        "rich_later": True,
    }
