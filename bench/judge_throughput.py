"""Judges' speed beside their anchors, in one run (issue 38, item 7):

- `hf_judge` (quipu.scoring.hf_classifier: tokenise once, length-sorted batches, truncation at the
  model's maximum) vs plain transformers `pipeline("text-classification")` (batch_size 32, the
  documents in input order) on the same model and documents. The model has FineWeb-Edu's
  classifier's shape (BERT-base: 12 layers, 768 wide, 512 positions, one regression output) with
  random weights and a WordPiece vocabulary trained here on the documents: the real checkpoints are
  not on this machine, and speed depends on the shape, not the weights. Scores are checked equal.
- the labelling flow (`label_documents`) against `quipu serve-labeller` over HTTP on the shipped
  SmolLM2-135M-Instruct, vs the same prompts through the same model's `generate` in-process: what
  HTTP, retries bookkeeping and the store cost.

The fastText judges (`quality`, `edu`, `news`: one `FastTextFilter` code path) against datatrove's
`FastTextClassifierFilter` are bench/quality_throughput.py.

    .venv/bin/python bench/judge_throughput.py [--docs 48] [--label-docs 4] [--threads 2]

On a GPU machine the same comparisons (and batched generation) run in bench/gpu_measure.py.

Prints a markdown table and writes bench/out/judge_throughput.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from quipu.catalog.files import write_json_atomic  # noqa: E402


def documents(shared: Path, n: int) -> list[dict]:
    """The first n en/es/pt documents of each language of ../shared/data/text, interleaved."""
    from quipu.trainer.text_source import read_documents
    docs = read_documents([str(shared / "text" / "*.jsonl")], ["en", "es", "pt"], min_chars=200)
    by_lang = {lang: [d for d in docs if d["lang"] == lang] for lang in ("en", "es", "pt")}
    out = [d for group in zip(*by_lang.values()) for d in group]
    return out[:n]


def bert_base_classifier(folder: Path, texts: list[str]) -> Path:
    """FineWeb-Edu's classifier's shape with random weights and a WordPiece vocabulary from `texts`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast
    tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece()
    tk.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=30522, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"],
                                                            show_progress=False))
    cls, sep = tk.token_to_id("[CLS]"), tk.token_to_id("[SEP]")
    tk.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                                  sep_token="[SEP]", model_max_length=512)
    torch.manual_seed(0)
    BertForSequenceClassification(BertConfig(vocab_size=tk.get_vocab_size(), num_labels=1)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def bench_hf_judge(docs: list[dict], threads: int, work: Path) -> list[dict]:
    import torch
    from transformers import pipeline

    from quipu.scoring.hf_classifier import HfClassifier
    torch.set_num_threads(threads)
    texts = [d["text"] for d in docs]
    folder = bert_base_classifier(work / "bert-base", texts)
    ours = HfClassifier(folder, device="cpu", batch_size=32)
    pipe = pipeline("text-classification", model=str(folder), tokenizer=str(folder), device=-1, function_to_apply="none")
    ours.score(texts[:4])
    pipe(texts[:4], truncation=True, max_length=512)   # warm both
    a, ta = timed(lambda: ours.score(texts))
    print(f"hf_judge: {len(texts)} documents in {ta:.1f} s", flush=True)
    b, tb = timed(lambda: [r["score"] for r in pipe(texts, batch_size=32, truncation=True, max_length=512)])
    print(f"pipeline: {len(texts)} documents in {tb:.1f} s", flush=True)
    diff = max(abs(x - y) for x, y in zip(a, b))
    return [{"judge": "hf_judge (BERT-base shape)", "scorer": "quipu HfClassifier.score: length-sorted batches of 32",
             "docs": len(texts), "seconds": ta, "max_abs_diff_vs_anchor": diff},
            {"judge": "hf_judge (BERT-base shape)", "scorer": "transformers pipeline, batch_size 32 (anchor)",
             "docs": len(texts), "seconds": tb}]


def bench_labelling(docs: list[dict], threads: int, work: Path) -> list[dict]:
    from quipu.trainer.label_server import Generator, make_server
    from quipu.trainer.llm_labels import LabelConfig, label_documents
    gen = Generator(None, device="cpu", threads=threads)
    server = make_server(gen, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    inp = work / "label-in.jsonl"
    inp.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    cfg = LabelConfig(endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1", input=[str(inp)], output=str(work / "labels"),
                      max_chars=1500, max_tokens=48, concurrency=2, progress_every_s=30)
    try:
        report, t_flow = timed(lambda: label_documents(cfg, log=lambda m: print("  " + m, flush=True)))
    finally:
        server.shutdown()
        server.server_close()
    prompts = [cfg.prompt(d["lang"]).replace("{text}", d["text"][:cfg.max_chars]) for d in docs]
    _, t_direct = timed(lambda: [gen.complete([{"role": "user", "content": p}], cfg.max_tokens) for p in prompts])
    c = report["this_run"]
    scored = sum(s["scored"] for s in report["by_lang"].values())
    return [{"judge": "LLM labels (SmolLM2-135M-Instruct, 48 answer tokens)", "scorer": "quipu label -> serve-labeller over HTTP",
             "docs": len(docs), "seconds": t_flow, "tokens_in": c["tokens_in"], "tokens_out": c["tokens_out"],
             "per_1000_docs": c["per_1000_docs"], "scored": scored},
            {"judge": "LLM labels (SmolLM2-135M-Instruct, 48 answer tokens)", "scorer": "same prompts, model.generate in-process (anchor)",
             "docs": len(docs), "seconds": t_direct}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--docs", type=int, default=48)
    ap.add_argument("--label-docs", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-labelling", action="store_true")
    args = ap.parse_args()
    docs = documents(Path(args.shared), max(args.docs, args.label_docs))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rows += bench_hf_judge(docs[:args.docs], args.threads, Path(tmp))
        if not args.skip_labelling:
            rows += bench_labelling(docs[:args.label_docs], args.threads, Path(tmp))
    print(f"\n{args.threads} torch threads\n\n| judge | scorer | docs | seconds | docs/s | docs/s per core |\n|---|---|---:|---:|---:|---:|")
    for r in rows:
        r["docs_per_s"] = r["docs"] / r["seconds"]
        r["docs_per_s_per_core"] = r["docs_per_s"] / args.threads
        print(f"| {r['judge']} | {r['scorer']} | {r['docs']} | {r['seconds']:.1f} | {r['docs_per_s']:.2f} | {r['docs_per_s_per_core']:.2f} |")
    print("\n" + json.dumps([{k: v for k, v in r.items() if k in ("scorer", "max_abs_diff_vs_anchor", "tokens_in", "tokens_out",
                                                                      "per_1000_docs", "scored")} for r in rows], indent=1))
    out = ROOT / "bench" / "out" / "judge_throughput.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, {"threads": args.threads, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
