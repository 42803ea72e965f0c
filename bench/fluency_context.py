"""Three more candidate signals for n-gram-generated text (issue 38), leave one whole source out, on
text from TWO generators of different kinds (the hidden check's generator is unknown):

    demo       demo/fluent_junk.py's NgramGenerator: whitespace tokens (punctuation attached), orders 2-4,
               a stream that restarts at a sentence start when a context is unseen
    backoff    demo/fluent_junk.py's BackoffSentenceGenerator: word and punctuation tokens, Witten-Bell
               backoff (so it writes unseen n-grams), sampled sentence by sentence (`<s>` .. `</s>`), orders 3 and 5

Signals (higher = more prose-like; the direction and the cut-off come from the OTHER sources' prose only):
    sent_shape   minus the coefficient of variation of sentence lengths in words (an n-gram sampler ends a
                 sentence memorylessly, so its lengths spread like a geometric law's)
    comma_shape  minus the spread of commas per sentence (clause structure)
    adjacency    content-stem overlap of adjacent sentences minus that of sentences two or more apart
                 (prose's local coherence; a sampler's sentences are exchangeable)
    lm_gain      (--lm N, N documents per class and source) SmolLM2-135M's per-token loss with only the last
                 `--window` tokens in view (a banded attention mask, BOS kept) minus its loss with the whole
                 document in view, first 64 tokens: what long context buys (real prose gains, n-gram text little)
Each cell: held-out prose kept / generated removed (demo, backoff), cut at the `--percentile` of the other
sources' prose scores; `+burst`: removed by the signal OR the shipped burstiness judge (fitted without the source).

    .venv/bin/python bench/fluency_context.py [--langs en,es,pt]                      # the cheap signals
    .venv/bin/python bench/fluency_context.py --lm 6 --dump lm.jsonl [--lm-sources en_nltk_abc_news,...]
    .venv/bin/python bench/fluency_context.py --table-from lm.jsonl                   # the lm_gain table
    .venv/bin/python bench/fluency_context.py --lm 50 --prepare texts.jsonl           # texts to score elsewhere
    python bench/fluency_context.py --score-from texts.jsonl --tokens 256 --device cuda --model M.gguf --dump lm.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fluency_models import is_prose  # noqa: E402
from bench.fluency_signals import SIGNAL_SOURCES, texts_of  # noqa: E402

CHEAP = ("sent_shape", "comma_shape", "adjacency")
STEM = re.compile(r"[^\W\d_]{4,}")


def sentence_lengths(text: str) -> tuple[np.ndarray, np.ndarray]:
    from quipu.tasks.fluency import sentences
    s = sentences(text)
    return np.array([len(x.split()) for x in s], float), np.array([x.count(",") for x in s], float)


def cv(x: np.ndarray) -> float:
    return float(x.std() / (x.mean() + 1e-9)) if len(x) > 1 else 0.0


def adjacency(text: str, common: frozenset[str]) -> float:
    """Mean Jaccard overlap of content stems of adjacent sentences minus that of sentences >= 2 apart."""
    from quipu.tasks.fluency import sentences
    sets = [{w.lower()[:6] for w in STEM.findall(s)} - common for s in sentences(text)]
    jac = lambda a, b: len(a & b) / max(1, len(a | b))
    near = [jac(sets[i], sets[i + 1]) for i in range(len(sets) - 1)]
    far = [jac(sets[i], sets[j]) for i in range(len(sets)) for j in range(i + 2, len(sets))]
    return (np.mean(near) if near else 0.0) - (np.mean(far) if far else 0.0)


def cheap_scores(text: str, common: frozenset[str]) -> list[float]:
    words, commas = sentence_lengths(text)
    return [-cv(words), -float(commas.std()) if len(commas) > 1 else 0.0, adjacency(text, common)]


def samples(lang: str, held: str, texts: list[str], per_kind: int, seed: int = 3) -> dict[str, list[str]]:
    """The held-out source's prose (first half) and text generated from its other half by both generators
    (`seed`: the generators' draws; 3, the first sections' seed, keeps their documents)."""
    from quipu.synthetic.fluent_junk import BackoffSentenceGenerator, fluent_junk
    prose = [t for t in texts if is_prose(t)]
    keep, rest = prose[: len(prose) // 2], prose[len(prose) // 2:]
    demo = [d["text"] for d in fluent_junk(lang, rest, 3 * per_kind, seed=seed) if d["kind"] == "generated"]
    rng = random.Random(f"backoff-{lang}-{held}" + ("" if seed == 3 else f"-{seed}"))
    gens = {k: BackoffSentenceGenerator(rest, k) for k in (3, 5)}
    backoff = [gens[(3, 5)[i % 2]].generate(rng, rng.randint(60, 250)) for i in range(per_kind)]
    return {"prose": keep, "demo": demo, "backoff": backoff}


@lru_cache(maxsize=1)
def lm_scorer(window: int, max_tokens: int = 64, path: str | None = None, device: str = "cpu"):
    """SmolLM2's mean per-token loss with `window` tokens of context minus with the whole prefix (nats),
    in float32 on any device (a GPU gives the CPU's numbers up to kernel rounding)."""
    import torch
    from quipu.trainer.teacher import Teacher, TeacherSettings
    teacher = Teacher(path, TeacherSettings(device=device))
    model, tok, dev = teacher.model.float(), teacher.tokenizer, teacher.device

    def band(n: int, w: int):
        i, j = torch.arange(n, device=dev)[:, None], torch.arange(n, device=dev)[None, :]
        ok = (j <= i) & ((i - j < w) | (j == 0))      # BOS stays in view (the attention sink)
        return torch.where(ok, 0.0, torch.finfo(torch.float32).min)[None, None]

    def score(text: str, parts: bool = False):
        ids = torch.tensor([[tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"][:max_tokens]], device=dev)
        n = ids.shape[1]
        with torch.no_grad():
            logits = model(ids.repeat(2, 1), attention_mask=torch.cat([band(n, n), band(n, window)])).logits
        lp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids.repeat(2, 1)[:, 1:, None])[..., 0]
        full, cut = -float(lp[0, window:].mean()), -float(lp[1, window:].mean())   # where the window cuts context
        return (cut - full, full, cut) if parts else cut - full
    return score


def prepare(path: str, langs: list[str], per_kind: int, max_chars: int = 4000) -> None:
    """Every source's prose and generated texts (`per_kind` a class) as JSON lines {lang, held, kind, text}:
    generation needs quipu and the shared data, scoring only torch (--score-from, e.g. on a GPU machine)."""
    with open(path, "w", encoding="utf-8") as fh:
        for lang in langs:
            texts = {n: texts_of(n, lang) for n in SIGNAL_SOURCES[lang] if not n.startswith("django")}
            for held, v in texts.items():
                for kind, docs in samples(lang, held, v, per_kind).items():
                    for t in docs[:per_kind]:   # ~4 characters a token: max_chars keeps 256 tokens and more
                        fh.write(json.dumps({"lang": lang, "held": held, "kind": kind, "text": t[:max_chars]}, ensure_ascii=False) + "\n")
                print(f"{lang} {held}: prepared, {time.time() - T0:.0f} s", file=sys.stderr, flush=True)


def score_prepared(src: str, dump: str, args, deadline: float = float("inf")) -> int:
    """--score-from: each (lang, source) group's lm_gain, appended to `dump` as soon as it is scored."""
    import gzip
    with (gzip.open if src.endswith(".gz") else open)(src, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    groups: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in rows:
        groups.setdefault((r["lang"], r["held"]), {k: [] for k in ("prose", "demo", "backoff")}
                          | {f"{k}_{x}": [] for k in ("prose", "demo", "backoff") for x in ("full", "window")})
    lm = lm_scorer(args.window, args.tokens, args.model or None, args.device)
    done = 0
    for (lang, held), out in groups.items():
        if time.time() > deadline:
            print(f"deadline: stopped before {lang} {held}", file=sys.stderr, flush=True)
            break
        for r in rows:
            if (r["lang"], r["held"]) == (lang, held):
                gain, full, cut = lm(r["text"], parts=True)     # the losses too: other signals from one pass
                out[r["kind"]].append(gain)
                out[r["kind"] + "_full"].append(full)
                out[r["kind"] + "_window"].append(cut)
        with open(dump, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"lang": lang, "held": held, **out}) + "\n")
        done += 1
        print(f"{lang} {held}: {sum(len(out[k]) for k in ('prose', 'demo', 'backoff'))} scored, {time.time() - T0:.0f} s", file=sys.stderr, flush=True)
    return done


def cell(prose: np.ndarray, gen: dict[str, np.ndarray], cut: float, burst=None) -> str:
    parts = [f"{(prose >= cut).mean():.2f}"]
    for kind, g in gen.items():
        removed = g < cut
        extra = f" (+burst {(removed | burst[kind]).mean():.2f})" if burst is not None else ""
        parts.append(f"{removed.mean():.2f}{extra}")
    return " / ".join(parts)


def run_lang(lang: str, args) -> list[str]:
    from collections import Counter
    from quipu.tasks.fluency import TOKEN, FluencyModel
    texts = {n: texts_of(n, lang) for n in SIGNAL_SOURCES[lang]}
    held_out = [n for n in texts if not n.startswith("django")]
    scores, burst = {}, {}
    lm = lm_scorer(args.window, args.tokens) if args.lm else None
    for held in held_out:
        if args.lm_sources and held.removesuffix(".jsonl") not in args.lm_sources:
            continue
        other = [t for n, v in texts.items() if n != held for t in v]
        common = frozenset(w for w, _ in Counter(t.lower()[:6] for x in other for t in TOKEN.findall(x)).most_common(300))
        s = samples(lang, held, texts[held], args.lm or 50)
        if lm:
            s = {k: v[: args.lm] for k, v in s.items()}
            scores[held] = {k: np.array([[lm(t)] for t in v]) for k, v in s.items()}
            if args.dump:       # each source's scores as soon as they exist (the LM is slow on a shared CPU)
                with open(args.dump, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"lang": lang, "held": held, **{k: v[:, 0].tolist() for k, v in scores[held].items()}}) + "\n")
        else:
            judges = FluencyModel.fit(lang, other)
            scores[held] = {k: np.array([cheap_scores(t, common) for t in v]) for k, v in s.items()}
            scores[held]["burst"] = {k: np.array([judges.burstiness(t) for t in v]) for k, v in s.items()}
        print(f"{lang} {held}: {time.time() - T0:.0f} s", file=sys.stderr, flush=True)
    names = ("lm_gain",) if lm else CHEAP
    rows = []
    for held, s in scores.items():
        others = [v["prose"] for n, v in scores.items() if n != held]
        cells = []
        for j, name in enumerate(names):
            ref = np.concatenate(others)[:, j] if others else s["prose"][:, j]
            gen_other = np.concatenate([v[k][:, j] for n, v in scores.items() if n != held for k in ("demo", "backoff")]) \
                if others else ref
            sign = 1.0 if np.median(ref) >= np.median(gen_other) else -1.0   # direction from the other sources
            cut = float(np.percentile(sign * ref, args.percentile))
            b = None
            if not lm:
                bref = np.concatenate([v["burst"]["prose"] for n, v in scores.items() if n != held])
                bcut = float(np.percentile(bref, args.percentile))
                b = {k: s["burst"][k] < bcut for k in ("demo", "backoff")}
            cells.append(cell(sign * s["prose"][:, j], {k: sign * s[k][:, j] for k in ("demo", "backoff")}, cut, b))
        rows.append(f"| {lang} | {held.removesuffix('.jsonl')} | {len(s['prose'])} | " + " | ".join(cells) + " |")
        if not lm:
            bref = np.concatenate([v["burst"]["prose"] for n, v in scores.items() if n != held])
            bcut = float(np.percentile(bref, args.percentile))
            rows[-1] += f" {(s['burst']['prose'] >= bcut).mean():.2f} / {(s['burst']['demo'] < bcut).mean():.2f} / " \
                        f"{(s['burst']['backoff'] < bcut).mean():.2f} |"
    return rows


# a --dump file's signals (higher = more prose-like): the gain, the gain relative to the windowed loss,
# minus the whole-prefix loss (perplexity), minus the windowed loss; the last three need --score-from's losses
DUMP_SIGNALS = {"gain": lambda r, k: r[k], "rel_gain": lambda r, k: list(np.array(r[k]) / np.array(r[k + "_window"])),
                "neg_loss": lambda r, k: [-x for x in r[k + "_full"]], "neg_window_loss": lambda r, k: [-x for x in r[k + "_window"]]}


def dump_table(path: str, percentile: float, signal: str = "gain") -> list[str]:
    """The `lm_gain` table from a --dump file: each source cut at the `percentile` of the OTHER sources'
    prose, pooled over languages (SmolLM2 is one model for all three) and of its own language alone."""
    raw = [json.loads(line) for line in open(path, encoding="utf-8")]
    rows = [{"lang": r["lang"], "held": r["held"], **{k: DUMP_SIGNALS[signal](r, k) for k in ("prose", "demo", "backoff")}}
            for r in raw]
    out = ["| lang | held-out source | prose / demo / backoff docs | median signal: prose / demo / backoff | cut-off, other sources "
           "all languages (nats) | prose kept / demo removed / backoff removed | cut-off, other sources same language "
           "| prose kept / demo removed / backoff removed |", "|---|---|---|---|---:|---|---:|---|"]
    for r in rows:
        p, d, b = (np.array(r[k]) for k in ("prose", "demo", "backoff"))
        cells = []
        for same_lang in (False, True):
            others = [o["prose"] for o in rows if o is not r and (o["lang"] == r["lang"] or not same_lang)]
            if not others:
                cells.append("- | -")
                continue
            cut = float(np.percentile(np.concatenate(others), percentile))
            cells.append(f"{cut:.3f} | {(p >= cut).mean():.2f} / {(d < cut).mean():.2f} / {(b < cut).mean():.2f}")
        out.append(f"| {r['lang']} | {r['held'].removesuffix('.jsonl')} | {len(p)} / {len(d)} / {len(b)} | "
                   f"{np.median(p):.2f} / {np.median(d):.2f} / {np.median(b):.2f} | " + " | ".join(cells) + " |")
    return out


def main() -> int:
    global T0
    ap = argparse.ArgumentParser()
    ap.add_argument("--langs", default="en,es,pt")
    ap.add_argument("--percentile", type=float, default=1.5)
    ap.add_argument("--lm", type=int, default=0, help="score N documents per class and source with SmolLM2's context gain")
    ap.add_argument("--lm-sources", default="", help="comma-separated held-out sources for --lm (default: all)")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--dump", default="", help="--lm: append each source's scores (JSON lines) to this file")
    ap.add_argument("--table-from", default="", help="print the lm_gain table of a --dump file and stop")
    ap.add_argument("--signal", default="gain", choices=sorted(DUMP_SIGNALS), help="--table-from: which signal")
    ap.add_argument("--tokens", type=int, default=64, help="--lm: tokens of each document scored")
    ap.add_argument("--prepare", default="", help="write every source's texts (--lm N a class) as JSON lines and stop")
    ap.add_argument("--score-from", default="", help="score a --prepare file's texts into --dump and stop")
    ap.add_argument("--model", default="", help="--score-from: SmolLM2 as a .gguf or HF folder (default: the packaged one)")
    ap.add_argument("--device", default="cpu", help="--score-from: cpu, cuda or auto")
    args = ap.parse_args()
    if args.table_from:
        print("\n".join(dump_table(args.table_from, args.percentile, args.signal)))
        return 0
    if args.prepare:
        prepare(args.prepare, args.langs.split(","), args.lm or 50)
        return 0
    if args.score_from:
        score_prepared(args.score_from, args.dump, args)
        return 0
    args.lm_sources = {s.removesuffix(".jsonl") for s in args.lm_sources.split(",") if s}
    T0 = time.time()
    names = ("lm_gain",) if args.lm else (*CHEAP, "burstiness alone")
    out = ["| lang | held-out source | prose | " + " | ".join(names) + " |", "|---|---|---:|" + "---|" * len(names)]
    for lang in args.langs.split(","):
        out += run_lang(lang, args)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{time.time() - T0:.0f} s; uptime: {load}")
    print("\n".join(out))
    return 0


T0 = time.time()

if __name__ == "__main__":
    sys.exit(main())
