"""How long `quipu` takes to answer before any work: `--help`, `config show` (its argument check),
a failing argument check, and two commands that must load their config models. Median of N runs
of each, in fresh interpreters, as a user runs them (`python -m quipu.flows.cli`, the same entry
point as the `quipu` script).

    python bench/cli_startup.py [--runs 5] [--pythonpath DIR]   # DIR: another checkout to compare

There is no anchor tool to race here: the target is the issue's 1.5 s per answer.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = [["--help"], ["config", "show"], ["curate", "--bogus"], ["deploy", "--dry-run"], ["config", "show", "curate"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pythonpath", help="import quipu from here instead (e.g. an older checkout)")
    args = ap.parse_args()
    env = {**os.environ, **({"PYTHONPATH": args.pythonpath} if args.pythonpath else {})}
    print(f"load: {os.getloadavg()[0]:.2f}")
    for cmd in COMMANDS:
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "quipu.flows.cli", *cmd], env=env, capture_output=True)
            times.append(time.perf_counter() - t0)
        print(f"quipu {' '.join(cmd):<24} median {statistics.median(times):5.2f} s  (min {min(times):.2f}, max {max(times):.2f})")


if __name__ == "__main__":
    main()
