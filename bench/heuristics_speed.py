r"""The heuristics stage with and without its issue-40 speed-ups, same documents, same run.

`HeuristicFilters.process` over real en/es/pt documents of ../shared/data/text (first `--per-file`
of each file, at most 20,000 characters), in `compat: datatrove` and `compat: quipu`, CPU seconds
of this process, rounds alternating (the best round of each counts: the machine is shared):
- `now`: the stage as shipped;
- `before`: the same stage with the speed-ups undone in place: language_rules' plain classes (not
  language_rules_fast's) with their per-word caches off (`__wrapped__`), datatrove's own
  `GopherQualityFilter` and `C4QualityFilter`, `DocTokens.words` slicing the text per call, and gopher_counts'
  `WordStats` counting n-grams with the code of before this issue (bench/heuristics_before.py), and
  `DocTokens.of` running spaCy on each whole document (not tasks/spacy_chunks.py's pieces).
  (`WordStats`' ids and arrays, `SharedTokens` and spaCy's cache predate the issue: both sides.)
Before the timed rounds each side runs once untimed (spaCy's cache warm for both; the last column: that
first pass's CPU seconds, `now` with spacy_chunks' pieces still to learn, after `before` warmed spaCy's vocabulary).
Both must decide the same (checked here on every document; tests/test_heuristics_speed.py too).

    .venv/bin/python bench/heuristics_speed.py [--per-file 60] [--rounds 2]
    .venv/bin/python bench/heuristics_speed.py --check-all quipu,datatrove
    .venv/bin/python bench/heuristics_speed.py --check-tokens
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = ROOT.parent / "shared" / "data" / "text"


def load(per_file: int, every_file: bool = False, cut: int | None = 20000):
    import pyarrow as pa
    texts, langs = [], []
    for f in sorted(TEXT.glob("*.jsonl")):
        lang = f.name[:2]
        if lang not in ("en", "es", "pt") and not every_file:
            continue
        with open(f, encoding="utf-8") as fh:
            for _, line in zip(range(per_file), fh):
                texts.append(json.loads(line)["text"][:cut])
                langs.append(lang if lang in ("en", "es", "pt") else "en")
    return pa.table({"id": [str(i) for i in range(len(texts))], "text": texts, "lang": langs})


def check_all(modes: list[str]) -> None:
    """Every document of ../shared/data/text (whole, every file) and of the demo corpus: the stage
    as shipped and as before decide the same (kept ids and texts, removal reasons)."""
    import pyarrow as pa

    from quipu.synthetic.corpus import SEED, DocumentPlan
    shared = load(10**9, every_file=True, cut=None)
    docs = DocumentPlan(1.0, seed=SEED).build()
    demo = pa.table({"id": [f"demo{i}" for i in range(len(docs))], "text": [d.plain() for d in docs],
                     "lang": [d.lang if d.lang in ("en", "es", "pt") else "en" for d in docs]})
    for name, batch in (("shared text", shared), ("demo corpus", demo)):
        langs = dict(zip(batch.column("id").to_pylist(), batch.column("lang").to_pylist()))
        for compat in modes:
            _, now, kept = run(batch, compat)
            with before():
                _, then, _ = run(batch, compat)
            print(f"check-all {name} compat {compat}: {batch.num_rows} documents, kept {kept}, same decisions and "
                  f"texts: {now == then}", flush=True)
            now, then = dict(now), dict(then)      # id -> ("kept", text) or ("removed", reason)
            for lang in sorted(set(langs.values())):
                ids = [i for i, lang_of in langs.items() if lang_of == lang]
                same = sum(now[i] == then[i] for i in ids)
                print(f"  {lang}: {len(ids)} documents, kept {sum(now[i][0] == 'kept' for i in ids)}, "
                      f"the same decision and text: {same}", flush=True)


def check_tokens() -> None:
    """Every document of ../shared/data/text (whole, every file) and of the demo corpus through every
    spaCy tokenizer `compat: datatrove` uses: tasks/spacy_chunks.py's tokens against spaCy's own."""
    import numpy as np
    from datatrove.utils.word_tokenizers import load_word_tokenizer

    from quipu.synthetic.corpus import SEED, DocumentPlan
    from quipu.tasks import spacy_chunks
    from quipu.tasks.languages import LANGUAGES
    texts = load(10**9, every_file=True, cut=None).column("text").to_pylist()
    texts += [d.plain() for d in DocumentPlan(1.0, seed=SEED).build()]
    for lang in sorted({entry.tokenizer for entry in LANGUAGES.values()}):
        tokenizer = load_word_tokenizer(lang).tokenizer.tokenizer
        chunks = spacy_chunks.for_tokenizer(tokenizer)
        same = sum(np.array_equal(chunks.arrays(t), spacy_chunks.token_array(tokenizer, t)) for t in texts)
        print(f"check-tokens {lang}: {len(texts)} documents, the same tokens as spaCy on {same}: {same == len(texts)}",
              flush=True)


@contextlib.contextmanager
def before():
    """The stage as it was before the speed-ups (see the module docstring)."""
    from heuristics_before import WordStatsBefore

    from quipu.tasks import gopher_counts, heuristics, language_rules, language_rules_fast, spacy_chunks
    saved = {n: getattr(language_rules, n) for n in ("is_punct_only", "bare", "has_letter", "words_of")}
    counting = {n: getattr(gopher_counts.WordStats, n) for n in vars(WordStatsBefore) if not n.startswith("__")}
    spec, c4_spec, words = heuristics.FILTERS["gopher_quality"], heuristics.FILTERS["c4"], heuristics.DocTokens.words
    doc_tokens_of = heuristics.DocTokens.__dict__["of"]

    def spacy_whole(cls, text, nlp):        # spaCy on the whole document (before tasks/spacy_chunks.py)
        try:
            arr = spacy_chunks.token_array(nlp.tokenizer, text)
        except Exception:
            return None
        return cls(text, arr, frozenset(nlp.get_pipe("sentencizer").punct_chars))
    fast_rules = dict(language_rules_fast.RULES)

    def old_words(self, first, end):
        text = self.text
        ws = (text[a:a + n].strip() for a, n in zip(self.idx[first:end].tolist(), self.length[first:end].tolist()))
        return [w for w in ws if w]
    try:
        for n in ("is_punct_only", "bare", "has_letter"):
            setattr(language_rules, n, saved[n].__wrapped__)
        language_rules.words_of = lambda text: [t for t in text.split() if not language_rules.is_punct_only(t)]
        heuristics.FILTERS["gopher_quality"] = (spec[0], "datatrove.pipeline.filters:GopherQualityFilter")
        heuristics.FILTERS["c4"] = (c4_spec[0], "datatrove.pipeline.filters:C4QualityFilter")
        heuristics.DocTokens.words = old_words
        heuristics.DocTokens.of = classmethod(spacy_whole)
        language_rules_fast.RULES.update(language_rules.RULES)
        for n in counting:
            setattr(gopher_counts.WordStats, n, getattr(WordStatsBefore, n))
        yield
    finally:
        for n, f in saved.items():
            setattr(language_rules, n, f)
        language_rules_fast.RULES.update(fast_rules)
        for n, f in counting.items():
            setattr(gopher_counts.WordStats, n, f)
        heuristics.FILTERS["gopher_quality"], heuristics.FILTERS["c4"], heuristics.DocTokens.words = spec, c4_spec, words
        heuristics.DocTokens.of = doc_tokens_of


def run(batch, compat: str) -> tuple[float, list, int]:
    from quipu.tasks import language_rules
    from quipu.tasks.heuristics import HeuristicFilters, HeuristicsConfig
    from quipu.tasks import language_rules_fast
    for f in (language_rules._words_of, language_rules.is_punct_only, language_rules.bare, language_rules.has_letter,
              language_rules_fast.words_and_stats, language_rules_fast.word_stats):
        getattr(f, "cache_clear", lambda: None)()      # no answers carried over from the other side's round
    from quipu.tasks import gopher_quality_fast
    for words in (gopher_quality_fast.ONLY_SYMBOLS, gopher_quality_fast.NO_LETTER):
        words.seen, words.having = set(), set()
    stage = HeuristicFilters(HeuristicsConfig(compat=compat))
    stage.process(batch.slice(0, 5))                   # spaCy / filters loaded before the clock
    t0 = time.process_time()
    out = stage.process(batch)
    dt = time.process_time() - t0
    kept = [(i, ("kept", text)) for i, text in zip(out.kept.column("id").to_pylist(), out.kept.column("text").to_pylist())]
    removed = [(i, ("removed", reason)) for i, reason in zip(out.removed.column("id").to_pylist(),
                                                            out.removed.column("reason").to_pylist())]
    return dt, sorted(kept) + sorted(removed), out.kept.num_rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-file", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--check-all", default="", help="comma list of modes (quipu,datatrove): only the identity "
                    "check over every shared text document and the demo corpus")
    ap.add_argument("--check-tokens", action="store_true", help="only the token check of tasks/spacy_chunks.py "
                    "against spaCy over every shared text document and the demo corpus, every language")
    args = ap.parse_args()
    if args.check_tokens:
        return check_tokens()
    if args.check_all:
        return check_all(args.check_all.split(","))
    batch = load(args.per_file)
    print(f"{batch.num_rows} documents; load {os.getloadavg()}", flush=True)
    print("| compat | docs | before: CPU s (docs/s) | now: CPU s (docs/s) | speed-up | same decisions and texts | first pass CPU s, before / now |\n|---|---|---|---|---|---|---|")
    for compat in ("datatrove", "quipu"):
        best = {}
        same = True
        with before():
            first_b = run(batch, compat)[0]            # untimed: spaCy's cache warm for both sides
        first_n = run(batch, compat)[0]                # (and the pieces of tasks/spacy_chunks.py known)
        for _ in range(args.rounds):
            with before():
                b, out_b, _ = run(batch, compat)
            a, out_a, _ = run(batch, compat)
            same &= out_a == out_b
            best["before"], best["now"] = min(best.get("before", b), b), min(best.get("now", a), a)
        n = batch.num_rows
        print(f"| {compat} | {n} | {best['before']:.2f} ({n / best['before']:.0f}) | {best['now']:.2f} ({n / best['now']:.0f}) | "
              f"{best['before'] / best['now']:.2f}x | {same} | {first_b:.2f} / {first_n:.2f} |", flush=True)
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()
