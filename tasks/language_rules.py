"""The heuristics stage's rules with statistics that mean the same in every language (`compat: quipu`).

datatrove's Gopher, C4 and FineWeb filters (`compat: datatrove`, the stage's default) count words
with spaCy tokens, and a few of their statistics are distorted by that tokenisation in ways that
differ by language and house style:

- Gopher's alpha rule (`max_non_alpha_words_ratio`: at least 80 % of words hold a letter) counts
  every punctuation token as a word, so prose with «», parentheses and dashes (European
  Portuguese, Spanish dialogue) falls under it. Here a word is a whitespace-separated token that is
  not punctuation only; symbol tokens (`|`, `→`, `$`) and numbers still count as non-alpha words,
  which is what the rule is for (tables, menus, code).
- Gopher's word count, mean word length, `#`/ellipsis ratio and stop-word rule use the same words;
  stop words are matched lower-cased and without surrounding punctuation (datatrove: exact token,
  so "La" or "De" opening a sentence did not count).
- C4's sentence count (`min_num_sentences`) splits sentences at every `.`, including the one of an
  abbreviation ("Sr.", "Dra.", "pág.", "etc.", "EE. UU."): here the split knows the language's
  abbreviations, initials and decimal numbers, and only terminated sentences count (spaCy counts
  any fragment, so every line of a menu was a "sentence"). Its policy lines (cookie banners, legal footers)
  are matched in the document's language, not in English only.
- FineWeb's `line_punct_ratio` asks whether a line ends in terminal punctuation; a line that ends
  `...termina.»` or `(ver pág. 3).` with a space after it did not count. Here closing quotes,
  brackets and trailing spaces are looked through, and a long line of sentences that runs on after
  its last full stop (a byline, a caption) counts as punctuated: text stored one paragraph or one
  document per line (Fake.br) otherwise scores 0 or 1 on its last few words. `list_ratio` (newlines per word) uses the words
  above.

The Gopher repetition rules keep their definitions over these words (no spaCy: n-grams of
whitespace words, counted by `gopher_counts.WordStats`). Every filter here has the datatrove
filter's `filter(doc)` interface and reason names, plus `statistics(text)`: the numbers its rules
compare, which `quipu calibrate` computes on reference text (quipu.tasks.calibration), so a
calibrated threshold and the rule that applies it measure the same thing.
"""
from __future__ import annotations

import math
import re
import unicodedata
from functools import lru_cache
from itertools import filterfalse

import numpy as np
from dataclasses import dataclass

from datatrove.pipeline.filters.c4_filters import CITATION_REGEX, ELLIPSIS
from datatrove.pipeline.filters.gopher_repetition_filter import find_duplicates
from datatrove.utils.text import TERMINAL_PUNCTUATION

from quipu.tasks.gopher_counts import WordStats
from quipu.tasks import languages

SENTENCE_END = re.compile(r"[.!?…]+[\"'»”’)\]]*(?=\s|$)")
NEXT_CHAR = re.compile(r"\s*(\S?)")
CLOSERS = "\"'»”’)]}*_ \t\r"
STOP_CHARS = tuple(TERMINAL_PUNCTUATION)


# Per-token answers are cached: a corpus repeats its tokens (Zipf), and these character loops were
# over half of the heuristics stage in `compat: quipu` (pure functions: the same answers).
WORD_CACHE = 1 << 17


@lru_cache(maxsize=WORD_CACHE)
def is_punct_only(token: str) -> bool:
    return all(unicodedata.category(c)[0] == "P" for c in token)


@lru_cache(maxsize=WORD_CACHE)
def has_letter(word: str) -> bool:
    return any(c.isalpha() for c in word)


@lru_cache(maxsize=4)
def _words_of(text: str) -> tuple[str, ...]:
    return tuple(filterfalse(is_punct_only, text.split()))


def words_of(text: str) -> list[str]:
    """Whitespace-separated tokens that are not punctuation only. (The Gopher rules and FineWeb ask
    for the same document's words: the last few texts' words are kept.)"""
    return list(_words_of(text))


@lru_cache(maxsize=WORD_CACHE)
def bare(word: str) -> str:
    """A word without the punctuation around it, lower-cased (for stop words and word length)."""
    i, j = 0, len(word)
    while i < j and unicodedata.category(word[i])[0] == "P":
        i += 1
    while j > i and unicodedata.category(word[j - 1])[0] == "P":
        j -= 1
    return word[i:j].lower()


@lru_cache(maxsize=16)
def abbreviations(lang: str) -> tuple[frozenset[str], frozenset[str]]:
    """The language's abbreviations, and those of them that also end a sentence before a capital
    (quipu.tasks.languages)."""
    entry = languages.language(lang)
    return frozenset(entry.abbreviations.split()), frozenset(entry.ends_sentence.split())


def count_sentences(line: str, lang: str) -> int:
    """Sentences in one line: ends at . ! ? … (with closing quotes) before a space or the line's end,
    except after the language's abbreviations, an initial ("J. R. Tolkien") or inside a number. Text
    after the last end is not a sentence (spaCy's sentencizer counts it: every menu item was one)."""
    abbrev, ends_sentence = abbreviations(lang)
    n, last = 0, 0
    for m in SENTENCE_END.finditer(line):
        end = m.end()
        if m.group().startswith(".") and m.group().rstrip("\"'»”’)]") == ".":
            before = line[last:m.start()].rsplit(None, 1)      # its last word
            token = bare(before[-1]) if before else ""
            after = NEXT_CHAR.match(line, end).group(1)         # line[end:].lstrip()[:1]
            final = token in ends_sentence and not after.islower()
            if (token in abbrev and not final) or (len(token) == 1 and token.isalpha()) or after.islower():
                continue             # an abbreviation, an initial, or the sentence goes on in lower case
        if line[last:m.start()].strip():
            n += 1
        last = end
    return n


RUN_ON_LINE_CHARS = 120
INNER_END = re.compile(r"[.!?…][\"'»”’)\]]*\s+\S")


def ends_in_punct(line: str) -> bool:
    """Whether a line is punctuated text: it ends in terminal punctuation (looking through closing
    quotes, brackets and spaces), or it is a long line of sentences that runs on after its last full
    stop (a byline, a caption: text stored one paragraph or one document per line)."""
    if line.rstrip(CLOSERS).endswith(STOP_CHARS):
        return True
    return len(line) >= RUN_ON_LINE_CHARS and INNER_END.search(line) is not None


@dataclass(frozen=True)
class Rule:
    """One threshold of a rule, as `quipu calibrate` sets it (quipu.tasks.calibration): the config
    key it sits at, the statistic it compares (a key of the rule's `statistics`), the direction and
    its plausible range."""
    filter: str                  # heuristics block, or "langid"
    param: str                   # config key
    stat: str                    # key of the rule's statistics
    kind: str                    # "min": documents below are removed; "max": above
    bounds: tuple[float, float] | None = None   # plausible range; None: not calibrated (policy)
    integer: bool = False
    n: int | None = None         # the n of an n-gram list parameter
    falsy_off: bool = True       # datatrove's Gopher rules: a threshold of 0 / null is off

    @property
    def key(self) -> str:
        return f"{self.filter}.{self.param}" + (f"[{self.n}]" if self.n is not None else "")


class _Rules:
    """Base: `filter(doc)` applies `statistics` against the thresholds in datatrove's rule order.
    `CALIBRATION`: the thresholds of the filter, each with its statistic and plausible range (the
    tight end is datatrove's English default except where quipu's statistic differs from
    datatrove's: alpha words, line punctuation, sentences, stop words, set on the shared es/pt/en
    text; see quipu.tasks.calibration)."""
    CALIBRATION: tuple[Rule, ...] = ()

    def __init__(self, language: str = "en", **params):
        self.lang = language
        self.__dict__.update(params)

    def filter(self, doc):
        ok, reason, text = self.check(doc.text)
        doc.text = text
        return True if ok else (False, reason)

    def measure(self, text: str) -> tuple[dict[str, float], str]:
        """(the statistics of `text`, the text the next filter of the chain sees)."""
        return self.statistics(text), text


class GopherRepetitionRules(_Rules):
    """datatrove's GopherRepetitionFilter over whitespace words."""
    CALIBRATION = (
        Rule("gopher_repetition", "dup_para_frac", "dup_para_frac", "max", (0.3, 0.5)),
        Rule("gopher_repetition", "dup_para_char_frac", "dup_para_char_frac", "max", (0.2, 0.4)),
        Rule("gopher_repetition", "dup_line_frac", "dup_line_frac", "max", (0.3, 0.5)),
        Rule("gopher_repetition", "dup_line_char_frac", "dup_line_char_frac", "max", (0.2, 0.4)),
        *[Rule("gopher_repetition", "top_n_grams", f"top_{n}_gram", "max", (tight, 0.3), n=n, falsy_off=False)
          for n, tight in ((2, 0.2), (3, 0.18), (4, 0.16))],
        *[Rule("gopher_repetition", "dup_n_grams", f"duplicated_{n}_n_grams", "max", (tight, 0.25), n=n, falsy_off=False)
          for n, tight in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))])
    paragraph_exp = re.compile(r"\n{2,}")
    line_exp = re.compile("\n+")

    def statistics(self, text: str) -> dict[str, float]:
        if not text:
            return {}
        paragraphs = self.paragraph_exp.split(text.strip())
        p_dup, p_chars = find_duplicates(paragraphs)
        lines = self.line_exp.split(text)
        l_dup, l_chars = find_duplicates(lines)
        n = len(text)
        out = {"dup_para_frac": p_dup / len(paragraphs), "dup_para_char_frac": p_chars / n,
               "dup_line_frac": l_dup / len(lines), "dup_line_char_frac": l_chars / n}
        words = words_of(text)
        stats = WordStats(words)
        for k, _ in self.top_n_grams:
            out[f"top_{k}_gram"] = stats.top_duplicate(k) / n if len(words) >= k else 0.0
        for k, _ in self.dup_n_grams:
            out[f"duplicated_{k}_n_grams"] = stats.all_duplicate(k) / n
        return out

    def check(self, text: str):
        if not text:
            return False, "empty", text
        s = self.statistics(text)
        for rule in ("dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac"):
            limit = getattr(self, rule)
            if limit and s[rule] > limit:
                return False, rule, text
        for k, limit in self.top_n_grams:
            if s[f"top_{k}_gram"] > limit:
                return False, f"top_{k}_gram", text
        for k, limit in self.dup_n_grams:
            if s[f"duplicated_{k}_n_grams"] > limit:
                return False, f"duplicated_{k}_n_grams", text
        return True, None, text


class GopherQualityRules(_Rules):
    """datatrove's GopherQualityFilter; words: whitespace tokens that are not punctuation only."""
    CALIBRATION = (
        Rule("gopher_quality", "min_doc_words", "n_words", "min"),
        Rule("gopher_quality", "max_doc_words", "n_words", "max"),
        Rule("gopher_quality", "min_avg_word_length", "avg_word_length", "min", (2.5, 3.0)),
        Rule("gopher_quality", "max_avg_word_length", "avg_word_length", "max", (10.0, 14.0)),
        Rule("gopher_quality", "max_symbol_word_ratio", "symbol_word_ratio", "max", (0.1, 0.2)),
        Rule("gopher_quality", "max_bullet_lines_ratio", "bullet_lines_ratio", "max", (0.9, 0.95)),
        Rule("gopher_quality", "max_ellipsis_lines_ratio", "ellipsis_lines_ratio", "max", (0.3, 0.5)),
        Rule("gopher_quality", "max_non_alpha_words_ratio", "alpha_words_ratio", "min", (0.6, 0.85)),
        Rule("gopher_quality", "min_stop_words", "stop_words", "min", (1, 3), integer=True))

    def statistics(self, text: str) -> dict[str, float]:
        words = words_of(text)
        n = len(words)
        lines = text.splitlines() or [""]
        bare_words = list(map(bare, words))
        return {
            "n_words": n,
            "avg_word_length": float(np.mean(list(map(len, bare_words)))) if n else 0.0,
            "hash_ratio": text.count("#") / max(n, 1),
            "ellipsis_ratio": (text.count("...") + text.count("…")) / max(n, 1),
            "bullet_lines_ratio": sum(s.lstrip().startswith(("•", "-")) for s in lines) / len(lines),
            "ellipsis_lines_ratio": sum(s.rstrip().endswith(("...", "…")) for s in lines) / len(lines),
            "alpha_words_ratio": sum(map(has_letter, words)) / n if n else 0.0,
            "stop_words": len(self.stop_words.intersection(bare_words)),
        }

    def measure(self, text: str) -> tuple[dict[str, float], str]:
        s = self.statistics(text)
        s["symbol_word_ratio"] = max(s["hash_ratio"], s["ellipsis_ratio"])   # max_symbol_word_ratio's two rules
        return s, text

    def check(self, text: str):
        s = self.statistics(text)
        rules = (("min_doc_words", s["n_words"] < (self.min_doc_words or 0), "gopher_short_doc"),
                 ("max_doc_words", s["n_words"] > (self.max_doc_words or float("inf")), "gopher_long_doc"),
                 ("min_avg_word_length", s["avg_word_length"] < (self.min_avg_word_length or 0), "gopher_below_avg_threshold"),
                 ("max_avg_word_length", s["avg_word_length"] > (self.max_avg_word_length or float("inf")), "gopher_above_avg_threshold"),
                 ("max_symbol_word_ratio", s["hash_ratio"] > (self.max_symbol_word_ratio or float("inf")), "gopher_too_many_hashes"),
                 ("max_symbol_word_ratio", s["ellipsis_ratio"] > (self.max_symbol_word_ratio or float("inf")), "gopher_too_many_ellipsis"),
                 ("max_bullet_lines_ratio", s["bullet_lines_ratio"] > (self.max_bullet_lines_ratio or float("inf")), "gopher_too_many_bullets"),
                 ("max_ellipsis_lines_ratio", s["ellipsis_lines_ratio"] > (self.max_ellipsis_lines_ratio or float("inf")), "gopher_too_many_end_ellipsis"),
                 ("max_non_alpha_words_ratio", s["alpha_words_ratio"] < (self.max_non_alpha_words_ratio or 0), "gopher_below_alpha_threshold"),
                 ("min_stop_words", s["stop_words"] < (self.min_stop_words or 0), "gopher_enough_stop_words"))
        for _, failed, reason in rules:
            if failed:
                return False, reason, text
        return True, None, text

    def __init__(self, language: str = "en", stop_words=None, **params):
        super().__init__(language, **params)
        self.stop_words = {w.lower() for w in (stop_words or [])}


class C4Rules(_Rules):
    """datatrove's C4QualityFilter (the same line edits) with sentences counted by `count_sentences`
    and policy lines in the document's language."""
    CALIBRATION = (
        Rule("c4", "filter_curly_bracket", "c4_whole_document", "max"),
        Rule("c4", "min_num_sentences", "num_sentences", "min", (1, 2), integer=True, falsy_off=False))
    # check: stop counting sentences once min_num_sentences are found (the verdict is the same)
    COUNT_ENOUGH_ONLY = False

    def __init__(self, language: str = "en", **params):
        super().__init__(language, **params)
        self.policy_lines = languages.language(self.lang).policy_lines

    def edit(self, text: str, stop: bool = True) -> tuple[str | None, str | None, int]:
        """(edited text or None, whole-document reason or None, sentences in the kept lines); with
        `stop=False` the lines go on being counted after a whole-document rule hit (statistics)."""
        n_sentences, kept, whole = 0, [], None
        enough = self.min_num_sentences if stop and self.COUNT_ENOUGH_ONLY else math.inf
        long_words, citations, substrings = self.line_tests(text)
        for line in text.splitlines():
            line = line.strip()
            words = line.split()
            if long_words and max(map(len, words), default=0) > self.max_word_length:
                continue
            if citations:
                line = CITATION_REGEX.sub("", line)
            if self.filter_no_terminal_punct and (not line.endswith((".", "?", "!", '"', "'")) or line.endswith(ELLIPSIS)):
                continue
            if len(words) < self.min_words_per_line:
                continue
            lower = line.lower() if substrings else ""
            if self.filter_lorem_ipsum and "lorem ipsum" in lower:
                whole = whole or "lorem_ipsum"
                if stop:
                    return None, whole, n_sentences
            if self.filter_javascript and "javascript" in lower:
                continue
            if self.filter_curly_bracket and "{" in line:
                whole = whole or "curly_bracket"
                if stop:
                    return None, whole, n_sentences
            if self.filter_policy and substrings and self.is_policy(lower):
                continue
            if n_sentences < enough:
                n_sentences += count_sentences(line, self.lang)
            kept.append(line)
        return "\n".join(kept).strip(), whole, n_sentences

    def line_tests(self, text: str) -> tuple[bool, bool, bool]:
        """Whether each line is tested for a word over `max_word_length`, cut of citations, and searched
        lower-cased (lorem ipsum, javascript, policy lines): as configured (C4Fast also asks the text)."""
        return self.max_word_length != -1, bool(self.remove_citations), True

    def is_policy(self, lower: str) -> bool:
        return any(p in lower for p in self.policy_lines)

    def statistics(self, text: str) -> dict[str, float]:
        return self.measure(text)[0]

    def measure(self, text: str) -> tuple[dict[str, float], str]:
        edited, reason, n = self.edit(text, stop=False)
        return {"num_sentences": n, "c4_whole_document": 1.0 if reason else 0.0}, edited

    def check(self, text: str):
        edited, reason, n = self.edit(text)
        if reason is not None:
            return False, reason, text
        if n < self.min_num_sentences:
            return False, "too_few_sentences", text
        return True, None, edited


class FineWebRules(_Rules):
    """datatrove's FineWebQualityFilter; a line's end is looked at through closing quotes and spaces."""
    CALIBRATION = (
        Rule("fineweb", "line_punct_thr", "line_punct_ratio", "min", (0.05, 0.2), falsy_off=False),
        Rule("fineweb", "short_line_thr", "short_line_ratio", "max", (0.67, 0.9), falsy_off=False),
        Rule("fineweb", "char_duplicates_ratio", "char_dup_ratio", "max", (0.01, 0.1), falsy_off=False),
        Rule("fineweb", "new_line_ratio", "list_ratio", "max", (0.3, 0.5), falsy_off=False))

    def measure(self, text: str) -> tuple[dict[str, float], str]:
        return self.statistics(text) or {"line_punct_ratio": math.nan}, text     # nothing left: the rule's "empty"

    def statistics(self, text: str) -> dict[str, float]:
        lines = [line for line in text.split("\n") if line.strip()]
        if not lines:
            return {}
        chars = len(text.replace("\n", "")) or 1
        return {"line_punct_ratio": sum(ends_in_punct(line) for line in lines) / len(lines),
                "short_line_ratio": sum(len(line.strip()) <= self.short_line_length for line in lines) / len(lines),
                "char_dup_ratio": find_duplicates(lines)[1] / chars,
                "list_ratio": text.count("\n") / max(len(words_of(text)), 1)}

    def check(self, text: str):
        s = self.statistics(text)
        if not s:
            return False, "empty", text
        if s["line_punct_ratio"] < self.line_punct_thr and not (s["line_punct_ratio"] == 0 and self.line_punct_exclude_zero):
            return False, "line_punct_ratio", text
        if s["short_line_ratio"] > self.short_line_thr:
            return False, "short_line_ratio", text
        if s["char_dup_ratio"] > self.char_duplicates_ratio:
            return False, "char_dup_ratio", text
        if s["list_ratio"] > self.new_line_ratio:
            return False, "list_ratio", text
        return True, None, text


RULES = {"gopher_repetition": GopherRepetitionRules, "gopher_quality": GopherQualityRules,
         "c4": C4Rules, "fineweb": FineWebRules}


def calibrated_rules() -> list[Rule]:
    """Every filter's thresholds, in the chain's order: what `quipu calibrate` sets and reports."""
    return [rule for cls in RULES.values() for rule in cls.CALIBRATION]
