"""Where ``toolfleet dev`` writes: a short terminal, and one log file per service.

Every child's output goes to ``$TOOLFLEET_HOME/logs/<service>.log``; the supervisor's own
lines go to the terminal and to ``logs/dev.log``. Each file is rotated once per run of
``toolfleet dev``: the previous run's is kept as ``<service>.log.1``, older ones are
dropped. A child restarted within a run appends to its file after a
``---- <time> started pid N ----`` marker.

The terminal shows what a developer acts on: one line per service once it is up, the
doctor's findings, the URLs, and for a service that dies, its exit and the last lines it
printed. With ``verbose`` the children's output streams to the terminal as well, each
line prefixed by its service (``executor    | ...``), the supervisor's by ``dev``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TextIO

from toolfleet.doctor.results import CheckResult, CheckStatus

#: Name under which the supervisor itself speaks (``logs/dev.log``).
SUPERVISOR = "dev"
#: Longest service name (``maintenance``): the width of the name column.
NAME_WIDTH = 11
#: Characters of one tail line shown on the terminal; the log file has the whole line.
TAIL_LINE_CHARS = 240

_COLORS = ("36", "32", "33", "35", "34", "96", "92", "93", "95")
_RESET = "\033[0m"


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when under it (shorter to type)."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def up_line(name: str, *, pid: int | None, log_path: Path, url: str | None = None) -> str:
    """``up  executor    pid 4242     .toolfleet/logs/executor.log``, and the URL if any."""
    text = f"up  {name:<{NAME_WIDTH}} pid {pid if pid is not None else '-':<7} "
    text += shown_path(log_path)
    return f"{text}   {url}" if url else text


def _clipped(line: str) -> str:
    return line if len(line) <= TAIL_LINE_CHARS else line[: TAIL_LINE_CHARS - 1] + "…"


def death_lines(
    name: str,
    *,
    pid: int | None,
    reason: str,
    tail: Sequence[str],
    log_path: Path,
    next_step: str,
    show_tail: bool = True,
    same_as_before: bool = False,
) -> list[str]:
    """What the terminal says when a service dies: one line with how it ended, the last
    lines it printed (``show_tail``; they are what was shown at its previous crash when
    ``same_as_before``, and then left out), then what the supervisor does next."""
    ended = f"{name} {reason}" if pid is None else f"{name} died: {reason} (pid {pid})"
    log = shown_path(log_path)
    if not show_tail:
        return [f"{ended}; log: {log}", next_step]
    if same_as_before:
        return [f"{ended}; its last lines as at its previous crash ({log}); {next_step}"]
    if not tail:
        return [f"{ended}; it printed nothing ({log})", next_step]
    return [
        f"{ended}; its last {len(tail)} lines ({log}):",
        *(f"  {name} | {_clipped(line)}" for line in tail),
        next_step,
    ]


def doctor_lines(results: Sequence[CheckResult], *, log_path: Path) -> tuple[str, list[str]]:
    """A summary of ``toolfleet doctor``'s checks, and the line of each one not ``ok``."""
    counts = Counter(result.status for result in results)
    summary = ", ".join(f"{counts[status]} {status.value}" for status in CheckStatus)
    return (
        f"doctor (dev profile): {summary}; every check in {shown_path(log_path)}",
        [f"  {r.line()}" for r in results if r.status is not CheckStatus.OK],
    )


def banner(*, api_url: str, env_file: Path, log_dir: Path) -> str:
    """What ``toolfleet dev`` prints once the fleet is up."""
    return "\n".join(
        [
            "",
            "toolfleet dev is up",
            "",
            f"  API      {api_url}   (OpenAPI: {api_url}/openapi.json)",
            f"  console  {api_url}/console",
            f"  join     source {shown_path(env_file)}   (in any other shell)",
            "  try      toolfleet invoke core__get_current_time --tenant t1 --wait",
            f"  logs     {shown_path(log_dir)}/<service>.log   (here too: toolfleet dev --verbose)",
            "  stop     Ctrl-C",
            "",
        ]
    )


class DevConsole:
    """The terminal of ``toolfleet dev`` and the log files of its services."""

    def __init__(
        self,
        log_dir: Path,
        *,
        stream: TextIO | None = None,
        color: bool | None = None,
        verbose: bool = False,
    ) -> None:
        self._log_dir = log_dir
        self._stream: TextIO | None = stream if stream is not None else sys.stdout
        if color is None:
            color = bool(getattr(self._stream, "isatty", lambda: False)())
        self._color = color
        self.verbose = verbose
        """Whether the children's output reaches the terminal too."""
        self._files: dict[str, IO[str]] = {}
        self._palette: dict[str, str] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, name: str) -> Path:
        """The file a service's output goes to."""
        return self._log_dir / f"{name}.log"

    def line(self, name: str, text: str) -> None:
        """One line of ``name``'s output (without its trailing newline)."""
        self._to_file(name, text)
        if self.verbose:
            self._to_console(name, text)

    def say(self, text: str) -> None:
        """A line of the supervisor itself: on the terminal and in ``dev.log``."""
        self.record(text)
        self.show(text)

    def record(self, text: str) -> None:
        """A line of the supervisor for ``dev.log`` only (each check of the doctor)."""
        self._to_file(SUPERVISOR, text)

    def show(self, text: str) -> None:
        """A line of the supervisor for the terminal only (what it recorded already)."""
        if self.verbose:
            self._to_console(SUPERVISOR, text)
        else:
            self._write(text + "\n")

    def mark(self, name: str, text: str) -> None:
        """A marker in ``name``'s log file only (``---- started pid 42 ...``)."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._to_file(name, f"---- {stamp} {text} ----")

    def print_block(self, text: str) -> None:
        """Unprefixed text on the console (the banner); also recorded in ``dev.log``."""
        for row in text.splitlines():
            self._to_file(SUPERVISOR, row)
        self._write(text if text.endswith("\n") else text + "\n")

    def close(self) -> None:
        for handle in self._files.values():
            with contextlib.suppress(OSError):
                handle.close()
        self._files.clear()

    def _to_file(self, name: str, text: str) -> None:
        handle = self._files.get(name)
        if handle is None:
            handle = self._open(name)
            self._files[name] = handle
        with contextlib.suppress(OSError):
            handle.write(text + "\n")

    def _open(self, name: str) -> IO[str]:
        """The service's file, fresh for this run; the previous run's becomes ``.log.1``."""
        path = self.log_path(name)
        with contextlib.suppress(FileNotFoundError):
            path.replace(path.with_name(f"{path.name}.1"))
        return path.open("a", encoding="utf-8", buffering=1)

    def _to_console(self, name: str, text: str) -> None:
        prefix = f"{name:<{NAME_WIDTH}} |"
        if self._color:
            code = self._palette.setdefault(name, _COLORS[len(self._palette) % len(_COLORS)])
            prefix = f"\033[{code}m{prefix}{_RESET}"
        self._write(f"{prefix} {text}\n")

    def _write(self, text: str) -> None:
        if self._stream is None:
            return
        try:
            self._stream.write(text)
            self._stream.flush()
        except (BrokenPipeError, ValueError):
            # The terminal went away (or stdout is piped into `head`): keep the files.
            self._stream = None
