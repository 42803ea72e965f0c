"""Stage `edu`: a fastText classifier distilled from LLM labels of educational value (`quipu label`,
then `quipu quality train configs/quality/edu.yaml`, catalog kind `edu-fasttext`), FineWeb-Edu's
recipe at fastText's speed.

Adds `edu_score`, the probability that the LLM would rate the document >= 3 of 5 (label `hq`): a
judge for the tiers (`quipu tiers fit --judge edu_score:higher`), a column for `where:` in blends, or
a filter keeping documents at least `threshold` or the top fraction of each language. Removal
reasons `edu<0.xx` and `edu=0.xx:tie`. Off by default: it needs the trained model.
"""
from __future__ import annotations

import pyarrow as pa

from quipu.tasks.fasttext_filter import FastTextFilter, FastTextFilterConfig


class EduConfig(FastTextFilterConfig):
    """Off by default: the stage needs a trained `edu-fasttext` classifier."""


class EduFilter(FastTextFilter):
    name = "edu"
    Config = EduConfig
    score_field = pa.field("edu_score", pa.float64())
    model_kind = "edu-fasttext"
