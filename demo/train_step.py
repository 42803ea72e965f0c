"""The demo's last step: tokenize the demo's curated output and train a tiny Llama on it for at most
2.5 minutes of training (configs/train/demo.yaml), then print the loss-curve path and a generated sample."""
from __future__ import annotations

import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN_DEMO_CONFIG = REPO / "configs" / "train" / "demo.yaml"


def train_step(ctx) -> None:
    from quipu.catalog.errors import UserError
    from quipu.flows.config import load_config
    from quipu.flows.train import preflight, tokenize_train
    from quipu.trainer.data import BlendError
    from quipu.trainer.train import TrainConfig, TrainingDiverged

    out = ctx.run_dir.parent / f"{ctx.run_dir.name}-train"
    # the curate step registered its shards as a dataset named after its run directory
    config = load_config(TrainConfig, str(TRAIN_DEMO_CONFIG), [
        f"output={out}", f"data.phases=[{{name: general, sources: [{{dataset: {ctx.run_dir.name}, weight: 1.0}}]}}]"])
    # the demo trains from scratch each time (the tokenizer and token shards are reused when unchanged)
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    try:
        preflight(config)
        summary = tokenize_train(config)
    except (BlendError, TrainingDiverged, FileNotFoundError) as e:
        raise UserError(str(e)) from None
    print(f"trained a {summary['params']:,}-parameter Llama for {summary['step']} steps "
          f"({summary['step'] * config.train.batch_size * config.data.seq_len:,} tokens): "
          f"loss {summary['final_loss']:.3f}, held-out loss {summary['eval_loss']:.3f} (ppl {summary['eval_ppl']:.1f})")
    print(f"loss curve: {summary.get('loss_curve')}")
    print(f"sample: {summary.get('sample')!r}")
    ctx.artifacts["train_summary"] = summary
    ctx.where += [
        ("loss curve", f"{summary.get('loss_curve')}  (metrics: {summary['metrics']})"),
        ("trained model", f"{summary.get('hf') or summary['checkpoint']}  (quipu export {out} --hf DIR)"),
    ]
