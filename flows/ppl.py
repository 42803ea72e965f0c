"""Flows that build what the `perplexity` stage uses, and the command line for them.

- `ppl-label`   (`quipu ppl label CONFIG`): the teacher LLM's log-perplexity on a seeded sample of the
  input documents, cached in the catalog (never computed twice for a teacher, document and N).
- `ppl-distill` (`quipu ppl distill CONFIG --output DIR`): label (from cache where possible), train the
  Wayra-style student (scoring/wayra.py), save it, register it (kind `wayra`) with validation metrics.
- `kenlm-train` (`quipu kenlm train CONFIG`): a CCNet-style KenLM model per language
  (quipu.scoring.kenlm_model), registered as kind `kenlm` with held-out perplexities.
- `quipu ppl eval` (quipu.trainer.ppl_eval, no flow): on held-out documents, Spearman/Pearson of the
  student's (and KenLM's) log-perplexity with the teacher's, and the docs/s of all three measured in
  the same run.

Documents are read through quipu.trainer.text_source, as every model's training text is.

Every model is loaded (a bad path fails, naming it) before any document is read.
"""
from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

from prefect import flow
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quipu.scoring.resolver import KENLM_KIND, STUDENT_KIND
from quipu.catalog.files import write_json_atomic
from quipu.catalog.errors import UserError
from quipu.flows.progress import say
from quipu.flows.run_names import output_name
from quipu.flows.runners import failed_run
from quipu.trainer.teacher import TeacherConfig, load_teacher
from quipu.trainer.text_source import read_documents
from quipu.scoring.wayra import WayraArch
from quipu.trainer.wayra_train import DistillSettings



# ---- configs ----------------------------------------------------------------------------------

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

def seeded_sample(docs: list[dict], n: int, seed: int) -> list[dict]:
    """The first n documents by a seeded hash of (id, text): stable when files are added or reordered."""
    key = lambda d: hashlib.sha256(f"{seed}:{d['id']}:{d['text'][:200]}".encode()).hexdigest()
    return sorted(docs, key=key)[:n]


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
    stats["precision"] = "bf16" if teacher.bf16 else "fp32"
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
    from quipu.scoring.resolver import resolve_model
    from quipu.scoring.wayra import StudentError, WayraStudent
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
    from quipu.scoring.kenlm_model import KenLMError, KenLMScorer, kenlm_binaries, train_kenlm
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
