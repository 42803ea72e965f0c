"""Stage `dedup`: exact and near-duplicate removal with MinHash LSH, out of core and in parallel,
incremental across runs.

A global stage of the stage contract (quipu.tasks.stage) with a partitioned plan; each phase hands
the next a typed result:
1. scan -> `Signatures`, per shard in parallel (quipu.tasks.minhash: words -> word n-gram shingles
   -> 32-bit shingle hashes -> MinHash signatures bit-identical to datasketch's, plus an exact hash
   of the normalised text). Besides the signature files, each shard writes its LSH band rows
   (band hash, exact-hash prefix, row) and its exact-hash rows, each sorted by hash.
2. plan_partitions -> `HashRange`s; plan_partition -> `VerifiedPairs`, per hash range in parallel
   (quipu.tasks.dedup_pairs): the band rows of every shard and of the persistent index in that
   range, sorted; documents sharing a band hash are candidates (exact copies collapse to one per
   bucket, a bucket pairs each document with at most `bucket_cap` earlier ones); each candidate
   pair is verified once (in the partition of the first band the two share) by its exact Jaccard
   on shingle sets (or estimated from signatures); equal exact hashes form exact groups.
3. combine -> `DedupPlan` (`decide_duplicates`, quipu.tasks.dedup_decide): one cheap pass over the
   verified pairs only, with the same policy as a sequential pass (`first_seen` in shard/row
   order, `quality` by descending `quality_score`; documents kept by earlier runs always stay): a
   document is an exact duplicate of a kept copy, else a near duplicate of its most similar kept
   candidate (Jaccard >= threshold), else kept.
4. process = split, per shard: kept (with `dup_count`, the size of its cluster) and removed
   (`reason` exact_dup / near_dup, `dup_of` = the kept twin's id, `cluster_id` = its index key,
   `dup_jaccard`).
5. commit: this run's kept documents join the index as one generation (segments and band rows
   sorted per hash range), in one atomic step, after all outputs exist.
Memory: one shard (scan), one partition of band rows (plan), the verified pairs (combine). The
driver keeps the scans' and partitions' results as done-markers (`scan_result`,
`partition_result`), the combine keeps its plan until the index moves on, and the commit is
idempotent: a rerun skips finished work and ends with the same bytes.
"""
from __future__ import annotations

import os
import socket
import sys
import time
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
from quipu.tasks.dedup_decide import EXACT, KEPT, NEAR, DecisionRules, DedupPlan, decide
from quipu.tasks.dedup_index import (GEN_SHIFT, LAYOUT, LOCAL_FLAG, SCHEME, BandPart, ConcurrentCommit, DedupIndex,
                                     FileStore, RedisStore, SegmentPart, check_params)
from quipu.tasks.dedup_pairs import (Docs, HashRange, LocalDocs, Signatures, VerifiedPairs, exact_groups, global_refs,
                                     merge, verify_range)
from quipu.tasks.minhash import BAND_HASH, SHINGLE_HASH, MinHasher, band_keys, exact_digests, tokenize
from quipu.tasks.partitions import SortedRun, bounds, n_partitions, save_npy
from quipu.tasks.schema import set_column
from quipu.tasks.stage import Outcome, RunContext, Shard, Stage, StageConfig, StoredFile, module_version, snippet

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
    return module_version(*(sys.modules[f"quipu.tasks.{m}"] for m in (
        "dedup", "dedup_pairs", "dedup_decide", "dedup_index", "minhash", "partitions")))


def _work_dir(ctx: RunContext, step: str) -> Path:
    """`_sig` (signature files) or `_plan` (verified pairs, decisions): deleted when the run completes."""
    return ctx.layout(STAGE).scratch(f"_{step}")


def _crash(point: str) -> None:
    """Fault injection for the kill tests: die like SIGKILL (no cleanup) at a named step."""
    if os.environ.get(CRASH_ENV) == point:
        os._exit(137)


def _stored(path: Path | str) -> StoredFile:
    return StoredFile(path=str(path), sha256=sha256_file(path))


def _run_files(run: SortedRun) -> dict[str, StoredFile]:
    return {f"{Path(run.prefix).name}.{c}": _stored(run.path(c)) for c in run.columns}


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



def signatures_fingerprint(shard: Shard, cfg: DedupConfig) -> str:
    """What a shard's signature files depend on: its bytes, the code and the index parameters."""
    return sha256_json({"input": shard.sha256, "code": code_version(), "quality": cfg.quality_column,
                        "params": cfg.index_params()})


def compute_signatures(shard: Shard, ctx: RunContext, cfg: DedupConfig) -> Signatures:
    """Signature files of one shard: meta.parquet (id, exact digest, shingle count, quality),
    sig.npy (docs x num_perm), shingles.npy + offsets in meta (with exact verification), and the
    shard's band rows and exact-hash rows, each sorted by hash (what the plan partitions read)."""
    d = _work_dir(ctx, "sig")
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
    files = {k: _stored(p) for k, p in paths.items()}
    files.update(_run_files(bands))
    files.update(_run_files(exact))
    return Signatures(shard=shard, rows=len(ids), has_quality=has_quality, files=files, bands=bands, exact=exact,
                      seconds=round(time.perf_counter() - t0, 3))


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



# ---- step 2: plan, per hash range in parallel, then the combine ---------------------------------

def plan_fingerprint(cfg: DedupConfig, sig_results: list[Signatures], ctx: RunContext) -> str:
    return sha256_json({"sigs": [s.fingerprint for s in sig_results], "code": code_version(),
                        "config": cfg.model_dump(mode="json", exclude={"batch_rows", "redis", "index_dir"}),
                        "index": index_name(cfg, ctx)})


def plan_partitions(sig_results: list[Signatures], ctx: RunContext, cfg: DedupConfig) -> list[HashRange]:
    """The plan's partitions (equal ranges of the hash space), sized by the band rows of this run
    and of the index."""
    index = open_index(cfg, ctx)
    rows = sum(s.bands.rows for s in sig_results) + (index.band_rows_total() if index else 0)
    n = cfg.partitions or n_partitions(rows, cfg.partition_rows, minimum=2)
    edges = bounds(n)
    next_gen = index.manifest.next_gen if index else 1
    plan_id = plan_fingerprint(cfg, sig_results, ctx)
    return [HashRange(p=p, n=n, lo=edges[p], hi=edges[p + 1], plan=plan_id, next_gen=next_gen,
                      index=index.generations_fingerprint() if index else []) for p in range(n)]


def verify_partition(sig_results: list[Signatures], part: HashRange, ctx: RunContext, cfg: DedupConfig) -> VerifiedPairs:
    """One hash range: candidate pairs from the band buckets, verified; exact groups. Writes
    `_plan/part-<p>.*.npy`."""
    d = _work_dir(ctx, "plan")
    t0 = time.perf_counter()
    index = open_index(cfg, ctx)
    if index is not None and index.manifest.next_gen != part.next_gen:
        raise ConcurrentCommit(f"the dedup index at {index.location} changed while this run was planning: rerun")
    docs = Docs(LocalDocs(sig_results), index, cfg.verify)
    band = merge(global_refs(sig_results, "bands", part.lo, part.hi),
                 index.band_rows(part.lo, part.hi) if index else None, ["key", "digest", "ref"])
    held_bytes = 24 * len(band["key"])
    pairs, stats = verify_range(band, docs, part, *cfg.lsh_params(), cfg.bucket_cap, cfg.threshold)
    del band
    ex = merge(global_refs(sig_results, "exact", part.lo, part.hi),
               index.exact_rows(part.lo, part.hi) if index else None, ["hi", "lo", "ref"])
    held_bytes = max(held_bytes, 24 * len(ex["hi"]))
    groups = exact_groups(ex)
    stats["exact_group_members"] = int(len(groups["member"]))
    files = {}
    for name, arr in {**pairs, **groups}.items():
        path = d / f"part-{part.p:04d}.{name}.npy"
        save_npy(path, arr)
        files[name] = _stored(path)
    docs.local.close()
    if index is not None:
        index.close()
    return VerifiedPairs(p=part.p, lo=part.lo, hi=part.hi, next_gen=part.next_gen, files=files, stats=stats,
                         held_bytes=held_bytes, ran_in={"host": socket.gethostname(), "pid": os.getpid()},
                         seconds=round(time.perf_counter() - t0, 3))


def _reusable_plan(marker: Path, plan_id: str, cfg: DedupConfig, ctx: RunContext) -> DedupPlan | None:
    """The stored plan, if it is this plan and nothing was committed since (or it was its commit)."""
    if not marker.exists():
        return None
    done = DedupPlan.model_validate(read_json(marker))
    if done.plan != plan_id or not all(Path(f.path).exists() and sha256_file(f.path) == f.sha256
                                       for f in done.decisions.values()):
        return None
    index = open_index(cfg, ctx)
    if index is None:
        return done
    committed = index.manifest.committed_plan(plan_id)
    if (committed and committed.gen == done.gen) or index.manifest.next_gen == done.expected_next_gen:
        return done
    return None


def decide_duplicates(sig_results: list[Signatures], partials: list[VerifiedPairs], ctx: RunContext,
                      cfg: DedupConfig) -> DedupPlan:
    """The combine: a decision for every document from the partitions' pairs (quipu.tasks.dedup_decide),
    kept as `_plan/plan.json` until the index moves on."""
    d = _work_dir(ctx, "plan")
    marker = d / "plan.json"
    plan_id = plan_fingerprint(cfg, sig_results, ctx)
    done = _reusable_plan(marker, plan_id, cfg, ctx)
    if done is not None:
        return done
    index = open_index(cfg, ctx)
    gen = partials[0].next_gen if partials else (index.manifest.next_gen if index else 1)
    rules = DecisionRules(exact=cfg.exact, near=cfg.near, threshold=cfg.threshold, policy=cfg.policy, verify=cfg.verify)
    result = decide(plan_id, gen, gen, sig_results, partials, index, rules, d)
    bands, rows = cfg.lsh_params()
    before = index.size() if index else 0
    result.index = {"backend": cfg.backend, "name": index_name(cfg, ctx), "location": index.location if index else None,
                    "docs_before": before, "docs_after": before + result.kept_docs,
                    "bands": bands, "rows": rows, "num_perm": cfg.num_perm,
                    "twins_in_index": result.index["twins_in_index"]}
    if index is not None:
        index.close()
    write_json_atomic(marker, result.model_dump(mode="json"))
    _crash("plan")
    return result



DUP_FIELDS = [pa.field("dup_of", pa.string()), pa.field("cluster_id", pa.string()), pa.field("dup_jaccard", pa.float64())]
DUP_COUNT = pa.field("dup_count", pa.int64())


# ---- step 4: commit ---------------------------------------------------------------------------

class IndexCommit(BaseModel):
    """What the commit step did: the generation it published (or found published), for the report."""
    committed: bool
    reason: str | None = None            # why nothing was committed
    gen: int | None = None
    skipped: bool = False                # this plan's generation was already in the index
    disk_bytes: int | None = None
    location: str | None = None
    backend: str | None = None
    seconds: float = 0.0
    catalog_error: str | None = None


def _removed_rows(plan_result: DedupPlan, name: str) -> np.ndarray:
    dec = pq.read_table(plan_result.decisions[name].path, columns=["row", "status"])
    rm = pc.not_equal(dec.column("status"), KEPT)
    return np.asarray(dec.column("row").filter(rm).to_numpy(), dtype=np.int64)


def segment_parts(sig_results: list[Signatures], plan_result: DedupPlan):
    """This run's kept documents per shard, in key order (shard, row). One shard's files are mapped
    at a time (a mapping kept open would keep every page read resident)."""
    for s in sig_results:
        files = s.files
        keep = np.ones(s.rows, bool)
        keep[_removed_rows(plan_result, s.shard.name)] = False
        rows = np.nonzero(keep)[0]
        meta = pq.read_table(files["meta"].path, columns=["id", "exact", "n_shingles"])
        flat = offs = None
        if "shingles" in files:
            lengths = meta.column("n_shingles").to_numpy().astype(np.int64)
            offs = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(lengths[rows], out=offs[1:])
            flat = np.load(files["shingles"].path)[np.repeat(keep, lengths)]
        sigs = np.load(files["sig"].path, mmap_mode="r")
        part = SegmentPart(ids=meta.column("id").take(pa.array(rows)).to_pylist(),
                           exact=meta.column("exact").take(pa.array(rows)).to_pylist(),
                           sigs=np.array(sigs[rows]), shingles=flat, offsets=offs)
        del sigs, meta
        yield part


def band_parts(sig_results: list[Signatures], plan_result: DedupPlan, gen: int):
    """This run's kept documents' band and exact rows, per plan partition, with index refs."""
    removed = []
    base = 0
    for s in sig_results:
        removed.append(_removed_rows(plan_result, s.shard.name) + base)
        base += s.rows
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

    for lo, hi in plan_result.ranges:
        bands = to_index(global_refs(sig_results, "bands", lo, hi))
        exact = to_index(global_refs(sig_results, "exact", lo, hi))
        o = np.lexsort([bands["ref"], bands["digest"], bands["key"]])
        e = np.lexsort([exact["ref"], exact["lo"], exact["hi"]])
        yield BandPart(lo=lo, hi=hi, bands={c: v[o] for c, v in bands.items()}, exact={c: v[e] for c, v in exact.items()})


def index_ref_array(gen: int, n: np.ndarray) -> np.ndarray:
    return (np.uint64(gen) << np.uint64(GEN_SHIFT)) | n.astype(np.uint64)


def commit(sig_results: list[Signatures], plan_result: DedupPlan, ctx: RunContext, cfg: DedupConfig) -> IndexCommit:
    """Add this run's kept documents to the index, once, after every output shard exists."""
    if cfg.backend == "none":
        return IndexCommit(committed=False, reason="backend none")
    t0 = time.perf_counter()
    index = open_index(cfg, ctx)
    done = index.manifest.committed_plan(plan_result.plan)
    if done is not None and done.gen == plan_result.gen:
        return IndexCommit(committed=True, gen=done.gen, skipped=True, disk_bytes=index.disk_bytes())
    gen = plan_result.gen
    index.commit(gen, plan_result.expected_next_gen, plan_result.plan, segment_parts(sig_results, plan_result),
                 band_parts(sig_results, plan_result, gen), crash_hook=_crash)
    info = IndexCommit(committed=True, gen=gen, disk_bytes=index.disk_bytes(), location=index.location,
                       backend=index.backend, seconds=round(time.perf_counter() - t0, 3))
    try:
        from quipu.catalog import registry
        registry.kv_put_many("dedup_index", {index_name(cfg, ctx): {
            "backend": index.backend, "location": index.location, "generation": gen,
            "docs": plan_result.index["docs_after"], "run_dir": ctx.run_dir}})
    except Exception as e:  # the index is committed; the catalog entry is only a pointer to it
        info.catalog_error = str(e)
    return info


def _example_pairs(plan_result: DedupPlan, sig_results: list[Signatures]) -> list[dict]:
    shards = {s.shard.name: s.shard.path for s in sig_results}

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
    for e in plan_result.examples:
        kept = text_at(e["kept_shard"], e["kept_row"])
        out.append({"kept_id": e["kept_id"], "removed_id": e["removed_id"], "cluster_id": e["cluster_id"],
                    "estimated_jaccard": e["estimated_jaccard"], "jaccard": e["jaccard"],
                    "kept": snippet(kept) if kept is not None else "(kept by an earlier run)",
                    "removed": snippet(text_at(e["removed_shard"], e["removed_row"]))})
    return out


# ---- the stage --------------------------------------------------------------------------------

class DecisionCursor:
    """One shard's decisions (the rows that are not plain keeps), handed out batch by batch."""

    def __init__(self, decisions: StoredFile):
        self.path, self.sha256 = decisions.path, decisions.sha256
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
    """Global: signatures and band rows per shard (scan), verified pairs per hash range in
    parallel and the decisions from them (combine), per-shard splits by the decisions, then the
    index commit."""
    name = STAGE
    columns = (*DUP_FIELDS, DUP_COUNT)   # dup_count on kept rows: removed by a later stage, they carry it
    Config = DedupConfig
    scan_result = Signatures             # the driver keeps both as done-markers: a rerun reuses them
    partition_result = VerifiedPairs

    def check(self) -> None:
        check_dedup(self.config, self.context)

    def code_version(self) -> str:
        return code_version()

    def needs_scan(self) -> bool:
        return True

    def scan_fingerprint(self, shard: Shard) -> str:
        return signatures_fingerprint(shard, self.config)

    def scan(self, shard: Shard) -> Signatures:
        return compute_signatures(shard, self.context, self.config)

    def plan_partitions(self, scans: list[Signatures]) -> list[HashRange]:
        return plan_partitions(scans, self.context, self.config)

    def partition_fingerprint(self, partition: HashRange) -> str:
        # the range names the plan (every shard's signatures, the config) and the index's state
        return sha256_json({"part": partition.model_dump(mode="json"), "code": code_version()})

    def plan_partition(self, scans: list[Signatures], partition: HashRange) -> VerifiedPairs:
        return verify_partition(scans, partition, self.context, self.config)

    def combine(self, scans: list[Signatures], partials: list[VerifiedPairs]) -> DedupPlan:
        return decide_duplicates(scans, partials, self.context, self.config)

    def plan_for(self, shard: Shard, plan_result: DedupPlan) -> DecisionCursor:
        return DecisionCursor(plan_result.decisions[shard.name])

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

    def commit(self, scans: list[Signatures], plan_result: DedupPlan) -> IndexCommit:
        _crash("split")   # every split is written, nothing committed yet
        return commit(scans, plan_result, self.context, self.config)

    def finalize(self, stats: dict, scans: list[Signatures], plan_result: DedupPlan, committed: IndexCommit) -> dict:
        report = {k: getattr(plan_result, k) for k in ("exact_dup", "near_dup", "exact_dup_rate", "near_dup_rate",
                                               "cluster_size_histogram", "candidates", "plan_partitions",
                                               "largest_partition_bytes", "partition_stats",
                                               "partition_seconds", "combine_seconds")}
        report["examples"] = _example_pairs(plan_result, scans)
        report["index"] = {**plan_result.index, "disk_bytes": committed.disk_bytes,
                           "committed_generation": committed.gen}
        report["signature_seconds"] = round(sum(s.seconds for s in scans), 3)
        report["commit_seconds"] = committed.seconds
        return {**stats, "dedup": report}
