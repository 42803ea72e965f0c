"""Stage `quality`: a fastText quality classifier (DCLM style) scores every document.

Adds `quality_score`, the classifier's probability of the positive ("high quality") label, and
keeps either the documents scoring at least `threshold`, or the top `top_fraction` of each language
(DCLM keeps the top 10%): a `FastTextFilter` (quipu.tasks.fasttext_filter) on `ScoreFilter`
(quipu.tasks.score_filter). Removal reasons `quality<0.xx` and `quality=0.xx:tie`.

The classifier (quipu.scoring.fasttext_classifier) comes from `quipu quality train`, registered in
the catalog as kind `quality-fasttext`; `model` names it (catalog name or id) or gives a path, and
None means the newest one registered.
"""
from __future__ import annotations

import pyarrow as pa

from quipu.tasks.fasttext_filter import FastTextFilter, FastTextFilterConfig
from quipu.scoring.resolver import QUALITY_KIND

QUALITY_SCORE = pa.field("quality_score", pa.float64())


class QualityConfig(FastTextFilterConfig):
    """Off by default: the stage needs a trained classifier (`quipu quality train`)."""


class QualityFilter(FastTextFilter):
    name = "quality"
    Config = QualityConfig
    score_field = QUALITY_SCORE
    model_kind = QUALITY_KIND
