"""A small student's context gain on n-gram-generated text (issue 38), leave whole sources out.

SmolLM2-135M's context gain (bench/fluency_context.py `--lm`: per-token loss with only the last 8 tokens in
view minus with the whole prefix in view) separated generated text from prose within a source, at ~300x the
default's cost. This bench asks whether a SMALL Llama-style model (trainer/llama.py: a few layers, a BPE of a
few thousand tokens, 128-token sequences) trained on CPU in minutes on reference prose gives the same signal at
crawl speed.

Protocol (cross-fitted, two folds): every held-out source of bench/fluency_signals.py's SIGNAL_SOURCES (en 6,
es 4, pt 3; django:pt is only ever training text) sits in fold 0 or 1 (FOLDS); one multilingual model (and its
BPE) is trained per fold on every source NOT in that fold, so each source is scored only by a model that never
saw it. Documents (bench/fluency_context.py's `samples`, seed 3, the same draws as the earlier sections): the
source's prose first half, `--per-kind` texts from each generator (`demo`: the stream NgramGenerator, orders
2-4; `backoff`: the Witten-Bell sentence sampler, orders 3 and 5) trained on its other half. A source is cut at
the `--percentile` of the OTHER same-language sources' prose scores (each from the model that did not see it).
Signals (higher = more prose-like): `gain` (windowed minus whole-prefix loss, nats a token, over the positions
where the window cuts context), `rel_gain` (gain / windowed loss), `neg_loss` (minus the whole-prefix loss).
`+burst`: removed by the signal OR the shipped burstiness judge refitted without the source (its scores read
from session 13's dump, `--burst`, on the same documents).

    nice -n 10 .venv/bin/python bench/fluency_student.py --work /tmp/student       # train both folds, score, table
    .venv/bin/python bench/fluency_student.py --work /tmp/student --table-only    # the table from the scores
"""
from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.fluency_context import samples  # noqa: E402
from bench.fluency_signals import SIGNAL_SOURCES, texts_of  # noqa: E402

# each held-out source's fold; both Genesis translations together (same content), each language in both folds
FOLDS = {("en", "en_nltk_abc_news.jsonl"): 0, ("en", "en_nltk_shakespeare.jsonl"): 0, ("en", "multi_nltk_genesis.jsonl"): 0,
         ("en", "en_nltk_movie_reviews.jsonl"): 1, ("en", "en_nltk_speeches.jsonl"): 1, ("en", "en_ud_ewt_web.jsonl"): 1,
         ("es", "es_nltk_cess_esp_news.jsonl"): 0, ("es", "es_activ_es_subtitles.jsonl"): 0,
         ("es", "es_nltk_conll2002_efe_news.jsonl"): 1, ("es", "es_gutenberg_quijote.jsonl"): 1,
         ("pt", "pt_fakebr_news.jsonl#true"): 0, ("pt", "multi_nltk_genesis.jsonl"): 0, ("pt", "pt_fakebr_news.jsonl#fake"): 1}
KINDS = ("prose", "demo", "backoff")
SIGNALS = ("gain", "rel_gain", "neg_loss")


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.0f} s] {msg}", file=sys.stderr, flush=True)


def prepare(work: Path, per_kind: int) -> tuple[dict, dict]:
    """All texts per (lang, source) and the evaluation documents per held-out source (cached as JSON)."""
    cache = work / "docs.json"
    if cache.exists():
        d = json.loads(cache.read_text())
        return {tuple(k.split("|")): v for k, v in d["texts"].items()}, {tuple(k.split("|")): v for k, v in d["eval"].items()}
    texts = {(lang, n): texts_of(n, lang) for lang in ("en", "es", "pt") for n in SIGNAL_SOURCES[lang]}
    ev = {}
    for (lang, n), v in texts.items():
        if (lang, n) in FOLDS:
            s = samples(lang, n, v, per_kind)
            ev[(lang, n)] = {k: s[k][:per_kind] if k != "prose" else s[k] for k in KINDS}
            log(f"{lang} {n}: {len(ev[(lang, n)]['prose'])} prose documents")
    cache.write_text(json.dumps({"texts": {"|".join(k): v for k, v in texts.items()},
                                 "eval": {"|".join(k): v for k, v in ev.items()}}, ensure_ascii=False))
    return texts, ev


def band_mask(n: int, window: int):
    """(n, n) boolean: causal, only the last `window` tokens and BOS (the attention sink) in view."""
    import torch
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & ((i - j < window) | (j == 0))


def run_layers(model, ids, mask):
    """trainer/llama.py's Llama.hidden with an explicit attention mask (B, 1, T, T) -> logits."""
    cos, sin = model.rotary(None, ids.shape[1])
    x = model.embed_tokens(ids)
    for layer in model.layers:
        x = layer(x, cos, sin, mask)
    return model.lm_head(model.norm(x))


def train_fold(fold: int, train_texts: list[str], args, work: Path):
    """A BPE and a small Llama on the fold's training text: 128-token chunks from each document's start
    (BOS first); a quarter of the steps with the banded mask, so the windowed loss is in distribution."""
    import torch
    import torch.nn.functional as F
    from quipu.trainer.llama import Llama, ModelConfig, pad_vocab
    from quipu.trainer.tokenizer import BOS, train_bpe
    torch.manual_seed(fold)
    t0 = time.process_time()
    from tokenizers import Tokenizer
    resume = Path(args.resume) if args.resume else None
    tok = Tokenizer.from_file(str(resume / f"fold{fold}.tokenizer.json")) if resume else train_bpe(train_texts, args.vocab, 2)
    tok.save(str(work / f"fold{fold}.tokenizer.json"))
    bos = tok.token_to_id(BOS)
    chunks = []
    for enc in tok.encode_batch(train_texts):
        ids = enc.ids
        for s in range(0, min(len(ids), args.chunks_per_doc * (args.seq - 1)), args.seq - 1):
            piece = ids[s: s + args.seq - 1]
            if len(piece) >= 16:
                chunks.append([bos] + piece)
    log(f"fold {fold}: BPE {tok.get_vocab_size()} tokens, {len(chunks)} chunks, {sum(map(len, chunks)):,} tokens "
        f"({time.process_time() - t0:.0f} CPU-s)")
    cfg = ModelConfig(vocab_size=pad_vocab(tok.get_vocab_size()), dim=args.dim, n_layers=args.layers,
                      n_heads=args.heads, max_seq_len=args.seq)
    model = Llama(cfg)
    if resume:      # more steps on a saved fold (a fresh warm-up and cosine): a point on the learning curve
        model.load_state_dict(torch.load(resume / f"fold{fold}.pt"))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = random.Random(fold)
    band = band_mask(args.seq, args.window)[None, None]
    causal = band_mask(args.seq, args.seq)[None, None]
    model.train()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        batch = [rng.choice(chunks) for _ in range(args.batch)]
        ids = torch.zeros(args.batch, args.seq, dtype=torch.long)
        tgt = torch.full((args.batch, args.seq), -100, dtype=torch.long)
        for b, c in enumerate(batch):
            ids[b, :len(c)] = torch.tensor(c)
            tgt[b, :len(c) - 1] = torch.tensor(c[1:])
        logits = run_layers(model, ids, band if rng.random() < 0.25 else causal)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            log(f"fold {fold}: step {step} loss {loss.item():.3f} ({time.process_time() - t0:.0f} CPU-s)")
    torch.save(model.state_dict(), work / f"fold{fold}.pt")
    (work / f"fold{fold}.json").write_text(json.dumps({"cfg": cfg.model_dump(), "cpu_s": time.process_time() - t0,
                                                       "params": model.num_params()}))
    return tok, model.eval()


def scorer(tok, model, args):
    """score(texts) -> (n, 3) array: gain, whole-prefix loss, windowed loss over the first `--tokens` tokens,
    both masks in one batched pass (documents right-padded; padding never enters a mean)."""
    import torch
    import torch.nn.functional as F
    from quipu.trainer.tokenizer import BOS
    bos = tok.token_to_id(BOS)

    def score(texts: list[str]) -> np.ndarray:
        out = []
        for s in range(0, len(texts), args.score_batch):
            encs = [[bos] + e.ids[: args.tokens] for e in tok.encode_batch(texts[s: s + args.score_batch])]
            T = max(len(e) for e in encs)
            ids = torch.zeros(len(encs), T, dtype=torch.long)
            for b, e in enumerate(encs):
                ids[b, :len(e)] = torch.tensor(e)
            mask = torch.cat([band_mask(T, T)[None, None].expand(len(encs), 1, T, T),
                              band_mask(T, args.window)[None, None].expand(len(encs), 1, T, T)])
            with torch.no_grad():
                logits = run_layers(model, ids.repeat(2, 1), mask)
                nll = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids.repeat(2, 1)[:, 1:], reduction="none")
            for b, e in enumerate(encs):
                n = len(e) - 1
                if n <= args.window:
                    out.append((0.0, float("nan"), float("nan")))
                    continue
                full, cut = float(nll[b, args.window:n].mean()), float(nll[len(encs) + b, args.window:n].mean())
                out.append((cut - full, full, cut))
        return np.array(out)
    return score


def signal(a: np.ndarray, name: str) -> np.ndarray:
    gain, full, cut = a[:, 0], a[:, 1], a[:, 2]
    return {"gain": gain, "rel_gain": gain / np.maximum(cut, 1e-6), "neg_loss": -full}[name]


def load_burst(path: str) -> dict:
    from bench.fluency_longrange import load_dump
    return {(r["lang"], r["held"]): r["burst"] for r in load_dump(path)} if path and Path(path).exists() else {}


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a prose document's signal is above a generated one's), ties half."""
    pos, neg = pos[~np.isnan(pos)], neg[~np.isnan(neg)]
    return float(((pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()))


def table(scores: dict, burst: dict, pct: float) -> list[str]:
    """Per source and pooled per language: prose kept / demo removed / backoff removed for each signal alone,
    `(+b ...)` OR'ed with burstiness, and burstiness alone; cut-offs from the other same-language sources."""
    head = "| lang | held-out source | prose / demo / backoff docs | median gain: prose / demo / backoff | AUC gain: demo / backoff | " + \
           " | ".join(f"{s} (+burst)" for s in SIGNALS) + " | burstiness alone |"
    out = [head, "|---|---|---|---|---|" + "---|" * (len(SIGNALS) + 1)]
    for lang in ("es", "pt", "en"):
        group = [k for k in scores if k[0] == lang]
        if len(group) < 2:      # no other source to place a cut-off with
            continue
        pooled = {n: np.zeros((2, 3)) for n in (*SIGNALS, *(s + "+b" for s in SIGNALS), "burst")}
        for key in group:
            r = scores[key]
            others = [k for k in group if k != key]
            b = burst.get(key)
            if b is not None:   # the dump scored every prose document of the half; this bench its first --max-prose
                b = {k: np.asarray(v)[: len(r[k])] for k, v in b.items()}
            bcut = np.percentile(np.concatenate([np.asarray(burst[k]["prose"])[: len(scores[k]["prose"])] for k in others]), pct) if b is not None else None
            cells = []
            for name in SIGNALS:
                ref = np.concatenate([signal(scores[k]["prose"], name) for k in others])
                cut = np.nanpercentile(ref, pct)
                hit = [signal(r["prose"], name) >= cut] + [~(signal(r[k], name) >= cut) for k in ("demo", "backoff")]
                pooled[name] += [[h.sum() for h in hit], [len(h) for h in hit]]
                cell = " / ".join(f"{h.mean():.2f}" for h in hit)
                if b is not None and all(len(b[k]) == len(r[k]) for k in KINDS):
                    hb = [hit[0] & (np.asarray(b["prose"]) >= bcut)] + \
                         [hit[i + 1] | (np.asarray(b[k]) < bcut) for i, k in enumerate(("demo", "backoff"))]
                    pooled[name + "+b"] += [[h.sum() for h in hb], [len(h) for h in hb]]
                    cell += " (+b " + " / ".join(f"{h.mean():.2f}" for h in hb) + ")"
                cells.append(cell)
            if b is not None:
                hb = [np.asarray(b["prose"]) >= bcut] + [np.asarray(b[k]) < bcut for k in ("demo", "backoff")]
                pooled["burst"] += [[h.sum() for h in hb], [len(h) for h in hb]]
                cells.append(" / ".join(f"{h.mean():.2f}" for h in hb))
            else:
                cells.append("-")
            med = " / ".join(f"{np.nanmedian(r[k][:, 0]):.2f}" for k in KINDS) + " | " + \
                " / ".join(f"{auc(r['prose'][:, 0], r[k][:, 0]):.2f}" for k in ("demo", "backoff"))
            out.append(f"| {lang} | {key[1].removesuffix('.jsonl')} | {' / '.join(str(len(r[k])) for k in KINDS)} | {med} | "
                       + " | ".join(cells) + " |")
        frac = lambda n: " / ".join(f"{a / max(c, 1):.2f}" for a, c in zip(*pooled[n]))
        out.append(f"| {lang} | **pooled** | {' / '.join(str(int(x)) for x in pooled['gain'][1])} | | | "
                   + " | ".join(f"{frac(s)} (+b {frac(s + '+b')})" for s in SIGNALS) + f" | {frac('burst')} |")
    return out


def load_fold(work: Path, fold: int):
    import torch
    from tokenizers import Tokenizer
    from quipu.trainer.llama import Llama, ModelConfig
    model = Llama(ModelConfig(**json.loads((work / f"fold{fold}.json").read_text())["cfg"]))
    model.load_state_dict(torch.load(work / f"fold{fold}.pt"))
    return Tokenizer.from_file(str(work / f"fold{fold}.tokenizer.json")), model.eval()


def speed(tok, model, texts: list[str], args) -> float:
    """Documents per CPU-second on one thread (tokenising included): documents/s/core, whatever the load."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    score = scorer(tok, model, args)
    score(texts[:args.score_batch])                 # warm-up
    t = time.process_time()
    score(texts)
    dt = time.process_time() - t
    torch.set_num_threads(threads)
    return len(texts) / dt


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--per-kind", type=int, default=50)
    ap.add_argument("--percentile", type=float, default=1.5)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=127, help="tokens of each document scored (after BOS)")
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--chunks-per-doc", type=int, default=4)
    ap.add_argument("--max-prose", type=int, default=150, help="the held-out prose half's first N documents scored")
    ap.add_argument("--score-batch", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--burst", default="/work/notes/fluency_longrange-wt38n-s13.pkl",
                    help="session 13's bench/fluency_longrange.py dump: burstiness per document, fitted without the source")
    ap.add_argument("--folds", default="0,1", help="the folds to train and score")
    ap.add_argument("--resume", default="", help="a --work folder whose fold models (and BPEs) training continues from")
    ap.add_argument("--speed-only", action="store_true", help="documents/s/core of the saved fold models and stop")
    ap.add_argument("--table-only", action="store_true")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    scores_path = work / "scores.json"
    if args.speed_only:     # documents/s/core of the saved fold models, on the held-out prose
        _, ev = prepare(work, args.per_kind)
        sample = [t for key in FOLDS for t in ev[key]["prose"]][:512]
        for fold in map(int, args.folds.split(",")):
            tok, model = load_fold(work, fold)
            print(f"fold {fold}: {speed(tok, model, sample, args):.0f} documents per CPU-second on one thread "
                  f"({args.tokens} tokens, both masks, {len(sample)} documents)")
        return 0
    if not args.table_only:
        texts, ev = prepare(work, args.per_kind)
        scores = {}
        for fold in map(int, args.folds.split(",")):
            train = [t for k, v in texts.items() if FOLDS.get(k, -1) != fold for t in v]
            tok, model = train_fold(fold, train, args, work)
            score = scorer(tok, model, args)
            for key in (k for k, f in FOLDS.items() if f == fold):
                scores[key] = {k: score(ev[key][k][: args.max_prose] if k == "prose" else ev[key][k]) for k in KINDS}
                log(f"fold {fold} {key}: median gain " + " / ".join(f"{np.nanmedian(scores[key][k][:, 0]):.3f}" for k in KINDS))
            sample = [t for key in FOLDS for t in ev[key]["prose"]][:512]
            dps = speed(tok, model, sample, args)
            log(f"fold {fold}: {dps:.0f} documents/s on one thread ({args.tokens} tokens, both masks)")
            meta = json.loads((work / f"fold{fold}.json").read_text()) | {"docs_per_s_1thread": dps}
            (work / f"fold{fold}.json").write_text(json.dumps(meta))
        scores_path.write_text(json.dumps({"|".join(k): {kk: vv.tolist() for kk, vv in v.items()} for k, v in scores.items()}))
    raw = json.loads(scores_path.read_text())
    scores = {tuple(k.split("|")): {kk: np.array(vv, float) for kk, vv in v.items()} for k, v in raw.items()}
    burst = load_burst(args.burst)
    for fold in map(int, args.folds.split(",")):
        meta = json.loads((work / f"fold{fold}.json").read_text())
        print(f"fold {fold}: {meta['params']:,} parameters, {meta['cpu_s'] / 60:.1f} CPU-min training, "
              f"{meta.get('docs_per_s_1thread', 0):.0f} documents/s on one thread (as measured in the run)")
    print(f"{time.time() - T0:.0f} s; uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print("\n".join(table(scores, burst, args.percentile)))
    return 0


T0 = time.time()

if __name__ == "__main__":
    sys.exit(main())
