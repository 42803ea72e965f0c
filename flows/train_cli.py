"""`quipu train`, `quipu plan`, `quipu export` (flows/train.py, trainer/). Prefect and torch are
imported only when a command runs."""
from __future__ import annotations

import argparse

from quipu.catalog.errors import UserError
from quipu.flows.config import add_config_args


def load_train_config(args):
    from quipu.flows.config import load_config
    from quipu.trainer.train import TrainConfig
    overrides = list(args.overrides)
    if args.output:
        overrides.append(f"output={args.output}")
    if args.max_steps:
        overrides += steps_scaled(args.config, overrides, args.max_steps)
    return load_config(TrainConfig, args.config, overrides)


def steps_scaled(path: str, overrides: list[str], max_steps: int) -> list[str]:
    """`--max-steps N` as overrides: train.max_steps, and what is counted in steps scaled by the same
    factor (warm-up, phase start steps) unless set explicitly, so a short trial run of a long config
    keeps its shape instead of failing on a warm-up longer than the run. Each change is printed."""
    from quipu.flows.config import apply_overrides, read_yaml
    raw = apply_overrides(read_yaml(path), list(overrides))
    old = int((raw.get("train") or {}).get("max_steps") or 1000)
    if max_steps == old:
        return [f"train.max_steps={max_steps}"]
    factor = max_steps / old
    out = [f"train.max_steps={max_steps}"]
    explicit = {o.split("=", 1)[0].strip() for o in overrides}
    warmup = (raw.get("schedule") or {}).get("warmup_steps")
    if warmup is None:
        warmup = 100   # ScheduleConfig's default
    if "schedule.warmup_steps" not in explicit and warmup:
        new = min(max_steps - 1, max(0, round(warmup * factor)))
        if new != warmup:
            out.append(f"schedule.warmup_steps={new}")
            print(f"--max-steps {max_steps}: schedule.warmup_steps {warmup} -> {new} (scaled with train.max_steps {old} -> {max_steps})")
    phases = ((raw.get("data") or {}).get("phases")) or []
    if "data.phases" not in explicit and any(isinstance(p, dict) and p.get("start_step") for p in phases):
        import json
        scaled = [dict(p, start_step=max(1, min(max_steps - 1, round(p["start_step"] * factor))))
                  if isinstance(p, dict) and p.get("start_step") else p for p in phases]
        out.append(f"data.phases={json.dumps(scaled)}")
        print(f"--max-steps {max_steps}: data.phases[].start_step scaled by {factor:.3g}")
    return out


def cmd_train(args) -> int:
    from quipu.trainer.data import BlendError
    from quipu.trainer.train import TrainingDiverged
    config = load_train_config(args)
    from quipu.flows.train import preflight
    try:
        preflight(config)   # sources, weights, phase boundaries: fail before any work
        from pathlib import Path

        from quipu.catalog.ownership import check_free
        check_free(Path(config.output).resolve())   # another live run in this folder: say so before Prefect
        from quipu.flows.train import tokenize_train
        summary = tokenize_train(config, resume=args.resume, strict=args.strict)
    except (BlendError, FileNotFoundError, TrainingDiverged) as e:
        raise UserError(str(e)) from None
    print()
    print(f"trained {summary['params']:,} parameters for {summary['step']} steps: "
          f"loss {summary['final_loss']:.4f}, held-out loss {summary['eval_loss'] or float('nan'):.4f}")
    if summary.get("eval_by_source"):
        from quipu.flows.progress import format_eval_groups
        print(f"held-out bits/byte: {format_eval_groups(summary)}")
    print(f"metrics:    {summary['metrics']}")
    print(f"loss curve: {summary.get('loss_curve')}")
    print(f"checkpoint: {summary['checkpoint']}")
    if summary.get("hf"):
        print(f"HF model:   {summary['hf']}")
    if summary.get("sample"):
        print(f"sample:     {summary['sample']!r}")
    if summary["stopped_early"]:
        print(f"stopped at step {summary['step']} of {summary['max_steps']} (train.stop_at_step / train.max_minutes); "
              "continue with --resume")
    return 0


def cmd_plan(args) -> int:
    from quipu.trainer.plan import format_plan, plan
    try:
        p = plan(args.params, args.tokens, args.gpus, args.peak_flops, args.mfu)
    except ValueError as e:
        raise UserError(str(e)) from None
    print(format_plan(p))
    return 0


def cmd_export(args) -> int:
    from pathlib import Path

    from quipu.trainer.export import export_hf
    if not Path(args.run_dir).is_dir():
        raise UserError(f"{args.run_dir}: not a run directory")
    try:
        out = export_hf(args.run_dir, args.hf, args.checkpoint)
    except (FileNotFoundError, RuntimeError) as e:
        raise UserError(str(e)) from None
    print(f"wrote {out} (AutoModelForCausalLM / AutoTokenizer.from_pretrained)")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="tokenize curated datasets and train a Llama-style model (flow tokenize-train)")
    add_config_args(p)
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in the run directory")
    p.add_argument("--strict", action="store_true",
                   help="a blend language with too little tokenizer training text, no held-out text or a fertility "
                        "above tokenizer.max_tokens_per_word is an error (default: a warning)")
    p.add_argument("--output", help="run directory (replaces the config's output)")
    p.add_argument("--max-steps", type=int, help="replaces train.max_steps")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("plan", help="6ND training FLOPs and days; Chinchilla-optimal N and D for that compute")
    p.add_argument("--params", type=float, required=True, help="parameters N, e.g. 70e9")
    p.add_argument("--tokens", type=float, required=True, help="training tokens D, e.g. 2e12")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--peak-flops", type=float, default=989e12, help="peak FLOP/s per GPU (default H100 dense bf16)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation, 0-1")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("export", help="write a trained run as a HF transformers folder")
    p.add_argument("run_dir", help="training run directory")
    p.add_argument("--hf", required=True, help="output folder")
    p.add_argument("--checkpoint", help="a checkpoint file (default: the newest)")
    p.set_defaults(func=cmd_export)
