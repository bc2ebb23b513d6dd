"""How commands print: rich for people on stderr/stdout, plain JSON for ``--json``.

rich is imported at the first thing printed for people, not with this module: the
``worker`` and ``api`` commands print nothing of the kind while they run, and rich would
be 2-3 MB of every worker's memory (issue 36). ``console`` and ``err_console`` are made
on first use (a module ``__getattr__``, PEP 562); modules on those commands' path read
them as ``output.err_console`` when they print, not by ``from ... import``.
"""

from __future__ import annotations

import json
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from toolfleet.bus.topics import TopicReport

    console: Console
    """Human output (stdout)."""
    err_console: Console
    """Progress and diagnostics (stderr), so stdout stays clean for pipes."""


@cache
def _stdout() -> Console:
    from rich.console import Console

    return Console(highlight=False)


@cache
def _stderr() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def escape(text: str) -> str:
    """``text`` with rich's markup escaped (:func:`rich.markup.escape`)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def __getattr__(name: str) -> Console:
    if name == "console":
        return _stdout()
    if name == "err_console":
        return _stderr()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_STATUS_STYLE = {
    "success": "bold green",
    "pending": "cyan",
    "pending_approval": "bold yellow",
    "queued": "yellow",
    "running": "cyan",
    "error": "bold red",
    "timeout": "bold red",
    "cancelled": "yellow",
    "permission_denied": "bold red",
}


def print_json(data: Any) -> None:
    """One JSON document on stdout, nothing else (machine-readable output)."""
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def styled_status(status: str) -> str:
    return f"[{_STATUS_STYLE.get(status, 'bold')}]{status}[/]"


def print_invocation(view: dict[str, Any]) -> None:
    """A status API invocation as a key/value table, result and error as JSON."""
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column()
    version = f"@{view['tool_version']}" if view.get("tool_version") else ""
    table.add_row("invocation", str(view["invocation_id"]))
    table.add_row("tenant", str(view["tenant_id"]))
    table.add_row("tool", f"{view['tool_id']}{version}")
    table.add_row("status", styled_status(str(view["status"])))
    if view.get("status") in {"running", "pending"} or view.get("current_phase"):
        phase = view.get("current_phase") or ""
        table.add_row(
            "progress", f"{view.get('progress_percent', 0):.0f}% {escape(phase)}".rstrip()
        )
    for name in ("created_at", "started_at", "completed_at"):
        if view.get(name):
            table.add_row(name.replace("_", " "), str(view[name]))
    _stdout().print(table)
    print_details(view)


def print_details(outcome: dict[str, Any]) -> None:
    """Result, error, warnings and a metadata summary of an outcome or status."""
    from rich.json import JSON

    if outcome.get("result") is not None:
        _stdout().print("[dim]result[/]")
        _stdout().print(JSON.from_data(outcome["result"]))
    error = outcome.get("error")
    if error:
        retry = " (retryable)" if error.get("retryable") else ""
        message = escape(str(error.get("message", "")))
        _stdout().print(f"[bold red]{error.get('code')}[/]: {message}{retry}")
        if error.get("details"):
            _stdout().print(JSON.from_data(error["details"]))
    for warning in outcome.get("warnings") or []:
        _stdout().print(f"[yellow]warning:[/] {escape(str(warning))}")
    meta = outcome.get("execution_metadata") or {}
    if meta:
        parts = [f"{meta.get('duration_ms', 0)} ms", f"attempts {meta.get('attempts', 1)}"]
        checkpoints = meta.get("checkpoints_created") or []
        if checkpoints:
            parts.append(f"checkpoints {len(checkpoints)}")
        if meta.get("resumed_from_checkpoint_id"):
            parts.append("resumed")
        if meta.get("cached"):
            parts.append("cached")
        if meta.get("truncated"):
            parts.append("result truncated: a preview")
        _stdout().print(f"[dim]{', '.join(parts)}[/]")
        for attachment in meta.get("attachments") or []:
            url, kind = attachment.get("url"), attachment.get("content_type")
            size = attachment.get("bytes", 0)
            _stdout().print(
                f"[dim]attachment[/] {escape(str(url))} ({size} bytes, {escape(str(kind))})"
            )


def print_topic_report(report: TopicReport) -> None:
    """Created, missing and drifted topics (``toolfleet init``), on stderr."""
    for name in report.created:
        _stderr().print(f"created topic {escape(name)}")
    for name in report.missing:
        _stderr().print(f"[bold red]missing topic[/] {escape(name)}")
    for d in report.altered:
        _stderr().print(f"altered {escape(d.topic)}: {escape(d.key)} {d.have} -> {d.want}")
    for d in report.drift:
        note = "" if d.alterable else " (not changed by --apply: it would move tenants)"
        _stderr().print(
            f"[bold yellow]drift[/] {escape(d.topic)}: {escape(d.key)} is "
            f"{escape(str(d.have) if d.have is not None else 'unset')}, "
            f"topics.yaml says {escape(d.want)}{note}"
        )
    if report.drift and report.mode.value == "create":
        _stderr().print("run `toolfleet init --apply` to alter the drifted configs")
