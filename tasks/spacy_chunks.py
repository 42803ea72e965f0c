"""spaCy's tokens of a text, each whitespace-separated piece of it tokenised once per process.

spaCy's `Tokenizer.__call__` cuts the text into maximal runs of whitespace and of non-whitespace
(`str.isspace`), drops the first character of a whitespace run when it is a space (that space
becomes the previous token's `whitespace_`; a run at the very start is kept whole), and tokenises
every remaining piece on its own: special cases, prefixes, suffixes, infixes, `token_match`,
`url_match` (spaCy 3's `_tokenize_affixes`). A piece's tokens are a function of the piece alone, so
spaCy caches them per piece. Only one step looks across pieces: `_apply_special_cases` runs a
PhraseMatcher over the whole document for the special cases that hold an affix or a space (e.g.
`:)` is cut into `:` `)` first, or Spanish `EE. UU.`, two pieces) and rewrites the tokens it
matches; a longer match also blocks the shorter ones it overlaps.

`ChunkTokens.arrays(text)` therefore gives spaCy's (IDX, LENGTH, ORTH, IS_PUNCT) array from the
tokens of each distinct piece (spaCy run on the piece alone, once, then a dict lookup), except when
a match of a multi-token special case could span two neighbouring pieces: then the matched token
texts would end the first piece with a proper prefix of the pattern (joined) and start the second
with the rest. Every piece is classed by those two tests against the tokenizer's own patterns
(rebuilt the way `add_special_case` builds them); a document where a piece that could end a
match precedes a piece that could start one is tokenised by spaCy whole, as before. So the tokens
are spaCy's on every text (tests/test_spacy_chunks.py compares them on real en/es/pt/ca text and
adversarial pieces); what moves is time: a warm lookup per piece instead of spaCy's per-piece
hashing, cache probes and Doc building for every piece of every document.
"""
from __future__ import annotations

import re
from itertools import accumulate
from operator import itemgetter

import numpy as np

# `\s` in a str pattern and `str.isspace` hold the same code points (tests/test_spacy_chunks.py checks all)
_PIECES = re.compile(r"(\s+)").split
MAX_PIECES = 100_000            # distinct pieces remembered per tokenizer (~0.9 KB each with their lexemes), then afresh
_NONE = (0, b"", frozenset(), frozenset())


class ChunkTokens:
    """spaCy's token arrays of texts for one `spacy.tokenizer.Tokenizer` (see the module docstring)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._affixes_only = affixes_only(tokenizer)
        self._known: dict = {"": _NONE}
        # every way a match could cross from one piece to the next: a pattern cut in two
        keys, patterns = matcher_patterns(tokenizer)
        # a piece's first / last token before matching is its first / last token after, unless a match
        # rewrote it: then the piece starts / ends with that special case's text
        alternatives = "|".join(map(re.escape, sorted(keys, key=len, reverse=True))) or r"(?!)"
        self._starts_with_key = re.compile(alternatives).match
        self._ends_with_key = re.compile("|".join(map(re.escape, sorted((k[::-1] for k in keys), key=len,
                                                                        reverse=True))) or r"(?!)").match
        self._cuts = [(tuple(p[:a]), tuple(p[a:])) for p in patterns for a in range(1, len(p))]
        self._by_last, self._by_first = {}, {}      # the cuts by the token a piece must end / start with
        for i, (first, rest) in enumerate(self._cuts):
            self._by_last.setdefault(first[-1], []).append(i)
            self._by_first.setdefault(rest[0], []).append(i)
        self._span = max(map(len, patterns), default=0)     # a match spans at most this many pieces
        self._batch = not any("\n" in p for p in patterns)

    def arrays(self, text: str) -> np.ndarray:
        """spaCy's `tokenizer(text).to_array([IDX, LENGTH, ORTH, IS_PUNCT])` as an (n, 4) uint64 array."""
        pieces = _PIECES(text)
        n = len(pieces)
        offsets = np.fromiter(accumulate(map(len, pieces[:-1]), initial=0), np.int64, n)
        if n > 1 and pieces[0] == "":
            pieces[1] = (pieces[1],)     # a whitespace run at the start is tokenised whole
        known = self._known
        entries = list(map(known.get, pieces))
        if None in entries:
            if len(known) > MAX_PIECES:
                known.clear()
                known[""] = _NONE
            self._learn(set(pieces).difference(known))
            entries = list(map(known.__getitem__, pieces))
        codes = np.fromiter(map(itemgetter(0), entries), np.int64, n)     # 4 x token count + flags
        counts = codes >> 2
        bearing = np.flatnonzero(counts)
        flags = (codes & 3)[bearing]
        if ((flags[:-1] & 1) & (flags[1:] >> 1)).any():
            self._tokenise_crossings(text, pieces, offsets, entries, counts, bearing, flags)
        arr = np.frombuffer(b"".join(map(itemgetter(1), entries)), np.uint64).reshape(-1, 4).copy()
        arr[:, 0] += np.repeat(offsets, counts).astype(np.uint64)
        return arr

    def _tokenise_crossings(self, text, pieces, offsets, entries, counts, bearing, flags) -> None:
        """Where a special case could match across pieces (the same cut ends one token-bearing piece
        and starts the next), spaCy tokenises the run of pieces such a match could cover as one
        text; its tokens replace the pieces' (in `entries` and `counts`, in place). No match crosses
        the run's ends: every match's first crossing was found, and it covers at most `_span` pieces."""
        crossings = [i for i in np.flatnonzero((flags[:-1] & 1) & (flags[1:] >> 1)).tolist()
                     if entries[bearing[i]][2] & entries[bearing[i + 1]][3]]
        runs: list[list[int]] = []
        for i in crossings:
            last = min(i + self._span - 1, len(bearing) - 1)
            if runs and i <= runs[-1][1]:
                runs[-1][1] = max(runs[-1][1], last)
            else:
                runs.append([i, last])
        bearing = bearing.tolist()
        for first, last in runs:
            a, b = bearing[first], bearing[last]
            start, end = int(offsets[a]), int(offsets[b + 1]) if b + 1 < len(pieces) else len(text)
            shift = 1 if isinstance(pieces[a], str) and pieces[a][0] == " " else 0
            arr = self.whole(text[start + shift:end])
            arr[:, 0] += shift
            entries[a] = (4 * len(arr), arr.tobytes(), None, None)
            counts[a] = len(arr)
            for k in range(a + 1, b + 1):
                entries[k], counts[k] = _NONE, 0

    def whole(self, text: str) -> np.ndarray:
        return token_array(self.tokenizer, text)

    def _learn(self, new: set) -> None:
        """Tokenise pieces not seen yet. Words (pieces without whitespace) go to spaCy together, one
        per line: no special case's pattern holds a newline token (`_batch`), so no match reaches
        across the newlines and each word's tokens are its own."""
        words = [p for p in new if isinstance(p, str) and p and not p[0].isspace()] if self._batch else []
        for piece in new.difference(words):
            self._known[piece] = self._piece(piece)
        if not words:
            return
        lengths = np.fromiter(map(len, words), np.int64, len(words))
        starts = np.zeros(len(words), np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        arr = self.whole("\n".join(words))
        idx = arr[:, 0].astype(np.int64)
        which = np.searchsorted(starts, idx, "right") - 1
        inside = idx < starts[which] + lengths[which]            # not a newline between two words
        arr, which = arr[inside], which[inside]
        arr[:, 0] -= starts[which].astype(np.uint64)
        bounds = np.searchsorted(which, np.arange(len(words) + 1)).tolist()
        for k, word in enumerate(words):
            self._known[word] = self._entry(word, arr[bounds[k]:bounds[k + 1]])

    def _piece(self, piece) -> tuple:
        """A piece's entry (see `_entry`), spaCy run on the piece alone."""
        if isinstance(piece, tuple):                 # the leading whitespace run
            text, shift = piece[0], 0
        elif piece[0] == " ":                        # a run after a token: its first space is dropped
            text, shift = piece[1:], 1
        else:
            text, shift = piece, 0
        if not text:
            return _NONE
        arr = self.whole(text)
        arr[:, 0] += shift
        return self._entry(text, arr)

    def _entry(self, text: str, arr: np.ndarray) -> tuple:
        """(4 x token count + 1 if it could end a special case's match + 2 if it could start one,
        (relative idx, length, orth, is_punct) of each token as bytes, the cuts it could end, those it
        could start)."""
        ends = starts = frozenset()
        strings = self.tokenizer.vocab.strings
        if (strings[int(arr[0, 2])] in self._by_first or strings[int(arr[-1, 2])] in self._by_last
                or self._starts_with_key(text) or self._ends_with_key(text[::-1])):
            # what the matcher sees: the piece's tokens before special cases are matched
            seen = tuple(t.text for t in self._affixes_only(text))
            cuts = self._cuts
            ends = frozenset(i for i in self._by_last.get(seen[-1], ()) if seen[-len(cuts[i][0]):] == cuts[i][0])
            starts = frozenset(i for i in self._by_first.get(seen[0], ()) if seen[:len(cuts[i][1])] == cuts[i][1]
                               or (len(seen) < len(cuts[i][1]) and cuts[i][1][:len(seen)] == seen))
        return 4 * len(arr) + (1 if ends else 0) + (2 if starts else 0), arr.tobytes(), ends, starts


class _Switch:
    """An affix function that answers "no affix" until switched on (see `affixes_only`)."""

    def __init__(self, find, off):
        self.find, self.off, self.on = find, off, False

    def __call__(self, string):
        return self.find(string) if self.on else self.off


def affixes_only(tokenizer):
    """A tokenizer giving `tokenizer`'s tokens before its PhraseMatcher pass (spaCy's
    `_tokenize_affixes(text, True)`): the same special cases, affixes and matches, but its matcher
    built while the affix functions answer "none", so it holds no pattern of an affix (a special
    case with a space never matches inside one piece: those are left out)."""
    from spacy.tokenizer import Tokenizer
    switches = [_Switch(f, off) if f is not None else None for f, off in (
        (tokenizer.prefix_search, None), (tokenizer.suffix_search, None), (tokenizer.infix_finditer, ()))]
    rules = {k: v for k, v in tokenizer.rules.items() if " " not in k or k.isspace()}
    plain = Tokenizer(tokenizer.vocab, rules=rules, prefix_search=switches[0], suffix_search=switches[1],
                      infix_finditer=switches[2], token_match=tokenizer.token_match, url_match=None,
                      faster_heuristics=tokenizer.faster_heuristics)
    plain.url_match = tokenizer.url_match        # (a setter: reloads the rules, affixes still off)
    for switch in switches:
        if switch is not None:
            switch.on = True
    plain._flush_cache()
    return plain


def token_array(tokenizer, text: str) -> np.ndarray:
    """spaCy itself on the text (the reference): (IDX, LENGTH, ORTH, IS_PUNCT) of each token."""
    from spacy.attrs import IDX, IS_PUNCT, LENGTH, ORTH
    doc = tokenizer(text)
    if not len(doc):
        return np.zeros((0, 4), np.uint64)
    return doc.to_array([IDX, LENGTH, ORTH, IS_PUNCT]).reshape(-1, 4).astype(np.uint64)


def multi_token_patterns(tokenizer) -> list[list[str]]:
    """The PhraseMatcher patterns of more than one token (see `matcher_patterns`)."""
    return matcher_patterns(tokenizer)[1]


def matcher_patterns(tokenizer) -> tuple[list[str], list[list[str]]]:
    """(the special cases spaCy's `add_special_case` gives its PhraseMatcher, their patterns of more
    than one token): each special case that holds a prefix, infix, suffix or space (every one without
    `faster_heuristics`), its tokens by affixes alone (a tokenizer without special cases)."""
    from spacy.tokenizer import Tokenizer
    bare = Tokenizer(tokenizer.vocab, rules={}, prefix_search=tokenizer.prefix_search,
                     suffix_search=tokenizer.suffix_search, infix_finditer=tokenizer.infix_finditer,
                     token_match=tokenizer.token_match, url_match=tokenizer.url_match)
    keys, patterns = [], []
    for string in tokenizer.rules:
        if (not tokenizer.faster_heuristics or tokenizer.find_prefix(string) or tokenizer.find_infix(string)
                or tokenizer.find_suffix(string) or " " in string):
            keys.append(string)
            tokens = [t.text for t in bare(string)]
            if len(tokens) > 1:
                patterns.append(tokens)
    return keys, patterns


_BY_TOKENIZER: dict[int, ChunkTokens] = {}


def for_tokenizer(tokenizer) -> ChunkTokens | None:
    """The ChunkTokens of a plain spaCy tokenizer (None for another class, e.g. Chinese or Japanese)."""
    from spacy.tokenizer import Tokenizer
    if type(tokenizer) is not Tokenizer:
        return None
    key = id(tokenizer)
    found = _BY_TOKENIZER.get(key)
    if found is None or found.tokenizer is not tokenizer:
        if len(_BY_TOKENIZER) > 16:      # tokenizers rebuilt (heuristics.use_tokenizer_cache): forget old ones
            _BY_TOKENIZER.clear()
        found = _BY_TOKENIZER[key] = ChunkTokens(tokenizer)
    return found
