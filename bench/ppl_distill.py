"""Perplexity distillation benchmark: SmolLM2-135M teacher → Wayra-style student, vs KenLM.

Runs, in order (each step is a plain `quipu` command, printed before it runs):
  1. python bench/ppl_data.py                         train.jsonl / heldout.jsonl from ../shared/data/text
     quipu ppl label over both (per-token teacher NLLs, cached in the catalog: a rerun computes
     nothing; ~40 min for the 10,304 documents, 256 tokens each, on an idle 2-core machine)
  2. quipu ppl distill configs/ppl/smollm2-shared.yaml   student on train.jsonl (labels from the cache)
  3. quipu kenlm train configs/kenlm/shared-text.yaml    (skipped with a notice without `make kenlm`)
  4. quipu ppl eval --student … --input bench/out/ppl/heldout.jsonl --max-tokens 256 [--kenlm …]
Result: bench/out/ppl/eval.json (printed). Set QUIPU_HOME to keep the label cache between runs
(default here: bench/out/quipu).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUIPU = [sys.executable, "-m", "quipu.flows.cli"]


def sh(cmd: list[str]) -> None:
    print("+ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main() -> None:
    os.environ.setdefault("QUIPU_HOME", str(ROOT / "bench" / "out" / "quipu"))
    sys.path.insert(0, str(ROOT))
    from quipu.trainer.kenlm_model import kenlm_available
    threads = os.environ.get("BENCH_THREADS", "2")
    sh([sys.executable, "bench/ppl_data.py"])
    for name in ("heldout", "train"):
        sh(QUIPU + ["ppl", "label", "configs/ppl/smollm2-shared.yaml", "--input", f"bench/out/ppl/{name}.jsonl",
                    "--set", f"teacher.threads={threads}"])
    sh(QUIPU + ["ppl", "distill", "configs/ppl/smollm2-shared.yaml", "--set", f"train.threads={threads}",
                "--set", f"teacher.threads={threads}"])
    ev = QUIPU + ["ppl", "eval", "--student", "runs/ppl-student-shared", "--input", "bench/out/ppl/heldout.jsonl",
                  "--max-tokens", "256", "--threads", threads, "--timing-docs", os.environ.get("BENCH_TIMING_DOCS", "64"), "--out", "bench/out/ppl/eval.json"]
    if kenlm_available():
        sh(QUIPU + ["kenlm", "train", "configs/kenlm/shared-text.yaml"])
        ev += ["--kenlm", "runs/kenlm-shared"]
    else:
        print("kenlm: lmplz not built (make kenlm): evaluating the student only")
    sh(ev)


if __name__ == "__main__":
    main()
