"""Stage `quality`: a fastText quality classifier (DCLM style) scores every document.

Adds `quality_score`, the classifier's probability of the positive ("high quality") label, and
keeps either the documents scoring at least `threshold`, or the top `top_fraction` of each language
(DCLM keeps the top 10%): a `ScoreFilter` (quipu.tasks.score_filter). Removal reasons
`quality<0.xx` and `quality=0.xx:tie`.

The classifier (quipu.trainer.quality_model) comes from `quipu quality train`, registered in the
catalog as kind `quality-fasttext`; `model` names it (catalog name or id) or gives a path, and
None means the newest one registered.
"""
from __future__ import annotations

from functools import cached_property

import pyarrow as pa
from pydantic import Field

from quipu.tasks.score_filter import ScoreFilter, ScoreFilterConfig
from quipu.trainer.models import QUALITY_KIND, resolve_model
from quipu.trainer.quality_model import QualityModel, load_quality_model

QUALITY_SCORE = pa.field("quality_score", pa.float64())


class QualityConfig(ScoreFilterConfig):
    """Off by default: the stage needs a trained classifier (`quipu quality train`)."""
    enabled: bool = False
    model: str | None = Field(None, description="catalog model name or id, or a path to a fastText .bin; "
                                                "None: the newest registered quality-fasttext model")
    positive_label: str | None = Field(None, description="label whose probability is the score; default: the "
                                                         "model's sidecar, else 'hq'")


class QualityFilter(ScoreFilter):
    name = "quality"
    Config = QualityConfig
    score_field = QUALITY_SCORE

    @cached_property
    def model(self) -> QualityModel:
        path = resolve_model(QUALITY_KIND, self.config.model, "quality.model", (".bin", ".ftz"))
        return load_quality_model(path, self.config.positive_label)

    def check(self) -> None:
        self.model

    def score(self, batch: pa.Table) -> list[float]:
        return self.model.score(batch.column("text").to_pylist())

    def model_version(self) -> str:
        return self.model.sha256[:16]

    def describe(self) -> dict:
        return {"model": self.model.path}
