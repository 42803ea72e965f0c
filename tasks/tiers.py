"""Stage `tiers`: combine the judges' scores into one integer `quality_tier` per document, as
Nemotron-CC does (Su et al. 2024, "Nemotron-CC", arXiv:2412.02595, section 2.2): each judge's score
becomes the document's token-weighted percentile among its language's documents, the judges'
percentiles are combined (by default their maximum), and the result is cut into `tiers` equal
bands: tier 0 holds the lowest-scoring fifth of a language's tokens, tier 4 the highest (5 tiers).

Percentiles never depend on the batch, the shard or the run (determinism, streaming, out of core):
they come from per-language tables of each judge's token-weighted quantiles, fitted once on a
sample of curated documents (`fit_tables`, `quipu tiers fit`) and stored in a small JSON file with
its provenance. The shipped default, tasks/tier_tables/default.json, is rebuilt by
bench/tier_tables.py.

A judge is any numeric column an earlier stage wrote (`fluency_word_order`, `fluency_burstiness`,
`quality_score`, `ppl_kenlm`, `ppl_wayra`, a classifier's `<name>_score`, ...) with its direction
(perplexities: lower is better). A judge applies to a document when the document has a score and
the tables hold the judge for its language; a document no judge applies to gets no tier (null) and
is kept unless `unscored: remove`. Every judge's score stays on the document; the stage adds
`quality_percentile` (the combined percentile, 0-100) and `quality_tier`.

`min_tier` removes, per language, documents below a tier (reason `tiers:quality_tier<N`); off by
default, so the stage annotates. The report holds, per language and tier, documents, tokens, how
many were kept, and an example (the document of the tier with the smallest id hash).
"""
from __future__ import annotations

import hashlib
import heapq
import json
import math
from bisect import bisect_left, bisect_right
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from quipu.catalog.files import sha256_file, write_bytes_atomic
from quipu.tasks.classifiers.quality_edu import EduFilter
from quipu.tasks.classifiers.transformer_judge import HfJudge
from quipu.tasks.fluency import BURSTINESS, WORD_ORDER
from quipu.tasks.per_language import PerLanguage, resolve
from quipu.tasks.perplexity import PPL_KENLM, PPL_WAYRA
from quipu.tasks.quality import QUALITY_SCORE
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, Stage, StageConfig, langs_of, snippet, split_by_mask
from quipu.tasks.terminal_punct import TERMINAL_PUNCT_SCORE

TABLES_FORMAT = "quipu-quality-tiers/1"
DEFAULT_TABLES = Path(__file__).parent / "tier_tables" / "default.json"
QUALITY_PERCENTILE = pa.field("quality_percentile", pa.float64())
QUALITY_TIER = pa.field("quality_tier", pa.int64())
UNSCORED = "unscored"
GRID = 100          # quantiles at percentiles 0, 1, ..., 100

# the judges quipu's stages write, with their direction; any other column is a judge when the
# tables name it (`quipu tiers fit --judge edu_score:higher`)
KNOWN_JUDGES: dict[str, bool] = {
    WORD_ORDER.name: True, BURSTINESS.name: True, QUALITY_SCORE.name: True, TERMINAL_PUNCT_SCORE.name: True,
    PPL_KENLM.name: False, PPL_WAYRA.name: False,
    EduFilter.score_field.name: True, HfJudge.score_field.name: True,   # off by default; judges once run
}


def doc_tokens(text: str | None) -> int:
    """A document's weight: its whitespace-separated tokens (at least 1)."""
    return max(1, len((text or "").split()))


def id_hash(doc_id: str) -> int:
    """A stable pseudo-random rank of a document id (sampling and report examples)."""
    return int.from_bytes(hashlib.blake2b(str(doc_id).encode(), digest_size=8).digest(), "big")


# ---- the tables: token-weighted quantiles per judge and language ----------------------------------

def weighted_quantiles(scores: list[float], weights: list[int]) -> list[float]:
    """The scores at token-weighted percentiles 0..100: entry k is the lowest score such that at
    least k % of the tokens are in documents scoring at most it."""
    order = np.lexsort((np.asarray(weights), np.asarray(scores)))
    s = np.asarray(scores, dtype=np.float64)[order]
    cum = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    targets = np.arange(GRID + 1) / GRID * cum[-1]
    idx = np.minimum(np.searchsorted(cum, targets, side="left"), len(s) - 1)
    return [round(float(x), 6) for x in s[idx]]


def percentile_of(score: float, quantiles: list[float]) -> float:
    """The token-weighted percentile (0-100) of `score` in a judge's table for one language:
    linear between the quantiles, the middle of a run of equal quantiles; monotone in `score`."""
    lo, hi = bisect_left(quantiles, score), bisect_right(quantiles, score)
    if lo < hi:                       # score equals one or more quantiles
        return (lo + hi - 1) / 2 * 100 / GRID
    if lo == 0:
        return 0.0
    if lo > GRID:
        return 100.0
    a, b = quantiles[lo - 1], quantiles[lo]
    return (lo - 1 + (score - a) / (b - a)) * 100 / GRID


class TierTables:
    """The fitted tables ({judge: {higher_is_better, languages: {lang: {docs, tokens, quantiles}}}})
    and their provenance, as stored in the JSON file."""

    def __init__(self, data: dict, source: str = "<memory>"):
        if data.get("format") != TABLES_FORMAT:
            raise ValueError(f"{source}: not a quality-tier table file (format {data.get('format')!r}, "
                             f"expected {TABLES_FORMAT!r})")
        for judge, spec in data.get("judges", {}).items():
            for lang, t in spec.get("languages", {}).items():
                q = t.get("quantiles", [])
                if len(q) != GRID + 1 or any(b < a for a, b in zip(q, q[1:])):
                    raise ValueError(f"{source}: judges.{judge}.languages.{lang}.quantiles must be "
                                     f"{GRID + 1} non-decreasing numbers")
        self.data = data
        self.source = source

    @classmethod
    def load(cls, path: str | Path) -> "TierTables":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"tiers: cannot read the tables {path}: {e}") from None
        return cls(data, str(path))

    def save(self, path: str | Path) -> None:
        text = json.dumps(self.data, ensure_ascii=False, sort_keys=True, indent=1) + "\n"
        write_bytes_atomic(Path(path), text.encode("utf-8"))

    @property
    def judges(self) -> dict[str, dict]:
        return self.data["judges"]

    def percentile(self, judge: str, lang: str, score: float) -> float | None:
        """The judge's percentile of `score` among `lang`'s documents; None where it has no table."""
        spec = self.judges.get(judge)
        table = spec and spec["languages"].get(lang)
        if not table:
            return None
        return percentile_of(score if spec["higher_is_better"] else -score, table["quantiles"])


@lru_cache(maxsize=4)
def load_tables(path: str) -> TierTables:
    return TierTables.load(path)


# ---- fitting: a bounded sample per language, read batch by batch -------------------------------

class TierSample:
    """Per language, the `max_docs` documents with the smallest id hash (a sample that does not
    depend on file order or batch size), each with its tokens and its judges' scores."""

    def __init__(self, judges: dict[str, bool], max_docs: int):
        self.judges, self.max_docs = judges, max_docs
        self.heaps: dict[str, list] = {}       # lang -> max-heap by hash: (-hash, id, tokens, scores)
        self.seen: dict[str, int] = {}

    def add(self, batch: pa.Table) -> None:
        cols = {j: batch.column(j).to_pylist() for j in self.judges if j in batch.column_names}
        ids, texts = batch.column("id").to_pylist(), batch.column("text").to_pylist()
        for i, (lang, doc_id, text) in enumerate(zip(langs_of(batch), ids, texts)):
            scores = {j: float(v[i]) for j, v in cols.items() if v[i] is not None and math.isfinite(v[i])}
            if not scores:
                continue
            self.seen[lang] = self.seen.get(lang, 0) + 1
            heap = self.heaps.setdefault(lang, [])
            item = (-id_hash(doc_id), str(doc_id), doc_tokens(text), scores)
            if len(heap) < self.max_docs:
                heapq.heappush(heap, item)
            elif item[:2] > heap[0][:2]:
                heapq.heapreplace(heap, item)

    def tables(self, min_docs: int, provenance: dict) -> TierTables:
        judges: dict[str, dict] = {}
        for lang in sorted(self.heaps):
            docs = self.heaps[lang]
            for judge, higher in sorted(self.judges.items()):
                pairs = [(d[3][judge] if higher else -d[3][judge], d[2]) for d in docs if judge in d[3]]
                if len(pairs) < min_docs:
                    continue
                spec = judges.setdefault(judge, {"higher_is_better": higher, "languages": {}})
                spec["languages"][lang] = {"docs": len(pairs), "tokens": sum(w for _, w in pairs),
                                           "quantiles": weighted_quantiles([s for s, _ in pairs], [w for _, w in pairs])}
        sample = {lang: {"seen": self.seen[lang], "sampled": len(h)} for lang, h in sorted(self.heaps.items())}
        return TierTables({"format": TABLES_FORMAT, "judges": judges,
                           "provenance": {**provenance, "sample": sample, "max_docs_per_language": self.max_docs,
                                          "min_docs": min_docs, "weight": "whitespace tokens per document"}})


def fit_tables(batches: Iterable[pa.Table], judges: dict[str, bool], max_docs: int = 20000,
               min_docs: int = 50, provenance: dict | None = None) -> TierTables:
    """Tables fitted on documents carrying `judges`' columns ({column: higher_is_better}); a
    language gets a judge's table only with at least `min_docs` scored documents."""
    sample = TierSample(judges, max_docs)
    for batch in batches:
        sample.add(batch)
    if not sample.heaps:
        raise ValueError(f"no document carries a score of any judge ({', '.join(judges)}): "
                         "fit on a curated run whose judges ran")
    return sample.tables(min_docs, provenance or {})


# ---- the stage ---------------------------------------------------------------------------------

class TiersConfig(StageConfig):
    enabled: bool = Field(False, description="on (annotating) in configs/curate/default.yaml")
    tables: str | None = Field(None, description="fitted tables (`quipu tiers fit`); null: the shipped "
                                                 "tasks/tier_tables/default.json")
    judges: list[str] | None = Field(None, description="judge columns to combine; null: every judge of the tables")
    combine: Literal["max", "mean", "min"] = Field("max", description="how judges' percentiles combine (Nemotron-CC: max)")
    tiers: int = Field(5, ge=2, le=100, description="equal percentile bands: tier 0 lowest, tiers-1 highest")
    min_tier: PerLanguage(int, ge=0) = Field(None, description="remove documents below this tier, e.g. "
                                                               "{default: off, es: 1}; off: annotate only")
    unscored: Literal["keep", "remove"] = Field("keep", description="documents no judge applies to (no tables for "
                                                                    "their language, too short to judge)")

    @field_validator("judges")
    @classmethod
    def _some(cls, v):
        if v is not None and not v:
            raise ValueError("give at least one judge column, or null for every judge of the tables")
        return v


COMBINE = {"max": max, "min": min, "mean": lambda ps: sum(ps) / len(ps)}


class QualityTiers(Stage):
    name = "tiers"
    Config = TiersConfig
    columns = (QUALITY_PERCENTILE, QUALITY_TIER)

    @property
    def tables_path(self) -> str:
        return str(Path(self.config.tables) if self.config.tables else DEFAULT_TABLES)

    @property
    def tables(self) -> TierTables:
        return load_tables(self.tables_path)

    def check(self) -> None:
        if not Path(self.tables_path).is_file():
            raise FileNotFoundError(f"tiers.tables: no file {self.tables_path} (fit one with `quipu tiers fit`)")
        tables = self.tables
        unknown = [j for j in self.config.judges or [] if j not in tables.judges]
        if unknown:
            raise ValueError(f"tiers.judges: {', '.join(unknown)} not in {self.tables_path} "
                             f"(its judges: {', '.join(sorted(tables.judges))})")
        top = max((m for m in _tier_values(self.config.min_tier)), default=None)
        if top is not None and top >= self.config.tiers:
            raise ValueError(f"tiers.min_tier: {top} removes every document (tiers are 0..{self.config.tiers - 1})")

    def judges(self) -> list[str]:
        return self.config.judges or sorted(self.tables.judges)

    def assign(self, lang: str, scores: dict[str, Any]) -> tuple[float | None, int | None]:
        """(combined percentile, tier) of a document of `lang` with its judges' `scores`."""
        ps = [p for j, s in scores.items() if s is not None and math.isfinite(s)
              for p in [self.tables.percentile(j, lang, s)] if p is not None]
        if not ps:
            return None, None
        p = COMBINE[self.config.combine](ps)
        return round(p, 4), min(self.config.tiers - 1, int(p * self.config.tiers / 100))

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        judges = [j for j in self.judges() if j in batch.column_names]
        cols = {j: batch.column(j).to_pylist() for j in judges}
        ids, texts, langs = batch.column("id").to_pylist(), batch.column("text").to_pylist(), langs_of(batch)
        pcts, tiers, reasons = [], [], []
        for i, lang in enumerate(langs):
            p, tier = self.assign(lang, {j: cols[j][i] for j in judges})
            pcts.append(p)
            tiers.append(tier)
            reasons.append(self.decide(lang, tier))
        batch = set_column(set_column(batch, QUALITY_PERCENTILE, pa.array(pcts, pa.float64())),
                           QUALITY_TIER, pa.array(tiers, pa.int64()))
        keep = [r is None for r in reasons]
        kept, removed = split_by_mask(batch, keep, reasons)
        stats = tier_stats(ids, texts, langs, tiers, pcts, keep)
        # a judge of the tables whose stage did not run (its column absent): the tiers rest on the others
        stats["judge_column_missing_docs"] = {j: batch.num_rows for j in self.judges() if j not in cols}
        return Outcome(kept, removed, stats)

    def decide(self, lang: str, tier: int | None) -> str | None:
        if tier is None:
            return "tiers:unscored" if self.config.unscored == "remove" else None
        floor = resolve(self.config.min_tier, lang)
        return f"tiers:quality_tier<{floor}" if floor is not None and tier < floor else None

    def fingerprint(self, shard_plan=None) -> dict:
        return {"tables": sha256_file(Path(self.tables_path))}

    def finalize(self, stats: dict, scans, plan, committed) -> dict:
        """Each (language, tier)'s example: the candidate with the smallest id hash over all batches."""
        best: dict[tuple[str, str], dict] = {}
        for ex in stats.pop("tier_candidates", []):
            key = (ex["lang"], ex["tier"])
            if key not in best or (ex["rank"], ex["id"]) < (best[key]["rank"], best[key]["id"]):
                best[key] = ex
        for (lang, tier), ex in best.items():
            stats["tiers"][lang][tier]["example"] = {k: ex[k] for k in ("id", "percentile", "snippet")}
        order = lambda key: (key == UNSCORED, int(key) if key != UNSCORED else 0)
        stats["tiers"] = {lang: {k: tiers[k] for k in sorted(tiers, key=order)}
                          for lang, tiers in sorted(stats.get("tiers", {}).items())}
        t = self.tables
        return {"tables": self.tables_path, "judges": self.judges(), "combine": self.config.combine,
                "n_tiers": self.config.tiers, "tables_provenance": t.data.get("provenance", {}), **stats}


def _tier_values(value) -> list[int]:
    if isinstance(value, dict):
        return [v for v in value.values() if v is not None]
    return [] if value is None else [value]


def tier_stats(ids, texts, langs, tiers, pcts, keep) -> dict:
    """Per language and tier (`unscored` for none): docs, tokens, kept docs and tokens; plus each
    (language, tier)'s example candidate of this batch (the smallest id hash)."""
    out: dict[str, dict[str, dict[str, int]]] = {}
    cand: dict[tuple[str, str], dict] = {}
    for doc_id, text, lang, tier, p, k in zip(ids, texts, langs, tiers, pcts, keep):
        key = UNSCORED if tier is None else str(tier)
        n = doc_tokens(text)
        slot = out.setdefault(lang, {}).setdefault(key, {"docs": 0, "tokens": 0, "kept_docs": 0, "kept_tokens": 0})
        slot["docs"] += 1
        slot["tokens"] += n
        slot["kept_docs"] += int(k)
        slot["kept_tokens"] += n if k else 0
        rank = id_hash(doc_id)
        c = cand.get((lang, key))
        if c is None or (rank, str(doc_id)) < (c["rank"], c["id"]):
            cand[(lang, key)] = {"lang": lang, "tier": key, "rank": rank, "id": str(doc_id), "percentile": p,
                                 "snippet": text}
    for c in cand.values():
        c["snippet"] = snippet(c["snippet"])
    return {"tiers": out, "tier_candidates": list(cand.values())}

