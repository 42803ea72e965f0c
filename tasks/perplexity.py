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
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import Field, field_validator, model_validator

from quipu.catalog.errors import UserError
from quipu.catalog.files import read_json, sha256_json
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, Shard, Stage, StageConfig, langs_of, split_by_mask, write_table
from quipu.scoring.kenlm_model import load_kenlm, resolve_kenlm
from quipu.scoring.resolver import STUDENT_KIND, resolve_model
PPL_WAYRA = pa.field("ppl_wayra", pa.float64())
PPL_KENLM = pa.field("ppl_kenlm", pa.float64())
PPL_BUCKET = pa.field("ppl_bucket", pa.string())
UNKNOWN_LANG = "und"
TAIL_REASON = "ppl_tail"


class PerplexityModelError(UserError, ValueError):
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
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: the student runs on CUDA (bf16, length-bucketed batches) when a GPU is visible")
    cuda_batch_tokens: int = Field(131072, ge=256, description="on CUDA: padded tokens per batch of similar-length documents")

    @model_validator(mode="after")
    def _consistent(self):
        if self.head_percentile >= self.tail_percentile:
            raise ValueError(f"head_percentile ({self.head_percentile}) must be below tail_percentile ({self.tail_percentile})")
        if self.remove_tail and not self.buckets:
            raise ValueError("remove_tail needs buckets: true")
        if self.buckets and self.bucket_by == "kenlm" and not self.kenlm:
            raise ValueError("bucket_by: kenlm needs a kenlm model")
        if self.quantize and self.device == "cuda":
            raise ValueError("quantize: int8 dynamic quantisation runs on the CPU only (device: cuda)")
        return self

    @field_validator("kenlm")
    @classmethod
    def _kenlm_langs(cls, v):
        if isinstance(v, dict):
            for lang in v:
                if not lang.isalpha() and lang != "*":
                    raise ValueError(f"'{lang}' is not a language code like 'en' (or '*')")
        return v


# ---- loading models (resolution: quipu.scoring.resolver) -------------------------------------------

@lru_cache(maxsize=4)
def load_student(path: str, quantize: bool, threads: int | None, device: str = "cpu"):
    from quipu.scoring.wayra import StudentError, WayraStudent, resolve_device
    try:
        # int8 is CPU-only: with quantize, auto means the CPU
        return WayraStudent.load(path, quantize=quantize, threads=threads,
                                 device="cpu" if quantize and device == "auto" else resolve_device(device).type)
    except StudentError as e:
        raise PerplexityModelError(str(e)) from None


def resolve_models(cfg: PerplexityConfig) -> dict:
    """{"student": directory, "kenlm": {lang or '*': binary}} from the config's references."""
    return {"student": resolve_model(STUDENT_KIND, cfg.student, "perplexity.student"),
            "kenlm": resolve_kenlm(cfg.kenlm, "perplexity.kenlm")}


# ---- scoring ----------------------------------------------------------------------------------

class Scorer:
    """ppl_wayra (and ppl_kenlm) for a batch of documents."""

    def __init__(self, cfg: PerplexityConfig, models: dict):
        self.cfg = cfg
        self.models = models
        self.student = load_student(models["student"], cfg.quantize, cfg.threads, cfg.device)
        on_gpu = self.student.device.type == "cuda"
        # CUDA: batches by a token budget (thousands of short documents at once); CPU: small batches
        self.batch = (1 << 20, cfg.cuda_batch_tokens) if on_gpu else (cfg.batch_size, None)
        self.kenlm = {lang: load_kenlm(p) for lang, p in models["kenlm"].items()}

    def score(self, t: pa.Table) -> dict[str, list]:
        texts = t.column("text").to_pylist()
        out = {"ppl_wayra": [math.exp(v) for v in self.student.predict_log_ppl(
            texts, self.batch[0], max_batch_tokens=self.batch[1])]}
        if self.kenlm:
            vals = []
            for text, lang in zip(texts, langs_of(t)):
                lm = self.kenlm.get(lang) or self.kenlm.get("*")
                v = lm.perplexity([text])[0] if lm is not None else math.nan
                vals.append(None if math.isnan(v) else v)
            out["ppl_kenlm"] = vals
        return out

    def fingerprint(self) -> str:
        """What the scores depend on besides the config: the model weights."""
        from quipu.catalog.files import sha256_file
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
    columns = (PPL_WAYRA, PPL_KENLM, PPL_BUCKET)
    Config = PerplexityConfig

    @cached_property
    def scorer(self) -> Scorer:
        return Scorer(self.config, resolve_models(self.config))

    def check(self) -> None:
        self.scorer

    def needs_scan(self) -> bool:
        return self.config.buckets   # per-language percentiles: every shard is scored first

    def scan(self, shard: Shard) -> tuple[str, str, dict[str, list[float]]]:
        """(shard name, its scores file, the bucketing score of its documents by language)."""
        path, by_lang = score_shard(self.scorer, shard, self.layout.scratch("_shards") / "scores", self.config.batch_rows)
        return shard.name, path, by_lang

    def plan(self, scans: list | None) -> dict | None:
        if scans is None:
            return None
        by_lang: dict[str, list[float]] = {}
        for _, _, part in scans:
            for lang, vals in part.items():
                by_lang.setdefault(lang, []).extend(vals)
        return {"cutoffs": percentile_cutoffs(by_lang, self.config), "scores": {name: path for name, path, _ in scans}}

    def plan_for(self, shard: Shard, plan: dict | None) -> "ShardScores":
        if plan is None:
            return ShardScores(None, None)
        return ShardScores(plan["cutoffs"], pq.read_table(plan["scores"][shard.name]))

    def fingerprint(self, shard_plan: "ShardScores") -> dict:
        # models and cutoffs change the output without changing the config: both go in the fingerprint
        return {"models": self.scorer.fingerprint(), "cutoffs": sha256_json(shard_plan.cutoffs)[:12]}

    def process(self, batch: pa.Table, shard_plan: "ShardScores") -> Outcome:
        scores = shard_plan.take(batch) if shard_plan.precomputed is not None else self.scorer.score(batch)
        t = set_column(batch, PPL_WAYRA, scores["ppl_wayra"])
        if "ppl_kenlm" in scores:
            t = set_column(t, PPL_KENLM, scores["ppl_kenlm"])
        stats = shard_stats(t, scores)
        if not self.config.buckets:
            kept, removed = split_by_mask(t, [True] * t.num_rows, [None] * t.num_rows)
            return Outcome(kept=kept, removed=removed, stats=stats)
        by = scores["ppl_" + self.config.bucket_by]
        langs = langs_of(batch)
        buckets = [bucket_of(s, shard_plan.cutoffs.get(lang)) for s, lang in zip(by, langs)]
        t = set_column(t, PPL_BUCKET, buckets)
        stats["docs_by_bucket"] = {}
        for b, lang in zip(buckets, langs):
            key = b or "none"
            stats["docs_by_bucket"].setdefault(lang, {})
            stats["docs_by_bucket"][lang][key] = stats["docs_by_bucket"][lang].get(key, 0) + 1
        keep = [not (self.config.remove_tail and b == "tail") for b in buckets]
        kept, removed = split_by_mask(t, keep, [None if k else TAIL_REASON for k in keep])
        return Outcome(kept=kept, removed=removed, stats=stats)

    def finalize(self, stats: dict, scans, plan: dict | None, committed) -> dict:
        """Models, thresholds and per-language geometric means from the summed shard stats."""
        cfg = self.config
        docs, sums = stats.get("docs_by_lang", {}), stats.get("log_ppl_wayra_sum_by_lang", {})
        kdocs, ksums = stats.get("kenlm_docs_by_lang", {}), stats.get("log_ppl_kenlm_sum_by_lang", {})
        models = self.scorer.models
        out = {"models": {"student": models["student"], "kenlm": models["kenlm"]},
               "geo_mean_ppl_wayra_by_lang": {lang: round(math.exp(sums[lang] / n), 3) for lang, n in sorted(docs.items()) if n}}
        if kdocs:
            out["geo_mean_ppl_kenlm_by_lang"] = {lang: round(math.exp(ksums[lang] / n), 3) for lang, n in sorted(kdocs.items()) if n}
        if plan is not None:
            out["cutoffs"] = {"by": f"ppl_{cfg.bucket_by}", "head_percentile": cfg.head_percentile,
                              "tail_percentile": cfg.tail_percentile,
                              "by_lang": {lang: {"head": round(c["head"], 4), "tail": round(c["tail"], 4), "docs": c["docs"]}
                                          for lang, c in plan["cutoffs"].items()}}
        return {**out, **stats}


class ShardScores:
    """One shard's part of the plan: the cut-offs and the scores its scan wrote, read in row order."""

    def __init__(self, cutoffs: dict | None, precomputed: pa.Table | None):
        self.cutoffs = cutoffs
        self.precomputed = precomputed
        self._offset = 0

    def take(self, batch: pa.Table) -> dict[str, list]:
        part = self.precomputed.slice(self._offset, batch.num_rows)
        self._offset += batch.num_rows
        if part.column("id").to_pylist() != batch.column("id").to_pylist():
            raise AssertionError("perplexity: precomputed scores are out of step with the shard")
        return {c: part.column(c).to_pylist() for c in part.column_names if c != "id"}


def shard_stats(t: pa.Table, scores: dict[str, list]) -> dict:
    """Per language: documents and sums of log-perplexities (the report turns them into means)."""
    stats: dict = {"docs_by_lang": {}, "log_ppl_wayra_sum_by_lang": {}}
    for lang, v in zip(langs_of(t), scores["ppl_wayra"]):
        stats["docs_by_lang"][lang] = stats["docs_by_lang"].get(lang, 0) + 1
        stats["log_ppl_wayra_sum_by_lang"][lang] = stats["log_ppl_wayra_sum_by_lang"].get(lang, 0.0) + math.log(v)
    if "ppl_kenlm" in scores:
        stats["log_ppl_kenlm_sum_by_lang"] = {}
        stats["kenlm_docs_by_lang"] = {}
        for lang, v in zip(langs_of(t), scores["ppl_kenlm"]):
            if v is not None:
                stats["kenlm_docs_by_lang"][lang] = stats["kenlm_docs_by_lang"].get(lang, 0) + 1
                stats["log_ppl_kenlm_sum_by_lang"][lang] = stats["log_ppl_kenlm_sum_by_lang"].get(lang, 0.0) + math.log(v)
    return stats


# ---- global buckets: score, cut, split ----------------------------------------------------------

def score_shard(scorer: Scorer, shard: Shard, folder: Path, batch_rows: int) -> tuple[str, dict[str, list[float]]]:
    """Write a shard's scores (id + ppl columns, same row order) and return the bucketing score by language."""
    pf = pq.ParquetFile(shard.path)
    cols = [c for c in ("id", "text", "lang") if c in pf.schema_arrow.names]
    parts, by_lang = [], {}
    for rb in pf.iter_batches(batch_size=batch_rows, columns=cols):
        t = pa.Table.from_batches([rb])
        s = scorer.score(t)
        parts.append(pa.table({"id": t.column("id"), **{k: pa.array(v, pa.float64()) for k, v in s.items()}}))
        for lang, v in zip(langs_of(t), s["ppl_" + scorer.cfg.bucket_by]):
            if v is not None and not math.isnan(v):
                by_lang.setdefault(lang, []).append(v)
    path = folder / f"{shard.name}.{shard.sha256[:16]}.{scorer.fingerprint()}.parquet"
    if parts:
        table = pa.concat_tables(parts)
    else:
        table = pa.table({"id": pa.array([], pa.string()), "ppl_wayra": pa.array([], pa.float64())})
    write_table(path, table)
    return str(path), by_lang


def percentile_cutoffs(by_lang: dict[str, list[float]], cfg: PerplexityConfig) -> dict[str, dict]:
    """Per language, the head and tail thresholds (numpy's linear-interpolation percentiles)."""
    import numpy as np
    out = {}
    for lang in sorted(by_lang):
        v = np.asarray(sorted(by_lang[lang]), dtype=np.float64)
        if len(v):
            out[lang] = {"head": float(np.percentile(v, cfg.head_percentile)),
                         "tail": float(np.percentile(v, cfg.tail_percentile)), "docs": int(len(v))}
    return out
