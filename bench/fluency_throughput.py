"""Speed of the fluency judge (tasks/fluency.py) beside its anchor, a plain KenLM scorer (CCNet-style
5-gram perplexity per document, quipu.scoring.kenlm_model, KenLM's own query code), on the same
documents in one run: documents per second per core (process CPU time, one process).

    .venv/bin/python bench/fluency_throughput.py [--docs 3000] [--write]

Documents: the first of each es/pt/en source of ../shared/data/text, judged as their language. The
KenLM model is trained here (build/kenlm/bin, `make kenlm`) on the same documents: its speed, not its
verdicts, is compared.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Fluency judge speed beside a plain KenLM scorer (`bench/fluency_throughput.py`)"


def cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> int:
    import pyarrow as pa
    from bench.fluency_models import SOURCES, source_texts
    from quipu.tasks.fluency import FluencyConfig, FluencyFilter
    from quipu.scoring.kenlm_model import KenLMScorer, train_kenlm
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000, help="documents per language")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    rows = ["| language | documents | chars/doc | fluency docs/s/core | KenLM 5-gram docs/s/core | ratio |", "|---|---|---|---|---|---|"]
    for lang, names in SOURCES.items():
        texts = [t for n in names if not n.startswith("django:") for t in source_texts(n, lang)][: args.docs]
        batch = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts, "lang": [lang] * len(texts)})
        stage = FluencyFilter(FluencyConfig(enabled=True, languages=[lang]))
        stage.check()
        stage.process(batch.slice(0, 50))        # warm: the model's first lookups
        t_ours = cpu(lambda: stage.process(batch))
        with tempfile.TemporaryDirectory() as tmp:
            train_kenlm(texts, Path(tmp) / f"{lang}.binary", order=5)
            scorer = KenLMScorer(Path(tmp) / f"{lang}.binary")
            t_kenlm = cpu(lambda: scorer.perplexity(texts))
        n = len(texts)
        rows.append(f"| {lang} | {n} | {sum(map(len, texts)) // n} | {n / t_ours:,.0f} | {n / t_kenlm:,.0f} | {t_kenlm / t_ours:.2f}x |")
        print(rows[-1], flush=True)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    body = "\n".join([SECTION, "", f"`.venv/bin/python bench/fluency_throughput.py --docs {args.docs}` (`uptime`: {load}; "
                      "shared 2-core machine, process CPU time of one process):", "", *rows, ""])
    print(body)
    if args.write:
        from bench.curate_throughput import write_results_section
        write_results_section(RESULTS, SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
