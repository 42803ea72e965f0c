"""Stage `perplexity`: a distilled student (Wayra style) and optionally KenLM (CCNet style) score
every document.

Adds `ppl_wayra` (the student's estimate of the teacher LLM's perplexity on the document's start) and,
when a KenLM model is configured, `ppl_kenlm` (CCNet's n-gram perplexity; null for a language without
a model). Optionally `ppl_bucket`: `head` / `middle` / `tail` by per-language percentiles of one of the
two scores (CCNet's 30th and 60th by default; the thresholds go in the report), and optionally the tail
bucket is removed with reason `ppl_tail`. By default nothing is removed.

Percentiles are a global decision: `run_perplexity` first scores every shard (scores written next to
the stage's outputs, so the second pass does not recompute them), computes the cutoffs, then splits.
The student comes from `quipu ppl distill` (catalog kind `wayra`), the KenLM models from
`quipu kenlm train` (kind `kenlm`); a missing or corrupt model fails in `check_perplexity`, before
any document is read.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from prefect import task, unmapped
from pydantic import Field, field_validator, model_validator

from catalog.files import read_json, sha256_json
from tasks.schema import set_column
from tasks.stage import Outcome, Shard, Stage, StageConfig, process_shard, split_by_mask, stage_dirs, write_table

STUDENT_KIND = "wayra"
KENLM_KIND = "kenlm"
PPL_WAYRA = pa.field("ppl_wayra", pa.float64())
PPL_KENLM = pa.field("ppl_kenlm", pa.float64())
PPL_BUCKET = pa.field("ppl_bucket", pa.string())
UNKNOWN_LANG = "und"
TAIL_REASON = "ppl_tail"


class PerplexityModelError(ValueError):
    """A student or KenLM model that cannot be found or loaded; the message names it."""


class PerplexityConfig(StageConfig):
    enabled: bool = Field(False, description="off by default: it needs a student from `quipu ppl distill`")
    student: str | None = Field(None, description="student directory, or catalog name/id of a `wayra` model; None: the newest registered")
    kenlm: str | dict[str, str] | None = Field(
        None, description="KenLM binaries: a directory of <lang>.binary, one binary for all languages, "
                          "a catalog name of a `kenlm` model, or {lang: path}")
    buckets: bool = Field(False, description="add ppl_bucket (head/middle/tail) by per-language percentiles")
    bucket_by: Literal["wayra", "kenlm"] = Field("wayra", description="which score the buckets use")
    head_percentile: float = Field(30.0, gt=0, lt=100, description="head: score <= this percentile of its language")
    tail_percentile: float = Field(60.0, gt=0, lt=100, description="tail: score > this percentile of its language")
    remove_tail: bool = Field(False, description=f"remove the tail bucket (reason `{TAIL_REASON}`)")
    quantize: bool = Field(False, description="int8 dynamic quantisation of the student's linear layers")
    batch_size: int = Field(16, ge=1, le=4096, description="documents per student forward pass (sorted by length; "
                                                             "larger batches were slower on CPU here)")
    batch_rows: int = Field(2000, ge=1, description="rows read per parquet batch")
    threads: int | None = Field(None, ge=1, le=256, description="torch threads (default: torch's choice)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.head_percentile >= self.tail_percentile:
            raise ValueError(f"head_percentile ({self.head_percentile}) must be below tail_percentile ({self.tail_percentile})")
        if self.remove_tail and not self.buckets:
            raise ValueError("remove_tail needs buckets: true")
        if self.buckets and self.bucket_by == "kenlm" and not self.kenlm:
            raise ValueError("bucket_by: kenlm needs a kenlm model")
        return self

    @field_validator("kenlm")
    @classmethod
    def _kenlm_langs(cls, v):
        if isinstance(v, dict):
            for lang in v:
                if not lang.isalpha() and lang != "*":
                    raise ValueError(f"'{lang}' is not a language code like 'en' (or '*')")
        return v


# ---- resolving and loading models -------------------------------------------------------------

def resolve_student(spec: str | None) -> str:
    """A student directory from a path, a catalog name/id, or the newest `wayra` model."""
    if spec and Path(spec).expanduser().exists():
        return str(Path(spec).expanduser().resolve())
    from catalog import registry
    row = registry.get_model(spec, STUDENT_KIND)
    if row is None:
        if spec:
            raise PerplexityModelError(f"perplexity.student: {spec} is neither a directory nor a `{STUDENT_KIND}` model in the catalog")
        raise PerplexityModelError("perplexity.student: no student model registered; train one with "
                                   "`quipu ppl distill` or set perplexity.student to its directory")
    return row["path"]


def resolve_kenlm(spec: str | dict[str, str] | None) -> dict[str, str]:
    """{lang or '*': binary path}. A directory gives every `<lang>.binary` in it."""
    if not spec:
        return {}
    if isinstance(spec, dict):
        return {lang: str(Path(p).expanduser()) for lang, p in spec.items()}
    p = Path(spec).expanduser()
    if not p.exists():
        from catalog import registry
        row = registry.get_model(spec, KENLM_KIND)
        if row is None:
            raise PerplexityModelError(f"perplexity.kenlm: {spec} is neither a file/directory nor a `{KENLM_KIND}` model in the catalog")
        p = Path(row["path"])
    if p.is_dir():
        found = {f.stem: str(f) for f in sorted(p.glob("*.binary"))}
        if not found:
            raise PerplexityModelError(f"perplexity.kenlm: directory {p} holds no <lang>.binary")
        return found
    return {"*": str(p)}


@lru_cache(maxsize=4)
def load_student(path: str, quantize: bool, threads: int | None):
    from trainer.wayra import StudentError, WayraStudent
    try:
        return WayraStudent.load(path, quantize=quantize, threads=threads)
    except StudentError as e:
        raise PerplexityModelError(str(e)) from None


@lru_cache(maxsize=16)
def load_kenlm(path: str):
    from tasks.kenlm_lm import KenLMError, KenLMScorer
    try:
        return KenLMScorer(path)
    except KenLMError as e:
        raise PerplexityModelError(str(e)) from None


def check_perplexity(cfg: PerplexityConfig) -> dict:
    """Resolve and load every model the stage needs; raises PerplexityModelError naming the path."""
    student = resolve_student(cfg.student)
    load_student(student, cfg.quantize, cfg.threads)
    kenlm = resolve_kenlm(cfg.kenlm)
    for path in kenlm.values():
        load_kenlm(path)
    return {"student": student, "kenlm": kenlm}


# ---- scoring ----------------------------------------------------------------------------------

def _langs(t: pa.Table) -> list[str]:
    if "lang" not in t.column_names:
        return [UNKNOWN_LANG] * t.num_rows
    return [x or UNKNOWN_LANG for x in t.column("lang").to_pylist()]


class Scorer:
    """ppl_wayra (and ppl_kenlm) for a batch of documents."""

    def __init__(self, cfg: PerplexityConfig, models: dict):
        self.cfg = cfg
        self.models = models
        self.student = load_student(models["student"], cfg.quantize, cfg.threads)
        self.kenlm = {lang: load_kenlm(p) for lang, p in models["kenlm"].items()}

    def score(self, t: pa.Table) -> dict[str, list]:
        texts = t.column("text").to_pylist()
        out = {"ppl_wayra": [math.exp(v) for v in self.student.predict_log_ppl(texts, self.cfg.batch_size)]}
        if self.kenlm:
            vals = []
            for text, lang in zip(texts, _langs(t)):
                lm = self.kenlm.get(lang) or self.kenlm.get("*")
                v = lm.perplexity([text])[0] if lm is not None else math.nan
                vals.append(None if math.isnan(v) else v)
            out["ppl_kenlm"] = vals
        return out

    def fingerprint(self) -> str:
        """What the scores depend on besides the config: the model weights."""
        from catalog.files import sha256_file
        files = {"student": self.student.meta.get("weights_sha256") or read_json(Path(self.models["student"]) / "config.json").get("weights_sha256")}
        for lang, p in sorted(self.models["kenlm"].items()):
            files[f"kenlm:{lang}"] = sha256_file(p)
        return sha256_json(files)[:16]


def bucket_of(score: float | None, cut: dict | None) -> str | None:
    if score is None or cut is None or (isinstance(score, float) and math.isnan(score)):
        return None
    if score <= cut["head"]:
        return "head"
    return "middle" if score <= cut["tail"] else "tail"


class PerplexityStage(Stage):
    name = "perplexity"

    def __init__(self, cfg: PerplexityConfig, scorer: Scorer, cutoffs: dict | None = None,
                 precomputed: pa.Table | None = None):
        super().__init__(cfg)
        self.scorer = scorer
        self.cutoffs = cutoffs
        self.precomputed = precomputed
        self._offset = 0

    def code_version(self) -> str:
        # models and cutoffs change the output without changing the config: both go in the fingerprint
        return super().code_version() + "+" + sha256_json({"models": self.scorer.fingerprint(),
                                                           "cutoffs": self.cutoffs})[:12]

    def _scores(self, batch: pa.Table) -> dict[str, list]:
        if self.precomputed is None:
            return self.scorer.score(batch)
        part = self.precomputed.slice(self._offset, batch.num_rows)
        self._offset += batch.num_rows
        if part.column("id").to_pylist() != batch.column("id").to_pylist():
            raise AssertionError("perplexity: precomputed scores are out of step with the shard")
        return {c: part.column(c).to_pylist() for c in part.column_names if c != "id"}

    def process(self, batch: pa.Table) -> Outcome:
        scores = self._scores(batch)
        t = set_column(batch, PPL_WAYRA, scores["ppl_wayra"])
        if "ppl_kenlm" in scores:
            t = set_column(t, PPL_KENLM, scores["ppl_kenlm"])
        stats = shard_stats(t, scores)
        if not self.config.buckets:
            kept, removed = split_by_mask(t, [True] * t.num_rows, [None] * t.num_rows)
            return Outcome(kept=kept, removed=removed, stats=stats)
        by = scores["ppl_" + self.config.bucket_by]
        langs = _langs(batch)
        buckets = [bucket_of(s, self.cutoffs.get(lang)) for s, lang in zip(by, langs)]
        t = set_column(t, PPL_BUCKET, buckets)
        stats["docs_by_bucket"] = {}
        for b, lang in zip(buckets, langs):
            key = b or "none"
            stats["docs_by_bucket"].setdefault(lang, {})
            stats["docs_by_bucket"][lang][key] = stats["docs_by_bucket"][lang].get(key, 0) + 1
        keep = [not (self.config.remove_tail and b == "tail") for b in buckets]
        kept, removed = split_by_mask(t, keep, [None if k else TAIL_REASON for k in keep])
        return Outcome(kept=kept, removed=removed, stats=stats)


def shard_stats(t: pa.Table, scores: dict[str, list]) -> dict:
    """Per language: documents and sums of log-perplexities (the report turns them into means)."""
    stats: dict = {"docs_by_lang": {}, "log_ppl_wayra_sum_by_lang": {}}
    for lang, v in zip(_langs(t), scores["ppl_wayra"]):
        stats["docs_by_lang"][lang] = stats["docs_by_lang"].get(lang, 0) + 1
        stats["log_ppl_wayra_sum_by_lang"][lang] = stats["log_ppl_wayra_sum_by_lang"].get(lang, 0.0) + math.log(v)
    if "ppl_kenlm" in scores:
        stats["log_ppl_kenlm_sum_by_lang"] = {}
        stats["kenlm_docs_by_lang"] = {}
        for lang, v in zip(_langs(t), scores["ppl_kenlm"]):
            if v is not None:
                stats["kenlm_docs_by_lang"][lang] = stats["kenlm_docs_by_lang"].get(lang, 0) + 1
                stats["log_ppl_kenlm_sum_by_lang"][lang] = stats["log_ppl_kenlm_sum_by_lang"].get(lang, 0.0) + math.log(v)
    return stats


# ---- global buckets: score, cut, split ----------------------------------------------------------

def score_shard(scorer: Scorer, shard: Shard, run_dir: str, batch_rows: int) -> tuple[str, dict[str, list[float]]]:
    """Write a shard's scores (id + ppl columns, same row order) and return the bucketing score by language."""
    pf = pq.ParquetFile(shard.path)
    cols = [c for c in ("id", "text", "lang") if c in pf.schema_arrow.names]
    parts, by_lang = [], {}
    for rb in pf.iter_batches(batch_size=batch_rows, columns=cols):
        t = pa.Table.from_batches([rb])
        s = scorer.score(t)
        parts.append(pa.table({"id": t.column("id"), **{k: pa.array(v, pa.float64()) for k, v in s.items()}}))
        for lang, v in zip(_langs(t), s["ppl_" + scorer.cfg.bucket_by]):
            if v is not None and not math.isnan(v):
                by_lang.setdefault(lang, []).append(v)
    _, _, done_dir = stage_dirs(run_dir, "perplexity")
    path = done_dir / "scores" / f"{shard.name}.{shard.sha256[:16]}.{scorer.fingerprint()}.parquet"
    if parts:
        table = pa.concat_tables(parts)
    else:
        table = pa.table({"id": pa.array([], pa.string()), "ppl_wayra": pa.array([], pa.float64())})
    write_table(path, table)
    return str(path), by_lang


def compute_cutoffs(by_lang: dict[str, list[float]], cfg: PerplexityConfig) -> dict[str, dict]:
    """Per language, the head and tail thresholds (numpy's linear-interpolation percentiles)."""
    import numpy as np
    out = {}
    for lang in sorted(by_lang):
        v = np.asarray(sorted(by_lang[lang]), dtype=np.float64)
        if len(v):
            out[lang] = {"head": float(np.percentile(v, cfg.head_percentile)),
                         "tail": float(np.percentile(v, cfg.tail_percentile)), "docs": int(len(v))}
    return out


@task(name="perplexity-score", task_run_name="perplexity-score-{shard.name}", retries=1, retry_delay_seconds=1)
def perplexity_score_task(shard: Shard, run_dir: str, cfg: PerplexityConfig, models: dict) -> tuple[str, dict]:
    return score_shard(Scorer(cfg, models), shard, run_dir, cfg.batch_rows)


@task(name="perplexity", task_run_name="perplexity-{shard.name}", retries=1, retry_delay_seconds=1)
def perplexity_task(shard: Shard, run_dir: str, cfg: PerplexityConfig, models: dict,
                    cutoffs: dict | None = None, scores_path: str | None = None) -> dict:
    pre = pq.read_table(scores_path) if scores_path else None
    return process_shard(PerplexityStage(cfg, Scorer(cfg, models), cutoffs, pre), shard, run_dir, batch_rows=cfg.batch_rows)


def run_perplexity(shards: list[Shard], run_dir: str, cfg: PerplexityConfig) -> list[dict]:
    """The stage's runner: load models (before any document is read); with buckets, score every
    shard first, compute per-language cutoffs, then split; without, one pass."""
    models = check_perplexity(cfg)
    cutoffs, paths = None, [None] * len(shards)
    if cfg.buckets:
        by_lang: dict[str, list[float]] = {}
        scored = [f.result() for f in perplexity_score_task.map(shards, run_dir=unmapped(run_dir), cfg=unmapped(cfg),
                                                                  models=unmapped(models))]
        for i, (path, part) in enumerate(scored):
            paths[i] = path
            for lang, vals in part.items():
                by_lang.setdefault(lang, []).extend(vals)
        cutoffs = compute_cutoffs(by_lang, cfg)
    futures = [perplexity_task.submit(s, run_dir, cfg, models, cutoffs, p) for s, p in zip(shards, paths)]
    results = [f.result() for f in futures]
    summarize(results, models, cutoffs, cfg)
    return results


def summarize(results: list[dict], models: dict, cutoffs: dict | None, cfg: PerplexityConfig) -> None:
    """Global parts of the report ride on the first shard: models, thresholds, per-language means."""
    if not results:
        return
    docs: dict[str, int] = {}
    sums: dict[str, float] = {}
    kdocs: dict[str, int] = {}
    ksums: dict[str, float] = {}
    for r in results:
        st = r["stats"]
        for lang, n in st.get("docs_by_lang", {}).items():
            docs[lang] = docs.get(lang, 0) + n
        for lang, s in st.get("log_ppl_wayra_sum_by_lang", {}).items():
            sums[lang] = sums.get(lang, 0.0) + s
        for lang, n in st.get("kenlm_docs_by_lang", {}).items():
            kdocs[lang] = kdocs.get(lang, 0) + n
        for lang, s in st.get("log_ppl_kenlm_sum_by_lang", {}).items():
            ksums[lang] = ksums.get(lang, 0.0) + s
        for k in ("geo_mean_ppl_wayra_by_lang", "geo_mean_ppl_kenlm_by_lang", "models", "cutoffs"):
            st.pop(k, None)
    first = results[0]["stats"]
    first["models"] = {"student": models["student"], "kenlm": models["kenlm"]}
    first["geo_mean_ppl_wayra_by_lang"] = {lang: round(math.exp(sums[lang] / n), 3) for lang, n in sorted(docs.items()) if n}
    if kdocs:
        first["geo_mean_ppl_kenlm_by_lang"] = {lang: round(math.exp(ksums[lang] / n), 3) for lang, n in sorted(kdocs.items()) if n}
    if cutoffs is not None:
        first["cutoffs"] = {"by": f"ppl_{cfg.bucket_by}", "head_percentile": cfg.head_percentile,
                            "tail_percentile": cfg.tail_percentile,
                            "by_lang": {lang: {"head": round(c["head"], 4), "tail": round(c["tail"], 4), "docs": c["docs"]}
                                        for lang, c in cutoffs.items()}}
