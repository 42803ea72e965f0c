"""The heuristics stage's speed-ups change no decision, in either mode: `compat: quipu` runs
language_rules_fast's classes (words shared, per-distinct-word statistics, early stops) and
`compat: datatrove` tasks/gopher_quality_fast.py and heuristics.DocTokens' token strings; checked
against the reference code (language_rules' plain classes, uncached; datatrove's own class) on real
en/es/pt text, variants of it built to trip other rules, and the demo corpus. bench/heuristics_speed.py
--check-all compares every document of ../shared/data/text and the demo corpus, both modes."""
from __future__ import annotations

import json

import pyarrow as pa

from quipu.tasks import language_rules, language_rules_fast
from quipu.tasks.heuristics import HeuristicFilters, HeuristicsConfig
from quipu.tasks.languages import LANGUAGES


def documents(root, per_file: int = 8) -> tuple[list[str], list[str]]:
    """Real documents of every shared text file, each also as a bullet list, as lines ending in an
    ellipsis and cut to its first 60 words (short documents, lists, few stop words)."""
    texts, langs = [], []
    for path in sorted((root / "text").glob("*.jsonl")):
        lang = path.name[:2] if path.name[:2] in ("en", "es", "pt") else "en"
        with open(path, encoding="utf-8") as fh:
            for _, line in zip(range(per_file), fh):
                text = json.loads(line)["text"][:8000]
                words = text.split()
                for variant in (text, "\n".join("- " + " ".join(words[i:i + 4]) for i in range(0, 200, 4)),
                                "\n".join(" ".join(words[i:i + 9]) + " ..." for i in range(0, 300, 9)),
                                " ".join(words[:60])):
                    texts.append(variant)
                    langs.append(lang)
    return texts, langs


def verdicts(texts: list[str], langs: list[str], compat: str) -> list[tuple[str | None, str]]:
    batch = pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts, "lang": langs})
    out = HeuristicFilters(HeuristicsConfig(compat=compat)).process(batch)
    got = dict(zip(out.kept.column("id").to_pylist(), ((None, t) for t in out.kept.column("text").to_pylist())))
    got.update(zip(out.removed.column("id").to_pylist(), ((r, "") for r in out.removed.column("reason").to_pylist())))
    return [got[f"d{i}"] for i in range(len(texts))]


def demo_documents(scale: float = 0.1) -> tuple[list[str], list[str]]:
    """The demo corpus's documents (articles, spam, word salad, keyboard noise, short ones...)."""
    from quipu.synthetic.corpus import SEED, DocumentPlan
    docs = DocumentPlan(scale, seed=SEED).build()
    return [d.plain() for d in docs], [d.lang if d.lang in ("en", "es", "pt") else "en" for d in docs]


def reference_rules(monkeypatch) -> None:
    """`compat: quipu` as language_rules states it: its plain classes, no per-word caches."""
    for name in ("is_punct_only", "bare", "has_letter"):
        monkeypatch.setattr(language_rules, name, getattr(language_rules, name).__wrapped__)
    monkeypatch.setattr(language_rules, "words_of",
                        lambda text: [t for t in text.split() if not language_rules.is_punct_only(t)])
    monkeypatch.setattr(language_rules_fast, "RULES", dict(language_rules.RULES))


def test_quipu_mode_decides_as_the_reference_rules(shared_data, monkeypatch):
    texts, langs = documents(shared_data)
    demo_texts, demo_langs = demo_documents()
    texts, langs = texts + demo_texts, langs + demo_langs
    fast = verdicts(texts, langs, "quipu")
    reference_rules(monkeypatch)
    slow = verdicts(texts, langs, "quipu")
    assert fast == slow
    reasons = {r.split(":")[0] + ":" + r.split(":")[1] for r, _ in fast if r}
    assert len(reasons) >= 5 and sum(r is None for r, _ in fast) > 20, reasons      # many rules decided


def test_fast_statistics_are_the_reference_s(shared_data):
    """Every statistic (what `quipu calibrate` measures too), not only the verdicts, is the same number."""
    texts, langs = documents(shared_data, per_file=3)
    params = HeuristicsConfig()
    for text, lang in zip(texts, langs):
        for name in ("gopher_repetition", "gopher_quality", "fineweb"):
            kwargs = params.filter_config(name, lang).model_dump(exclude={"enabled"})
            if name == "gopher_quality":
                kwargs["stop_words"] = list(LANGUAGES[lang].stop_words)
            fast = language_rules_fast.RULES[name](language=lang, **kwargs).statistics(text)
            assert fast == language_rules.RULES[name](language=lang, **kwargs).statistics(text), (name, text[:80])


def test_datatrove_mode_gopher_quality_is_datatrove_s(shared_data):
    from datatrove.data import Document
    from datatrove.pipeline.filters import GopherQualityFilter

    from quipu.tasks.gopher_quality_fast import GopherQualityFast
    texts, langs = documents(shared_data)
    tok = {"en": "eng", "es": "spa", "pt": "por"}
    seen = set()
    for text, lang in zip(texts, langs):
        kwargs = dict(stop_words=list(LANGUAGES[lang].stop_words), language=tok[lang])
        want = GopherQualityFilter(**kwargs).filter(Document(text=text, id="x"))
        assert GopherQualityFast(**kwargs).filter(Document(text=text, id="x")) == want, text[:100]
        seen.add(want if want is True else want[1])
    assert len(seen) >= 4, seen
