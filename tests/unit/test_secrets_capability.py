"""The invocation-scoped capability, the leak check, and ``@tool(credentials=...)``."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from toolfleet.errors import PermissionDenied, RegistrationError
from toolfleet.sdk import Sandbox, ToolContext, ToolPermissions, spec_of, tool
from toolfleet.secrets.capability import (
    CredentialCapability,
    LeakDetector,
    encodings,
    resolve_credentials,
)
from toolfleet.secrets.env import EnvSecretStore
from toolfleet.secrets.store import Secret, SecretNotFound

pytestmark = pytest.mark.unit

VALUE = "sk_live_7Hq2x9Lm4Pz8"


class Empty(BaseModel):
    pass


class Out(BaseModel):
    value: str


def context(capability: CredentialCapability | None) -> ToolContext:
    return ToolContext(
        tenant_id="t1",
        agent_did="did:agent:a",
        invocation_id="i",
        tool_id="acme__x",
        tool_version="1.0.0",
        credentials=capability,
        connection_id="c",
    )


def test_only_declared_names_while_the_call_runs() -> None:
    capability = CredentialCapability({"api_key": Secret(VALUE)}, tool_id="acme__x")
    ctx = context(capability)
    assert ctx.credential("api_key").reveal() == VALUE
    with pytest.raises(PermissionDenied, match="did not declare"):
        ctx.credential("other")
    capability.revoke()
    with pytest.raises(PermissionDenied, match="only usable while the call runs"):
        ctx.credential("api_key")
    assert VALUE not in repr(capability)


def test_a_tool_without_credentials_gets_none() -> None:
    with pytest.raises(PermissionDenied, match="declared no credentials"):
        context(None).credential("api_key")


async def test_resolve_credentials_resolves_each_name_now() -> None:
    store = EnvSecretStore(
        {"TOOLFLEET_SECRET__T1__C__API_KEY": "a", "TOOLFLEET_SECRET__T1__C__USER": "b"}
    )
    capability = await resolve_credentials(
        store, tenant_id="t1", connection_id="c", names=["api_key", "user"], tool_id="acme__x"
    )
    assert capability.get("user").reveal() == "b"
    with pytest.raises(SecretNotFound):
        await resolve_credentials(
            store, tenant_id="t1", connection_id="c", names=["api_key", "nope"], tool_id="x"
        )


def test_detector_finds_raw_and_base64_anywhere_in_the_output() -> None:
    detector = CredentialCapability({"k": Secret(VALUE)}, tool_id="x").detector()
    assert detector.leaks({"a": [{"b": f"prefix {VALUE} suffix"}]})
    assert detector.leaks({f"key-{VALUE}": 1})
    assert detector.leaks(["x", ("y", base64.b64encode(VALUE.encode()).decode())])
    assert detector.leaks(base64.urlsafe_b64encode(b"u:" + VALUE.encode()).decode())
    assert detector.leaks({"obj": Secret("anything")})
    assert detector.leaks(Out(value=VALUE))
    assert not detector.leaks({"fine": "nothing to see", "n": 42, "f": 1.5, "b": True, "z": None})


def test_detector_survives_hostile_nesting() -> None:
    deep: Any = VALUE
    for _ in range(50_000):
        deep = [deep]
    detector = LeakDetector([Secret(VALUE)])
    assert detector.leaks(deep)


def test_numeric_secret_in_a_number_is_found() -> None:
    assert LeakDetector([Secret("98765432")]).leaks({"pin": 98765432})


def test_empty_detector_finds_nothing() -> None:
    assert not LeakDetector([])
    assert not LeakDetector([]).leaks({"a": VALUE})


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    secret=st.text(min_size=8, max_size=64).filter(lambda s: "\x00" not in s),
    prefix=st.binary(max_size=9),
    suffix=st.binary(max_size=9),
    urlsafe=st.booleans(),
)
def test_base64_of_any_text_containing_the_secret_is_found(
    secret: str, prefix: bytes, suffix: bytes, urlsafe: bool
) -> None:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    carried = encode(prefix + secret.encode() + suffix).decode().rstrip("=")
    assert LeakDetector([Secret(secret)]).leaks({"out": carried})


def test_encodings_include_the_value_itself() -> None:
    assert VALUE in encodings(VALUE)
    assert base64.b64encode(VALUE.encode()).decode().rstrip("=")[:-1] in "".join(encodings(VALUE))


def test_tool_declares_credentials_in_its_manifest() -> None:
    @tool(
        id="acme__gh",
        version="1.0.0",
        effect="read_only",
        redaction_allowlist=["value"],
        sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key", "app_id"])),
    )
    async def gh(params: Empty, ctx: ToolContext) -> Out:
        return Out(value="x")

    assert spec_of(gh).credentials == ("api_key", "app_id")
    assert spec_of(gh).manifest().credentials == ["api_key", "app_id"]


@pytest.mark.parametrize(
    "credentials",
    [["API_KEY"], ["api-key"], ["../x"], ["a", "a"], "api_key", [""], [42]],
)
def test_invalid_credential_declarations_are_refused(credentials: Any) -> None:
    # A list that is not one of strings fails at ToolPermissions; a bad name at @tool.
    with pytest.raises((RegistrationError, ValidationError)):

        @tool(
            id="acme__gh",
            version="1.0.0",
            effect="read_only",
            redaction_allowlist=["value"],
            sandbox=Sandbox(permissions=ToolPermissions(credentials=credentials)),
        )
        async def gh(params: Empty, ctx: ToolContext) -> Out:
            return Out(value="x")


class WithConnection(BaseModel):
    connection_id: str


def test_input_may_still_not_declare_connection_id() -> None:
    with pytest.raises(RegistrationError, match="connection_id"):

        @tool(
            id="acme__gh",
            version="1.0.0",
            effect="read_only",
            redaction_allowlist=["value"],
            sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])),
        )
        async def gh(params: WithConnection, ctx: ToolContext) -> Out:
            return Out(value="x")
