"""The fluency stage: fluent junk (spun, n-gram generated) removed, prose kept, on text its shipped
models never saw (Python's documentation for English, Django's Spanish catalogues), per language."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from quipu.synthetic.fluent_junk import NgramGenerator, fluent_junk, sentences, spin
from quipu.tasks.fluency import FluencyConfig, FluencyFilter, FluencyModel
from tests.textgen import python_doc_paragraphs


def english_prose(n: int = 120) -> list[str]:
    paras = [p for p in python_doc_paragraphs() if len(sentences(p)) >= 3 and len(p.split()) >= 50]
    return paras[:n]


def spanish_prose() -> list[str]:
    from quipu.synthetic.sources import catalogue_articles
    return [a.plain() for a in catalogue_articles("es") if len(a.plain().split()) >= 50]


def judge(texts: list[str], lang: str, **config) -> tuple[pa.Table, pa.Table]:
    stage = FluencyFilter(FluencyConfig(enabled=True, languages=[lang], **config))
    stage.check()
    out = stage.process(pa.table({"id": [str(i) for i in range(len(texts))], "text": texts, "lang": [lang] * len(texts)}))
    return out.kept, out.removed


@pytest.mark.parametrize("lang, prose", [("en", english_prose), ("es", spanish_prose)])
def test_spun_text_removed_and_prose_kept_on_unseen_text(lang, prose):
    texts = prose()
    assert len(texts) >= 30
    kept, removed = judge(texts, lang)
    kept_share = kept.num_rows / len(texts)
    rng = random.Random(1)
    spun = [spin(t, rng) for t in texts]
    _, spun_removed = judge(spun, lang)
    print(f"{lang}: prose kept {kept_share:.3f} of {len(texts)}, spun removed {spun_removed.num_rows / len(spun):.3f}")
    assert kept_share >= 0.9, removed.column("reason").to_pylist()[:5]
    assert spun_removed.num_rows / len(spun) >= 0.9
    assert set(spun_removed.column("reason").to_pylist()) <= {r for r in spun_removed.column("reason").to_pylist()
                                                              if r.startswith("fluency:")}


def test_generated_text_mostly_removed(shared_data):
    """Text sampled from n-gram models (orders 2-4) of news prose loses its topic: most is removed.
    (From a small single-topic corpus, e.g. 100 paragraphs of Python's docs, it keeps repeating the
    topic's words and mostly passes: docs/quality.md, Fluent junk.)"""
    import json
    texts = [json.loads(line)["text"] for line in open(shared_data / "text" / "en_nltk_abc_news.jsonl")][:1000]
    rng = random.Random(2)
    models = {order: NgramGenerator(texts, order) for order in (2, 3, 4)}   # each built once
    generated = [models[order].generate(rng, rng.randint(60, 250)) for order in (2, 3, 4) for _ in range(20)]
    _, removed = judge(generated, "en")
    assert removed.num_rows / len(generated) >= 0.7
    assert any(r.startswith("fluency:burstiness<") for r in removed.column("reason").to_pylist())


def test_other_languages_and_short_texts_pass_unjudged():
    texts = ["Le chat dort sur le tapis. " * 20, "Too short to judge. Really."]
    stage = FluencyFilter(FluencyConfig(enabled=True))
    out = stage.process(pa.table({"id": ["a", "b"], "text": texts, "lang": ["fr", "en"]}))
    assert out.kept.num_rows == 2 and out.removed.num_rows == 0
    assert out.kept.column("fluency_word_order").to_pylist() == [None, None]


def test_fit_is_deterministic_and_missing_model_is_one_line(tmp_path):
    texts = english_prose(40)
    a, b = FluencyModel.fit("en", texts), FluencyModel.fit("en", texts)
    a.save(tmp_path / "a.json")
    b.save(tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    stage = FluencyFilter(FluencyConfig(enabled=True, languages=["gl"]))
    with pytest.raises(FileNotFoundError, match="fluency: no model for 'gl'"):
        stage.check()


def test_fluent_junk_generator_is_deterministic():
    texts = english_prose(60)
    assert fluent_junk("en", texts, 12, seed=4) == fluent_junk("en", texts, 12, seed=4)
    assert {d["kind"] for d in fluent_junk("en", texts, 12, seed=4)} == {"spun", "generated", "doorway"}


def test_cutoffs_come_from_held_out_folds_and_too_little_reference_is_one_line():
    """fit_with_cutoffs (what `quipu calibrate --fluency-model` runs): the burstiness cut-off is the
    1.5th percentile of scores by models that did not see the scored documents, word order halfway
    between held-out prose's 1.5th percentile and its spun copies' 95th; a reference with too few long documents is refused in one line."""
    from quipu.tasks.fluency import fit_with_cutoffs, percentile
    texts = english_prose(60)
    model, held = fit_with_cutoffs("en", texts)
    assert model.cutoffs["burstiness"] == round(percentile(held["reference"]["burstiness"], 1.5), 3)
    low, spun = percentile(held["reference"]["word_order"], 1.5), percentile(held["spun"], 95)
    assert model.cutoffs["word_order"] == round((low + spun) / 2, 3)
    assert len(held["reference"]["burstiness"]) == len(held["spun"]) == len(texts)   # every document scored once, held out
    own = FluencyModel.fit("en", texts)      # the model scores its own text more kindly than held-out folds do
    assert sorted(own.burstiness(t) for t in texts)[1] > model.cutoffs["burstiness"]
    with pytest.raises(ValueError, match="too few") as e:
        fit_with_cutoffs("en", texts[:12])
    assert "\n" not in str(e.value)


def test_backoff_sentence_generator_writes_new_ngrams_in_whole_sentences():
    """The bench's second generator (a different kind from NgramGenerator): deterministic, whole
    detokenised sentences, and through backoff word trigrams that no reference text has."""
    from quipu.synthetic.fluent_junk import BackoffSentenceGenerator
    prose = python_doc_paragraphs()
    gen = BackoffSentenceGenerator(prose, 3)
    a, b = (gen.generate(random.Random(5), 120) for _ in range(2))
    assert a == b and len(a.split()) >= 120
    assert all(s[-1] in ".!?" for s in sentences(a)) and " ," not in a and " ." not in a
    seen = {tuple(w[i:i + 3]) for t in prose for w in [t.split()] for i in range(len(w) - 2)}
    inside = [tuple(w[i:i + 3]) for s in sentences(a) for w in [s.split()] for i in range(len(w) - 2)]
    assert any(g not in seen for g in inside)      # within a sentence, not across a sentence break


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_word_order_is_the_mean_gain_of_the_ngram_ending_at_each_token(order):
    """word_order's windowed fast path equals its definition: per token after `<s>`, the log-probability of
    the class n-gram ending there (shorter at the start) minus its unigram's, averaged; any order, any
    length, summed in the same order (so the scores are the same floats)."""
    from quipu.tasks.fluency import classes
    reference = ["the cat sat on the mat . " * 20, "el perro come pan en la casa . " * 20]
    model = FluencyModel.fit("xx", reference, function_words=5, common_stems=5, order=order, min_count=1)
    for text in ["", "a", "A b.", "Uno dos tres cuatro cinco seis.", "x " * 30, *reference]:
        c = classes(text, model.function_words)
        total = 0.0
        for i in range(1, len(c)):
            gram = tuple(c[max(0, i - order + 1):i + 1])
            total += model.logprob(gram) - model.logprob(gram[-1:])
        assert model.word_order(text) == ((total / (len(c) - 1) if len(c) > 1 else 0.0), len(c) - 1)
