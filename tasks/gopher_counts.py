"""datatrove's Gopher repetition counts, computed over arrays: the same numbers, a fraction of the time.

`GopherRepetitionFilter` counts, for n = 2..4, the characters of the most frequent word n-gram
(`get_n_grams` + `find_top_duplicate`: n-grams joined with spaces, ties to the first seen) and,
for n = 5..10, the characters of n-grams seen before in a left-to-right walk that jumps over a
repeat (`find_all_duplicate`: n-grams joined WITHOUT spaces, so "ab"+"c" repeats "a"+"bc"). In
pure Python these loops were about a third of the heuristics stage. Here:

- top n-gram: words become integer ids (no word holds a space, so equal space-joined n-grams are
  equal id tuples), rows of ids are counted with numpy; ties go to the earliest first occurrence,
  as `Counter.most_common(1)` does.
- repeated n-grams: every n-gram's concatenation gets a 64-bit polynomial hash of its characters
  (arithmetic modulo 2**64, numpy's wrapping uint64: one multiply per step; the base is odd, so it
  is invertible and a hash is made position-free by multiplying by base**-start); when no hash
  repeats, nothing repeats (equal strings have equal hashes) and the count is 0. Otherwise the
  walk runs only over the positions whose hash another position shares, and a repeat is confirmed
  by comparing the strings, so a hash collision (2**64 hashes are weak against crafted text, e.g.
  Thue-Morse strings) costs time but cannot change the result.
- `check` needs a top n-gram count only where `top_bound` (from word counts and lengths) could
  break the rule.

`words` must be what datatrove's tokenizer returns (stripped, non-empty); anything the fast paths
do not cover (a word holding a space) goes to datatrove's own functions.
"""
from __future__ import annotations

import numpy as np

BASE = 0x9E3779B97F4A7C15                       # odd: invertible modulo 2**64
_POWERS: list[np.ndarray] = [np.ones(0, np.uint64), np.ones(0, np.uint64)]


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """BASE**i and BASE**-i modulo 2**64, for i < n (grown by doubling, kept for the process)."""
    fwd, back = _POWERS
    if len(fwd) < n:
        size = max(n, 2 * len(fwd), 1 << 16)
        fwd, back = np.empty(size, np.uint64), np.empty(size, np.uint64)
        fwd[0] = back[0] = 1
        step, istep, filled, mask = BASE, pow(BASE, -1, 1 << 64), 1, (1 << 64) - 1
        while filled < size:            # fill [filled, 2*filled) from [0, filled): log2(size) numpy steps
            k = min(filled, size - filled)
            fwd[filled:filled + k] = fwd[:k] * np.uint64(step)           # wraps: modulo 2**64
            back[filled:filled + k] = back[:k] * np.uint64(istep)
            step, istep, filled = step * step & mask, istep * istep & mask, filled + k
        _POWERS[:] = fwd, back
    return fwd[:n], back[:n]


class WordStats:
    """One document's words as arrays: ids, lengths, and prefix hashes of their concatenation."""

    def __init__(self, words: list[str], distinct: dict | None = None):
        """`distinct`: `dict.fromkeys(words)` when the caller already has it."""
        self.words = words
        # ids in order of first occurrence; the loops run in C but over the distinct words
        distinct = dict.fromkeys(words) if distinct is None else distinct
        self.index = ids = dict(zip(distinct, range(len(distinct))))      # word -> id
        self.ids = np.fromiter(map(ids.__getitem__, words), np.int64, len(words))
        self.vocab = len(ids)
        self.distinct = list(ids)          # the distinct words, id order
        self.offsets = np.zeros(len(words) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, words), np.int64, len(words)), out=self.offsets[1:])
        self.joined = "".join(words)
        self.space_free = " " not in self.joined     # no word holds a space
        self._prefix: np.ndarray | None = None
        self._at_words: tuple[np.ndarray, np.ndarray] | None = None
        self._counts: np.ndarray | None = None
        self._bound: tuple[int, int] | None = None
        self._offset_list: list[int] | None = None

    @property
    def offset_list(self) -> list[int]:
        if self._offset_list is None:
            self._offset_list = self.offsets.tolist()
        return self._offset_list

    @property
    def counts(self) -> np.ndarray:
        """How often each distinct word occurs (id order)."""
        if self._counts is None:
            self._counts = np.bincount(self.ids, minlength=self.vocab)
        return self._counts

    def _prefixes(self) -> np.ndarray:
        """Prefix hashes of the joined words: h[k] = sum of code[i] * BASE**i for i < k (mod 2**64)."""
        if self._prefix is None:
            codes = np.frombuffer(self.joined.encode("utf-32-le", "surrogatepass"), np.uint32).astype(np.uint64)
            self._prefix = np.zeros(len(codes) + 1, np.uint64)
            np.cumsum(codes * _powers(len(codes))[0], out=self._prefix[1:])
        return self._prefix

    def ngram_keys(self, n: int) -> np.ndarray:
        """Each n-gram's concatenation hashed, position-free (equal strings, equal keys)."""
        m = max(0, len(self.words) - n + 1)
        if self._at_words is None:      # prefix hashes and BASE**-offset at every word boundary
            self._at_words = self._prefixes()[self.offsets], _powers(len(self.joined) + 1)[1][self.offsets]
        h, back = self._at_words
        return (h[n:n + m] - h[:m]) * back[:m]

    def id_keys(self, n: int) -> np.ndarray:
        """One key per n-gram of word ids: the n ids as one int64 number where that is exact, else
        the id rows as bytes."""
        m = len(self.words) - n + 1
        if self.vocab ** n < 1 << 62:
            keys = np.zeros(m, np.int64)
            for k in range(n):
                keys = keys * self.vocab + self.ids[k:k + m]
            return keys
        rows = np.lib.stride_tricks.sliding_window_view(self.ids, n)[:m]
        return np.ascontiguousarray(rows).view(np.dtype((np.void, 8 * n))).ravel()

    def top_duplicate(self, n: int) -> int:
        """`find_top_duplicate(get_n_grams(words, n))`: characters of the most frequent n-gram x its count."""
        keys = self.id_keys(n)
        if keys.dtype == np.int64:
            order = np.argsort(keys, kind="stable")       # equal keys together, in position order
            ordered = keys[order]
            bounds = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1], [True])))
            counts = np.diff(bounds)
            top = counts.max()
            # ties go to the n-gram seen first (Counter.most_common): the smallest first position
            i = int(order[bounds[:-1][counts == top]].min())
        else:
            return self.top_by_unique(keys, n)
        return self._top_chars(i, n, top)

    def top_by_unique(self, keys: np.ndarray, n: int) -> int:
        """`top_duplicate` from any n-gram keys, by `np.unique` (first occurrences and counts)."""
        _, first, counts = np.unique(keys, return_index=True, return_counts=True)
        top = counts.max()
        return self._top_chars(int(first[counts == top].min()), n, top)

    def _top_chars(self, i: int, n: int, top) -> int:
        chars = int(self.offsets[i + n] - self.offsets[i]) + n - 1      # the words and n - 1 spaces
        return chars * int(top)

    def top_bound(self, n: int) -> int:
        """An upper bound of `top_duplicate(n)`: an n-gram seen k times holds each of its words k
        times at least, so k * chars <= n * max(count * length) + (n - 1) * max(count)."""
        if self._bound is None:
            counts = self.counts
            self._bound = int((counts * np.fromiter(map(len, self.distinct), np.int64, self.vocab)).max()), int(counts.max())
        most_chars, most = self._bound
        return n * most_chars + (n - 1) * most

    def all_duplicate(self, n: int) -> int:
        """`find_all_duplicate(words, n)`: characters of the repeated n-grams of the jumping walk.

        Only positions whose key another position shares can repeat or be repeated, so the walk runs
        over those. Each key stands for the string of the first position the walk kept with it; a
        later position with that key repeats iff its string is that one (compared, so a hash collision
        cannot count: a mismatch hands the n to `_all_duplicate_by_groups`, which compares every match)."""
        m = len(self.words) - n + 1
        if m <= 0:
            return 0
        key = self.ngram_keys(n)
        ordered = np.sort(key)
        same = ordered[1:] == ordered[:-1]
        if not same.any():
            return 0                         # no hash occurs twice, so no n-gram string does
        shared = np.isin(key, ordered[1:][same])          # positions sharing their key with another
        positions = np.flatnonzero(shared)
        joined, offsets = self.joined, self.offset_list
        kept: dict[int, int] = {}            # key -> the first position the walk kept with it
        repeated, walk = 0, 0
        for p, k in zip(positions.tolist(), key[positions].tolist()):
            if p < walk:
                continue                     # inside the jump after an earlier repeat
            q = kept.get(k)
            if q is None:
                kept[k] = p                  # not seen before: the walk keeps it and steps on
                continue
            gram = joined[offsets[p]:offsets[p + n]]
            if gram != joined[offsets[q]:offsets[q + n]]:
                return self._all_duplicate_by_groups(n, key)   # a hash collision
            repeated += len(gram)
            walk = p + n
        return repeated

    def _all_duplicate_by_groups(self, n: int, key: np.ndarray) -> int:
        """`all_duplicate` where keys collide: every hash match confirmed against each earlier position."""
        m = len(key)
        order = np.argsort(key, kind="stable")     # positions grouped by hash, in position order
        sorted_key = key[order]
        same = sorted_key[1:] == sorted_key[:-1]
        new_group = np.ones(m, bool)
        new_group[1:] = ~same
        group_of = np.empty(m, np.int64)
        group_of[order] = np.cumsum(new_group) - 1
        seen_before = np.zeros(m, bool)
        seen_before[order[~new_group]] = True
        # the walk, over the positions whose hash was seen before, in plain Python lists
        bounds, order = np.append(np.flatnonzero(new_group), m).tolist(), order.tolist()
        joined, offsets = self.joined, self.offset_list
        skipped = bytearray(m + n)           # positions jumped over (their n-grams never seen)
        repeated, walk = 0, 0
        for p, g in zip(np.flatnonzero(seen_before).tolist(), group_of[seen_before].tolist()):
            if p < walk:
                continue                     # inside the jump after an earlier repeat
            gram = joined[offsets[p]:offsets[p + n]]
            for q in order[bounds[g]:bounds[g + 1]]:
                if q >= p:
                    walk = p + 1             # not seen before: the walk steps on
                    break
                if not skipped[q] and joined[offsets[q]:offsets[q + n]] == gram:
                    repeated += len(gram)
                    skipped[p + 1:p + n] = b"\x01" * (n - 1)
                    walk = p + n
                    break
        return repeated


class NGrams:
    """What the patched `get_n_grams` returns: the document's words and n, for `find_top_duplicate`."""

    def __init__(self, stats: WordStats, n: int):
        self.stats, self.n = stats, n

    def __len__(self) -> int:
        return max(0, len(self.stats.words) - self.n + 1)


def install(stats_of) -> None:
    """Route datatrove's Gopher repetition helpers through `WordStats` whenever `stats_of(words)`
    gives one (while a document is judged); otherwise they are datatrove's own."""
    import datatrove.pipeline.filters.gopher_repetition_filter as rep
    if getattr(rep, "_quipu_fast", False):
        return
    get_n_grams, find_top_duplicate, find_all_duplicate = rep.get_n_grams, rep.find_top_duplicate, rep.find_all_duplicate

    def fast_get_n_grams(words, n):
        stats = stats_of(words)
        return get_n_grams(words, n) if stats is None else NGrams(stats, n)

    def fast_find_top_duplicate(x):
        return x.stats.top_duplicate(x.n) if isinstance(x, NGrams) else find_top_duplicate(x)

    def fast_find_all_duplicate(words, n):
        stats = stats_of(words)
        return find_all_duplicate(words, n) if stats is None else stats.all_duplicate(n)

    rep.get_n_grams, rep.find_top_duplicate, rep.find_all_duplicate = \
        fast_get_n_grams, fast_find_top_duplicate, fast_find_all_duplicate
    rep._quipu_fast = True
