"""Text → words → word n-gram shingles → MinHash signatures, vectorised with numpy (the dedup stage's
signatures, quipu.tasks.dedup).

Words are whitespace tokens, lower-cased, with punctuation stripped from their ends; shingles are
hashed to 32 bits; signatures use datasketch's "affine32" permutations and are bit-identical to
`datasketch.MinHash(hashfunc=...).update_batch` on the same hashes, computed over all shingles of a
batch of documents at once. The exact hash is of the normalised text (its words joined by single
spaces, as datatrove's exact dedup simplifies text).
"""
from __future__ import annotations

import sys
import unicodedata
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from quipu.tasks.dedup_index import SCHEME

SHINGLE_HASH = "ws-trim-punct/bytes-lin64-words/poly64-fmix64-hi32/v1"   # stored in the index: changing it breaks old indexes
_U64 = np.uint64
_FMIX64 = (_U64(33), _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53))
_FMIX32 = (np.uint32(16), np.uint32(0x85EBCA6B), np.uint32(13), np.uint32(0xC2B2AE35))
# Odd 64-bit multipliers that make a shingle's hash depend on word order (fixed: part of SHINGLE_HASH).
_POSITION_MULT = np.random.RandomState(20261122).randint(0, 2**62, size=32, dtype=np.uint64) * _U64(2) + _U64(1)


# Odd 64-bit multipliers per byte position in a word (fixed: part of SHINGLE_HASH).
_BYTE_MULT = np.random.RandomState(20261123).randint(0, 2**62, size=1 << 16, dtype=np.uint64) * _U64(2) + _U64(1)
_LEN_MULT = _U64(0x9E3779B97F4A7C15)


def hash_strings(arr: pa.Array) -> np.ndarray:
    """64-bit hashes of non-empty strings, vectorised over the Arrow buffers: a linear hash of the
    UTF-8 bytes with random odd multipliers per position, mixed with the length, then fmix64."""
    if len(arr) == 0:
        return np.zeros(0, np.uint64)
    off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offs = np.frombuffer(arr.buffers()[1], dtype=off_type)[arr.offset:arr.offset + len(arr) + 1].astype(np.int64)
    lo, hi = int(offs[0]), int(offs[-1])
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[lo:hi].astype(np.uint64) + _U64(1)
    lens = np.diff(offs)
    pos = np.arange(hi - lo, dtype=np.int64) - np.repeat(offs[:-1] - lo, lens)
    h = np.add.reduceat(data * _BYTE_MULT[pos & 0xFFFF], offs[:-1] - lo)
    return _fmix64(h ^ (lens.astype(np.uint64) * _LEN_MULT))


def _fmix64(h: np.ndarray) -> np.ndarray:
    s, m1, m2 = _FMIX64
    h = h ^ (h >> s)
    h = h * m1
    h = h ^ (h >> s)
    h = h * m2
    return h ^ (h >> s)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finalizer: datasketch's affine32 pre-mix of every input hash."""
    s1, m1, s2, m2 = _FMIX32
    h = h ^ (h >> s1)
    h = h * m1
    h = h ^ (h >> s2)
    h = h * m2
    return h ^ (h >> s1)


@lru_cache(maxsize=1)
def _punctuation() -> str:
    """Every Unicode punctuation and symbol character: stripped from both ends of a word."""
    return "".join(chr(i) for i in range(sys.maxunicode + 1) if unicodedata.category(chr(i))[0] in "PS")


def tokenize(texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(words of all texts, words per text). A word: a whitespace-separated token, lower-cased,
    with leading and trailing punctuation/symbols stripped; tokens left empty are dropped."""
    parts = pc.utf8_split_whitespace(pc.utf8_lower(texts))
    flat = pc.utf8_trim(pc.list_flatten(parts), characters=_punctuation())
    keep = pc.greater(pc.binary_length(flat), 0)
    parent = pc.list_parent_indices(parts).to_numpy(zero_copy_only=False)
    lengths = np.bincount(parent[keep.to_numpy(zero_copy_only=False)], minlength=len(texts)).astype(np.int64)
    return flat.filter(keep), lengths


def words(text: str) -> list[str]:
    """The words of one text, exactly as the shingler sees them."""
    return tokenize(pa.array([text], pa.string()))[0].to_pylist()


def exact_digests(flat: pa.Array, lengths: np.ndarray) -> list[bytes]:
    """128-bit hash of each text's normalised form: its words joined by one space (so case,
    punctuation at word ends and whitespace do not make two texts differ)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    joined = pc.binary_join(pa.LargeListArray.from_arrays(pa.array(offsets), flat), " ")
    return [xxhash.xxh3_128_digest(t) for t in joined.to_pylist()]


class MinHasher:
    """Vectorised MinHash over word n-gram shingles, producing datasketch-compatible signatures."""

    def __init__(self, ngram: int, num_perm: int, seed: int, chunk: int = 4096):
        from datasketch import MinHash
        if ngram > len(_POSITION_MULT):
            raise ValueError(f"ngram must be at most {len(_POSITION_MULT)}")
        self.ngram, self.num_perm, self.seed, self.chunk = ngram, num_perm, seed, chunk
        perm = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
        self.a = np.ascontiguousarray(perm[0], dtype=np.uint32)[:, None]
        self.b = np.ascontiguousarray(perm[1], dtype=np.uint32)[:, None]
        self._buf = np.empty((num_perm, chunk), dtype=np.uint32)

    def shingle_hashes(self, texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(hashes, offsets): 32-bit hashes of each document's word n-grams (a document with fewer
        words than n has one shingle of all its words, an empty one none); document i owns
        hashes[offsets[i]:offsets[i+1]]. Words are hashed once per batch vocabulary (numpy over
        the Arrow buffers), n-grams combine word hashes with position multipliers in numpy."""
        return self.hashes_of_words(*tokenize(texts))

    def hashes_of_words(self, flat: pa.Array, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.ngram
        counts = np.where(lengths >= n, lengths - n + 1, (lengths > 0).astype(np.int64))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        if len(flat) == 0:
            return np.zeros(0, np.uint32), offsets
        enc = pc.dictionary_encode(flat)      # each distinct word of the batch is hashed once
        w = hash_strings(enc.dictionary)[enc.indices.to_numpy(zero_copy_only=False)]
        n_words = len(w)
        out = np.empty(int(offsets[-1]), dtype=np.uint64)
        long_docs = lengths >= n
        if n_words >= n and long_docs.any():
            span = n_words - n + 1
            acc = w[:span] * _POSITION_MULT[0]
            for k in range(1, n):
                acc += w[k:k + span] * _POSITION_MULT[k]
            starts = np.zeros(len(lengths), dtype=np.int64)
            np.cumsum(lengths[:-1], out=starts[1:])
            word_end = np.repeat(starts + lengths, lengths)[:span]
            valid = np.arange(n, span + n, dtype=np.int64) <= word_end
            out[np.repeat(long_docs, counts)] = acc[valid]
        short = np.nonzero((lengths > 0) & ~long_docs)[0]
        if len(short):
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[short]
            lens = lengths[short]
            pos_in_doc = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
            contrib = w[np.repeat(starts, lens) + pos_in_doc] * _POSITION_MULT[pos_in_doc]
            out[offsets[short]] = np.add.reduceat(contrib, np.cumsum(lens) - lens)
        return (_fmix64(out) >> _U64(32)).astype(np.uint32), offsets

    def signatures(self, hashes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(documents, num_perm) uint32: per permutation, min over a document's shingles of
        a * fmix32(h) + b mod 2^32 (datasketch affine32). Documents without shingles keep the
        empty value 2^32-1. Shingles are processed in cache-sized chunks of whole documents."""
        docs = len(offsets) - 1
        sig = np.full((docs, self.num_perm), np.uint32(0xFFFFFFFF), dtype=np.uint32)
        hv = _fmix32(hashes.astype(np.uint32, copy=False))
        nz = np.nonzero(np.diff(offsets))[0]
        ends = offsets[nz + 1]
        j = 0
        while j < len(nz):
            s0 = offsets[nz[j]]
            jj = int(np.searchsorted(ends, s0 + self.chunk, side="right"))
            if jj <= j:   # one document longer than a chunk: reduce it piece by piece
                d = nz[j]
                acc = sig[d]
                for c0 in range(int(s0), int(offsets[d + 1]), self.chunk):
                    c1 = min(c0 + self.chunk, int(offsets[d + 1]))
                    acc = np.minimum(acc, self._permuted(hv[c0:c1]).min(axis=1))
                sig[d] = acc
                j += 1
                continue
            block = self._permuted(hv[s0:ends[jj - 1]])
            sig[nz[j:jj]] = np.minimum.reduceat(block, offsets[nz[j:jj]] - s0, axis=1).T
            j = jj
        return sig

    def _permuted(self, hv: np.ndarray) -> np.ndarray:
        v = self._buf[:, :len(hv)]
        np.multiply(self.a, hv[None, :], out=v)
        np.add(v, self.b, out=v)
        return v




# Odd 64-bit multipliers per row of a band (fixed: part of BAND_HASH).
_ROW_MULT = np.random.RandomState(20261125).randint(0, 2**62, size=1024, dtype=np.uint64) * _U64(2) + _U64(1)
# Per-band salts (fixed: part of BAND_HASH), so equal values in different bands hash apart.
_BAND_SALT = np.random.RandomState(20261126).randint(0, 2**62, size=1024, dtype=np.uint64)
BAND_HASH = "rows-lin64-band-fmix64/v1"    # stored in the index: changing it breaks old indexes


def band_keys(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, bands) uint64: one hash per LSH band of each signature. Two documents share a
    bucket when a band's `rows` MinHash values are all equal (as datasketch's `MinHashLSH`); the
    band number is mixed in, so equal values in different bands never meet. A 64-bit collision
    only adds a candidate that verification rejects."""
    docs = sigs.shape[0]
    out = np.empty((docs, bands), dtype=np.uint64)
    mult = _ROW_MULT[:rows]
    for b in range(bands):
        block = sigs[:, b * rows:(b + 1) * rows].astype(np.uint64)
        h = (block * mult).sum(axis=1, dtype=np.uint64) ^ _BAND_SALT[b]
        out[:, b] = _fmix64(h)
    return out
