"""Quality-classifier scoring throughput: our batched `quality` stage vs datatrove's
`FastTextClassifierFilter`, same fastText model, same documents.

Model: trained here with configs/quality/shared-text.yaml (thread 1, seed 0) into
bench/out/quality-model/ unless --model is given. Documents: every en/es/pt document of
../shared/data/text (~14.8k, ~26 MB).

- ours: `QualityFilter.process` over Arrow batches of 2,000 (normalisation, one `multilinePredict`
  call per batch, the keep decision, the kept/removed split), and `FastTextClassifier.score` alone.
- datatrove 0.10.1: `FastTextClassifierFilter(model_url=<our local .bin>, keep_labels=("hq", 0.5),
  newline_replacement=" ")`, `.filter(doc)` per document, as its pipeline calls it. It copies the
  local file into its asset cache (HF_HOME pointed at a temporary directory: nothing is downloaded).
  fasttext 0.9.3's `predict` (which datatrove calls) fails under numpy 2 (`np.array(..., copy=False)`):
  we give the fasttext module a numpy whose `array(copy=False)` is `asarray`, nothing else changes.
- the same normalised lines (model input identical) through our batched `multilinePredict` and
  through datatrove's per-document `filter`: the prediction cost alone.
- check: datatrove's per-document scores on our normalised lines equal our batched scores.

    .venv/bin/python bench/quality_throughput.py [--shared ../shared/data] [--model PATH] [--repeats 3]

Prints a markdown table and writes bench/out/quality_throughput.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quipu.catalog.files import write_json_atomic  # noqa: E402
from quipu.tasks.quality import QualityConfig, QualityFilter  # noqa: E402
from quipu.scoring.fasttext_classifier import load_classifier, model_sidecar, normalize_text  # noqa: E402


def train_bench_model(shared: Path, out: Path) -> str:
    """The shared-text classifier, trained without Prefect (same functions as the flow)."""
    from quipu.flows.config import load_config, read_yaml
    from quipu.trainer.classifier_train import ClassifierTrainConfig, prepare_data, train_model
    from quipu.catalog.files import write_json_atomic as wj
    model = out / "model.bin"
    if model.is_file():
        return str(model)
    raw = read_yaml(ROOT / "configs/quality/shared-text.yaml")
    for side in ("positive", "negative"):
        for src in raw[side]:
            src["path"] = src["path"].replace("../shared/data", str(shared))
    raw["output"] = str(out)
    cfg = load_config(ClassifierTrainConfig, data=raw)
    data = prepare_data(cfg, str(out))
    wj(model_sidecar(model), {"positive_label": "hq", "normalization": cfg.normalization.model_dump()})
    return train_model(data["train"], cfg.fasttext, cfg.seed, str(model))


def load_docs(shared: Path) -> pa.Table:
    ids, texts, langs = [], [], []
    for f in sorted((shared / "text").glob("*.jsonl")):
        for line in f.open():
            d = json.loads(line)
            if d["lang"] in ("en", "es", "pt"):
                ids.append(d["id"]); texts.append(d["text"]); langs.append(d["lang"])
    return pa.table({"id": ids, "text": texts, "lang": langs})


def numpy2_safe_fasttext() -> None:
    import numpy as np
    import fasttext.FastText as ft
    shim = types.ModuleType("numpy_copy_shim")
    shim.__dict__.update({k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    shim.array = lambda obj, *a, copy=True, **kw: np.asarray(obj, *a, **kw) if copy is False else np.array(obj, *a, copy=copy, **kw)
    ft.np = shim


def time_ours(stage: QualityFilter, docs: pa.Table, batch: int = 2000) -> tuple[float, int]:
    t0 = time.perf_counter()
    kept = 0
    for i in range(0, docs.num_rows, batch):
        kept += stage.process(docs.slice(i, batch)).kept.num_rows
    return time.perf_counter() - t0, kept


def time_score_only(model, texts: list[str], batch: int = 2000) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        model.score(texts[i:i + batch])
    return time.perf_counter() - t0


def time_lines(model, lines: list[str], batch: int = 2000) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(lines), batch):
        model.score_lines(lines[i:i + batch])
    return time.perf_counter() - t0


def time_datatrove(flt, ids: list[str], texts: list[str]) -> tuple[float, int]:
    from datatrove.data import Document
    rows = [Document(text=t, id=i) for i, t in zip(ids, texts)]
    t0 = time.perf_counter()
    kept = sum(1 for d in rows if flt.filter(d))
    return time.perf_counter() - t0, kept


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--model", help="a fastText quality model (default: train one into bench/out/quality-model)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    shared = Path(args.shared)
    out_dir = ROOT / "bench" / "out"
    model_path = args.model or train_bench_model(shared, out_dir / "quality-model")
    docs = load_docs(shared)
    mb = sum(len(t.encode()) for t in docs.column("text").to_pylist()) / 1e6
    model = load_classifier(model_path)
    stage = QualityFilter(QualityConfig(enabled=True, threshold=0.5), model)

    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="dt-assets-")   # datatrove's asset cache: a copy of our file
    numpy2_safe_fasttext()
    from datatrove.pipeline.filters import FastTextClassifierFilter
    flt = FastTextClassifierFilter(model_url=model_path, keep_labels=("hq", 0.5), newline_replacement=" ")
    flt.model  # load (copy into the asset cache) outside the timing

    ids, texts = docs.column("id").to_pylist(), docs.column("text").to_pylist()
    norm = [normalize_text(t, model.normalization) for t in texts]
    lines = [x + "\n" for x in norm]
    runs: dict[str, list[float]] = {k: [] for k in ("ours", "score_only", "datatrove", "lines_ours", "lines_datatrove")}
    for _ in range(args.repeats):   # interleaved, so load on the shared machine hits all alike
        s, kept_ours = time_ours(stage, docs); runs["ours"].append(s)
        runs["score_only"].append(time_score_only(model, texts))
        s, kept_dt = time_datatrove(flt, ids, texts); runs["datatrove"].append(s)
        runs["lines_ours"].append(time_lines(model, lines))
        s, kept_dt_norm = time_datatrove(flt, ids, norm); runs["lines_datatrove"].append(s)

    # same model, same input line -> same score: datatrove's per-document predict on our normalised text
    dt_scores = []
    for line in norm[:2000]:
        labels, probs = flt.model.predict(line, k=-1)
        dt_scores.append(min(1.0, float(dict(zip(labels, probs)).get("__label__hq", 0.0))))
    max_diff = max(abs(a - b) for a, b in zip(dt_scores, model.score(texts[:2000])))

    n = docs.num_rows
    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {"docs": n, "mb": round(mb, 2), "repeats": args.repeats, "model": model_path,
              "model_bytes": os.path.getsize(model_path),
              "seconds": {k: round(v, 3) for k, v in med.items()},
              "docs_per_s": {k: round(n / v, 1) for k, v in med.items()},
              "ratio_ours_vs_datatrove": round(med["datatrove"] / med["ours"], 2),
              "ratio_same_lines": round(med["lines_datatrove"] / med["lines_ours"], 2),
              "kept": {"ours": kept_ours, "datatrove_raw_text": kept_dt, "datatrove_our_lines": kept_dt_norm},
              "max_score_diff_same_lines": max_diff}
    write_json_atomic(out_dir / "quality_throughput.json", result)
    print(f"documents: {n} en/es/pt ({mb:.1f} MB), model {os.path.getsize(model_path) / 1e6:.0f} MB, median of {args.repeats}")
    print("| scorer | seconds | docs/s | MB/s |\n|---|---:|---:|---:|")
    for k, label in (("ours", "quipu `quality` stage: normalise, batched predict, split"),
                     ("score_only", "quipu `FastTextClassifier.score`: normalise + batched predict"),
                     ("datatrove", "datatrove `FastTextClassifierFilter.filter` per document, raw text"),
                     ("lines_ours", "same normalised lines: quipu batched `multilinePredict`"),
                     ("lines_datatrove", "same normalised lines: datatrove `filter` per document")):
        print(f"| {label} | {med[k]:.2f} | {n / med[k]:,.0f} | {mb / med[k]:.2f} |")
    print(f"\nstage vs datatrove on raw text: {result['ratio_ours_vs_datatrove']}x; on the same normalised lines: "
          f"{result['ratio_same_lines']}x. Kept at 0.5: ours {kept_ours}, datatrove on raw text {kept_dt}, "
          f"datatrove on our lines {kept_dt_norm}; max |score difference| on identical lines: {max_diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
