"""The shape of a stage that applies a fastText classifier of the family (quipu.scoring.fasttext_classifier):
a `ScoreFilter` whose score is the model's probability of its positive label.

A subclass names the stage, its config, its score column and the catalog `model_kind` it applies
(the `kind` of its training config, `quipu quality train CONFIG`); loading (checked, cached per
process), resolving `model` (a catalog name or id, a path, or None: the newest model of the kind),
batched scoring and the model's hash in the shard fingerprint are here. The quality stage
(quipu.tasks.quality) is the first; tasks/classifiers/ holds the others, found there by the pipeline.
"""
from __future__ import annotations

from functools import cached_property
from typing import ClassVar

import pyarrow as pa
from pydantic import Field

from quipu.tasks.score_filter import ScoreFilter, ScoreFilterConfig
from quipu.scoring.fasttext_classifier import FastTextClassifier, load_classifier
from quipu.scoring.resolver import resolve_model


class FastTextFilterConfig(ScoreFilterConfig):
    """Off by default: the stage needs a trained classifier of its kind."""
    enabled: bool = False
    model: str | None = Field(None, description="catalog model name or id, or a path to a fastText .bin; "
                                                "None: the newest registered model of the stage's kind")
    positive_label: str | None = Field(None, description="label whose probability is the score; default: the "
                                                         "model's sidecar, else 'hq'")


class FastTextFilter(ScoreFilter):
    model_kind: ClassVar[str]

    @cached_property
    def model(self) -> FastTextClassifier:
        path = resolve_model(self.model_kind, self.config.model, f"{self.name}.model", (".bin", ".ftz"))
        return load_classifier(path, self.config.positive_label)

    def check(self) -> None:
        self.model

    def score(self, batch: pa.Table) -> list[float]:
        return self.model.score(batch.column("text").to_pylist())

    def model_version(self) -> str:
        return self.model.sha256[:16]

    def describe(self) -> dict:
        return {"model": self.model.path}
