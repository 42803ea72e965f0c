"""Builds configs/curate/default.yaml with `quipu calibrate`, and checks it on whole sources left out.

    .venv/bin/python bench/calibrate_default.py [--write] [--max-docs 600]

1. Starts from BASE (the stages of a crawl curation that need no model the user trains: quality
   and perplexity off) and calibrates es, pt and en in turn (`quipu calibrate ... --keep 0.97`)
   on the CALIBRATE sources of ../shared/data/text, with seeded junk (synthetic/junk.py, seed 0) for
   the report; with --write the result replaces configs/curate/default.yaml.
2. Left-out table: the config's langid + heuristics decisions on the prose (>= 3 sentences,
   >= 50 words) of the CHECK sources, which no calibration saw, and on other junk (seed 1).
3. Leave-one-source-out: for each news or literature source, its language calibrated on the
   language's other sources only, then the share of the source's prose removed.

Prints both tables in markdown (docs/languages.md) and replaces its section of bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from quipu.tasks.calibration import lid_tau_over  # noqa: E402  (after the path: the checkout's quipu)
SHARED_TEXT = Path(os.environ.get("QUIPU_SHARED_DATA") or ROOT.parent / "shared" / "data") / "text"
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Per-language calibration: configs/curate/default.yaml on left-out sources (`bench/calibrate_default.py`)"
DEFAULT = ROOT / "configs" / "curate" / "default.yaml"

BASE = {
    "input": [], "output": "runs/default", "workers": 2,
    "extract": {"timeout_s": 10, "fix_unicode": True},
    "urls": {"block_lists": [], "allow_lists": []},
    "langid": {"languages": ["en", "es", "pt"], "min_score": 0.65},
    "bad_words": {"enabled": False},
    "lines": {"max_line_count": 10},
    "heuristics": {"compat": "quipu"},
    "fluency": {"enabled": True, "languages": ["en", "es", "pt"], "min_burstiness": {"default": None, "en": -5.5}},
    "quality": {"enabled": False},
    "decontam": {"benchmarks": ["humaneval"], "policy": "drop"},
    "pii": {"email_allow": []},
    "tiers": {"enabled": True},
}
# Comments `--write` puts in the shipped file where YAML's dump has none: (line as dumped, comment lines
# before it or, starting with "#", after the value on the same line).
COMMENTS = {
    "fluency:": ["  # fluent junk rules cannot see: spun text (word order) and n-gram-generated text (no recurring topic words);",
                 "  # models and cut-offs shipped in tasks/fluency_models/<lang>.json (rebuilt by bench/fluency_models.py)"],
    "    default: null": "# the model's own cut-off (tasks/fluency_models/<lang>.json)",
    "    en: -5.5": "# below the model's -2.476: short English news and web posts (tests/test_calibration.py) repeat few rare words",
    "tiers:": ["  # quality_tier 0-4 per document from the judges' token-weighted percentiles (tasks/tiers.py;",
               "  # docs/quality.md); tables shipped in tasks/tier_tables/default.json (rebuilt by bench/tier_tables.py),",
               "  # fitted on other text than yours: refit on your crawl with `quipu tiers fit RUN --output tiers.json`.",
               "  # Annotates only (no min_tier): removing a tier removes its prose too; select tiers in blends with where:"],
}
CALIBRATE = {   # reference text per language: whole sources; everything else is left out
    "es": ["es_activ_es_subtitles.jsonl", "es_gutenberg_quijote.jsonl"],
    "pt": ["multi_nltk_genesis.jsonl"],
    "en": ["en_nltk_speeches.jsonl", "en_nltk_shakespeare.jsonl", "en_nltk_movie_reviews.jsonl"],
}
CHECK = {
    "es": ["es_nltk_cess_esp_news.jsonl", "es_nltk_conll2002_efe_news.jsonl"],
    "pt": ["pt_fakebr_news.jsonl"],
    "en": ["en_nltk_abc_news.jsonl", "en_ud_ewt_web.jsonl", "en_nltk_webtext.jsonl"],
}
# LID tau where no crawl sample of the language is at hand. Clean reference text puts every language at the 0.9
# cap, which loses real prose: Portuguese news 22 of 300 documents, English web text (en_nltk_webtext) 145 of 952,
# English technical documentation 6-34 % (bench/RESULTS.md, "LID tau"). Spanish and Portuguese: FineWeb-2's own
# tau, computed its way (median - sigma of the LID scores) over its crawl of the language (GlotLID there). English,
# which FineWeb-2 leaves out: FineWeb's threshold for the same lid.176 model. Users refit each on their crawl:
# `quipu calibrate --crawl`.
PUBLISHED_TAU = {
    "pt": (0.799, lid_tau_over("FineWeb-2's Portuguese crawl (its published tau; refit on your crawl sample with --crawl)")),
    "es": (0.84, lid_tau_over("FineWeb-2's Spanish crawl (its published tau; refit on your crawl sample with --crawl)")),
    "en": (0.65, "FineWeb's English threshold for the same lid.176 model (a fixed choice, not median - sigma; "
                 "refit on your crawl sample with --crawl)"),
}
NEWS_AND_LITERATURE = {   # the second acceptance: each checked with its language calibrated without it
    "es": ["es_nltk_cess_esp_news.jsonl", "es_nltk_conll2002_efe_news.jsonl", "es_gutenberg_quijote.jsonl"],
    "pt": ["pt_fakebr_news.jsonl"],
    "en": ["en_nltk_abc_news.jsonl", "en_nltk_shakespeare.jsonl"],
}
SENTENCE = re.compile(r"[.!?…]+(?:\s|$)")


def is_prose(text: str) -> bool:
    """The issue's prose: at least 3 sentences and 50 words (sentences split at . ! ? …)."""
    return len(text.split()) >= 50 and len([s for s in SENTENCE.split(text) if s.strip()]) >= 3


def documents(files: list[str], lang: str, max_docs: int) -> list[dict]:
    out = []
    for name in files:
        n = 0
        with open(SHARED_TEXT / name, encoding="utf-8") as fh:
            for line in fh:
                doc = json.loads(line)
                if doc.get("lang") == lang and n < max_docs:
                    out.append(doc)
                    n += 1
    return out


def write_jsonl(path: Path, docs: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": d["id"], "text": d["text"]}, ensure_ascii=False) + "\n" for d in docs))
    return str(path)


def calibrate_languages(base_path: Path, out_path: Path, sources: dict[str, list[str]], work: Path,
                        max_docs: int, junk_seed: int = 0) -> dict:
    from quipu.synthetic.junk import junk_documents
    from quipu.flows.calibrate import run_calibration
    current, reports = base_path, {}
    for lang, files in sources.items():
        name = "+".join(f.removesuffix(".jsonl") for f in files)
        ref = write_jsonl(work / f"{lang}-reference-{name}.jsonl", documents(files, lang, max_docs))
        junk = write_jsonl(work / f"junk-{lang}.jsonl", junk_documents(lang, 400, junk_seed))
        rep = run_calibration(str(current), [ref], lang, [junk], keep=0.97, output=str(out_path),
                              report_path=str(work / f"calibration-{lang}"), lid_tau=PUBLISHED_TAU.get(lang),
                              replace=True)
        reports[lang] = rep["languages"][lang]
        current = out_path
    return reports


def judge(config_path: Path, lang: str, texts: list[str]) -> tuple[float, dict]:
    """Share of `texts` the config's langid + heuristics remove, and the top rules."""
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.tasks import calibration as cal
    config = load_config(CurateConfig, config_path)
    m = cal.measure(texts, lang, config.heuristics, config.langid)
    ev = cal.evaluate(m, None, config.heuristics, config.langid)
    top = {r["rule"]: r["reference_removed"] for r in ev["rules"] if r["reference_removed"] > 0}
    return ev["reference_removed"], dict(sorted(top.items(), key=lambda kv: -kv[1])[:3])


def _fmt_top(top: dict) -> str:
    return ", ".join(f"{k} {100 * v:.1f} %" for k, v in top.items()) or "-"


def with_comments(text: str) -> str:
    """The dumped config with COMMENTS added (a block's comment lines after its key, a value's at its end)."""
    out = []
    section = None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            section = line
        comment = COMMENTS.get(line)
        if isinstance(comment, str) and section == "fluency:":
            out.append(f"{line}   {comment}")
            continue
        out.append(line)
        if isinstance(comment, list):
            out.extend(comment)
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="replace configs/curate/default.yaml")
    ap.add_argument("--max-docs", type=int, default=600, help="documents per source (the first ones; the shipped "
                                                             "file was calibrated with 600)")
    args = ap.parse_args()
    import yaml
    t0 = time.time()
    work = Path(tempfile.mkdtemp(prefix="quipu-calibrate-"))
    base = work / "base.yaml"
    base.write_text(yaml.safe_dump(BASE, sort_keys=False))
    out = work / "default.yaml"
    calibrate_languages(base, out, CALIBRATE, work, args.max_docs)
    if args.write:
        DEFAULT.write_text("# The shipped curation config for es/pt/en crawls: no model to train (quality and perplexity off).\n"
                           "# Regenerate with `.venv/bin/python bench/calibrate_default.py --write` (reference: whole sources\n"
                           "# of ../shared/data/text, listed below; the other sources are left out to check it: docs/languages.md).\n"
                           + with_comments(out.read_text()))
    from quipu.synthetic.junk import junk_documents
    rows = ["| language | calibrated on | left-out source | prose docs | prose removed | top rules |",
            "|---|---|---|---|---|---|"]
    for lang, files in CHECK.items():
        for name in files:
            texts = [d["text"] for d in documents([name], lang, args.max_docs) if is_prose(d["text"])]
            removed, top = judge(out, lang, texts)
            rows.append(f"| {lang} | {', '.join(f.removesuffix('.jsonl') for f in CALIBRATE[lang])} | "
                        f"{name.removesuffix('.jsonl')} | {len(texts)} | {100 * removed:.1f} % | {_fmt_top(top)} |")
        junk = [d["text"] for d in junk_documents(lang, 400, seed=1)]
        removed, top = judge(out, lang, junk)
        rows.append(f"| {lang} | (same) | junk, synthetic/junk.py seed 1 (8 kinds) | {len(junk)} | {100 * removed:.1f} % | {_fmt_top(top)} |")
    loo = ["| source | its language calibrated on | prose docs | prose removed (calibrated without it) | English defaults (datatrove) |",
           "|---|---|---|---|---|"]
    for lang, names in NEWS_AND_LITERATURE.items():
        for name in names:
            refs = [f for f in sorted(p.name for p in SHARED_TEXT.glob("*.jsonl"))
                    if f != name and documents([f], lang, 1)]
            sub = work / f"loo-{name}"
            cfg = sub / "config.yaml"
            sub.mkdir()
            calibrate_languages(base, cfg, {lang: refs}, sub, args.max_docs)
            texts = [d["text"] for d in documents([name], lang, args.max_docs) if is_prose(d["text"])]
            removed, top = judge(cfg, lang, texts)
            dt_removed = datatrove_removed(texts, lang)
            loo.append(f"| {name.removesuffix('.jsonl')} | {', '.join(f.removesuffix('.jsonl') for f in refs)} | "
                       f"{len(texts)} | {100 * removed:.1f} % ({_fmt_top(top)}) | {100 * dt_removed:.1f} % |")
    import subprocess
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    body = "\n".join([SECTION, "", f"`.venv/bin/python bench/calibrate_default.py --write` (first {args.max_docs} documents "
                      f"per source; {time.time() - t0:.0f} s; `uptime`: {load}; the machine is shared)", "",
                      "Left-out sources (no calibration saw them) and other junk, langid + heuristics of the shipped config:", "",
                      *rows, "", "Leave-one-source-out: each news or literature source checked with its language calibrated on "
                      "the language's other sources only (`compat: quipu`), beside datatrove's English defaults "
                      "(langid 0.65, heuristics as in configs/curate/demo.yaml):", "", *loo, ""])
    print(body)
    text = RESULTS.read_text() if RESULTS.exists() else ""
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + body + (text[nxt + 1:] if nxt != -1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    RESULTS.write_text(text)
    return 0


def datatrove_removed(texts: list[str], lang: str) -> float:
    """The share the English defaults remove: langid at 0.65 and datatrove's filters as demo.yaml sets them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.tasks.heuristics import HeuristicFilters
    from quipu.tasks.langid import LanguageId
    config = load_config(CurateConfig, ROOT / "configs" / "curate" / "demo.yaml")
    batch = pa.table({"id": [str(i) for i in range(len(texts))], "text": texts})
    kept = LanguageId(config.langid).process(batch).kept
    kept = kept.filter(pc.equal(kept.column("lang"), lang))
    kept = HeuristicFilters(config.heuristics).process(kept).kept
    return 1 - kept.num_rows / max(len(texts), 1)


if __name__ == "__main__":
    raise SystemExit(main())
