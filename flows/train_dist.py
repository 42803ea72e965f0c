"""Data-parallel training under torchrun (DDP, or FSDP2 with `distributed.strategy: fsdp`):

    torchrun --nproc_per_node 2 -m quipu.flows.train_dist CONFIG [--output DIR] [--resume] [--max-steps N] [--set k=v]

Same config and run directory as `quipu train`. Rank 0 prepares the data (tokenizer, token shards:
skipped when already done) while the other ranks wait; then every rank runs the trainer. No Prefect
here: torchrun owns the processes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from quipu.catalog.errors import UserError
    from quipu.flows.config import load_config
    from quipu.trainer.prepare import prepare, resolve_sources
    from quipu.trainer.train import TrainConfig, train

    ap = argparse.ArgumentParser(prog="torchrun ... -m quipu.flows.train_dist")
    ap.add_argument("config")
    ap.add_argument("--output")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--max-steps", type=int)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        overrides = list(args.overrides)
        if args.output:
            overrides.append(f"output={args.output}")
        if args.max_steps:
            overrides.append(f"train.max_steps={args.max_steps}")
        cfg = load_config(TrainConfig, args.config, overrides)
        run_dir = Path(cfg.output).resolve()
        ready = run_dir / "prepared.json"
        if rank == 0:
            if not ready.exists():
                resolve_sources(cfg.data)
                prepare(cfg.tokenizer, cfg.data, run_dir)
        else:
            while not ready.exists():   # rank 0 is tokenizing (a failure there ends the torchrun job)
                time.sleep(0.5)
        summary = train(cfg, run_dir, resume=args.resume)
    except (UserError, FileNotFoundError) as e:    # a config, blend, checkpoint or divergence error: one line
        print(f"quipu: {e}", file=sys.stderr)
        return 2
    if rank == 0:
        print(json.dumps({k: summary.get(k) for k in ("step", "final_loss", "eval_loss", "loss_curve", "world_size")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
