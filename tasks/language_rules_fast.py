"""`compat: quipu`'s rules (quipu.tasks.language_rules) computed with less work, to the same numbers.

language_rules states each statistic plainly and stays the reference (tests/test_heuristics_speed.py
and bench/heuristics_speed.py compare these classes with it on real en/es/pt text). Here:
- a document's words are split once and shared by Gopher repetition, Gopher quality and FineWeb
  (`words_and_stats`, the last few texts kept); punctuation-only tokens are looked for among the
  distinct tokens, not every token;
- Gopher quality's per-word statistics (bare length, holds a letter, stop words) are computed once
  per distinct word and weighted by its count: integer sums, so the means are the same floats;
- Gopher repetition stops at the first rule that fails, in datatrove's order (the reason is the
  same; the later statistics are not needed), and its n-gram counts reuse the shared word arrays;
- per-word answers come from plain dicts and sets: bare forms by C-level maps (`PerWord`), the few
  words that are punctuation only or hold no letter by set operations (`WordsWith`), where an
  lru_cache's wrapper cost more per word than the answer;
- line tests run as C-level `map`s; C4's policy substrings are one regex, and its check stops counting
  sentences once `min_num_sentences` are found (the lines are still edited; `statistics` counts all).
"""
from __future__ import annotations

import re
from functools import lru_cache
from itertools import compress, filterfalse
from operator import methodcaller, mul

from datatrove.pipeline.filters.gopher_repetition_filter import find_duplicates

from quipu.tasks import language_rules as rules, languages
from quipu.tasks.gopher_counts import WordStats


class PerWord:
    """A pure function of one word, answered for a list of words from a plain dict (bounded: emptied
    when it would hold more than `size` words). The answers are the function's own."""

    def __init__(self, fn, size: int = rules.WORD_CACHE):
        self.fn, self.size, self.known = getattr(fn, "__wrapped__", fn), size, {}

    def __call__(self, words) -> list:
        known = self.known
        missing = list(filterfalse(known.__contains__, words))
        if missing:
            if len(known) + len(missing) > self.size:
                known.clear()
                missing = list(words)
            known.update(zip(missing, map(self.fn, missing)))
        return list(map(known.__getitem__, words))


class WordsWith:
    """The words of a collection that have a property (a pure function of one word), as a set: set
    operations over the words already looked at (bounded: forgotten past `size` words), the
    function run only on new words. For properties few words have (punctuation only, no letter)."""

    def __init__(self, fn, size: int = rules.WORD_CACHE):
        self.fn, self.size, self.seen, self.having = getattr(fn, "__wrapped__", fn), size, set(), set()

    def among(self, words) -> set:
        words = set(words)
        new = words - self.seen          # iterates `words`, the smaller set
        if new:
            if len(self.seen) + len(new) > self.size:
                self.seen, self.having, new = set(), set(), words
            self.seen |= new
            self.having.update(filter(self.fn, new))
        return self.having & words


def has_no_letter(word: str) -> bool:
    return not rules.has_letter(word)


PUNCT_ONLY, NO_LETTER, BARE = WordsWith(rules.is_punct_only), WordsWith(has_no_letter), PerWord(rules.bare)


@lru_cache(maxsize=4)
def words_and_stats(text: str) -> tuple[list[str], dict]:
    """(`language_rules.words_of(text)`, `dict.fromkeys` of those words)."""
    tokens = text.split()
    distinct = dict.fromkeys(tokens)
    punct = PUNCT_ONLY.among(distinct)
    if not punct:
        return tokens, distinct
    for token in punct:      # the other keys keep their order: dict.fromkeys of the words
        del distinct[token]
    return list(filterfalse(punct.__contains__, tokens)), distinct


@lru_cache(maxsize=4)
def word_stats(text: str) -> WordStats:
    words, distinct = words_and_stats(text)
    return WordStats(words, distinct)


STARTS_BULLET = methodcaller("startswith", ("•", "-"))
ENDS_ELLIPSIS = methodcaller("endswith", ("...", "…"))


class GopherRepetitionFast(rules.GopherRepetitionRules):
    def _statistics(self, text: str):
        """(statistic, value, limit) in the order `check` applies them; limit None: not a rule."""
        n = len(text)
        paragraphs = self.paragraph_exp.split(text.strip())
        p_dup, p_chars = find_duplicates(paragraphs)
        yield "dup_para_frac", p_dup / len(paragraphs), self.dup_para_frac or None
        yield "dup_para_char_frac", p_chars / n, self.dup_para_char_frac or None
        lines = self.line_exp.split(text)
        l_dup, l_chars = find_duplicates(lines)
        yield "dup_line_frac", l_dup / len(lines), self.dup_line_frac or None
        yield "dup_line_char_frac", l_chars / n, self.dup_line_char_frac or None
        stats = word_stats(text)
        for k, limit in self.top_n_grams:
            yield f"top_{k}_gram", stats.top_duplicate(k) / n if len(stats.words) >= k else 0.0, limit
        for k, limit in self.dup_n_grams:
            yield f"duplicated_{k}_n_grams", stats.all_duplicate(k) / n, limit

    def statistics(self, text: str) -> dict[str, float]:
        return {name: value for name, value, _ in self._statistics(text)} if text else {}

    def check(self, text: str):
        if not text:
            return False, "empty", text
        for name, value, limit in self._statistics(text):
            if limit is not None and value > limit:
                return False, name, text
        return True, None, text


class GopherQualityFast(rules.GopherQualityRules):
    def statistics(self, text: str) -> dict[str, float]:
        words, _ = words_and_stats(text)
        n = len(words)
        lines = text.splitlines() or [""]
        if n:
            stats = word_stats(text)
            bare = BARE(stats.distinct)
            counts = stats.counts.tolist()
            length = sum(map(mul, map(len, bare), counts))            # integer sums: exact
            letters = n - sum(counts[stats.index[w]] for w in NO_LETTER.among(stats.distinct))
            avg, alpha, stop = length / n, letters / n, len(self.stop_words.intersection(bare))
        else:
            avg, alpha, stop = 0.0, 0.0, 0
        return {
            "n_words": n,
            "avg_word_length": avg,
            "hash_ratio": text.count("#") / max(n, 1),
            "ellipsis_ratio": (text.count("...") + text.count("…")) / max(n, 1),
            "bullet_lines_ratio": sum(map(STARTS_BULLET, map(str.lstrip, lines))) / len(lines),
            "ellipsis_lines_ratio": sum(map(ENDS_ELLIPSIS, map(str.rstrip, lines))) / len(lines),
            "alpha_words_ratio": alpha,
            "stop_words": stop,
        }


class FineWebFast(rules.FineWebRules):
    def statistics(self, text: str) -> dict[str, float]:
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return {}
        chars = len(text.replace("\n", "")) or 1
        short = self.short_line_length
        return {"line_punct_ratio": sum(map(rules.ends_in_punct, lines)) / len(lines),
                "short_line_ratio": sum(len(line.strip()) <= short for line in lines) / len(lines),
                "char_dup_ratio": find_duplicates(lines)[1] / chars,
                "list_ratio": text.count("\n") / max(len(words_and_stats(text)[0]), 1)}


@lru_cache(maxsize=16)
def policy_pattern(lang: str) -> re.Pattern:
    """One regex for C4's policy substrings of a language: found iff one of them is in the line."""
    return re.compile("|".join(map(re.escape, languages.language(lang).policy_lines)))


class C4Fast(rules.C4Rules):
    COUNT_ENOUGH_ONLY = True

    def is_policy(self, lower: str) -> bool:
        return policy_pattern(self.lang).search(lower) is not None


RULES = {"gopher_repetition": GopherRepetitionFast, "gopher_quality": GopherQualityFast, "c4": C4Fast,
         "fineweb": FineWebFast}
