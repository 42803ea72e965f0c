"""The ablation's result: per-variant table (tokens seen, documents and unique tokens available,
epochs, held-out BPB mean ± std over seeds per language and per source, differences to the
baselines with a significance note, documents and tokens kept per language), the invariants every
run must share, `OUT/ablate.json`, `OUT/ablate.md`, the plot `OUT/ablate.png` and the Prefect
artifact `ablate-results`. The baselines: the first variant, and `raw` and `full` where present.

A difference is called significant when it exceeds twice the seed standard deviation (the two
variants' standard deviations pooled); with one seed there is no spread to compare against. Runs of
two variants with the same seed start from the same weights, so the per-seed differences are also
reported (`paired_std`, `significant_paired`: mean beyond twice their std, `same_sign_seeds`).
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from quipu.catalog.files import atomic_path

BASELINES = ("raw", "full")


def baselines(variants: list[str]) -> list[str]:
    """What every variant is compared with: the first variant, then `raw` and `full` if present."""
    return list(dict.fromkeys([variants[0], *(b for b in BASELINES if b in variants)]))


def mean_std(xs: list[float], seeds: list[int]) -> dict:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None, "n": len(xs),
            "values": xs, "seeds": seeds}


def compare(a: dict, b: dict) -> dict:
    """a - b (BPB: negative is better) with the pooled seed std and whether it exceeds twice that;
    and, since runs with the same seed start from the same weights, the per-seed (paired)
    differences: their std, whether their mean exceeds twice that, and how many agree in sign."""
    delta = a["mean"] - b["mean"]
    out = {"delta": delta, "pooled_std": None, "significant": None,
           "paired_std": None, "significant_paired": None, "same_sign_seeds": None}
    if a["std"] is None or b["std"] is None:
        return out
    pooled = math.sqrt((a["std"] ** 2 + b["std"] ** 2) / 2)
    out.update(pooled_std=pooled, significant=abs(delta) > 2 * pooled)
    pa, pb = dict(zip(a["seeds"], a["values"])), dict(zip(b["seeds"], b["values"]))
    diffs = [pa[s] - pb[s] for s in pa if s in pb]
    if len(diffs) > 1:
        sd = statistics.stdev(diffs)
        mean = statistics.fmean(diffs)
        out.update(paired_std=sd, significant_paired=abs(mean) > 2 * sd,
                   same_sign_seeds=f"{sum((d < 0) == (mean < 0) for d in diffs)}/{len(diffs)}")
    return out


def build_results(config, out: Path, variants: dict, runs: list[dict], heldout, tree, sizing, timings: dict, tok,
                  overlap) -> dict:
    table = {}
    for name, info in variants.items():
        rs = [r for r in runs if r["variant"] == name]
        blend = rs[0]["blend"][0] if rs[0]["blend"] else {}
        seeds = [r["seed"] for r in rs]
        bpb: dict[str, dict] = {"all": mean_std([r["bpb"]["all"]["bpb"] for r in rs], seeds)}
        for group in ("by_lang", "by_source"):
            keys = sorted(rs[0]["bpb"][group])
            bpb[group] = {k: mean_std([r["bpb"][group][k]["bpb"] for r in rs], seeds) for k in keys}
        available = blend.get("available_tokens")
        table[name] = {
            "stages": info["stages"], "dataset": info["dataset"], "documents": info["documents"],
            "curated_bytes": info["bytes"], "available_tokens": available, "tokens_seen": rs[0]["tokens_seen"],
            "epochs": round(rs[0]["tokens_seen"] / available, 3) if available else None,
            "bpb": bpb, "seeds": [r["seed"] for r in rs],
            "final_train_loss": mean_std([r["summary"]["final_loss"] for r in rs], seeds),
            "train_seconds": [r["summary"].get("train_seconds") for r in rs], "funnel": info["funnel"],
            "kept_by_lang": info.get("kept_by_lang", {}), "where": info.get("where"),
            "token_budget": info.get("token_budget"), "resampled_per_seed": bool(info.get("resampled_per_seed"))}
    for name, row in table.items():
        row["vs"] = {}
        for base in baselines(list(table)):
            if base == name:
                continue
            b = table[base]["bpb"]
            row["vs"][base] = {"all": compare(row["bpb"]["all"], b["all"]),
                               **{f"{g}:{k}": compare(v, b[g][k]) for g in ("by_lang", "by_source")
                                  for k, v in row["bpb"][g].items() if k in b[g]}}
    first = runs[0]
    invariants = {
        "tokenizer_sha256": sorted({r["tokenizer_sha256"] for r in runs}),
        "model_configs": len({json.dumps(r["model_config"], sort_keys=True) for r in runs}),
        "tokens_seen": sorted({r["tokens_seen"] for r in runs}),
        "seeds_per_variant": {n: sorted(r["seed"] for r in runs if r["variant"] == n) for n in variants},
        "train_configs_differ_only_in": sorted(_config_differences(runs)),
    }
    hf_diffs = [abs(r["bpb_hf"]["all"]["bpb"] - r["bpb"]["all"]["bpb"]) for r in runs if r.get("bpb_hf")]
    return {
        "name": config.name, "output": str(out), "variants": list(variants), "seeds": list(config.seeds),
        "table": table, "invariants": invariants,
        "hf_check": {"runs": len(hf_diffs), "max_abs_bpb_diff": max(hf_diffs) if hf_diffs else None,
                     "tokens_match": all(r.get("hf_tokens_match") for r in runs if r.get("bpb_hf"))},
        "runs": [{k: r[k] for k in ("variant", "seed", "run_dir", "hf", "summary", "bpb", "bpb_hf",
                                    "hf_max_abs_doc_nll_diff", "tokens_seen", "score_seconds")} for r in runs],
        "model": first["model_config"], "params": first["summary"].get("params"),
        "train": {k: first["train_config"][k] for k in ("optim", "schedule", "train", "data")},
        "tokenizer": {"path": str(tok.path), "vocab_size": tok.vocab_size, "sha256": tok.sha256,
                      "sample_docs": config.tokenizer.sample_docs},
        "heldout": {"sources": _heldout_summary(heldout), "dropped_overlapping_raw": sorted(map(list, overlap))},
        "curation": [{"node": Path(n["dir"]).name, "stage": n["stage"], "variants": n["variants"],
                      "input_docs": n["report"]["input_docs"], "kept_docs": n["report"]["kept_docs"],
                      "seconds": n["seconds"]} for n in tree.nodes.values()],
        "budget": sizing, "timings": {k: round(v, 1) for k, v in timings.items()},
        "plot": str(out / "ablate.png"), "markdown": str(out / "ablate.md"),
    }


def _config_differences(runs: list[dict]) -> set[str]:
    """Top-level keys (data.phases, output, seed ...) in which the runs' train configs differ."""
    keys: set[str] = set()
    base = runs[0]["train_config"]
    for r in runs[1:]:
        for k, v in r["train_config"].items():
            if isinstance(v, dict):
                keys |= {f"{k}.{kk}" for kk, vv in v.items() if base[k].get(kk) != vv}
            elif base.get(k) != v:
                keys.add(k)
    return keys


def _heldout_summary(heldout) -> list[dict]:
    out: dict[tuple, dict] = {}
    for d in heldout:
        e = out.setdefault((d.source, d.lang), {"source": d.source, "lang": d.lang, "docs": 0, "bytes": 0})
        e["docs"] += 1
        e["bytes"] += len(d.text.encode("utf-8"))
    return list(out.values())


# ---- presentation ------------------------------------------------------------------------------

def _pm(s: dict) -> str:
    return f"{s['mean']:.4f}" + (f" ± {s['std']:.4f}" if s.get("std") is not None else "")


def _delta(c: dict | None) -> str:
    if c is None:
        return ""
    mark = "" if c["significant"] is None else (" *" if c["significant"] else " †" if c["significant_paired"] else " ~")
    return f"{c['delta']:+.4f}{mark}"


def format_markdown(result: dict) -> str:
    t = result["table"]
    langs = sorted({k for row in t.values() for k in row["bpb"]["by_lang"]})
    sources = sorted({k for row in t.values() for k in row["bpb"]["by_source"]})
    bases = baselines(list(t))
    lines = [f"# Ablation `{result['name']}`", "",
             f"{len(result['variants'])} variants x {len(result['seeds'])} seeds; model {result['params']:,} parameters "
             f"({result['model']['dim']} dim, {result['model']['n_layers']} layers); every run saw "
             f"{result['invariants']['tokens_seen'][0]:,} tokens. Held-out bits per byte, lower is better; "
             "Δ = variant − baseline; `*` beyond twice the pooled seed std; `†` within it, but the per-seed "
             "differences (same seed: same initial weights) are beyond twice their own std; `~` neither.", "",
             "| variant | stages | docs | unique tokens | epochs | BPB all | " + " | ".join(f"BPB {x}" for x in langs)
             + "".join(f" | Δ {b} (" + "/".join(langs) + ")" for b in bases) + " |",
             "|---" * (6 + len(langs) + len(bases)) + "|"]
    for name, row in t.items():
        d = {b: " / ".join(_delta(row["vs"].get(b, {}).get(f"by_lang:{x}")) or "·" for x in langs) if b in row["vs"] else "·"
             for b in bases}
        where = " where " + ", ".join(f"{k} {v}" for k, v in row["where"].items()) if row.get("where") else ""
        lines.append(f"| {name} | {', '.join(row['stages']) or '(extract only)'}{where} | {row['documents']:,} | "
                     f"{row['available_tokens'] or 0:,} | {row['epochs']} | {_pm(row['bpb']['all'])} | "
                     + " | ".join(_pm(row["bpb"]["by_lang"][x]) if x in row["bpb"]["by_lang"] else "" for x in langs)
                     + "".join(f" | {d[b]}" for b in bases) + " |")
    budget = next((row["token_budget"] for row in t.values() if row.get("token_budget")), None)
    resampled = any(row.get("resampled_per_seed") for row in t.values())
    if budget:
        lines += ["", "Equal tokens per language (every variant's selection sampled to the fewest any holds"
                  + ("; each training seed draws its own sample" if resampled else "") + "): "
                  + ", ".join(f"{lang} {n:,}" for lang, n in budget.items()) + " tokens."]
    kept_langs = sorted({k for row in t.values() for k in row.get("kept_by_lang", {})})
    if kept_langs:
        first = next(iter(t))
        lines += ["", f"Kept per language (curated documents / training tokens; Δ tokens vs `{first}`"
                  + ("; the first seed's sample" if resampled else "") + "):", "",
                  "| variant | " + " | ".join(kept_langs) + " |", "|---" * (1 + len(kept_langs)) + "|"]
        for name, row in t.items():
            cells = []
            for x in kept_langs:
                k, base = row["kept_by_lang"].get(x), t[first]["kept_by_lang"].get(x)
                d = f" ({(k['tokens'] / base['tokens'] - 1) * 100:+.1f} %)" if k and base and base["tokens"] and name != first else ""
                cells.append(f"{k['documents']:,} / {k['tokens']:,}{d}" if k else "0")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Per held-out source (BPB mean ± std over seeds):", "",
              "| variant | " + " | ".join(sources) + " |", "|---" * (1 + len(sources)) + "|"]
    for name, row in t.items():
        lines.append(f"| {name} | " + " | ".join(_pm(row["bpb"]["by_source"][s]) if s in row["bpb"]["by_source"] else ""
                                                  for s in sources) + " |")
    hf = result["hf_check"]
    lines += ["", f"transformers check: {hf['runs']} exported models re-scored, max |BPB difference| "
                  f"{hf['max_abs_bpb_diff']:.2e}; same token counts: {hf['tokens_match']}" if hf["runs"] else "",
              f"Invariants: tokenizers {len(result['invariants']['tokenizer_sha256'])}, model configs "
              f"{result['invariants']['model_configs']}, token counts {result['invariants']['tokens_seen']}, "
              f"train configs differ only in {result['invariants']['train_configs_differ_only_in']}."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    t = result["table"]
    names = list(t)
    groups = ["all"] + sorted({k for row in t.values() for k in row["bpb"]["by_lang"]})
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        row = t[name]
        stats = [row["bpb"]["all"] if g == "all" else row["bpb"]["by_lang"].get(g) for g in groups]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(groups))]
        ax.bar(xs, [s["mean"] if s else 0 for s in stats], width,
               yerr=[(s["std"] or 0) if s else 0 for s in stats], capsize=3, label=name)
    ax.set_xticks(range(len(groups)), groups)
    lo = min(row["bpb"]["all"]["mean"] for row in t.values())
    ax.set_ylim(bottom=max(0, lo * 0.85))
    ax.set_ylabel("held-out bits per byte (lower is better)")
    ax.set_title("BPB per variant (mean ± std over seeds)")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    for r in result["runs"]:
        metrics = Path(r["run_dir"]) / "metrics.jsonl"
        if not metrics.exists():
            continue
        rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        pts = [(m["tokens"], m["loss"]) for m in rows if "loss" in m and "tokens" in m]
        if pts:
            color = f"C{names.index(r['variant']) % 10}"
            ax2.plot(*zip(*pts), lw=0.8, color=color, alpha=0.8, label=r["variant"] if r["seed"] == result["seeds"][0] else None)
    ax2.set_xlabel("tokens")
    ax2.set_ylabel("training loss (nats/token, own data)")
    ax2.set_title("loss curves (every seed)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path


def publish(result: dict, out: Path) -> None:
    md = format_markdown(result)
    with atomic_path(out / "ablate.md") as tmp:
        tmp.write_text(md)
    plot(result, out / "ablate.png")
    try:
        from prefect.artifacts import create_markdown_artifact
        create_markdown_artifact(md, key="ablate-results", description=f"quipu ablate: {result['name']}")
    except Exception:   # artifacts are a view; the files above are the result
        pass
