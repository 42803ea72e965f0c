"""`burst+copy` checked on more text (issue 38): the shipped burstiness evidence alone against burstiness
plus `copy_llr` (each repeated two-token context a Bernoulli event, prose's continuation-repeat rate
against a trigram chain's; the rates fitted as the burstiness judge fits its repeat rates, on the
reference and on 300 texts sampled from a trigram model of it, seed 0), leave one whole source
out exactly as bench/fluency_longrange.py does: every model fitted on the language's OTHER sources; the
held-out source's prose (>= 3 sentences, >= 50 words; first half) kept or not at the `--percentile` of
the OTHER sources' prose scores; text generated from its other half by both generators of
bench/fluency_context.py (`demo`: the stream NgramGenerator, orders 2-4; `backoff`: the sentence
sampler with Witten-Bell backoff, orders 3 and 5), `--per-kind` documents per generator, source and
seed, for each of `--seeds`.

    nice -n 5 .venv/bin/python bench/fluency_copy.py --langs es,pt,en --per-kind 150 --seeds 3,4,5 --dump copy.pkl
    .venv/bin/python bench/fluency_copy.py --table-from copy.pkl
"""
from __future__ import annotations

import argparse
import math
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fluency_context import samples  # noqa: E402
from bench.fluency_longrange import load_dump  # noqa: E402
from bench.fluency_signals import SIGNAL_SOURCES, texts_of  # noqa: E402

KINDS = ("prose", "demo", "backoff")
JUDGES = ("burstiness", "burst+copy")


def capped(n: int, hits: int, most: int = 50) -> tuple[float, float]:
    """A document's (events, hits) scaled to at most `most` events, so that no one document (a chain
    caught in a loop, "printing, copies, printing, copies, ...") sets a pooled rate."""
    return (n, hits) if n <= most else (most, hits * most / n)


def copy_counts(text: str, length: int = 2) -> tuple[int, int]:
    """(positions whose `length`-token context occurred earlier in the text, how many of them continue
    with a token already seen after that context). Prose's recurring phrases continue alike; a chain
    picks each continuation afresh. A run of one repeated token ("!!!!", "-----", "ha ha ha") counts
    once: layout, not phrasing (one such run would otherwise outweigh every phrase of a document, and
    of a fitted rate)."""
    from quipu.tasks.fluency import TOKEN
    toks: list[str] = []
    for t in TOKEN.findall(text):
        t = t.lower()
        if not toks or t != toks[-1]:
            toks.append(t)
    seen: dict[tuple[str, ...], set[str]] = {}
    hits = n = 0
    for i in range(length, len(toks)):
        ctx = tuple(toks[i - length:i])
        after = seen.get(ctx)
        if after is None:
            seen[ctx] = {toks[i]}
        else:
            n += 1
            hits += toks[i] in after
            after.add(toks[i])
    return n, hits


def copy_rates(texts: list[str]) -> dict[str, float]:
    """Pooled (capped) continuation-repeat rate of the reference and of 300 texts sampled from a trigram
    model of it (seed 0; the burstiness judge's chance texts)."""
    import random
    from quipu.tasks.fluency import NgramGenerator
    rng = random.Random(0)
    generator = NgramGenerator(texts, 3)
    chance = [generator.generate(rng, rng.randint(60, 250)) for _ in range(300)]
    pooled = lambda pairs: sum(r for _, r in pairs) / max(1, sum(n for n, _ in pairs))
    rate = lambda xs: round(min(0.999, max(1e-3, pooled([capped(*copy_counts(x)) for x in xs]))), 4)
    return {"prose": rate(texts), "chance": rate(chance)}


def copy_evidence(text: str, rates: dict[str, float]) -> float:
    """Evidence (nats) that the document's repeated contexts continue alike at prose's rate, not a chain's."""
    n, hits = copy_counts(text)
    q1, q0 = rates["prose"], rates["chance"]
    return hits * math.log(q1 / q0) + (n - hits) * math.log((1 - q1) / (1 - q0))


def run_lang(lang: str, args) -> None:
    from quipu.tasks.fluency import FluencyModel
    texts = {n: texts_of(n, lang) for n in SIGNAL_SOURCES[lang]}
    for held in (n for n in texts if not n.startswith("django")):
        other = [t for n, v in texts.items() if n != held for t in v]
        model, rates = FluencyModel.fit(lang, other), copy_rates(other)
        for seed in args.seeds:
            s = samples(lang, held, texts[held], args.per_kind, seed)
            row = {"lang": lang, "held": held, "seed": seed, "copy_rates": rates}
            for kind in KINDS:
                burst = np.array([model.burstiness(t) for t in s[kind]])
                row[kind] = np.column_stack([burst, burst + np.array([copy_evidence(t, rates) for t in s[kind]])])
            with open(args.dump, "ab") as fh:
                pickle.dump(row, fh)
            print(f"{lang} {held} seed {seed}: {len(s['demo'])}/{len(s['backoff'])} generated, copy rates "
                  f"{rates}, {time.time() - T0:.0f} s", file=sys.stderr, flush=True)


def table(path: str, pct: float) -> list[str]:
    """Per language, source and seed: prose kept / demo removed / backoff removed for each judge alone, each
    held-out source cut at `pct` of the other sources' prose (same seed); pooled over sources per seed, and
    over sources and seeds."""
    rows = load_dump(path)
    out = ["| lang | held-out source | seed | prose | demo | backoff | burstiness | burst+copy |", "|---|---|---|---:|---:|---:|---|---|"]
    for lang in dict.fromkeys(r["lang"] for r in rows):
        total = {j: np.zeros((2, 3)) for j in range(len(JUDGES))}
        per_source: dict[str, dict] = {}
        for seed in dict.fromkeys(r["seed"] for r in rows if r["lang"] == lang):
            group = [r for r in rows if r["lang"] == lang and r["seed"] == seed]
            if len(group) < 2:      # nothing to place a cut-off with (a run still under way)
                continue
            pooled = {j: np.zeros((2, 3)) for j in range(len(JUDGES))}
            for r in group:
                cells = []
                for j in range(len(JUDGES)):
                    cut = np.percentile(np.concatenate([o["prose"][:, j] for o in group if o is not r]), pct)
                    hit = [r["prose"][:, j] >= cut, r["demo"][:, j] < cut, r["backoff"][:, j] < cut]
                    counts = np.array([[h.sum() for h in hit], [len(h) for h in hit]])
                    pooled[j] += counts
                    per_source.setdefault(r["held"], {}).setdefault(j, np.zeros((2, 3)))
                    per_source[r["held"]][j] += counts
                    cells.append(" / ".join(f"{h.mean():.2f}" for h in hit))
                out.append(f"| {lang} | {r['held'].removesuffix('.jsonl')} | {seed} | {len(r['prose'])} | {len(r['demo'])} | "
                           f"{len(r['backoff'])} | " + " | ".join(cells) + " |")
            out.append(f"| {lang} | **pooled** | {seed} | " + " | ".join(str(int(x)) for x in pooled[0][1]) + " | "
                       + " | ".join(" / ".join(f"{a / b:.2f}" for a, b in zip(*pooled[j])) for j in pooled) + " |")
            for j in pooled:
                total[j] += pooled[j]
        for held, counts in per_source.items():
            out.append(f"| {lang} | {held.removesuffix('.jsonl')} | all | " + " | ".join(str(int(x)) for x in counts[0][1]) + " | "
                       + " | ".join(" / ".join(f"{a / b:.2f}" for a, b in zip(*counts[j])) for j in counts) + " |")
        out.append(f"| {lang} | **pooled, all seeds** | all | " + " | ".join(str(int(x)) for x in total[0][1]) + " | "
                   + " | ".join(" / ".join(f"**{a / b:.3f}**" for a, b in zip(*total[j])) for j in total) + " |")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--langs", default="es,pt,en")
    ap.add_argument("--percentile", type=float, default=1.5)
    ap.add_argument("--per-kind", type=int, default=150, help="generated documents per generator, source and seed")
    ap.add_argument("--seeds", default="3,4,5", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--dump", default="copy.pkl", help="append each (source, seed)'s scores (pickles) to this file")
    ap.add_argument("--table-from", default="", help="print the table of a --dump file and stop")
    args = ap.parse_args()
    if not args.table_from:
        for lang in args.langs.split(","):
            run_lang(lang, args)
        load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        print(f"{time.time() - T0:.0f} s; uptime: {load}")
    print("cell: prose kept / demo removed / backoff removed")
    print("\n".join(table(args.table_from or args.dump, args.percentile)))
    return 0


T0 = time.time()

if __name__ == "__main__":
    sys.exit(main())
