"""Candidate signals for n-gram-generated text beside the shipped fluency judges, each measured
leave-one-source-out (issue 38): for every es/pt/en source of ../shared/data/text, every model is
fitted on the language's OTHER sources, the source's prose (>= 3 sentences, >= 50 words; first half)
is scored, and so is text sampled from n-gram models (orders 2, 3, 4; synthetic/fluent_junk.py) of its
other half. A signal's cut-off is the `--percentile` of the OTHER sources' prose scores (each scored
by a model fitted without it), so the held-out source never places its own cut-off.

    .venv/bin/python bench/fluency_signals.py [--langs en,es,pt] [--fasttext] [--write]
    .venv/bin/python bench/fluency_signals.py --shapes   # the shipped stage on prose of other shapes

`--shapes`: the shipped config's langid and fluency stages on real prose of other shapes in
../shared/data (the ground-truth article bodies of web/constructed's pages; the paragraphs of every PDF
there as quipu's pdf stage extracts them), prose only (>= 3 sentences, >= 50 words): kept per language and shape.

Signals (higher = more prose-like):
    word_order     the shipped judge (function-word/shape trigram gain over unigram)
    burstiness     the shipped judge (rare-word recurrence, log-likelihood ratio)
    class_gain     per-token log-probability of an order-6 minus an order-3 KenLM model over token
                   classes (300 commonest tokens kept, others shape + last two letters): context
                   beyond a sampled text's order should not help it
    word_gain      the same with word models (order 4 minus order 2, KenLM on CCNet-normalised
                   words), mean over the document; word_window: its 5th-percentile 10-token window
                   (the splice points of a sampled text)
    balance        minus the number of unbalanced pairs ((), [], “”, «», an odd count of ")
    fitted         a logistic regression over all the signals above, fitted on the other sources'
                   held-out scores (prose against generated, each source weighing the same)
    fasttext       (--fasttext) DCLM-style: a fastText classifier (word 2-grams) of the other
                   sources' prose against text sampled from n-gram models (orders 2-4) of each of
                   them and of their pool; minus P(generated), cut at 0.5 (its own decision)
Portuguese: Fake.br's true and fake news count as two sources (Django's catalogues train only).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fluency_models import SHARED_TEXT, SOURCES, is_prose, source_texts  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Fluent junk: candidate signals for n-gram-generated text, leave one source out (`bench/fluency_signals.py`)"
SIGNAL_SOURCES = {**SOURCES, "pt": ["pt_fakebr_news.jsonl#true", "pt_fakebr_news.jsonl#fake", "multi_nltk_genesis.jsonl",
                                    "django:pt"]}
SIGNALS = ("word_order", "burstiness", "class_gain", "word_gain", "word_window", "balance")
PAIRS = (("(", ")"), ("[", "]"), ("“", "”"), ("«", "»"))


def texts_of(name: str, lang: str) -> list[str]:
    if "#" not in name:
        return source_texts(name, lang)
    name, label = name.split("#")
    rows = (json.loads(line) for line in open(SHARED_TEXT / name, encoding="utf-8"))
    return [r["text"] for r in rows if r.get("lang") == lang and r.get("label") == label][:1500]


def class_text(text: str, function_words: frozenset[str]) -> str:
    """Token classes as KenLM words: a common token itself, else its shape and last two letters."""
    from quipu.tasks.fluency import TOKEN
    out = []
    for t in TOKEN.findall(text):
        low = t.lower()
        if low in function_words:
            out.append(low)
        elif t.isdigit():
            out.append("zzn")
        elif t[:1].isupper():
            out.append("zzc")
        else:
            out.append("zzw" + low[-2:] if t[:1].isalpha() else "zzp")
    return " ".join(out)


class ContextGain:
    """Per-token log-probability of a high-order minus a low-order KenLM model (nats)."""

    def __init__(self, lines: list[str], high: int, low: int, tmp: Path, name: str):
        import kenlm
        from quipu.scoring.kenlm_model import train_kenlm
        self.models = []
        for order in (high, low):
            path = tmp / f"{name}-{order}.binary"
            train_kenlm(lines, path, order=order, memory="10%")
            self.models.append(kenlm.Model(str(path)))

    def gains(self, line: str) -> np.ndarray:
        hi, lo = ([p for p, _, _ in m.full_scores(line, bos=True, eos=False)] for m in self.models)
        return (np.array(hi) - np.array(lo)) * math.log(10)


def balance(text: str) -> float:
    return -float(sum(text.count(a) != text.count(b) for a, b in PAIRS) + text.count('"') % 2)


def fasttext_judge(prose: dict[str, list[str]], tmp: Path, rng: random.Random):
    """A fastText classifier of prose against n-gram samples of each source and of their pool."""
    import fasttext
    from quipu.synthetic.fluent_junk import NgramGenerator
    from quipu.trainer.classifier_train import zero_filled_allocations
    from quipu.scoring.kenlm_model import tokenize
    lines = []
    for texts in [*prose.values(), [t for v in prose.values() for t in v]]:
        for order in (2, 3, 4):
            gen = NgramGenerator(texts, order)
            lines += [f"__label__gen {tokenize(gen.generate(rng, rng.randint(60, 250)))}" for _ in range(150)]
    lines += [f"__label__prose {tokenize(t)}" for texts in prose.values() for t in texts[:600]]
    rng.shuffle(lines)
    path = tmp / "fasttext.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with zero_filled_allocations():
        model = fasttext.train_supervised(input=str(path), wordNgrams=2, dim=16, epoch=5, lr=0.05, minCount=2,
                                          bucket=200_000, thread=1, seed=0, verbose=0)
    return lambda text: -dict((label, p) for p, label in model.f.predict(tokenize(text) + "\n", 2, 0.0, "strict")
                              ).get("__label__gen", 0.0)


def fold(lang: str, held: str, texts: dict[str, list[str]], use_fasttext: bool, tmp: Path) -> dict:
    """Scores of the held-out source's prose and generated text under models fitted without it."""
    from collections import Counter
    from quipu.synthetic.fluent_junk import fluent_junk
    from quipu.tasks.fluency import TOKEN, FluencyModel
    from quipu.scoring.kenlm_model import tokenize
    other = [t for n, v in texts.items() if n != held for t in v]
    judges = FluencyModel.fit(lang, other)
    common = frozenset(w for w, _ in Counter(t.lower() for x in other for t in TOKEN.findall(x)).most_common(300))
    classes = ContextGain([class_text(t, common) for t in other], 6, 3, tmp, "class")
    words = ContextGain(other, 4, 2, tmp, "word")
    ft = fasttext_judge({n: [t for t in v if is_prose(t)] for n, v in texts.items() if n != held and not n.startswith("django")},
                        tmp, random.Random(f"ft-{held}")) if use_fasttext else None

    def score(text: str) -> list[float]:
        g = words.gains(tokenize(text))
        windows = np.convolve(g, np.ones(10) / 10, mode="valid") if len(g) >= 10 else g
        row = [judges.word_order(text)[0], judges.burstiness(text), float(classes.gains(class_text(text, common)).mean()),
               float(g.mean()), float(np.percentile(windows, 5)), balance(text)]
        return row + ([ft(text)] if ft else [])
    prose = [t for t in texts[held] if is_prose(t)]
    keep, rest = prose[: len(prose) // 2], prose[len(prose) // 2:]
    generated = [d["text"] for d in fluent_junk(lang, rest, 150, seed=3) if d["kind"] == "generated"]  # orders 2,3,4 in turn
    return {"prose": np.array([score(t) for t in keep]), "generated": np.array([score(t) for t in generated])}


def logistic(X: np.ndarray, y: np.ndarray, w: np.ndarray, l2: float = 1.0, steps: int = 30):
    """Weighted L2-regularised logistic regression (Newton steps) on standardised features: X -> logit."""
    mu, sd = X.mean(0), X.std(0) + 1e-9
    Z = np.c_[np.ones(len(X)), (X - mu) / sd]
    b = np.zeros(Z.shape[1])
    ridge = l2 * np.diag(np.r_[0.0, np.ones(Z.shape[1] - 1)])
    for _ in range(steps):
        p = 1 / (1 + np.exp(-Z @ b))
        b -= np.linalg.solve((Z * (w * p * (1 - p))[:, None]).T @ Z + ridge, Z.T @ (w * (p - y)) + ridge @ b)
    return lambda X: np.c_[np.ones(len(X)), (X - mu) / sd] @ b


def add_fitted(scores: dict[str, dict]) -> None:
    """Append to each held-out source's scores a column: minus the logit of a logistic regression over
    the shipped and candidate signals, fitted on the OTHER sources' held-out scores."""
    k = len(SIGNALS)
    for held, s in scores.items():
        others = [v for n, v in scores.items() if n != held]
        X = np.concatenate([v[c][:, :k] for v in others for c in ("prose", "generated")])
        y = np.concatenate([np.full(len(v[c]), float(c == "generated")) for v in others for c in ("prose", "generated")])
        w = np.concatenate([np.full(len(v[c]), 1 / len(v[c])) for v in others for c in ("prose", "generated")])
        f = logistic(X, y, w * len(X) / w.sum()) if others else (lambda X: np.zeros(len(X)))
        for c in ("prose", "generated"):
            s[c] = np.c_[s[c], -f(s[c][:, :k])]


def table(lang: str, scores: dict[str, dict], signals: list[str]) -> list[str]:
    """Per held-out source and signal: prose kept and generated removed at the other sources' cut-off."""
    rows = []
    burst = signals.index("burstiness")
    pooled = np.zeros((len(signals), 5))      # prose kept, prose, generated removed, generated, removed OR burstiness
    for held, s in scores.items():
        others = [v["prose"] for n, v in scores.items() if n != held]
        cells = []
        for j, name in enumerate(signals):
            cut = -0.5 if name == "fasttext" else (float(np.percentile(np.concatenate(others)[:, j], ARGS.percentile))
                                                    if others else math.nan)
            kept = s["prose"][:, j] >= cut
            removed = s["generated"][:, j] < cut
            union = removed | (s["generated"][:, burst] < float(np.percentile(np.concatenate(others)[:, burst], ARGS.percentile)))
            cells.append(f"{kept.mean():.2f} / {removed.mean():.2f} ({union.mean():.2f})")
            pooled[j] += [kept.sum(), len(kept), removed.sum(), len(removed), union.sum()]
        rows.append(f"| {lang} | {held.removesuffix('.jsonl')} | {len(s['prose'])} | " + " | ".join(cells) + " |")
    cells = [f"**{k / n:.2f} / {r / g:.2f} ({u / g:.2f})**" for k, n, r, g, u in pooled]
    rows.append(f"| {lang} | **all held-out sources** | {int(pooled[0, 1])} | " + " | ".join(cells) + " |")
    return rows


def other_shapes() -> list[str]:
    """Kept by the shipped langid + fluency stages, per language and shape of real prose."""
    from collections import Counter
    import pyarrow as pa
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.tasks.fluency import FluencyFilter
    from quipu.tasks.langid import LanguageId
    config = load_config(CurateConfig, ROOT / "configs" / "curate" / "default.yaml")
    shared = SHARED_TEXT.parent
    truth = shared / "web" / "constructed" / "article-extraction-benchmark-shared.ground_truth.jsonl"
    docs = [("web article bodies", json.loads(line)["articleBody"]) for line in open(truth, encoding="utf-8")]
    from quipu.tasks.reading.pdf import PdfConfig, read_pdf
    for path in sorted((shared / "pdf").glob("*.pdf")):     # quipu's own extraction, paragraphs as documents
        text = read_pdf(str(path), PdfConfig(ocr="never")).text   # text layers only (OCR is slow here)
        docs += [("PDF paragraphs (quipu's extraction)", p) for p in text.split("\n\n")]
    docs = [(shape, t) for shape, t in docs if t and is_prose(t)]
    batch = pa.table({"id": [str(i) for i in range(len(docs))], "text": [t for _, t in docs]})
    lid = LanguageId(config.langid).process(batch).kept
    out = FluencyFilter(config.fluency).process(lid)
    removed = dict(zip(out.removed.column("id").to_pylist(), out.removed.column("reason").to_pylist()))
    total, gone, reasons = Counter(), Counter(), Counter()
    for i, lang in zip(lid.column("id").to_pylist(), lid.column("lang").to_pylist()):
        shape = docs[int(i)][0]
        total[shape, lang] += 1
        gone[shape, lang] += i in removed
        if i in removed:
            reasons[shape, lang, removed[i].split("<")[0]] += 1
    rows = ["| shape | lang | prose documents | kept by fluency | removed by |", "|---|---|---:|---:|---|"]
    for shape, lang in sorted(total):
        why = ", ".join(f"{r} {n}" for (s, l, r), n in sorted(reasons.items()) if (s, l) == (shape, lang)) or "-"
        rows.append(f"| {shape} | {lang} | {total[shape, lang]} | {1 - gone[shape, lang] / total[shape, lang]:.3f} | {why} |")
    return rows


def main() -> int:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--langs", default="en,es,pt")
    ap.add_argument("--percentile", type=float, default=1.5)
    ap.add_argument("--fasttext", action="store_true")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--shapes", action="store_true", help="only the shipped stage on prose of other shapes")
    ARGS = ap.parse_args()
    if ARGS.shapes:
        print("\n".join(other_shapes()))
        return 0
    t0 = time.time()
    signals = [*SIGNALS, *(["fasttext"] if ARGS.fasttext else [])]
    out = ["| lang | held-out source | prose | " + " | ".join([*signals, "fitted"]) + " |",
           "|---|---|---:|" + "---|" * (len(signals) + 1)]
    for lang in ARGS.langs.split(","):
        texts = {n: texts_of(n, lang) for n in SIGNAL_SOURCES[lang]}
        scores = {}
        with tempfile.TemporaryDirectory(prefix="quipu-signals-") as tmp:
            for held in texts:
                if held.startswith("django:"):
                    continue
                scores[held] = fold(lang, held, texts, ARGS.fasttext, Path(tmp))
                print(f"{lang} {held}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
        add_fitted(scores)
        out += table(lang, scores, [*signals, "fitted"])
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    body = "\n".join([SECTION, "", f"`.venv/bin/python bench/fluency_signals.py{' --fasttext' if ARGS.fasttext else ''}` "
                      f"({time.time() - t0:.0f} s; `uptime`: {load}; shared 2-core machine). Each cell: held-out prose kept / "
                      f"generated text (orders 2-4) removed at the cut-off placed at the {ARGS.percentile:g}th percentile of the "
                      "other sources' held-out prose scores (fastText: P(generated) > 0.5), and in brackets removed by it OR "
                      "burstiness at its own such cut-off:", "", *out, ""])
    print(body)
    if ARGS.write:
        from bench.curate_throughput import write_results_section
        write_results_section(RESULTS, SECTION, body)
    return 0


ARGS = argparse.Namespace(percentile=1.5)

if __name__ == "__main__":
    sys.exit(main())
