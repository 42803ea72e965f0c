"""Issue 13, contamination in disguise: benchmark items copied with their punctuation removed,
changed or inserted, apostrophes dropped, case/whitespace/line breaks changed, homoglyphs,
full-width forms or accents stripped are still found, in English, Spanish and Portuguese, and short
items (10-20 words, the length of TruthfulQA/MMLU questions) most of all.

English items are the real GSM8K test questions. Spanish and Portuguese items are sentences of
10-30 words from two real corpora (Spanish news, Brazilian news) declared as benchmarks, the way a
team registers its own es/pt evaluation sets; they are planted into documents of OTHER corpora, and
false positives are counted on every shared document of the corpora the items do not come from.
"""
from __future__ import annotations

import json
import random
import re
import time
import unicodedata
from pathlib import Path

import pyarrow as pa
import pytest

from quipu.tasks.benchmark_index import normalize
from quipu.tasks.decontam import DecontamConfig, Decontaminate

ITEM_SOURCES = {"es_items": "es_nltk_cess_esp_news.jsonl", "pt_items": "pt_fakebr_news.jsonl"}
CYRILLIC = dict(zip("aeopcxyAEOPCXHKMT", "аеорсхуАЕОРСХНКМТ"))


def _sentences(path: Path, rng: random.Random, k: int) -> list[str]:
    found = []
    for line in open(path, encoding="utf-8"):
        for s in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]):
            words = s.split()
            # an item of a real evaluation set reads as a sentence: letters, some punctuation
            if 10 <= len(words) <= 30 and sum(c.isalpha() for c in s) > 0.7 * len(s) and re.search(r"[,.;:'’-]", s):
                found.append(" ".join(words))
    return rng.sample(sorted(set(found)), k)


# ---- disguises: each takes the item and a seeded rng ------------------------------------------

def no_punct(t, rng):
    return re.sub(r"[^\w\s]", "", t)


def no_apostrophes(t, rng):
    return t.replace("'", "").replace("’", "")


def changed_punct(t, rng):
    return re.sub(r"[,.;:!?]", lambda m: rng.choice([";", ",", " -", ".", ""]), t)


def inserted_punct(t, rng):
    words = t.split()
    out = []
    for w in words:
        if len(w) > 4 and rng.random() < 0.15:           # inside a word
            i = rng.randrange(1, len(w) - 1)
            w = w[:i] + rng.choice(".-'") + w[i:]
        out.append(w + (rng.choice([",", ";", " ,", ":"]) if rng.random() < 0.25 else ""))
    return " ".join(out)


def case_and_space(t, rng):
    words = [rng.choice([w.upper(), w.lower(), w.title(), w.swapcase()]) for w in t.split()]
    return "".join(w + rng.choice([" ", "  ", "\n", "\t", " \n "]) for w in words).strip()


def homoglyphs(t, rng):
    return "".join(CYRILLIC[c] if c in CYRILLIC and rng.random() < 0.5 else c for c in t)


def full_width(t, rng):
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else ("\u3000" if c == " " else c) for c in t)


def no_accents(t, rng):
    return "".join(c for c in unicodedata.normalize("NFD", t) if unicodedata.category(c) != "Mn")


def everything(t, rng):
    for f in (no_accents, no_apostrophes, inserted_punct, case_and_space, homoglyphs):
        t = f(t, rng)
    return t


DISGUISES = [no_punct, no_apostrophes, changed_punct, inserted_punct, case_and_space, homoglyphs, full_width,
             no_accents, everything]


# ---- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(shared_data, tmp_path_factory):
    import yaml
    rng = random.Random(13)
    d = tmp_path_factory.mktemp("disguise-benchmarks")
    items: dict[str, list[tuple[str, str]]] = {}
    gsm = [json.loads(line) for line in open(shared_data / "benchmarks" / "gsm8k_test.jsonl")]
    items["gsm8k"] = [(g["id"], g["text"]) for g in rng.sample(gsm, 120)]
    (d / "gsm8k.yaml").write_text(yaml.safe_dump({"name": "gsm8k", "path": str(shared_data / "benchmarks" / "gsm8k_test.jsonl"),
                                                  "fields": ["text", "answer"], "id_field": "id"}))
    for name, src in ITEM_SOURCES.items():
        sents = _sentences(shared_data / "text" / src, rng, 120)
        items[name] = [(f"{name}-{i}", s) for i, s in enumerate(sents)]
        path = d / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"id": i, "question": s}, ensure_ascii=False) + "\n" for i, s in items[name]))
        (d / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "path": str(path), "fields": ["question"], "id_field": "id"}))
    cfg = DecontamConfig(benchmarks=["gsm8k", *ITEM_SOURCES], registry_dir=str(d),
                         cache_dir=str(tmp_path_factory.mktemp("disguise-cache")))
    clean = []
    for path in sorted((shared_data / "text").glob("*.jsonl")):
        if path.name in ITEM_SOURCES.values():
            continue          # the corpora the es/pt items come from contain them for real
        clean.extend(json.loads(line) for line in open(path, encoding="utf-8"))
    return cfg, items, clean


def _table(docs: list[dict]) -> pa.Table:
    return pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]})


# ---- tests ------------------------------------------------------------------------------------

def test_disguised_items_are_found_in_every_language(setup):
    cfg, items, clean = setup
    rng = random.Random(7)
    hosts = [d for d in clean if 60 <= len(d["text"].split()) <= 1500]
    planted, expect = [], {}
    for bench, chosen in items.items():
        for item_id, text in chosen:
            for disguise in DISGUISES:
                host = rng.choice(hosts)["text"]
                cut = rng.choice([m.end() for m in re.finditer(r"[.!?]\s", host)] or [len(host)])
                doc_id = f"{bench}/{item_id}/{disguise.__name__}"
                planted.append({"id": doc_id, "text": host[:cut] + "\n" + disguise(text, rng) + "\n" + host[cut:]})
                expect[doc_id] = (bench, item_id)
    out = Decontaminate(cfg).process(_table(planted))
    missed = out.kept.column("id").to_pylist()
    by_lang: dict[str, list[int]] = {}
    for doc_id in expect:
        by_lang.setdefault(doc_id.split("/")[0], [0, 0])[1] += 1
    for doc_id in missed:
        by_lang[doc_id.split("/")[0]][0] += 1
    recall = {b: 1 - m / n for b, (m, n) in by_lang.items()}
    print(f"disguise recall per benchmark: {recall} ({len(planted)} planted, {len(DISGUISES)} disguises)")
    assert all(r >= 0.99 for r in recall.values()), (recall, missed[:10])
    for doc_id, reason, hits in zip(out.removed.column("id").to_pylist(), out.removed.column("reason").to_pylist(),
                                    out.removed.column("decontam_hits").to_pylist()):
        bench, item_id = expect[doc_id]
        assert item_id in {h["item"] for h in hits}, doc_id


def test_clean_documents_are_rarely_flagged(setup):
    cfg, _, clean = setup
    assert len(clean) >= 5000
    out = Decontaminate(cfg).process(_table(clean))
    rate = out.removed.num_rows / len(clean)
    print(f"false positives: {out.removed.num_rows} of {len(clean)} clean documents ({rate:.4%})")
    assert rate <= 0.002, out.removed.select(["id", "decontam_hits"]).to_pylist()[:5]


def test_normalisation_is_the_same_for_every_disguise():
    rng = random.Random(1)
    text = "¿Qué pasó? No sé — dijo María: «el coche está allí», don't you think so, señor O'Brien?"
    base = normalize(text)
    for disguise in (no_punct, no_apostrophes, case_and_space, homoglyphs, full_width, no_accents):
        assert normalize(disguise(text, rng)) == base, disguise.__name__


def test_combining_mark_flood_costs_linear_time():
    """200,000 combining marks on one letter took 28 s (NFKC reorders a run in quadratic time)."""
    t0 = time.perf_counter()
    assert normalize("a" + "\u0301" * 200_000 + " b " + "\u0300\u0301" * 50_000) == "a b"
    assert time.perf_counter() - t0 < 3
