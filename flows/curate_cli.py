"""Commands `quipu curate`, `quipu report` and `quipu catalog`."""
from __future__ import annotations

import argparse
from pathlib import Path

from quipu.catalog.errors import UserError
from quipu.flows.config import add_config_args


# ---- curate -----------------------------------------------------------------------------------

def cmd_curate(args) -> int:
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.tasks.readers import expand_inputs

    overrides = list(args.overrides)
    config = load_config(CurateConfig, args.config, overrides)
    if args.input:
        config = config.model_copy(update={"input": args.input})
    if args.output:
        config = config.model_copy(update={"output": args.output})
    config = CurateConfig.model_validate(config.model_dump())
    if not config.input:
        raise UserError("no input: give --input PATH/GLOB or set `input` in the config")
    try:
        expand_inputs(config.input)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    from quipu.flows.curate import preflight
    try:  # models the enabled stages need: a missing or corrupt file is named before any work
        preflight(config)
    except UserError:
        raise
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    from quipu.catalog.ownership import check_free
    check_free(Path(config.output).resolve())   # another live run into this output: say so before Prefect starts
    return run_curate(config, overwrite=args.overwrite)


def run_curate(config, overwrite: bool = False) -> int:
    from quipu.flows.curate import curate
    from quipu.flows.reports import format_funnel
    from quipu.flows.runners import make_task_runner

    summary = curate.with_options(task_runner=make_task_runner(config.runner, config.workers))(config, overwrite)
    print()
    print(format_funnel(summary))
    print()
    print(f"curated shards: {summary['output']}/curated   reports: {summary['output']}/<stage>/report.json")
    print(f"removed documents: {summary['output']}/<stage>/removed   quarantine: {summary['output']}/quarantine")
    return 0


# ---- report -----------------------------------------------------------------------------------

def cmd_report(args) -> int:
    from quipu.flows.reports import format_funnel, load_run

    if args.diff:
        from quipu.flows.reports import diff_runs, resolve_run_dir
        try:
            print(diff_runs(load_run(resolve_run_dir(args.diff[0])), load_run(resolve_run_dir(args.diff[1]))))
        except FileNotFoundError as e:
            raise UserError(str(e)) from None
        return 0
    run_dir = args.run
    if args.latest or not run_dir:
        from quipu.catalog import registry
        run = registry.latest_run("curate", status=None)
        if run is None:
            raise UserError("no curate run in the catalog yet")
        run_dir = run["output"]
    try:
        run = load_run(run_dir)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    print(format_funnel(run, top=args.top))
    return 0


# ---- catalog ----------------------------------------------------------------------------------

def cmd_catalog_ls(args) -> int:
    from quipu.catalog import registry

    what = args.what
    if what in ("all", "runs"):
        print("RUNS")
        for r in registry.list_runs(args.limit):
            print(f"  {r['id']:<40} {r['flow']:<16} {r['status']:<10} {r['started']:%Y-%m-%d %H:%M}  {r['output'] or ''}")
    if what in ("all", "datasets"):
        from quipu.catalog.versions import format_datasets
        print("DATASETS")
        print(format_datasets())   # a curated dataset: one line per version (documents, tokens, run)
    if what in ("all", "models"):
        print("MODELS")
        for m in registry.list_models():
            print(f"  {m['name']:<32} {m['kind']:<18} {m['created']:%Y-%m-%d %H:%M}  {m['path']}")
    return 0


def cmd_catalog_show(args) -> int:
    import json

    from quipu.catalog import registry

    run = registry.get_run(args.run)
    if run is None:
        ds = registry.get_dataset(args.run)
        if ds is None:
            raise UserError(f"no run or dataset named {args.run!r} in the catalog")
        from quipu.catalog.versions import version_lineage
        ds["versions"] = version_lineage(ds["name"], ds["kind"])   # every version: its run and that run's inputs
        print(json.dumps(ds, indent=2, default=str))
        return 0
    run["config"] = json.loads(run["config"] or "{}")
    run["summary"] = json.loads(run["summary"]) if run.get("summary") else None
    run["lineage"] = registry.get_lineage(run["id"])
    run["reports"] = sorted(registry.get_reports(run["id"]))
    print(json.dumps(run, indent=2, default=str))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("curate", help="run the curation flow")
    add_config_args(p)
    p.add_argument("--input", action="append", help="input path, glob or URL (repeatable; replaces the config's input)")
    p.add_argument("--output", help="run directory (replaces the config's output)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what an earlier run with other inputs or config wrote into the output directory "
                        "(without it such a run is refused; the same inputs and config resume)")
    p.set_defaults(func=cmd_curate)

    p = sub.add_parser("report", help="print a run's funnel and top removal reasons")
    p.add_argument("run", nargs="?", help="run directory")
    p.add_argument("--latest", action="store_true", help="the newest curate run in the catalog")
    p.add_argument("--diff", nargs=2, metavar=("RUN_A", "RUN_B"), help="compare two runs stage by stage (run dirs or ids)")
    p.add_argument("--top", type=int, default=5, help="reasons per stage")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("catalog", help="runs, datasets, shards and models registered so far")
    csub = p.add_subparsers(dest="catalog_command", required=True)
    q = csub.add_parser("ls", help="list runs, datasets and models")
    q.add_argument("what", nargs="?", default="all", choices=["all", "runs", "datasets", "models"])
    q.add_argument("--limit", type=int, default=50)
    q.set_defaults(func=cmd_catalog_ls)
    q = csub.add_parser("show", help="one run (config, status, lineage) or dataset (shards)")
    q.add_argument("run", help="run id, run directory or dataset name")
    q.set_defaults(func=cmd_catalog_show)
