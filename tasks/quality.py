"""Stage `quality`: a fastText quality classifier (DCLM style) scores every document.

Adds `quality_score`, the classifier's probability of the positive ("high quality") label, and
keeps either the documents scoring at least `threshold`, or the top `top_fraction` of each language
(DCLM keeps the top 10%). Removal reason `quality<0.xx` (the threshold, or the language's cutoff;
`quality=0.xx:tie` for a document scoring exactly the cutoff that lost the tie-break on its id).

The classifier comes from the `quality-train` flow (flows/quality_train.py), which registers it in
the catalog as kind `quality-fasttext`; `model` names it (catalog name or id) or gives a path, and
None means the newest one registered. Training and scoring share one text normalisation,
`normalize_text`, whose settings travel with the model in its sidecar `<model>.json`.

Keeping the top fraction per language is a global decision: `run_quality` scores every shard first,
computes each language's cutoff exactly (rank by score, ties broken by document id, so the kept
count is exactly ceil(fraction * n) and does not depend on shard boundaries), then splits.
"""
from __future__ import annotations

import math
import os
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task, unmapped
from pydantic import BaseModel, ConfigDict, Field, field_validator

from catalog.files import read_json, sha256_file
from tasks.schema import set_column
from tasks.stage import Outcome, Shard, Stage, StageConfig, process_shard, snippet, split_by_mask

MODEL_KIND = "quality-fasttext"
POSITIVE = "hq"
NEGATIVE = "lq"
QUALITY_SCORE = pa.field("quality_score", pa.float64())
HISTOGRAM_BINS = 20
EXTREMES = 5                  # highest- and lowest-scoring snippets in the report
UNKNOWN_LANG = "und"          # documents without a `lang` column (langid switched off)
FASTTEXT_MAGIC = 793712314    # first int32 of every fastText .bin/.ftz file


# ---- the one text normalisation ---------------------------------------------------------------

class Normalization(BaseModel):
    """How text is turned into one fastText input line; stored with the model, used by both sides."""
    model_config = ConfigDict(extra="forbid")
    lowercase: bool = Field(True, description="fold case (some sources are all lower case: case alone must not decide)")
    split_punctuation: bool = Field(True, description="put spaces around punctuation so 'end.' and 'end' are one word")
    max_chars: int = Field(10_000, gt=0, description="characters of each document the classifier sees")


_PUNCT = re.compile(r"([^\w\s])")


def normalize_text(text: str, norm: Normalization) -> str:
    """One line of whitespace-separated tokens: what fastText trains on and predicts from."""
    text = (text or "")[: norm.max_chars]
    if norm.lowercase:
        text = text.lower()
    if norm.split_punctuation:
        text = _PUNCT.sub(r" \1 ", text)
    return " ".join(text.split())   # also removes newlines: fastText reads one line per example


# ---- the classifier ---------------------------------------------------------------------------

class QualityModelError(ValueError):
    """A quality model that cannot be found or loaded; the message names the path or name."""


def model_sidecar(model_path: str | Path) -> Path:
    """`model.bin` -> `model.json`: the normalisation, labels and training config of the model."""
    return Path(model_path).with_suffix(".json")


class QualityModel:
    """A loaded fastText classifier plus the normalisation it was trained with; `score` is batched."""

    def __init__(self, path: str, positive_label: str | None = None):
        self.path = str(path)
        if not os.path.isfile(self.path):
            raise QualityModelError(f"quality model file not found: {self.path}")
        with open(self.path, "rb") as fh:
            head = fh.read(4)
        if len(head) < 4 or int.from_bytes(head, "little", signed=True) != FASTTEXT_MAGIC:
            raise QualityModelError(f"quality model {self.path} is not a fastText model file (corrupt or wrong file)")
        sidecar = model_sidecar(self.path)
        try:   # a model without a sidecar (trained elsewhere) gets the default normalisation
            meta = read_json(sidecar) if sidecar.is_file() else {}
            self.normalization = Normalization(**meta.get("normalization", {}))
        except Exception as e:
            raise QualityModelError(f"quality model sidecar {sidecar} is unreadable: {e}") from None
        self.positive = "__label__" + (positive_label or meta.get("positive_label") or POSITIVE)
        self.sha256 = sha256_file(self.path)
        import fasttext
        fasttext.FastText.eprint = lambda *a, **k: None   # the load_model deprecation warning
        try:
            self.model = fasttext.load_model(self.path)
        except Exception as e:   # truncated or corrupt beyond the header
            raise QualityModelError(f"cannot load quality model {self.path}: {e}") from None
        labels = list(self.model.labels)
        if self.positive not in labels:
            raise QualityModelError(f"quality model {self.path} has no label {self.positive} (labels: {', '.join(labels)})")
        self.n_labels = len(labels)

    def score(self, texts: list[str]) -> list[float]:
        """Probability of the positive label for each text, in one batched call.

        The binding's `multilinePredict`: fasttext 0.9.3's Python `predict` breaks under numpy 2.
        Each line ends in "\n" as in training (and as fastText's own `predict` does): the newline is
        the end-of-sentence token `</s>` the model was trained with; without it scores differ.
        """
        if not texts:
            return []
        return self.score_lines([normalize_text(t, self.normalization) + "\n" for t in texts])

    def score_lines(self, lines: list[str]) -> list[float]:
        """Scores of already normalised lines, each ending in "\n"."""
        labels, probs = self.model.f.multilinePredict(lines, self.n_labels, 0.0, "strict")
        pos = self.positive
        out = []
        for ls, ps in zip(labels, probs):
            p = 0.0
            for label, prob in zip(ls, ps):
                if label == pos:
                    p = float(prob)
                    break
            out.append(min(1.0, max(0.0, p)))  # fastText adds 1e-5 before exp: clip to a probability
        return out


_load_lock = threading.Lock()


@lru_cache(maxsize=4)
def _load_cached(path: str, mtime_ns: int, size: int, positive_label: str | None) -> QualityModel:
    return QualityModel(path, positive_label)


def load_quality_model(path: str, positive_label: str | None = None) -> QualityModel:
    """Load once per process (threads share it); a changed file on disk is loaded again."""
    try:
        st = os.stat(path)
    except OSError:
        raise QualityModelError(f"quality model file not found: {path}") from None
    with _load_lock:
        return _load_cached(str(path), st.st_mtime_ns, st.st_size, positive_label)


def resolve_model(ref: str | None) -> str:
    """A model path from a path, a catalog name or id, or None (the newest `quality-fasttext`)."""
    if ref and (os.path.exists(ref) or ref.endswith((".bin", ".ftz")) or os.sep in ref):
        return os.path.abspath(ref)
    from catalog import registry
    row = registry.get_model(ref, MODEL_KIND)
    if row is None:
        if ref is None:
            raise QualityModelError("quality.model: no quality-fasttext model is registered in the catalog; "
                                    "train one with `quipu quality train CONFIG` or set quality.model to a path")
        raise QualityModelError(f"quality.model: {ref!r} is neither a file nor a quality-fasttext model in the catalog")
    return row["path"]


# ---- the stage --------------------------------------------------------------------------------

class QualityConfig(StageConfig):
    """Off by default: the stage needs a trained classifier (`quipu quality train`)."""
    enabled: bool = False
    model: str | None = Field(None, description="catalog model name or id, or a path to a fastText .bin; "
                                                "None: the newest registered quality-fasttext model")
    positive_label: str | None = Field(None, description="label whose probability is the score; default: the "
                                                         "model's sidecar, else 'hq'")
    keep: Literal["threshold", "top_fraction"] = Field("threshold", description="keep policy")
    threshold: float = Field(0.5, ge=0, le=1, description="keep: threshold: keep quality_score >= threshold")
    top_fraction: float = Field(0.1, gt=0, le=1, description="keep: top_fraction: keep this fraction of each language")
    top_fraction_per_language: dict[str, float] = Field(default_factory=dict,
                                                        description="per-language top fractions, e.g. {es: 0.2}")
    batch_rows: int = Field(2000, gt=0, description="documents per fastText batch")

    @field_validator("top_fraction_per_language")
    @classmethod
    def _fractions(cls, v: dict[str, float]) -> dict[str, float]:
        for lang, f in v.items():
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


def _langs(batch: pa.Table) -> list[str]:
    if "lang" not in batch.column_names:
        return [UNKNOWN_LANG] * batch.num_rows
    return [lang or UNKNOWN_LANG for lang in batch.column("lang").to_pylist()]


def _bin(score: float) -> str:
    i = min(HISTOGRAM_BINS - 1, int(score * HISTOGRAM_BINS))
    return f"{i / HISTOGRAM_BINS:.2f}"


class QualityFilter(Stage):
    """Scores a batch and keeps by threshold, or by per-language cutoffs computed beforehand."""
    name = "quality"

    def __init__(self, config: QualityConfig, model: QualityModel, cutoffs: dict[str, Cutoff] | None = None):
        super().__init__(config)
        self.model = model
        self.cutoffs = cutoffs
        if config.keep == "top_fraction" and cutoffs is None:
            raise ValueError("quality: keep=top_fraction needs per-language cutoffs (use run_quality)")

    def code_version(self) -> str:
        """A different model file or different cutoffs must not reuse finished shards."""
        cut = sorted((k, v.score, v.id, v.keep_all, v.keep_none) for k, v in (self.cutoffs or {}).items())
        from catalog.files import sha256_json
        return f"{super().code_version()}+model:{self.model.sha256[:16]}+cut:{sha256_json(cut)[:12]}"

    def decide(self, score: float, doc_id: str, lang: str) -> str | None:
        cfg: QualityConfig = self.config
        if cfg.keep == "threshold":
            return None if score >= cfg.threshold else f"quality<{cfg.threshold:.2f}"
        cut = self.cutoffs.get(lang)
        if cut is None:   # a language the scoring pass did not see cannot happen; be explicit anyway
            raise AssertionError(f"quality: no cutoff for language {lang!r}")
        if cut.keeps(score, doc_id):
            return None
        if cut.keep_none:
            return "quality:top_fraction=0"
        # scores saturate (long documents often score 1.0): ties at the cutoff are ranked by id
        return f"quality<{cut.score:.2f}" if score < cut.score else f"quality={cut.score:.2f}:tie"

    def process(self, batch: pa.Table) -> Outcome:
        texts = batch.column("text").to_pylist()
        ids = batch.column("id").to_pylist()
        langs = _langs(batch)
        scores = self.model.score(texts)
        batch = set_column(batch, QUALITY_SCORE, scores)
        reasons = [self.decide(s, i, lang) for s, i, lang in zip(scores, ids, langs)]
        keep = [r is None for r in reasons]
        kept, removed = split_by_mask(batch, keep, reasons)
        return Outcome(kept, removed, score_stats(ids, texts, langs, scores, keep))


def score_stats(ids, texts, langs, scores, keep) -> dict:
    """Per-language histogram and counts (summed across shards) plus extreme-score candidates."""
    hist: dict[str, dict[str, int]] = {}
    docs: dict[str, int] = {}
    kept: dict[str, int] = {}
    total: dict[str, float] = {}
    for lang, s, k in zip(langs, scores, keep):
        h = hist.setdefault(lang, {})
        b = _bin(s)
        h[b] = h.get(b, 0) + 1
        docs[lang] = docs.get(lang, 0) + 1
        kept[lang] = kept.get(lang, 0) + int(k)
        total[lang] = total.get(lang, 0.0) + s
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], ids[i]))
    ex = lambda i: {"score": round(scores[i], 4), "id": ids[i], "lang": langs[i], "snippet": snippet(texts[i])}
    return {"docs_by_lang": docs, "kept_by_lang": kept,
            "removed_by_lang": {lang: docs[lang] - kept.get(lang, 0) for lang in docs},
            "score_sum_by_lang": total, "histogram_by_lang": hist,
            "highest": [ex(i) for i in order[:EXTREMES]],
            "lowest": [ex(i) for i in reversed(order[-EXTREMES:])]}


def summarize(results: list[dict], extra: dict | None = None) -> None:
    """Make the stats of a shard list whole: the flow sums shard stats, so the global parts
    (the five highest/lowest of the whole stage, mean score per language, `extra`) ride on the
    first shard, first (the UI shows the start of the stats), and are cleared from the rest."""
    if not results:
        return
    highest = [e for r in results for e in r["stats"].get("highest", [])]
    lowest = [e for r in results for e in r["stats"].get("lowest", [])]
    docs: dict[str, int] = {}
    total: dict[str, float] = {}
    for r in results:
        for lang, n in r["stats"].get("docs_by_lang", {}).items():
            docs[lang] = docs.get(lang, 0) + n
        for lang, s in r["stats"].get("score_sum_by_lang", {}).items():
            total[lang] = total.get(lang, 0.0) + s
    derived = ("highest", "lowest", "mean_by_lang", "score_sum_by_lang", *(extra or {}))
    for r in results:
        r["stats"] = {k: v for k, v in r["stats"].items() if k not in derived}
    results[0]["stats"] = {
        **(extra or {}),
        "mean_by_lang": {lang: round(total[lang] / n, 4) for lang, n in sorted(docs.items()) if n},
        "highest": sorted(highest, key=lambda e: (-e["score"], e["id"]))[:EXTREMES],
        "lowest": sorted(lowest, key=lambda e: (e["score"], e["id"]))[:EXTREMES],
        **results[0]["stats"]}


# ---- top fraction per language: score everything, then cut ------------------------------------

def score_shard(model: QualityModel, shard: Shard, batch_rows: int) -> dict[str, list[tuple[float, str]]]:
    """(score, id) of every document of a shard, by language. Reads only id, text and lang."""
    pf = pq.ParquetFile(shard.path)
    cols = [c for c in ("id", "text", "lang") if c in pf.schema_arrow.names]
    out: dict[str, list[tuple[float, str]]] = {}
    for rb in pf.iter_batches(batch_size=batch_rows, columns=cols):
        t = pa.Table.from_batches([rb])
        ids = t.column("id").to_pylist()
        for lang, s, i in zip(_langs(t), model.score(t.column("text").to_pylist()), ids):
            out.setdefault(lang, []).append((s, i))
    return out


def compute_cutoffs(scored: dict[str, list[tuple[float, str]]], cfg: QualityConfig) -> dict[str, Cutoff]:
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


@task(name="quality-score", task_run_name="quality-score-{shard.name}", retries=1, retry_delay_seconds=1)
def quality_score_task(shard: Shard, model_path: str, cfg: QualityConfig) -> dict:
    return score_shard(load_quality_model(model_path, cfg.positive_label), shard, cfg.batch_rows)


@task(name="quality", task_run_name="quality-{shard.name}", retries=1, retry_delay_seconds=1)
def quality_task(shard: Shard, run_dir: str, cfg: QualityConfig, model_path: str,
                 cutoffs: dict[str, Cutoff] | None = None) -> dict:
    model = load_quality_model(model_path, cfg.positive_label)
    return process_shard(QualityFilter(cfg, model, cutoffs), shard, run_dir, batch_rows=cfg.batch_rows)


def check_quality(cfg: QualityConfig) -> str:
    """Resolve and load the classifier; raises QualityModelError naming the path. Returns the path."""
    path = resolve_model(cfg.model)
    load_quality_model(path, cfg.positive_label)
    return path


def run_quality(shards: list[Shard], run_dir: str, cfg: QualityConfig) -> list[dict]:
    """The stage's runner: load the model (before any document is read), then threshold in one
    pass, or score all shards, cut per language and split in a second pass."""
    path = check_quality(cfg)
    cutoffs = None
    if cfg.keep == "top_fraction":
        scored: dict[str, list[tuple[float, str]]] = {}
        for part in [f.result() for f in quality_score_task.map(shards, model_path=unmapped(path), cfg=unmapped(cfg))]:
            for lang, pairs in part.items():
                scored.setdefault(lang, []).extend(pairs)
        cutoffs = compute_cutoffs(scored, cfg)
    futures = quality_task.map(shards, run_dir=unmapped(run_dir), cfg=unmapped(cfg), model_path=unmapped(path),
                               cutoffs=unmapped(cutoffs))
    results = [f.result() for f in futures]
    extra: dict = {"model": path, "keep": cfg.keep}
    if cutoffs is not None:
        extra["cutoffs"] = {lang: {"score": round(c.score, 6), "id": c.id, "keep_all": c.keep_all,
                                   "keep_none": c.keep_none} for lang, c in cutoffs.items()}
    summarize(results, extra)
    return results
