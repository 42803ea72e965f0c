"""tasks/spacy_chunks.py gives spaCy's own tokens (offset, length, orth, is_punct), for every
language `compat: datatrove` tokenises with spaCy: adversarial text (special cases cut across
pieces, URLs, emoji, contractions, numbers, quotes, odd whitespace, mixed scripts), seeded random
mixes of the tokenizers' own special-case patterns, and real shared text. bench/heuristics_speed.py
--check-tokens compares every shared document."""
from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
from datatrove.utils.word_tokenizers import load_word_tokenizer

from quipu.tasks import spacy_chunks
from quipu.tasks.languages import LANGUAGES

LANGS = sorted({entry.tokenizer for entry in LANGUAGES.values()})     # every spaCy language we serve

ADVERSARIAL = [
    "", " ", "  ", "\n", " \n ", "\t\t", "\u00a0", " a", "  a  ", "\na\n", "a  b", "a \n b", "a\u00a0b", "a \u00a0 b",
    "a\u2028b\u2029c\x0b\x0c\x1c\x1dd\x85e\u3000f", "\u200b zero\u200bwidth",
    "Visit https://example.com/a-b?x=1&y=2#frag, or www.foo.org. Mail me: a.b@c.de!",
    "I can't, won't, don't; cannot gonna wanna 'cause he's y'all ain't it's o'clock.",
    "Can't CANNOT Gonna 'Cause 'S 'em 'bout rock'n'roll",
    "well-known state-of-the-art e-mail co-op -- dash — em–en ‐ hyphen",
    "1,000.50 1.000,50 10km 5kg 3.5% $20 €15,99 +34 600 123 456 1/2 10:30 2024-01-01 #1 № 5",
    "\"quoted\" 'single' «guillemets» „low“ ‘curly’ ''double'' ``tex'' (paren) [br] {curly}",
    "Emoji 😀😀 👍🏽 🇪🇸 ❤️ :) :-) ;) :( :'( (: ): :P <3 ^_^ (-_-) (╯°□°）╯︵┻━┻ ._. ¯\\_(ツ)_/¯",
    ": ) ; ) ( : ' s ' em 10 a.m. 10a.m. 10 p.m. a.m. p.m. e.g. i.e. etc. vs. Mr. Dr. Sra. Dña. EE. UU. Ee. Uu.",
    "EE. UU. EE.\nUU. EE.  UU. EE.UU. (EE. UU.) EE. UU.: ee. uu.",
    "Mixed Кириллица 中文字符 العربية עברית ελληνικά हिन्दी 日本語テキスト 한국어 ไทย",
    "...word... ..word .. . . . ! ? ¿Qué? ¡Hola! ¿¡no!? a.b.c. U.S.A. S.A. Ltda. n.º 3.º 1.ª",
    "l'home d'aquí qui-sap-lo dóna-m'ho porta'ns l·l col·lecció s'ha n'hi",
    "dá-lo fá-lo-ia vê-lo-ás disse-me d'água pra'quele à às",
    "tabs\tbetween\twords\t\tand\r\nwindows\rlines\n\n\nparagraph",
    "x" * 300 + " " + "y-" * 100 + " " + "😀" * 50,
]


def tokenizers():
    for lang in LANGS:
        tok = load_word_tokenizer(lang)
        yield lang, tok.tokenizer.tokenizer


def same(chunks, text: str) -> bool:
    got, ref = chunks.arrays(text), spacy_chunks.token_array(chunks.tokenizer, text)
    return got.shape == ref.shape and bool((got == ref).all())


def mixes(tokenizer, n: int, seed: int) -> list[str]:
    """Texts of the tokenizer's own special-case patterns, their pieces and common words, joined by
    random whitespace: matches across pieces, next to each other and overlapping."""
    rng = random.Random(seed)
    patterns = spacy_chunks.multi_token_patterns(tokenizer)
    keys = sorted(tokenizer.rules)
    words = ["a", "o", "e", "s", "he", "it", "the", "and", "EE.", "UU.", "(", ")", ":", "'", ".", "-", "word.",
             "x:", "(y", "10", "a.m", "dijo:", "''Yo,"]
    seps = [" ", " ", " ", "  ", "\n", " \n", "\t", "\u00a0", " \u00a0 ", ""]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            kind = rng.random()
            if kind < 0.4:
                parts.extend(rng.choice(patterns))
            elif kind < 0.7:
                parts.append(rng.choice(keys))
            else:
                parts.append(rng.choice(words))
        out.append(rng.choice(["", " ", "\n"]) + "".join(p + rng.choice(seps) for p in parts))
    return out


def test_whitespace_split_is_spacys():
    """spaCy cuts at `str.isspace`; the pieces are cut at `\\s`: the same code points."""
    regex = re.compile(r"\s")
    assert all(bool(regex.match(chr(c))) == chr(c).isspace() for c in range(0x110000))


@pytest.mark.parametrize("lang", LANGS)
def test_adversarial_text_gives_spacys_tokens(lang):
    chunks = spacy_chunks.for_tokenizer(load_word_tokenizer(lang).tokenizer.tokenizer)
    for text in ADVERSARIAL + [" ".join(ADVERSARIAL), "\n".join(ADVERSARIAL)]:
        assert same(chunks, text), (lang, text)
        assert same(chunks, text), (lang, text)        # again, from the pieces it now knows
    for text in mixes(chunks.tokenizer, 150, seed=40):
        assert same(chunks, text), (lang, text)


def test_crossing_special_cases_are_needed_and_found():
    """Spanish `EE. UU.` is one special case over two pieces and `: )` a pattern spaCy matches across
    a space: without the crossing test the tokens would differ (so the tests above can fail)."""
    es = load_word_tokenizer("es").tokenizer.tokenizer
    chunks = spacy_chunks.ChunkTokens(es)
    text = "Viajó a EE. UU. ayer"
    assert same(chunks, text)
    assert [text[a:a + n] for a, n, *_ in chunks.arrays(text).tolist()] == ["Viajó", "a", "EE. UU.", "ayer"]
    blind = spacy_chunks.ChunkTokens(es)
    blind._by_last, blind._by_first = {}, {}      # no crossing test
    assert not same(blind, text)
    texts = mixes(es, 300, seed=41)
    assert not all(same(blind, t) for t in texts)       # the random mixes hit crossings too
    assert all(same(chunks, t) for t in texts)


def test_real_text_gives_spacys_tokens(shared_data):
    for lang, tokenizer in tokenizers():
        chunks = spacy_chunks.for_tokenizer(tokenizer)
        for path in sorted((shared_data / "text").glob("*.jsonl")):
            with open(path, encoding="utf-8") as fh:
                for _, line in zip(range(4), fh):
                    text = json.loads(line)["text"][:8000]
                    assert same(chunks, text), (lang, path.name, text[:200])


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(spacy_chunks, "MAX_PIECES", 50)
    chunks = spacy_chunks.ChunkTokens(load_word_tokenizer("en").tokenizer.tokenizer)
    text = " ".join(f"w{i}, x{i}." for i in range(200))
    assert same(chunks, text) and same(chunks, text)
    assert len(chunks._known) <= 50 + 400 + 3
    assert same(chunks, "fresh words here") and len(chunks._known) < 10
    assert np.array_equal(chunks.arrays(text), spacy_chunks.token_array(chunks.tokenizer, text))


def test_words_learnt_one_by_one_or_together_agree():
    """New words go to spaCy together, one per line (no pattern holds a newline token); the same
    tokens as one spaCy call per piece."""
    en = load_word_tokenizer("eng").tokenizer.tokenizer
    together, alone = spacy_chunks.ChunkTokens(en), spacy_chunks.ChunkTokens(en)
    alone._batch = False
    assert together._batch
    for text in ADVERSARIAL + mixes(en, 60, seed=42):
        assert np.array_equal(together.arrays(text), alone.arrays(text)) and same(together, text), text
