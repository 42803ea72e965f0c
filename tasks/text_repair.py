"""Unicode repair of extracted text (`extract.fix_unicode`): ftfy's mojibake fixes, then NFC.

Mojibake (UTF-8 read as Latin-1 or Windows-1252: "SÃ£o Paulo", "naÃ¯ve") is common in crawls and
dumps of Spanish and Portuguese text, and splits one word into several rare tokens. We use
datatrove's `FTFYFormatter` (FineWeb's choice of ftfy options: encoding fixes on; curly quotes,
full-width characters, ligatures and line breaks left as written), with two changes: HTML entities
are not unescaped (extraction already did; a JSONL record's `&amp;` may be meant) and the text is
NFC-normalised, so "é" is one code point whatever the source wrote.
"""
from __future__ import annotations

import unicodedata
from functools import lru_cache


@lru_cache(maxsize=1)
def _formatter():
    from datatrove.pipeline.formatters.ftfy import FTFYFormatter
    return FTFYFormatter(unescape_html=False, normalization="NFC")


def repair_unicode(text: str) -> tuple[str, str | None]:
    """(repaired text, what changed: "mojibake" (more than normalisation), "nfc", or None)."""
    if text.isascii():
        return text, None   # nothing to fix, and the common case by far
    fixed = _formatter().format(text)
    if fixed == text:
        return text, None
    return fixed, ("nfc" if fixed == unicodedata.normalize("NFC", text) else "mojibake")
