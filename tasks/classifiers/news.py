"""Stage `news`: a fastText topic classifier, how news-like a document is (the worked example of docs/architecture.md
of a second classifier: this module, its training config configs/quality/news.yaml, its test
tests/test_news_classifier.py and one line of docs are all it takes).

Adds `news_score`, the probability of the label `news`: a column for `where:` in blends
(`news_score: ">= 0.5"`), or a filter keeping documents at least `threshold` or the top fraction
of each language. Removal reasons `news<0.xx` and `news=0.xx:tie`. Off by default; train its model
with `quipu quality train configs/quality/news.yaml` (catalog kind `news-fasttext`).
"""
from __future__ import annotations

import pyarrow as pa

from quipu.tasks.fasttext_filter import FastTextFilter, FastTextFilterConfig


class NewsConfig(FastTextFilterConfig):
    """Off by default: the stage needs a trained `news-fasttext` classifier."""


class NewsFilter(FastTextFilter):
    name = "news"
    Config = NewsConfig
    score_field = pa.field("news_score", pa.float64())
    model_kind = "news-fasttext"
