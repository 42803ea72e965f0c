"""Curated parquet shards → token shards.

Token shards are cached by content: for a curated shard whose bytes hash to H, the output
directory (one per tokenizer) gets
  `H.tokens.bin`  every document's BOS + ids + EOS, concatenated, raw uint16 (vocab < 65536) or uint32
  `H.docs.npy`    int64 document start offsets into the .bin, plus the end (len = docs + 1)
  `H.ppl.npy`     float32 `ppl_wayra` per document (NaN where the curated data has none): curriculum order
  `H.json`        done-marker: fingerprint (input hash, tokenizer hash, code version), counts, tokens per source

A shard whose marker fingerprint matches is skipped, so a killed run resumes where it stopped, a
dataset's new version costs only its own shards, and every version of every dataset shares one
cache (H is the content, not the path: `part-00000.parquet` of version 1 and 2 are different files).
Shards are tokenized in parallel threads (`encode_batch` releases the GIL). `TokenShards` memory-
maps a tokenized dataset for the data loader.
"""
from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from quipu.catalog.files import atomic_path, sha256_file, sha256_json, write_json_atomic
from quipu.trainer.tokenizer import TextTokenizer, reference_tokenizer   # noqa: F401  (callers import it from here too)

# a change to this file invalidates token shards written by an older version
CODE_VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
BATCH_ROWS = 1000


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def _save_npy(path: Path, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)


def tokenize_shard(shard_path: str, out_dir: str | Path, tokenizer: TextTokenizer, tokenizer_sha: str,
                   input_sha: str | None = None) -> dict:
    """Tokenize one curated shard (or reuse its tokens when already done); returns its marker dict,
    whose `input` is `shard_path`. `input_sha`: the shard's sha256 when the catalog knows it."""
    out_dir = Path(out_dir)
    input_sha = input_sha or sha256_file(shard_path)
    stem = input_sha[:24]
    marker = out_dir / f"{stem}.json"
    fp = sha256_json({"input": input_sha, "tokenizer": tokenizer_sha, "code": CODE_VERSION})
    if marker.exists():
        done = json.loads(marker.read_text())
        if done.get("fingerprint") == fp and Path(done["tokens_path"]).exists():
            return {**done, "input": str(shard_path), "reused": True}
    dtype = token_dtype(tokenizer.vocab_size)
    pf = pq.ParquetFile(shard_path)
    names = pf.schema_arrow.names
    for col in ("id", "text"):
        if col not in names:
            raise ValueError(f"{shard_path}: curated shard has no '{col}' column")
    cols = [c for c in ("text", "source", "ppl_wayra") if c in names]
    offsets = [0]
    ppl: list[float] = []
    by_source: dict[str, dict] = {}
    bin_path = out_dir / f"{stem}.tokens.bin"
    with atomic_path(bin_path) as tmp, open(tmp, "wb") as fh:
        for rb in pf.iter_batches(batch_size=BATCH_ROWS, columns=cols):
            d = rb.to_pydict()
            docs = tokenizer.encode_docs(d["text"])
            lengths = np.fromiter((len(x) for x in docs), dtype=np.int64, count=len(docs))
            fh.write(np.fromiter((t for x in docs for t in x), dtype=dtype, count=int(lengths.sum())).tobytes())
            offsets.extend((offsets[-1] + np.cumsum(lengths)).tolist())
            srcs = d.get("source") or ["unknown"] * len(docs)
            for s, n in zip(srcs, lengths.tolist()):
                e = by_source.setdefault(str(s), {"docs": 0, "tokens": 0})
                e["docs"] += 1
                e["tokens"] += n
            p = d.get("ppl_wayra")
            ppl.extend(float("nan") if v is None else float(v) for v in (p or [None] * len(docs)))
    _save_npy(out_dir / f"{stem}.docs.npy", np.asarray(offsets, dtype=np.int64))
    _save_npy(out_dir / f"{stem}.ppl.npy", np.asarray(ppl, dtype=np.float32))
    done = {"fingerprint": fp, "input": str(shard_path), "tokens_path": str(bin_path), "dtype": dtype.name,
            "docs": len(offsets) - 1, "tokens": int(offsets[-1]), "tokens_by_source": by_source,
            "has_ppl_wayra": "ppl_wayra" in names, "sha256": sha256_file(bin_path)}
    write_json_atomic(marker, done)
    return done


def tokenize_shards(shards: list[str] | list[dict], out_dir: str | Path, tokenizer: TextTokenizer, workers: int = 2) -> list[dict]:
    """Markers of `shards` (paths, or catalog rows with path and sha256), in the given order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sha = tokenizer.sha256
    rows = [s if isinstance(s, dict) else {"path": s} for s in shards]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda r: tokenize_shard(r["path"], out_dir, tokenizer, sha, r.get("sha256")), rows))


def summarize(markers: list[dict]) -> dict:
    by_source: dict[str, dict] = {}
    for m in markers:
        for s, e in m["tokens_by_source"].items():
            t = by_source.setdefault(s, {"docs": 0, "tokens": 0})
            t["docs"] += e["docs"]
            t["tokens"] += e["tokens"]
    return {"docs": sum(m["docs"] for m in markers), "tokens": sum(m["tokens"] for m in markers),
            "tokens_by_source": by_source, "shards": len(markers)}


def register_tokens(name: str, out_dir: str | Path, markers: list[dict], tokenizer_sha: str, run_id: str | None) -> str:
    from quipu.catalog import registry
    info = summarize(markers) | {"tokenizer_sha256": tokenizer_sha}
    return registry.register_dataset(
        name, "tokens", str(Path(out_dir).resolve()), run_id,
        [{"path": m["tokens_path"], "rows": m["docs"], "bytes": Path(m["tokens_path"]).stat().st_size,
          "sha256": m["sha256"]} for m in markers], info=info, shared_path=True)


@dataclass
class TokenShards:
    """One tokenized dataset, memory-mapped: document i is `tokens[shard[i]][start[i]:start[i]+length[i]]`."""
    tokens: list[np.memmap]
    doc_shard: np.ndarray   # int32
    doc_start: np.ndarray   # int64
    doc_len: np.ndarray     # int64
    doc_ppl: np.ndarray     # float32

    @classmethod
    def open(cls, markers: list[dict]) -> "TokenShards":
        tokens, shard, start, length, ppl = [], [], [], [], []
        for i, m in enumerate(markers):
            bin_path = Path(m["tokens_path"])
            stem = bin_path.name.removesuffix(".tokens.bin")
            offs = np.load(bin_path.parent / f"{stem}.docs.npy")
            tokens.append(np.memmap(bin_path, dtype=np.dtype(m["dtype"]), mode="r") if m["tokens"] else np.zeros(0, np.uint16))
            shard.append(np.full(len(offs) - 1, i, dtype=np.int32))
            start.append(offs[:-1])
            length.append(np.diff(offs))
            ppl.append(np.load(bin_path.parent / f"{stem}.ppl.npy"))
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        return cls(tokens, cat(shard, np.int32), cat(start, np.int64), cat(length, np.int64), cat(ppl, np.float32))

    @property
    def num_docs(self) -> int:
        return len(self.doc_len)

    @property
    def num_tokens(self) -> int:
        return int(self.doc_len.sum())

    def doc(self, i: int) -> np.ndarray:
        s = int(self.doc_start[i])
        return self.tokens[int(self.doc_shard[i])][s:s + int(self.doc_len[i])]


# ---- token counts of a curated version, before any training tokenizer exists --------------------

REFERENCE_TOKENIZER = "smollm2"    # a fixed, public tokenizer: counts are comparable across versions


def count_tokens(shard_paths: list[str], sample_docs: int = 5000) -> dict:
    """Tokens of curated shards under the reference tokenizer: exact when they hold at most
    `sample_docs` documents, else measured on an evenly spread sample of that many and scaled by
    the text bytes (the result says which)."""
    import pyarrow.compute as pc
    total_docs = sum(pq.ParquetFile(p).metadata.num_rows for p in shard_paths)
    every = max(1, -(-total_docs // sample_docs))
    tok = reference_tokenizer()
    sample_tokens = sample_bytes = total_bytes = seen = 0
    for p in shard_paths:
        for rb in pq.ParquetFile(p).iter_batches(batch_size=BATCH_ROWS, columns=["text"]):
            text = rb.column(0)
            total_bytes += int(pc.sum(pc.binary_length(text)).as_py() or 0)
            picked = [t for i, t in enumerate(text.to_pylist(), seen) if i % every == 0]
            seen += len(text)
            sample_bytes += sum(len(t.encode()) for t in picked)
            sample_tokens += sum(len(e.ids) for e in tok.encode_batch(picked, add_special_tokens=False))
    exact = every == 1
    tokens = sample_tokens if exact else round(sample_tokens * total_bytes / max(1, sample_bytes))
    return {"tokens": int(tokens), "tokenizer": REFERENCE_TOKENIZER, "exact": exact,
            "sampled_docs": -(-total_docs // every), "documents": total_docs, "text_bytes": total_bytes}
