"""The benchmark index of the decontam stage (quipu.tasks.decontam): the one text normalisation of
benchmarks and documents, word and window hashing, and the index itself.

Text is normalised (combining-mark runs capped, NFKD, homoglyphs folded, casefold, everything but
letters, digits and spaces deleted) and split into words; every benchmark item's word n-grams are
hashed into ONE index across all benchmarks: sorted 64-bit keys with postings (key -> items). A
field shorter than n words is matched as a whole contiguous word sequence, through the hash of its
first `min_short_words` words and a check of the rest. Words become 64-bit hashes through the
index's vocabulary (a word no benchmark has gets 0, and no window through it can match); window
hashes are computed with numpy for a whole batch at once.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from quipu.catalog.files import atomic_path, read_json, sha256_json, write_json_atomic
from quipu.tasks.benchmarks import Benchmark

INDEX_VERSION = 2     # 2: NFKD, homoglyphs, accents and punctuation deleted
WORD = r"[\p{L}\p{N}]+"                   # a word: letters and digits, after normalisation (Rust regex)
# Pieces of the original text that normalise independently: punctuation no longer separates words
# (it is deleted), so only whitespace does.
# Punctuation is deleted, joining what it stood between ("don't" = "dont", "1/5" = "15"): copies
# lose punctuation far more often than they gain spaces. So only whitespace separates words.
CHUNK = re.compile(r"\S+")

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_PRIME = np.uint64(0x100000001B3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)



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



def index_key(benchmarks: list[Benchmark], n: int, min_short: int) -> str:
    return sha256_json({"version": INDEX_VERSION, "n": n, "min_short": min_short,
                        "benchmarks": sorted([b.name, b.sha256, list(b.spec.fields), b.spec.id_field] for b in benchmarks)})


