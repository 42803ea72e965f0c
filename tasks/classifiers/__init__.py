"""Classifier stages beyond `quality`: one module each, found here by the pipeline definition
(quipu.tasks.pipeline), which runs them right after `quality`, in module-name order.

A module holds one `ScoreFilter` subclass (quipu.tasks.score_filter): usually a `FastTextFilter`
(quipu.tasks.fasttext_filter) with its stage name, config, score column and the catalog `model_kind`
its training config (configs/quality/*.yaml, `kind:`) registers; `hf_judge` (transformer_judge.py) applies any Hugging Face
sequence-classification model from a folder. Dropping the module here is all the wiring there is: the curate config gets its block,
the run its stage, curated shards its score column (for `where:` in blends).
"""
from __future__ import annotations

import importlib
import pkgutil


def stages() -> list[type]:
    """The classifier stages of this package: every module's `ScoreFilter` subclasses, by module name."""
    from quipu.tasks.score_filter import ScoreFilter
    found: list[type] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        found += [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, ScoreFilter)
                  and c.__module__ == module.__name__ and "name" in c.__dict__]
    return found
