"""The n-gram counts of `quipu.tasks.gopher_counts.WordStats` as they were when issue 40 was filed
(5a02274 to ca9b519: a 62-bit hash over two moduli, `np.unique` for the top n-gram, the walk over numpy
arrays), frozen here so that bench/heuristics_speed.py's `before` arm runs the code of then, not
today's faster one. Same numbers (tests/test_heuristics.py compares both with datatrove's own).
"""
from __future__ import annotations

import numpy as np

from quipu.tasks.gopher_counts import WordStats

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


class WordStatsBefore(WordStats):
    """`WordStats` with the counting methods of ca9b519."""

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
        """`find_top_duplicate(get_n_grams(words, n))`: np.unique over every key (as then)."""
        return self.top_by_unique(self.id_keys(n), n)

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
