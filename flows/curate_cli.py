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
    # Everything that can be wrong before any work is checked here, before Prefect starts:
    # the inputs, the models the enabled stages need, the output folder.
    files = checked_inputs(config.input)
    from quipu.flows.curate import NOT_IDENTITY, owned_entries, preflight
    try:  # models the enabled stages need: a missing or corrupt file is named before any work
        preflight(config)
    except UserError:
        raise
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    from quipu.catalog.ownership import check_free, check_identity, identity, refuse_output_among_inputs
    run_dir = Path(config.output).resolve()
    refuse_output_among_inputs(run_dir, config.input, files)
    check_free(run_dir)   # a file, an unwritable folder, another live run into this output
    if not args.overwrite:
        check_identity(run_dir, identity(files, config.model_dump(mode="json"), NOT_IDENTITY), owned_entries())
    return run_curate(config, overwrite=args.overwrite, allow_empty=args.allow_empty)


def checked_inputs(patterns: list[str]) -> list[str]:
    """The input files, or a one-line error: a pattern that matches nothing, or only files no
    reader takes (those would each be quarantined and the run would curate nothing)."""
    from quipu.tasks.readers import SUPPORTED, expand_inputs, reader_kind
    try:
        files = expand_inputs(patterns)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    if not any(reader_kind(f) for f in files):
        shown = ", ".join(Path(f).name for f in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise UserError(f"no supported input files: {len(files)} matched ({shown}), none of them "
                        f"{', '.join(SUPPORTED)}")
    return files


def run_curate(config, overwrite: bool = False, allow_empty: bool = False) -> int:
    from quipu.flows.curate import curate
    from quipu.flows.reports import format_funnel
    from quipu.flows.runners import make_task_runner

    summary = curate.with_options(task_runner=make_task_runner(config.runner, config.workers))(config, overwrite)
    print()
    print(format_funnel(summary))
    print()
    print(f"curated shards: {summary['output']}/curated   reports: {summary['output']}/<stage>/report.json")
    print(f"removed documents: {summary['output']}/<stage>/removed   quarantine: {summary['output']}/quarantine")
    print(f"report page: quipu report {summary['output']} --html")
    if summary["curated"]["rows"] == 0 and not allow_empty:
        raise EmptyRun(f"the run curated 0 documents ({summary['records_read']} records read, "
                       f"{summary['quarantined']} quarantined; the funnel above says where they went); "
                       "pass --allow-empty if that is expected")
    return 0


class EmptyRun(UserError):
    """A run that finished but curated nothing: almost always wrong inputs or filters."""
    exit_code = 3


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
    if args.json:
        import json
        from quipu.flows.html_report import load_reports
        print(json.dumps({"run": run, "reports": load_reports(run_dir, run)}, indent=1, default=str))
        return 0
    if args.html is not None:
        from quipu.flows.html_report import write_html_report
        path = write_html_report(run_dir, run, args.html or None)
        print(f"wrote {path} (one self-contained page: open it in a browser)")
        return 0
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
    p.add_argument("--allow-empty", action="store_true",
                   help="exit 0 even if no document is curated (otherwise such a run exits 3)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace what an earlier run with other inputs or config wrote into the output directory "
                        "(without it such a run is refused; the same inputs and config resume)")
    p.set_defaults(func=cmd_curate)

    p = sub.add_parser("report", help="print a run's funnel and top removal reasons")
    p.add_argument("run", nargs="?", help="run directory")
    p.add_argument("--latest", action="store_true", help="the newest curate run in the catalog")
    p.add_argument("--diff", nargs=2, metavar=("RUN_A", "RUN_B"), help="compare two runs stage by stage (run dirs or ids)")
    p.add_argument("--top", type=int, default=5, help="reasons per stage")
    p.add_argument("--html", nargs="?", const="", metavar="FILE",
                   help="write a self-contained HTML report with charts (default RUN/report.html)")
    p.add_argument("--json", action="store_true", help="print run.json and every stage report as one JSON object")
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
