"""Source-grouped documents for the perplexity distillation benchmark (leave-source-out protocol).

Every document belongs to a *source* (one corpus, or one site class of a corpus) and every source to
one of three *folds*. `bench/ppl_distill.py` distils one student per fold without that fold's sources
and evaluates it on them, so each source is scored by a student that never saw any of its documents;
the shipped student is then distilled on all sources. Each fold holds at least one source of each of
en, es and pt.

What the sources are (all real text, nothing generated):
- the 12 en/es/pt corpora of ../shared/data/text, Fake.br split into its two site classes (`label`
  true: real newspapers; fake: fake-news sites), Genesis split by language, EWT kept as one source;
- web pages: every WARC/ARC response of ../shared/data/web (the test crawls) and the 100 real news and
  blog pages of web/constructed, extracted with quipu's own `extract` stage and language-identified with
  its fastText model (only pages that come out en/es/pt with probability >= 0.65);
- text shipped inside installed packages (synthetic/sources.py): Python's language reference, our
  dependencies' READMEs, and the Spanish/Portuguese gettext catalogues of Django and Apprise.

Long documents (speeches, plays, Don Quijote, ...) are cut into pieces of about `--piece-chars`
characters at paragraph or line ends, so that a long source gives many documents of the kind the stage
sees, not a few book-length ones (the teacher reads only the start of each). Per source at most
`--per-source` documents, chosen by a hash of their ids (deterministic; a larger cap only adds).

pt is the weak spot of the available data: Fake.br is essentially one corpus (same collection, same
preprocessing, two classes of sites), plus 62 Genesis pieces and the software catalogues.

Writes bench/out/ppl/sources.jsonl: {id, text, lang, source, fold, round} per document, where `round`
is the document's rank within its source (labelling goes round by round, so a partial labelling run is
balanced across sources). The shared data is never copied into the repo.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LANGS = ("en", "es", "pt")

# source -> fold: each fold has >= 1 source per language, genres spread across folds
FOLDS = {
    "en_abc_news": 0, "en_movie_reviews": 0, "en_genesis": 0, "en_pydoc": 0,
    "en_ewt_web": 1, "en_speeches": 1, "en_web_crawl": 1, "en_readmes": 1,
    "en_webtext": 2, "en_shakespeare": 2, "en_web_articles": 2,
    "es_efe_news": 0, "es_quijote": 0,
    "es_cess_news": 1, "es_gettext": 1,
    "es_subtitles": 2, "es_web": 2,
    "pt_fakebr_true": 0,
    "pt_fakebr_fake": 1,
    "pt_genesis": 2, "pt_gettext": 2, "pt_web": 2,
}
TEXT_FILES = {
    "en_nltk_abc_news.jsonl": "en_abc_news", "en_nltk_movie_reviews.jsonl": "en_movie_reviews",
    "en_nltk_shakespeare.jsonl": "en_shakespeare", "en_nltk_speeches.jsonl": "en_speeches",
    "en_nltk_webtext.jsonl": "en_webtext", "en_ud_ewt_web.jsonl": "en_ewt_web",
    "es_activ_es_subtitles.jsonl": "es_subtitles", "es_gutenberg_quijote.jsonl": "es_quijote",
    "es_nltk_cess_esp_news.jsonl": "es_cess_news", "es_nltk_conll2002_efe_news.jsonl": "es_efe_news",
}


def pieces(text: str, size: int) -> list[str]:
    """`text` cut at paragraph (else line) ends into pieces of about `size` characters (one piece if short)."""
    if len(text) <= size * 3 // 2:
        return [text]
    parts = re.split(r"(\n\s*\n)", text) if "\n\n" in text else re.split(r"(\n)", text)
    out, cur = [], ""
    for p in parts:
        cur += p
        if len(cur) >= size:
            out.append(cur.strip())
            cur = ""
    if cur.strip():
        if out and len(cur) < size // 3:
            out[-1] = out[-1] + "\n\n" + cur.strip()
        else:
            out.append(cur.strip())
    return [p for p in out if p]


def text_sources(data: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for name, source in TEXT_FILES.items():
        out[source] = [d for d in map(json.loads, (data / name).open()) if d.get("text", "").strip()]
    for d in map(json.loads, (data / "pt_fakebr_news.jsonl").open()):
        out.setdefault(f"pt_fakebr_{d['label']}", []).append(d)
    for d in map(json.loads, (data / "multi_nltk_genesis.jsonl").open()):
        if d["lang"] in ("en", "pt"):
            out.setdefault(f"{d['lang']}_genesis", []).append(d)
    return out


def web_sources(web: Path) -> dict[str, list[dict]]:
    """Pages of every crawl under `web` (not bad/), through quipu's extract stage, then fastText LID."""
    import pyarrow.parquet as pq

    from quipu.tasks.extract import ExtractConfig, extract_file
    from quipu.tasks.langid import default_model_path, load_fasttext, predict_top
    files = sorted(p for p in web.glob("*") if re.search(r"\.(warc|arc)(\.gz)?$", p.name))
    constructed = sorted((web / "constructed").glob("*.warc.gz"))
    out: dict[str, list[dict]] = {}
    model = load_fasttext(default_model_path())
    with tempfile.TemporaryDirectory() as tmp:
        for kind, group in (("crawl", files), ("articles", constructed)):
            for f in group:
                res = extract_file(str(f), Path(tmp) / f.name, ExtractConfig())
                for shard in res.kept_shards:
                    rows = pq.read_table(shard.path, columns=["id", "text"]).to_pylist()
                    langs, probs = predict_top(model, [r["text"][:20000] for r in rows])
                    for r, lang, p in zip(rows, langs, probs):
                        if lang in LANGS and p >= 0.65 and len(r["text"]) >= 200:
                            source = f"{lang}_web_{kind}" if lang == "en" else f"{lang}_web"
                            out.setdefault(source, []).append({"id": r["id"], "text": r["text"], "lang": lang})
    return out


def package_sources() -> dict[str, list[dict]]:
    from quipu.synthetic.sources import catalogue_articles, python_reference_articles, readme_articles
    out = {"en_pydoc": python_reference_articles(), "en_readmes": readme_articles(),
           "es_gettext": catalogue_articles("es"), "pt_gettext": catalogue_articles("pt")}
    return {s: [{"id": a.origin, "text": f"{a.title}\n\n{a.plain()}", "lang": a.lang} for a in arts]
            for s, arts in out.items()}


def build(data: Path, web: Path, per_source: int, piece_chars: int) -> list[dict]:
    groups = {**text_sources(data), **web_sources(web), **package_sources()}
    rows = []
    for source in sorted(groups):
        if source not in FOLDS:
            raise SystemExit(f"source {source} has no fold: add it to FOLDS")
        lang = source.split("_")[0]
        docs = []
        seen = set()
        for d in groups[source]:
            for k, piece in enumerate(pieces(d["text"], piece_chars)):
                if len(piece) < 100 or piece in seen:
                    continue
                seen.add(piece)
                docs.append({"id": f"{d['id']}#{k}", "text": piece, "lang": lang, "source": source,
                             "fold": FOLDS[source]})
        docs.sort(key=lambda d: hashlib.sha256(f"{source}:{d['id']}".encode()).hexdigest())
        for r, d in enumerate(docs[:per_source]):
            rows.append({**d, "round": r})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=str(ROOT.parent / "shared/data/text"))
    ap.add_argument("--web", default=str(ROOT.parent / "shared/data/web"))
    ap.add_argument("--out", default=str(ROOT / "bench/out/ppl/sources.jsonl"))
    ap.add_argument("--per-source", type=int, default=1500)
    ap.add_argument("--piece-chars", type=int, default=2000)
    args = ap.parse_args()
    from quipu.catalog.files import write_bytes_atomic
    rows = build(Path(args.data), Path(args.web), args.per_source, args.piece_chars)
    write_bytes_atomic(args.out, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in rows).encode())
    counts: dict[str, int] = {}
    for d in rows:
        counts[d["source"]] = counts.get(d["source"], 0) + 1
    for s in sorted(counts):
        print(f"  fold {FOLDS[s]}  {s:18s} {counts[s]:5d}")
    print(f"{args.out}: {len(rows)} documents")


if __name__ == "__main__":
    main()
