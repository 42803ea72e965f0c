"""Operating commands: `quipu watch` (new-data watcher) and `quipu deploy` (Prefect deployments)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quipu.flows.config import add_config_args

DEFAULT_WATCH_CONFIG = "configs/watch/default.yaml"


def _watch_config(args):
    from quipu.flows.config import load_config
    from quipu.flows.watch import WatchConfig

    path = args.config or (DEFAULT_WATCH_CONFIG if Path(DEFAULT_WATCH_CONFIG).is_file() else None)
    overrides = list(args.overrides)
    if args.location:
        overrides.append("locations=[" + ",".join(f'"{loc}"' for loc in args.location) + "]")
    return load_config(WatchConfig, path, overrides)


def cmd_watch(args) -> int:
    cfg = _watch_config(args)
    if not args.once:
        from quipu.flows.watch import watch
        out = watch(cfg)
        print(f"new files: {out['new']}  still being written: {len(out['unsettled'])}  unchanged: {out['unchanged']}  "
              f"waiting for their curate run: {out['pending']}  (this look: {out['settled']['seen']} seen, "
              f"{out['settled']['retry']} announced again after a failed run)")
        if out.get("event_id"):
            print(f"event quipu.data.arrived {out['event_id']} → curate output {out['output']}")
        return 0
    return watch_once(cfg, args.curate_set)


def watch_once(cfg, curate_overrides: list[str]) -> int:
    """One look without a Prefect server: curate the new files directly, then record them as seen."""
    from quipu.flows.curate_cli import run_curate
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.flows.watch import incremental_output, mark_seen, missing_locations, scan

    for warning in missing_locations(cfg):
        print(f"WARNING: {warning}", file=sys.stderr)
    result = scan(cfg)
    for path in result.unsettled:
        print(f"still being written, left for the next look: {path}")
    if not result.paths:
        print(f"no new input files ({result.unchanged} unchanged)")
        return 0
    print(f"{len(result.paths)} new files" + (f" ({result.deferred} more next time)" if result.deferred else ""))
    curate_cfg = load_config(CurateConfig, cfg.curate_config, curate_overrides)
    curate_cfg = CurateConfig.model_validate({**curate_cfg.model_dump(), "input": result.paths, "dataset": cfg.dataset,
                                              "output": incremental_output(cfg, result.paths)})
    rc = run_curate(curate_cfg, allow_empty=True)   # an increment of only duplicates is not an error
    if rc == 0:
        mark_seen(result, None)
    return rc


def cmd_deploy(args) -> int:
    from quipu.flows.deploy import DEFAULT_FILE, deploy

    return deploy(Path(args.prefect_file) if args.prefect_file else DEFAULT_FILE, args.name or None, args.dry_run,
                  args.overrides)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("watch", help="look for new input files: emit quipu.data.arrived, or with --once curate them directly")
    add_config_args(p, config_required=False)
    p.add_argument("--once", action="store_true",
                   help="no Prefect server needed (cron): curate the new files right away, incrementally")
    p.add_argument("--location", action="append", help="directory or fsspec URL to watch (repeatable; replaces the config's)")
    p.add_argument("--curate-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a value of the curate config used by --once (repeatable)")
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("deploy", help="register the Prefect deployments of deploy/prefect.yaml with the server")
    p.add_argument("--prefect-file", help="deployment file (default deploy/prefect.yaml)")
    p.add_argument("--name", action="append", help="only this deployment (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="check the deployments together, write the resolved file, deploy nothing")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="DEPLOYMENT.KEY=VALUE",
                   help="override a value of a deployment's config, e.g. watch.locations=[/mnt/crawls] or "
                        "tokenize-train.train.max_steps=50 (dotted key, YAML value); repeatable")
    p.set_defaults(func=cmd_deploy)
