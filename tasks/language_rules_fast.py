"""`compat: quipu`'s rules (quipu.tasks.language_rules) computed with less work, to the same numbers.

language_rules states each statistic plainly and stays the reference (tests/test_heuristics_speed.py
and bench/heuristics_speed.py compare these classes with it on real en/es/pt text). Here:
- a document's words are split once and shared by Gopher repetition, Gopher quality and FineWeb
  and C4 (`words_and_stats`, the last few texts kept);
- per-word answers (punctuation only, holds no letter, bare form) come from one regex pass over the
  document's distinct words joined by newlines, with character classes built from language_rules'
  own per-character tests on every code point (`char_ranges`): no per-word Python call, no cache;
- Gopher quality's per-word statistics (bare length, holds a letter, stop words) are computed once
  per distinct word and weighted by its count: integer sums, so the means are the same floats;
- Gopher repetition stops at the first rule that fails, in datatrove's order (the reason is the
  same; the later statistics are not needed), skips a top n-gram rule that cannot fail
  (`WordStats.top_bound`), and its n-gram counts reuse the shared word arrays;
- line tests run as C-level `map`s; C4's policy substrings are one regex, and its check stops counting
  sentences once `min_num_sentences` are found (the lines are still edited; `statistics` counts all).
"""
from __future__ import annotations

import re
import sys
import unicodedata
from functools import lru_cache
from itertools import filterfalse, repeat
from operator import methodcaller, mul

import numpy as np

from datatrove.pipeline.filters.gopher_repetition_filter import find_duplicates

from quipu.tasks import language_rules as rules, languages
from quipu.tasks.gopher_counts import WordStats


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


@lru_cache(maxsize=None)
def char_ranges(name: str) -> tuple[tuple[int, int], ...]:
    """(first, last) code point of each run that language_rules' per-character test holds for: "punct"
    (`unicodedata.category(c)[0] == "P"`, is_punct_only's and bare's test) or "letter" (`c.isalpha()`,
    has_letter's; numpy's `isalpha` is CPython's). The running Python's own answers for every code
    point (once per process, ~0.2 s), so a class built from them and the test agree everywhere
    (tests/test_heuristics_speed.py checks each code point)."""
    code_points = np.arange(sys.maxunicode + 1, dtype=np.uint32)
    if name == "punct":
        chars = code_points.tobytes().decode("utf-32-le", "surrogatepass")
        holds = np.fromiter(map(str.startswith, map(unicodedata.category, chars), repeat("P")), np.int8, len(chars))
    else:
        holds = np.strings.isalpha(code_points.view("<U1")).view(np.int8)
    edges = np.diff(np.concatenate(([0], holds, [0])))
    return tuple(zip(np.flatnonzero(edges == 1).tolist(), (np.flatnonzero(edges == -1) - 1).tolist()))


ASTRAL = re.compile("[\U00010000-\U0010ffff]")


@lru_cache(maxsize=None)
def word_pattern(name: str, astral: bool) -> re.Pattern:
    """Regexes over words joined by newlines (a word from `str.split` holds no whitespace), one pass
    for all of a text's distinct words: "punct_only" finds the words that are punctuation only
    (`is_punct_only`), "no_letter" those without a letter (not `has_letter`), "punct_start" the
    punctuation `bare` strips from a word's start. Without `astral` the classes stop at U+FFFF, for
    text without such characters: re checks a class's ranges past U+FFFF one by one for every character."""
    def cls(kind: str) -> str:
        top = sys.maxunicode if astral else 0xFFFF
        return "".join(f"\\U{a:08x}-\\U{min(b, top):08x}" for a, b in char_ranges(kind) if a <= top)
    return re.compile({"punct_only": f"^[{cls('punct')}]+$", "no_letter": f"^[^{cls('letter')}\\n]+$",
                       "punct_start": f"^[{cls('punct')}]+"}[name], re.M)


def words_matching(name: str, words) -> list[str]:
    """The words (no whitespace in any) that `word_pattern(name)` matches whole: e.g. the punctuation-only ones."""
    joined = "\n".join(words)
    return word_pattern(name, ASTRAL.search(joined) is not None).findall(joined)


def bare_forms(words: list[str]) -> list[str]:
    """`[language_rules.bare(w) for w in words]` for words without whitespace: punctuation stripped
    from each word's start, then (the text reversed) from its end, by one regex pass each, then
    lower-cased word by word."""
    if not words:
        return []
    joined = "\n".join(words)
    start = word_pattern("punct_start", ASTRAL.search(joined) is not None)
    return list(map(str.lower, start.sub("", start.sub("", joined)[::-1])[::-1].split("\n")))


@lru_cache(maxsize=4)
def words_and_stats(text: str) -> tuple[list[str], dict, int]:
    """(`language_rules.words_of(text)`, `dict.fromkeys` of those words, the longest token's length)."""
    tokens = text.split()
    distinct = dict.fromkeys(tokens)
    longest = max(map(len, distinct), default=0)
    punct = words_matching("punct_only", distinct)
    if not punct:
        return tokens, distinct, longest
    for token in punct:      # the other keys keep their order: dict.fromkeys of the words
        del distinct[token]
    punct = set(punct)
    return list(filterfalse(punct.__contains__, tokens)), distinct, longest


def count_words(text: str) -> int:
    """`len(language_rules.words_of(text))`: the tokens less the punctuation-only ones."""
    tokens = text.split()
    return len(tokens) - len(words_matching("punct_only", tokens))


@lru_cache(maxsize=4)
def word_stats(text: str) -> WordStats:
    words, distinct, _ = words_and_stats(text)
    return WordStats(words, distinct)


STARTS_BULLET = methodcaller("startswith", ("•", "-"))
ENDS_ELLIPSIS = methodcaller("endswith", ("...", "…"))


class GopherRepetitionFast(rules.GopherRepetitionRules):
    def _statistics(self, text: str, verdict_only: bool = False):
        """(statistic, value, limit) in the order `check` applies them; limit None: not a rule. With
        `verdict_only`, a top n-gram rule that cannot fail (`WordStats.top_bound`) is left out."""
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
            if len(stats.words) < k:
                yield f"top_{k}_gram", 0.0, limit
            elif not verdict_only or stats.top_bound(k) / n > limit:     # a/n <= b/n when a <= b
                yield f"top_{k}_gram", stats.top_duplicate(k) / n, limit
        for k, limit in self.dup_n_grams:
            yield f"duplicated_{k}_n_grams", stats.all_duplicate(k) / n, limit

    def statistics(self, text: str) -> dict[str, float]:
        return {name: value for name, value, _ in self._statistics(text)} if text else {}

    def check(self, text: str):
        if not text:
            return False, "empty", text
        for name, value, limit in self._statistics(text, verdict_only=True):
            if limit is not None and value > limit:
                return False, name, text
        return True, None, text


class GopherQualityFast(rules.GopherQualityRules):
    def statistics(self, text: str) -> dict[str, float]:
        words, _, _ = words_and_stats(text)
        n = len(words)
        lines = text.splitlines() or [""]
        if n:
            stats = word_stats(text)
            bare = bare_forms(stats.distinct)
            counts = stats.counts.tolist()
            length = sum(map(mul, map(len, bare), counts))            # integer sums: exact
            letters = n - sum(counts[stats.index[w]] for w in words_matching("no_letter", stats.distinct))
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
                "list_ratio": text.count("\n") / max(count_words(text), 1)}


@lru_cache(maxsize=16)
def policy_pattern(lang: str) -> re.Pattern:
    """One regex for C4's policy substrings of a language: found iff one of them is in the line."""
    return re.compile("|".join(map(re.escape, languages.language(lang).policy_lines)))


class C4Fast(rules.C4Rules):
    COUNT_ENOUGH_ONLY = True

    def is_policy(self, lower: str) -> bool:
        return policy_pattern(self.lang).search(lower) is not None

    def line_tests(self, text: str) -> tuple[bool, bool, bool]:
        """A per-line test that can find nothing anywhere in the text is left out: no word over
        `max_word_length` in the text, no "[", no searched substring in the text with its citations
        cut, lower-cased. A line, stripped and cut, is a piece of that text (a citation holds no line
        break), and lower-casing depends on context only for Greek sigma (never in these substrings:
        checked), so a substring of a lower-cased line is one of the lower-cased text."""
        long_words, citations, _ = super().line_tests(text)
        long_words = long_words and words_and_stats(text)[2] > self.max_word_length
        citations = citations and "[" in text
        if not self.substrings_sigma_free:
            return long_words, citations, True
        lower = (rules.CITATION_REGEX.sub("", text) if citations else text).lower()
        return long_words, citations, ((self.filter_lorem_ipsum and "lorem ipsum" in lower)
                                       or (self.filter_javascript and "javascript" in lower)
                                       or (self.filter_policy and any(map(lower.__contains__, self.policy_lines))))

    @property
    def substrings_sigma_free(self) -> bool:
        return not any(c in "Σσς" for line in (*self.policy_lines, "lorem ipsum", "javascript") for c in line)


RULES = {"gopher_repetition": GopherRepetitionFast, "gopher_quality": GopherQualityFast, "c4": C4Fast,
         "fineweb": FineWebFast}
