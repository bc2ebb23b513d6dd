"""Renders the docs' configuration table from the settings classes.

``python -m toolfleet.config_doc [docs/configuration.md]`` rewrites the table between
the ``config-table`` markers; a test fails when that page and the classes disagree.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from pydantic_settings import BaseSettings

#: Every settings class, by module and name; each service's own knobs included.
SETTINGS_CLASSES = (
    ("toolfleet.settings", "FleetSettings"),
    ("toolfleet.policy.settings", "PolicySettings"),
    ("toolfleet.executor.settings", "ExecutorSettings"),
    ("toolfleet.api.settings", "ApiSettings"),
    ("toolfleet.maintenance.settings", "MaintenanceSettings"),
    ("toolfleet.analytics.settings", "AnalyticsSettings"),
    ("toolfleet.devstack.broker_profile.settings", "DevBrokerSettings"),
)
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"


def _classes() -> list[tuple[str, type[BaseSettings]]]:
    found = []
    for module, name in SETTINGS_CLASSES:
        cls = getattr(importlib.import_module(module), name)
        found.append((module.split(".")[1] if module.count(".") > 1 else "fleet", cls))
    return found


#: Broker profiles, the one a default can follow (``TOOLFLEET_BROKER_PROFILE``) first.
PROFILES = ("kafka", "dev")


def _default(cls: type[BaseSettings], field_name: str) -> object:
    info = cls.model_fields[field_name]
    if info.default_factory_takes_validated_data:  # follows the broker profile
        return {
            profile: info.get_default(
                call_default_factory=True, validated_data={"broker_profile": profile}
            )
            for profile in PROFILES
        }
    return info.get_default(call_default_factory=True)


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{_shown(v)} ({profile})" for profile, v in value.items())
    return "unset" if value is None or value == "" else f"`{value}`"


def render_table() -> str:
    """One row per variable; a service that overrides a shared default says so."""
    classes = _classes()
    base = classes[0][1]
    rows: dict[str, list[str]] = {}
    for scope, cls in classes:
        for field_name, info in cls.model_fields.items():
            var = f"TOOLFLEET_{field_name.upper()}"
            text = (info.description or "").replace("\n", " ").replace("|", "\\|")
            text = text.replace("``", "`")
            if cls is base:
                rows[var] = [_shown(_default(cls, field_name)), text]
            elif field_name not in base.model_fields:
                rows[var] = [_shown(_default(cls, field_name)), f"{text} ({scope})"]
            elif _default(cls, field_name) != _default(base, field_name):
                rows[var][0] += f"; {scope}: {_shown(_default(cls, field_name))}"
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    lines += [f"| `{var}` | {default} | {text} |" for var, (default, text) in rows.items()]
    return "\n".join(lines)


def rewrite(page: str) -> str:
    """``page`` with the table between its markers regenerated; ValueError without them
    (the table moved: say so instead of appending a second one)."""
    if page.count(START) != 1 or page.count(END) != 1:
        raise ValueError(f"the page needs exactly one {START} ... {END} pair")
    head, _, rest = page.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{render_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m toolfleet.config_doc",
        description="Rewrite the configuration table of PAGE from the settings classes.",
    )
    parser.add_argument("page", nargs="?", type=Path, default=Path("docs/configuration.md"))
    path: Path = parser.parse_args(argv).page
    path.write_text(rewrite(path.read_text()))


if __name__ == "__main__":
    main()
