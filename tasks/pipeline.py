"""The pipeline definition: every stage after extract, in the order documents flow through them.

A stage's config block in the curate config is named as the stage (`Stage.name`) and typed by its
`Stage.Config`, so adding a stage is adding its class here; a fastText classifier stage needs not
even that: its module in tasks/classifiers/ is found there and runs after `quality`. This is the one
list of stages: the driver runs whatever `StageRef`s it is given, and nothing in tasks/, trainer/ or
catalog/ imports this module (flows and tests do).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from quipu.tasks import classifiers
from quipu.tasks.bad_words import BadWordsFilter
from quipu.tasks.decontam import Decontaminate
from quipu.tasks.dedup import DedupStage
from quipu.tasks.fluency import FluencyFilter
from quipu.tasks.heuristics import HeuristicFilters
from quipu.tasks.langid import LanguageId
from quipu.tasks.lines import LineDedup
from quipu.tasks.perplexity import PerplexityStage
from quipu.tasks.pii import PiiRedaction
from quipu.tasks.quality import QualityFilter
from quipu.tasks.schema import removed_schema
from quipu.tasks.driver import InProcess, StageRef, run_stage
from quipu.tasks.stage import RunContext, Shard, ShardResult, Stage, StageConfig
from quipu.tasks.terminal_punct import TerminalPunctFilter
from quipu.tasks.tiers import QualityTiers
from quipu.tasks.urls import UrlFilter

STAGES: list[type[Stage]] = [
    UrlFilter,           # first: a blocked site's text is never read
    LanguageId,
    BadWordsFilter,      # off by default; per language, so after langid
    LineDedup,           # global: boilerplate lines go before any rule judges the text
    HeuristicFilters,
    FluencyFilter,       # fluent junk (spun, n-gram generated): needs langid's `lang`
    TerminalPunctFilter,
    QualityFilter,
    *classifiers.stages(),   # tasks/classifiers/: every other fastText classifier
    DedupStage,          # global: signatures, plan, split, commit
    Decontaminate,
    PiiRedaction,        # edits kept text only: nothing after it sees personal data
    PerplexityStage,     # scores what is kept
    QualityTiers,        # last: every judge's score (perplexity's included) into one quality_tier
]


# every stage's removed/ rows (and extract's) in a run of this pipeline share one schema
REMOVED_SCHEMA = removed_schema(list({f.name: f for s in STAGES for f in s.columns}.values()))


def stage_names() -> list[str]:
    return [s.name for s in STAGES]


def column_stage(column: str) -> str | None:
    """The stage that writes `column` (a classifier in tasks/classifiers/ included), if any."""
    return next((s.name for s in STAGES for f in s.columns if f.name == column), None)


def stage_class(name: str) -> type[Stage]:
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"no stage named {name!r} (stages: {', '.join(stage_names())})")


def stage_ref(name: str, config: StageConfig, context: RunContext) -> StageRef:
    """The pipeline's stage `name` in a run (its removed rows in the pipeline's one schema)."""
    return StageRef(stage_class(name), config, replace(context, removed_schema=REMOVED_SCHEMA))


def run_local(name: str, config: StageConfig, shards: list[Shard], run_dir: str | Path,
              dataset: str | None = None, map_fn: Callable | None = None) -> tuple[list[ShardResult], dict]:
    """One stage of the pipeline over `shards`, in this process: tests, benchmarks, notebooks."""
    ref = stage_ref(name, config, RunContext(str(Path(run_dir).resolve()), dataset))
    return run_stage(ref, shards, InProcess(map_fn))
