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


def test_ngram_counts_are_datatrove_s_even_when_every_hash_collides(monkeypatch):
    """`WordStats`' repeated n-grams confirm each hash match by comparing strings: with every n-gram
    given the same key (the worst collision), and on Thue-Morse words (what breaks hashes modulo
    2**64), the counts are still datatrove's own; so are the top n-gram counts (ties to the first)."""
    import random

    import datatrove.pipeline.filters.gopher_repetition_filter as rep
    import numpy as np

    from quipu.tasks.gopher_counts import WordStats
    rng = random.Random(11)
    thue = "".join("ab"[bin(i).count("1") % 2] for i in range(4096))
    vocab = ["a", "b", "ab", "ba", "abc", "c", "bc", "é", "😀"]
    cases = [[rng.choice(vocab) for _ in range(rng.randint(0, 60))] for _ in range(150)]
    cases += [[rng.choice(vocab) for _ in range(7)] * rng.randint(1, 5) for _ in range(30)]
    cases += [[thue[i:i + 64] for i in range(0, 4096, 64)], [thue[i:i + 8] for i in range(0, 2048, 5)]]
    for collide in (False, True):
        if collide:
            monkeypatch.setattr(WordStats, "ngram_keys", lambda self, n: np.zeros(max(0, len(self.words) - n + 1), np.uint64))
        for words in cases:
            stats = WordStats(words)
            for n in range(5, 11):
                assert stats.all_duplicate(n) == rep.find_all_duplicate(words, n), (collide, words[:10], n)
            for n in (2, 3, 4):
                if len(words) >= n:
                    top = stats.top_duplicate(n)
                    assert top == rep.find_top_duplicate(rep.get_n_grams(words, n)), (words[:10], n)
                    assert top <= stats.top_bound(n), (words[:10], n)      # what `check` may skip on


def test_word_classes_are_the_reference_tests_on_every_code_point():
    """`compat: quipu`'s per-word answers by regex over a text's distinct words (language_rules_fast:
    punctuation only, no letter, bare forms): their character runs are the per-character tests' on
    every code point; the answers are language_rules' own on every character up to U+FFFF, past it on
    each run's edges and a sample, and on words mixing punctuation, letters, digits, marks, Greek
    sigma and characters past U+FFFF (the classes without those serve text without them)."""
    import random
    import sys
    import unicodedata
    from itertools import compress, filterfalse

    import numpy as np

    from quipu.tasks.language_rules_fast import bare_forms, char_ranges, words_matching

    def runs(holds) -> tuple:
        edges = np.diff(np.concatenate(([0], np.fromiter(holds, np.int8, sys.maxunicode + 1), [0])))
        return tuple(zip(np.flatnonzero(edges == 1).tolist(), (np.flatnonzero(edges == -1) - 1).tolist()))
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    assert char_ranges("letter") == runs(map(str.isalpha, every))
    assert char_ranges("punct") == runs(c == "P" for c, *_ in map(unicodedata.category, every))
    rng = random.Random(3)
    edges = {c for a, b in char_ranges("punct") + char_ranges("letter") for c in (a - 1, a, b, b + 1)}
    astral = sorted(c for c in edges | set(rng.sample(range(0x10000, sys.maxunicode + 1), 20000)) if 0xFFFF < c <= sys.maxunicode)
    chars = [c for c in every[:0x10000] if not c.isspace()] + list(map(chr, astral))
    pool = list(".,;:!?¡¿«»\"'()[]-–—…·#$%&*/@_|~0123456789aeioucñçãõéíóúΣσςİßﬁ") + ["\u0301", "\u200d", "😀", "𝐀", "\U00010100", "\ud800"]
    mixed = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 7))) for _ in range(20000)]
    punct_only, has_letter, bare = (getattr(language_rules, n).__wrapped__ for n in ("is_punct_only", "has_letter", "bare"))
    for words in (chars, [c for c in chars if c <= "\uffff"], mixed, [w for w in mixed if max(w) <= "\uffff"]):
        assert set(words_matching("punct_only", words)) == set(compress(words, map(punct_only, words)))
        assert set(words_matching("no_letter", words)) == set(filterfalse(has_letter, words))
        assert bare_forms(words) == list(map(bare, words))
    assert bare_forms([]) == [] and words_matching("punct_only", []) == []


def test_quipu_c4_whole_text_prechecks_edit_as_the_reference():
    """C4Fast leaves out a per-line test that can find nothing in the whole text (long words,
    citations, lower-cased substrings): the same verdicts, edited texts and sentence counts as
    C4Rules on text built to sit on those edges (a citation inside "lorem ipsum", upper case,
    dotted capital I, Greek sigma, every line break str.splitlines knows); and a substring holding
    a sigma turns the text-level search off."""
    lines = ["Lorem[1] ipsum dolor sit amet.", "Uses JavaScript[edit] here, ok.", "Our Privacy[citation needed] Policy applies here.",
             "  ΟΔΟΣ ΣΟΦΙΑΣ είναι εδώ. Και εκεί.  ", "İstanbul is big. İt is.", "{a} b c d.", "x" * 1001 + " y z.",
             "Three short words.", "a b", "Plain line one. Two. Three. Four. Five. Six."]
    seps = ["\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"]
    texts = [sep.join(lines[i:] + lines[:i]) for i, sep in enumerate(seps)]
    texts += [sep.join(lines[3:5] + lines[7:] + [lines[i]]) for sep in ("\n", "\u2028") for i in range(len(lines))]
    texts += ["Privacy[3] policy here. " * 3, "lorem [1]ipsum x y.", "Normal text here. Más texto aquí. Y otro."]
    for params in ({}, {"remove_citations": False}, {"max_word_length": -1}, {"filter_policy": False, "filter_javascript": False}):
        for lang in ("en", "es", "pt"):
            kwargs = {**HeuristicsConfig().filter_config("c4", lang).model_dump(exclude={"enabled"}), **params}
            fast, ref = language_rules_fast.C4Fast(language=lang, **kwargs), language_rules.C4Rules(language=lang, **kwargs)
            for text in texts:
                assert fast.check(text) == ref.check(text) and fast.measure(text) == ref.measure(text), (params, lang, text[:60])
    sigma = language_rules_fast.C4Fast(language="en", **HeuristicsConfig().filter_config("c4", "en").model_dump(exclude={"enabled"}))
    sigma.policy_lines = (*sigma.policy_lines, "όροι χρήσης")
    assert not sigma.substrings_sigma_free and sigma.line_tests("Plain text.")[2]


def test_datatrove_mode_c4_is_datatrove_s(shared_data):
    """tasks/c4_fast.py stops counting sentences at `min_num_sentences`: the same verdicts and edited
    texts as datatrove's own C4QualityFilter, with the stage's settings and C4's own."""
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4QualityFilter

    from quipu.tasks.c4_fast import C4QualityFast
    texts, langs = documents(shared_data, per_file=1)
    texts += ["One. Two. Three.\nlorem ipsum dolor sit amet.", "a b c d.\n{x} y z.", "x " * 1200 + "y.\n" + "z" * 1100]
    langs += ["en"] * 3
    tok = {"en": "eng", "es": "spa", "pt": "por"}
    seen = set()
    for params in ({"filter_no_terminal_punct": False}, {"min_num_sentences": 2}):
        for text, lang in zip(texts, langs):
            ours, theirs = Document(text=text, id="x"), Document(text=text, id="x")
            want = C4QualityFilter(language=tok[lang], **params).filter(theirs)
            assert (C4QualityFast(language=tok[lang], **params).filter(ours), ours.text) == (want, theirs.text), text[:100]
            seen.add(want if want is True else want[1])
    assert seen == {True, "too_few_sentences", "lorem_ipsum", "curly_bracket"}, seen


def test_datatrove_mode_decides_as_datatrove_s_classes(shared_data, monkeypatch):
    """`compat: datatrove` with its fast classes (Gopher quality per distinct word of the judged
    document, C4's sentence count stopped at its minimum) against the same stage running datatrove's
    own GopherQualityFilter and C4QualityFilter: the same verdicts and edited texts."""
    from quipu.tasks import heuristics
    texts, langs = documents(shared_data, per_file=2)
    fast = verdicts(texts, langs, "datatrove")
    for name, cls in (("gopher_quality", "GopherQualityFilter"), ("c4", "C4QualityFilter")):
        monkeypatch.setitem(heuristics.FILTERS, name, (heuristics.FILTERS[name][0], f"datatrove.pipeline.filters:{cls}"))
    assert verdicts(texts, langs, "datatrove") == fast
    assert sum(r is None for r, _ in fast) > 5 and len({r for r, _ in fast}) >= 5
