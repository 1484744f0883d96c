"""Each test file's time from pytest's ``--durations=0`` report -> ``tests/durations.json`` (tests/conftest.py starts
the longest files first, so that two pytest-xdist workers end together).

A file's time is the sum of its tests' setup, call and teardown, as the report lists them; the JSON maps each file's
name to its seconds, rounded to 0.1 s, longest first. pytest leaves rows under 0.005 s out of the report unless it
runs with ``-vv`` or ``--durations-min=0``; this script counts every row it gets and says how many pytest left out.

    make test TEST_S3=rgw DURATIONS_LOG=/tmp/durations.log   # pytest's output, its report included
    python scripts/test_durations.py /tmp/durations.log      # -> tests/durations.json
    python -m pytest --durations=0 -vv tests/test_docs.py | python scripts/test_durations.py --out -
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "durations.json"
HEADER = re.compile(r"^=+ slowest (?:\d+ )?durations =+$")
ROW = re.compile(r"^(?P<seconds>\d+(?:\.\d+)?)s (?P<when>setup|call|teardown)\s+(?P<nodeid>\S.*)$")
HIDDEN = re.compile(r"^\(\d+ durations < \S+ hidden\.")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def file_seconds(lines: Iterable[str]) -> tuple[dict[str, float], int]:
    """``({test file name: seconds}, rows hidden)`` from pytest's output: the rows of every "slowest durations"
    section summed per file (a row's node id up to ``::``, its file name without folders)."""
    totals: dict[str, float] = defaultdict(float)
    hidden = 0
    in_report = False
    for raw in lines:
        line = ANSI.sub("", raw).rstrip()
        if HEADER.match(line):
            in_report = True
            continue
        if not in_report:
            continue
        row = ROW.match(line)
        if row:
            totals[Path(row["nodeid"].split("::", 1)[0]).name] += float(row["seconds"])
        elif HIDDEN.match(line):
            hidden += int(line[1:].split()[0])
        elif line:
            in_report = False  # the summary line after the report
    return dict(totals), hidden


def ranked(totals: dict[str, float]) -> dict[str, float]:
    """The files, longest first (ties by name), each rounded to 0.1 s."""
    rounded = {name: round(seconds, 1) for name, seconds in totals.items()}
    return dict(sorted(rounded.items(), key=lambda kv: (-kv[1], kv[0])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", default="-", help="pytest's output with --durations=0 (default: stdin)")
    parser.add_argument("--out", default=str(OUT), help=f"the JSON to write, '-' for stdout (default: {OUT})")
    args = parser.parse_args(argv)
    if args.log == "-":
        totals, hidden = file_seconds(sys.stdin)
    else:
        with open(args.log, encoding="utf-8", errors="replace") as fh:
            totals, hidden = file_seconds(fh)
    if not totals:
        print(
            f"test_durations: {args.log} holds no 'slowest durations' report; run pytest with --durations=0 -vv",
            file=sys.stderr,
        )
        return 1
    if hidden:
        print(
            f"test_durations: pytest hid {hidden} durations under its minimum, left out of the totals "
            "(run it with -vv or --durations-min=0 to count them)",
            file=sys.stderr,
        )
    text = json.dumps(ranked(totals), indent=2) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
        print(f"test_durations: {len(totals)} test files, {sum(totals.values()):.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
