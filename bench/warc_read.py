r"""WARC reading only: quipu's reader against plain warcio and fastwarc, same files, same run (issue 40, scope 2).

Arms, each reading every record's whole block (what the extract stage needs before parsing HTML):
- `quipu`: quipu.tasks.reading.warc.read_warc (warcio with digest checks, capped header lines,
  resynchronisation after damage, quarantine records);
- `warcio`: warcio's ArchiveIterator (arc2warc, check_digests) reading each raw block;
- `fastwarc`: fastwarc's ArchiveIterator (parse_http) reading each record's payload and checking its
  block digest (the check quipu does through warcio).
CPU seconds of this process per arm (time.process_time: the machine is shared), rounds interleaved.

Then the hostile files (../shared/data/web/bad and the truncated shared files): per file, what each
reader makes of it (records, quarantines, or the exception that ends it). fastwarc reads WARC only:
an ARC file is counted as what it returns.

    .venv/bin/python bench/warc_read.py [--crawl /tmp/quipu-crawl/pages-100000/crawl-0000.warc.gz] [--rounds 3]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT.parent / "shared" / "data" / "web"


def read_quipu(path: Path) -> tuple[int, int, int]:
    """(records, payload bytes, quarantined); records counts the non-document ones it skips too"""
    from quipu.tasks.reading.records import Quarantined, ReadStats
    from quipu.tasks.reading.warc import read_warc
    n = size = bad = 0
    stats = ReadStats()
    for item in read_warc(str(path), stats):
        if isinstance(item, Quarantined):
            bad += 1
        else:
            n += 1
            size += len(item.payload or b"")
    return n + sum(stats.skipped.values()), size, bad


def read_warcio(path: Path) -> tuple[int, int, int]:
    from warcio.archiveiterator import ArchiveIterator
    n = size = 0
    with open(path, "rb") as fh:
        for record in ArchiveIterator(fh, arc2warc=True, check_digests=True):
            n += 1
            size += len(record.raw_stream.read())     # content_stream() fails on brotli (warcio 1.7)
    return n, size, 0


def read_fastwarc(path: Path) -> tuple[int, int, int]:
    from fastwarc.warc import ArchiveIterator
    n = size = bad = 0
    for record in ArchiveIterator(str(path), parse_http=True, fsspec_args=False):
        n += 1
        bad += not record.verify_block_digest(consume=False) and record.headers.get("WARC-Block-Digest") is not None
        size += len(record.reader.read())
    return n, size, bad


ARMS = {"quipu": read_quipu, "warcio": read_warcio, "fastwarc": read_fastwarc}


def outcome(fn, path: Path) -> str:
    try:
        n, _, bad = fn(path)
        return f"{n} records" + (f", {bad} quarantined" if bad and fn is read_quipu else f", {bad} bad digests" if bad else "")
    except Exception as e:
        said = " ".join(str(e).split()).encode("ascii", "backslashreplace").decode().replace("|", "/")
        return f"raises {type(e).__name__}: {said[:48]}"


def hostile_table() -> None:
    bad = sorted(f for f in (WEB / "bad").iterdir() if f.name != "PROVENANCE.md") + sorted(WEB.glob("*truncated*"))
    print("\n| hostile file | quipu | warcio | fastwarc |\n|---|---|---|---|")
    for f in bad:
        print(f"| {f.name} | " + " | ".join(outcome(fn, f) for fn in ARMS.values()) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--crawl", type=Path, action="append", default=[], help="more WARC files (e.g. bench/crawl_cost.py's)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    shared = sorted(f for f in WEB.iterdir() if f.is_file() and (f.name.endswith(".warc.gz") or f.name.endswith(".warc")))
    shared.append(WEB / "constructed" / "article-extraction-benchmark-shared.warc.gz")
    sets = {"shared WARC files": shared} | {f.name: [f] for f in args.crawl}
    print(f"`uptime` at the start: `{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}`\n")
    print("| files | arm | records | MB of blocks | CPU s per round (min / max) | records per core-second (best) | vs warcio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, files in sets.items():
        cpu = {a: [] for a in ARMS}
        counts = {}
        for _ in range(args.rounds):
            for arm, fn in ARMS.items():
                t0 = time.process_time()
                res = [fn(f) for f in files]
                cpu[arm].append(time.process_time() - t0)
                counts[arm] = (sum(r[0] for r in res), sum(r[1] for r in res))
        for arm in ARMS:
            n, size = counts[arm]
            best = min(cpu[arm])
            print(f"| {label} | {arm} | {n:,} | {size / 1e6:,.1f} | {best:.3f} / {max(cpu[arm]):.3f} | {n / best:,.0f} | "
                  f"{min(cpu['warcio']) / best:.2f}x |", flush=True)
    hostile_table()
    print(f"\n`uptime` at the end: `{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}`")


if __name__ == "__main__":
    main()
