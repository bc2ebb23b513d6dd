"""Instructions per item of an in-process stage bench, counted by valgrind.

    python bench/instructions.py bench/runtime_record_bench.py [--n 2000] [bench args ...]
    python bench/instructions.py bench/runtime_record_bench.py --against /path/to/services

On a shared or virtual machine, CPU time moves by 10 to 30% from one run to the next
(steal, neighbours, frequency), which hides a change of a few percent. Instructions
retired do not move with the machine: this runs the bench under ``valgrind
--tool=cachegrind`` (no cache simulation) with ``--rounds 1`` and ``--rounds 3`` and
prints ``(I3 - I1) / (2 n)``, the instructions of one item without the start-up. The
bench must take ``--n`` (items per round) and an option for the number of rounds:
``--rounds`` (``runtime_record_bench.py``, ``policy_call_bench.py``) or another name
given with ``--rounds-option`` (``--repeat`` for ``executor_call_bench.py``).
``--against DIR`` counts the same bench with ``PYTHONPATH=DIR`` too (another checkout's
``services``), side by side. About 50 times slower than the bench itself.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

_REFS = re.compile(rb"I\s+refs:\s+([\d,]+)")


def instructions(bench: list[str], rounds: str, services: str | None) -> int:
    env = dict(os.environ)
    if services is not None:
        env["PYTHONPATH"] = services
    done = subprocess.run(
        [
            "valgrind",
            "--tool=cachegrind",
            "--cache-sim=no",
            "--cachegrind-out-file=/dev/null",
            sys.executable,
            *bench,
            rounds,
        ],
        env=env,
        capture_output=True,
        check=True,
    )
    found = _REFS.search(done.stderr)
    if found is None:
        raise SystemExit("valgrind printed no instruction count:\n" + done.stderr.decode()[-2000:])
    return int(found.group(1).replace(b",", b""))


def per_item(bench: list[str], n: int, option: str, services: str | None) -> float:
    one, three = (instructions(bench, f"{option}={r}", services) for r in (1, 3))
    return (three - one) / (2 * n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", help="the bench script")
    parser.add_argument("--n", type=int, default=2000, help="items per round")
    parser.add_argument("--against", help="another checkout's services directory")
    parser.add_argument("--rounds-option", default="--rounds", help="the bench's round count")
    args, rest = parser.parse_known_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    bench = [args.bench, "--n", str(args.n), *rest]
    for label, services in (("this checkout", None), (args.against, args.against)):
        if label is None:
            continue
        count = per_item(bench, args.n, args.rounds_option, services)
        print(f"{label}: {count:,.0f} instructions per item")


if __name__ == "__main__":
    main()
