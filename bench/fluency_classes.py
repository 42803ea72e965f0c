"""A discriminative model over token classes (issue 38, a new idea after burst+copy): a fastText classifier
of prose against n-gram-generated text where every token is its class (the 150 commonest tokens of the
training prose kept, punctuation included; every other word its shape and last two letters, bench/
fluency_signals.py's class_text), so it cannot learn a source's topic words, only word order around the
function words (splice points, clauses a chain leaves open). Leave one whole source out: trained on the
language's OTHER sources' prose (first halves) against text both generators (bench/fluency_context.py's
`demo` and `backoff`) sample from each of their other halves; scored on the held-out source's prose and
generated text. Cut-off: P(generated) at the 98.5th percentile of the OTHER sources' prose second halves
(prose the classifier never trained on), so the held-out source never places it. Also the held-out
source's AUC (prose vs generated, both generators), which needs no cut-off.

    nice -n 5 .venv/bin/python bench/fluency_classes.py --langs es,en,pt --per-kind 100
    nice -n 5 .venv/bin/python bench/fluency_classes.py --langs es --shape-only --ngrams 3 --epoch 3   # a plainer model
"""
from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fluency_context import samples  # noqa: E402
from bench.fluency_models import is_prose  # noqa: E402
from bench.fluency_signals import SIGNAL_SOURCES, class_text, texts_of  # noqa: E402

SUFFIX = re.compile(r"zzw\S*")


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a generated document scores above a prose one): rank separation, no cut-off."""
    allv = np.concatenate([pos, neg])
    ranks = allv.argsort().argsort() + 1.0
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def classifier(lines: list[str], tmp: Path, args):
    import fasttext
    from quipu.trainer.classifier_train import zero_filled_allocations
    path = tmp / "classes.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with zero_filled_allocations():
        model = fasttext.train_supervised(input=str(path), wordNgrams=args.ngrams, dim=16, epoch=args.epoch, lr=0.2, minCount=2,
                                          bucket=500_000, thread=1, seed=0, verbose=0)
    return lambda text: dict((label, p) for p, label in model.f.predict(text + "\n", 2, 0.0, "strict")).get("__label__gen", 0.0)


def run_lang(lang: str, args, tmp: Path) -> list[str]:
    from quipu.tasks.fluency import TOKEN
    texts = {n: texts_of(n, lang) for n in SIGNAL_SOURCES[lang] if not n.startswith("django")}
    gen = {n: samples(lang, n, v, args.per_kind) for n, v in texts.items()}
    rows = []
    for held in texts:
        others = [n for n in texts if n != held]
        fw = frozenset(w for w, _ in Counter(t.lower() for n in others for x in gen[n]["prose"]
                                             for t in TOKEN.findall(x)).most_common(150))
        cls = (lambda x: SUFFIX.sub("zzw", class_text(x, fw))) if args.shape_only else (lambda x: class_text(x, fw))
        rng = random.Random(f"classes-{lang}-{held}")
        lines = [f"__label__prose {cls(x)}" for n in others for x in gen[n]["prose"][:600]]
        lines += [f"__label__gen {cls(x)}" for n in others for k in ("demo", "backoff") for x in gen[n][k]]
        rng.shuffle(lines)
        p_gen = classifier(lines, tmp, args)
        # prose the classifier never saw: the other sources' second halves
        unseen = [x for n in others for x in [t for t in texts[n] if is_prose(t)][len(gen[n]["prose"]):][:300]]
        cut = np.percentile([p_gen(cls(x)) for x in unseen], 100 - args.percentile)
        s = {k: np.array([p_gen(cls(x)) for x in gen[held][k]]) for k in ("prose", "demo", "backoff")}
        a = auc(np.concatenate([s["demo"], s["backoff"]]), s["prose"])
        rows.append(f"| {lang} | {held.removesuffix('.jsonl')} | {len(s['prose'])} | {(s['prose'] <= cut).mean():.2f} / "
                    f"{(s['demo'] > cut).mean():.2f} / {(s['backoff'] > cut).mean():.2f} | {a:.2f} | {cut:.3f} |")
        print(rows[-1], f"{time.time() - T0:.0f} s", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--langs", default="es,en,pt")
    ap.add_argument("--per-kind", type=int, default=100)
    ap.add_argument("--percentile", type=float, default=1.5)
    ap.add_argument("--ngrams", type=int, default=4, help="fastText wordNgrams over the classes")
    ap.add_argument("--epoch", type=int, default=10)
    ap.add_argument("--shape-only", action="store_true", help="other words as their shape only (no last two letters)")
    args = ap.parse_args()
    out = ["| lang | held-out source | prose | prose kept / demo removed / backoff removed | AUC | cut P(gen) |",
           "|---|---|---:|---|---:|---:|"]
    with tempfile.TemporaryDirectory(prefix="quipu-classes-") as tmp:
        for lang in args.langs.split(","):
            out += run_lang(lang, args, Path(tmp))
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{time.time() - T0:.0f} s; uptime: {load}")
    print("\n".join(out))
    return 0


T0 = time.time()

if __name__ == "__main__":
    sys.exit(main())
