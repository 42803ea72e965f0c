"""The `quipu` command line.

Each command parses its arguments, validates its config before any work starts (a config error is
one message naming the key, exit code 2, no traceback), then runs the Prefect flow. Without
`PREFECT_API_URL` flows run on Prefect's ephemeral local API (SQLite): nothing to start by hand.
"""
from __future__ import annotations

import argparse
import errno
import os
import sys
from pathlib import Path
from typing import Callable

# Set before Prefect is imported (see ../shared/ENVIRONMENT.md): the ephemeral API needs more than
# the default 20 s to start on two cores, and telemetry has no network to reach.
PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_LOGGING_TO_API_BATCH_INTERVAL": "0.5",
}


def prefect_env() -> None:
    for k, v in PREFECT_DEFAULTS.items():
        os.environ.setdefault(k, v)


WRITE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM}


class UserError(Exception):
    """An error the user can fix; printed as one line."""


def add_config_args(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    if config_required:
        p.add_argument("config", help="YAML config file")
    else:
        p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (dotted key, YAML value); repeatable")


# ---- curate -----------------------------------------------------------------------------------

def cmd_curate(args) -> int:
    from flows.config import load_config
    from flows.curate import CurateConfig
    from tasks.readers import expand_inputs

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
    from flows.curate import preflight
    try:  # models the enabled stages need: a missing or corrupt file is named before any work
        preflight(config)
    except (ValueError, OSError) as e:
        raise UserError(str(e)) from None
    from catalog.ownership import check_free
    check_free(Path(config.output).resolve())   # another live run into this output: say so before Prefect starts
    return run_curate(config, overwrite=args.overwrite)


def run_curate(config, overwrite: bool = False) -> int:
    from flows.curate import curate
    from flows.reports import format_funnel
    from flows.runners import make_task_runner

    summary = curate.with_options(task_runner=make_task_runner(config.runner, config.workers))(config, overwrite)
    print()
    print(format_funnel(summary))
    print()
    print(f"curated shards: {summary['output']}/curated   reports: {summary['output']}/<stage>/report.json")
    print(f"removed documents: {summary['output']}/<stage>/removed   quarantine: {summary['output']}/quarantine")
    return 0


# ---- report -----------------------------------------------------------------------------------

def cmd_report(args) -> int:
    from flows.reports import format_funnel, load_run

    if args.diff:
        from flows.reports import diff_runs, resolve_run_dir
        try:
            print(diff_runs(load_run(resolve_run_dir(args.diff[0])), load_run(resolve_run_dir(args.diff[1]))))
        except FileNotFoundError as e:
            raise UserError(str(e)) from None
        return 0
    run_dir = args.run
    if args.latest or not run_dir:
        from catalog import registry
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
    from catalog import registry

    what = args.what
    if what in ("all", "runs"):
        print("RUNS")
        for r in registry.list_runs(args.limit):
            print(f"  {r['id']:<40} {r['flow']:<16} {r['status']:<10} {r['started']:%Y-%m-%d %H:%M}  {r['output'] or ''}")
    if what in ("all", "datasets"):
        print("DATASETS")
        for d in registry.list_datasets():
            print(f"  {d['name']:<32} {d['kind']:<12} rows={d['rows']:<9} bytes={d['bytes']:<11} {d['path']}")
    if what in ("all", "models"):
        print("MODELS")
        for m in registry.list_models():
            print(f"  {m['name']:<32} {m['kind']:<18} {m['created']:%Y-%m-%d %H:%M}  {m['path']}")
    return 0


def cmd_catalog_show(args) -> int:
    import json

    from catalog import registry

    run = registry.get_run(args.run)
    if run is None:
        ds = registry.get_dataset(args.run)
        if ds is None:
            raise UserError(f"no run or dataset named {args.run!r} in the catalog")
        print(json.dumps(ds, indent=2, default=str))
        return 0
    run["config"] = json.loads(run["config"] or "{}")
    run["summary"] = json.loads(run["summary"]) if run.get("summary") else None
    run["lineage"] = registry.get_lineage(run["id"])
    run["reports"] = sorted(registry.get_reports(run["id"]))
    print(json.dumps(run, indent=2, default=str))
    return 0


# ---- parser -----------------------------------------------------------------------------------

# Other modules add their commands here: (name, help, add_arguments, handler) or a sub-group.
EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quipu", description="Curate web crawls and text dumps into training data, and train on it.")
    sub = parser.add_subparsers(dest="command", required=True)

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

    import flows.ops  # noqa: F401  (watch, deploy)
    import flows.quality_cli  # noqa: F401  (quality train)
    import flows.ppl_cli  # noqa: F401  (ppl label/distill/eval, kenlm train)
    import flows.benchmarks_cli  # noqa: F401  (benchmarks ls/check)
    import flows.train_cli  # noqa: F401  (train, plan, export)
    import flows.demo  # noqa: F401  (demo)
    for add in EXTRA_COMMANDS:
        add(sub)
    return parser


def domain_exit_code(e: BaseException) -> int | None:
    """The exit code of an error the code that detected it has already worded for the user (one line,
    no traceback), or None for a bug. 2: the user must change something; 1: the run failed, rerun."""
    from catalog.names import InvalidName
    from catalog.ownership import OutputInUse, OutputMismatch
    from tasks.dedup_index import ConcurrentCommit
    from trainer.checkpoint import UnsafeCheckpoint
    if isinstance(e, (OutputInUse, OutputMismatch, InvalidName, UnsafeCheckpoint)):
        return 2
    if isinstance(e, ConcurrentCommit):
        return 1
    return None


def main(argv: list[str] | None = None) -> int:
    prefect_env()
    parser = build_parser()
    args = parser.parse_args(argv)
    from flows.config import ConfigError
    try:
        return int(args.func(args) or 0)
    except (ConfigError, UserError) as e:
        print(f"quipu: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("quipu: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if e.errno in WRITE_ERRNOS:  # disk full, read-only or forbidden output: say where, no traceback
            print(f"quipu: cannot write {e.filename or 'output'}: {e.strerror}; earlier outputs are left as they were",
                  file=sys.stderr)
            return 1
        raise
    except Exception as e:
        code = domain_exit_code(e)
        if code is None:
            raise
        print(f"quipu: {e}", file=sys.stderr)
        return code


if __name__ == "__main__":
    # `python -m flows.cli`: run the importable module, the one other modules add commands to.
    from flows.cli import main as _main
    sys.exit(_main())
