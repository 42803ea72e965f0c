"""Decontamination throughput with 1 and with 10 benchmark sets: the cost per document must stay flat.

The 10 sets are the two shared benchmarks (GSM8K test, HumanEval) plus 8 more read from them with
different seeds: a seeded half of the items of one of them, with the words of each text shuffled by
that seed, so each set brings its own n-grams and the index really grows about tenfold.
Documents: every document of ../shared/data/text (en/es/pt and others, ~15k, ~26 MB), untouched.

    .venv/bin/python bench/decontam_throughput.py [--shared ../shared/data] [--repeats 3]

Prints a markdown table and writes bench/out/decontam_throughput.json.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quipu.catalog.files import write_json_atomic  # noqa: E402
from quipu.tasks.decontam import DecontamConfig, Decontaminate, get_index  # noqa: E402


def make_registry(shared: Path, out: Path) -> list[str]:
    """Ten benchmark YAMLs (and derived JSONL files) in `out`; returns their names."""
    bench = shared / "benchmarks"
    sources = {"gsm8k": (bench / "gsm8k_test.jsonl", ["text", "answer"]),
               "humaneval": (bench / "humaneval.jsonl", ["text", "solution"])}
    names = []
    for name, (path, fields) in sources.items():
        (out / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "path": str(path), "fields": fields, "id_field": "id"}))
        names.append(name)
    for seed in range(1, 9):
        base = "gsm8k" if seed % 2 else "humaneval"
        path, fields = sources[base]
        rows = [json.loads(line) for line in open(path)]
        rng = random.Random(seed)
        rows = rng.sample(rows, len(rows) // 2)
        derived = []
        for r in rows:
            item = {"id": f"{base}-s{seed}/{r['id']}"}
            for f in fields:
                words = r[f].split()
                rng.shuffle(words)
                item[f] = " ".join(words)
            derived.append(item)
        name = f"{base}_s{seed}"
        (out / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in derived))
        (out / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "path": f"{name}.jsonl", "fields": fields, "id_field": "id"}))
        names.append(name)
    return names


def load_docs(shared: Path) -> pa.Table:
    ids, texts = [], []
    for p in sorted((shared / "text").glob("*.jsonl")):
        for line in open(p):
            d = json.loads(line)
            ids.append(d["id"]); texts.append(d["text"])
    return pa.table({"id": ids, "text": texts})


def measure(cfg: DecontamConfig, docs: pa.Table, repeats: int, batch_rows: int) -> dict:
    t0 = time.perf_counter()
    index = get_index(cfg)
    build_s = time.perf_counter() - t0
    stage = Decontaminate(cfg, index=index)
    runs, flagged = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        flagged = 0
        for i in range(0, docs.num_rows, batch_rows):
            flagged += stage.process(docs.slice(i, batch_rows)).removed.num_rows
        runs.append(time.perf_counter() - t0)
    sec = statistics.median(runs)
    mb = sum(len(t.encode()) for t in docs.column("text").to_pylist()) / 1e6
    return {"benchmarks": len(cfg.benchmarks), "items": len(index.item_ids), "ngram_keys": int(len(index.ngram_keys)),
            "vocab": len(index.vocab), "index_build_s": round(build_s, 2), "docs": docs.num_rows,
            "seconds_median": round(sec, 2), "docs_per_s": round(docs.num_rows / sec), "mb_per_s": round(mb / sec, 2),
            "flagged": flagged, "runs_s": [round(r, 2) for r in runs]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-rows", type=int, default=2000)
    args = ap.parse_args()
    docs = load_docs(args.shared)
    with tempfile.TemporaryDirectory() as tmp:
        reg = Path(tmp) / "registry"
        reg.mkdir()
        names = make_registry(args.shared, reg)
        results = []
        for chosen in (names[:1], names):
            cfg = DecontamConfig(benchmarks=chosen, registry_dir=str(reg), cache_dir=str(Path(tmp) / "cache"))
            results.append(measure(cfg, docs, args.repeats, args.batch_rows))
    write_json_atomic(ROOT / "bench" / "out" / "decontam_throughput.json", results)
    print("| benchmark sets | items | index n-grams | index build s | docs | docs/s | MB/s | flagged |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['benchmarks']} | {r['items']:,} | {r['ngram_keys']:,} | {r['index_build_s']} | {r['docs']:,} | "
              f"{r['docs_per_s']:,} | {r['mb_per_s']} | {r['flagged']} |")
    print(f"\nratio docs/s (10 sets / 1 set): {results[1]['docs_per_s'] / results[0]['docs_per_s']:.2f}")


if __name__ == "__main__":
    main()
