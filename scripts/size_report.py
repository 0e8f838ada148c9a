#!/usr/bin/env python3
"""Lists source files over 1,000 lines and production functions over 70 lines (house style: files of one
concern, functions that fit on a screen).

An entry may stay over its limit when the code says why: a comment `size: <reason>` on one of the three lines
above a function (or inside its first line), or anywhere in a file's first 40 lines for the file. The report
prints every entry with its reason; with --check it exits 1 if any entry has none (`make lint` runs it so).

Function lengths are lizard's (first line to last line, comments included), for C++ and Python.

  python3 scripts/size_report.py [--check] [--file-lines N] [--function-lines N] [PATH ...]
"""
import argparse
import os
import re
import subprocess
import sys

import lizard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_EXTENSIONS = (".cc", ".h", ".cpp", ".hpp", ".c", ".py", ".sh")
FUNCTION_EXTENSIONS = (".cc", ".h", ".cpp", ".hpp", ".c", ".py")
# Functions are checked in production code; tests and fuzz targets are checked only for file size (a Catch2
# TEST_CASE is one long function by design: its sections share set-up).
NOT_PRODUCTION = ("tests/unit/", "fuzz/", "tests/integration/test_")
REASON = re.compile(r"(?:#|//)\s*size:\s*(\S.*)$")


def tracked_files(paths):
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "--cached", "--others", "--exclude-standard", *paths],
                         check=True, capture_output=True, text=True).stdout
    return sorted(p for p in out.splitlines() if p.endswith(SOURCE_EXTENSIONS) and os.path.isfile(os.path.join(ROOT, p)))


def reason_in(lines, first, last):
    """The `size:` reason on lines [first, last] (1-based, clamped), or None."""
    for i in range(max(first, 1), min(last, len(lines)) + 1):
        m = REASON.search(lines[i - 1])
        if m:
            return m.group(1).strip()
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if an entry over its limit gives no reason")
    ap.add_argument("--file-lines", type=int, default=1000)
    ap.add_argument("--function-lines", type=int, default=70)
    ap.add_argument("paths", nargs="*", help="limit the report to these paths (default: the whole repository)")
    args = ap.parse_args()

    big_files, long_functions = [], []
    for path in tracked_files(args.paths):
        with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
        if len(lines) > args.file_lines:
            big_files.append((len(lines), path, reason_in(lines, 1, 40)))
        if not path.endswith(FUNCTION_EXTENSIONS) or path.startswith(NOT_PRODUCTION):
            continue
        for fn in lizard.analyze_file(os.path.join(ROOT, path)).function_list:
            length = fn.end_line - fn.start_line + 1
            if length > args.function_lines:
                long_functions.append((length, path, fn.start_line, fn.name,
                                       reason_in(lines, fn.start_line - 3, fn.start_line)))

    unexplained = 0
    print(f"files over {args.file_lines} lines: {len(big_files)}")
    for n, path, why in sorted(big_files, reverse=True):
        unexplained += why is None
        print(f"  {n:5d}  {path}" + (f"  -- {why}" if why else ""))
    print(f"functions over {args.function_lines} lines: {len(long_functions)}")
    for n, path, line, name, why in sorted(long_functions, reverse=True):
        unexplained += why is None
        print(f"  {n:5d}  {path}:{line}  {name}" + (f"  -- {why}" if why else ""))
    if args.check and unexplained:
        print(f"size_report: {unexplained} entries over their limit without a `size:` reason", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
