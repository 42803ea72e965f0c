"""text_repair's shortcut (`_untouched`: ftfy is skipped on text it cannot change) gives what ftfy
gives: on real en/es/pt text, on that text turned into mojibake, and on each character class that
makes one of ftfy's fixers act."""
from __future__ import annotations

import json
import re
import unicodedata

import pytest

from quipu.tasks import text_repair
from quipu.tasks.text_repair import repair_unicode


def ftfy_only(text: str) -> tuple[str, str | None]:
    """repair_unicode without the shortcut: ftfy on every non-ASCII text."""
    if text.isascii():
        return text, None
    fixed = text_repair._formatter().format(text)
    if fixed == text:
        return text, None
    return fixed, ("nfc" if fixed == unicodedata.normalize("NFC", text) else "mojibake")


def real_texts(root, per_file: int = 40, chars: int = 6000) -> list[str]:
    texts = []
    for path in sorted((root / "text").glob("*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for _, line in zip(range(per_file), fh):
                texts.append(json.loads(line)["text"][:chars])
    return texts


def damaged(text: str, i: int) -> str:
    """Real text with one kind of damage in its middle: mojibake, NFD, a control character,..."""
    mid = len(text) // 2
    kind = i % 6
    if kind == 0:
        piece = text[mid:mid + 200]
        return text[:mid] + piece.encode("utf-8").decode("latin-1", "replace") + text[mid + 200:]
    if kind == 1:
        piece = text[mid:mid + 200]
        return text[:mid] + piece.encode("utf-8").decode("cp1252", "replace") + text[mid + 200:]
    if kind == 2:
        return unicodedata.normalize("NFD", text)
    return text[:mid] + ["\x07", "\x1b[31m", "\ud83d", "\x92"][kind - 3] + text[mid:]


def test_shortcut_matches_ftfy_on_real_and_damaged_text(shared_data):
    texts = real_texts(shared_data)
    assert sum(not t.isascii() for t in texts) > 100      # es/pt text: accents, curly quotes
    texts += [damaged(t, i) for i, t in enumerate(texts) if not t.isascii()]
    kinds = {None: 0, "nfc": 0, "mojibake": 0}
    for t in texts:
        got = repair_unicode(t)
        assert got == ftfy_only(t), t[:200]
        kinds[got[1]] += 1
    assert kinds["mojibake"] > 20 and kinds["nfc"] > 20 and kinds[None] > 100, kinds


@pytest.mark.parametrize("text", [
    "Ã sÃ³ isso", "texto\nÃ volta", "naÃ¯ve cafÃ©", "SÃ£o Paulo", "precio 10 â‚¬", "line\x85end",
    "ESC \x1b[1mbold\x1b[0m é", "zero\ufeffwidth é", "lone \udc00 surrogate é", "cafe\u0301", "Œ 1",
    "×²", "ГўВЂВ\x9dx", "x" * 30 + "Ã" + "\xa0" + "y" * 30, "word Â word",
])
def test_shortcut_leaves_every_trigger_to_ftfy(text):
    assert not text_repair._untouched(text)
    assert repair_unicode(text) == ftfy_only(text)


def test_badness_branches_need_a_non_ascii_character():
    """`_looks_bad` searches only near non-ASCII runs: no class of ftfy's BADNESS_RE holds ASCII."""
    from ftfy.badness import MOJIBAKE_CATEGORIES
    for name, chars in MOJIBAKE_CATEGORIES.items():
        assert not re.search(f"[{chars}]", "".join(map(chr, range(128)))), name
    from ftfy.badness import BADNESS_RE
    long = "a" * 50 + "Ãé" + "b" * 50      # a match far from the text's ends is found in its window
    assert bool(text_repair._looks_bad(long, BADNESS_RE)) == bool(BADNESS_RE.search(long))
