"""More cheap candidate signals for n-gram-generated text (issue 38), leave one whole source out, both
generators of bench/fluency_context.py (`demo`: synthetic/fluent_junk.py's stream NgramGenerator,
orders 2-4; `backoff`: its BackoffSentenceGenerator, orders 3 and 5). Every model is fitted on the
language's OTHER sources; a signal's direction and cut-off (the `--percentile` of prose) come from the
other sources' prose only, so the held-out source never places its own cut-off.

Signals (computed on tasks/fluency.py's TOKEN tokens, lower-cased):
    pair_llr     long-range function-word statistics: every pair (a, b) of function tokens (the 150
                 commonest tokens, punctuation included) 4-12 tokens apart, scored log P_prose(b | a, gap)
                 - log P_chance(b | a, gap), where P_prose is counted on the reference prose and P_chance on
                 text sampled from a trigram model of the same reference (the burstiness judge's trick: what
                 a chain gives beyond its reach). Mean over the document's pairs. (¿..?, «..», "not only ..
                 but", "si .. entonces", a subordinator needing its verb: dependencies past a chain's order.)
    pair_sum     the same summed (evidence, nats; grows with length as burstiness does)
    rep6         share of the document's token 6-grams that occurred earlier in it (a narrow-source chain
                 that revisits a state copies the continuation)
    copy2/copy4  among positions whose 2- (4-) token context occurred earlier in the document, the share
                 whose next token repeats a continuation seen after it; copy_gain = copy4 - copy2 (a chain
                 forgets beyond its order, prose's repeated phrases continue alike)
    start_rep    share of sentences whose first two tokens opened an earlier sentence of the document
    ref6         share of the document's token 6-grams found in the reference (other sources) 6-gram set
    burst+pair   the shipped burstiness (nats) plus pair_sum (nats): two log-likelihood ratios of prose
                 against chain-sampled text, summed as naive Bayes would
    copy_llr     copy2 as evidence (nats), burstiness's way: each repeated 2-token context a Bernoulli event,
                 hit rate of the reference prose against that of trigram-sampled reference text
    burst+copy   burstiness plus copy_llr
Each cell: prose kept / demo removed / backoff removed; `+b`: removed by the signal OR the shipped
burstiness judge (refitted without the source, each at its own cut-off); `joint`: the signal and
burstiness cut together at half the prose budget each.

    nice .venv/bin/python bench/fluency_longrange.py --langs es,pt,en --dump lr.pkl
    .venv/bin/python bench/fluency_longrange.py --table-from lr.pkl      # per source and pooled, each signal alone
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fluency_context import samples  # noqa: E402
from bench.fluency_signals import SIGNAL_SOURCES, texts_of  # noqa: E402

NAMES = ("pair_llr", "pair_sum", "rep6", "copy2", "copy4", "copy_gain", "start_rep", "ref6", "burst+pair",
         "copy_llr", "burst+copy")
GAPS = range(4, 13)


def tokens(text: str) -> list[str]:
    from quipu.tasks.fluency import TOKEN
    return [t.lower() for t in TOKEN.findall(text)]


class PairModel:
    """P(b | a, gap bucket) of function tokens 4-12 apart, in prose and in trigram-sampled text."""

    def __init__(self, texts: list[str], function_words: frozenset[str], seed: int = 0):
        import random
        from quipu.tasks.fluency import NgramGenerator
        self.fw = function_words
        rng = random.Random(seed)
        gen = NgramGenerator(texts, 3)
        chance = [gen.generate(rng, rng.randint(60, 250)) for _ in range(max(300, len(texts) // 2))]
        self.prose, self.chance = self.count(texts), self.count(chance)
        rate = lambda xs: max(1e-3, min(0.999, (lambda h: h[0] / max(1, h[1]))(np.sum([copy_counts(tokens(x), 2) for x in xs], 0))))
        self.copy_rates = rate(texts), rate(chance)     # prose's and a chain's rate of repeated continuations
        uni = Counter(t for x in texts for t in tokens(x) if t in function_words)
        total = sum(uni.values())
        self.uni = {w: c / total for w, c in uni.items()}

    @staticmethod
    def bucket(gap: int) -> int:
        return 0 if gap <= 6 else 1

    def pairs(self, text: str):
        toks = tokens(text)
        pos = [(i, t) for i, t in enumerate(toks) if t in self.fw]
        for j, (i, a) in enumerate(pos):
            for i2, b in pos[j + 1:]:
                gap = i2 - i
                if gap > GAPS[-1]:
                    break
                if gap >= GAPS[0]:
                    yield a, b, self.bucket(gap)

    def count(self, texts: list[str]) -> tuple[Counter, Counter]:
        pair, ctx = Counter(), Counter()
        for x in texts:
            for a, b, k in self.pairs(x):
                pair[a, b, k] += 1
                ctx[a, k] += 1
        return pair, ctx

    def logp(self, table: tuple[Counter, Counter], a: str, b: str, k: int, alpha: float = 20.0) -> float:
        pair, ctx = table
        return math.log((pair.get((a, b, k), 0) + alpha * self.uni.get(b, 1e-6)) / (ctx.get((a, k), 0) + alpha))

    def score(self, text: str) -> tuple[float, float]:
        s = [self.logp(self.prose, a, b, k) - self.logp(self.chance, a, b, k) for a, b, k in self.pairs(text)]
        return (float(np.mean(s)) if s else 0.0), float(np.sum(s))


def copy_counts(toks: list[str], length: int) -> tuple[int, int]:
    """(positions whose `length`-token context occurred earlier and whose next token repeats a continuation
    seen after it, positions whose context occurred earlier)."""
    seen: dict[tuple, set] = {}
    hits = n = 0
    for i in range(length, len(toks)):
        ctx = tuple(toks[i - length:i])
        cont = seen.get(ctx)
        if cont is not None:
            n += 1
            hits += toks[i] in cont
            cont.add(toks[i])
        else:
            seen[ctx] = {toks[i]}
    return hits, n


def copy_rate(toks: list[str], length: int) -> float:
    hits, n = copy_counts(toks, length)
    return hits / n if n else 0.0


def copy_llr(toks: list[str], rates: tuple[float, float]) -> float:
    """Evidence (nats) that repeated contexts continue alike at prose's rate rather than a chain's."""
    hits, n = copy_counts(toks, 2)
    q1, q0 = rates
    return hits * math.log(q1 / q0) + (n - hits) * math.log((1 - q1) / (1 - q0))


def grams(toks: list[str], n: int) -> list[tuple]:
    return [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]


def repetition(text: str) -> list[float]:
    from quipu.tasks.fluency import sentences
    toks = tokens(text)
    g6 = grams(toks, 6)
    seen: set = set()
    rep = 0
    for g in g6:
        rep += g in seen
        seen.add(g)
    starts = [tuple(tokens(s)[:2]) for s in sentences(text)]
    start_rep = sum(s in set(starts[:i]) for i, s in enumerate(starts)) / max(1, len(starts))
    c2, c4 = copy_rate(toks, 2), copy_rate(toks, 4)
    return [rep / max(1, len(g6)), c2, c4, c4 - c2, start_rep]


def signals(text: str, pair: PairModel, ref6: set) -> list[float]:
    g6 = grams(tokens(text), 6)
    found = sum(hash(g) in ref6 for g in g6) / max(1, len(g6))
    return [*pair.score(text), *repetition(text), found, copy_llr(tokens(text), pair.copy_rates)]


def cut_rows(lang: str, scores: dict, pct: float) -> list[str]:
    rows = []
    for held, s in scores.items():
        others = [v for n, v in scores.items() if n != held]
        bref = np.concatenate([v["burst"]["prose"] for v in others])
        bcut, bhalf = np.percentile(bref, pct), np.percentile(bref, pct / 2)
        cells = [f"{(s['burst']['prose'] >= bcut).mean():.2f} / {(s['burst']['demo'] < bcut).mean():.2f} / "
                 f"{(s['burst']['backoff'] < bcut).mean():.2f}"]
        for j in range(len(NAMES)):
            ref = np.concatenate([v["prose"][:, j] for v in others])
            gen = np.concatenate([v[k][:, j] for v in others for k in ("demo", "backoff")])
            sign = 1.0 if np.median(ref) >= np.median(gen) else -1.0
            cut, half = np.percentile(sign * ref, pct), np.percentile(sign * ref, pct / 2)
            part = []
            for k in ("prose", "demo", "backoff"):
                x, b = sign * s[k][:, j], s["burst"][k]
                alone, union, joint = x < cut, (x < cut) | (b < bcut), (x < half) | (b < bhalf)
                if k == "prose":
                    part.append(f"{1 - alone.mean():.2f}/{1 - union.mean():.2f}/{1 - joint.mean():.2f}")
                else:
                    part.append(f"{alone.mean():.2f}/{union.mean():.2f}/{joint.mean():.2f}")
            cells.append(("" if sign > 0 else "(-) ") + " ; ".join(part))
        rows.append(f"| {lang} | {held.removesuffix('.jsonl')} | {len(s['prose'])} | " + " | ".join(cells) + " |")
    return rows


def load_dump(path: str) -> list[dict]:
    import pickle
    rows = []
    with open(path, "rb") as fh:
        while True:
            try:
                rows.append(pickle.load(fh))
            except EOFError:
                return rows


def column(row: dict, name: str, kind: str) -> np.ndarray:
    return row["burst"][kind] if name == "burstiness" else row[kind][:, NAMES.index(name)]


def pooled_table(path: str, pct: float, names=("burstiness", "pair_llr", "pair_sum", "copy2", "copy_gain", "burst+pair",
                                               "copy_llr", "burst+copy")) -> list[str]:
    """Per source and pooled per language (each source cut by the OTHER sources' prose, as above): prose kept /
    demo removed / backoff removed, one signal alone."""
    rows = load_dump(path)
    out = ["| lang | held-out source | prose | " + " | ".join(names) + " |", "|---|---|---:|" + "---|" * len(names)]
    for lang in dict.fromkeys(r["lang"] for r in rows):
        group = [r for r in rows if r["lang"] == lang]
        if len(group) < 2:      # nothing to place a cut-off with
            continue
        pooled = {n: np.zeros((2, 3)) for n in names}
        for r in group:
            cells = []
            for name in names:
                ref = np.concatenate([column(o, name, "prose") for o in group if o is not r])
                gen = np.concatenate([column(o, name, k) for o in group if o is not r for k in ("demo", "backoff")])
                sign = 1.0 if np.median(ref) >= np.median(gen) else -1.0
                cut = np.percentile(sign * ref, pct)
                hit = [(sign * column(r, name, "prose") >= cut)] + [sign * column(r, name, k) < cut for k in ("demo", "backoff")]
                pooled[name] += [[h.sum() for h in hit], [len(h) for h in hit]]
                cells.append(("(-) " if sign < 0 else "") + " / ".join(f"{h.mean():.2f}" for h in hit))
            out.append(f"| {lang} | {r['held'].removesuffix('.jsonl')} | {len(r['prose'])} | " + " | ".join(cells) + " |")
        out.append(f"| {lang} | **pooled** | {int(pooled[names[0]][1, 0])} | " + " | ".join(
            " / ".join(f"{a / b:.2f}" for a, b in zip(*pooled[n])) for n in names) + " |")
    return out


def run_lang(lang: str, args) -> list[str]:
    from quipu.tasks.fluency import FluencyModel
    texts = {n: texts_of(n, lang) for n in SIGNAL_SOURCES[lang]}
    scores = {}
    for held in (n for n in texts if not n.startswith("django")):
        other = [t for n, v in texts.items() if n != held for t in v]
        judges = FluencyModel.fit(lang, other)
        pair = PairModel(other, judges.function_words)
        ref6 = {hash(g) for t in other for g in grams(tokens(t), 6)}
        s = samples(lang, held, texts[held], args.per_kind)
        scores[held] = {k: np.array([signals(t, pair, ref6) for t in v]) for k, v in s.items()}
        scores[held]["burst"] = {k: np.array([judges.burstiness(t) for t in v]) for k, v in s.items()}
        for k in s:     # burst+pair: the two log-likelihood ratios (nats) summed, naive Bayes
            b, x = scores[held]["burst"][k], scores[held][k]
            scores[held][k] = np.column_stack([x[:, :8], b + x[:, 1], x[:, 8], b + x[:, 8]])
        print(f"  copy rates prose {pair.copy_rates[0]:.3f} chance {pair.copy_rates[1]:.3f}", file=sys.stderr)
        if args.dump:
            import pickle
            with open(args.dump, "ab") as fh:
                pickle.dump({"lang": lang, "held": held, **scores[held]}, fh)
        print(f"{lang} {held}: {time.time() - T0:.0f} s", file=sys.stderr, flush=True)
        if args.medians:
            for j, name in enumerate(NAMES):
                print(f"  {name}: " + " ".join(f"{k} {np.median(scores[held][k][:, j]):.3f}"
                                                for k in ("prose", "demo", "backoff")), file=sys.stderr)
    rows = cut_rows(lang, scores, args.percentile)
    print("\n".join(rows), file=sys.stderr, flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--langs", default="en,es,pt")
    ap.add_argument("--percentile", type=float, default=1.5)
    ap.add_argument("--per-kind", type=int, default=50, help="generated documents per generator and source")
    ap.add_argument("--dump", default="", help="append each source's scores (pickles) to this file")
    ap.add_argument("--medians", action="store_true", help="print each source's median scores to stderr")
    ap.add_argument("--table-from", default="", help="print the per-source and pooled table of a --dump file and stop")
    args = ap.parse_args()
    if args.table_from:
        print("\n".join(pooled_table(args.table_from, args.percentile)))
        return 0
    out = ["| lang | held-out source | prose | burstiness alone | " + " | ".join(NAMES) + " |",
           "|---|---|---:|" + "---|" * (len(NAMES) + 1)]
    for lang in args.langs.split(","):
        out += run_lang(lang, args)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{time.time() - T0:.0f} s; uptime: {load}")
    print("cell: prose kept alone/+b/joint ; demo removed alone/+b/joint ; backoff removed alone/+b/joint")
    print("\n".join(out))
    return 0


T0 = time.time()

if __name__ == "__main__":
    sys.exit(main())
