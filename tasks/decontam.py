"""Stage `decontam`: remove evaluation-set text (GSM8K, HumanEval, MMLU, ...) from the corpus.

Benchmarks come from the YAML registry (`tasks.benchmarks`). Their text is normalised (Unicode
NFKC, lowercase by `casefold`, punctuation and whitespace folded: a word is a run of letters,
digits and marks) and every item's word n-grams (n = 13 by default) are hashed into ONE index
across all benchmarks: sorted 64-bit keys with postings (key -> items). A field shorter than n
words is matched as a whole contiguous word sequence, through the hash of its first
`min_short_words` words and a check of the rest; fields shorter than `min_short_words` (e.g.
`return x`) are too common to match safely and are counted in the index instead.

Scanning is batched: a shard batch is normalised and split into words in one pass (polars' regex
over the whole batch), words become 64-bit hashes through the index's vocabulary (a word no
benchmark has gets 0 and no window through it can match), window hashes are computed with numpy
for the whole batch at once and looked up by binary search in the sorted keys. The cost per
document is a hash per window whatever the number of benchmarks. Only documents with a hit are
tokenised again with character offsets, to report and cut the matched spans.

Policies: `drop` removes a document with a hit (reason `contaminated:<benchmark>`, the benchmark
with the most matched words); `cut` removes the matched spans plus `cut_margin_words` on each side
and keeps the rest, recording what was cut in `decontam_cuts` (a document left with fewer than
`min_words_after_cut` words is dropped). Every row gets `decontam_hits`: a JSON list of
{benchmark, item, start, end} (character offsets in the text as the stage read it).

The index is built once per benchmark set and cached on disk under a key made of the benchmark
files' SHA-256, the fields and the matching parameters; a changed benchmark file gives a new key,
and the key is part of the stage fingerprint, so finished shards are redone against the new version.
"""
from __future__ import annotations

import json
import re
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from quipu.catalog.files import atomic_path, read_json, sha256_json, write_json_atomic
from quipu.tasks.benchmarks import Benchmark, load_benchmarks
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, RunContext, Stage, StageConfig, snippet, split_by_mask

INDEX_VERSION = 2     # 2: NFKD, homoglyphs, accents and punctuation deleted
WORD = r"[\p{L}\p{N}]+"                   # a word: letters and digits, after normalisation (Rust regex)
# Pieces of the original text that normalise independently: punctuation no longer separates words
# (it is deleted), so only whitespace does.
# Punctuation is deleted, joining what it stood between ("don't" = "dont", "1/5" = "15"): copies
# lose punctuation far more often than they gain spaces. So only whitespace separates words.
CHUNK = re.compile(r"\S+")
EXAMPLES_PER_BENCHMARK = 3
HITS = pa.field("decontam_hits", pa.string())
CUTS = pa.field("decontam_cuts", pa.string())

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_PRIME = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class DecontamConfig(StageConfig):
    benchmarks: list[str] = Field(default_factory=lambda: ["humaneval"], min_length=1,
                                  description="registry names (configs/benchmarks/<name>.yaml) or paths of benchmark YAML files")
    registry_dir: str | None = Field(None, description="directory of benchmark YAML files; default: configs/benchmarks")
    n: int = Field(13, ge=3, le=64, description="n-gram length in words")
    min_short_words: int = Field(8, ge=1, description="fields shorter than n words are matched whole if they have at least this many words")
    policy: Literal["drop", "cut"] = Field("drop", description="drop the document, or cut the matched spans and keep the rest")
    cut_margin_words: int = Field(5, ge=0, description="words removed on each side of a matched span (policy cut)")
    min_words_after_cut: int = Field(20, ge=0, description="a cut document left with fewer words is dropped")
    cache_dir: str | None = Field(None, description="where built indexes are kept; default $QUIPU_HOME/cache/decontam")

    @model_validator(mode="after")
    def _check(self):
        if self.min_short_words > self.n:
            raise ValueError(f"min_short_words ({self.min_short_words}) must not exceed n ({self.n})")
        if len(set(self.benchmarks)) != len(self.benchmarks):
            raise ValueError("benchmarks: a benchmark is listed twice")
        return self


# ---- normalisation and hashing ----------------------------------------------------------------

# Latin look-alikes from Cyrillic and Greek (both cases, applied before casefold): a copied item
# with a few letters swapped for homoglyphs must still match. Legitimate Cyrillic/Greek text maps
# the same way in documents and benchmarks alike, so only matching is affected.
HOMOGLYPHS = str.maketrans({
    # Cyrillic
    "\u0410": "A", "\u0412": "B", "\u0415": "E", "\u0405": "S", "\u0406": "I", "\u0408": "J", "\u041a": "K",
    "\u041c": "M", "\u041d": "H", "\u041e": "O", "\u0420": "P", "\u0421": "C", "\u0422": "T", "\u0425": "X",
    "\u0423": "Y", "\u0430": "a", "\u0435": "e", "\u043e": "o", "\u0440": "p", "\u0441": "c", "\u0443": "y",
    "\u0445": "x", "\u0455": "s", "\u0456": "i", "\u0458": "j", "\u0501": "d", "\u04bb": "h", "\u04cf": "l",
    "\u051b": "q", "\u051d": "w",
    # Greek
    "\u0391": "A", "\u0392": "B", "\u0395": "E", "\u0396": "Z", "\u0397": "H", "\u0399": "I", "\u039a": "K",
    "\u039c": "M", "\u039d": "N", "\u039f": "O", "\u03a1": "P", "\u03a4": "T", "\u03a5": "Y", "\u03a7": "X",
    "\u03b1": "a", "\u03b9": "i", "\u03bf": "o", "\u03bd": "v", "\u03c1": "p", "\u03c4": "t", "\u03c5": "u",
    "\u03c7": "x", "\u03f2": "c", "\u03ba": "k",
    # Latin variants
    "\u0261": "g", "\u0131": "i",
})
MAX_MARKS = 8     # combining marks kept per base character (Zalgo text has hundreds)


def split_words(texts: list[str]) -> tuple[pa.Array, np.ndarray]:
    """Normalised words of every text (flat) and the index of the text each word came from.

    Documents and benchmark items go through the same steps, so that the usual manglings of copied
    text leave the words unchanged: runs of combining marks are capped (NFKD reorders a run in
    quadratic time: 200,000 marks took 28 s); NFKD (full-width and compatibility forms to their
    plain letters, accents split off); Cyrillic/Greek homoglyphs to Latin; casefold (also ß/ss);
    then every character that is not a letter, digit or whitespace is deleted (accents, and
    punctuation inside and between words: "don't" and "dont", "e-mail" and "email" are one word)
    and words are the runs of letters and digits between whitespace (polars' Rust regex)."""
    capped = pl.Series("t", texts, dtype=pl.String).fill_null("").str.replace_all(
        r"(\p{M}{%d})\p{M}+" % MAX_MARKS, "$1")
    norm = [unicodedata.normalize("NFKD", t).translate(HOMOGLYPHS).casefold() for t in capped.to_list()]
    lists = (pl.Series("t", norm, dtype=pl.String).str.replace_all(r"[^\p{L}\p{N}\s]+", "")
             .str.extract_all(WORD))
    counts = lists.list.len().fill_null(0).to_numpy().astype(np.int64)
    words = lists.explode().drop_nulls().to_arrow().cast(pa.string())
    return words, np.repeat(np.arange(len(texts), dtype=np.int64), counts)


def normalize(text: str) -> str:
    """The normalised text (words joined by spaces): what the index sees."""
    words, _ = split_words([text])
    return " ".join(words.to_pylist())


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: spreads structured integers over all 64 bits."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def windows(h: np.ndarray, length: int) -> np.ndarray:
    """Start of every window of `length` words holding no 0 (an unknown word or a separator)."""
    m = len(h) - length + 1
    if m <= 0:
        return np.zeros(0, np.int64)
    zeros = np.concatenate([[0], np.cumsum(h == 0)])
    return np.nonzero(zeros[length:length + m] == zeros[:m])[0]


def window_keys(h: np.ndarray, pos: np.ndarray, length: int) -> np.ndarray:
    """64-bit key of the windows of `length` word hashes starting at `pos`: a polynomial hash
    salted by the length and mixed, computed for all windows of the batch at once."""
    with np.errstate(over="ignore"):
        g = np.zeros(len(pos), np.uint64)
        for j in range(length):
            g = g * _PRIME + h[pos + j]
        return _mix(g ^ (np.uint64(length) * _GOLDEN))


def layout(parents: np.ndarray) -> np.ndarray:
    """Position of each word in the batch sequence: texts one after another, a 0 after each."""
    return np.arange(len(parents), dtype=np.int64) + parents


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, e) for each pair (vectorised)."""
    counts = ends - starts
    if counts.sum() == 0:
        return np.zeros(0, np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    return np.arange(counts.sum(), dtype=np.int64) + offsets


# ---- the index --------------------------------------------------------------------------------

@dataclass
class BenchmarkIndex:
    """All benchmarks' n-grams and short fields, one set of sorted keys with postings."""
    key: str
    n: int
    min_short: int
    benchmarks: list[dict]           # Benchmark.describe() of each, in index order
    item_bench: np.ndarray           # item -> benchmark number
    item_ids: list[str]
    vocab: pa.Array                  # sorted distinct words
    word_hash: np.ndarray            # vocab position -> nonzero 64-bit hash
    ngram_keys: np.ndarray           # sorted unique
    ngram_start: np.ndarray          # CSR into ngram_items
    ngram_items: np.ndarray
    prefix_keys: np.ndarray          # hash of the first min_short words of each short field, sorted unique
    prefix_start: np.ndarray         # CSR into prefix_patterns
    prefix_patterns: np.ndarray
    pattern_item: np.ndarray         # short field -> item
    pattern_start: np.ndarray        # short field -> its word hashes in pattern_words
    pattern_len: np.ndarray
    pattern_words: np.ndarray
    skipped_fields: dict[str, int]   # per benchmark: fields too short to match safely

    @property
    def bench_names(self) -> list[str]:
        return [b["name"] for b in self.benchmarks]

    # -- building --
    @classmethod
    def build(cls, benchmarks: list[Benchmark], n: int, min_short: int, key: str) -> "BenchmarkIndex":
        benchmarks = sorted(benchmarks, key=lambda b: b.name)
        item_bench, item_ids, seg_texts, seg_item = [], [], [], []
        for bi, b in enumerate(benchmarks):
            for item in b.items:
                ii = len(item_ids)
                item_ids.append(item.id)
                item_bench.append(bi)
                for t in item.texts:
                    seg_texts.append(t)
                    seg_item.append(ii)
        words, parents = split_words(seg_texts)
        vocab = pc.unique(words)
        vocab = vocab.take(pc.sort_indices(vocab))
        word_hash = _mix(np.arange(1, len(vocab) + 1, dtype=np.uint64) + _GOLDEN)
        word_hash[word_hash == 0] = 1
        seg_item = np.asarray(seg_item, np.int64)
        h = np.zeros(len(words) + len(seg_texts), np.uint64)
        pos = layout(parents)
        h[pos] = word_hash[pc.index_in(words, value_set=vocab).to_numpy(zero_copy_only=False)]
        seg_len = np.bincount(parents, minlength=len(seg_texts))
        seg_first = np.concatenate([[0], np.cumsum(seg_len + 1)[:-1]])   # first position of each segment

        # long fields: every n-gram -> item
        wpos = windows(h, n)
        wseg = np.searchsorted(seg_first, wpos, side="right") - 1
        ngram_keys, ngram_start, ngram_items = _postings(window_keys(h, wpos, n), seg_item[wseg])

        # short fields: whole sequence, found through the hash of its first min_short words
        short = np.nonzero((seg_len < n) & (seg_len >= min_short))[0]
        pattern_len = seg_len[short].astype(np.int64)
        pattern_start = np.concatenate([[0], np.cumsum(pattern_len)[:-1]]).astype(np.int64)
        pattern_words = h[_ranges(seg_first[short], seg_first[short] + pattern_len)]
        prefix = window_keys(h, seg_first[short], min_short)
        prefix_keys, prefix_start, prefix_patterns = _postings(prefix, np.arange(len(short), dtype=np.int64))

        too_short = (seg_len < min_short)
        skipped: dict[str, int] = {}
        for s in np.nonzero(too_short)[0]:
            name = benchmarks[item_bench[seg_item[s]]].name
            skipped[name] = skipped.get(name, 0) + 1
        return cls(key=key, n=n, min_short=min_short, benchmarks=[b.describe() for b in benchmarks],
                   item_bench=np.asarray(item_bench, np.int64), item_ids=item_ids, vocab=vocab,
                   word_hash=word_hash, ngram_keys=ngram_keys, ngram_start=ngram_start, ngram_items=ngram_items,
                   prefix_keys=prefix_keys, prefix_start=prefix_start, prefix_patterns=prefix_patterns,
                   pattern_item=seg_item[short], pattern_start=pattern_start, pattern_len=pattern_len,
                   pattern_words=pattern_words, skipped_fields=skipped)

    # -- disk cache --
    ARRAYS = ("item_bench", "word_hash", "ngram_keys", "ngram_start", "ngram_items", "prefix_keys",
              "prefix_start", "prefix_patterns", "pattern_item", "pattern_start", "pattern_len", "pattern_words")

    def save(self, directory: Path) -> None:
        arrays = {a: getattr(self, a) for a in self.ARRAYS}
        arrays["vocab"] = np.frombuffer("\n".join(self.vocab.to_pylist()).encode(), np.uint8)
        with atomic_path(directory / f"{self.key}.npz") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **arrays)
        write_json_atomic(directory / f"{self.key}.json", {
            "key": self.key, "version": INDEX_VERSION, "n": self.n, "min_short": self.min_short,
            "benchmarks": self.benchmarks, "item_ids": self.item_ids, "skipped_fields": self.skipped_fields})

    @classmethod
    def load(cls, directory: Path, key: str) -> "BenchmarkIndex | None":
        meta_path, arr_path = directory / f"{key}.json", directory / f"{key}.npz"
        if not (meta_path.is_file() and arr_path.is_file()):
            return None
        try:
            meta = read_json(meta_path)
            with np.load(arr_path) as z:
                arrays = {a: z[a] for a in cls.ARRAYS}
                vocab_bytes = z["vocab"].tobytes()
        except Exception:
            return None   # a damaged cache entry is rebuilt
        if meta.get("key") != key or meta.get("version") != INDEX_VERSION:
            return None
        vocab = pa.array(vocab_bytes.decode().split("\n") if vocab_bytes else [], pa.string())
        return cls(key=key, n=meta["n"], min_short=meta["min_short"], benchmarks=meta["benchmarks"],
                   item_ids=meta["item_ids"], vocab=vocab, skipped_fields=meta["skipped_fields"], **arrays)

    # -- matching --
    def hashes(self, words: pa.Array) -> np.ndarray:
        idx = pc.index_in(words, value_set=self.vocab)
        known = pc.is_valid(idx).to_numpy(zero_copy_only=False)
        out = np.zeros(len(words), np.uint64)
        out[known] = self.word_hash[idx.drop_null().to_numpy()]
        return out

    def matches(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every match in the word-hash sequence `h`: (start position, length in words, item)."""
        starts, lengths, items = [], [], []
        pos = windows(h, self.n)
        if len(pos) and len(self.ngram_keys):
            at, found = _lookup(self.ngram_keys, window_keys(h, pos, self.n))
            pos, at = pos[found], at[found]
            lo, hi = self.ngram_start[at], self.ngram_start[at + 1]
            starts.append(np.repeat(pos, hi - lo))
            items.append(self.ngram_items[_ranges(lo, hi)])
            lengths.append(np.full(len(items[-1]), self.n, np.int64))
        if len(self.prefix_keys):
            pos = windows(h, self.min_short)
            at, found = _lookup(self.prefix_keys, window_keys(h, pos, self.min_short))
            pos, at = pos[found], at[found]
            lo, hi = self.prefix_start[at], self.prefix_start[at + 1]
            cand_pos = np.repeat(pos, hi - lo)
            cand = self.prefix_patterns[_ranges(lo, hi)]
            ok = [(p, c) for p, c in zip(cand_pos.tolist(), cand.tolist()) if self._pattern_at(h, p, c)]
            if ok:
                pos_ok, pat_ok = (np.asarray(x, np.int64) for x in zip(*ok))
                starts.append(pos_ok)
                lengths.append(self.pattern_len[pat_ok])
                items.append(self.pattern_item[pat_ok])
        if not starts:
            e = np.zeros(0, np.int64)
            return e, e, e
        return np.concatenate(starts), np.concatenate(lengths), np.concatenate(items)

    def _pattern_at(self, h: np.ndarray, pos: int, pattern: int) -> bool:
        s, ln = self.pattern_start[pattern], self.pattern_len[pattern]
        return pos + ln <= len(h) and np.array_equal(h[pos:pos + ln], self.pattern_words[s:s + ln])


def _postings(keys: np.ndarray, items: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted unique keys, CSR starts, items) from (key, item) pairs, duplicates removed."""
    if len(keys) == 0:
        return np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((items, keys))
    k, it = keys[order], items[order]
    keep = np.ones(len(k), bool)
    keep[1:] = (k[1:] != k[:-1]) | (it[1:] != it[:-1])
    k, it = k[keep], it[keep]
    first = np.ones(len(k), bool)
    first[1:] = k[1:] != k[:-1]
    uniq = k[first]
    start = np.concatenate([np.nonzero(first)[0], [len(k)]]).astype(np.int64)
    return uniq, start, it.astype(np.int64)


def _lookup(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    at = np.searchsorted(sorted_keys, keys)
    at[at == len(sorted_keys)] = 0
    return at, sorted_keys[at] == keys


# ---- building once, caching --------------------------------------------------------------------

_INDEXES: dict[str, BenchmarkIndex] = {}
_LOCK = threading.Lock()


def cache_dir(cfg: DecontamConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    from quipu.catalog.db import quipu_home
    return quipu_home() / "cache" / "decontam"


def index_key(benchmarks: list[Benchmark], n: int, min_short: int) -> str:
    return sha256_json({"version": INDEX_VERSION, "n": n, "min_short": min_short,
                        "benchmarks": sorted([b.name, b.sha256, list(b.spec.fields), b.spec.id_field] for b in benchmarks)})


def get_index(cfg: DecontamConfig) -> BenchmarkIndex:
    """The index of `cfg.benchmarks`: from memory, else from the disk cache, else built and saved."""
    benchmarks = load_benchmarks(cfg.benchmarks, cfg.registry_dir)
    key = index_key(benchmarks, cfg.n, cfg.min_short_words)
    with _LOCK:
        index = _INDEXES.get(key)
        if index is None:
            directory = cache_dir(cfg)
            index = BenchmarkIndex.load(directory, key)
            if index is not None:  # same contents; report where the files are now
                index.benchmarks = [b.describe() for b in sorted(benchmarks, key=lambda b: b.name)]
            else:
                index = BenchmarkIndex.build(benchmarks, cfg.n, cfg.min_short_words, key)
                index.save(directory)
            _INDEXES[key] = index
    return index


# ---- finding hits in documents ----------------------------------------------------------------

@dataclass
class Hit:
    benchmark: str
    item: str
    start: int          # character offsets in the document
    end: int
    words: int          # matched words


@dataclass
class DocMatches:
    hits: list[Hit]
    cut_spans: list[tuple[int, int]]   # merged character spans to cut (matches plus margin)


class Matcher:
    """Finds benchmark text in batches of documents with one `BenchmarkIndex`."""

    def __init__(self, index: BenchmarkIndex, margin_words: int = 0):
        self.index = index
        self.margin = margin_words

    def candidates(self, texts: list[str]) -> list[int]:
        """Documents with at least one match (fast: whole batch, no character offsets)."""
        words, parents = split_words(texts)
        h = np.zeros(len(words) + len(texts), np.uint64)
        h[layout(parents)] = self.index.hashes(words)
        starts, _, _ = self.index.matches(h)
        if len(starts) == 0:
            return []
        doc_first = np.concatenate([[0], np.cumsum(np.bincount(parents, minlength=len(texts)) + 1)[:-1]])
        return sorted(set((np.searchsorted(doc_first, starts, side="right") - 1).tolist()))

    def find(self, texts: list[str]) -> list[DocMatches]:
        """Hits with character spans for each document (run on the candidates only)."""
        chunk_doc, chunk_start, chunk_end, chunk_text = [], [], [], []
        for d, t in enumerate(texts):
            for m in CHUNK.finditer(t):
                a, b = _word_span(m.group())   # the span without the punctuation around the word
                chunk_doc.append(d); chunk_start.append(m.start() + a); chunk_end.append(m.start() + b)
                chunk_text.append(m.group())
        words, wchunk = split_words(chunk_text)
        chunk_doc = np.asarray(chunk_doc, np.int64)
        wdoc = chunk_doc[wchunk] if len(wchunk) else np.zeros(0, np.int64)
        pos = layout(wdoc)
        h = np.zeros(len(words) + len(texts), np.uint64)
        h[pos] = self.index.hashes(words)
        starts, lengths, items = self.index.matches(h)
        word_at = np.full(len(h), -1, np.int64)
        word_at[pos] = np.arange(len(words))
        w_start = np.asarray(chunk_start, np.int64)[wchunk] if len(wchunk) else np.zeros(0, np.int64)
        w_end = np.asarray(chunk_end, np.int64)[wchunk] if len(wchunk) else np.zeros(0, np.int64)
        doc_words = np.bincount(wdoc, minlength=len(texts))
        doc_first_word = np.concatenate([[0], np.cumsum(doc_words)[:-1]])

        per_doc: dict[int, dict[int, list[tuple[int, int]]]] = {}
        for s, ln, it in zip(starts.tolist(), lengths.tolist(), items.tolist()):
            w0 = int(word_at[s])
            per_doc.setdefault(int(wdoc[w0]), {}).setdefault(it, []).append((w0, w0 + ln))
        out = []
        names = self.index.bench_names
        for d in range(len(texts)):
            by_item = per_doc.get(d, {})
            hits, all_spans = [], []
            for it, spans in by_item.items():
                for a, b in _merge(spans):
                    hits.append(Hit(names[self.index.item_bench[it]], self.index.item_ids[it],
                                    int(w_start[a]), int(w_end[b - 1]), b - a))
                    all_spans.append((a, b))
            hits.sort(key=lambda x: (x.start, x.end, x.benchmark, x.item))
            lo, hi = doc_first_word[d], doc_first_word[d] + doc_words[d]
            cut = [_widen(texts[d], int(w_start[max(lo, a - self.margin)]), int(w_end[min(hi, b + self.margin) - 1]))
                   for a, b in _merge(all_spans)]
            out.append(DocMatches(hits, _merge(cut)))
        return out


def _word_span(chunk: str) -> tuple[int, int]:
    """Offsets of the first and last letter/digit (or mark) of a chunk: "(today?" -> "today"."""
    def word_char(c: str) -> bool:
        return c.isalnum() or unicodedata.category(c)[0] == "M"
    a = next((i for i, c in enumerate(chunk) if word_char(c)), 0)
    b = next((i + 1 for i in range(len(chunk) - 1, -1, -1) if word_char(chunk[i])), len(chunk))
    return (a, b) if a < b else (0, len(chunk))


def _widen(text: str, a: int, b: int) -> tuple[int, int]:
    """A cut span grown over the punctuation touching it (`"`, `?`, `)`), up to whitespace or a word."""
    while a > 0 and not text[a - 1].isspace() and not text[a - 1].isalnum():
        a -= 1
    while b < len(text) and not text[b].isspace() and not text[b].isalnum():
        b += 1
    return a, b


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def cut_text(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[dict]]:
    """`text` without the character spans; a cut becomes one line break between what remains."""
    pieces, cuts, last = [], [], 0
    for a, b in spans:
        pieces.append(text[last:a])
        cuts.append({"start": a, "end": b, "text": text[a:b]})
        last = b
    pieces.append(text[last:])
    kept = [p.strip(" \t") for p in pieces]
    return "\n".join(p for p in kept if p.strip()).strip(), cuts


def _dominant(hits: list[Hit]) -> str:
    words: dict[str, int] = {}
    for h in hits:
        words[h.benchmark] = words.get(h.benchmark, 0) + h.words
    return min(words, key=lambda b: (-words[b], b))


# ---- the stage --------------------------------------------------------------------------------

class Decontaminate(Stage):
    name = "decontam"
    Config = DecontamConfig

    def __init__(self, config: DecontamConfig, context: RunContext | None = None, index: BenchmarkIndex | None = None):
        super().__init__(config, context)
        self._index = index

    @property
    def index(self) -> BenchmarkIndex:
        if self._index is None:   # built once per process and benchmark set (get_index caches it)
            self._index = get_index(self.config)
        return self._index

    def check(self) -> None:
        """Read and check every benchmark file and build (or load) the index: a missing or empty
        file, or a declared field absent, fails here naming the file and field."""
        self.index

    def fingerprint(self, shard_plan) -> dict:
        # The benchmark versions are part of what a finished shard was checked against.
        return {"index": self.index.key}

    def commit(self, scans, plan) -> dict:
        """Record each benchmark file (path, items, SHA-256) in the catalog as a `benchmark` dataset."""
        from quipu.catalog import registry
        for b in self.index.benchmarks:
            registry.register_dataset(b["name"], "benchmark", b["path"], self.context.run_id,
                                      [{"path": b["path"], "rows": b["items"], "bytes": b["bytes"], "sha256": b["sha256"]}],
                                      info={**b, "index": self.index.key,
                                            "skipped_fields": self.index.skipped_fields.get(b["name"], 0)})
        return {"benchmarks": len(self.index.benchmarks)}

    def finalize(self, stats: dict, scans, plan, committed) -> dict:
        # shard lists are concatenated in shard order: keep the first examples per benchmark
        for bench, examples in stats.get("example_matches", {}).items():
            stats["example_matches"][bench] = examples[:EXAMPLES_PER_BENCHMARK]
        return stats

    @property
    def matcher(self) -> Matcher:
        if not hasattr(self, "_matcher"):
            cfg = self.config
            self._matcher = Matcher(self.index, cfg.cut_margin_words if cfg.policy == "cut" else 0)
        return self._matcher

    def process(self, batch: pa.Table, shard_plan=None) -> Outcome:
        cfg = self.config
        texts = batch.column("text").to_pylist()
        cand = self.matcher.candidates(texts) if texts else []
        found = self.matcher.find([texts[i] for i in cand]) if cand else []
        by_doc = dict(zip(cand, found))

        ids = batch.column("id").to_pylist()
        changed = False
        hits_col, cuts_col, keep, reasons = [], [], [], []
        stats = _Stats(self.index)
        for i in range(batch.num_rows):
            m = by_doc.get(i)
            if m is None or not m.hits:
                hits_col.append("[]"); cuts_col.append("[]"); keep.append(True); reasons.append(None)
                continue
            text = texts[i]
            hits_col.append(json.dumps([h.__dict__ for h in m.hits], ensure_ascii=False))
            bench = _dominant(m.hits)
            stats.contaminated(ids[i], text, m.hits)
            if cfg.policy == "cut":
                rest, cuts = cut_text(text, m.cut_spans)
                cuts_col.append(json.dumps(cuts, ensure_ascii=False))
                if len(split_words([rest])[0]) >= max(1, cfg.min_words_after_cut):
                    texts[i], changed = rest, True
                    keep.append(True); reasons.append(None)
                    stats.cut(m.hits, sum(b - a for a, b in m.cut_spans))
                    continue
            else:
                cuts_col.append("[]")
            keep.append(False); reasons.append(f"contaminated:{bench}")

        if changed:
            batch = set_column(batch, batch.schema.field("text"), pa.array(texts, pa.string()))
        batch = set_column(set_column(batch, HITS, hits_col), CUTS, cuts_col)
        kept, removed = split_by_mask(batch, keep, reasons)
        return Outcome(kept, removed, stats.as_dict())


class _Stats:
    """Per-shard counters: contaminated documents per benchmark, items hit, example matches."""

    def __init__(self, index: BenchmarkIndex):
        self.index = index
        self.docs: dict[str, int] = {}
        self.items: dict[str, dict[str, int]] = {}
        self.examples: dict[str, list[dict]] = {}
        self.cut_docs: dict[str, int] = {}
        self.cut_chars = 0

    def contaminated(self, doc_id: str, text: str, hits: list[Hit]) -> None:
        for bench in sorted({h.benchmark for h in hits}):
            self.docs[bench] = self.docs.get(bench, 0) + 1
        for bench, item in sorted({(h.benchmark, h.item) for h in hits}):
            slot = self.items.setdefault(bench, {})
            slot[item] = slot.get(item, 0) + 1
        for h in hits:
            ex = self.examples.setdefault(h.benchmark, [])
            if len(ex) < EXAMPLES_PER_BENCHMARK and all(e["doc"] != doc_id for e in ex):
                ex.append({"doc": doc_id, "item": h.item, "span": snippet(text[h.start:h.end])})

    def cut(self, hits: list[Hit], chars: int) -> None:
        for bench in sorted({h.benchmark for h in hits}):
            self.cut_docs[bench] = self.cut_docs.get(bench, 0) + 1
        self.cut_chars += chars

    def as_dict(self) -> dict:
        # Strings only under `benchmarks`: shard stats are summed, strings are carried over.
        return {"contaminated_docs": self.docs, "cut_docs": self.cut_docs, "cut_chars": self.cut_chars,
                "items_hit": self.items, "example_matches": self.examples, "index": self.index.key,
                "benchmarks": {b["name"]: {"path": b["path"], "sha256": b["sha256"], "spec": str(b["spec"]),
                                           "fields": ", ".join(b["fields"])} for b in self.index.benchmarks}}
