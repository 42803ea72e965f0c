"""datatrove's `C4QualityFilter` (0.10) for `compat: datatrove`, with less work and the same output.

Its `filter` runs spaCy's sentence split on every line it keeps, only to compare the total with
`min_num_sentences` at the end; here the count stops once that many sentences are found (the lines
are still edited and kept the same way, so the verdict and the edited text are the same). The
rest is datatrove's loop line for line, with its per-line statistics counters left out (the stage
does not read them), the longest-word test as one `max` and the policy substrings as one regex.
tests/test_heuristics_speed.py compares verdicts and texts with datatrove's own class.
"""
from __future__ import annotations

import re

from datatrove.pipeline.filters.c4_filters import (CITATION_REGEX, ELLIPSIS, END_PUNCTUATION, POLICY_SUBSTRINGS,
                                                   C4QualityFilter)
from datatrove.utils.text import split_into_sentences

POLICY = re.compile("|".join(map(re.escape, POLICY_SUBSTRINGS)))


class C4QualityFast(C4QualityFilter):
    def filter(self, doc) -> bool | tuple[bool, str]:
        if not self.split_paragraph:
            return super().filter(doc)
        num_sentences, kept_lines = 0, []
        for line in doc.text.splitlines():
            line = line.strip()
            words = line.split()
            if self.max_word_length != -1 and words and max(map(len, words)) > self.max_word_length:
                continue
            if self.remove_citations:
                line = CITATION_REGEX.sub("", line)
            if self.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith(ELLIPSIS)):
                continue
            if len(words) < self.min_words_per_line:
                continue
            line_l = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in line_l:
                return False, "lorem_ipsum"
            if self.filter_javascript and "javascript" in line_l:
                continue
            if self.filter_curly_bracket and "{" in line:
                return False, "curly_bracket"
            if self.filter_policy and POLICY.search(line_l):
                continue
            if self.min_num_sentences != -1 and num_sentences < self.min_num_sentences:
                num_sentences += len(split_into_sentences(line, self.language))
            kept_lines.append(line)
        if num_sentences < self.min_num_sentences:
            return False, "too_few_sentences"
        doc.text = "\n".join(kept_lines).strip()
        return True
