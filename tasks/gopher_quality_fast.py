"""datatrove's `GopherQualityFilter` (0.10) with its per-word tests answered once per distinct word.

Its `filter` walks every word of a document twice in Python generator expressions ("holds a
character that is not punctuation", "holds a letter"): about a sixth of the heuristics stage in
`compat: datatrove`. A corpus repeats its words (Zipf), so here each test runs once per distinct
word (a bounded cache) and, for the judged document's words, once per distinct word of the document
weighted by its count (`SharedTokens.word_stats`: integer sums, the same numbers); the rest is
datatrove's code, line for line: the same rules, in the
same order, on the same numbers (tests/test_heuristics_speed.py compares verdicts with datatrove's
own class on real en/es/pt text).
"""
from __future__ import annotations

from functools import lru_cache
from operator import mul

import numpy as np
from datatrove.pipeline.filters.gopher_quality_filter import GopherQualityFilter
from datatrove.utils.text import PUNCTUATION_SET, split_into_words

from quipu.tasks.language_rules_fast import WordsWith

WORD_CACHE = 1 << 17


@lru_cache(maxsize=WORD_CACHE)
def not_only_symbols(word: str) -> bool:
    return any(ch not in PUNCTUATION_SET for ch in word)


@lru_cache(maxsize=WORD_CACHE)
def has_letter(word: str) -> bool:
    return any(c.isalpha() for c in word)


def only_symbols(word: str) -> bool:
    return not not_only_symbols(word)


def no_letter(word: str) -> bool:
    return not has_letter(word)


# the few words that are symbols only or hold no letter, by set operations over the words seen
ONLY_SYMBOLS, NO_LETTER = WordsWith(only_symbols, WORD_CACHE), WordsWith(no_letter, WORD_CACHE)


class GopherQualityFast(GopherQualityFilter):
    def filter(self, doc) -> bool | tuple[bool, str]:
        from quipu.tasks.heuristics import SharedTokens
        text = doc.text
        words = split_into_words(text, self.language)
        n_words = len(words)
        stats = SharedTokens.word_stats(words)     # the document's words as distinct words + counts
        if stats is None:
            return self._filter_words(text, words)
        distinct, counts, index = stats.distinct, stats.counts.tolist(), stats.index
        symbols = [index[w] for w in ONLY_SYMBOLS.among(distinct)]
        n_non_symbol_words_words = n_words - sum(counts[i] for i in symbols)

        if self.min_doc_words and n_non_symbol_words_words < self.min_doc_words:
            return False, "gopher_short_doc"
        if self.max_doc_words and n_non_symbol_words_words > self.max_doc_words:
            return False, "gopher_long_doc"

        # np.mean of integers is their exact sum over n (float64 sums of integers below 2**53)
        length = sum(map(mul, map(len, distinct), counts)) - sum(len(distinct[i]) * counts[i] for i in symbols)
        avg_n_words = length / n_non_symbol_words_words if n_non_symbol_words_words else np.mean([])
        n_alpha = n_words - sum(counts[index[w]] for w in NO_LETTER.among(distinct))
        return self._rest(text, n_words, avg_n_words, n_alpha, distinct)

    def _filter_words(self, text: str, words: list[str]) -> bool | tuple[bool, str]:
        """datatrove's filter over a word list (words that are not the judged document's)."""
        n_words = len(words)
        non_symbol_words = list(filter(not_only_symbols, words))
        n_non_symbol_words_words = len(non_symbol_words)

        if self.min_doc_words and n_non_symbol_words_words < self.min_doc_words:
            return False, "gopher_short_doc"
        if self.max_doc_words and n_non_symbol_words_words > self.max_doc_words:
            return False, "gopher_long_doc"

        avg_n_words = np.mean([len(w) for w in non_symbol_words])
        return self._rest(text, n_words, avg_n_words, sum(map(has_letter, words)), words)

    def _rest(self, text: str, n_words: int, avg_n_words: float, n_alpha: int, words) -> bool | tuple[bool, str]:
        """The rules after the word counts, in datatrove's order."""
        if self.min_avg_word_length and avg_n_words < self.min_avg_word_length:
            return False, "gopher_below_avg_threshold"
        if self.max_avg_word_length and avg_n_words > self.max_avg_word_length:
            return False, "gopher_above_avg_threshold"

        if self.max_symbol_word_ratio and text.count("#") / n_words > self.max_symbol_word_ratio:
            return False, "gopher_too_many_hashes"
        if self.max_symbol_word_ratio and (text.count("...") + text.count("…")) / n_words > self.max_symbol_word_ratio:
            return False, "gopher_too_many_ellipsis"

        lines = text.splitlines()
        if (
            self.max_bullet_lines_ratio
            and sum(s.lstrip().startswith("•") or s.lstrip().startswith("-") for s in lines) / len(lines)
            > self.max_bullet_lines_ratio
        ):
            return False, "gopher_too_many_bullets"
        if (
            self.max_ellipsis_lines_ratio
            and sum(s.rstrip().endswith("...") or s.rstrip().endswith("…") for s in lines) / len(lines)
            > self.max_ellipsis_lines_ratio
        ):
            return False, "gopher_too_many_end_ellipsis"

        if self.max_non_alpha_words_ratio and n_alpha / n_words < self.max_non_alpha_words_ratio:
            return False, "gopher_below_alpha_threshold"

        if self.min_stop_words and len(self.stop_words.intersection(set(words))) < self.min_stop_words:
            return False, "gopher_enough_stop_words"

        return True
