"""Dedup's combine step: from the plan partitions' verified pairs and exact groups to a decision for
every document (for tasks/dedup.py).

Documents are visited in policy order (`first_seen`: shard/row order; `quality`: by descending
quality score; documents kept by earlier runs always stay): each is an exact duplicate of a kept
copy, else a near duplicate of its most similar kept candidate (Jaccard >= threshold), else kept.
Only documents with a pair or a copy are visited, so memory is the verified pairs, not the run.
Per shard, the rows that are not plain keeps (removed rows, kept rows with duplicates) are written
as one small parquet file: what the stage's `process` splits the shard by. The result is typed
(`DedupPlan`), like `LinePlan` in tasks/lines.py.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel

from quipu.catalog.files import atomic_path, sha256_file
from quipu.tasks.dedup_index import LOCAL_FLAG, DedupIndex, make_key, ref_key
from quipu.tasks.dedup_pairs import LOCAL, Docs, LocalDocs, Signatures, VerifiedPairs
from quipu.tasks.stage import StoredFile

KEPT, EXACT, NEAR = "kept", "exact_dup", "near_dup"


@dataclass(frozen=True)
class DecisionRules:
    """What decides between the documents of a cluster (from the stage's config)."""
    exact: bool
    near: bool
    threshold: float
    policy: str              # first_seen | quality
    verify: str              # exact | signature (for the examples' Jaccard estimates)


class DedupPlan(BaseModel):
    """The combine step's result, and its marker (`_plan/plan.json`)."""
    plan: str                            # the plan's fingerprint: the index records it at commit
    gen: int                             # the generation this run's kept documents join
    expected_next_gen: int               # the index's next generation when planning started
    decisions: dict[str, StoredFile]     # per shard: rows that are not plain keeps
    ranges: list[tuple[int, int]]        # the partitions' hash ranges, in order
    index: dict                          # the index before and after, for the report
    input_docs: int
    kept_docs: int
    exact_dup: int
    near_dup: int
    exact_dup_rate: float
    near_dup_rate: float
    cluster_size_histogram: dict[str, int]
    examples: list[dict]
    candidates: int
    plan_partitions: int
    largest_partition_bytes: int
    partition_stats: dict[str, int]
    partition_seconds: float
    policy_note: str | None
    seconds: float
    combine_seconds: float


class Decisions:
    """The policy pass over the verified pairs: groups of exact copies, candidates by group, and
    each visited document's decision."""

    def __init__(self, rules: DecisionRules, local: LocalDocs, partials: list[VerifiedPairs]):
        self.rules, self.local = rules, local
        load = lambda name: np.concatenate([np.load(p.files[name].path) for p in partials]) if partials else np.empty(0)
        a, b, jac = load("a").astype(np.uint64), load("b").astype(np.uint64), load("jaccard").astype(np.float64)
        member, leader = load("member").astype(np.uint64), load("leader").astype(np.uint64)
        self.group: dict[int, int] = dict(zip(member.tolist(), leader.tolist()))
        self.pairs_verified = len(a)
        near = jac >= rules.threshold
        a, b, jac = a[near], b[near], jac[near]
        # candidates by group: (group of one side, the other side, jaccard), both directions
        ga = np.array([self.group.get(x, x) for x in a.tolist()], dtype=np.uint64)
        gb = np.array([self.group.get(x, x) for x in b.tolist()], dtype=np.uint64)
        src, dst, j = np.concatenate([ga, gb]), np.concatenate([b, a]), np.concatenate([jac, jac])
        other_group = np.concatenate([gb, ga])
        keep = src != other_group                       # copies of one text are one group, not a pair
        src, dst, j = src[keep], dst[keep], j[keep]
        order = np.argsort(src, kind="stable")
        self.src, self.dst, self.j = src[order], dst[order], j[order]
        involved = np.unique(np.concatenate([a, b, member]))
        self.involved = involved[involved >= LOCAL_FLAG]

    def cands(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        s = np.searchsorted(self.src, np.uint64(g), side="left")
        e = np.searchsorted(self.src, np.uint64(g), side="right")
        return self.dst[s:e], self.j[s:e]

    def order(self, stats: Counter) -> list[int]:
        refs = self.involved.tolist()
        if self.rules.policy != "quality":
            return refs
        if not any(s.has_quality for s in self.local.results):
            stats["quality_column_missing"] = 1
            return refs
        q = {}
        by_file: dict[int, list[tuple[int, int]]] = {}
        for ref in refs:
            f, r = self.local.locate(ref)
            by_file.setdefault(f, []).append((ref, r))
        for f, items in by_file.items():
            col = self.local.column(f, "quality")
            for ref, r in items:
                q[ref] = float(col[r])
        return sorted(refs, key=lambda x: (0, -q[x], x) if not np.isnan(q[x]) else (1, 0.0, x))

    def run(self, has_shingles: Callable[[int], bool]) -> tuple[dict[int, tuple[str, int, float]], Counter, list[int]]:
        """{ref: (status, kept twin's ref, jaccard)} for removed documents, stats, processing order."""
        rules = self.rules
        stats = Counter()
        kept_of_group: dict[int, int] = {}      # group -> its first kept document
        for m, lead in self.group.items():      # index documents are kept; the earliest one leads
            if lead < LOCAL:
                kept_of_group[lead] = lead
        rank: dict[int, tuple[int, int]] = {}   # kept local ref -> (1, order it was kept in)
        removed: dict[int, tuple[str, int, float]] = {}
        order = self.order(stats)
        for x in order:
            g = self.group.get(x, x)
            if rules.exact and g in kept_of_group:
                removed[x] = (EXACT, kept_of_group[g], 1.0)
                continue
            if rules.near and has_shingles(x):
                best = None
                if g in kept_of_group:          # exact: false: a kept copy is a near duplicate at 1.0
                    best = (1.0, self._rank(kept_of_group[g], rank), kept_of_group[g])
                dst, js = self.cands(g)
                for k, jac in zip(dst.tolist(), js.tolist()):
                    gk = self.group.get(k, k)
                    kept = kept_of_group.get(gk, gk if gk < LOCAL else None)   # earlier runs' are kept
                    if kept is None:
                        continue
                    cand = (jac, self._rank(kept, rank), kept)
                    if best is None or cand[0] > best[0] or (cand[0] == best[0] and cand[1] < best[1]):
                        best = cand
                if best is not None:
                    removed[x] = (NEAR, best[2], best[0])
                    continue
            rank[x] = (1, len(rank))
            kept_of_group.setdefault(g, x)
        return removed, stats, order

    @staticmethod
    def _rank(ref: int, rank: dict) -> tuple[int, int]:
        return rank[ref] if ref >= LOCAL else (0, ref)


def decide(plan_id: str, gen: int, expected_next_gen: int, sig_results: list[Signatures],
           partials: list[VerifiedPairs], index: DedupIndex | None, rules: DecisionRules, out_dir: Path) -> DedupPlan:
    """Every document's decision from the partitions' results; writes `<shard>.parquet` per shard
    into `out_dir`. Of the `index` section only `twins_in_index` is filled: the caller knows the index."""
    t0 = time.perf_counter()
    local = LocalDocs(sig_results)
    decisions = Decisions(rules, local, partials)
    removed, stats, order = decisions.run(_has_shingles(local))
    t_decide = time.perf_counter() - t0

    # keys of kept documents: this run's in (shard, row) order after every earlier generation
    removed_sorted = np.array(sorted(removed), dtype=np.uint64)

    def key_of(ref: int) -> str:
        if ref < LOCAL:
            return ref_key(ref)
        return make_key(gen, ref - LOCAL - int(np.searchsorted(removed_sorted, np.uint64(ref))))

    ids = ids_of(sorted({t for _, t, _ in removed.values()}), local, index)
    dup_count = Counter(t for _, t, _ in removed.values())
    outputs = _write_decisions(local, removed, dup_count, ids, key_of, out_dir)
    examples = _pick_examples(order, removed, local, Docs(local, index, rules.verify), key_of, ids)
    local.close()
    counts = Counter(st for st, _, _ in removed.values())
    total = len(local)
    hist = Counter(n + 1 for n in dup_count.values())    # members removed + the kept one
    return DedupPlan(
        plan=plan_id, gen=gen, expected_next_gen=expected_next_gen, decisions=outputs,
        ranges=[(p.lo, p.hi) for p in partials],
        index={"twins_in_index": sum(n for t, n in dup_count.items() if t < LOCAL)},
        input_docs=total, kept_docs=total - len(removed), exact_dup=counts[EXACT], near_dup=counts[NEAR],
        exact_dup_rate=round(counts[EXACT] / total, 6) if total else 0.0,
        near_dup_rate=round(counts[NEAR] / total, 6) if total else 0.0,
        cluster_size_histogram={str(k): v for k, v in sorted(hist.items())},
        examples=examples, candidates=decisions.pairs_verified, plan_partitions=len(partials),
        largest_partition_bytes=max((p.held_bytes for p in partials), default=0),
        partition_stats=_summed([p.stats for p in partials]),
        partition_seconds=round(sum(p.seconds for p in partials), 3),
        policy_note="quality column missing: first_seen order used" if stats["quality_column_missing"] else None,
        seconds=round(time.perf_counter() - t0, 3), combine_seconds=round(t_decide, 3))


def _summed(stats: list[dict[str, int]]) -> dict[str, int]:
    total = Counter()
    for s in stats:
        total.update(s)       # zeros stay (Counter's + would drop them)
    return dict(total)


def _has_shingles(local: LocalDocs) -> Callable[[int], bool]:
    """Whether a document has any shingle (one too short has none: it can only be an exact copy)."""
    n_shingles: dict[int, np.ndarray] = {}

    def has_shingles(ref: int) -> bool:
        f, r = local.locate(ref)
        if f not in n_shingles:
            n_shingles[f] = local.column(f, "n_shingles")
        return bool(n_shingles[f][r] > 0)
    return has_shingles


def _write_decisions(local: LocalDocs, removed: dict, dup_count: Counter, ids: dict[int, str],
                     key_of: Callable[[int], str], out_dir: Path) -> dict[str, StoredFile]:
    """Per shard, the rows that are not plain keeps: removed rows (status, twin's id, its cluster
    key, Jaccard) and kept rows with duplicates (their cluster's size), in row order."""
    by_file: dict[int, list[int]] = {}
    for ref in list(removed) + [t for t in dup_count if t >= LOCAL]:
        by_file.setdefault(local.locate(ref)[0], []).append(ref)
    outputs: dict[str, StoredFile] = {}
    for f, s in enumerate(local.results):
        rows, status, dup_of, cluster, jac, size = [], [], [], [], [], []
        for ref in sorted(set(by_file.get(f, []))):
            rows.append(local.locate(ref)[1])
            if ref in removed:
                st, twin, j = removed[ref]
                status.append(st); dup_of.append(ids[twin]); cluster.append(key_of(twin)); jac.append(j); size.append(None)
            else:
                status.append(KEPT); dup_of.append(None); cluster.append(key_of(ref)); jac.append(None)
                size.append(1 + dup_count[ref])
        table = pa.table({"row": pa.array(rows, pa.int64()), "status": pa.array(status, pa.string()),
                          "dup_of": pa.array(dup_of, pa.string()), "cluster_id": pa.array(cluster, pa.string()),
                          "dup_jaccard": pa.array(jac, pa.float64()), "dup_count": pa.array(size, pa.int64())})
        path = out_dir / f"{s.shard.name}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        outputs[s.shard.name] = StoredFile(path=str(path), sha256=sha256_file(path))
    return outputs


def ids_of(refs: list[int], local: LocalDocs, index: DedupIndex | None) -> dict[int, str]:
    """Document ids by ref: this run's from the signature files, earlier runs' from the index."""
    out: dict[int, str] = {}
    by_file: dict[int, list[tuple[int, int]]] = {}
    for ref in refs:
        if ref >= LOCAL:
            f, r = local.locate(ref)
            by_file.setdefault(f, []).append((ref, r))
    for f, items in by_file.items():
        ids = pq.read_table(local.results[f].files["meta"].path, columns=["id"]).column("id")
        for ref, r in items:
            out[ref] = ids[r].as_py()
    earlier = [r for r in refs if r < LOCAL]
    if earlier:
        out.update(index.doc_ids_of(earlier))
    return out


def _pick_examples(order, removed, local: LocalDocs, docs: Docs, key_of, ids) -> list[dict]:
    """Three example pairs for the report: near duplicates first (in processing order), then exact."""
    near = [x for x in order if x in removed and removed[x][0] == NEAR][:3]
    exact = [x for x in order if x in removed and removed[x][0] == EXACT][:3 - len(near)]
    out = []
    for x in near + exact:
        st, twin, jac = removed[x]
        f, r = local.locate(x)
        kept_loc = local.locate(twin) if twin >= LOCAL else None
        est = float(np.mean(docs.signature(twin) == docs.signature(x)))
        out.append({"removed_id": ids_of([x], local, None)[x], "removed_shard": local.results[f].shard.name,
                    "removed_row": r, "kept_id": ids[twin], "cluster_id": key_of(twin),
                    "kept_shard": local.results[kept_loc[0]].shard.name if kept_loc else None,
                    "kept_row": kept_loc[1] if kept_loc else None,
                    "jaccard": round(jac, 4), "estimated_jaccard": round(est, 4)})
    return out
