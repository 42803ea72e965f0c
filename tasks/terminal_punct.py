"""Stage `terminal_punct`: keep prose, drop menus and lists, by the fraction of a document's
non-empty lines that end in terminal punctuation (FineWeb's `line_punct_ratio`, datatrove's
punctuation set). As a score filter it can also keep the top fraction of each language, and the
report shows the score's histogram per language. Off by default: the FineWeb rules of the
heuristics stage already apply a fixed ratio (0.12).
"""
from __future__ import annotations

import pyarrow as pa
from datatrove.utils.text import TERMINAL_PUNCTUATION
from pydantic import Field

from quipu.tasks.score_filter import ScoreFilter, ScoreFilterConfig

STOP_CHARS = tuple(sorted(TERMINAL_PUNCTUATION))
TERMINAL_PUNCT_SCORE = pa.field("terminal_punct_score", pa.float64())


def terminal_punct_ratio(text: str, strip: bool) -> float:
    """Fraction of non-empty lines ending in terminal punctuation (0.0 for a text with none)."""
    lines = [line.rstrip() if strip else line for line in text.split("\n") if line.strip()]
    return sum(1 for line in lines if line.endswith(STOP_CHARS)) / len(lines) if lines else 0.0


class TerminalPunctConfig(ScoreFilterConfig):
    enabled: bool = False
    threshold: float = Field(0.12, ge=0, le=1, description="keep: threshold: keep documents with at least this "
                                                           "fraction of lines ending in . ! ? etc. (FineWeb: 0.12)")
    strip_trailing_space: bool = Field(True, description="ignore spaces after the punctuation (FineWeb does not)")


class TerminalPunctFilter(ScoreFilter):
    name = "terminal_punct"
    Config = TerminalPunctConfig
    score_field = TERMINAL_PUNCT_SCORE

    def score(self, batch: pa.Table) -> list[float]:
        strip = self.config.strip_trailing_space
        return [terminal_punct_ratio(text, strip) for text in batch.column("text").to_pylist()]
