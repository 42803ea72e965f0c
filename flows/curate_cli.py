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
    from quipu.tasks.reading import expand_inputs

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
    from quipu.tasks.reading import SUPPORTED, expand_inputs, reader_kind
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
        from quipu.flows.reports import resolve_run_dir
        run_dir = resolve_run_dir(run_dir)
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
        name, _, version = args.run.partition("@")
        ds = registry.get_dataset(name)
        if ds is None:
            raise UserError(f"no run or dataset named {args.run!r} in the catalog (quipu catalog ls)")
        from quipu.catalog.versions import version_lineage
        ds["versions"] = version_lineage(ds["name"], ds["kind"])   # every version: its run and that run's inputs
        if version:
            ds["versions"] = [v for v in ds["versions"] if str(v["version"]) == version.lstrip("v")]
        print(json.dumps(ds, indent=2, default=str) if args.json else format_dataset(ds))
        return 0
    run["config"] = json.loads(run["config"] or "{}")
    run["summary"] = json.loads(run["summary"]) if run.get("summary") else None
    run["lineage"] = registry.get_lineage(run["id"])
    run["reports"] = sorted(registry.get_reports(run["id"]))
    print(json.dumps(run, indent=2, default=str) if args.json else format_run(run))
    return 0


def _short(paths: list[str], n: int = 3) -> str:
    return ", ".join(paths[:n]) + (f" and {len(paths) - n} more" if len(paths) > n else "")


def format_run(run: dict) -> str:
    """`quipu catalog show RUN`: what the run was, what it read and wrote, its result in a few lines."""
    took = f" ({(run['ended'] - run['started']).total_seconds():.0f} s)" if run.get("ended") and run.get("started") else ""
    lines = [f"run {run['id']}: {run['flow']}, {run['status']}, started {run['started']:%Y-%m-%d %H:%M:%S}{took}",
             f"  output:   {run.get('output') or '-'}"]
    inputs = [r["path"] for r in run["lineage"] if r["direction"] == "input"]
    outputs = [r["path"] for r in run["lineage"] if r["direction"] == "output"]
    if inputs:
        lines.append(f"  inputs:   {len(inputs)}: {_short(inputs)}")
    if outputs:
        lines.append(f"  outputs:  {_short(outputs)}")
    summary = run.get("summary") or {}
    cfg = run.get("config") or {}
    if run["flow"] == "curate":
        stages = [k for k, v in cfg.items() if isinstance(v, dict) and v.get("enabled")]
        lines.append(f"  dataset:  {cfg.get('dataset') or '(the output folder name)'}   stages on: {', '.join(stages)}")
        if summary:
            lines.append(f"  result:   {summary.get('records_read', 0):,} records read, {summary.get('quarantined', 0):,} "
                         f"quarantined, {(summary.get('curated') or {}).get('rows', 0):,} documents curated")
            for st in summary.get("stages", []):
                lines.append(f"    {st['name']:<14}{st['input_docs']:>10,} in {st['kept_docs']:>10,} kept "
                             f"{st['removed_docs']:>9,} removed")
    elif summary:
        shown = {k: summary[k] for k in ("step", "final_loss", "eval_loss", "params", "versions", "checkpoint")
                 if summary.get(k) is not None}
        lines += [f"  {k + ':':<9} {v}" for k, v in shown.items()]
    if run.get("reports"):
        lines.append(f"  reports:  {', '.join(run['reports'])} (quipu report {run['id']})")
    lines.append(f"  all of it: quipu catalog show {run['id']} --json")
    return "\n".join(lines)


def format_dataset(ds: dict) -> str:
    """`quipu catalog show DATASET`: one line per version with its documents, tokens, run and inputs."""
    lines = [f"dataset {ds['name']} ({ds['kind']}): {len(ds['versions'])} version(s)"]
    for v in ds["versions"]:
        tokens = "-" if v.get("tokens") is None else f"{v['tokens']:,}"
        lines.append(f"  v{v['version'] or '?':<4} {v['documents'] or 0:>10,} docs {tokens:>13} tokens  "
                     f"{v['created']:%Y-%m-%d %H:%M}  run {v['run_id'] or '-'}")
        lines.append(f"        {len(v['shards'])} shards in {v['path']}; inputs: {_short(v['inputs']) or '-'}")
    if not ds["versions"]:   # not a versioned dataset: its own shards
        lines.append(f"  {len(ds.get('shards') or [])} shards in {ds['path']}")
    lines.append(f"  all of it: quipu catalog show {ds['name']} --json")
    return "\n".join(lines)


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
    p.add_argument("run", nargs="?", help="run directory, run id, dataset name or dataset@version")
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
    q = csub.add_parser("show", help="one run (status, inputs, outputs, result) or dataset (versions)")
    q.add_argument("run", help="run id, run directory, dataset name or dataset@version")
    q.add_argument("--json", action="store_true", help="everything the catalog holds about it, as JSON")
    q.set_defaults(func=cmd_catalog_show)
