"""`quipu quality train CONFIG [--set k=v] [--output DIR]`: train, evaluate and register a fastText
classifier, the quality classifier or any kind the config names (flows/quality_train.py). Prefect is
imported only when the command runs."""
from __future__ import annotations

import argparse

from quipu.flows.config import add_config_args


def cmd_quality_train(args) -> int:
    from quipu.flows.config import load_config
    from quipu.flows.quality_train import quality_train
    from quipu.trainer.classifier_train import ClassifierTrainConfig
    from quipu.trainer.text_source import source_files

    overrides = list(args.overrides)
    if args.output:
        overrides.append(f"output={args.output}")
    config = load_config(ClassifierTrainConfig, args.config, overrides)
    for src in config.positive + config.negative:   # a source that matches nothing: say so before starting
        source_files(src)
    summary = quality_train(config)
    print(f"model {summary['model']} (catalog id {summary['model_id']})")
    print(f"validation: {summary['valid']} documents, ROC AUC {summary['roc_auc']}, precision {summary['precision']}, "
          f"recall {summary['recall']}, F1 {summary['f1']}")
    for lang, auc in summary["per_language"].items():
        print(f"  {lang}: ROC AUC {auc}")
    print(f"evaluation: {summary['eval']}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("quality", help="the fastText quality classifier (and any other fastText classifier kind)")
    qsub = p.add_subparsers(dest="quality_command", required=True)
    q = qsub.add_parser("train", help="train, evaluate and register a quality (or other `kind`) classifier")
    add_config_args(q)
    q.add_argument("--output", help="model directory (replaces the config's output)")
    q.set_defaults(func=cmd_quality_train)
