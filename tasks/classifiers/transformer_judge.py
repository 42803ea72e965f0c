"""Stage `hf_judge`: any Hugging Face sequence-classification model from a local folder scores every
document (FineWeb-Edu's classifier for English, FinePDFs' educational classifiers for Spanish and
Portuguese, or a head quipu trained on frozen SmolLM2 layers from LLM labels, `quipu label`).

Adds `hf_judge_score`: the model's output as its head makes it (quipu.scoring.hf_classifier: the
logit of a regression head, FineWeb-Edu's 0-5; a classification head's expected class value or one
named label's probability). `model` is one folder or one per language
(`{default: off, en: models/fineweb-edu, es: models/finepdfs-edu-es}`): a language without a model
is kept unscored and counted. Keeps documents scoring at least `threshold` (per language, in the
score's own units: FineWeb-Edu keeps >= 3) or the top fraction of each language; removal reasons
`hf_judge<3.00` and `hf_judge=x:tie`. The column feeds the tiers as any judge does
(`quipu tiers fit --judge hf_judge_score:higher`). Off by default: it needs a model folder, and it is
slow on a CPU (a BERT-base model scores tens of documents per second per core; bench/hf_judge_throughput.py).
"""
from __future__ import annotations

import math
from functools import cached_property
from typing import Literal

import pyarrow as pa
from pydantic import Field, model_validator

from quipu.tasks.per_language import PerLanguage, languages_named, resolve
from quipu.tasks.score_filter import ScoreFilter, ScoreFilterConfig
from quipu.scoring.hf_classifier import Head, HfClassifier, check_folder, load_hf_classifier


class HfJudgeConfig(ScoreFilterConfig):
    """Off by default: the stage needs a model folder."""
    enabled: bool = False
    model: PerLanguage(str) = Field(None, description="folder of a HF sequence-classification model, or one per "
                                                      "language {default: <folder>|off, es: <folder>}")
    head: Head = Field("auto", description="regression: the logit; expected: expected class value; probability: "
                                           "`label`'s probability; auto: from the model's labels")
    label: str | None = Field(None, description="head probability: the label whose probability is the score")
    threshold: PerLanguage(float) = Field(3.0, description="keep: threshold: keep score >= this (per language; "
                                                           "the score's units: FineWeb-Edu's 0-5 keeps >= 3)")
    histogram_width: float = Field(0.25, gt=0, description="width of the report's score histogram bins")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: CUDA when a GPU is visible")
    batch_size: int = Field(32, ge=1, le=4096, description="documents per forward pass on the CPU")
    max_batch_tokens: int = Field(65536, ge=256, description="on CUDA: padded tokens per length-sorted batch")
    max_length: int | None = Field(None, ge=8, description="tokens per document (default and cap: the model's maximum)")
    threads: int | None = Field(None, ge=1, le=256, description="torch threads on the CPU (default: torch's)")

    @model_validator(mode="after")
    def _needs_a_model(self):
        if self.enabled and (self.model is None or (isinstance(self.model, dict) and not any(self.model.values()))):
            raise ValueError("enabled, but `model` names no folder: give model: <folder> or {default: off, es: <folder>}")
        return self


class HfJudge(ScoreFilter):
    name = "hf_judge"
    Config = HfJudgeConfig
    score_field = pa.field("hf_judge_score", pa.float64())

    def __init__(self, config: HfJudgeConfig, context=None):
        super().__init__(config, context)
        self.histogram_width = config.histogram_width

    def folders(self) -> dict[str, str]:
        """{language or 'default': folder} of every model the config names."""
        m = self.config.model
        return {k: v for k, v in (m.items() if isinstance(m, dict) else [("default", m)]) if v}

    def folder_for(self, lang: str) -> str | None:
        return resolve(self.config.model, lang)

    @cached_property
    def models(self) -> dict[str, HfClassifier]:
        cfg = self.config
        for folder in self.folders().values():   # every folder's layout first: one line, before any load
            check_folder(folder)
        opts = dict(head=cfg.head, label=cfg.label, device=cfg.device, batch_size=cfg.batch_size,
                    max_length=cfg.max_length, max_batch_tokens=cfg.max_batch_tokens, threads=cfg.threads)
        return {f: load_hf_classifier(f, **opts) for f in sorted(set(self.folders().values()))}

    def check(self) -> None:
        self.models

    def threshold_for(self, lang: str) -> float:
        return resolve(self.config.threshold, lang, off=-math.inf)

    def score(self, batch: pa.Table) -> list[float | None]:
        from quipu.tasks.stage import langs_of
        texts = batch.column("text").to_pylist()
        by_folder: dict[str, list[int]] = {}
        for i, lang in enumerate(langs_of(batch)):
            folder = self.folder_for(lang)
            if folder:
                by_folder.setdefault(folder, []).append(i)
        out: list[float | None] = [None] * len(texts)
        for folder, idx in sorted(by_folder.items()):
            for i, s in zip(idx, self.models[folder].score([texts[i] for i in idx])):
                out[i] = s
        return out

    def model_version(self) -> str:
        return ",".join(f"{k}={self.models[f].fingerprint}" for k, f in sorted(self.folders().items()))

    def describe(self) -> dict:
        return {"models": {k: self.models[f].describe() for k, f in sorted(self.folders().items())},
                "languages_with_own_model": sorted(languages_named(self.config.model))}
