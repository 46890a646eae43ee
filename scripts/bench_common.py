"""Helpers the benchmark reports share (scripts/bench_report.py, scripts/bench_parallel.py,
scripts/bench_families.py)."""

import datetime
import json
import os
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


def record(script, cpu, simd, flags, bandwidth, load_before, load_after, **fields):
    """The fields every speed record starts with (docs/bench/README.md), then `fields`."""
    # Changes to the JSONL files themselves do not make a run's tree dirty.
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/bench/*.jsonl")
    line = {
        "schema": 1,
        "script": script,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "cpu": {"model": cpu, "cores": os.cpu_count(), "simd": simd, "flags": flags},
    }
    isa = fields.pop("isa", None)
    if isa is not None:
        line["isa"] = isa
    line.update({
        "kernels": os.environ.get("BERTH_KERNELS", "best"),
        "read_bandwidth_gb_per_s": {str(t): bandwidth[t] for t in sorted(bandwidth)},
        "load_before": [float(x) for x in load_before.split()],
        "load_after": [float(x) for x in load_after.split()],
    })
    line.update(fields)
    return line


def append_record(path, line):
    """Appends `line` to the JSONL file at `path` and says so."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, separators=(",", ":")) + "\n")
    print(f"\nappended this run to {path}")
