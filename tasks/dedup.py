"""Stage `dedup`: exact and near-duplicate removal with MinHash LSH, out of core and in parallel,
incremental across runs.

A global stage of the stage contract (quipu.tasks.stage) with a partitioned plan:
1. scan = signatures, per shard in parallel (quipu.tasks.minhash: words -> word n-gram shingles ->
   32-bit shingle hashes -> MinHash signatures bit-identical to datasketch's, plus an exact hash of
   the normalised text). Besides the signature files, each shard writes its LSH band rows
   (band hash, exact-hash prefix, row) and its exact-hash rows, each sorted by hash.
2. plan, per hash range (partition) in parallel: the band rows of every shard and of the
   persistent index in that range, sorted; documents sharing a band hash are candidates (exact
   copies collapse to one per bucket, a bucket pairs each document with at most `bucket_cap`
   earlier ones); each candidate pair is verified once (in the partition of the first band the
   two share) by its exact Jaccard on shingle sets (or estimated from signatures); equal exact
   hashes form exact groups. Then one cheap combine over the verified pairs only: connected
   groups, and in each the same policy as a sequential pass (`first_seen` in shard/row order,
   `quality` by descending `quality_score`; documents kept by earlier runs always stay): a document
   is an exact duplicate of a kept copy, else a near duplicate of its most similar kept candidate
   (Jaccard >= threshold), else kept.
3. process = split, per shard: kept (with `dup_count`, the size of its cluster) and removed
   (`reason` exact_dup / near_dup, `dup_of` = the kept twin's id, `cluster_id` = its index key,
   `dup_jaccard`).
4. commit: this run's kept documents join the index as one generation (segments and band rows
   sorted per hash range), in one atomic step, after all outputs exist.
Memory: one shard (scan), one partition of band rows (plan), the verified pairs (combine). Every
step leaves a done-marker; a rerun skips finished work and ends with the same bytes.
"""
from __future__ import annotations

import os
import sys
import time
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from quipu.catalog.files import atomic_path, read_json, sha256_file, sha256_json, write_json_atomic
from quipu.catalog.names import check_name
from quipu.tasks.minhash import SHINGLE_HASH, MinHasher, exact_digests, tokenize
from quipu.tasks.dedup_index import (BAND_COLUMNS, EXACT_COLUMNS, GEN_SHIFT, LAYOUT, LOCAL_FLAG, SCHEME, BandPart, DedupIndex, FileStore, RedisStore,
                                     SegmentPart, check_params, make_key, ref_key)
from quipu.tasks.minhash import BAND_HASH, band_keys
from quipu.tasks.partitions import NpyRows, SortedRun, bounds, n_partitions, partition_of, save_npy
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, RunContext, Shard, Stage, StageConfig, module_version, snippet

STAGE = "dedup"
PRESETS = {"fineweb": {"num_perm": 112, "bands": 14, "rows": 8}}
CRASH_ENV = "QUIPU_DEDUP_CRASH_AT"      # fault injection for the kill tests: a step name


# ---- config -----------------------------------------------------------------------------------

class RedisConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    host: str = "127.0.0.1"
    port: int = Field(6379, ge=1, le=65535)
    db: int = Field(0, ge=0)
    password_env: str | None = Field(None, description="name of the environment variable holding the password")
    prefix: str = Field("quipu-dedup", pattern=r"^[A-Za-z0-9._:-]+$", description="prefix of every Redis key")


class DedupConfig(StageConfig):
    preset: Literal["default", "fineweb"] = Field("default", description="`fineweb`: 112 permutations, 14 bands x 8 rows")
    exact: bool = Field(True, description="remove exact duplicates of the normalised text (same words, same order)")
    near: bool = Field(True, description="remove near duplicates (MinHash-LSH)")
    ngram: int = Field(5, ge=1, le=32, description="words per shingle")
    num_perm: int = Field(128, ge=8, le=1024, description="MinHash permutations")
    threshold: float = Field(0.8, gt=0, le=1, description="Jaccard similarity of a near duplicate (verified)")
    lsh_threshold: float = Field(0.6, gt=0, le=1, description="threshold the LSH bands are tuned for when bands/rows are not given (lower = more recall, more verification)")
    bands: int | None = Field(None, ge=2, description="LSH bands (derived when not given)")
    rows: int | None = Field(None, ge=1, description="rows per band (derived when not given)")
    verify: Literal["exact", "signature"] = Field("exact", description="candidate check: exact Jaccard of shingle sets, or estimated from signatures")
    policy: Literal["first_seen", "quality"] = Field("first_seen", description="which document of a cluster is kept")
    quality_column: str = Field("quality_score", description="column the `quality` policy ranks by (higher is better)")
    seed: int = Field(1, ge=0, description="MinHash permutation seed")
    index: str | None = Field(None, description="name of the persistent index shared by runs (default: the curate `dataset`; neither: one private to the output folder)")
    backend: Literal["file", "redis", "none"] = Field("file", description="where the index persists: file, redis, none (this run only)")
    index_dir: str | None = Field(None, description="folder of the file index (default: $QUIPU_HOME/dedup/<index>)")
    redis: RedisConfig = RedisConfig()
    partition_rows: int = Field(1_000_000, ge=1000, description="band rows (24 bytes each, this run's and the index's) one plan partition holds: bounds the plan's memory (~100 MB per partition task at the default)")
    partitions: int | None = Field(None, ge=1, le=4096, description="plan partitions (parallel tasks); default: band rows / partition_rows, at least 2")
    bucket_cap: int = Field(100, ge=1, description="a document is compared with at most this many earlier distinct documents of one band bucket (huge buckets are templates; each is counted in the report)")

    @field_validator("index")
    @classmethod
    def _safe_index(cls, v):
        return None if v is None else check_name(v, "dedup index name")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data):
        if isinstance(data, dict) and isinstance(data.get("preset"), str) and data["preset"] in PRESETS:
            data = {**PRESETS[data["preset"]], **data}
        return data

    @field_validator("lsh_threshold")
    @classmethod
    def _lsh_threshold(cls, v: float, info):
        t = info.data.get("threshold")
        if t is not None and v > t:
            raise ValueError(f"must not exceed dedup.threshold ({t}): the LSH would miss pairs the threshold accepts")
        return v

    @model_validator(mode="after")
    def _bands(self):
        b, r = self.lsh_params()
        if b * r > self.num_perm:
            raise ValueError(f"dedup.bands x dedup.rows = {b} x {r} = {b * r} exceeds dedup.num_perm = {self.num_perm}")
        if b < 2:
            raise ValueError(f"dedup.bands must be at least 2 (got {b} from num_perm={self.num_perm}, rows={r})")
        return self

    def lsh_params(self) -> tuple[int, int]:
        """(bands, rows): as given, one derived from the other, or datasketch's optimum for `lsh_threshold`."""
        if self.bands and self.rows:
            return self.bands, self.rows
        if self.bands:
            return self.bands, max(1, self.num_perm // self.bands)
        if self.rows:
            return max(1, self.num_perm // self.rows), self.rows
        return _optimal_bands(self.lsh_threshold, self.num_perm)

    def index_params(self) -> dict:
        """What must match between a stored index and this config."""
        b, r = self.lsh_params()
        return {"ngram": self.ngram, "num_perm": self.num_perm, "bands": b, "rows": r, "seed": self.seed,
                "verify": self.verify, "scheme": SCHEME, "shingle_hash": SHINGLE_HASH, "band_hash": BAND_HASH,
                "layout": LAYOUT}


@lru_cache(maxsize=64)
def _optimal_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """datasketch's own choice of (bands, rows) for a threshold (equal false positive/negative weights)."""
    from datasketch.lsh import _optimal_param
    return _optimal_param(threshold, num_perm, 0.5, 0.5)


# ---- step 1: signatures -----------------------------------------------------------------------

def code_version() -> str:
    return module_version(sys.modules[__name__], sys.modules["quipu.tasks.dedup_index"],
                          sys.modules["quipu.tasks.minhash"], sys.modules["quipu.tasks.partitions"])


def _dirs(ctx: RunContext) -> dict[str, Path]:
    layout = ctx.layout(STAGE)
    return {"sig": layout.scratch("_sig"), "plan": layout.scratch("_plan")}


def _crash(point: str) -> None:
    """Fault injection for the kill tests: die like SIGKILL (no cleanup) at a named step."""
    if os.environ.get(CRASH_ENV) == point:
        os._exit(137)


def _files_intact(files: dict[str, dict]) -> bool:
    return all(Path(f["path"]).exists() and sha256_file(f["path"]) == f["sha256"] for f in files.values())


def _run_files(run: SortedRun) -> dict[str, dict]:
    return {f"{Path(run.prefix).name}.{c}": {"path": run.path(c), "sha256": sha256_file(run.path(c))} for c in run.columns}


def digest_words(digests: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """The 128-bit exact hashes as two uint64 (high word first: the sort and partition key)."""
    raw = np.frombuffer(b"".join(digests), dtype=">u8").reshape(-1, 2) if digests else np.zeros((0, 2), ">u8")
    return raw[:, 0].astype(np.uint64), raw[:, 1].astype(np.uint64)


def band_rows(sigs: np.ndarray, has_shingles: np.ndarray, digest_hi: np.ndarray, refs: np.ndarray,
              cfg: DedupConfig) -> dict[str, np.ndarray]:
    """One row per band of every document with shingles: (band hash, exact-hash prefix, ref)."""
    bands, rows = cfg.lsh_params()
    sel = np.nonzero(has_shingles)[0]
    keys = band_keys(np.asarray(sigs[sel]), bands, rows) if len(sel) else np.zeros((0, bands), np.uint64)
    return {"key": keys.reshape(-1), "digest": np.repeat(digest_hi[sel], bands),
            "ref": np.repeat(refs[sel].astype(np.uint64), bands)}


def compute_signatures(shard: Shard, ctx: RunContext, cfg: DedupConfig) -> dict:
    """Signature files of one shard: meta.parquet (id, exact digest, shingle count, quality),
    sig.npy (docs x num_perm), shingles.npy + offsets in meta (with exact verification), and the
    shard's band rows and exact-hash rows, each sorted by hash (what the plan partitions read)."""
    d = _dirs(ctx)["sig"]
    marker = d / f"{shard.name}.json"
    fp = sha256_json({"input": shard.sha256, "code": code_version(), "quality": cfg.quality_column,
                      "params": cfg.index_params()})
    if marker.exists():
        done = read_json(marker)
        if done.get("fingerprint") == fp and _files_intact(done["files"]):
            return done
    t0 = time.perf_counter()
    hasher = MinHasher(cfg.ngram, cfg.num_perm, cfg.seed)
    pf = pq.ParquetFile(shard.path)
    has_quality = cfg.quality_column in pf.schema_arrow.names
    cols = ["id", "text"] + ([cfg.quality_column] if has_quality else [])
    ids, digests, counts, quality, sigs, shingles = [], [], [], [], [], []
    for rb in pf.iter_batches(batch_size=cfg.batch_rows, columns=cols):
        flat, lengths = tokenize(rb.column("text"))
        hashes, offsets = hasher.hashes_of_words(flat, lengths)
        sigs.append(hasher.signatures(hashes, offsets))
        shingles.append(hashes)
        counts.append(np.diff(offsets))
        ids.extend(rb.column("id").to_pylist())
        digests.extend(exact_digests(flat, lengths))
        q = rb.column(cfg.quality_column).cast(pa.float64()) if has_quality else pa.nulls(rb.num_rows, pa.float64())
        quality.append(q)
    n_shingles = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    offsets = np.zeros(len(n_shingles) + 1, dtype=np.int64)
    np.cumsum(n_shingles, out=offsets[1:])
    meta = pa.table({"id": pa.array(ids, pa.string()), "exact": pa.array(digests, pa.binary(16)),
                     "n_shingles": pa.array(n_shingles.astype(np.int32)),
                     "offset": pa.array(offsets[:-1]),
                     "quality": pa.concat_arrays(quality) if quality else pa.array([], pa.float64())})
    paths = {"meta": d / f"{shard.name}.meta.parquet", "sig": d / f"{shard.name}.sig.npy"}
    with atomic_path(paths["meta"]) as tmp:
        pq.write_table(meta, tmp, compression="zstd")
    sig = np.concatenate(sigs) if sigs else np.zeros((0, cfg.num_perm), np.uint32)
    save_npy(paths["sig"], sig)
    if cfg.verify == "exact":
        paths["shingles"] = d / f"{shard.name}.shingles.npy"
        save_npy(paths["shingles"], np.concatenate(shingles) if shingles else np.zeros(0, np.uint32))
    hi, lo = digest_words(digests)
    rows = np.arange(len(ids), dtype=np.uint64)
    bands = SortedRun.write(d / f"{shard.name}.bands", band_rows(sig, n_shingles > 0, hi, rows, cfg))
    exact = SortedRun.write(d / f"{shard.name}.exact", {"hi": hi, "lo": lo, "ref": rows})
    files = {k: {"path": str(p), "sha256": sha256_file(p)} for k, p in paths.items()}
    files.update(_run_files(bands))
    files.update(_run_files(exact))
    result = {"shard": shard.model_dump(), "fingerprint": fp, "rows": len(ids), "has_quality": has_quality,
              "files": files, "bands": bands.model_dump(), "exact": exact.model_dump(),
              "seconds": round(time.perf_counter() - t0, 3)}
    write_json_atomic(marker, result)
    _crash("signatures")
    return result


class LocalDocs:
    """This run's documents by ref (LOCAL_FLAG | position in shard order): signatures, shingles,
    ids, read from the memory-mapped signature files of each shard, opened when first needed."""

    def __init__(self, sig_results: list[dict]):
        self.results = sig_results
        self.bases = np.concatenate([[0], np.cumsum([s["rows"] for s in sig_results])]).astype(np.int64)
        self._open: dict[int, dict] = {}

    def __len__(self) -> int:
        return int(self.bases[-1])

    def locate(self, ref: int) -> tuple[int, int]:
        n = int(ref) - LOCAL
        f = int(np.searchsorted(self.bases, n, side="right")) - 1
        return f, n - int(self.bases[f])

    def _file(self, f: int) -> dict:
        o = self._open.get(f)
        if o is None:
            files = self.results[f]["files"]
            meta = pq.read_table(files["meta"]["path"], columns=["n_shingles", "offset"])
            n = meta.column("n_shingles").to_numpy()
            o = self._open[f] = {
                "sig": NpyRows(files["sig"]["path"]),
                "flat": NpyRows(files["shingles"]["path"]) if "shingles" in files else None,
                "offsets": np.append(meta.column("offset").to_numpy(), int(n.sum()) if len(n) else 0)}
        return o

    def signature(self, ref: int) -> np.ndarray:
        f, r = self.locate(ref)
        return self._file(f)["sig"].rows(r, r + 1)[0]

    def signatures(self, refs: np.ndarray) -> np.ndarray:
        """(len(refs), num_perm): the signatures of many documents, read shard by shard."""
        n = (refs & ~LOCAL_FLAG).astype(np.int64)
        f = np.searchsorted(self.bases, n, side="right") - 1
        out = None
        for k in np.unique(f):
            sel = np.nonzero(f == k)[0]
            sig = self._file(int(k))["sig"]
            if out is None:
                out = np.empty((len(refs), *sig.row_shape), np.uint32)
            out[sel] = sig.take(n[sel] - self.bases[k])
        return out if out is not None else np.zeros((0, 0), np.uint32)

    def shingles(self, ref: int) -> np.ndarray:
        f, r = self.locate(ref)
        o = self._file(f)
        return o["flat"].rows(o["offsets"][r], o["offsets"][r + 1])

    def close(self) -> None:
        for o in self._open.values():
            o["sig"].close()
            if o["flat"] is not None:
                o["flat"].close()
        self._open.clear()

    def column(self, f: int, name: str) -> np.ndarray | list:
        col = pq.read_table(self.results[f]["files"]["meta"]["path"], columns=[name]).column(name)
        return col.to_pylist() if name in ("id", "exact") else col.to_numpy(zero_copy_only=False)


class Docs:
    """Every document a plan can name, by ref: this run's (LocalDocs) and the index's."""

    def __init__(self, local: LocalDocs, index: DedupIndex | None, cfg: DedupConfig):
        self.local, self.index, self.cfg = local, index, cfg
        self._sets: dict[int, np.ndarray] = {}

    def signature(self, ref: int) -> np.ndarray:
        return self.local.signature(ref) if ref >= LOCAL else self.index.signature(ref)

    def signatures(self, refs: np.ndarray) -> np.ndarray:
        local = refs >= LOCAL_FLAG
        if local.all():
            return self.local.signatures(refs)
        out = np.stack([self.signature(int(r)) for r in refs[~local]]) if (~local).any() else None
        full = np.empty((len(refs), out.shape[1]), np.uint32)
        full[~local] = out
        if local.any():
            full[local] = self.local.signatures(refs[local])
        return full

    def shingle_set(self, ref: int) -> np.ndarray:
        s = self._sets.get(ref)
        if s is None:
            raw = self.local.shingles(ref) if ref >= LOCAL else self.index.shingles(ref)
            if len(self._sets) > 50_000:
                self._sets.clear()
            s = self._sets[ref] = np.unique(raw)
        return s

    def jaccard(self, a: int, b: int) -> float:
        if self.cfg.verify == "exact":
            x, y = self.shingle_set(a), self.shingle_set(b)
            inter = len(np.intersect1d(x, y, assume_unique=True))
            return inter / (len(x) + len(y) - inter)
        return float(np.mean(self.signature(a) == self.signature(b)))


# ---- the index ----------------------------------------------------------------------------------

def index_name(cfg: DedupConfig, ctx: RunContext | None) -> str:
    """`dedup.index`, else the curate config's `dataset` (runs naming the same one share the index),
    else one index private to the output folder: `<folder name>-<hash of its path and the index
    parameters>` (two unrelated runs into folders that happen to share a name must not remove each
    other's documents). "" when it depends on a run folder that is not given."""
    import re
    name = cfg.index or (ctx.dataset if ctx is not None else None)
    if name:
        return check_name(name, "dedup index name")
    if ctx is None:
        return ""
    p = Path(ctx.run_dir)
    folder = re.sub(r"[^A-Za-z0-9._-]", "_", p.name).lstrip("._-")[:60] or "run"
    return f"{folder}-{sha256_json({'path': str(p), 'params': cfg.index_params()})[:8]}"


def index_location(cfg: DedupConfig, ctx: RunContext | None) -> Path:
    from quipu.catalog.db import quipu_home
    return Path(cfg.index_dir) if cfg.index_dir else quipu_home() / "dedup" / index_name(cfg, ctx)



def open_store(cfg: DedupConfig, ctx: RunContext | None) -> FileStore | RedisStore | None:
    if not cfg.enabled or cfg.backend == "none":
        return None
    if cfg.backend == "redis":
        try:
            return RedisStore(cfg.redis.model_dump(), index_name(cfg, ctx))
        except ConnectionError as e:
            raise ValueError(str(e)) from None
    return FileStore(index_location(cfg, ctx))


def check_dedup(cfg: DedupConfig, ctx: RunContext | None = None) -> None:
    """Before any document is read: Redis reachable, a stored index built with these parameters."""
    if not cfg.enabled or cfg.backend == "none":
        return
    if cfg.backend == "file" and not (index_name(cfg, ctx) or cfg.index_dir):
        return
    store = open_store(cfg, ctx)
    stored = store.raw_params()
    if stored is not None:
        check_params(stored, cfg.index_params(), store.location)


def open_index(cfg: DedupConfig, ctx: RunContext) -> DedupIndex | None:
    store = open_store(cfg, ctx)
    return DedupIndex(store, cfg.index_params(), ctx.run_dir) if store is not None else None


# ---- step 2: plan, per partition in parallel, then a combine ----------------------------------

KEPT, EXACT, NEAR = "kept", "exact_dup", "near_dup"
LOCAL = int(LOCAL_FLAG)      # refs of this run's documents start here, after every generation's


def plan_fingerprint(cfg: DedupConfig, sig_results: list[dict], ctx: RunContext) -> str:
    return sha256_json({"sigs": [s["fingerprint"] for s in sig_results], "code": code_version(),
                        "config": cfg.model_dump(mode="json", exclude={"batch_rows", "redis", "index_dir"}),
                        "index": index_name(cfg, ctx)})


def plan_partitions(sig_results: list[dict], ctx: RunContext, cfg: DedupConfig) -> list[dict]:
    """The plan's partitions (equal ranges of the hash space), sized by the band rows of this run
    and of the index, each a small dict a task can take."""
    index = open_index(cfg, ctx)
    rows = sum(s["bands"]["rows"] for s in sig_results) + (index.band_rows_total() if index else 0)
    n = cfg.partitions or n_partitions(rows, cfg.partition_rows, minimum=2)
    edges = bounds(n)
    next_gen = index.manifest.next_gen if index else 1
    plan_id = plan_fingerprint(cfg, sig_results, ctx)
    return [{"p": p, "n": n, "lo": edges[p], "hi": edges[p + 1], "plan": plan_id, "next_gen": next_gen,
             "index": index.generations_fingerprint() if index else []} for p in range(n)]


def _global_refs(sig_results: list[dict], kind: str, lo: int, hi: int) -> dict[str, np.ndarray]:
    parts = []
    base = 0
    for s in sig_results:
        cols = SortedRun(**s[kind]).slice(lo, hi)
        cols["ref"] = cols["ref"] + np.uint64(base) | LOCAL_FLAG
        parts.append(cols)
        base += s["rows"]
    names = BAND_COLUMNS if kind == "bands" else EXACT_COLUMNS
    return {c: np.concatenate([p[c] for p in parts]) if parts else np.empty(0, np.uint64) for c in names}


def _merge(local: dict[str, np.ndarray], index: dict[str, np.ndarray], order: list[str]) -> dict[str, np.ndarray]:
    """Rows sorted by `order`: index rows (smaller refs) first and this run's in ref order, so a
    stable sort on the other columns leaves equal rows in ref order."""
    cols = {c: np.concatenate([index[c], local[c]]).astype(np.uint64, copy=False) for c in order}
    idx = np.lexsort([cols[c] for c in reversed(order[:-1])])
    return {c: v[idx] for c, v in cols.items()}


def bucket_pairs(rows: dict[str, np.ndarray], cap: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Candidate pairs (a < b by ref) of band rows sorted by (key, digest, ref): in each bucket
    (equal key), documents with the same exact-hash prefix collapse to the first (its copies pair
    with it only), and each remaining document pairs with up to `cap` earlier ones."""
    key, digest, ref = rows["key"], rows["digest"], rows["ref"]
    n = len(key)
    stats = {"band_rows": n, "buckets_over_cap": 0}
    if n < 2:
        return np.empty(0, np.uint64), np.empty(0, np.uint64), stats
    new_group = np.ones(n, bool)
    new_group[1:] = (key[1:] != key[:-1]) | (digest[1:] != digest[:-1])
    group_first = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    copies = ~new_group
    a_copy, b_copy = ref[group_first[copies]], ref[copies]          # a copy and its bucket's first copy
    reps = np.nonzero(new_group)[0]
    rk, rr = key[reps], ref[reps]
    order = np.lexsort([rr, rk])                                    # earliest documents first in a bucket
    rk, rr = rk[order], rr[order]
    starts = np.ones(len(rk), bool)
    starts[1:] = rk[1:] != rk[:-1]
    bucket_start = np.maximum.accumulate(np.where(starts, np.arange(len(rk)), 0))
    pos = np.arange(len(rk)) - bucket_start                         # position in its bucket
    k = np.minimum(pos, cap)                                        # pairs with the k earliest
    size = np.bincount(np.cumsum(starts) - 1)
    stats["buckets_over_cap"] = int((size > cap + 1).sum())
    total = int(k.sum())
    if total:
        i = np.repeat(np.arange(len(rk)), k)
        j = bucket_start[i] + (np.arange(total) - np.repeat(np.cumsum(k) - k, k))
        a_rep, b_rep = rr[j], rr[i]
    else:
        a_rep = b_rep = np.empty(0, np.uint64)
    a = np.concatenate([a_copy, a_rep])
    b = np.concatenate([b_copy, b_rep])
    lo_, hi_ = np.minimum(a, b), np.maximum(a, b)
    keep = lo_ != hi_
    return _unique_pairs(lo_[keep], hi_[keep]) + (stats,)


def _unique_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(a) == 0:
        return a, b
    order = np.lexsort([b, a])
    a, b = a[order], b[order]
    first = np.ones(len(a), bool)
    first[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return a[first], b[first]


def owned(a: np.ndarray, b: np.ndarray, docs: Docs, cfg: DedupConfig, part: dict) -> np.ndarray:
    """Which pairs this partition verifies: those whose first shared band hash falls in it (a pair
    sharing several bands is found in several partitions and verified once)."""
    bands, rows = cfg.lsh_params()
    out = np.zeros(len(a), bool)
    for s in range(0, len(a), 20_000):
        sa, sb = docs.signatures(a[s:s + 20_000]), docs.signatures(b[s:s + 20_000])
        ka, kb = band_keys(sa, bands, rows), band_keys(sb, bands, rows)
        same = ka == kb
        first = np.argmax(same, axis=1)
        key = ka[np.arange(len(first)), first]
        out[s:s + len(first)] = same.any(axis=1) & (partition_of(key, part["n"]) == part["p"])
    return out


def plan_partition(sig_results: list[dict], part: dict, ctx: RunContext, cfg: DedupConfig) -> dict:
    """One hash range: candidate pairs from the band buckets, verified; exact groups. Writes
    `_plan/part-<p>.*.npy` and a marker; a rerun with the same inputs and index reuses them."""
    d = _dirs(ctx)["plan"]
    marker = d / f"part-{part['p']:04d}.json"
    fp = sha256_json({"part": part, "code": code_version()})
    if marker.exists():
        done = read_json(marker)
        if done.get("fingerprint") == fp and _files_intact(done["files"]):
            return done
    t0 = time.perf_counter()
    index = open_index(cfg, ctx)
    if index is not None and index.manifest.next_gen != part["next_gen"]:
        from quipu.tasks.dedup_index import ConcurrentCommit
        raise ConcurrentCommit(f"the dedup index at {index.location} changed while this run was planning: rerun")
    docs = Docs(LocalDocs(sig_results), index, cfg)
    lo, hi = part["lo"], part["hi"]
    empty_b = {c: np.empty(0, np.uint64) for c in ("key", "digest", "ref")}
    empty_e = {c: np.empty(0, np.uint64) for c in ("hi", "lo", "ref")}

    band = _merge(_global_refs(sig_results, "bands", lo, hi), index.band_rows(lo, hi) if index else empty_b,
                  ["key", "digest", "ref"])
    held_bytes = 24 * len(band["key"])
    a, b, stats = bucket_pairs(band, cfg.bucket_cap)
    del band
    local_pair = b >= LOCAL_FLAG                     # a pair of two index documents decides nothing
    a, b = a[local_pair], b[local_pair]
    stats["candidate_pairs"] = int(len(a))
    mine = owned(a, b, docs, cfg, part) if len(a) else np.zeros(0, bool)
    a, b = a[mine], b[mine]
    jac = np.array([docs.jaccard(int(x), int(y)) for x, y in zip(a, b)], dtype=np.float64)
    stats["verified_pairs"] = int(len(a))
    stats["similar_pairs"] = int((jac >= cfg.threshold).sum())

    ex = _merge(_global_refs(sig_results, "exact", lo, hi), index.exact_rows(lo, hi) if index else empty_e,
                ["hi", "lo", "ref"])
    held_bytes = max(held_bytes, 24 * len(ex["hi"]))
    n = len(ex["hi"])
    first = np.ones(n, bool)
    if n:
        first[1:] = (ex["hi"][1:] != ex["hi"][:-1]) | (ex["lo"][1:] != ex["lo"][:-1])
    leader = ex["ref"][np.maximum.accumulate(np.where(first, np.arange(n), 0))] if n else ex["ref"]
    last = np.ones(n, bool)
    if n:
        last[:-1] = first[1:]
    in_group = ~(first & last)                       # members of groups of two or more
    member, leader = ex["ref"][in_group], leader[in_group]
    stats["exact_group_members"] = int(len(member))

    out = {"a": a, "b": b, "jaccard": jac, "member": member, "leader": leader}
    files = {}
    for name, arr in out.items():
        path = d / f"part-{part['p']:04d}.{name}.npy"
        save_npy(path, arr)
        files[name] = {"path": str(path), "sha256": sha256_file(path)}
    docs.local.close()
    if index is not None:
        index.close()
    import socket
    result = {"p": part["p"], "lo": lo, "hi": hi, "next_gen": part["next_gen"], "fingerprint": fp,
              "files": files, "stats": stats, "held_bytes": held_bytes,
              "ran_in": {"host": socket.gethostname(), "pid": os.getpid()},     # which worker planned it
              "seconds": round(time.perf_counter() - t0, 3)}
    write_json_atomic(marker, result)
    return result


def _reusable_plan(marker: Path, plan_id: str, cfg: DedupConfig, ctx: RunContext) -> dict | None:
    """The stored plan, if it is this plan and nothing was committed since (or it was its commit)."""
    if not marker.exists():
        return None
    done = read_json(marker)
    if done.get("plan") != plan_id or not _files_intact(done["decisions"]):
        return None
    index = open_index(cfg, ctx)
    if index is None:
        return done
    committed = index.manifest.committed_plan(plan_id)
    if (committed and committed.gen == done["gen"]) or index.manifest.next_gen == done["expected_next_gen"]:
        return done
    return None


class Combine:
    """The decisions from the partitions' verified pairs and exact groups: documents in policy
    order, each an exact duplicate of a kept copy, else a near duplicate of its most similar kept
    candidate, else kept. Only documents with a pair or a copy are visited."""

    def __init__(self, cfg: DedupConfig, local: LocalDocs, partials: list[dict]):
        self.cfg, self.local = cfg, local
        load = lambda name: np.concatenate([np.load(p["files"][name]["path"]) for p in partials]) if partials else np.empty(0)
        a, b, jac = load("a").astype(np.uint64), load("b").astype(np.uint64), load("jaccard").astype(np.float64)
        member, leader = load("member").astype(np.uint64), load("leader").astype(np.uint64)
        self.group: dict[int, int] = dict(zip(member.tolist(), leader.tolist()))
        self.pairs_verified = len(a)
        near = jac >= cfg.threshold
        a, b, jac = a[near], b[near], jac[near]
        # candidates by group: (group of one side, the other side, jaccard), both directions
        ga = np.array([self.group.get(x, x) for x in a.tolist()], dtype=np.uint64)
        gb = np.array([self.group.get(x, x) for x in b.tolist()], dtype=np.uint64)
        src, dst, j = np.concatenate([ga, gb]), np.concatenate([b, a]), np.concatenate([jac, jac])
        other_group = np.concatenate([gb, ga])
        keep = src != other_group                       # copies of one text are one group, not a pair
        src, dst, j = src[keep], dst[keep], j[keep]
        order = np.argsort(src, kind="stable")
        self.src, self.dst, self.j = src[order], dst[order], j[order]
        involved = np.unique(np.concatenate([a, b, member]))
        self.involved = involved[involved >= LOCAL_FLAG]

    def cands(self, g: int) -> tuple[np.ndarray, np.ndarray]:
        s = np.searchsorted(self.src, np.uint64(g), side="left")
        e = np.searchsorted(self.src, np.uint64(g), side="right")
        return self.dst[s:e], self.j[s:e]

    def order(self, stats: Counter) -> list[int]:
        refs = self.involved.tolist()
        if self.cfg.policy != "quality":
            return refs
        if not any(s["has_quality"] for s in self.local.results):
            stats["quality_column_missing"] = 1
            return refs
        q = {}
        by_file: dict[int, list[tuple[int, int]]] = {}
        for ref in refs:
            f, r = self.local.locate(ref)
            by_file.setdefault(f, []).append((ref, r))
        for f, items in by_file.items():
            col = self.local.column(f, "quality")
            for ref, r in items:
                q[ref] = float(col[r])
        return sorted(refs, key=lambda x: (0, -q[x], x) if not np.isnan(q[x]) else (1, 0.0, x))

    def run(self, has_shingles) -> tuple[dict[int, tuple[str, int, float]], Counter, list[int]]:
        """{ref: (status, kept twin's ref, jaccard)} for removed documents, stats, processing order."""
        cfg = self.cfg
        stats = Counter()
        kept_of_group: dict[int, int] = {}      # group -> its first kept document
        for m, lead in self.group.items():      # index documents are kept; the earliest one leads
            if lead < LOCAL:
                kept_of_group[lead] = lead
        rank: dict[int, tuple[int, int]] = {}   # kept local ref -> (1, order it was kept in)
        removed: dict[int, tuple[str, int, float]] = {}
        order = self.order(stats)
        for x in order:
            g = self.group.get(x, x)
            if cfg.exact and g in kept_of_group:
                removed[x] = (EXACT, kept_of_group[g], 1.0)
                continue
            if cfg.near and has_shingles(x):
                best = None
                if g in kept_of_group:          # exact: false: a kept copy is a near duplicate at 1.0
                    best = (1.0, self._rank(kept_of_group[g], rank), kept_of_group[g])
                dst, js = self.cands(g)
                for k, jac in zip(dst.tolist(), js.tolist()):
                    gk = self.group.get(k, k)
                    kept = kept_of_group.get(gk, gk if gk < LOCAL else None)   # earlier runs' are kept
                    if kept is None:
                        continue
                    cand = (jac, self._rank(kept, rank), kept)
                    if best is None or cand[0] > best[0] or (cand[0] == best[0] and cand[1] < best[1]):
                        best = cand
                if best is not None:
                    removed[x] = (NEAR, best[2], best[0])
                    continue
            rank[x] = (1, len(rank))
            kept_of_group.setdefault(g, x)
        return removed, stats, order

    @staticmethod
    def _rank(ref: int, rank: dict) -> tuple[int, int]:
        return rank[ref] if ref >= LOCAL else (0, ref)


def plan(sig_results: list[dict], partials: list[dict], ctx: RunContext, cfg: DedupConfig) -> dict:
    """The combine: decisions from the partitions' pairs; writes per shard the rows that are not
    plain keeps (removed rows, kept rows with duplicates) and the plan marker."""
    d = _dirs(ctx)["plan"]
    marker = d / "plan.json"
    plan_id = plan_fingerprint(cfg, sig_results, ctx)
    done = _reusable_plan(marker, plan_id, cfg, ctx)
    if done is not None:
        return done
    t0 = time.perf_counter()
    index = open_index(cfg, ctx)
    gen = partials[0]["next_gen"] if partials else (index.manifest.next_gen if index else 1)
    local = LocalDocs(sig_results)
    combine = Combine(cfg, local, partials)
    n_shingles: dict[int, np.ndarray] = {}

    def has_shingles(ref: int) -> bool:
        f, r = local.locate(ref)
        if f not in n_shingles:
            n_shingles[f] = local.column(f, "n_shingles")
        return bool(n_shingles[f][r] > 0)

    removed, stats, order = combine.run(has_shingles)
    t_plan = time.perf_counter() - t0

    # keys of kept documents: this run's in (shard, row) order after every earlier generation
    removed_sorted = np.array(sorted(removed), dtype=np.uint64)

    def local_key(ref: int) -> str:
        n = ref - LOCAL
        return make_key(gen, n - int(np.searchsorted(removed_sorted, np.uint64(ref))))

    def key_of(ref: int) -> str:
        return local_key(ref) if ref >= LOCAL else ref_key(ref)

    twins = sorted({t for _, t, _ in removed.values()})
    ids = _ids_of(twins, local, index)
    dup_count = Counter(t for _, t, _ in removed.values())
    counts = Counter(st for st, _, _ in removed.values())

    by_file: dict[int, list[int]] = {}
    for ref in list(removed) + [t for t in dup_count if t >= LOCAL]:
        by_file.setdefault(local.locate(ref)[0], []).append(ref)
    outputs: dict[str, dict] = {}
    for f, s in enumerate(sig_results):
        refs = sorted(set(by_file.get(f, [])))
        rows, status, dup_of, cluster, jac, size = [], [], [], [], [], []
        for ref in refs:
            rows.append(local.locate(ref)[1])
            if ref in removed:
                st, twin, j = removed[ref]
                status.append(st); dup_of.append(ids[twin]); cluster.append(key_of(twin)); jac.append(j); size.append(None)
            else:
                status.append(KEPT); dup_of.append(None); cluster.append(key_of(ref)); jac.append(None)
                size.append(1 + dup_count[ref])
        table = pa.table({"row": pa.array(rows, pa.int64()), "status": pa.array(status, pa.string()),
                          "dup_of": pa.array(dup_of, pa.string()), "cluster_id": pa.array(cluster, pa.string()),
                          "dup_jaccard": pa.array(jac, pa.float64()), "dup_count": pa.array(size, pa.int64())})
        path = d / f"{s['shard']['name']}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        outputs[s["shard"]["name"]] = {"path": str(path), "sha256": sha256_file(path)}

    hist = Counter(n + 1 for n in dup_count.values())    # members removed + the kept one
    examples = _pick_examples(order, removed, local, docs=Docs(local, index, cfg), key_of=key_of, ids=ids)
    local.close()
    if index is not None:
        index.close()
    total = len(local)
    kept = total - len(removed)
    bands, rows = cfg.lsh_params()
    part_stats = Counter()
    for p in partials:
        part_stats.update(p["stats"])
    result = {
        "plan": plan_id, "gen": gen, "expected_next_gen": gen, "decisions": outputs,
        "partitions": [{"lo": str(p["lo"]), "hi": str(p["hi"])} for p in (partials or [])],
        "index": {"backend": cfg.backend, "name": index_name(cfg, ctx), "location": index.location if index else None,
                  "docs_before": index.size() if index else 0, "docs_after": (index.size() if index else 0) + kept,
                  "bands": bands, "rows": rows, "num_perm": cfg.num_perm,
                  "twins_in_index": sum(n for t, n in dup_count.items() if t < LOCAL)},
        "input_docs": total, "kept_docs": kept, "exact_dup": counts[EXACT], "near_dup": counts[NEAR],
        "exact_dup_rate": round(counts[EXACT] / total, 6) if total else 0.0,
        "near_dup_rate": round(counts[NEAR] / total, 6) if total else 0.0,
        "cluster_size_histogram": {str(k): v for k, v in sorted(hist.items())},
        "examples": examples, "candidates": combine.pairs_verified,
        "plan_partitions": len(partials), "largest_partition_bytes": max((p["held_bytes"] for p in partials), default=0),
        "partition_stats": dict(part_stats),
        "partition_seconds": round(sum(p["seconds"] for p in partials), 3),
        "policy_note": "quality column missing: first_seen order used" if stats["quality_column_missing"] else None,
        "seconds": round(time.perf_counter() - t0, 3), "combine_seconds": round(t_plan, 3),
    }
    write_json_atomic(marker, result)
    _crash("plan")
    return result


def _ids_of(refs: list[int], local: LocalDocs, index: DedupIndex | None) -> dict[int, str]:
    out: dict[int, str] = {}
    by_file: dict[int, list[tuple[int, int]]] = {}
    for ref in refs:
        if ref >= LOCAL:
            f, r = local.locate(ref)
            by_file.setdefault(f, []).append((ref, r))
    for f, items in by_file.items():
        ids = pq.read_table(local.results[f]["files"]["meta"]["path"], columns=["id"]).column("id")
        for ref, r in items:
            out[ref] = ids[r].as_py()
    earlier = [r for r in refs if r < LOCAL]
    if earlier:
        out.update(index.doc_ids_of(earlier))
    return out


def _pick_examples(order, removed, local: LocalDocs, docs: Docs, key_of, ids) -> list[dict]:
    """Three example pairs for the report: near duplicates first (in processing order), then exact."""
    near = [x for x in order if x in removed and removed[x][0] == NEAR][:3]
    exact = [x for x in order if x in removed and removed[x][0] == EXACT][:3 - len(near)]
    out = []
    for x in near + exact:
        st, twin, jac = removed[x]
        f, r = local.locate(x)
        kept_loc = local.locate(twin) if twin >= LOCAL else None
        est = float(np.mean(docs.signature(twin) == docs.signature(x)))
        out.append({"removed_id": _ids_of([x], local, None)[x], "removed_shard": local.results[f]["shard"]["name"],
                    "removed_row": r, "kept_id": ids[twin], "cluster_id": key_of(twin),
                    "kept_shard": local.results[kept_loc[0]]["shard"]["name"] if kept_loc else None,
                    "kept_row": kept_loc[1] if kept_loc else None,
                    "jaccard": round(jac, 4), "estimated_jaccard": round(est, 4)})
    return out


DUP_FIELDS = [pa.field("dup_of", pa.string()), pa.field("cluster_id", pa.string()), pa.field("dup_jaccard", pa.float64())]
DUP_COUNT = pa.field("dup_count", pa.int64())


# ---- step 4: commit ---------------------------------------------------------------------------

def _removed_rows(plan_result: dict, name: str) -> np.ndarray:
    dec = pq.read_table(plan_result["decisions"][name]["path"], columns=["row", "status"])
    rm = pc.not_equal(dec.column("status"), KEPT)
    return np.asarray(dec.column("row").filter(rm).to_numpy(), dtype=np.int64)


def segment_parts(sig_results: list[dict], plan_result: dict):
    """This run's kept documents per shard, in key order (shard, row). One shard's files are mapped
    at a time (a mapping kept open would keep every page read resident)."""
    for s in sig_results:
        files = s["files"]
        keep = np.ones(s["rows"], bool)
        keep[_removed_rows(plan_result, s["shard"]["name"])] = False
        rows = np.nonzero(keep)[0]
        meta = pq.read_table(files["meta"]["path"], columns=["id", "exact", "n_shingles"])
        flat = offs = None
        if "shingles" in files:
            lengths = meta.column("n_shingles").to_numpy().astype(np.int64)
            offs = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(lengths[rows], out=offs[1:])
            flat = np.load(files["shingles"]["path"])[np.repeat(keep, lengths)]
        sigs = np.load(files["sig"]["path"], mmap_mode="r")
        part = SegmentPart(ids=meta.column("id").take(pa.array(rows)).to_pylist(),
                           exact=meta.column("exact").take(pa.array(rows)).to_pylist(),
                           sigs=np.array(sigs[rows]), shingles=flat, offsets=offs)
        del sigs, meta
        yield part


def band_parts(sig_results: list[dict], plan_result: dict, gen: int):
    """This run's kept documents' band and exact rows, per plan partition, with index refs."""
    removed = []
    base = 0
    for s in sig_results:
        removed.append(_removed_rows(plan_result, s["shard"]["name"]) + base)
        base += s["rows"]
    removed = np.sort(np.concatenate(removed)) if removed else np.zeros(0, np.int64)

    def to_index(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Drop removed documents; a kept one's ref becomes gen << 36 | its position among the kept."""
        pos = (cols["ref"] & ~LOCAL_FLAG).astype(np.int64)
        before = np.searchsorted(removed, pos)             # removed documents before it
        is_removed = np.zeros(len(pos), bool)
        if len(removed):
            is_removed = removed[np.minimum(before, len(removed) - 1)] == pos
        keep = ~is_removed
        out = {c: v[keep] for c, v in cols.items()}
        out["ref"] = index_ref_array(gen, pos[keep] - before[keep])
        return out

    for p in plan_result["partitions"]:
        lo, hi = int(p["lo"]), int(p["hi"])
        bands = to_index(_global_refs(sig_results, "bands", lo, hi))
        exact = to_index(_global_refs(sig_results, "exact", lo, hi))
        o = np.lexsort([bands["ref"], bands["digest"], bands["key"]])
        e = np.lexsort([exact["ref"], exact["lo"], exact["hi"]])
        yield BandPart(lo=lo, hi=hi, bands={c: v[o] for c, v in bands.items()}, exact={c: v[e] for c, v in exact.items()})


def index_ref_array(gen: int, n: np.ndarray) -> np.ndarray:
    return (np.uint64(gen) << np.uint64(GEN_SHIFT)) | n.astype(np.uint64)


def commit(sig_results: list[dict], plan_result: dict, ctx: RunContext, cfg: DedupConfig) -> dict:
    """Add this run's kept documents to the index, once, after every output shard exists."""
    if cfg.backend == "none":
        return {"committed": False, "reason": "backend none"}
    t0 = time.perf_counter()
    index = open_index(cfg, ctx)
    done = index.manifest.committed_plan(plan_result["plan"])
    if done is not None and done.gen == plan_result["gen"]:
        return {"committed": True, "gen": done.gen, "skipped": True, "disk_bytes": index.disk_bytes()}
    index.commit(plan_result["gen"], plan_result["expected_next_gen"], plan_result["plan"],
                 segment_parts(sig_results, plan_result), band_parts(sig_results, plan_result, plan_result["gen"]),
                 crash_hook=_crash)
    info = {"committed": True, "gen": plan_result["gen"], "skipped": False, "disk_bytes": index.disk_bytes(),
            "location": index.location, "backend": index.backend, "seconds": round(time.perf_counter() - t0, 3)}
    try:
        from quipu.catalog import registry
        registry.kv_put_many("dedup_index", {index_name(cfg, ctx): {
            "backend": index.backend, "location": index.location, "generation": plan_result["gen"],
            "docs": plan_result["index"]["docs_after"], "run_dir": ctx.run_dir}})
    except Exception as e:  # the index is committed; the catalog entry is only a pointer to it
        info["catalog_error"] = str(e)
    return info


def _example_pairs(plan_result: dict, sig_results: list[dict]) -> list[dict]:
    shards = {s["shard"]["name"]: s["shard"]["path"] for s in sig_results}

    def text_at(shard: str | None, row: int | None) -> str | None:
        if shard is None:
            return None
        seen = 0
        for rb in pq.ParquetFile(shards[shard]).iter_batches(batch_size=2000, columns=["text"]):
            if row < seen + rb.num_rows:
                return rb.column(0)[row - seen].as_py()
            seen += rb.num_rows
        return None

    out = []
    for e in plan_result["examples"]:
        kept = text_at(e["kept_shard"], e["kept_row"])
        out.append({"kept_id": e["kept_id"], "removed_id": e["removed_id"], "cluster_id": e["cluster_id"],
                    "estimated_jaccard": e["estimated_jaccard"], "jaccard": e["jaccard"],
                    "kept": snippet(kept) if kept is not None else "(kept by an earlier run)",
                    "removed": snippet(text_at(e["removed_shard"], e["removed_row"]))})
    return out


# ---- the stage --------------------------------------------------------------------------------

class DecisionCursor:
    """One shard's decisions (the rows that are not plain keeps), handed out batch by batch."""

    def __init__(self, decisions: dict):
        self.path, self.sha256 = decisions["path"], decisions["sha256"]
        self._table: pa.Table | None = None
        self._offset = 0

    def take(self, n: int) -> tuple[np.ndarray, pa.Table]:
        """(rows within the batch, their decisions) for the next `n` rows of the shard."""
        if self._table is None:
            self._table = pq.read_table(self.path)
        rows = self._table.column("row").to_numpy()
        a, b = np.searchsorted(rows, self._offset), np.searchsorted(rows, self._offset + n)
        part = self._table.slice(int(a), int(b - a))
        local = rows[a:b] - self._offset
        self._offset += n
        return local, part


class DedupStage(Stage):
    """Global: signatures and band rows per shard (scan), the plan per hash range in parallel and
    a combine, per-shard splits by the plan's decisions, then the index commit."""
    name = STAGE
    columns = (*DUP_FIELDS, DUP_COUNT)   # dup_count on kept rows: removed by a later stage, they carry it
    Config = DedupConfig

    def check(self) -> None:
        check_dedup(self.config, self.context)

    def code_version(self) -> str:
        return code_version()

    def needs_scan(self) -> bool:
        return True

    def scan(self, shard: Shard) -> dict:
        return compute_signatures(shard, self.context, self.config)

    def plan_partitions(self, scans: list[dict]) -> list[dict]:
        return plan_partitions(scans, self.context, self.config)

    def plan_partition(self, scans: list[dict], partition: dict) -> dict:
        return plan_partition(scans, partition, self.context, self.config)

    def combine(self, scans: list[dict], partials: list[dict]) -> dict:
        return plan(scans, partials, self.context, self.config)

    def plan_for(self, shard: Shard, plan_result: dict) -> DecisionCursor:
        return DecisionCursor(plan_result["decisions"][shard.name])

    def fingerprint(self, cursor: DecisionCursor) -> dict:
        return {"decisions": cursor.sha256}

    def process(self, batch: pa.Table, cursor: DecisionCursor) -> Outcome:
        rows, dec = cursor.take(batch.num_rows)
        n = batch.num_rows
        status = np.full(n, KEPT, dtype=object)
        status[rows] = dec.column("status").to_numpy(zero_copy_only=False)
        size = np.ones(n, np.int64)
        kept_dec = pc.equal(dec.column("status"), KEPT).to_numpy(zero_copy_only=False)
        size[rows[kept_dec]] = dec.column("dup_count").filter(pa.array(kept_dec)).to_numpy()
        keep = status == KEPT
        kept = set_column(batch.filter(pa.array(keep)), DUP_COUNT, pa.array(size[keep], pa.int64()))
        removed = batch.filter(pa.array(~keep))
        rm = dec.filter(pc.not_equal(dec.column("status"), KEPT))     # in row order, as the removed rows
        removed = removed.append_column(pa.field("reason", pa.string(), nullable=False), rm.column("status"))
        for fld in DUP_FIELDS:
            removed = removed.append_column(fld, rm.column(fld.name))
        st = rm.column("status").to_pylist()
        return Outcome(kept, removed, {"exact_dup": st.count(EXACT), "near_dup": st.count(NEAR)})

    def commit(self, scans: list[dict], plan_result: dict) -> dict:
        _crash("split")   # every split is written, nothing committed yet
        return commit(scans, plan_result, self.context, self.config)

    def finalize(self, stats: dict, scans: list[dict], plan_result: dict, committed: dict) -> dict:
        report = {k: plan_result[k] for k in ("exact_dup", "near_dup", "exact_dup_rate", "near_dup_rate",
                                               "cluster_size_histogram", "candidates", "plan_partitions",
                                               "largest_partition_bytes", "partition_stats",
                                               "partition_seconds", "combine_seconds")}
        report["examples"] = _example_pairs(plan_result, scans)
        report["index"] = {**plan_result["index"], "disk_bytes": committed.get("disk_bytes"),
                           "committed_generation": committed.get("gen")}
        report["signature_seconds"] = round(sum(s.get("seconds", 0) for s in scans), 3)
        report["commit_seconds"] = committed.get("seconds", 0.0)
        return {**stats, "dedup": report}
