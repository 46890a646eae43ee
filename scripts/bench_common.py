"""Helpers the benchmark reports share (scripts/bench_report.py, scripts/bench_parallel.py)."""

import subprocess


def git(*args):
    """Output of a git command in the repository, or None outside one."""
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def table(head, rows):
    """Prints rows of strings under a header, in left-aligned columns."""
    w = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("   ".join(c.ljust(w[i]) for i, c in enumerate(r)).rstrip())
