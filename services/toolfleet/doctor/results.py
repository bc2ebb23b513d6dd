"""What one check of ``toolfleet doctor`` found: a status and one line of detail."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from toolfleet.settings import BrokerProfileName

Profile = BrokerProfileName
"""``TOOLFLEET_BROKER_PROFILE``: what the deployment is judged as (contract section 9)."""


class CheckStatus(StrEnum):
    """How a check ended; any ``fail`` makes ``toolfleet doctor`` exit 1."""

    OK = "ok"
    """The deployment does what production needs here."""
    WARN = "warn"
    """Worth a look, or not checkable from here (a managed Redis that refuses
    ``CONFIG``); under the ``dev`` profile also what only production needs."""
    FAIL = "fail"
    """Production would break, lose data or be open here; or the check could not reach
    what it checks."""


Problem = tuple[CheckStatus, str]
"""One thing a check found wrong, with how bad it is."""

_RANK = {CheckStatus.FAIL: 0, CheckStatus.WARN: 1, CheckStatus.OK: 2}


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One line of ``toolfleet doctor``. ``detail`` never holds a password, key or token."""

    name: str
    status: CheckStatus
    detail: str

    def line(self) -> str:
        """``ok    topics          8 topics match topics.yaml``: fixed columns."""
        shown = "FAIL" if self.status is CheckStatus.FAIL else self.status.value
        return f"{shown:<5} {self.name:<15} {self.detail}"

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail}


def production_only(profile: Profile) -> CheckStatus:
    """The status of a gap only production cares about: a warning under ``dev``."""
    return CheckStatus.WARN if profile == "dev" else CheckStatus.FAIL


def worst(statuses: Sequence[CheckStatus]) -> CheckStatus:
    """The most severe of ``statuses`` (``ok`` for none)."""
    return min(statuses, key=_RANK.__getitem__, default=CheckStatus.OK)


def result_of(name: str, problems: Sequence[Problem], *, ok: str) -> CheckResult:
    """One result of several problems: the worst status, and the problems (worst first)
    as the detail; ``ok`` as the detail when there are none."""
    if not problems:
        return CheckResult(name=name, status=CheckStatus.OK, detail=ok)
    ordered = sorted(problems, key=lambda problem: _RANK[problem[0]])
    return CheckResult(
        name=name,
        status=ordered[0][0],
        detail="; ".join(text for _, text in ordered),
    )
