"""Unicode repair of extracted text (`extract.fix_unicode`): ftfy's mojibake fixes, then NFC.

Mojibake (UTF-8 read as Latin-1 or Windows-1252: "SÃ£o Paulo", "naÃ¯ve") is common in crawls and
dumps of Spanish and Portuguese text, and splits one word into several rare tokens. We use
datatrove's `FTFYFormatter` (FineWeb's choice of ftfy options: encoding fixes on; curly quotes,
full-width characters, ligatures and line breaks left as written), with two changes: HTML entities
are not unescaped (extraction already did; a JSONL record's `&amp;` may be meant) and the text is
NFC-normalised, so "é" is one code point whatever the source wrote.

ftfy fixes a text line by line in Python: about 2 ms for a news article, as much as resiliparse
takes to extract it. Most non-ASCII text has nothing to fix, and `_untouched` proves that with a
few C-speed scans of the whole text, so ftfy runs only on text it could change (same result:
tests/test_text_repair.py compares both on real text and on every trigger).
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache


@lru_cache(maxsize=1)
def _formatter():
    from datatrove.pipeline.formatters.ftfy import FTFYFormatter
    return FTFYFormatter(unescape_html=False, normalization="NFC")


@lru_cache(maxsize=1)
def _triggers() -> tuple[re.Pattern, re.Pattern]:
    """(characters one of ftfy's enabled fixers acts on, its mojibake detector).

    With unescape_html off, a line that is NFC, holds none of the characters below and does not
    match ftfy's `BADNESS_RE` comes back from `fix_and_explain` unchanged: `fix_encoding` starts
    only where `is_bad` (that regex) matches, C1 controls are in it too, and the other enabled
    fixers act on surrogates, ESC (terminal escapes) and the control characters `CONTROL_CHARS`
    lists. A regex that finds no match in the whole text finds none in any of its lines, except
    for its `^[ÃÂ][ ]` branch (anchored at a line's start): "[ÃÂ] " anywhere counts as a trigger."""
    from ftfy.badness import BADNESS_RE
    from ftfy.chardata import CONTROL_CHARS
    chars = "".join(re.escape(chr(c)) for c in sorted(CONTROL_CHARS))
    return re.compile(f"[{chars}\\x1b\\x80-\\x9f\\ud800-\\udfff]|[ÃÂ] "), BADNESS_RE


_NON_ASCII = re.compile(r"[^\x00-\x7f]+")
# Every branch of ftfy's BADNESS_RE holds a non-ASCII character (its character classes hold no
# ASCII: tests/test_text_repair.py checks) and matches at most 7 characters, so a match lies
# within BADNESS_REACH characters of a non-ASCII run.
BADNESS_REACH = 8


def _looks_bad(text: str, badness: re.Pattern) -> bool:
    """`badness.search(text)`, searched only around the text's non-ASCII characters: the whole
    text costs ~1.5 ms a page at this regex's ~40 branches, the windows a tenth of that."""
    start = end = None
    for run in _NON_ASCII.finditer(text):
        a, b = max(0, run.start() - BADNESS_REACH), run.end() + BADNESS_REACH
        if end is not None and a > end:
            if badness.search(text, start, end):
                return True
            start = None
        if start is None:
            start = a
        end = b
    return start is not None and badness.search(text, start, end) is not None


def _untouched(text: str) -> bool:
    """ftfy (our config) would return `text` as it is (see `_triggers`)."""
    from ftfy import TextFixerConfig
    if len(text) > TextFixerConfig().max_decode_length:   # ftfy also cuts inside such a long line
        return False
    chars, badness = _triggers()
    return unicodedata.is_normalized("NFC", text) and not chars.search(text) and not _looks_bad(text, badness)


def repair_unicode(text: str) -> tuple[str, str | None]:
    """(repaired text, what changed: "mojibake" (more than normalisation), "nfc", or None)."""
    if text.isascii() or _untouched(text):
        return text, None   # nothing to fix, and the common case by far
    fixed = _formatter().format(text)
    if fixed == text:
        return text, None
    return fixed, ("nfc" if fixed == unicodedata.normalize("NFC", text) else "mojibake")
