"""Perplexity distillation benchmark, leave-source-out: SmolLM2-135M teacher -> Wayra-style student.

Protocol (every step a plain `quipu` command, printed before it runs):
  1. python bench/ppl_sources.py: bench/out/ppl/sources.jsonl, documents of 21 sources (en/es/pt
     corpora, web pages extracted from the crawls, package text) in 3 folds; see that file.
  2. quipu ppl label over the first `--rounds` documents of every source (teacher labels with per-token
     NLLs, cached in the catalog: a rerun computes nothing; label round by round in the background
     beforehand to spread a partial run over all sources).
  3. For each fold k: the student is distilled with the shipped config (configs/ppl/smollm2-shared.yaml)
     on the labelled documents of the *other* folds' sources (their unlabelled documents as `lm_input`),
     with `--config` variants and `--set` overrides as given, then `quipu ppl eval` scores fold k's
     labelled documents: sources that student never saw. Predictions of the three students are pooled:
     Spearman overall, per language and per source, and CCNet head/middle/tail bucket agreement.
  4. `--final`: the shipped student, distilled on every source, and its student/teacher docs/s ratio
     measured in one run (alternating rounds, median ratio), under `flock /work/.locks/timing.lock`
     when that lock exists (so no two timing runs on the shared machine overlap).
Result: bench/out/ppl/<name>/loso.json (printed). QUIPU_HOME keeps the label cache (default
bench/out/quipu). A variant is a name plus `--set` overrides (or another `--config`), e.g.
  python bench/ppl_distill.py --name two-layers --set student.teacher_layers=2
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIPU = [sys.executable, "-m", "quipu.flows.cli"]
OUT = ROOT / "bench" / "out" / "ppl"
CONFIG = "configs/ppl/smollm2-shared.yaml"


def sh(cmd: list[str], lock: bool = False) -> None:
    if lock and Path("/work/.locks/timing.lock").exists() and shutil.which("flock"):
        cmd = ["flock", "/work/.locks/timing.lock"] + cmd
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    from quipu.catalog.files import write_bytes_atomic
    write_bytes_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())


def fold_files(rows: list[dict], rounds: int, out: Path) -> list[int]:
    """labelled-<k>.jsonl (the first `rounds` documents of each source of fold k) and
    unlabelled-<k>.jsonl (the rest of them), plus the same for all folds together."""
    folds = sorted({r["fold"] for r in rows})
    for k in folds + ["all"]:
        mine = [r for r in rows if k == "all" or r["fold"] == k]
        write_jsonl(out / f"labelled-{k}.jsonl", [r for r in mine if r["round"] < rounds])
        write_jsonl(out / f"unlabelled-{k}.jsonl", [r for r in mine if r["round"] >= rounds])
    return folds


def pooled(pred_files: list[Path]) -> dict:
    """Spearman and bucket agreement over the pooled out-of-fold predictions."""
    from quipu.trainer.ppl_eval import bucket_agreement
    from quipu.trainer.wayra_train import pearson, spearman
    rows = [json.loads(line) for f in pred_files for line in f.open()]
    t, p = [r["teacher"] for r in rows], [r["student"] for r in rows]
    out = {"n": len(rows), "spearman": round(spearman(p, t), 4), "pearson": round(pearson(p, t), 4)}
    for field in ("lang", "source"):
        out[f"by_{field}"] = {}
        for g in sorted({r[field] for r in rows}):
            ix = [i for i, r in enumerate(rows) if r[field] == g]
            out[f"by_{field}"][g] = {"n": len(ix), "spearman": round(spearman([p[i] for i in ix], [t[i] for i in ix]), 4)}
    out["buckets"] = bucket_agreement(p, t, [r["lang"] for r in rows])
    return out


def window_curve(rows: list[dict], max_tokens: int, windows=(16, 32, 64, 96)) -> dict:
    """How well the teacher's log-perplexity over its first W tokens ranks documents like its
    log-perplexity over all `max_tokens` (prefix means of the cached per-token NLLs; the teacher is
    causal, so they are what it gives a W-token window): the best a student reading W tokens can do."""
    from quipu.catalog.registry import kv_get_many
    from quipu.scoring.model_files import weights_fingerprint
    from quipu.trainer.teacher import LABEL_NAMESPACE, label_key, resolve_teacher_path
    from quipu.trainer.wayra_train import spearman
    fp = weights_fingerprint(resolve_teacher_path(None))
    keys = {label_key(fp, max_tokens, r["text"]): r for r in rows}
    got = kv_get_many(f"{LABEL_NAMESPACE}:tokens", sorted(keys))
    full = {k: sum(v) / len(v) for k, v in got.items() if v}
    out = {"n": len(full)}
    for w in windows:
        ks = [k for k in full]
        part = [sum(got[k][:w]) / len(got[k][:w]) for k in ks]
        out[f"rho_{w}_vs_{max_tokens}"] = round(spearman(part, [full[k] for k in ks]), 4)
        for lang in ("en", "es", "pt"):
            lk = [i for i, k in enumerate(ks) if keys[k]["lang"] == lang]
            out.setdefault("by_lang", {}).setdefault(lang, {})[f"rho_{w}"] = round(
                spearman([part[i] for i in lk], [full[ks[i]] for i in lk]), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", default="shipped", help="variant name (output folder)")
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", action="append", default=[], help="config override for this variant (repeatable)")
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("BENCH_ROUNDS", "100")),
                    help="labelled documents per source (the first N of each)")
    ap.add_argument("--folds", default="", help="only these folds (comma-separated), e.g. 1 for a quick screen")
    ap.add_argument("--assistant-config", help="distil an assistant with this config first (per fold), "
                                               "then the student with `assistant` set to it")
    ap.add_argument("--final", action="store_true", help="also distil the shipped student on all sources")
    ap.add_argument("--timing", action="store_true", help="time the shipped student against the teacher (one run)")
    ap.add_argument("--no-loso", action="store_true", help="skip the per-fold students (e.g. --final in its own process)")
    ap.add_argument("--timing-input", default=None, help="documents for the timing run (default: labelled-all.jsonl)")
    ap.add_argument("--skip-sources", action="store_true", help="reuse bench/out/ppl/sources.jsonl")
    ap.add_argument("--skip-label", action="store_true", help="labels are cached already (labelled elsewhere)")
    ap.add_argument("--pool-only", action="store_true",
                    help="no distillation: pool the folds' predictions already written for this variant "
                         "(after running folds as separate processes with --folds)")
    args = ap.parse_args()
    os.environ.setdefault("QUIPU_HOME", str(ROOT / "bench" / "out" / "quipu"))
    threads = os.environ.get("BENCH_THREADS", "2")
    if not args.skip_sources or not (OUT / "sources.jsonl").exists():
        sh([sys.executable, "bench/ppl_sources.py"])
    rows = [json.loads(line) for line in (OUT / "sources.jsonl").open()]
    folds = fold_files(rows, args.rounds, OUT)
    if args.folds:
        folds = [int(k) for k in args.folds.split(",")]
    sets = [x for s in args.set for x in ("--set", s)]
    common = ["--set", f"train.threads={threads}", "--set", f"teacher.threads={threads}",
              "--set", "label_docs=1000000"]
    if not (args.skip_label or args.pool_only):
        sh(QUIPU + ["ppl", "label", args.config, "--input", str(OUT / "labelled-all.jsonl")] + common + sets)
    var = OUT / args.name
    var.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def distill(k, train_inputs, unlabelled, output, config=args.config, extra=()):
        cmd = QUIPU + ["ppl", "distill", config, "--output", str(output), "--set", f"name=wayra-{args.name}-{k}"]
        for f in train_inputs:
            cmd += ["--input", str(f)]
        cmd += ["--set", "lm_input=[" + ",".join(str(f) for f in unlabelled) + "]"]
        sh(cmd + common + sets + list(extra))

    preds = []
    for k in ([] if args.pool_only or args.no_loso else folds):
        others = [f for f in folds_all(rows) if f != k]
        train = [OUT / f"labelled-{j}.jsonl" for j in others]
        unl = [OUT / f"unlabelled-{j}.jsonl" for j in others]
        student = ROOT / "runs" / f"ppl-loso-{args.name}-{k}"
        extra = []
        if args.assistant_config:
            assistant = ROOT / "runs" / f"ppl-loso-{args.name}-assistant-{k}"
            distill(k, train, unl, assistant, config=args.assistant_config)
            extra = ["--set", f"assistant={assistant}"]
            # the assistant is a variant of its own: its held-out figures come for the price of an eval
            sh(QUIPU + ["ppl", "eval", "--student", str(assistant), "--input", str(OUT / f"labelled-{k}.jsonl"),
                        "--threads", threads, "--timing-docs", "8", "--rounds", "1",
                        "--predictions", str(var / f"assistant-pred-{k}.jsonl"),
                        "--out", str(var / f"assistant-eval-{k}.json")])
        distill(k, train, unl, student, extra=extra)
        sh(QUIPU + ["ppl", "eval", "--student", str(student), "--input", str(OUT / f"labelled-{k}.jsonl"),
                    "--threads", threads, "--timing-docs", "16", "--rounds", "2",
                    "--predictions", str(var / f"pred-{k}.jsonl"), "--out", str(var / f"eval-{k}.json")])
    preds = [var / f"pred-{k}.jsonl" for k in folds_all(rows) if (var / f"pred-{k}.jsonl").exists()]
    folds = [k for k in folds_all(rows) if (var / f"pred-{k}.jsonl").exists()]
    result = {"variant": args.name, "config": args.config, "set": args.set, "rounds": args.rounds,
              "assistant_config": args.assistant_config, "folds": folds, "loso": pooled(preds),
              "per_fold": {k: json.loads((var / f"eval-{k}.json").read_text()) for k in folds},
              "seconds": round(time.time() - t0)}
    assisted = [var / f"assistant-pred-{k}.jsonl" for k in folds if (var / f"assistant-pred-{k}.jsonl").exists()]
    if assisted:
        result["assistant_loso"] = pooled(assisted)
    student = ROOT / "runs" / "ppl-student-shared"
    if args.final:
        extra = []
        if args.assistant_config:
            assistant = ROOT / "runs" / "ppl-student-shared-assistant"
            distill("all", [OUT / "labelled-all.jsonl"], [OUT / "unlabelled-all.jsonl"], assistant,
                    config=args.assistant_config)
            extra = ["--set", f"assistant={assistant}"]
        distill("all", [OUT / "labelled-all.jsonl"], [OUT / "unlabelled-all.jsonl"], student, extra=extra)
    if args.timing:
        sh(["uptime"])
        sh(QUIPU + ["ppl", "eval", "--student", str(student), "--input", args.timing_input or str(OUT / "labelled-all.jsonl"),
                    "--threads", threads, "--timing-docs", os.environ.get("BENCH_TIMING_DOCS", "96"), "--rounds", "3",
                    "--out", str(var / "timing.json")], lock=True)
        sh(["uptime"])
        result["final"] = json.loads((var / "timing.json").read_text())
    from quipu.flows.config import load_config
    from quipu.flows.ppl import PplConfig
    window = load_config(PplConfig, args.config, args.set).teacher.max_tokens
    result["teacher_window_curve"] = window_curve([r for r in rows if r["round"] < args.rounds], window)
    from quipu.catalog.files import write_json_atomic
    write_json_atomic(var / ("final.json" if args.no_loso else "loso.json"), result)
    show = {k: v for k, v in result.items() if k != "per_fold"}
    if "final" in show:
        show["final"] = {k: show["final"][k] for k in ("n", "spearman_student", "teacher_docs_per_s", "student_docs_per_s",
                                                       "speedup_student_vs_teacher", "speedup_rounds",
                                                       "speedup_median_of_rounds", "teacher_max_tokens")}
    print(json.dumps(show, indent=1))


def folds_all(rows: list[dict]) -> list[int]:
    return sorted({r["fold"] for r in rows})


if __name__ == "__main__":
    main()
