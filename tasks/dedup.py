"""Stage `dedup`: exact and near-duplicate removal with MinHash-LSH (datasketch), incremental
across runs.

A global stage of the stage contract (quipu.tasks.stage), in four phases:
1. scan = signatures, per shard in parallel (quipu.tasks.minhash: words → word n-gram shingles →
   32-bit shingle hashes → MinHash signatures, plus an exact hash of the normalised text).
   Written as signature files per shard.
2. plan, one sequential task in a deterministic order: exact match against kept documents, else
   datasketch `MinHashLSH` candidates (from the persistent index of earlier runs and from this run),
   each verified by its Jaccard similarity (exact on shingle sets, or estimated from signatures),
   so the LSH can be tuned for recall (a lower band threshold) without losing precision.
   Policy `first_seen` processes documents in shard/row order; `quality` in descending
   `quality_score`, so the best document of a cluster is the one kept.
3. process = split, per shard: kept and removed shards (`reason` exact_dup / near_dup, `dup_of` = the kept
   twin's id, `cluster_id` = the kept twin's index key, `dup_jaccard`).
4. commit: this run's kept documents join the index in one atomic step, after all outputs exist.
Every step leaves a done-marker; a rerun skips finished work and ends with the same bytes.
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
from quipu.tasks.dedup_index import (SCHEME, DedupIndex, FileIndex, LocalIndex, RedisIndex, SegmentPart, save_npy,
                               key_order, lean)
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
                "verify": self.verify, "scheme": SCHEME, "shingle_hash": SHINGLE_HASH}


@lru_cache(maxsize=64)
def _optimal_bands(threshold: float, num_perm: int) -> tuple[int, int]:
    """datasketch's own choice of (bands, rows) for a threshold (equal false positive/negative weights)."""
    from datasketch.lsh import _optimal_param
    return _optimal_param(threshold, num_perm, 0.5, 0.5)


# ---- step 1: signatures -----------------------------------------------------------------------

def code_version() -> str:
    return module_version(sys.modules[__name__], sys.modules["quipu.tasks.dedup_index"], sys.modules["quipu.tasks.minhash"])


def _dirs(ctx: RunContext) -> dict[str, Path]:
    layout = ctx.layout(STAGE)
    return {"sig": layout.scratch("_sig"), "plan": layout.scratch("_plan")}


def _crash(point: str) -> None:
    """Fault injection for the kill tests: die like SIGKILL (no cleanup) at a named step."""
    if os.environ.get(CRASH_ENV) == point:
        os._exit(137)


def _files_intact(files: dict[str, dict]) -> bool:
    return all(Path(f["path"]).exists() and sha256_file(f["path"]) == f["sha256"] for f in files.values())


def compute_signatures(shard: Shard, ctx: RunContext, cfg: DedupConfig) -> dict:
    """Signature files of one shard: meta.parquet (id, exact digest, shingle count, quality),
    sig.npy (docs x num_perm), shingles.npy + offsets in meta (with exact verification)."""
    d = _dirs(ctx)["sig"]
    marker = d / f"{shard.name}.json"
    fp = sha256_json({"input": shard.sha256, "code": code_version(), "quality": cfg.quality_column,
                      "params": {k: v for k, v in cfg.index_params().items() if k not in ("bands", "rows")}})
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
    save_npy(paths["sig"], np.concatenate(sigs) if sigs else np.zeros((0, cfg.num_perm), np.uint32))
    if cfg.verify == "exact":
        paths["shingles"] = d / f"{shard.name}.shingles.npy"
        save_npy(paths["shingles"], np.concatenate(shingles) if shingles else np.zeros(0, np.uint32))
    result = {"shard": shard.model_dump(), "fingerprint": fp, "rows": len(ids), "has_quality": has_quality,
              "files": {k: {"path": str(p), "sha256": sha256_file(p)} for k, p in paths.items()},
              "seconds": round(time.perf_counter() - t0, 3)}
    write_json_atomic(marker, result)
    _crash("signatures")
    return result


class SignatureFile:
    """One shard's signature files, memory-mapped."""

    def __init__(self, done: dict):
        self.done = done
        self.name = done["shard"]["name"]
        meta = pq.read_table(done["files"]["meta"]["path"])
        self.ids: list[str] = meta.column("id").to_pylist()
        self.exact: list[bytes] = meta.column("exact").to_pylist()
        self.n_shingles = meta.column("n_shingles").to_numpy()
        self.offsets = np.append(meta.column("offset").to_numpy(), int(self.n_shingles.sum()) if len(self.ids) else 0)
        self.quality = meta.column("quality").to_numpy(zero_copy_only=False)
        self.sigs = np.load(done["files"]["sig"]["path"], mmap_mode="r")
        self.flat = np.load(done["files"]["shingles"]["path"], mmap_mode="r") if "shingles" in done["files"] else None

    def shingles(self, row: int) -> np.ndarray:
        return np.asarray(self.flat[self.offsets[row]:self.offsets[row + 1]])


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


def check_dedup(cfg: DedupConfig, ctx: RunContext | None = None) -> None:
    """Before any document is read: Redis reachable, a named index built with these parameters."""
    if not cfg.enabled or cfg.backend == "none":
        return
    if cfg.backend == "redis":
        import redis
        conn = redis.Redis(host=cfg.redis.host, port=cfg.redis.port, db=cfg.redis.db,
                           password=os.environ.get(cfg.redis.password_env) if cfg.redis.password_env else None)
        try:
            conn.ping()
        except redis.RedisError as e:
            raise ValueError(f"dedup.redis: cannot reach Redis at {cfg.redis.host}:{cfg.redis.port} ({e})") from None
        name = index_name(cfg, ctx)
        if name:
            raw = conn.get(f"{cfg.redis.prefix}:{name}:manifest")
            if raw:
                import json
                from quipu.tasks.dedup_index import check_params
                check_params(json.loads(raw)["params"], cfg.index_params(), f"redis {cfg.redis.prefix}:{name}")
        return
    if index_name(cfg, ctx) or cfg.index_dir:
        folder = index_location(cfg, ctx)
        if (folder / "manifest.json").exists():
            from quipu.tasks.dedup_index import check_params
            check_params(read_json(folder / "manifest.json")["params"], cfg.index_params(), str(folder))


def index_location(cfg: DedupConfig, ctx: RunContext | None) -> Path:
    from quipu.catalog.db import quipu_home
    return Path(cfg.index_dir) if cfg.index_dir else quipu_home() / "dedup" / index_name(cfg, ctx)


def open_index(cfg: DedupConfig, ctx: RunContext) -> DedupIndex | None:
    rd = ctx.run_dir
    if cfg.backend == "none":
        return None
    if cfg.backend == "redis":
        return RedisIndex(cfg.redis.model_dump(), index_name(cfg, ctx), cfg.index_params(), rd)
    return FileIndex(index_location(cfg, ctx), cfg.index_params(), rd)


# ---- step 2: plan -----------------------------------------------------------------------------

KEPT, EXACT, NEAR = "kept", "exact_dup", "near_dup"
LOCAL_GEN = 1 << 40      # sorts this run's documents after every committed generation


class Planner:
    """Greedy clustering in processing order: each document joins the most similar kept document
    (Jaccard >= threshold) or is kept itself."""

    def __init__(self, cfg: DedupConfig, files: list[SignatureFile], index: DedupIndex | None):
        self.cfg, self.files, self.index = cfg, files, index
        self.local = LocalIndex(cfg.index_params())
        self.local_ref: list[tuple[int, int]] = []           # local key n -> (file, row)
        self._sets: dict[str, np.ndarray] = {}
        self.stats = Counter()

    def order(self) -> list[tuple[int, int]]:
        pairs = [(f, r) for f, sf in enumerate(self.files) for r in range(len(sf.ids))]
        if self.cfg.policy == "quality":
            if not any(sf.done["has_quality"] for sf in self.files):
                self.stats["quality_column_missing"] = 1
                return pairs
            q = {p: self.files[p[0]].quality[p[1]] for p in pairs}
            return sorted(pairs, key=lambda p: (0, -q[p], p) if not np.isnan(q[p]) else (1, 0.0, p))
        return pairs

    def _set_of(self, key: str) -> np.ndarray:
        s = self._sets.get(key)
        if s is None:
            if key.startswith("L"):
                f, r = self.local_ref[int(key[1:])]
                s = np.unique(self.files[f].shingles(r))
            else:
                s = np.unique(self.index.shingles(key))
            if len(self._sets) > 50_000:
                self._sets.clear()
            self._sets[key] = s
        return s

    def _sig_of(self, key: str) -> np.ndarray:
        if key.startswith("L"):
            f, r = self.local_ref[int(key[1:])]
            return np.asarray(self.files[f].sigs[r])
        return self.index.signature(key)

    @staticmethod
    def _rank(key: str) -> tuple[int, int]:
        return (LOCAL_GEN, int(key[1:])) if key.startswith("L") else key_order(key)

    def run(self) -> tuple[list[dict[str, list]], list[dict]]:
        cfg = self.cfg
        decisions = [{"status": [KEPT] * len(sf.ids), "ref": [None] * len(sf.ids), "jac": [None] * len(sf.ids)}
                     for sf in self.files]
        examples: list[dict] = []
        exact_examples: list[dict] = []
        for f, r in self.order():
            sf = self.files[f]
            digest = sf.exact[r]
            if cfg.exact:
                key = self.local.exact.get(digest) or (self.index.exact_key(digest) if self.index else None)
                if key is not None:
                    d = decisions[f]
                    d["status"][r], d["ref"][r], d["jac"][r] = EXACT, key, 1.0
                    if len(exact_examples) < 3:
                        exact_examples.append(self._example(f, r, key, 1.0))
                    continue
            m = lean(np.asarray(sf.sigs[r]), cfg.seed)
            if cfg.near and sf.n_shingles[r] > 0:
                best = self._best_match(f, r, m)
                if best is not None:
                    key, jac = best
                    d = decisions[f]
                    d["status"][r], d["ref"][r], d["jac"][r] = NEAR, key, jac
                    if len(examples) < 3:
                        examples.append(self._example(f, r, key, jac))
                    continue
            key = f"L{len(self.local_ref)}"
            self.local_ref.append((f, r))
            self.local.insert(key, m, digest, in_lsh=bool(sf.n_shingles[r] > 0))
            decisions[f]["ref"][r] = key
        return decisions, examples + exact_examples[:3 - len(examples)]   # near pairs first

    def _example(self, f: int, r: int, key: str, jac: float) -> dict:
        est = float(np.mean(self._sig_of(key) == np.asarray(self.files[f].sigs[r])))
        return {"file": f, "row": r, "key": key, "jaccard": round(jac, 4), "estimated_jaccard": round(est, 4)}

    def _best_match(self, f: int, r: int, m) -> tuple[str, float] | None:
        cands = self.local.query(m) + (self.index.query(m) if self.index and self.index.visible_gens else [])
        if not cands:
            return None
        self.stats["candidates"] += len(cands)
        best = None
        mine = np.unique(self.files[f].shingles(r)) if self.cfg.verify == "exact" else np.asarray(self.files[f].sigs[r])
        for key in sorted(cands, key=self._rank):   # ties go to the earliest kept document
            if self.cfg.verify == "exact":
                other = self._set_of(key)
                inter = len(np.intersect1d(mine, other, assume_unique=True))
                jac = inter / (len(mine) + len(other) - inter)
            else:
                jac = float(np.mean(self._sig_of(key) == mine))
            if jac >= self.cfg.threshold and (best is None or jac > best[1]):
                best = (key, jac)
        if best is None:
            self.stats["rejected_candidates_docs"] += 1
        return best


def plan_fingerprint(cfg: DedupConfig, sig_results: list[dict], ctx: RunContext) -> str:
    return sha256_json({"sigs": [s["fingerprint"] for s in sig_results], "code": code_version(),
                        "config": cfg.model_dump(mode="json", exclude={"batch_rows", "redis", "index_dir"}),
                        "index": index_name(cfg, ctx)})


def _reusable_plan(marker: Path, plan_id: str, cfg: DedupConfig, ctx: RunContext) -> dict | None:
    """The stored plan, if it is this plan and nothing was committed since (or it was its commit)."""
    if not marker.exists():
        return None
    done = read_json(marker)
    if done.get("plan") != plan_id or not _files_intact(done["decisions"]):
        return None
    if cfg.backend == "none":
        return done
    manifest = _open_for_commit(cfg, ctx).manifest     # reads the manifest only
    committed = manifest.committed_plan(plan_id)
    if (committed and committed.gen == done["gen"]) or manifest.next_gen == done["expected_next_gen"]:
        return done
    return None


def plan(sig_results: list[dict], ctx: RunContext, cfg: DedupConfig) -> dict:
    """Decide every document (one sequential pass); write decisions per shard and the plan marker."""
    d = _dirs(ctx)["plan"]
    marker = d / "plan.json"
    plan_id = plan_fingerprint(cfg, sig_results, ctx)
    done = _reusable_plan(marker, plan_id, cfg, ctx)
    if done is not None:
        return done
    t0 = time.perf_counter()
    index = open_index(cfg, ctx)
    files = [SignatureFile(s) for s in sig_results]
    gen = index.manifest.next_gen if index else 1
    planner = Planner(cfg, files, index)
    decisions, examples = planner.run()
    t_plan = time.perf_counter() - t0

    # Final keys of this run's kept documents: grouped by shard, in row order (the commit's order).
    final: dict[str, str] = {}
    n = 0
    for f, dec in enumerate(decisions):
        for r, st in enumerate(dec["status"]):
            if st == KEPT:
                final[dec["ref"][r]] = f"g{gen}:{n}"
                n += 1

    def resolve(key: str) -> tuple[str, str]:     # (doc id, cluster key) of a kept document
        if key.startswith("L"):
            f, r = planner.local_ref[int(key[1:])]
            return files[f].ids[r], final[key]
        return index.doc_id(key), key

    outputs: dict[str, dict] = {}
    cluster_sizes: Counter = Counter()
    counts = Counter()
    for f, dec in enumerate(decisions):
        dup_of, cluster, jac = [], [], []
        for r, st in enumerate(dec["status"]):
            counts[st] += 1
            if st == KEPT:
                dup_of.append(None); cluster.append(final[dec["ref"][r]]); jac.append(None)
            else:
                doc_id, ckey = resolve(dec["ref"][r])
                dup_of.append(doc_id); cluster.append(ckey); jac.append(dec["jac"][r])
                cluster_sizes[ckey] += 1
        table = pa.table({"status": pa.array(dec["status"], pa.string()), "dup_of": pa.array(dup_of, pa.string()),
                          "cluster_id": pa.array(cluster, pa.string()), "dup_jaccard": pa.array(jac, pa.float64())})
        path = d / f"{files[f].name}.parquet"
        with atomic_path(path) as tmp:
            pq.write_table(table, tmp, compression="zstd")
        outputs[files[f].name] = {"path": str(path), "sha256": sha256_file(path)}

    hist = Counter(size + 1 for size in cluster_sizes.values())   # members removed + the kept one
    ex_out = []
    for e in examples:
        sf = files[e["file"]]
        kept_id, ckey = resolve(e["key"])
        kept_loc = planner.local_ref[int(e["key"][1:])] if e["key"].startswith("L") else None
        ex_out.append({"removed_id": sf.ids[e["row"]], "removed_shard": sf.name, "removed_row": e["row"],
                       "kept_id": kept_id, "cluster_id": ckey,
                       "kept_shard": files[kept_loc[0]].name if kept_loc else None,
                       "kept_row": kept_loc[1] if kept_loc else None,
                       "jaccard": e["jaccard"], "estimated_jaccard": e["estimated_jaccard"]})
    total = sum(counts.values())
    bands, rows = cfg.lsh_params()
    result = {
        "plan": plan_id, "gen": gen, "expected_next_gen": gen, "decisions": outputs,
        "index": {"backend": cfg.backend, "name": index_name(cfg, ctx),
                  "location": index.location if index else None,
                  "docs_before": index.size() if index else 0,
                  "docs_after": (index.size() if index else 0) + counts[KEPT],
                  "bands": bands, "rows": rows, "num_perm": cfg.num_perm,
                  "memory_bytes": lsh_memory_bytes(planner.local.lsh) + (lsh_memory_bytes(index.lsh) if isinstance(index, FileIndex) else 0)},
        "input_docs": total, "kept_docs": counts[KEPT], "exact_dup": counts[EXACT], "near_dup": counts[NEAR],
        "exact_dup_rate": round(counts[EXACT] / total, 6) if total else 0.0,
        "near_dup_rate": round(counts[NEAR] / total, 6) if total else 0.0,
        "cluster_size_histogram": {str(k): v for k, v in sorted(hist.items())},
        "examples": ex_out, "candidates": planner.stats["candidates"],
        "policy_note": "quality column missing: first_seen order used" if planner.stats["quality_column_missing"] else None,
        "seconds": round(time.perf_counter() - t0, 3), "plan_seconds": round(t_plan, 3),
    }
    write_json_atomic(marker, result)
    _crash("plan")
    return result


def lsh_memory_bytes(lsh) -> int:
    """Approximate Python memory of a dict-backed MinHashLSH (tables, key lists, band values)."""
    from datasketch.storage import DictListStorage
    seen = 0
    for store in [lsh.keys, *lsh.hashtables]:
        if not isinstance(store, DictListStorage):
            return 0
        table = store._dict
        seen += sys.getsizeof(table)
        for k, v in table.items():
            seen += sys.getsizeof(k) + sys.getsizeof(v)
            if store is lsh.keys:
                seen += sum(sys.getsizeof(x) for x in v)
    return seen


DUP_FIELDS = [pa.field("dup_of", pa.string()), pa.field("cluster_id", pa.string()), pa.field("dup_jaccard", pa.float64())]


# ---- step 4: commit ---------------------------------------------------------------------------

def segment_parts(sig_results: list[dict], plan_result: dict):
    """This run's kept documents per shard, in final-key order (shard, row)."""
    for s in sig_results:
        sf = SignatureFile(s)
        dec = pq.read_table(plan_result["decisions"][sf.name]["path"])
        rows = np.nonzero(np.asarray(pc.equal(dec.column("status"), KEPT).to_numpy(zero_copy_only=False)))[0]
        if sf.flat is not None:
            lens = sf.n_shingles[rows].astype(np.int64)
            offs = np.zeros(len(rows) + 1, np.int64)
            np.cumsum(lens, out=offs[1:])
            flat = np.concatenate([sf.shingles(r) for r in rows]) if len(rows) else np.zeros(0, np.uint32)
        else:
            flat = offs = None
        yield SegmentPart(ids=[sf.ids[r] for r in rows], exact=[sf.exact[r] for r in rows],
                          sigs=np.asarray(sf.sigs[rows]) if len(rows) else np.zeros((0, sf.sigs.shape[1]), np.uint32),
                          shingles=flat, offsets=offs)


def commit(sig_results: list[dict], plan_result: dict, ctx: RunContext, cfg: DedupConfig) -> dict:
    """Add this run's kept documents to the index, once, after every output shard exists."""
    if cfg.backend == "none":
        return {"committed": False, "reason": "backend none"}
    t0 = time.perf_counter()
    index = _open_for_commit(cfg, ctx)
    done = index.manifest.committed_plan(plan_result["plan"])
    if done is not None and done.gen == plan_result["gen"]:
        return {"committed": True, "gen": done.gen, "skipped": True, "disk_bytes": index.disk_bytes()}
    index.commit(plan_result["gen"], plan_result["expected_next_gen"], plan_result["plan"],
                 segment_parts(sig_results, plan_result), crash_hook=_crash)
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


def _open_for_commit(cfg: DedupConfig, ctx: RunContext) -> DedupIndex:
    """The index without rebuilding its in-memory LSH (the commit only writes)."""
    rd = ctx.run_dir
    if cfg.backend == "redis":
        return RedisIndex(cfg.redis.model_dump(), index_name(cfg, ctx), cfg.index_params(), rd)
    idx = FileIndex.__new__(FileIndex)
    DedupIndex.__init__(idx, cfg.index_params(), rd)
    idx.folder = index_location(cfg, ctx)
    idx.location = str(idx.folder)
    man = idx._read_manifest()
    if man is not None:
        from quipu.tasks.dedup_index import check_params
        check_params(man.params, cfg.index_params(), idx.location)
        idx.manifest = man
    return idx


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
    """One shard's decisions (rows aligned with the shard), handed out batch by batch in row order."""

    def __init__(self, decisions: dict):
        self.path, self.sha256 = decisions["path"], decisions["sha256"]
        self._table: pa.Table | None = None
        self._offset = 0

    def take(self, n: int) -> pa.Table:
        if self._table is None:
            self._table = pq.read_table(self.path)
        if self._offset + n > self._table.num_rows:
            raise AssertionError(f"dedup: {self.path} has {self._table.num_rows} decisions, the shard has more rows")
        part = self._table.slice(self._offset, n)
        self._offset += n
        return part


class DedupStage(Stage):
    """Global: signatures per shard (scan), one sequential plan over them, per-shard splits by the
    plan's decisions, then the index commit once every output is written."""
    name = STAGE
    columns = tuple(DUP_FIELDS)
    Config = DedupConfig

    def check(self) -> None:
        check_dedup(self.config, self.context)

    def code_version(self) -> str:
        return code_version()

    def needs_scan(self) -> bool:
        return True

    def scan(self, shard: Shard) -> dict:
        return compute_signatures(shard, self.context, self.config)

    def plan(self, scans: list[dict]) -> dict:
        return plan(scans, self.context, self.config)

    def plan_for(self, shard: Shard, plan_result: dict) -> DecisionCursor:
        return DecisionCursor(plan_result["decisions"][shard.name])

    def fingerprint(self, cursor: DecisionCursor) -> dict:
        return {"decisions": cursor.sha256}

    def process(self, batch: pa.Table, cursor: DecisionCursor) -> Outcome:
        dec = cursor.take(batch.num_rows)
        keep = pc.equal(dec.column("status"), KEPT)
        drop = pc.invert(keep)
        removed, dd = batch.filter(drop), dec.filter(drop)
        removed = removed.append_column(pa.field("reason", pa.string(), nullable=False), dd.column("status"))
        for fld in DUP_FIELDS:
            removed = removed.append_column(fld, dd.column(fld.name))
        status = dd.column("status").to_pylist()
        return Outcome(batch.filter(keep), removed, {"exact_dup": status.count(EXACT), "near_dup": status.count(NEAR)})

    def commit(self, scans: list[dict], plan_result: dict) -> dict:
        _crash("split")   # every split is written, nothing committed yet
        return commit(scans, plan_result, self.context, self.config)

    def finalize(self, stats: dict, scans: list[dict], plan_result: dict, committed: dict) -> dict:
        report = {k: plan_result[k] for k in ("exact_dup", "near_dup", "exact_dup_rate", "near_dup_rate",
                                               "cluster_size_histogram", "candidates", "plan_seconds")}
        report["examples"] = _example_pairs(plan_result, scans)
        report["index"] = {**plan_result["index"], "disk_bytes": committed.get("disk_bytes"),
                           "committed_generation": committed.get("gen")}
        report["signature_seconds"] = round(sum(s.get("seconds", 0) for s in scans), 3)
        report["commit_seconds"] = committed.get("seconds", 0.0)
        return {**stats, "dedup": report}
