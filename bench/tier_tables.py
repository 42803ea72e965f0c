"""Rebuild the quality-tier tables shipped in tasks/tier_tables/default.json, and time the tier stage.

    .venv/bin/python bench/tier_tables.py --write     # rebuild the shipped tables (needs ../shared/data)
    .venv/bin/python bench/tier_tables.py --speed     # tier stage docs/s/core beside its anchor
    .venv/bin/python bench/tier_tables.py --heldout   # tiers of held-out prose and fluent junk per language

Tables: the raw mix of configs/ablate/tiers.yaml (real es/pt/en text of ../shared/data/text, none of
the ablation's held-out sources) curated by configs/curate/default.yaml with the tiers stage off,
then `quipu tiers fit` on the curated documents (what reaches the tiers stage). The provenance in
the file names the mix, the curate config's settings and the judges' model files: a changed fluency model
(tasks/fluency_models/) or a changed setting of the curate config before the tiers stage (a threshold,
the LID tau) makes the tables stale (tests/test_tiers.py says so); rerun this with --write.

Speed: the tier stage's `process` (percentiles of every judge, combination, tier, stats) against its
anchor, numpy's `searchsorted` over the same quantile tables (the bare lookup, no stats, no arrow
columns), on the same scored documents in one run; docs/s per core with one thread.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ABLATION = ROOT / "configs" / "ablate" / "tiers.yaml"
DEFAULT = ROOT / "configs" / "curate" / "default.yaml"
QUIPU = Path(sys.executable).with_name("quipu")


def curate_mix(work: Path) -> Path:
    """The ablation's raw mix curated by the shipped default (tiers off): the run folder."""
    os.chdir(ROOT)     # the ablation config's paths are relative to the checkout
    from quipu.synthetic.ablate_mix import ensure_mix
    from quipu.flows.ablate import AblateConfig
    from quipu.flows.config import load_config
    config = load_config(AblateConfig, str(ABLATION), [])
    files, _ = ensure_mix(config.raw_mix)
    run = work / "curated-mix"
    cmd = [str(QUIPU), "--quiet", "curate", str(DEFAULT), "--output", str(run), "--set", "tiers.enabled=false",
           *[a for f in files for a in ("--input", str(f))]]
    env = {**os.environ, "QUIPU_HOME": str(work / "home")}   # the scratch run stays out of the user's catalog
    subprocess.run(cmd, check=True, env=env)
    return run


def curate_settings_sha256() -> str:
    """sha256 of configs/curate/default.yaml's settings as loaded, the tiers block left out: what decides
    which documents reach the tiers stage and with which scores (a changed threshold or LID tau counts,
    an edited comment does not). tests/test_tiers.py compares it with the shipped tables' provenance."""
    import hashlib
    import json
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    settings = load_config(CurateConfig, DEFAULT).model_dump(mode="json", exclude={"tiers"})
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def write_tables(out: Path) -> None:
    from quipu.catalog.files import sha256_file
    from quipu.flows.tiers_cli import batches, input_files
    from quipu.tasks.fluency import MODEL_DIR
    from quipu.tasks.tiers import KNOWN_JUDGES, fit_tables
    with tempfile.TemporaryDirectory() as tmp:
        run = curate_mix(Path(tmp))
        files = input_files([str(run)])
        provenance = {
            "command": "python bench/tier_tables.py --write",
            "fitted_on": f"the raw mix of {ABLATION.relative_to(ROOT)} curated by {DEFAULT.relative_to(ROOT)} (tiers off)",
            "curate_settings_sha256": curate_settings_sha256(),
            "inputs": [{"file": f.name, "sha256": sha256_file(f)} for f in files],
            "judge_models": {f"fluency/{p.name}": sha256_file(p) for p in sorted(MODEL_DIR.glob("*.json"))},
        }
        tables = fit_tables(batches(files, KNOWN_JUDGES), KNOWN_JUDGES, max_docs=20000, min_docs=50,
                            provenance=provenance)
    tables.save(out)
    for judge, spec in sorted(tables.judges.items()):
        print(judge, {lang: t["docs"] for lang, t in spec["languages"].items()})
    print(f"wrote {out}")


def speed(docs: int = 20000) -> None:
    """The tier stage beside a bare numpy lookup of the same tables, on the same documents."""
    import numpy as np
    import pyarrow as pa

    from quipu.tasks.tiers import DEFAULT_TABLES, QualityTiers, TiersConfig, load_tables
    tables = load_tables(str(DEFAULT_TABLES))
    rng = np.random.default_rng(0)
    langs = sorted({lang for spec in tables.judges.values() for lang in spec["languages"]})
    judges = sorted(tables.judges)
    lang_col = [langs[i % len(langs)] for i in range(docs)]
    cols = {}
    for j in judges:   # scores drawn from each language's own fitted range
        lo = {lang: t["quantiles"][0] for lang, t in tables.judges[j]["languages"].items()}
        hi = {lang: t["quantiles"][-1] for lang, t in tables.judges[j]["languages"].items()}
        cols[j] = [float(rng.uniform(lo.get(lang, 0), hi.get(lang, 1))) for lang in lang_col]
    text = "una frase de prueba con algunas palabras " * 20
    batch = pa.table({"id": [f"d{i}" for i in range(docs)], "text": [text] * docs, "lang": lang_col, **cols})
    stage = QualityTiers(TiersConfig(enabled=True))
    stage.check()

    def ours():
        for i in range(0, docs, 2000):
            stage.process(batch.slice(i, 2000))

    def anchor():
        q = {(j, lang): np.asarray(t["quantiles"]) for j in judges for lang, t in tables.judges[j]["languages"].items()}
        for j in judges:
            sign = 1.0 if tables.judges[j]["higher_is_better"] else -1.0
            s = np.asarray(cols[j]) * sign
            for lang in langs:
                m = np.asarray([x == lang for x in lang_col])
                if (j, lang) in q:
                    np.searchsorted(q[(j, lang)], s[m])

    rows = []
    for name, fn in (("tiers stage (process)", ours), ("numpy searchsorted (anchor)", anchor)):
        t0 = time.process_time()
        fn()
        rows.append((name, docs / (time.process_time() - t0)))
    for name, rate in rows:
        print(f"{name:<30} {rate:>12,.0f} docs/s/core")
    print(f"ratio ours/anchor: {rows[0][1] / rows[1][1]:.3f}")
    print(f"load: {os.getloadavg()}")


HELDOUT = {"en": ["en_ud_ewt_web.jsonl"], "es": ["es_nltk_cess_esp_news.jsonl"], "pt": ["pt_fakebr_news.jsonl"]}


def heldout_tiers(combine: str = "max", max_docs: int = 200) -> None:
    """Tiers (shipped tables, fluency judges) of prose from sources the tables never saw (the
    ablation's held-out sources; pt: Fake.br's "true" half) beside fluent junk made from the rest of
    those sources (synthetic/fluent_junk.py), per language: the share of each kind in each tier, of the
    documents the fluency judges score (the junk the fluency stage removes is tiered here too)."""
    import json

    from quipu.synthetic.fluent_junk import fluent_junk
    from quipu.tasks.fluency import FluencyConfig, FluencyFilter
    from quipu.tasks.tiers import QualityTiers, TiersConfig
    shared = ROOT.parent / "shared" / "data" / "text"
    judge = FluencyFilter(FluencyConfig(enabled=True))
    tiers = QualityTiers(TiersConfig(enabled=True, combine=combine))
    tiers.check()
    print(f"combine: {combine}")
    print(f"{'lang':<5}{'kind':<11}{'docs':>6}{'unscored':>9}  share per tier 0..4")
    for lang, files in HELDOUT.items():
        texts = [d["text"] for f in files for d in map(json.loads, open(shared / f, encoding="utf-8"))
                 if d.get("lang") == lang and d.get("label", "true") == "true" and len(d["text"].split()) >= 50]
        prose, rest = texts[:max_docs], texts[max_docs:2 * max_docs] or texts
        rows = [{"id": f"p{i}", "text": t, "kind": "prose"} for i, t in enumerate(prose)]
        rows += [{"id": d["id"], "text": d["text"], "kind": d["kind"]} for d in fluent_junk(lang, rest, 3 * max_docs // 2, seed=5)]
        for kind in ("prose", "spun", "generated", "doorway"):
            sel = [r for r in rows if r["kind"] == kind]
            scored = [judge.judge(r["text"], lang)[1:] for r in sel]
            got = [tiers.assign(lang, {"fluency_word_order": o, "fluency_burstiness": b})[1] for o, b in scored]
            n = [t for t in got if t is not None]
            share = " ".join(f"{sum(t == k for t in n) / max(1, len(n)):.2f}" for k in range(5))
            print(f"{lang:<5}{kind:<11}{len(sel):>6}{len(got) - len(n):>9}  {share}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="rebuild tasks/tier_tables/default.json")
    ap.add_argument("--speed", action="store_true", help="time the tier stage beside its anchor")
    ap.add_argument("--heldout", action="store_true", help="tiers of held-out prose beside fluent junk, per language")
    ap.add_argument("--combine", default="max", choices=["max", "mean", "min"], help="how --heldout combines the judges")
    args = ap.parse_args()
    if args.heldout:
        heldout_tiers(args.combine)
    if args.write:
        from quipu.tasks.tiers import DEFAULT_TABLES
        write_tables(DEFAULT_TABLES)
    if args.speed or not (args.write or args.heldout):
        speed()


if __name__ == "__main__":
    main()
