"""Frozen-feature study of issue 20 (bench/RESULTS.md, "Which layers, and matching the teacher's state").

Reads the cache of bench/ppl_features.py and asks, with the teacher's layers frozen and only small
heads trained, on the same 3 leave-source-out folds as bench/ppl_distill.py (each document scored by
heads fitted on the other folds' sources only):

- how well a per-token head on the state after layer L (1, 2, 4) ranks documents like the teacher;
- whether the teacher's final state helps when the student must predict it: a linear map from the
  layer-L state at j - 1 to the teacher's final state at j - 1 (ridge, fitted on the training folds),
  dotted with the embedding of token j, is the teacher's logit of token j as far as layer L can tell;
  with a predicted log-normaliser it is an estimate of the teacher's NLL of token j that costs one
  576 x 576 product per token (a tuned lens without the softmax);
- the same features together in one head.

    python bench/ppl_frozen.py [--variants h2,h2+lens ...] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from quipu.trainer.wayra_train import spearman

ROOT = Path(__file__).parent / "out" / "ppl"
FEATS = ROOT / "feats"


def load_cache(parts: int = 2):
    """Per document: (part, start, length) and the per-part arrays."""
    meta = [np.load(FEATS / f"meta-{p}.npz") for p in range(parts)]
    docs = {}
    for p, m in enumerate(meta):
        for k, d in enumerate(m["doc_index"]):
            docs[int(d)] = (p, int(m["offsets"][k]), int(m["offsets"][k + 1] - m["offsets"][k]))
    return meta, docs


def states(name: str, parts: int = 2) -> list[np.ndarray]:
    return [np.load(FEATS / f"{name}-{p}.npy", mmap_mode="r") for p in range(parts)]


def gather(arrs, docs, doc_ids, shift: int):
    """Rows for target positions j = 1..n-1 of each document: the array at j - shift (shift 0: the
    state at the scored token; 1: at the position that predicts it)."""
    out = []
    for d in doc_ids:
        p, a, n = docs[d]
        out.append(np.asarray(arrs[p][a + 1 - shift:a + n - shift], dtype=np.float32))
    return np.concatenate(out)


def doc_slices(docs, doc_ids):
    lens = [docs[d][2] - 1 for d in doc_ids]
    return np.concatenate([[0], np.cumsum(lens)])


def ridge(x: np.ndarray, y: np.ndarray, lam: float = 1e-3) -> np.ndarray:
    """[W; b] minimising |[x 1] W - y|^2 + lam sum_i g_ii W_i^2 (normal equations accumulated in float64 over
    row chunks: the training rows are ~1M x 576)."""
    d = x.shape[1] + 1
    g = np.zeros((d, d)); c = np.zeros((d, y.shape[1]))
    for a in range(0, len(x), 65536):
        x1 = np.concatenate([x[a:a + 65536], np.ones((len(x[a:a + 65536]), 1), np.float32)], axis=1).astype(np.float64)
        g += x1.T @ x1
        c += x1.T @ y[a:a + 65536].astype(np.float64)
    g[np.arange(d - 1), np.arange(d - 1)] *= 1 + lam      # scale-free: relative to each feature's energy
    return np.linalg.solve(g, c).astype(np.float32)


def apply_ridge(x, w):
    return x @ w[:-1] + w[-1]


def fit_head(x_tr, y_tr, x_te, seed=0, epochs=3, hidden=128, lr=2e-3, batch=4096):
    """A per-token MLP (as the students' head: Linear-GELU-Linear) on standardised features."""
    torch.manual_seed(seed)
    mu, sd = x_tr.mean(0), x_tr.std(0) + 1e-6
    xt = torch.from_numpy((x_tr - mu) / sd)
    ym, ys = y_tr.mean(), y_tr.std()
    yt = torch.from_numpy((y_tr - ym) / ys)
    head = nn.Sequential(nn.Linear(xt.shape[1], hidden), nn.GELU(), nn.Linear(hidden, 1))
    steps = epochs * ((len(xt) + batch - 1) // batch)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    g = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for b in torch.randperm(len(xt), generator=g).split(batch):
            loss = ((head(xt[b]).squeeze(-1) - yt[b]) ** 2).mean()
            opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    with torch.no_grad():
        return head(torch.from_numpy((x_te - mu) / sd)).squeeze(-1).numpy() * ys + ym


def doc_means(values, sl):
    return np.array([values[sl[i]:sl[i + 1]].mean() for i in range(len(sl) - 1)])


VARIANTS = {
    # name: (layer, features)
    "h1": ("h1", ["state"]),
    "h2": ("h2", ["state"]),
    "h4": ("h4", ["state"]),
    "h6": ("h6", ["state"]),
    "h8": ("h8", ["state"]),
    "h12": ("h12", ["state"]),
    "h16": ("h16", ["state"]),
    "h20": ("h20", ["state"]),
    "h2+lens": ("h2", ["state", "lens"]),
    "h2+tuned": ("h2", ["state", "tuned", "lse"]),
    "h4+tuned": ("h4", ["state", "tuned", "lse"]),
    "h1+tuned": ("h1", ["state", "tuned", "lse"]),
    "tuned-only-h2": ("h2", ["tuned_nll"]),
    "final (ceiling check)": ("final", ["state", "lens"]),
    "final+lens+lse (harness check)": ("final", ["lens", "true_lse"]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=128, help="the per-token head's hidden width")
    ap.add_argument("--out", default=str(ROOT / "frozen.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    src = [json.loads(line) for line in open(ROOT / "labelled-all.jsonl")]
    meta, docs = load_cache()
    ids = [m["ids"] for m in meta]
    nll = [m["nll"] for m in meta]
    lse = [m["lse"] for m in meta]
    emb = None
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    folds = sorted({d["fold"] for d in src})
    for name in args.variants.split(","):
        layer, feats = VARIANTS[name]
        t0 = time.time()
        h = states(layer)
        final = states("final") if any(f in ("tuned", "lse", "tuned_nll", "lens") for f in feats) else None
        pred, teach, lang, source = [], [], [], []
        for k in folds:
            tr = [i for i, d in enumerate(src) if d["fold"] != k and i in docs]
            te = [i for i, d in enumerate(src) if d["fold"] == k and i in docs]
            y_tr = gather(nll, docs, tr, 0)
            sl_te = doc_slices(docs, te)
            y_te = gather(nll, docs, te, 0)

            def features(doc_ids, w_state=None, w_lse=None):
                cols = []
                if "state" in feats:
                    cols.append(gather(h, docs, doc_ids, 0))
                tok = gather(ids, docs, doc_ids, 0).astype(np.int64)
                if "lens" in feats or "tuned" in feats or "tuned_nll" in feats:
                    prev = gather(h, docs, doc_ids, 1)
                    e = embeddings()[tok]
                    if "lens" in feats:
                        cols.append(((prev * e).sum(1) / prev.shape[1] ** 0.5)[:, None])
                    if "tuned" in feats or "tuned_nll" in feats:
                        logit = (apply_ridge(prev, w_state) * e).sum(1)
                        z_lse = apply_ridge(prev, w_lse)[:, 0]
                        if "tuned" in feats:
                            cols.append(logit[:, None])
                        if "lse" in feats:
                            cols.append(z_lse[:, None])
                        if "tuned_nll" in feats:
                            cols.append((z_lse - logit)[:, None])
                if "true_lse" in feats:     # the teacher's own log-normaliser: NLL = lse - logit exactly
                    cols.append(gather(lse, docs, doc_ids, 1)[:, None])
                return np.concatenate(cols, axis=1)

            def embeddings():
                nonlocal emb
                if emb is None:
                    from quipu.trainer.teacher import Teacher, TeacherSettings
                    emb = Teacher(None, TeacherSettings(max_tokens=128)).model.get_output_embeddings().weight.detach().float().numpy()
                return emb

            w_state = w_lse = None
            if "tuned" in feats or "tuned_nll" in feats:
                # the hidden-state target: the teacher's final state at j - 1 from the layer-L state at j - 1
                prev_tr = gather(h, docs, tr, 1)
                w_state = ridge(prev_tr, gather(final, docs, tr, 1))
                w_lse = ridge(prev_tr, gather(lse, docs, tr, 1)[:, None])
                del prev_tr
            x_tr, x_te = features(tr, w_state, w_lse), features(te, w_state, w_lse)
            if feats == ["tuned_nll"]:
                p_tok = x_te[:, 0]
            else:
                p_tok = fit_head(x_tr, y_tr, x_te, epochs=args.epochs, hidden=args.hidden)
            pred += list(doc_means(p_tok, sl_te))
            teach += list(doc_means(y_te, sl_te))
            lang += [src[i]["lang"] for i in te]
            source += [src[i]["source"] for i in te]
            print(f"{name}: fold {k} done ({len(te)} docs, {time.time() - t0:.0f}s)", flush=True)
        pred, teach, lang = np.array(pred), np.array(teach), np.array(lang)
        r = {"n": len(pred), "spearman": round(spearman(teach, pred), 4), "seconds": round(time.time() - t0)}
        for lg in ("en", "es", "pt"):
            m = lang == lg
            r[lg] = round(spearman(teach[m], pred[m]), 4)
        key = name if (args.epochs, args.hidden) == (3, 128) else f"{name} (head {args.hidden}, {args.epochs} epochs)"
        results[key] = r
        print(key, r, flush=True)
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
