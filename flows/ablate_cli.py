"""`quipu ablate` (flows/ablate.py): curate once per variant, train each the same way, compare held-out BPB."""
from __future__ import annotations

import argparse
import re

from quipu.catalog.errors import UserError
from quipu.flows.config import add_config_args


def parse_minutes(text: str) -> float:
    """'25m', '1.5h', '90s' or a plain number of minutes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text or "")
    if not m or float(m.group(1)) <= 0:
        raise UserError(f"--budget {text!r}: expected a positive time such as 25m, 1.5h or 90s")
    return float(m.group(1)) * {"s": 1 / 60, "m": 1, "h": 60, "": 1}[m.group(2)]


def load_ablate_config(args):
    from quipu.flows.ablate import AblateConfig
    from quipu.flows.config import load_config
    overrides = list(args.overrides)
    if args.output:
        overrides.append(f"output={args.output}")
    if args.budget:
        overrides.append(f"budget.minutes={parse_minutes(args.budget)}")
    if args.seeds:
        overrides.append(f"seeds=[{args.seeds}]")
    config = load_config(AblateConfig, args.config, overrides)
    if args.variants:
        wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
        known = [v.name for v in config.variants]
        missing = [v for v in wanted if v not in known]
        if missing:
            raise UserError(f"--variants: no variant named {missing[0]!r} in {args.config} (variants: {', '.join(known)})")
        if len(wanted) < 2:
            raise UserError("--variants: name at least two variants to compare")
        config = AblateConfig.model_validate(config.model_dump() | {"variants": [v for v in config.model_dump()["variants"]
                                                                                  if v["name"] in wanted]})
    return config


def cmd_ablate(args) -> int:
    from pathlib import Path

    from quipu.flows.ablate import check_config
    config = load_ablate_config(args)
    check_config(config)            # variant curate configs, the train block, held-out files: before any work
    from quipu.catalog.ownership import check_free
    check_free(Path(config.output).resolve())
    from quipu.flows.ablate import ablate
    from quipu.flows.ablate_report import format_markdown
    try:
        from prefect.task_runners import ThreadPoolTaskRunner
        result = ablate.with_options(task_runner=ThreadPoolTaskRunner(max_workers=config.workers))(config, overwrite=args.overwrite)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    print()
    print(format_markdown(result))
    print(f"results:  {result['output']}/ablate.json   table: {result['markdown']}   plot: {result['plot']}")
    print(f"models:   {result['output']}/<variant>/seed-<k>/hf   ({result['seconds']:.0f} s)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ablate", help="curate each variant, train the same model on each, compare held-out bits per byte")
    add_config_args(p)
    p.add_argument("--output", help="output folder (replaces the config's output)")
    p.add_argument("--budget", help="wall-clock budget of the whole ablation, e.g. 25m or 1h: sizes model and tokens (6ND)")
    p.add_argument("--seeds", help="comma-separated training seeds (replaces the config's seeds)")
    p.add_argument("--variants", help="comma-separated subset of the config's variants")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier ablation with other inputs or config in the output folder (the same one resumes)")
    p.set_defaults(func=cmd_ablate)
