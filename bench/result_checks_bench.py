"""What the result rules cost the validator per result, beside strict mode.

    python bench/result_checks_bench.py [--n 2000]

In-process, no I/O: ``ResultChecker.check`` (limits, coercion, schema + allowlist,
sanitization) on a 2.4 KB plain-prose result for each tool of
``tests.support.hostile_results``, then once on a 1 MB string of prose sprinkled with
HTML and SQL metacharacters (so every detector runs) under ``escape`` and ``reject``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import hostile_results as hostile

from toolfleet.errors import ToolfleetError
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.results.checks import ResultChecker
from toolfleet.sdk import spec_of

PLAIN: dict[str, Any] = {
    "title": "Quarterly report",
    "body": "The quick brown fox jumps over the lazy dog. " * 40,
    "count": 3,
    "ok": True,
    "tags": ["a", "b", "c"],
    "nested": {"rows": [{"k": i, "v": f"value {i}"} for i in range(20)]},
}
HOSTILE_MB = {"body": "O'Brien <b>said</b>: fine; " * 36_000 + "<script>x</script>"}


def per_result_us(checker: ResultChecker, mode: str, n: int) -> float:
    manifest = spec_of(getattr(hostile, f"report_{mode}")).manifest()
    checker.check(manifest, PLAIN)
    started = time.perf_counter()
    for _ in range(n):
        checker.check(manifest, PLAIN)
    return (time.perf_counter() - started) / n * 1e6


def once_s(checker: ResultChecker, mode: str) -> tuple[float, str]:
    manifest = spec_of(getattr(hostile, f"report_{mode}")).manifest()
    started = time.perf_counter()
    try:
        checker.check(manifest, HOSTILE_MB)
        what = "ok"
    except ToolfleetError as exc:
        what = exc.code.value
    return time.perf_counter() - started, what


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    checker = ResultChecker(CompiledSchemas())
    for mode in ("strict", "escape", "redact", "reject", "mixed"):
        print(f"{mode:>7}: {per_result_us(checker, mode, args.n):7.0f} µs per 2.4 KB result")
    size = len(HOSTILE_MB["body"])
    for mode in ("escape", "reject"):
        seconds, what = once_s(checker, mode)
        print(f"{mode:>7}: {seconds:7.2f} s for a {size / 1e6:.1f} MB hostile string ({what})")


if __name__ == "__main__":
    main()
