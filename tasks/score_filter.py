"""The shape of a model-based filter: score every document, keep by threshold or top fraction.

A subclass names its score column and its `score(batch)`, a score in [0, 1] per document (higher
is better), plus `check()` to load its model and `model_version()` for the shard fingerprint. The
rest is here: `keep: threshold` keeps `score >= threshold` in one pass; `keep: top_fraction` scans
every shard, computes each language's cut-off exactly (rank by score, ties broken by document id,
so the kept count is exactly ceil(fraction * n) and does not depend on shard boundaries), then
splits. Removal reasons `<name><0.xx` (the threshold or the language's cut-off) and
`<name>=0.xx:tie` (scoring exactly the cut-off, losing the tie-break on its id). The report has a
score histogram, counts and mean per language, and the highest- and lowest-scoring snippets.

A subclass whose scores are not probabilities (a regression head's 0-5) widens `histogram_width`;
one whose threshold differs per language overrides `threshold_for`; one that cannot score some
documents (no model for their language) gives None for them: they are kept unscored and counted
(`unscored_by_lang`), and the top fraction is taken among the scored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, field_validator

from quipu.catalog.files import sha256_json
from quipu.tasks.per_language import check_language_code
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, Shard, Stage, StageConfig, langs_of, snippet, split_by_mask

HISTOGRAM_BINS = 20
EXTREMES = 5                  # highest- and lowest-scoring snippets in the report


class ScoreFilterConfig(StageConfig):
    keep: Literal["threshold", "top_fraction"] = Field("threshold", description="keep policy")
    threshold: float = Field(0.5, ge=0, le=1, description="keep: threshold: keep score >= threshold")
    top_fraction: float = Field(0.1, gt=0, le=1, description="keep: top_fraction: keep this fraction of each language")
    top_fraction_per_language: dict[str, float] = Field(default_factory=dict,
                                                        description="per-language top fractions, e.g. {es: 0.2}")

    @field_validator("top_fraction_per_language")
    @classmethod
    def _fractions(cls, v: dict[str, float]) -> dict[str, float]:
        for lang, f in v.items():
            check_language_code(lang)
            if not 0 < f <= 1:
                raise ValueError(f"fraction for '{lang}' must be in (0, 1], got {f}")
        return v

    def fraction(self, lang: str) -> float:
        return self.top_fraction_per_language.get(lang, self.top_fraction)


@dataclass(frozen=True)
class Cutoff:
    """The lowest-ranked kept document of a language: keep (score, id) ranked at or above it."""
    score: float
    id: str
    keep_all: bool = False
    keep_none: bool = False

    def keeps(self, score: float, doc_id: str) -> bool:
        if self.keep_all:
            return True
        if self.keep_none:
            return False
        return score > self.score or (score == self.score and doc_id <= self.id)


def top_fraction_cutoffs(scored: dict[str, list[tuple[float, str]]], cfg: ScoreFilterConfig) -> dict[str, Cutoff]:
    """Per language, the rank-k document (score descending, id ascending), k = ceil(fraction * n)."""
    cutoffs = {}
    for lang in sorted(scored):
        ranked = sorted(scored[lang], key=lambda x: (-x[0], x[1]))
        k = math.ceil(cfg.fraction(lang) * len(ranked) - 1e-9)
        if k >= len(ranked):
            cutoffs[lang] = Cutoff(score=0.0, id="", keep_all=True)
        elif k <= 0:
            cutoffs[lang] = Cutoff(score=1.0, id="", keep_none=True)
        else:
            s, i = ranked[k - 1]
            cutoffs[lang] = Cutoff(score=s, id=i)
    return cutoffs


class ScoreFilter(Stage):
    score_field: ClassVar[pa.Field]
    histogram_width: ClassVar[float] = 1 / HISTOGRAM_BINS

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "score_field" in cls.__dict__:   # the score column is the filter's column
            cls.columns = (cls.score_field,)

    def score(self, batch: pa.Table) -> list[float | None]:  # pragma: no cover - interface
        raise NotImplementedError

    def threshold_for(self, lang: str) -> float:
        """The `keep: threshold` bound of a language (one for all here)."""
        return self.config.threshold

    def model_version(self) -> str:
        """What the scores depend on besides code and config (e.g. the model file's hash)."""
        return ""

    def describe(self) -> dict:
        """Stage-wide facts for the report (e.g. which model)."""
        return {}

    # ---- the contract ----

    def needs_scan(self) -> bool:
        return self.config.keep == "top_fraction"

    def scan(self, shard: Shard) -> dict[str, list[tuple[float, str]]]:
        """(score, id) of every document of a shard, by language. Reads only id, text and lang."""
        pf = pq.ParquetFile(shard.path)
        cols = [c for c in ("id", "text", "lang") if c in pf.schema_arrow.names]
        out: dict[str, list[tuple[float, str]]] = {}
        for rb in pf.iter_batches(batch_size=self.config.batch_rows, columns=cols):
            t = pa.Table.from_batches([rb])
            for lang, s, i in zip(langs_of(t), self.score(t), t.column("id").to_pylist()):
                if s is not None:    # unscored documents are kept: not ranked
                    out.setdefault(lang, []).append((s, i))
        return out

    def plan(self, scans: list | None) -> dict[str, Cutoff] | None:
        if scans is None:
            return None
        scored: dict[str, list[tuple[float, str]]] = {}
        for part in scans:
            for lang, pairs in part.items():
                scored.setdefault(lang, []).extend(pairs)
        return top_fraction_cutoffs(scored, self.config)

    def fingerprint(self, cutoffs: dict[str, Cutoff] | None) -> dict:
        cut = sorted((k, v.score, v.id, v.keep_all, v.keep_none) for k, v in (cutoffs or {}).items())
        return {"model": self.model_version(), "cutoffs": sha256_json(cut)[:12]}

    def decide(self, score: float | None, doc_id: str, lang: str, cutoffs: dict[str, Cutoff] | None) -> str | None:
        cfg = self.config
        if score is None:
            return None
        if cfg.keep == "threshold":
            bound = self.threshold_for(lang)
            return None if score >= bound else f"{self.name}<{bound:.2f}"
        cut = cutoffs.get(lang)
        if cut is None:   # a language the scan did not see cannot happen; be explicit anyway
            raise AssertionError(f"{self.name}: no cutoff for language {lang!r}")
        if cut.keeps(score, doc_id):
            return None
        if cut.keep_none:
            return f"{self.name}:top_fraction=0"
        # scores saturate (long documents often score 1.0): ties at the cutoff are ranked by id
        return f"{self.name}<{cut.score:.2f}" if score < cut.score else f"{self.name}={cut.score:.2f}:tie"

    def process(self, batch: pa.Table, cutoffs: dict[str, Cutoff] | None = None) -> Outcome:
        ids = batch.column("id").to_pylist()
        langs = langs_of(batch)
        scores = self.score(batch)
        scored = set_column(batch, self.score_field, scores)
        reasons = [self.decide(s, i, lang, cutoffs) for s, i, lang in zip(scores, ids, langs)]
        keep = [r is None for r in reasons]
        kept, removed = split_by_mask(scored, keep, reasons)
        return Outcome(kept, removed, score_stats(ids, batch.column("text").to_pylist(), langs, scores, keep,
                                                  self.histogram_width))

    def finalize(self, stats: dict, scans, cutoffs: dict[str, Cutoff] | None, committed) -> dict:
        """Whole-stage figures from the summed shard stats: mean score and the extremes."""
        docs, total = stats.get("docs_by_lang", {}), stats.get("score_sum_by_lang", {})
        head = {**self.describe(), "keep": self.config.keep}
        if cutoffs is not None:
            head["cutoffs"] = {lang: {"score": round(c.score, 6), "id": c.id, "keep_all": c.keep_all,
                                      "keep_none": c.keep_none} for lang, c in cutoffs.items()}
        head["mean_by_lang"] = {lang: round(total[lang] / n, 4) for lang, n in sorted(docs.items()) if n}
        head["highest"] = sorted(stats.get("highest", []), key=lambda e: (-e["score"], e["id"]))[:EXTREMES]
        head["lowest"] = sorted(stats.get("lowest", []), key=lambda e: (e["score"], e["id"]))[:EXTREMES]
        rest = {k: v for k, v in stats.items() if k not in ("highest", "lowest", "score_sum_by_lang")}
        return {**head, **rest}


def _bin(score: float, width: float = 1 / HISTOGRAM_BINS) -> str:
    """The lower edge of a score's histogram bin: [0, 1] in HISTOGRAM_BINS bins, or bins of `width`."""
    if width == 1 / HISTOGRAM_BINS:
        i = min(HISTOGRAM_BINS - 1, max(0, int(score * HISTOGRAM_BINS)))
        return f"{i / HISTOGRAM_BINS:.2f}"
    return f"{math.floor(score / width) * width:.2f}"


def score_stats(ids, texts, langs, scores, keep, width: float = 1 / HISTOGRAM_BINS) -> dict:
    """Per-language histogram and counts (summed across shards) plus extreme-score candidates;
    documents without a score (None) are counted apart and kept."""
    hist: dict[str, dict[str, int]] = {}
    docs: dict[str, int] = {}
    kept: dict[str, int] = {}
    total: dict[str, float] = {}
    unscored: dict[str, int] = {}
    for i in [i for i, s in enumerate(scores) if s is None]:
        unscored[langs[i]] = unscored.get(langs[i], 0) + 1
    if unscored:
        keep_all = list(keep)
        idx = [i for i, s in enumerate(scores) if s is not None]
        ids, texts, langs, scores, keep = ([x[i] for i in idx] for x in (ids, texts, langs, scores, keep_all))
    for lang, s, k in zip(langs, scores, keep):
        h = hist.setdefault(lang, {})
        b = _bin(s, width)
        h[b] = h.get(b, 0) + 1
        docs[lang] = docs.get(lang, 0) + 1
        kept[lang] = kept.get(lang, 0) + int(k)
        total[lang] = total.get(lang, 0.0) + s
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], ids[i]))
    ex = lambda i: {"score": round(scores[i], 4), "id": ids[i], "lang": langs[i], "snippet": snippet(texts[i])}
    out = {"unscored_by_lang": unscored} if unscored else {}
    return {**out, "docs_by_lang": docs, "kept_by_lang": kept,
            "removed_by_lang": {lang: docs[lang] - kept.get(lang, 0) for lang in docs},
            "score_sum_by_lang": total, "histogram_by_lang": hist,
            "highest": [ex(i) for i in order[:EXTREMES]],
            "lowest": [ex(i) for i in reversed(order[-EXTREMES:])]}
