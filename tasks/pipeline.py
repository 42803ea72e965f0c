"""The pipeline definition: every stage after extract, in the order documents flow through them.

A stage's config block in the curate config is named as the stage (`Stage.name`) and typed by its
`Stage.Config`, so adding a stage is adding its class here; a fastText classifier stage needs not
even that: its module in tasks/classifiers/ is found there and runs after `quality`.
"""
from __future__ import annotations

from quipu.tasks import classifiers
from quipu.tasks.bad_words import BadWordsFilter
from quipu.tasks.decontam import Decontaminate
from quipu.tasks.dedup import DedupStage
from quipu.tasks.heuristics import HeuristicFilters
from quipu.tasks.langid import LanguageId
from quipu.tasks.lines import LineDedup
from quipu.tasks.perplexity import PerplexityStage
from quipu.tasks.pii import PiiRedaction
from quipu.tasks.quality import QualityFilter
from quipu.tasks.schema import removed_schema
from quipu.tasks.stage import Stage
from quipu.tasks.terminal_punct import TerminalPunctFilter
from quipu.tasks.urls import UrlFilter

STAGES: list[type[Stage]] = [
    UrlFilter,           # first: a blocked site's text is never read
    LanguageId,
    BadWordsFilter,      # off by default; per language, so after langid
    LineDedup,           # global: boilerplate lines go before any rule judges the text
    HeuristicFilters,
    TerminalPunctFilter,
    QualityFilter,
    *classifiers.stages(),   # tasks/classifiers/: every other fastText classifier
    DedupStage,          # global: signatures, plan, split, commit
    Decontaminate,
    PiiRedaction,        # edits kept text only: nothing after it sees personal data
    PerplexityStage,     # last: scores what is kept
]


REMOVED_SCHEMA = removed_schema(list({f.name: f for s in STAGES for f in s.columns}.values()))


def stage_names() -> list[str]:
    return [s.name for s in STAGES]


def stage_class(name: str) -> type[Stage]:
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"no stage named {name!r} (stages: {', '.join(stage_names())})")
