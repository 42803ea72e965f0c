"""A realistic raw mix for `quipu ablate`, built from real text files (`../shared/data/text`) the
way the demo corpus is built (synthetic/corpus.py): part of the documents rendered as web pages (cookie
banner, navigation, sidebar, footer around the text) in WARC files, the rest as JSONL text dumps,
plus the junk a crawl brings: exact copies under other URLs, near-duplicates (1-3 words changed),
first-sentence stubs, word salad, keyboard noise, spam, boilerplate-only pages, and whatever
non-target languages the listed files hold. Real crawls (the shared WARC/ARC files) join the mix
as they are, as globs in the ablation's `input`.

`ensure_mix(cfg)` writes, deterministically (fixed seed, WARC dates and record ids, gzip without
timestamps), under `cfg.out`:

    raw/crawl-NNNNN.warc.gz, raw/dump-NNNNN.jsonl.gz    the inputs
    labels.jsonl                                        what each record is (kind, lang, origin): not an input
    manifest.json                                       version, config hash, file hashes, counts per kind

and rebuilds only when the manifest does not match. Held-out evaluation text must come from other
files: the builder never reads anything but `cfg.text`.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from quipu.catalog.files import atomic_path, read_json, sha256_file, sha256_json, write_json_atomic
from quipu.synthetic.corpus import Doc, DocumentPlan, JsonlPackager, PageRenderer, Site, WarcPackager, slug
from quipu.synthetic.sources import Block
from quipu.trainer.text_source import TextSource, read_source

MIX_VERSION = 1
MANIFEST = "manifest.json"


class JunkShares(BaseModel):
    """Planted junk, as a share of the number of real documents."""
    model_config = ConfigDict(extra="forbid")
    exact_duplicate: float = Field(0.12, ge=0, le=2)
    near_duplicate: float = Field(0.06, ge=0, le=2)
    short: float = Field(0.04, ge=0, le=1)
    word_salad: float = Field(0.04, ge=0, le=1)
    keyboard_noise: float = Field(0.015, ge=0, le=1)
    spam: float = Field(0.03, ge=0, le=1)
    boilerplate_only: float = Field(0.03, ge=0, le=1)


class RawMixConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    out: str = Field("data/ablate-mix", description="folder the mix is written to (raw/ holds the inputs)")
    text: list[TextSource] = Field(min_length=1, description="real text files whose documents make up the mix")
    scale: float = Field(1.0, gt=0, le=1, description="fraction of each file's documents taken (tests use a small one)")
    html_share: float = Field(0.4, ge=0, le=1, description="share of documents rendered as web pages in WARC files")
    warc_files: int = Field(3, ge=1)
    jsonl_files: int = Field(2, ge=1)
    junk: JunkShares = JunkShares()
    seed: int = 20261125

    @field_validator("text")
    @classmethod
    def _files(cls, v: list[TextSource]):
        if any(s.path is None for s in v):
            raise ValueError("raw_mix.text: every entry needs a path (a JSONL file)")
        return v


def _article(rec: dict, src: TextSource, k: int) -> Doc:
    text = rec["text"]
    paras = [p.strip() for p in text.split("\n\n") if p.strip()]
    title = " ".join(paras[0].split()[:10])[:80] if paras else "untitled"
    name = src.label()
    site = Site(f"{slug(name, 30)}.example.org", name, rec.get("lang") or "en", "articles")
    return Doc("article", rec.get("lang") or "xx", title, [Block("p", p) for p in paras], site,
               f"/articles/{slug(title, 40)}-{k}", f"{Path(src.path).name}:{rec.get('id')}")


def plan_documents(cfg: RawMixConfig) -> list[Doc]:
    rng = random.Random(cfg.seed)
    articles: list[Doc] = []
    for src in cfg.text:
        recs = [d for d in read_source(src) if d["text"].strip()]
        k = max(1, round(len(recs) * cfg.scale))
        picked = sorted(rng.sample(range(len(recs)), min(k, len(recs))))
        articles += [_article(recs[i], src, i) for i in picked]
    # synthetic/corpus.py's junk makers, fed with these articles
    junk = DocumentPlan(1.0, rng.randrange(2**32))
    n = {kind: round(share * len(articles)) for kind, share in cfg.junk.model_dump().items()}
    long_articles = [d for d in articles if len(d.plain().split()) >= 150] or articles
    docs = list(articles)
    docs += [junk._exact_duplicate(d) for d in rng.sample(articles, min(n["exact_duplicate"], len(articles)))]
    docs += [junk._near_duplicate(d) for d in rng.sample(long_articles, min(n["near_duplicate"], len(long_articles)))]
    docs += [junk._short(rng.choice(articles), i) for i in range(n["short"])]
    docs += [junk._word_salad(rng.choice(long_articles), i) for i in range(n["word_salad"])]
    docs += [junk._keyboard_noise(i) for i in range(n["keyboard_noise"])]
    docs += [junk._spam(i) for i in range(n["spam"])]
    docs += [junk._boilerplate_only(i) for i in range(n["boilerplate_only"])]
    for d in docs:
        d.channel = "warc" if d.boilerplate_only or rng.random() < cfg.html_share else "jsonl"
    rng.shuffle(docs)
    DocumentPlan._dedupe_urls(docs)
    return docs


def build_mix(cfg: RawMixConfig) -> list[Path]:
    out = Path(cfg.out)
    raw = out / "raw"
    docs = plan_documents(cfg)
    pool = [d for d in docs if d.kind == "article"]
    warc_docs = [d for d in docs if d.channel == "warc"]
    jsonl_docs = [d for d in docs if d.channel == "jsonl"]
    packer = WarcPackager(random.Random(cfg.seed + 2), PageRenderer(random.Random(cfg.seed + 3)))
    files, labels = [], []
    for i in range(cfg.warc_files):
        path = raw / f"crawl-{i:05d}.warc.gz"
        labels += packer.write(path, warc_docs[i::cfg.warc_files], pool, with_request=False)
        files.append(path)
    jp = JsonlPackager(random.Random(cfg.seed + 4))
    for i in range(cfg.jsonl_files):
        path = raw / f"dump-{i:05d}.jsonl.gz"
        labels += jp.write(path, jsonl_docs[i::cfg.jsonl_files], f"{i}")
        files.append(path)
    for old in raw.glob("*"):     # a file an earlier build with another config left would join the input glob
        if old not in files:
            old.unlink()
    with atomic_path(out / "labels.jsonl") as tmp:
        tmp.write_text("".join(json.dumps(x, ensure_ascii=False, sort_keys=True) + "\n" for x in labels))
    kinds: dict[str, int] = {}
    langs: dict[str, int] = {}
    for x in labels:
        kinds[x["kind"]] = kinds.get(x["kind"], 0) + 1
        if x["kind"] == "article":
            langs[x["lang"]] = langs.get(x["lang"], 0) + 1
    write_json_atomic(out / MANIFEST, {
        "version": MIX_VERSION, "config": sha256_json(cfg.model_dump(mode="json")),
        "files": {p.name: sha256_file(p) for p in files}, "records": len(labels),
        "kinds": dict(sorted(kinds.items())), "article_languages": dict(sorted(langs.items())),
        "sources": [s.label() for s in cfg.text]})
    return files


def built_mix(cfg: RawMixConfig) -> list[Path] | None:
    out = Path(cfg.out)
    try:
        m = read_json(out / MANIFEST)
    except (FileNotFoundError, ValueError):
        return None
    if (m.get("version"), m.get("config")) != (MIX_VERSION, sha256_json(cfg.model_dump(mode="json"))):
        return None
    files = [out / "raw" / name for name in m["files"]]
    if all(p.is_file() and sha256_file(p) == h for p, h in zip(files, m["files"].values())):
        return files
    return None


def ensure_mix(cfg: RawMixConfig) -> tuple[list[Path], bool]:
    """(input files, whether they were built now)."""
    files = built_mix(cfg)
    if files is not None:
        return files, False
    return build_mix(cfg), True
