"""Where ``toolfleet dev`` writes: one console, lines prefixed by service, tee'd to files.

Each service's output goes to the terminal as ``executor  | <line>`` and, unprefixed,
to ``$TOOLFLEET_HOME/logs/<service>.log``. The supervisor's own messages use the name
``dev`` and go to ``logs/dev.log``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import IO, TextIO

#: Name under which the supervisor itself speaks.
SUPERVISOR = "dev"

_COLORS = ("36", "32", "33", "35", "34", "96", "92", "93", "95")
_RESET = "\033[0m"


class DevConsole:
    """Prefixes lines with their service name and tees them to per-service log files."""

    def __init__(
        self,
        log_dir: Path,
        *,
        stream: TextIO | None = None,
        color: bool | None = None,
        width: int = 9,
    ) -> None:
        self._log_dir = log_dir
        self._stream: TextIO | None = stream if stream is not None else sys.stdout
        if color is None:
            color = bool(getattr(self._stream, "isatty", lambda: False)())
        self._color = color
        self._width = width
        self._files: dict[str, IO[str]] = {}
        self._palette: dict[str, str] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_path(self, name: str) -> Path:
        """The file a service's output is tee'd to."""
        return self._log_dir / f"{name}.log"

    def line(self, name: str, text: str) -> None:
        """One line of ``name``'s output (without its trailing newline)."""
        self._to_file(name, text)
        self._to_console(name, text)

    def say(self, text: str) -> None:
        """A message of the supervisor itself."""
        self.line(SUPERVISOR, text)

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
            handle = self.log_path(name).open("a", encoding="utf-8", buffering=1)
            self._files[name] = handle
        with contextlib.suppress(OSError):
            handle.write(text + "\n")

    def _to_console(self, name: str, text: str) -> None:
        prefix = f"{name:<{self._width}} |"
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
