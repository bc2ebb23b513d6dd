"""The env backend: one variable per credential, with a one-to-one name mapping."""

from __future__ import annotations

import pytest

from toolfleet.secrets.env import EnvSecretStore, variable_name
from toolfleet.secrets.store import SecretNotFound

pytestmark = pytest.mark.unit


def test_variable_name_is_upper_cased_parts_joined_by_double_underscores() -> None:
    assert (
        variable_name("t_acme", "gh_main", "api_key")
        == "TOOLFLEET_SECRET__T_ACME__GH_MAIN__API_KEY"
    )


async def test_resolves_from_the_environment_at_resolution_time() -> None:
    environ = {"TOOLFLEET_SECRET__T1__CONN1__API_KEY": "v1"}
    store = EnvSecretStore(environ)
    assert (await store.resolve("t1", "conn1", "api_key")).reveal() == "v1"
    environ["TOOLFLEET_SECRET__T1__CONN1__API_KEY"] = "v2"  # rotated: no restart needed
    assert (await store.resolve("t1", "conn1", "api_key")).reveal() == "v2"


async def test_missing_or_empty_is_not_found_with_a_safe_message() -> None:
    store = EnvSecretStore({"TOOLFLEET_SECRET__T1__CONN1__EMPTY": ""})
    for name in ("api_key", "empty"):
        with pytest.raises(SecretNotFound) as caught:
            await store.resolve("t1", "conn1", name)
        assert "TOOLFLEET_SECRET" not in caught.value.message
        assert caught.value.code == "permission_denied"


@pytest.mark.parametrize(
    ("tenant", "connection"),
    [
        ("T1", "conn1"),  # would share T1's variable with tenant "t1"
        ("t-1", "conn1"),  # '-' cannot appear in a variable name
        ("t1", "conn.1"),
        ("t1", "a__b"),  # would be ambiguous with the separator
        ("t1", "_conn"),
        ("t1", "conn:1"),
    ],
)
async def test_ids_that_would_not_map_one_to_one_are_refused(tenant: str, connection: str) -> None:
    # Even when a variable exists that a lossy mapping would have hit.
    environ = {
        "TOOLFLEET_SECRET__T1__CONN1__API_KEY": "v",
        "TOOLFLEET_SECRET__T_1__CONN1__API_KEY": "v",
    }
    store = EnvSecretStore(environ)
    assert variable_name(tenant, connection, "api_key") is None
    with pytest.raises(SecretNotFound):
        await store.resolve(tenant, connection, "api_key")


async def test_tenants_cannot_read_each_others_variables() -> None:
    store = EnvSecretStore({"TOOLFLEET_SECRET__T_A__CONN__API_KEY": "a-secret"})
    with pytest.raises(SecretNotFound):
        await store.resolve("t_b", "conn", "api_key")
