"""The shipped configs/curate/default.yaml (langid, heuristics, fluency with its shipped models) on a domain
none of its thresholds or models saw: technical documentation, translated into Spanish and Portuguese.

    apt-get install debian-reference-es debian-reference-pt debian-reference-pt-br debian-reference-en \
        debian-faq debian-faq-pt debian-edu-doc-es debian-edu-doc-pt-br debian-edu-doc-en
    .venv/bin/python bench/fluency_new_domain.py [--write]

Sources (Debian registry packages, free licences; whole sources, so nothing here was tuned on them): the
Debian Reference, the Debian FAQ and the Debian Edu manual, each in the languages it is translated into.
A document is a run of consecutive <p> paragraphs of one HTML page (paragraphs holding code or commands
left out, paragraphs under 8 words skipped) joined until it has 80 words, kept when lid.176 labels it the
page's language (translations leave some paragraphs in English). Of a source's prose (>= 3 sentences,
>= 50 words: the issue's definition) every other document is scored as prose; the rest feed
synthetic/fluent_junk.py (spun, n-gram generated of orders 2-4, SEO doorway pages), as bench/fluency_models.py
does with held-out sources. Printed per source: prose kept and junk removed by kind, and what removed the
prose (langid, which heuristic, which fluency judge). Deterministic.
"""
from __future__ import annotations

import argparse
import glob
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SOURCES = {    # language -> source -> HTML files (globs)
    "es": {"debian_reference": ["/usr/share/debian-reference/*.es.html"],
           "debian_edu_manual": ["/usr/share/doc/debian-edu-doc-es/debian-edu-bookworm-manual.html"]},
    "pt": {"debian_reference": ["/usr/share/debian-reference/*.pt.html", "/usr/share/debian-reference/*.pt-br.html"],
           "debian_faq": ["/usr/share/doc/debian/FAQ/pt/*.html"],
           "debian_edu_manual": ["/usr/share/doc/debian-edu-doc-pt-br/debian-edu-bookworm-manual.html"]},
    "en": {"debian_reference": ["/usr/share/debian-reference/*.en.html"],
           "debian_faq": ["/usr/share/doc/debian/FAQ/*.en.html"],
           "debian_edu_manual": ["/usr/share/doc/debian-edu-doc-en/debian-edu-bookworm-manual.html"]},
}
SECTION = "## Fluent junk and prose kept on a new domain: translated technical documentation (`bench/fluency_new_domain.py`)"
CACHE_SECTION = ("## Fluent junk: a cache model over the crawl's own word frequencies, narrow and diluted crawls "
                 "(`bench/fluency_new_domain.py --crawl-cache`)")
LID_SECTION = "## LID tau: prose langid removes at the 0.9 cap and at the shipped tau (`bench/fluency_new_domain.py --lid`)"
DOC_WORDS = 80


def documents(lang: str, patterns: list[str]) -> list[str]:
    import lxml.html
    from quipu.tasks.langid import default_model_path, load_fasttext, predict_top
    lid = load_fasttext(default_model_path())
    out = []
    for path in sorted(p for pattern in patterns for p in glob.glob(pattern)):
        buf: list[str] = []
        for p in lxml.html.parse(path).getroot().iter("p"):
            if p.find(".//code") is not None or p.find(".//pre") is not None or p.find(".//span[@class='command']") is not None:
                continue
            text = " ".join(p.text_content().split())
            if len(text.split()) < 8:
                continue
            buf.append(text)
            if sum(len(x.split()) for x in buf) >= DOC_WORDS:
                doc, buf = "\n".join(buf), []
                if predict_top(lid, [doc.replace("\n", " ")])[0][0] == lang:
                    out.append(doc)
    return out


def prose_removed_by(config, lang: str, prose: list[str]) -> Counter:
    """What removes each prose document: the first stage (and rule) that does."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from quipu.tasks.fluency import FluencyFilter
    from quipu.tasks.heuristics import HeuristicFilters
    from quipu.tasks.langid import LanguageId
    why: Counter = Counter()
    batch = pa.table({"id": [str(i) for i in range(len(prose))], "text": prose})
    outcome = LanguageId(config.langid).process(batch)
    why.update(outcome.removed.column("reason").to_pylist())
    kept = outcome.kept
    why["langid:other language"] += kept.num_rows - pc.sum(pc.equal(kept.column("lang"), lang)).as_py()
    kept = kept.filter(pc.equal(kept.column("lang"), lang))
    for stage in (HeuristicFilters(config.heuristics), FluencyFilter(config.fluency)):
        outcome = stage.process(kept)
        why.update(r.split("<")[0].split(">")[0] for r in outcome.removed.column("reason").to_pylist())
        kept = outcome.kept
    return +why


def lid_removed(lang: str, prose: list[str], tau: float) -> float:
    """Share of `prose` that langid removes (score under `tau`, or another language)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from quipu.tasks.langid import LangIdConfig, LanguageId
    kept = LanguageId(LangIdConfig(languages=["en", "es", "pt"], min_score=tau)).process(
        pa.table({"id": [str(i) for i in range(len(prose))], "text": prose})).kept
    return 1 - pc.sum(pc.equal(kept.column("lang"), lang)).as_py() / len(prose)


def lid_table(config, is_prose) -> list[str]:
    """Per source, prose removed by langid at clean reference text's 0.9 cap and at the shipped tau:
    the Debian documentation and every es/pt/en source of ../shared/data/text (when present)."""
    import json
    from bench.fluency_models import SHARED_TEXT
    from quipu.tasks.per_language import resolve
    rows = ["| language | source | prose docs | removed by langid at tau 0.9 | at the shipped tau |", "|---|---|---|---|---|"]
    texts: dict[tuple[str, str], list[str]] = {}
    for lang, sources in SOURCES.items():
        for name, patterns in sources.items():
            texts[lang, name] = documents(lang, patterns)
    for path in sorted(SHARED_TEXT.glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                d = json.loads(line)
                if d.get("lang") in SOURCES:
                    texts.setdefault((d["lang"], path.stem), []).append(d["text"])
    for (lang, name), docs in texts.items():
        prose = [t for t in docs if is_prose(t)][:1500]
        if prose:
            tau = resolve(config.langid.min_score, lang)
            rows.append(f"| {lang} | {name} | {len(prose)} | {lid_removed(lang, prose, 0.9):.3f} | "
                        f"{lid_removed(lang, prose, tau):.3f} (tau {tau:g}) |")
    return rows


def auc(pos: list[float], neg: list[float]) -> float:
    """P(a prose score > a generated one), ties half."""
    import numpy as np
    p, n = np.array(pos)[:, None], np.array(neg)[None, :]
    return float((p > n).mean() + 0.5 * (p == n).mean())


def rate_curve(pairs: list[tuple[int, int]]) -> tuple[float, float]:
    """log(rare-word repeat rate) = a + b log(rare words), fitted over ten length bins (pooled rates)."""
    import numpy as np
    ns = np.array([n for n, _ in pairs if n >= 5], float)
    rs = np.array([r for n, r in pairs if n >= 5], float)
    edges = np.unique(np.quantile(ns, np.linspace(0, 1, 11)))
    xs, ys, ws = [], [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (ns >= lo) & (ns <= hi)
        if sel.sum() >= 3:
            xs.append(np.log(ns[sel].mean()))
            ys.append(np.log(max(1e-3, rs[sel].sum() / ns[sel].sum())))
            ws.append(np.sqrt(sel.sum()))
    b, a = np.polyfit(xs, ys, 1, w=ws)
    return float(a), float(b)


def length_aware(lang: str) -> list[str]:
    """Two variants of the burstiness judge beside the shipped one (constant rates from the reference):
    rates that grow with a document's length (prose's and chance's, each fitted on the shipped model's
    reference and on text sampled from a trigram model of it), and the chance rate fitted on the crawl
    itself (text sampled from a trigram model of the source's scored prose and generated text together,
    what a two-pass stage could do on a run). Per variant: AUC prose above generated, and generated text
    removed at the cut-off that costs 3 % of the source's prose (an oracle cut-off: optimistic)."""
    import math
    import random
    import numpy as np
    from bench.fluency_models import SOURCES as REFERENCE, is_prose, source_texts
    from quipu.synthetic.fluent_junk import fluent_junk
    from quipu.tasks.fluency import MODEL_DIR, NgramGenerator, load_model
    model = load_model(str(MODEL_DIR / f"{lang}.json"))
    texts = [t for name in REFERENCE[lang] for t in source_texts(name, lang)]
    rng = random.Random(0)
    sampler = NgramGenerator(texts, 3)
    prose_curve = rate_curve([model.repeats(t) for t in texts])
    chance_curve = rate_curve([model.repeats(sampler.generate(rng, rng.randint(60, 250))) for _ in range(600)])

    def score(text: str) -> float:
        n, r = model.repeats(text)
        q0 = min(0.95, math.exp(chance_curve[0] + chance_curve[1] * math.log(max(n, 5))))
        q1 = max(min(0.95, math.exp(prose_curve[0] + prose_curve[1] * math.log(max(n, 5)))), 1.05 * q0)
        return r * math.log(q1 / q0) + (n - r) * math.log((1 - q1) / (1 - q0))
    rows = []
    for name, patterns in SOURCES[lang].items():
        prose = [t for t in documents(lang, patterns) if is_prose(t)]
        generated = [d["text"] for d in fluent_junk(lang, prose[1::2], 150, seed=3) if d["kind"] == "generated"]
        crawl = NgramGenerator(prose[::2] + generated, 3)
        crawl_rng = random.Random(0)
        sampled = [model.repeats(crawl.generate(crawl_rng, crawl_rng.randint(60, 250))) for _ in range(300)]
        chance = sum(r for _, r in sampled) / sum(n for n, _ in sampled)
        q1 = max(model.data["repeat_rates"]["prose"], 1.5 * chance)

        def crawl_fitted(text: str) -> float:
            n, r = model.repeats(text)
            return r * math.log(q1 / chance) + (n - r) * math.log((1 - q1) / (1 - chance))
        cells = []
        for judge in (model.burstiness, score, crawl_fitted):
            p, g = [judge(t) for t in prose[::2]], [judge(t) for t in generated]
            cells.append(f"{auc(p, g):.2f} / {np.mean(np.array(g) < np.percentile(p, 3)):.2f}")
        rows.append(f"| {lang} | {name} | {' | '.join(cells)} | {chance:.3f} |")
    return rows


def cache_evidence(stems: list[str], freq, total: int, types: int) -> float:
    """Evidence (nats) that a document's words come from a cache of its own earlier words (prose: about
    something) rather than from the crawl's word frequencies alone (`freq`, the document left out): the
    log-likelihood ratio of a cache-mixture unigram model (weight q, profiled over a grid) over the plain
    one, >= 0. A word common in the crawl explains its own repeats, so a narrow source's generated text,
    whose repeats are the source's common words, should gain little (Kuhn and De Mori's cache model)."""
    import math
    best = 0.0
    for q in (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5):
        seen: Counter = Counter()
        total_gain = 0.0
        for i, w in enumerate(stems):
            f = (freq.get(w, 0) + 0.5) / (total + 0.5 * types)
            if i:
                total_gain += math.log((q * seen[w] / i + (1 - q) * f) / f)
            seen[w] += 1
        best = max(best, total_gain)
    return best


def crawl_cache(lang: str) -> list[str]:
    """The cache model's evidence (`cache_evidence`) with word frequencies counted over the crawl, a
    global two-pass stage's view: per source, its scored prose and text generated from its other half,
    (a) alone (the crawl is that one source and its junk) and (b) diluted by the language's other
    sources' prose (a broad crawl with junk from one narrow source). Per setting: AUC prose above
    generated, generated removed at the 3 % prose oracle cut-off, and at a fixed 3 nats (generated
    removed / prose lost)."""
    import numpy as np
    from bench.fluency_models import SOURCES as REFERENCE, is_prose, source_texts
    from quipu.synthetic.fluent_junk import fluent_junk
    from quipu.tasks.fluency import stems
    sources = {name: [t for t in documents(lang, patterns) if is_prose(t)]
               for name, patterns in SOURCES[lang].items()}
    sources.update({name.removesuffix(".jsonl"): [t for t in source_texts(name, lang) if is_prose(t)]
                    for name in REFERENCE[lang] if not name.startswith("django:")})
    rows = []
    for name, prose in sources.items():
        generated = [d["text"] for d in fluent_junk(lang, prose[1::2], 150, seed=3) if d["kind"] == "generated"]
        others = [t for other, texts in sources.items() if other != name for t in texts[::2]]
        cells = []
        for crawl in (prose[::2] + generated, prose[::2] + generated + others):
            docs = [stems(t) for t in crawl]
            freq = Counter(w for d in docs for w in d)
            total, types, scores = sum(freq.values()), len(freq), []
            for d in docs[:len(prose[::2]) + len(generated)]:
                own = Counter(d)
                freq.subtract(own)
                scores.append(cache_evidence(d, freq, total - len(d), types))
                freq.update(own)
            p, g = np.array(scores[:len(prose[::2])]), np.array(scores[len(prose[::2]):])
            cells.append(f"{auc(list(p), list(g)):.2f} / {np.mean(g < np.percentile(p, 3)):.2f} / "
                         f"{np.mean(g < 3):.2f}, {np.mean(p < 3):.2f}")
        rows.append(f"| {lang} | {name} | {len(prose[::2])} | {' | '.join(cells)} |")
    return rows


def main() -> int:
    from bench.fluency_models import DEFAULT, end_to_end, is_prose
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig
    from quipu.synthetic.fluent_junk import fluent_junk
    from quipu.tasks.fluency import MODEL_DIR, load_model
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true", help="write the table into bench/RESULTS.md")
    ap.add_argument("--lid", action="store_true", help="only the LID tau table (its own RESULTS section)")
    ap.add_argument("--length-aware", action="store_true", help="only the length-aware burstiness table (printed)")
    ap.add_argument("--crawl-cache", action="store_true", help="only the crawl-frequency cache model table "
                                                               "(its own RESULTS section)")
    args = ap.parse_args()
    if not glob.glob("/usr/share/debian-reference/*.html"):
        print("bench/fluency_new_domain.py: the Debian documentation packages are not installed "
              "(apt-get install, see this file's docstring)")
        return 2
    t0 = time.time()
    config = load_config(CurateConfig, DEFAULT)
    if args.length_aware:
        print("| language | source | shipped burstiness: AUC / generated removed at 3 % prose | length-aware rates: same "
              "| chance rate fitted on the crawl: same | that chance rate |")
        print("|---|---|---|---|---|---|")
        for lang in SOURCES:
            print("\n".join(length_aware(lang)), flush=True)
        return 0
    if args.crawl_cache:
        rows = ["| language | source | prose docs | crawl = the source and its junk: AUC / generated removed at 3 % "
                "prose / at 3 nats (generated removed, prose lost) | diluted by the language's other sources: same |",
                "|---|---|---|---|---|"]
        for lang in SOURCES:
            rows += crawl_cache(lang)
            print("\n".join(rows[-1:]), flush=True)
        publish(CACHE_SECTION, "--crawl-cache", t0, args.write, rows,
                "Not shipped. The cache model's evidence (`cache_evidence`: a unigram model of the crawl's "
                "own word frequencies, the document left out, mixed with a cache of the document's earlier "
                "words) ranks narrow sources' prose above their generated text far better than burstiness "
                "does when the crawl is the source and its junk, but the gain goes when the crawl also holds "
                "other sources' prose: the junk's words are then rare in the crawl, so its repeats look like "
                "a topic again. A two-pass stage would depend on what else the crawl holds. Within a source it "
                "ranks well (AUC 0.98-1.00 on Genesis, Shakespeare, news), but its level moves with the source "
                "(a fixed 3 nats removes 0.04-0.90), the same wall as every judge before it:")
        return 0
    if args.lid:
        publish(LID_SECTION, "--lid", t0, args.write, lid_table(config, is_prose),
                "Prose (>= 3 sentences, >= 50 words; the first 1,500 of a source) that configs/curate/default.yaml's "
                "langid removes (score under tau, or another top label): clean reference text puts tau at the 0.9 cap; "
                "the shipped values are FineWeb-2's published ones for es (0.84) and pt (0.799) and FineWeb's for en "
                "(0.65) (bench/calibrate_default.py, PUBLISHED_TAU):")
        return 0
    table = ["| language | source | prose docs | what configs/curate/default.yaml does (shipped models) | prose removed by |",
             "|---|---|---|---|---|"]
    for lang, sources in SOURCES.items():
        model = load_model(str(MODEL_DIR / f"{lang}.json"))
        for name, patterns in sources.items():
            prose = [t for t in documents(lang, patterns) if is_prose(t)]
            if len(prose) < 40:
                print(f"{lang} {name}: {len(prose)} prose documents, too few: left out")
                continue
            scored, generating = prose[::2], prose[1::2]
            line = end_to_end(lang, model, scored, fluent_junk(lang, generating, 150, seed=3))
            why = ", ".join(f"{k} {v}" for k, v in prose_removed_by(config, lang, scored).most_common(4)) or "-"
            print(f"{lang} {name}: {line}; prose removed by {why}", flush=True)
            table.append(f"| {lang} | {name} | {len(scored)} | {line} | {why} |")
    publish(SECTION, "", t0, args.write, table,
            "The shipped config and models as they are, on Debian's documentation (a domain none of them saw; "
            "this file's docstring says how documents are cut):")
    return 0


def publish(section: str, option: str, t0: float, write: bool, rows: list[str], intro: str) -> None:
    """Print a RESULTS section (command, time, load, `intro`, the table); with --write, replace it there."""
    from bench.fluency_models import RESULTS
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    command = " ".join(["`.venv/bin/python bench/fluency_new_domain.py", *([option] if option else []),
                        *(["--write"] if write else [])]) + "`"
    body = "\n".join([section, "", f"{command} ({time.time() - t0:.0f} s; `uptime`: {load}). {intro}", "", *rows, ""])
    print(body)
    if write:
        from bench.curate_throughput import write_results_section
        write_results_section(RESULTS, section, body)


if __name__ == "__main__":
    sys.exit(main())
