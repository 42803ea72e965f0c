"""Stage `heuristics`: datatrove's Gopher repetition, Gopher quality, C4 and FineWeb filters, in
FineWeb's order, configured per language.

We use datatrove's filter classes as they are (their rules, their reason names) and add what a
curation run needs around them: one filter instance per document language (its tokeniser and Gopher
stop words from the language table, quipu.tasks.languages, not only English), a reason for every removal
(`<filter>:<rule>`, e.g. `gopher_quality:gopher_enough_stop_words`), and a per-document error
guard so one odd document cannot stop a shard. The C4 filter also edits text (drops lines without
terminal punctuation, citations, policy lines), so kept documents carry the edited text.
"""
from __future__ import annotations

import logging
import threading

from typing import Any, ClassVar, Literal

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

from quipu.tasks import gopher_counts, language_rules_fast, languages, spacy_chunks
from quipu.tasks.per_language import PerLanguage, check_language_code, resolve
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, RunContext, Stage, StageConfig, split_by_mask

log = logging.getLogger(__name__)

class _FilterConfig(BaseModel):
    """A filter's parameters: each a scalar or a per-language value (quipu.tasks.per_language).
    `OFF`: what a rule's parameter is when a language switches it off (`off`), where None is not
    already datatrove's "rule off"."""
    model_config = ConfigDict(extra="forbid")
    OFF: ClassVar[dict[str, Any]] = {"enabled": False}
    enabled: PerLanguage(bool) = True

    def for_language(self, lang: str | None) -> "_FilterConfig":
        """The parameters that apply to a document in `lang`, every one a scalar."""
        if not any(isinstance(v, dict) or (v is None and k in self.OFF) for k, v in self.__dict__.items()):
            return self
        return type(self).model_validate({k: resolve(v, lang, self.OFF.get(k)) for k, v in self.__dict__.items()})


NGramLimits = list[tuple[int, float]]


class GopherRepetitionConfig(_FilterConfig):
    OFF: ClassVar[dict[str, Any]] = {"enabled": False, "top_n_grams": [], "dup_n_grams": []}
    dup_line_frac: PerLanguage(float, ge=0, le=1) = 0.3
    dup_para_frac: PerLanguage(float, ge=0, le=1) = 0.3
    dup_line_char_frac: PerLanguage(float, ge=0, le=1) = 0.2
    dup_para_char_frac: PerLanguage(float, ge=0, le=1) = 0.2
    top_n_grams: PerLanguage(NGramLimits) = [(2, 0.2), (3, 0.18), (4, 0.16)]
    dup_n_grams: PerLanguage(NGramLimits) = [(5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)]


class GopherQualityConfig(_FilterConfig):
    min_doc_words: PerLanguage(int, ge=0) = 50
    max_doc_words: PerLanguage(int, ge=0) = 100_000
    min_avg_word_length: PerLanguage(float, ge=0) = 3.0
    max_avg_word_length: PerLanguage(float, ge=0) = 10.0
    max_symbol_word_ratio: PerLanguage(float, ge=0) = 0.1
    max_bullet_lines_ratio: PerLanguage(float, ge=0, le=1) = 0.9
    max_ellipsis_lines_ratio: PerLanguage(float, ge=0, le=1) = 0.3
    max_non_alpha_words_ratio: PerLanguage(float, ge=0, le=1) = Field(0.8, description="really a minimum: the share of words holding a letter (datatrove's name)")
    min_stop_words: PerLanguage(int, ge=0) = 2
    stop_words: list[str] | None = Field(None, description="default: the document language's list (heuristics.stop_words, else the language table's)")


class C4Config(_FilterConfig):
    OFF: ClassVar[dict[str, Any]] = {"enabled": False, "split_paragraph": True, "min_num_sentences": -1,
                                     "min_words_per_line": -1, "max_word_length": -1, **{k: False for k in (
                                         "remove_citations", "filter_no_terminal_punct", "filter_lorem_ipsum",
                                         "filter_javascript", "filter_curly_bracket", "filter_policy")}}
    split_paragraph: PerLanguage(bool) = True
    remove_citations: PerLanguage(bool) = True
    filter_no_terminal_punct: PerLanguage(bool) = False   # FineWeb's setting; C4's own is true
    min_num_sentences: PerLanguage(int) = 5
    min_words_per_line: PerLanguage(int) = 3
    max_word_length: PerLanguage(int) = 1000
    filter_lorem_ipsum: PerLanguage(bool) = True
    filter_javascript: PerLanguage(bool) = True
    filter_curly_bracket: PerLanguage(bool) = True
    filter_policy: PerLanguage(bool) = True


class FineWebConfig(_FilterConfig):
    OFF: ClassVar[dict[str, Any]] = {"enabled": False, "line_punct_thr": 0.0, "line_punct_exclude_zero": False,
                                     "short_line_thr": 1.0, "short_line_length": 0, "char_duplicates_ratio": 1.0,
                                     "new_line_ratio": float("inf")}
    line_punct_thr: PerLanguage(float) = 0.12
    line_punct_exclude_zero: PerLanguage(bool) = False
    short_line_thr: PerLanguage(float, ge=0, le=1) = 0.67
    short_line_length: PerLanguage(int, ge=0) = 30
    char_duplicates_ratio: PerLanguage(float, ge=0, le=1) = 0.01
    new_line_ratio: PerLanguage(float, ge=0) = 0.3


FILTERS: dict[str, tuple[type[_FilterConfig], str]] = {
    "gopher_repetition": (GopherRepetitionConfig, "datatrove.pipeline.filters:GopherRepetitionFilter"),
    # datatrove's GopherQualityFilter, its per-word tests cached (the same verdicts: tasks/gopher_quality_fast.py)
    "gopher_quality": (GopherQualityConfig, "quipu.tasks.gopher_quality_fast:GopherQualityFast"),
    # datatrove's C4QualityFilter, its sentence count stopped at min_num_sentences (the same verdicts
    # and texts: tasks/c4_fast.py)
    "c4": (C4Config, "quipu.tasks.c4_fast:C4QualityFast"),
    "fineweb": (FineWebConfig, "datatrove.pipeline.filters:FineWebQualityFilter"),
}


class HeuristicsConfig(StageConfig):
    compat: Literal["datatrove", "quipu"] = Field(
        "datatrove", description="datatrove: datatrove's filters and statistics as they are (spaCy words); "
                                 "quipu: the same rules with statistics that mean the same in every language "
                                 "(quipu.tasks.language_rules; what `quipu calibrate` measures)")
    gopher_repetition: GopherRepetitionConfig = GopherRepetitionConfig()
    gopher_quality: GopherQualityConfig = GopherQualityConfig()
    c4: C4Config = C4Config()
    fineweb: FineWebConfig = FineWebConfig()
    stop_words: dict[str, list[str]] = Field(
        default_factory=dict, description="Gopher stop words per language, in place of the language table's "
                                          "(quipu.tasks.languages), e.g. {es: [de, la, que, el, en, y, a, los]}")
    per_language: dict[str, dict[str, dict[str, Any]]] = Field(
        default_factory=dict,
        description="overrides per language, e.g. {es: {gopher_quality: {min_doc_words: 40}}}")

    @model_validator(mode="after")
    def _check_overrides(self):
        for lang in [*self.per_language, *self.stop_words]:
            check_language_code(lang)
        for lang, blocks in self.per_language.items():
            for name, values in blocks.items():
                if name not in FILTERS:
                    raise ValueError(f"per_language.{lang}.{name}: unknown filter (expected one of {', '.join(FILTERS)})")
                self.filter_config(name, lang)  # validates the merged values
        return self

    def filter_config(self, name: str, lang: str) -> _FilterConfig:
        """The filter's parameters for documents in `lang`: per-language values resolved, then the
        `per_language` block's overrides."""
        base = getattr(self, name).for_language(lang)
        override = self.per_language.get(lang, {}).get(name)
        if not override:
            return base
        return type(base).model_validate({**base.model_dump(), **override}).for_language(lang)


def build_chain(cfg: HeuristicsConfig, lang: str) -> list[tuple[str, Any]]:
    """The enabled filters for documents in `lang` (a language of the table), in FineWeb's order:
    datatrove's (`compat: datatrove`) or quipu's (`compat: quipu`: quipu.tasks.language_rules_fast, the
    same decisions and statistics as the reference rules in language_rules, computed once per word). The
    one builder of the chain: the stage's, and what `quipu calibrate` measures."""
    entry = languages.language(lang)
    chain = []
    for name, (_, spec) in FILTERS.items():
        fc = cfg.filter_config(name, lang)
        if not fc.enabled:
            continue
        kwargs = fc.model_dump(exclude={"enabled"})
        if name == "gopher_quality" and kwargs.get("stop_words") is None:
            kwargs["stop_words"] = cfg.stop_words.get(lang, list(entry.stop_words))
        if name == "gopher_repetition":
            kwargs["top_n_grams"] = tuple(tuple(x) for x in kwargs["top_n_grams"])
            kwargs["dup_n_grams"] = tuple(tuple(x) for x in kwargs["dup_n_grams"])
        if cfg.compat == "quipu":
            chain.append((name, language_rules_fast.RULES[name](language=lang, **kwargs)))
        else:
            chain.append((name, _import(spec)(language=entry.tokenizer, **kwargs)))
    return chain


def _import(spec: str):
    import importlib
    mod, cls = spec.split(":")
    return getattr(importlib.import_module(mod), cls)


# datatrove caches one spaCy tokenizer per language for the whole process, and spaCy's tokenizer is
# not thread-safe: two shard tasks on the thread pool corrupt each other's state (KeyError,
# ValueError, AssertionError inside the filters). Threads give no speed-up here anyway (GIL).
_TOKENIZER_LOCK = threading.Lock()


MAX_LEXEMES = 200_000    # per language tokenizer: ~90 MB of spaCy vocabulary


def use_tokenizer_cache(languages: set[str]) -> None:
    """spaCy's tokenizers with their cache on, memory bounded by a rebuild instead of memory zones.

    datatrove's spaCy tokenizer opens a memory zone around every call. Inside a zone spaCy neither
    keeps nor uses its per-chunk cache and builds a transient lexeme for every word it sees, so
    every word of every line is analysed from scratch (2-2.5x slower than spaCy with its cache,
    measured). Zones exist to bound memory on long runs; here the per-call zones are switched off
    and a language's tokenizer is rebuilt (`spacy.blank`, ~0.1 s) once its vocabulary holds
    MAX_LEXEMES entries. Tokens do not depend on the cache, so results are unchanged. Call under
    _TOKENIZER_LOCK, before a batch.
    """
    import contextlib
    from datatrove.utils.word_tokenizers import SpaCyTokenizer, load_word_tokenizer
    for lang in sorted(languages):
        try:
            tok = load_word_tokenizer(lang)
        except Exception:  # a language datatrove cannot tokenise: judge() reports it per document
            continue
        if not isinstance(tok, SpaCyTokenizer):
            continue
        if tok._tokenizer is not None and len(tok._tokenizer.vocab) > MAX_LEXEMES:
            tok._tokenizer = None           # datatrove's `tokenizer` property builds a fresh one
        nlp = tok.tokenizer
        if "memory_zone" not in nlp.__dict__:
            nlp.memory_zone = lambda mem=None: contextlib.nullcontext(mem)


class SharedTokens:
    """Each document is tokenised once for the whole filter chain.

    datatrove's filters split text through `datatrove.utils.text.split_into_parts`: Gopher asks
    for the document's words, C4 for the sentences of every line it keeps, FineWeb for the words
    of the text C4 left, and each call runs spaCy (tokenizer and sentencizer) again. spaCy splits
    text at every whitespace character before it looks at affixes, so no token crosses a line:
    a line's tokens are the document's tokens inside it. While a document is judged,
    `split_into_parts` therefore answers from one tokenisation of the document (`DocTokens`): words
    of any text made of its lines, and sentences of any of its lines by spaCy's `Sentencizer`
    rule; text that is not made of its lines (e.g. a line C4 cut a citation from) is tokenised on
    its own. Outside `judge` (datatrove used elsewhere in the process) it behaves exactly as
    before. The answers are datatrove's own (tests/test_heuristics.py compares them on the shared
    text), so decisions are unchanged.
    """
    _installed = False
    _memo: dict | None = None        # only touched under _TOKENIZER_LOCK
    _text: str | None = None         # the document being judged
    _docs: dict[str, "DocTokens"] = {}
    _stats: dict[int, "gopher_counts.WordStats"] = {}   # by id() of a word list in _memo

    @classmethod
    def install(cls) -> None:
        import datatrove.utils.text as dt_text
        from datatrove.utils.typeshelper import Languages
        with _TOKENIZER_LOCK:
            if not cls._installed:
                cls._install(dt_text, Languages)

    @classmethod
    def _install(cls, dt_text, Languages) -> None:
        original = dt_text.split_into_parts
        uncached = getattr(original, "__wrapped__", original)

        def split_into_parts(text, mode="DOCUMENT", language=Languages.english):
            memo = cls._memo
            if memo is None:
                return original(text, mode, language)
            key = (text, mode, language)
            if key not in memo:
                memo[key] = cls.parts(text, mode, language, uncached)
            return memo[key]

        split_into_parts.__wrapped__ = uncached
        dt_text.split_into_parts = split_into_parts
        gopher_counts.install(cls.word_stats)
        cls._installed = True

    @classmethod
    def word_stats(cls, words) -> "gopher_counts.WordStats | None":
        """Array form of a word list this class returned for the document being judged (None otherwise)."""
        if cls._memo is None:
            return None
        key = id(words)
        if key not in cls._stats:
            if not any(words is v for v in cls._memo.values()):
                return None
            cls._stats[key] = gopher_counts.WordStats(words)
        stats = cls._stats[key]
        return stats if stats.space_free else None

    @classmethod
    def judging(cls, text: str | None) -> None:
        """Start (a document's text) or end (None) answering for one document."""
        cls._memo = None if text is None else {}
        cls._text = text
        cls._docs = {}
        cls._stats = {}

    @classmethod
    def parts(cls, text: str, mode: str, language: str, uncached) -> list[str]:
        """datatrove's `split_into_parts(text, mode, language)`, from the document's tokens where it can."""
        from datatrove.utils.text import SPLIT_TEXT_SENTENCES, SPLIT_TEXT_WORDS
        from datatrove.utils.word_tokenizers import SpaCyTokenizer, load_word_tokenizer
        if mode not in (SPLIT_TEXT_WORDS, SPLIT_TEXT_SENTENCES):
            return uncached(text, mode, language)
        tok = load_word_tokenizer(language)
        if not isinstance(tok, SpaCyTokenizer) or tok.language == "ja":   # ja is tokenised in chunks
            return uncached(text, mode, language)
        doc = cls._docs.get(language)
        if doc is None:
            doc = cls._docs[language] = DocTokens.of(cls._text, tok.tokenizer)
        if doc is None:     # the tokenizer failed on the document: datatrove's path handles or raises
            return uncached(text, mode, language)
        if mode == SPLIT_TEXT_WORDS:
            if text == doc.text:
                return doc.words(0, len(doc.idx))
            words: list[str] = []
            for part in text.split("\n"):          # tokens never cross a newline (see above)
                where = doc.find_line(part)
                if where is not None:
                    words += doc.words(*where[1:])
                elif part.strip():
                    own = DocTokens.of(part, tok.tokenizer)
                    if own is None:
                        return uncached(text, mode, language)
                    words += own.words(0, len(own.idx))
            return words
        where = doc.find_line(text)
        if where is None:
            own = DocTokens.of(text, tok.tokenizer)
            if own is None:
                return uncached(text, mode, language)
            doc, where = own, (0, 0, len(own.idx))
        return doc.sentences(text, *where)


class DocTokens:
    """A text's spaCy tokens as arrays (char offset, length, orth hash, is_punct), with its lines."""

    def __init__(self, text: str, arr, punct_chars: frozenset):
        import numpy as np
        self.text = text
        self.idx, self.length = arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64)
        hashes = _punct_hashes(punct_chars)                               # sorted: a binary search
        where = np.minimum(np.searchsorted(hashes, arr[:, 2]), max(len(hashes) - 1, 0))
        self.final = (hashes[where] == arr[:, 2]) if len(hashes) else np.zeros(len(arr), bool)   # sentence-final
        self.plain = ~self.final & (arr[:, 3] == 0)                      # neither that nor punctuation
        self._lines: dict[str, int] | None = None
        self._tokens: list[str] | None = None

    @classmethod
    def of(cls, text: str, nlp) -> "DocTokens | None":
        """spaCy's tokens of `text`, each distinct whitespace-separated piece tokenised once (the same
        tokens: tasks/spacy_chunks.py)."""
        try:
            chunks = spacy_chunks.for_tokenizer(nlp.tokenizer)
            arr = chunks.arrays(text) if chunks is not None else spacy_chunks.token_array(nlp.tokenizer, text)
        except Exception:
            return None
        return cls(text, arr, frozenset(nlp.get_pipe("sentencizer").punct_chars))

    def find_line(self, part: str) -> tuple[int, int, int] | None:
        """(char offset, first token, end token) of `part` if it is one of the text's lines, stripped."""
        import numpy as np
        if self._lines is None:
            self._lines, pos = {}, 0
            for line in self.text.splitlines(keepends=True):
                stripped = line.strip()
                if stripped and stripped not in self._lines:
                    self._lines[stripped] = pos + len(line) - len(line.lstrip())
                pos += len(line)
        start = self._lines.get(part)
        if start is None:
            return None
        a, b = np.searchsorted(self.idx, [start, start + len(part)])
        return start, int(a), int(b)

    def words(self, first: int, end: int) -> list[str]:
        """The token texts, stripped, empty ones dropped (datatrove's `strip_strings`)."""
        if self._tokens is None:        # every token once: the filters ask for the words of many lines
            text = self.text
            self._tokens = list(map(str.strip, map(text.__getitem__, map(slice, self.idx.tolist(),
                                                                           (self.idx + self.length).tolist()))))
        return list(filter(None, self._tokens[first:end]))

    def sentences(self, part: str, start: int, first: int, end: int) -> list[str]:
        """`part` (at `start`, tokens first..end) cut into sentences as datatrove does: spaCy's
        `Sentencizer` (a plain token starts a sentence if a sentence-final character came since the
        last start), then `span_tokenize` + `split_into_parts` (cut at each sentence's end but the last)."""
        import numpy as np
        final, plain = self.final[first:end], self.plain[first:end]
        events = np.flatnonzero(final | plain)
        kinds = final[events]
        starts = events[1:][kinds[:-1] & ~kinds[1:]]
        last = np.append(starts - 1, end - first - 1) + first if end > first else np.zeros(0, np.int64)
        ends = (self.idx[last] + self.length[last] - start).tolist()
        return [part[a:b] for a, b in zip([0] + ends[:-1], ends[:-1] + [len(part)])]


_PUNCT_HASHES: dict[frozenset, object] = {}


def _punct_hashes(punct_chars: frozenset):
    import numpy as np
    if punct_chars not in _PUNCT_HASHES:
        from spacy.strings import hash_string
        _PUNCT_HASHES[punct_chars] = np.array(sorted(hash_string(c) for c in punct_chars), np.uint64)
    return _PUNCT_HASHES[punct_chars]


class HeuristicFilters(Stage):
    name = "heuristics"
    Config = HeuristicsConfig

    def __init__(self, config: HeuristicsConfig, context: RunContext | None = None):
        super().__init__(config, context)
        self._chains: dict[str, list[tuple[str, Any]]] = {}
        SharedTokens.install()

    def chain(self, lang: str) -> list[tuple[str, Any]]:
        """The enabled filters for one language, built once."""
        if lang not in self._chains:
            self._chains[lang] = build_chain(self.config, lang)
        return self._chains[lang]

    def judge(self, text: str, lang: str, doc_id: str) -> tuple[str, str | None]:
        """(possibly edited text, removal reason or None)."""
        from datatrove.data import Document
        if languages.language(lang) is None:
            return text, f"no_language_entry:{lang}"
        doc = Document(text=text, id=doc_id)
        chain = self.chain(lang)
        with _TOKENIZER_LOCK:
            return self._judge(doc, chain)

    def _judge(self, doc, chain) -> tuple[str, str | None]:
        """The chain over one datatrove Document; the caller holds _TOKENIZER_LOCK."""
        SharedTokens.judging(doc.text)
        try:
            for name, flt in chain:
                try:
                    verdict = flt.filter(doc)
                except Exception as e:  # a rule that cannot evaluate this document removes it, visibly
                    return doc.text, f"{name}:error:{type(e).__name__}"
                ok, rule = verdict if isinstance(verdict, tuple) else (verdict, None)
                if not ok:
                    return doc.text, f"{name}:{rule or 'failed'}"
        finally:
            SharedTokens.judging(None)
        return doc.text, None

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        texts = batch.column("text").to_pylist()
        ids = batch.column("id").to_pylist()
        langs = batch.column("lang").to_pylist() if "lang" in batch.column_names else ["en"] * len(texts)
        from datatrove.data import Document
        new_texts, keep, reasons = [], [], []
        langs = [lang or "en" for lang in langs]
        # a language with no entry in the table has no lists to be judged by: removed, named, counted
        chains = {lang: self.chain(lang) for lang in set(langs) if languages.language(lang)}
        no_entry = {lang: langs.count(lang) for lang in sorted(set(langs) - set(chains))}
        tok_langs = {languages.language(lang).tokenizer for lang in chains}
        # one lock for the whole batch; spaCy's cache on, its memory bounded (see use_tokenizer_cache)
        with _TOKENIZER_LOCK:
            if self.config.compat == "datatrove":
                use_tokenizer_cache(tok_langs)
            verdicts = [self._judge(Document(text=text, id=doc_id), chains[lang]) if lang in chains
                        else (text, f"no_language_entry:{lang}") for text, lang, doc_id in zip(texts, langs, ids)]
        for text, (new_text, reason) in zip(texts, verdicts):
            keep.append(reason is None)
            reasons.append(reason)
            # removed documents keep their original text, so users see what the rule saw
            new_texts.append(new_text if reason is None else text)
        batch = set_column(batch, pa.field("text", pa.string(), nullable=False), new_texts)
        kept, removed = split_by_mask(batch, keep, reasons)
        edited = sum(1 for a, b, k in zip(texts, new_texts, keep) if k and a != b)
        stats = {"edited_by_c4": edited, "edits": {"documents edited by c4": edited}}
        if no_entry:
            stats["no_language_entry"] = no_entry
            log.warning("heuristics: %s documents in %s, which the language table (quipu.tasks.languages) has no "
                        "entry for, removed as no_language_entry:<lang> (add the language: docs/languages.md)",
                        sum(no_entry.values()), ", ".join(no_entry))
        return Outcome(kept, removed, stats)

