"""datatrove's Gopher repetition counts, computed over arrays: the same numbers, a fraction of the time.

`GopherRepetitionFilter` counts, for n = 2..4, the characters of the most frequent word n-gram
(`get_n_grams` + `find_top_duplicate`: n-grams joined with spaces, ties to the first seen) and,
for n = 5..10, the characters of n-grams seen before in a left-to-right walk that jumps over a
repeat (`find_all_duplicate`: n-grams joined WITHOUT spaces, so "ab"+"c" repeats "a"+"bc"). In
pure Python these loops were about a third of the heuristics stage. Here:

- top n-gram: words become integer ids (no word holds a space, so equal space-joined n-grams are
  equal id tuples), rows of ids are counted with numpy; ties go to the earliest first occurrence,
  as `Counter.most_common(1)` does.
- repeated n-grams: every n-gram's concatenation gets a 62-bit polynomial hash of its characters
  (two moduli, vectorised over the document's code points); when no hash repeats, nothing repeats
  (equal strings have equal hashes) and the count is 0. Otherwise the walk runs only over the
  positions whose hash was seen before, and a repeat is confirmed by comparing the strings, so a
  hash collision cannot change the result.

`words` must be what datatrove's tokenizer returns (stripped, non-empty); anything the fast paths
do not cover (a word holding a space) goes to datatrove's own functions.
"""
from __future__ import annotations

import numpy as np

MOD1, MOD2 = 2_147_483_629, 2_147_483_587        # primes below 2**31: products fit in int64
BASE1, BASE2 = 131_071, 524_287
_POWERS: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}


def _powers(base: int, mod: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """base**i and base**-i modulo `mod`, for i < n (grown by doubling, kept for the process)."""
    have = _POWERS.get((base, mod))
    if have is None or len(have[0]) < n:
        size = max(n, 2 * len(have[0]) if have else 1 << 16)
        inv = pow(base, mod - 2, mod)
        fwd, back = np.empty(size, np.int64), np.empty(size, np.int64)
        fwd[0] = back[0] = 1
        step, istep, filled = base, inv, 1
        while filled < size:            # fill [filled, 2*filled) from [0, filled): log2(size) numpy steps
            k = min(filled, size - filled)
            fwd[filled:filled + k] = fwd[:k] * step % mod
            back[filled:filled + k] = back[:k] * istep % mod
            step, istep, filled = step * step % mod, istep * istep % mod, filled + k
        _POWERS[(base, mod)] = have = (fwd, back)
    return have[0][:n], have[1][:n]


class WordStats:
    """One document's words as arrays: ids, lengths, and prefix hashes of their concatenation."""

    def __init__(self, words: list[str], distinct: dict | None = None):
        """`distinct`: `dict.fromkeys(words)` when the caller already has it."""
        self.words = words
        # ids in order of first occurrence; the loops run in C but over the distinct words
        distinct = dict.fromkeys(words) if distinct is None else distinct
        ids = dict(zip(distinct, range(len(distinct))))
        self.ids = np.fromiter(map(ids.__getitem__, words), np.int64, len(words))
        self.vocab = len(ids)
        self.distinct = list(ids)          # the distinct words, id order
        self.offsets = np.zeros(len(words) + 1, np.int64)
        np.cumsum(np.fromiter(map(len, words), np.int64, len(words)), out=self.offsets[1:])
        self.joined = "".join(words)
        self.space_free = " " not in self.joined     # no word holds a space
        self._prefix: list[np.ndarray] | None = None
        self._counts: np.ndarray | None = None

    @property
    def counts(self) -> np.ndarray:
        """How often each distinct word occurs (id order)."""
        if self._counts is None:
            self._counts = np.bincount(self.ids, minlength=self.vocab)
        return self._counts

    def _prefixes(self) -> list[np.ndarray]:
        if self._prefix is None:
            codes = np.frombuffer(self.joined.encode("utf-32-le", "surrogatepass"), np.uint32).astype(np.int64)
            self._prefix = []
            for base, mod in ((BASE1, MOD1), (BASE2, MOD2)):
                fwd, _ = _powers(base, mod, len(codes) + 1)
                h = np.zeros(len(codes) + 1, np.int64)
                np.cumsum(codes * fwd[:len(codes)] % mod, out=h[1:])   # < 2**21 * 2**31 per term
                self._prefix.append(h % mod)
        return self._prefix

    def top_duplicate(self, n: int) -> int:
        """`find_top_duplicate(get_n_grams(words, n))`: characters of the most frequent n-gram x its count."""
        m = len(self.words) - n + 1
        if self.vocab ** n < 1 << 62:        # the n ids as one number (exact)
            keys = np.zeros(m, np.int64)
            for k in range(n):
                keys = keys * self.vocab + self.ids[k:k + m]
        else:
            rows = np.lib.stride_tricks.sliding_window_view(self.ids, n)[:m]
            keys = np.ascontiguousarray(rows).view(np.dtype((np.void, 8 * n))).ravel()
        _, first, counts = np.unique(keys, return_index=True, return_counts=True)
        top = counts.max()
        i = int(first[counts == top].min())
        chars = int(self.offsets[i + n] - self.offsets[i]) + n - 1      # the words and n - 1 spaces
        return chars * int(top)

    def all_duplicate(self, n: int) -> int:
        """`find_all_duplicate(words, n)`: characters of the repeated n-grams of the jumping walk."""
        m = len(self.words) - n + 1
        if m <= 0:
            return 0
        start, end = self.offsets[:m], self.offsets[n:n + m]
        key = np.zeros(m, np.int64)
        for (base, mod), h in zip(((BASE1, MOD1), (BASE2, MOD2)), self._prefixes()):
            _, back = _powers(base, mod, len(self.joined) + 1)
            part = (h[end] - h[start]) % mod * back[start] % mod       # the n-gram's hash, position-free
            key = key * (1 << 31) + part
        if len(set(key.tolist())) == m:
            return 0                         # no hash occurs twice, so no n-gram string does
        order = np.argsort(key, kind="stable")     # positions grouped by hash, in position order
        sorted_key = key[order]
        new_group = np.ones(m, bool)
        new_group[1:] = sorted_key[1:] != sorted_key[:-1]
        group_of = np.empty(m, np.int64)
        group_of[order] = np.cumsum(new_group) - 1
        bounds = np.append(np.flatnonzero(new_group), m).tolist()
        seen_before = np.zeros(m, bool)
        seen_before[order[~new_group]] = True
        joined, offsets = self.joined, self.offsets
        skipped = np.zeros(m, bool)
        repeated, walk = 0, 0
        for p in np.flatnonzero(seen_before).tolist():
            if p < walk:
                continue                     # inside the jump after an earlier repeat
            gram = joined[offsets[p]:offsets[p + n]]
            g = int(group_of[p])
            hit = False
            for q in order[bounds[g]:bounds[g + 1]].tolist():
                if q >= p:
                    break
                if not skipped[q] and joined[offsets[q]:offsets[q + n]] == gram:
                    hit = True
                    break
            if hit:
                repeated += len(gram)
                skipped[p + 1:p + n] = True
                walk = p + n
            else:
                walk = p + 1
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
