"""Heuristic filters: datatrove's rules as they are, per language, a reason for every removal."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from quipu.tasks.heuristics import HeuristicFilters, HeuristicsConfig
from quipu.tasks.languages import LANGUAGES

EN = ("The river rose slowly through the night, and by morning the old bridge was under water. "
      "Families in the lower town carried what they could to the church on the hill. "
      "The mayor said that the council would meet again on Friday to decide what to do next. "
      "Volunteers with boats helped the last people leave their homes before the water reached them. "
      "Nobody was hurt, but many of the shops along the main street will be closed for weeks. "
      "Engineers have warned for years that the bridge was too low for a flood of this size.\n")
ES = ("El río subió lentamente durante la noche y por la mañana el viejo puente estaba bajo el agua. "
      "Las familias de la parte baja del pueblo llevaron lo que pudieron a la iglesia de la colina. "
      "El alcalde dijo que el consejo se reunirá de nuevo el viernes para decidir qué hacer. "
      "Los voluntarios con barcas ayudaron a las últimas personas a salir de sus casas a tiempo. "
      "Nadie resultó herido, pero muchas de las tiendas de la calle principal estarán cerradas. "
      "Los ingenieros llevaban años advirtiendo que el puente era demasiado bajo para una crecida así.\n")


def table(texts, langs):
    return pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts, "lang": langs})


def test_reasons_name_filter_and_rule():
    stage = HeuristicFilters(HeuristicsConfig())
    texts = [EN, "A short note about nothing much.", ("same line repeated here\n" * 40), ES, "a b c d e f g h i j k " * 30]
    out = stage.process(table(texts, ["en", "en", "en", "es", "en"]))
    reasons = dict(zip(out.removed.column("id").to_pylist(), out.removed.column("reason").to_pylist()))
    assert out.kept.column("id").to_pylist() == ["d0", "d3"]
    assert reasons["d1"] == "gopher_repetition:top_2_gram"  # datatrove's order: repetition first
    assert reasons["d2"].startswith("gopher_repetition:")
    assert reasons["d4"].split(":")[0] in {"gopher_repetition", "gopher_quality"}
    assert all(":" in r for r in reasons.values())
    # removed rows keep their original text; the stage's input = kept + removed
    assert out.removed.num_rows + out.kept.num_rows == len(texts)
    assert out.removed.filter(pa.compute.equal(out.removed.column("id"), "d2")).column("text")[0].as_py() == texts[2]


def test_spanish_needs_spanish_stop_words():
    """Gopher's stop-word rule with English stop words removes good Spanish; ours keeps it."""
    ours = HeuristicFilters(HeuristicsConfig())
    english_only = HeuristicFilters(HeuristicsConfig(stop_words={"es": list(LANGUAGES["en"].stop_words)}))
    assert ours.process(table([ES], ["es"])).kept.num_rows == 1
    out = english_only.process(table([ES], ["es"]))
    assert out.removed.column("reason").to_pylist() == ["gopher_quality:gopher_enough_stop_words"]


def test_same_verdicts_as_datatrove_filters(shared_data):
    """Our stage gives the verdict and reason of datatrove's own filter chain on real documents."""
    from datatrove.data import Document
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter)
    docs = []
    for name, lang in (("en_nltk_webtext.jsonl", "en"), ("es_nltk_cess_esp_news.jsonl", "es"), ("pt_fakebr_news.jsonl", "pt")):
        with open(shared_data / "text" / name) as fh:
            docs += [(json.loads(next(fh))["text"], lang) for _ in range(40)]
    tok = {"en": "eng", "es": "spa", "pt": "por"}
    chains = {lang: [("gopher_repetition", GopherRepetitionFilter(language=tok[lang])),
                     ("gopher_quality", GopherQualityFilter(stop_words=list(LANGUAGES[lang].stop_words), language=tok[lang])),
                     ("c4", C4QualityFilter(filter_no_terminal_punct=False, language=tok[lang])),
                     ("fineweb", FineWebQualityFilter(language=tok[lang]))] for lang in tok}
    expected = []
    for text, lang in docs:
        d = Document(text=text, id="x")
        reason = None
        for name, f in chains[lang]:
            v = f.filter(d)
            ok, rule = v if isinstance(v, tuple) else (v, None)
            if not ok:
                reason = f"{name}:{rule or 'failed'}"
                break
        expected.append((reason, d.text if reason is None else text))
    out = HeuristicFilters(HeuristicsConfig()).process(table([t for t, _ in docs], [lang for _, lang in docs]))
    kept = dict(zip(out.kept.column("id").to_pylist(), out.kept.column("text").to_pylist()))
    removed = dict(zip(out.removed.column("id").to_pylist(), out.removed.column("reason").to_pylist()))
    for i, (reason, text) in enumerate(expected):
        if reason is None:
            assert kept[f"d{i}"] == text          # C4's line edits included
        else:
            assert removed[f"d{i}"] == reason
    assert 0 < len(kept) < len(docs)


def test_per_language_overrides_and_switches():
    cfg = HeuristicsConfig(per_language={"es": {"gopher_quality": {"min_doc_words": 5000}}})
    out = HeuristicFilters(cfg).process(table([EN, ES], ["en", "es"]))
    assert out.kept.column("id").to_pylist() == ["d0"]
    assert out.removed.column("reason").to_pylist() == ["gopher_quality:gopher_short_doc"]
    no_rep = HeuristicsConfig(gopher_repetition={"enabled": False})
    out = HeuristicFilters(no_rep).process(table(["A short note about nothing much."], ["en"]))
    assert out.removed.column("reason").to_pylist() == ["gopher_quality:gopher_short_doc"]
    off = HeuristicsConfig(gopher_quality={"enabled": False}, gopher_repetition={"enabled": False},
                           c4={"enabled": False}, fineweb={"enabled": False})
    assert HeuristicFilters(off).process(table(["x"], ["en"])).kept.num_rows == 1
    with pytest.raises(ValueError, match="per_language.es.gopher: unknown filter"):
        HeuristicsConfig(per_language={"es": {"gopher": {}}})
    with pytest.raises(ValueError, match="min_doc_words"):
        HeuristicsConfig(per_language={"es": {"gopher_quality": {"min_doc_words": "many"}}})


def test_a_rule_that_fails_removes_the_document_visibly():
    stage = HeuristicFilters(HeuristicsConfig())

    class Broken:
        def filter(self, doc):
            raise ValueError("boom")

    stage._chains["en"] = [("broken", Broken())]
    out = stage.process(table([EN], ["en"]))
    assert out.removed.column("reason").to_pylist() == ["broken:error:ValueError"]


def test_one_tokenisation_answers_as_datatrove(shared_data):
    """While a document is judged, words and sentences come from one tokenisation of the document
    (`SharedTokens`): they must be datatrove's own answers for the document, every line of it, the
    text C4 leaves (lines dropped, citations cut) and lines that are not the document's."""
    import datatrove.utils.text as dt
    from datatrove.pipeline.filters.c4_filters import CITATION_REGEX
    from quipu.tasks.heuristics import SharedTokens
    SharedTokens.install()
    datatrove_parts = dt.split_into_parts.__wrapped__
    checked = 0
    for path in sorted((shared_data / "text").glob("*.jsonl")):
        lang = {"en": "eng", "es": "spa", "pt": "por"}.get(path.name[:2], "eng")
        with open(path, encoding="utf-8") as fh:
            texts = [json.loads(line)["text"] for _, line in zip(range(12), fh)]
        texts.append("Odd  spacing .. and\ttabs!\n\n  Indented [1] line?  Yes .\r\nA line\u2028after a separator.\x0cEnd")
        for text in texts:
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            c4_text = "\n".join(CITATION_REGEX.sub("", line) for line in lines if len(line.split()) >= 3).strip()
            asks = ([(text, "WORDS"), (c4_text, "WORDS"), (text, "SENTENCE"), ("Not from it. At all", "SENTENCE")]
                    + [(line, "SENTENCE") for line in lines] + [(CITATION_REGEX.sub("", line), "SENTENCE") for line in lines])
            SharedTokens.judging(text)
            try:
                ours = [SharedTokens.parts(t, mode, lang, datatrove_parts) for t, mode in asks]
            finally:
                SharedTokens.judging(None)
            for (t, mode), got in zip(asks, ours):
                assert got == datatrove_parts(t, mode, lang), (path.name, mode, t[:80])
                checked += 1
    assert checked > 2000


def test_gopher_repetition_counts_as_datatrove(shared_data):
    """`WordStats` gives datatrove's own top n-gram and repeated n-gram counts: on real words and on
    word lists built to repeat (including concatenations that repeat across word boundaries,
    "ab"+"c" = "a"+"bc", which datatrove's join without spaces counts)."""
    import random

    import datatrove.pipeline.filters.gopher_repetition_filter as rep
    from datatrove.utils.text import split_into_words
    from quipu.tasks.gopher_counts import NGrams, WordStats
    from quipu.tasks.heuristics import SharedTokens
    # outside a judged document datatrove's helpers (patched or not) run datatrove's own code
    assert SharedTokens._memo is None
    rng = random.Random(7)
    cases = []
    for path in sorted((shared_data / "text").glob("*.jsonl"))[:6]:
        with open(path, encoding="utf-8") as fh:
            cases += [split_into_words(json.loads(line)["text"], "eng") for _, line in zip(range(6), fh)]
    vocab = ["a", "b", "ab", "ba", "abc", "c", "bc", "é", "😀"]
    cases += [[rng.choice(vocab) for _ in range(rng.randint(0, 50))] for _ in range(300)]
    cases += [[rng.choice(vocab) for _ in range(6)] * rng.randint(1, 5) for _ in range(50)]
    for words in cases:
        stats = WordStats(words)
        for n in (2, 3, 4):
            grams = rep.get_n_grams(words, n)
            if grams:
                assert not isinstance(grams, NGrams)
                assert stats.top_duplicate(n) == rep.find_top_duplicate(grams), (words[:10], n)
        for n in range(5, 11):
            assert stats.all_duplicate(n) == rep.find_all_duplicate(words, n), (words[:10], n)
