"""`quipu benchmarks ls|check`: the benchmark registry used by the `decontam` stage.

`ls` lists the registered benchmarks (configs/benchmarks/*.yaml) and whether their files are there;
`check NAME|YAML ...` reads each file as the stage will, names a missing file or field, and shows
the items, SHA-256 and index size: how a user checks a benchmark they just declared in YAML.
"""
from __future__ import annotations

import argparse

from quipu.catalog.errors import UserError


def cmd_benchmarks_ls(args) -> int:
    from quipu.tasks.benchmarks import BenchmarkError, available, load_benchmarks, read_spec, spec_path

    names = available(args.registry)
    if not names:
        print("no benchmarks registered")
        return 0
    for name in names:
        path = spec_path(name, args.registry)
        fields = "?"
        try:
            fields = ", ".join(read_spec(path).fields)
            (bench,) = load_benchmarks([str(path)])
            state = f"{len(bench.items)} items  sha256 {bench.sha256[:12]}  {bench.file}"
        except BenchmarkError as e:
            state = f"NOT USABLE: {e}"
        print(f"  {name:<20} fields [{fields}]  {state}")
    return 0


def cmd_benchmarks_check(args) -> int:
    from quipu.tasks.benchmarks import BenchmarkError
    from quipu.tasks.decontam import DecontamConfig, get_index

    try:
        cfg = DecontamConfig(benchmarks=args.benchmarks, registry_dir=args.registry, n=args.n)
        index = get_index(cfg)
    except (BenchmarkError, ValueError) as e:
        raise UserError(str(e)) from None
    for b in index.benchmarks:
        skipped = index.skipped_fields.get(b["name"], 0)
        print(f"{b['name']}: {b['items']} items from {b['path']}\n  sha256 {b['sha256']}  fields [{', '.join(b['fields'])}]"
              + (f"  ({skipped} field values under {index.min_short} words are not matched)" if skipped else ""))
    print(f"index {index.key[:16]}: {len(index.ngram_keys):,} {index.n}-grams, {len(index.pattern_len):,} short fields, "
          f"{len(index.vocab):,} words")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("benchmarks", help="the evaluation sets the decontam stage removes")
    bsub = p.add_subparsers(dest="benchmarks_command", required=True)
    q = bsub.add_parser("ls", help="list the registered benchmarks and whether their files are usable")
    q.add_argument("--registry", help="directory of benchmark YAML files (default configs/benchmarks)")
    q.set_defaults(func=cmd_benchmarks_ls)
    q = bsub.add_parser("check", help="read benchmarks as the stage will and build their index")
    q.add_argument("benchmarks", nargs="+", help="registry names or YAML paths")
    q.add_argument("--registry", help="directory of benchmark YAML files (default configs/benchmarks)")
    q.add_argument("--n", type=int, default=13, help="n-gram length in words")
    q.set_defaults(func=cmd_benchmarks_check)
