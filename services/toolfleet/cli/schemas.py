"""Write ``schemas/`` from the event models, or check that it is current (``make schemas``).

Usage::

    python -m toolfleet.cli.schemas schemas          # (re)write the files
    python -m toolfleet.cli.schemas --check schemas  # write nothing; exit 1 listing drift

The text comes from :func:`toolfleet.contract.schema_export.render`; this module owns the
files: what differs, what is stale, and writing them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from toolfleet.contract.schema_export import ASYNCAPI_PATH, ENVELOPE_SCHEMA_PATH, GENERATOR, render


def _existing(root: Path) -> set[str]:
    """Generated-looking files already in ``root`` (to find stale ones)."""
    found = {p.relative_to(root).as_posix() for p in (root / "events").glob("*.json")}
    found |= {p for p in (ENVELOPE_SCHEMA_PATH, ASYNCAPI_PATH) if (root / p).exists()}
    return found


def drift(root: Path) -> list[str]:
    """Paths under ``root`` that differ from :func:`render` (changed, missing or stale)."""
    expected = render()
    drifted = [
        path
        for path, text in expected.items()
        if not (root / path).is_file() or (root / path).read_text(encoding="utf-8") != text
    ]
    drifted.extend(sorted(_existing(root) - expected.keys()))
    return drifted


def write(root: Path) -> list[str]:
    """Write every file under ``root``, removing stale event schemas; returns changed paths."""
    changed = drift(root)
    expected = render()
    for stale in _existing(root) - expected.keys():
        (root / stale).unlink()
    for path in changed:
        if path in expected:
            target = root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(expected[path], encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {GENERATOR}",
        description="Generate the JSON Schemas and AsyncAPI document from the event models.",
    )
    parser.add_argument("dir", type=Path, help="output directory, e.g. schemas")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 listing drifted files"
    )
    args = parser.parse_args(argv)
    root: Path = args.dir
    if args.check:
        drifted = drift(root)
        for path in drifted:
            print(f"drifted: {root / path}", file=sys.stderr)
        if drifted:
            print(
                f"{len(drifted)} file(s) differ from the models; run "
                f"`python -m {GENERATOR} {root}`",
                file=sys.stderr,
            )
            return 1
        return 0
    expected = render()
    for path in write(root):
        print(f"{'wrote' if path in expected else 'removed'} {root / path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
