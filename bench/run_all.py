"""`make bench`: run every benchmark in turn (each prints its anchor, ours and the ratio).

Each script also documents its own options; results go to bench/RESULTS.md by hand, with the command.
Needs ../shared/data (the benchmarks compare on real documents).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    ["curate_throughput.py", "--per-file", "100"],
    ["quality_throughput.py"],
    ["dedup_throughput.py", "--docs", "2000"],
    ["decontam_throughput.py"],
    ["train_throughput.py", "--rounds", "4", "--steps", "3", "--threads", "2"],
    ["ppl_distill.py"],
    ["pdf_extraction.py", "--scan-docs", "2"],
]


def main() -> int:
    failed = []
    for script, *args in BENCHMARKS:
        print(f"=== {script} {' '.join(args)}", flush=True)
        rc = subprocess.call([sys.executable, str(HERE / script), *args], cwd=HERE.parent)
        if rc:
            failed.append(script)
    if failed:
        print("failed:", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
