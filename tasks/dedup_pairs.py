"""Dedup's documents and candidate pairs (the algorithm of its plan partitions, for tasks/dedup.py).

A document is named by a ref (uint64): an index document by `gen << 36 | n`, one of this run's by
`LOCAL_FLAG | position in shard order`. `Signatures` is what the scan leaves per shard (typed:
the driver keeps it as the scan's done-marker); `LocalDocs` reads this run's documents from those
files and `Docs` adds the index's. `verify_range` finds one hash range's candidate pairs in the band
buckets, keeps those the range owns, and verifies each; `exact_groups` pairs each copy of a text
with the first one. Memory: one range's band rows, and the signatures of the pairs being checked.
"""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from quipu.tasks.dedup_index import BAND_COLUMNS, EXACT_COLUMNS, LOCAL_FLAG, DedupIndex
from quipu.tasks.minhash import band_keys
from quipu.tasks.partitions import KeyRange, NpyRows, SortedRun, partition_of
from quipu.tasks.stage import PhaseResult, Shard

LOCAL = int(LOCAL_FLAG)      # refs of this run's documents start here, after every generation's


class Signatures(PhaseResult):
    """One shard's scan: files `meta` (id, exact digest, shingle count, offset, quality), `sig`
    (docs x num_perm), `shingles` (with exact verification), and its band and exact-hash rows,
    each sorted by hash (what the plan partitions read)."""
    shard: Shard
    rows: int
    has_quality: bool
    bands: SortedRun
    exact: SortedRun


class HashRange(KeyRange):
    """One plan partition (of `n`): the band and exact-hash rows with lo <= hash < hi, of this run
    and the index as it was when the plan started (`next_gen`, `index`: its visible generations)."""
    n: int
    plan: str
    next_gen: int
    index: list


class VerifiedPairs(PhaseResult):
    """One hash range's result: files `a`, `b`, `jaccard` (the verified candidate pairs it owns) and
    `member`, `leader` (each copy of a text and the first copy)."""
    p: int
    lo: int
    hi: int
    next_gen: int
    stats: dict[str, int]
    held_bytes: int
    ran_in: dict                 # which worker planned it (host, pid)


class LocalDocs:
    """This run's documents by ref (LOCAL_FLAG | position in shard order): signatures, shingles,
    ids, read from the memory-mapped signature files of each shard, opened when first needed."""

    def __init__(self, sig_results: list[Signatures]):
        self.results = sig_results
        self.bases = np.concatenate([[0], np.cumsum([s.rows for s in sig_results])]).astype(np.int64)
        self._open: dict[int, dict] = {}

    def __len__(self) -> int:
        return int(self.bases[-1])

    def locate(self, ref: int) -> tuple[int, int]:
        n = int(ref) - LOCAL
        f = int(np.searchsorted(self.bases, n, side="right")) - 1
        return f, n - int(self.bases[f])

    def _file(self, f: int) -> dict:
        o = self._open.get(f)
        if o is None:
            files = self.results[f].files
            meta = pq.read_table(files["meta"].path, columns=["n_shingles", "offset"])
            n = meta.column("n_shingles").to_numpy()
            o = self._open[f] = {
                "sig": NpyRows(files["sig"].path),
                "flat": NpyRows(files["shingles"].path) if "shingles" in files else None,
                "offsets": np.append(meta.column("offset").to_numpy(), int(n.sum()) if len(n) else 0)}
        return o

    def signature(self, ref: int) -> np.ndarray:
        f, r = self.locate(ref)
        return self._file(f)["sig"].rows(r, r + 1)[0]

    def signatures(self, refs: np.ndarray) -> np.ndarray:
        """(len(refs), num_perm): the signatures of many documents, read shard by shard."""
        n = (refs & ~LOCAL_FLAG).astype(np.int64)
        f = np.searchsorted(self.bases, n, side="right") - 1
        out = None
        for k in np.unique(f):
            sel = np.nonzero(f == k)[0]
            sig = self._file(int(k))["sig"]
            if out is None:
                out = np.empty((len(refs), *sig.row_shape), np.uint32)
            out[sel] = sig.take(n[sel] - self.bases[k])
        return out if out is not None else np.zeros((0, 0), np.uint32)

    def shingles(self, ref: int) -> np.ndarray:
        f, r = self.locate(ref)
        o = self._file(f)
        return o["flat"].rows(o["offsets"][r], o["offsets"][r + 1])

    def close(self) -> None:
        for o in self._open.values():
            o["sig"].close()
            if o["flat"] is not None:
                o["flat"].close()
        self._open.clear()

    def column(self, f: int, name: str) -> np.ndarray | list:
        col = pq.read_table(self.results[f].files["meta"].path, columns=[name]).column(name)
        return col.to_pylist() if name in ("id", "exact") else col.to_numpy(zero_copy_only=False)


class Docs:
    """Every document a plan can name, by ref: this run's (LocalDocs) and the index's."""

    def __init__(self, local: LocalDocs, index: DedupIndex | None, verify: str):
        self.local, self.index, self.verify = local, index, verify
        self._sets: dict[int, np.ndarray] = {}

    def signature(self, ref: int) -> np.ndarray:
        return self.local.signature(ref) if ref >= LOCAL else self.index.signature(ref)

    def signatures(self, refs: np.ndarray) -> np.ndarray:
        local = refs >= LOCAL_FLAG
        if local.all():
            return self.local.signatures(refs)
        out = np.stack([self.signature(int(r)) for r in refs[~local]]) if (~local).any() else None
        full = np.empty((len(refs), out.shape[1]), np.uint32)
        full[~local] = out
        if local.any():
            full[local] = self.local.signatures(refs[local])
        return full

    def shingle_set(self, ref: int) -> np.ndarray:
        s = self._sets.get(ref)
        if s is None:
            raw = self.local.shingles(ref) if ref >= LOCAL else self.index.shingles(ref)
            if len(self._sets) > 50_000:
                self._sets.clear()
            s = self._sets[ref] = np.unique(raw)
        return s

    def jaccard(self, a: int, b: int) -> float:
        """Exact Jaccard of the shingle sets (`verify: exact`), else estimated from the signatures."""
        if self.verify == "exact":
            x, y = self.shingle_set(a), self.shingle_set(b)
            inter = len(np.intersect1d(x, y, assume_unique=True))
            return inter / (len(x) + len(y) - inter)
        return float(np.mean(self.signature(a) == self.signature(b)))


# ---- rows of one hash range ---------------------------------------------------------------------

def global_refs(sig_results: list[Signatures], kind: str, lo: int, hi: int) -> dict[str, np.ndarray]:
    """This run's band (`kind` "bands") or exact-hash ("exact") rows in [lo, hi), refs made global."""
    parts = []
    base = 0
    for s in sig_results:
        cols = getattr(s, kind).slice(lo, hi)
        cols["ref"] = cols["ref"] + np.uint64(base) | LOCAL_FLAG
        parts.append(cols)
        base += s.rows
    names = BAND_COLUMNS if kind == "bands" else EXACT_COLUMNS
    return {c: np.concatenate([p[c] for p in parts]) if parts else np.empty(0, np.uint64) for c in names}


def merge(local: dict[str, np.ndarray], index: dict[str, np.ndarray] | None, order: list[str]) -> dict[str, np.ndarray]:
    """Rows sorted by `order`: index rows (smaller refs) first and this run's in ref order, so a
    stable sort on the other columns leaves equal rows in ref order."""
    index = index or {c: np.empty(0, np.uint64) for c in order}
    cols = {c: np.concatenate([index[c], local[c]]).astype(np.uint64, copy=False) for c in order}
    idx = np.lexsort([cols[c] for c in reversed(order[:-1])])
    return {c: v[idx] for c, v in cols.items()}


def bucket_pairs(rows: dict[str, np.ndarray], cap: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Candidate pairs (a < b by ref) of band rows sorted by (key, digest, ref): in each bucket
    (equal key), documents with the same exact-hash prefix collapse to the first (its copies pair
    with it only), and each remaining document pairs with up to `cap` earlier ones."""
    key, digest, ref = rows["key"], rows["digest"], rows["ref"]
    n = len(key)
    stats = {"band_rows": n, "buckets_over_cap": 0}
    if n < 2:
        return np.empty(0, np.uint64), np.empty(0, np.uint64), stats
    new_group = np.ones(n, bool)
    new_group[1:] = (key[1:] != key[:-1]) | (digest[1:] != digest[:-1])
    group_first = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    copies = ~new_group
    a_copy, b_copy = ref[group_first[copies]], ref[copies]          # a copy and its bucket's first copy
    reps = np.nonzero(new_group)[0]
    rk, rr = key[reps], ref[reps]
    order = np.lexsort([rr, rk])                                    # earliest documents first in a bucket
    rk, rr = rk[order], rr[order]
    starts = np.ones(len(rk), bool)
    starts[1:] = rk[1:] != rk[:-1]
    bucket_start = np.maximum.accumulate(np.where(starts, np.arange(len(rk)), 0))
    pos = np.arange(len(rk)) - bucket_start                         # position in its bucket
    k = np.minimum(pos, cap)                                        # pairs with the k earliest
    size = np.bincount(np.cumsum(starts) - 1)
    stats["buckets_over_cap"] = int((size > cap + 1).sum())
    total = int(k.sum())
    if total:
        i = np.repeat(np.arange(len(rk)), k)
        j = bucket_start[i] + (np.arange(total) - np.repeat(np.cumsum(k) - k, k))
        a_rep, b_rep = rr[j], rr[i]
    else:
        a_rep = b_rep = np.empty(0, np.uint64)
    a = np.concatenate([a_copy, a_rep])
    b = np.concatenate([b_copy, b_rep])
    lo_, hi_ = np.minimum(a, b), np.maximum(a, b)
    keep = lo_ != hi_
    return _unique_pairs(lo_[keep], hi_[keep]) + (stats,)


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(a) == 0:
        return a, b
    order = np.lexsort([b, a])
    a, b = a[order], b[order]
    first = np.ones(len(a), bool)
    first[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[first], b[first]


def owned(a: np.ndarray, b: np.ndarray, docs: Docs, bands: int, rows: int, part: HashRange) -> np.ndarray:
    """Which pairs this partition verifies: those whose first shared band hash falls in it (a pair
    sharing several bands is found in several partitions and verified once)."""
    out = np.zeros(len(a), bool)
    for s in range(0, len(a), 20_000):
        sa, sb = docs.signatures(a[s:s + 20_000]), docs.signatures(b[s:s + 20_000])
        ka, kb = band_keys(sa, bands, rows), band_keys(sb, bands, rows)
        same = ka == kb
        first = np.argmax(same, axis=1)
        key = ka[np.arange(len(first)), first]
        out[s:s + len(first)] = same.any(axis=1) & (partition_of(key, part.n) == part.p)
    return out


def verify_range(band: dict[str, np.ndarray], docs: Docs, part: HashRange, bands: int, rows: int,
                 bucket_cap: int, threshold: float) -> tuple[dict[str, np.ndarray], dict]:
    """The candidate pairs of one range's merged band rows that the range owns, each verified:
    ({a, b, jaccard}, stats). A pair of two index documents decides nothing and is dropped."""
    a, b, stats = bucket_pairs(band, bucket_cap)
    local_pair = b >= LOCAL_FLAG
    a, b = a[local_pair], b[local_pair]
    stats["candidate_pairs"] = int(len(a))
    mine = owned(a, b, docs, bands, rows, part) if len(a) else np.zeros(0, bool)
    a, b = a[mine], b[mine]
    jac = np.array([docs.jaccard(int(x), int(y)) for x, y in zip(a, b)], dtype=np.float64)
    stats["verified_pairs"] = int(len(a))
    stats["similar_pairs"] = int((jac >= threshold).sum())
    return {"a": a, "b": b, "jaccard": jac}, stats


def exact_groups(ex: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """From exact-hash rows sorted by (hi, lo, ref): each member of a group of two or more copies
    and its leader (the group's first ref)."""
    n = len(ex["hi"])
    first = np.ones(n, bool)
    if n:
        first[1:] = (ex["hi"][1:] != ex["hi"][:-1]) | (ex["lo"][1:] != ex["lo"][:-1])
    leader = ex["ref"][np.maximum.accumulate(np.where(first, np.arange(n), 0))] if n else ex["ref"]
    last = np.ones(n, bool)
    if n:
        last[:-1] = first[1:]
    in_group = ~(first & last)
    return {"member": ex["ref"][in_group], "leader": leader[in_group]}
