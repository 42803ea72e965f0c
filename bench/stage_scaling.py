"""Do the per-shard stages scale with worker processes? The langid + heuristics segment (fused, as
`quipu curate` runs it) over the same extract shards, in a process pool of 1 worker and of N, with
no Prefect: the stage's own scaling, apart from the orchestration a flow adds (task states, the
Prefect server, the flow's reports), which on a 2-core machine competes with the workers for the
cores (see "Curation throughput" in bench/RESULTS.md).

Documents: the same sample as bench/curate_throughput.py (the first `--per-file` documents of every
../shared/data/text file), extracted once into shards of `--shard-mb`. Each pool is a fresh
`spawn` pool whose start-up (imports, the fastText model and spaCy tokenisers loaded on each
worker's first shard) is inside the timed run. Both runs must keep the same documents.

    .venv/bin/python bench/stage_scaling.py [--per-file 1200] [--shard-mb 2] [--workers 1,2]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def run_pool(workers: int, shards, run_dir: Path) -> tuple[float, list[str], float]:
    """(wall seconds, kept ids in shard order, summed per-shard seconds) of the segment on a pool."""
    import pyarrow.parquet as pq

    from quipu.tasks import driver
    from quipu.tasks.heuristics import HeuristicFilters, HeuristicsConfig
    from quipu.tasks.langid import LangIdConfig, LanguageId
    from quipu.tasks.stage import RunContext
    ctx = RunContext(str(run_dir.resolve()))
    refs = [driver.StageRef(LanguageId, LangIdConfig(), ctx), driver.StageRef(HeuristicFilters, HeuristicsConfig(), ctx)]
    (segment,) = driver.segments(refs, fuse=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        results = list(pool.map(driver.process_one, [segment] * len(shards), shards, [[None, None]] * len(shards)))
    seconds = time.perf_counter() - t0
    kept = [i for rs in results for i in pq.read_table(rs[-1].kept.path, columns=["id"]).column(0).to_pylist()]
    return seconds, kept, sum(r.seconds for rs in results for r in rs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-file", type=int, default=1200)
    ap.add_argument("--shard-mb", type=float, default=2.0)
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    from curate_throughput import make_inputs

    from quipu.tasks.extract import ExtractConfig, extract_unit
    work = Path(tempfile.mkdtemp(prefix="quipu-bench-scaling-"))
    os.environ.setdefault("QUIPU_HOME", str(work / "home"))
    n = make_inputs(work / "inputs", args.per_file)
    ex = extract_unit(sorted(str(p) for p in (work / "inputs").iterdir()), work / "extract",
                      ExtractConfig(shard_mb=args.shard_mb, fix_unicode=False))
    shards = [s for s in ex.kept_shards if s.rows]
    print(f"{n:,} documents in {len(shards)} shards of ~{args.shard_mb:g} MB; {os.cpu_count()} cores; "
          f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    rows = {}
    for w in [int(x) for x in args.workers.split(",")]:
        seconds, kept, summed = run_pool(w, shards, work / f"run-{w}")
        rows[w] = (seconds, kept)
        print(f"workers {w}: {seconds:.1f} s wall, {n / seconds:,.0f} docs/s, {len(kept):,} kept, "
              f"per-shard seconds summed {summed:.1f}", flush=True)
    base = rows[min(rows)]
    for w, (seconds, kept) in sorted(rows.items()):
        print(f"workers {w} / {min(rows)}: speed-up {base[0] / seconds:.2f}x; same kept ids: {kept == base[1]}")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")


if __name__ == "__main__":
    main()
