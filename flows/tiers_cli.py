"""`quipu tiers fit INPUT... --output TABLES.json`: fit the quality-tier tables (tasks/tiers.py) on
the documents of a curate run (what reached its `tiers` stage: the curated shards and the stage's
removed rows) or on parquet files, for every judge whose score they carry."""
from __future__ import annotations

import argparse
import glob
from pathlib import Path

from quipu.catalog.errors import UserError

DIRECTIONS = {"higher": True, "lower": False}


def parse_judges(specs: list[str]) -> dict[str, bool]:
    """`--judge COLUMN[:higher|lower]` values as {column: higher_is_better}; a known column's
    direction is implied (tasks.tiers.KNOWN_JUDGES)."""
    from quipu.tasks.tiers import KNOWN_JUDGES
    out: dict[str, bool] = {}
    for spec in specs:
        col, _, direction = spec.partition(":")
        if direction:
            if direction not in DIRECTIONS:
                raise UserError(f"--judge {spec}: the direction after ':' is 'higher' or 'lower' (which scores are better)")
            out[col] = DIRECTIONS[direction]
        elif col in KNOWN_JUDGES:
            out[col] = KNOWN_JUDGES[col]
        else:
            raise UserError(f"--judge {spec}: say whether higher or lower is better ({col}:higher or {col}:lower)")
    return out


def input_files(inputs: list[str]) -> list[Path]:
    """Parquet files of the inputs: a curate run folder gives its curated shards and the tiers stage's
    removed rows; a file or glob gives itself."""
    from quipu.flows.reports import load_run
    files: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir() and (p / "run.json").is_file():
            files += [Path(s) for s in load_run(p).get("curated", {}).get("shards", [])]
            files += sorted((p / "tiers" / "removed").glob("*.parquet"))
        elif p.is_dir():
            files += sorted(p.rglob("*.parquet"))
        else:
            matched = sorted(Path(m) for m in glob.glob(item))
            if not matched:
                raise UserError(f"{item}: no such file, glob match or curate run folder")
            files += matched
    if not files:
        raise UserError(f"no parquet files in {', '.join(inputs)}")
    return files


def batches(files: list[Path], judges: dict[str, bool], batch_rows: int = 4096):
    import pyarrow as pa
    import pyarrow.parquet as pq
    for f in files:
        pf = pq.ParquetFile(f)
        cols = [c for c in ("id", "text", "lang", *judges) if c in pf.schema_arrow.names]
        if "id" not in cols or "text" not in cols:
            raise UserError(f"{f}: no id/text columns (not curated documents)")
        for rb in pf.iter_batches(batch_size=batch_rows, columns=cols):
            yield pa.Table.from_batches([rb])


def cmd_tiers_fit(args) -> int:
    from quipu.catalog.files import sha256_file
    from quipu.tasks.tiers import KNOWN_JUDGES, fit_tables
    files = input_files(args.inputs)
    judges = parse_judges(args.judge) if args.judge else dict(KNOWN_JUDGES)
    provenance = {"command": "quipu tiers fit " + " ".join(args.inputs) + "".join(f" --judge {j}" for j in args.judge)
                             + f" --max-docs {args.max_docs} --min-docs {args.min_docs}",
                  "inputs": [{"file": f.name, "sha256": sha256_file(f)} for f in files]}
    try:
        tables = fit_tables(batches(files, judges), judges, args.max_docs, args.min_docs, provenance)
    except ValueError as e:
        raise UserError(str(e)) from None
    tables.save(args.output)
    print(f"tables: {args.output}")
    for judge, spec in sorted(tables.judges.items()):
        langs = ", ".join(f"{lang} {t['docs']} docs" for lang, t in sorted(spec["languages"].items()))
        print(f"  {judge} ({'higher' if spec['higher_is_better'] else 'lower'} is better): {langs}")
    if not tables.judges:
        raise UserError(f"no judge has {args.min_docs} scored documents in any language; lower --min-docs or fit on more")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tiers", help="quality tiers: fit the per-language percentile tables of the judges")
    tsub = p.add_subparsers(dest="tiers_command", required=True)
    f = tsub.add_parser("fit", help="fit token-weighted percentile tables per judge and language")
    f.add_argument("inputs", nargs="+", help="curate run folders, parquet files or globs")
    f.add_argument("--output", required=True, help="tables file to write (JSON; `tiers.tables` in the curate config)")
    f.add_argument("--judge", action="append", default=[], metavar="COLUMN[:higher|lower]",
                   help="a judge column (repeatable; default: every known judge the documents carry)")
    f.add_argument("--max-docs", type=int, default=20000, help="documents sampled per language (by id hash)")
    f.add_argument("--min-docs", type=int, default=50, help="fewest scored documents for a language's table")
    f.set_defaults(func=cmd_tiers_fit)
