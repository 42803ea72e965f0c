"""`quipu ppl label|distill|eval` and `quipu kenlm train` (flows in flows/ppl.py). Prefect and torch
are imported only when a command runs."""
from __future__ import annotations

import argparse
import json

from quipu.catalog.files import write_json_atomic
from quipu.flows.config import add_config_args


def _load_ppl_config(args):
    from quipu.flows.ppl import PplConfig
    from quipu.flows.config import load_config
    overrides = list(args.overrides)
    config = load_config(PplConfig, args.config, overrides)
    update = {}
    if getattr(args, "input", None):
        update["input"] = args.input
    if getattr(args, "output", None):
        update["output"] = args.output
    return PplConfig.model_validate({**config.model_dump(), **update})


def cmd_ppl_label(args) -> int:
    from quipu.flows.ppl import ppl_label
    stats = ppl_label(_load_ppl_config(args))
    print(json.dumps(stats, indent=2))
    return 0


def cmd_ppl_distill(args) -> int:
    from quipu.flows.ppl import ppl_distill
    summary = ppl_distill(_load_ppl_config(args))
    print(f"student {summary['output']} (catalog id {summary['model_id']}): validation Spearman "
          f"{summary['val_spearman']}, Pearson {summary['val_pearson']}, RMSE {summary['val_rmse']} nats, "
          f"{summary['params'] / 1e6:.2f}M parameters, {summary['seconds']} s")
    return 0


def cmd_ppl_eval(args) -> int:
    from quipu.trainer.ppl_eval import evaluate, student_window
    from quipu.trainer.teacher import TeacherConfig
    # the teacher window the student was distilled on, unless asked otherwise (a document-head student
    # of an older format names none: 512 then, the teacher's default)
    max_tokens = args.max_tokens or student_window(args.student) or 512
    teacher = TeacherConfig(path=args.teacher, max_tokens=max_tokens, batch_size=args.teacher_batch_size,
                            threads=args.threads, device=args.device)
    result = evaluate(args.student, args.input, teacher, args.kenlm, timing_docs=args.timing_docs,
                      quantize=args.quantize, threads=args.threads, batch_size=args.batch_size,
                      log=lambda m: None, device=args.device, rounds=args.rounds,
                      student_max_len=args.student_max_len, predictions_out=args.predictions)
    write_json_atomic(args.out, result)
    keys = ("n", "spearman_student", "spearman_kenlm", "pearson_student", "teacher_docs_per_s",
            "student_docs_per_s", "kenlm_docs_per_s", "speedup_median_of_rounds", "teacher_max_tokens")
    print(json.dumps({**{k: result[k] for k in keys}, "same_bucket": result["buckets"]["same_bucket"],
                      "by_lang": {g: v["spearman_student"] for g, v in result["by_lang"].items()}}))
    return 0


def cmd_kenlm_train(args) -> int:
    from quipu.flows.config import load_config
    overrides = list(args.overrides)
    from quipu.flows.ppl import KenLMTrainConfig, kenlm_train
    config = load_config(KenLMTrainConfig, args.config, overrides)
    update = {k: v for k, v in (("input", args.input), ("output", args.output)) if v}
    config = KenLMTrainConfig.model_validate({**config.model_dump(), **update})
    summary = kenlm_train(config)
    print(f"kenlm models in {summary['output']} (catalog id {summary['model_id']}):")
    for lang, f in summary["languages"].items():
        print(f"  {lang}: {f['tokens']} tokens, {f['seconds']} s, validation geometric-mean perplexity "
              f"{f.get('validation_geo_mean_ppl')}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ppl", help="teacher perplexity labels, student distillation and evaluation")
    psub = p.add_subparsers(dest="ppl_command", required=True)
    q = psub.add_parser("label", help="teacher log-perplexity of a sample of documents (cached in the catalog)")
    add_config_args(q)
    q.add_argument("--input", action="append", help="documents (glob, repeatable; replaces the config's input)")
    q.set_defaults(func=cmd_ppl_label)
    q = psub.add_parser("distill", help="label, train and register a student")
    add_config_args(q)
    q.add_argument("--output", help="student directory (replaces the config's output)")
    q.add_argument("--input", action="append", help="documents (glob, repeatable; replaces the config's input)")
    q.set_defaults(func=cmd_ppl_distill)
    q = psub.add_parser("eval", help="student (and KenLM) vs teacher on held-out documents")
    q.add_argument("--student", required=True, help="student directory")
    q.add_argument("--input", required=True, help="held-out documents (.jsonl)")
    q.add_argument("--teacher", help="HF directory or .gguf (default SmolLM2-135M)")
    q.add_argument("--kenlm", help="KenLM binary, directory of <lang>.binary, or catalog name")
    q.add_argument("--max-tokens", type=int, default=None,
                   help="teacher tokens per document (default: the window the student was distilled on)")
    q.add_argument("--teacher-batch-size", type=int, default=8)
    q.add_argument("--timing-docs", type=int, default=64, help="documents the teacher is timed on (computed afresh)")
    q.add_argument("--quantize", action="store_true", help="int8 dynamic quantisation of the student")
    q.add_argument("--batch-size", type=int, default=16, help="documents per student forward pass (sorted by length)")
    q.add_argument("--threads", type=int, default=None, help="torch threads for all models")
    q.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="teacher and student device (auto: CUDA when a GPU is visible)")
    q.add_argument("--rounds", type=int, default=3, help="alternating teacher/student timing rounds (median ratio)")
    q.add_argument("--student-max-len", type=int, default=None,
                   help="the student reads only this many tokens (BOS included; window measurements)")
    q.add_argument("--predictions", help="also write each document's teacher and student log-ppl here (JSONL)")
    q.add_argument("--out", required=True, help="result JSON")
    q.set_defaults(func=cmd_ppl_eval)

    p = sub.add_parser("kenlm", help="CCNet-style KenLM models")
    ksub = p.add_subparsers(dest="kenlm_command", required=True)
    q = ksub.add_parser("train", help="train and register one n-gram model per language")
    add_config_args(q)
    q.add_argument("--input", action="append", help="documents (glob, repeatable)")
    q.add_argument("--output", help="model directory")
    q.set_defaults(func=cmd_kenlm_train)
