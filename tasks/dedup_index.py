"""The persistent near-duplicate index of one dataset, kept between curation runs.

What it holds, per committed run (a *generation*), for every document that run kept:
- segment parts (one per input shard): doc ids and exact-text hashes (`meta.parquet`), MinHash
  signatures (`sig.npy`) and, with exact verification, shingle hashes (`shingles.npy`, `offsets.npy`);
- band parts (one per hash range of the run's commit): the LSH band rows sorted by band hash
  (`key`, the document's exact-hash prefix `digest`, the document's `ref`) and the exact-hash rows
  sorted by hash (`hi`, `lo`, `ref`).
A later run's plan reads, per partition, only the band and exact rows of its hash range from every
visible generation (a binary search in sorted files: the index is never loaded whole), and the
signatures or shingles of the few documents a candidate pair names. A document's `ref` is
`gen << 36 | n` (n: its position among the generation's kept documents), its key `g<gen>:<n>`;
earlier generations sort first.

Two stores, one index: `FileStore` (a folder; arrays are memory-mapped) and `RedisStore` (each
array one Redis value under `<prefix>:<index>:`, loaded whole when read: for small indexes shared
by several machines without a shared file system).

Commits are atomic: a generation's data is written first, then one atomic write of the manifest
(a file rename, or one Redis SET under WATCH) makes it visible. Data of a generation the manifest
does not list (a killed commit) is invisible and is deleted by the next commit. A run re-executed
into the same output directory *replaces* its earlier generation (otherwise its documents would be
found as duplicates of themselves).
"""
from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from quipu.catalog.errors import UserError
from quipu.catalog.files import atomic_path, read_json, write_json_atomic
from quipu.tasks.partitions import NpyRows, key_range, save_npy

SCHEME = "affine32"                      # datasketch 2.x default permutation scheme
LAYOUT = "sorted-bands/v2"               # stored in the index params: v1 (a datasketch LSH) is not read
MANIFEST_VERSION = 2
GEN_SHIFT = 36                           # ref = gen << 36 | n: 2^36 documents per generation
LOCAL_FLAG = np.uint64(1 << 63)          # refs of this run's documents (the planner's), after every generation

__all__ = ["save_npy"]   # re-exported: older callers import it from here


class IndexMismatch(UserError, ValueError):
    """The stored index was built with other parameters than the config asks for."""


class ConcurrentCommit(UserError, RuntimeError):
    """Another run committed to the same index while this run was planning."""
    exit_code = 1   # nothing to change: a rerun plans against the other run's documents


def make_key(gen: int, n: int) -> str:
    return f"g{gen}:{n}"


def ref_key(ref: int) -> str:
    """`g<gen>:<n>` of an index ref."""
    return make_key(ref >> GEN_SHIFT, ref & ((1 << GEN_SHIFT) - 1))


@dataclass
class SegmentPart:
    """Kept documents of one input shard in one generation, in kept order."""
    ids: list[str]
    exact: list[bytes]
    sigs: np.ndarray                      # (n, num_perm) uint32
    shingles: np.ndarray | None           # flat uint32, or None without exact verification
    offsets: np.ndarray | None            # (n + 1,) int64 into `shingles`


@dataclass
class BandPart:
    """One hash range of a generation's band rows and exact-hash rows, each sorted by hash."""
    lo: int
    hi: int
    bands: dict[str, np.ndarray]          # key, digest, ref (uint64)
    exact: dict[str, np.ndarray]          # hi, lo, ref (uint64)


@dataclass
class Generation:
    gen: int
    plan: str
    run_dir: str
    docs: int
    part_docs: list[int]                  # documents per segment part
    ranges: list[list[int]]               # [lo, hi, band rows, exact rows] per band part
    superseded: bool = False

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Manifest:
    params: dict
    next_gen: int = 1
    generations: list[Generation] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"version": MANIFEST_VERSION, "params": self.params, "next_gen": self.next_gen,
                "generations": [g.to_json() for g in self.generations]}

    @classmethod
    def from_json(cls, d: dict) -> "Manifest":
        return cls(params=d["params"], next_gen=int(d["next_gen"]),
                   generations=[Generation(**g) for g in d.get("generations", [])]
                   if d.get("version") == MANIFEST_VERSION else [])

    def visible(self, run_dir: str) -> list[Generation]:
        """Generations a run into `run_dir` deduplicates against: not superseded, not its own."""
        return [g for g in self.generations if not g.superseded and g.run_dir != run_dir]

    def committed_plan(self, plan: str) -> Generation | None:
        return next((g for g in self.generations if g.plan == plan and not g.superseded), None)

    def with_commit(self, new: Generation) -> tuple["Manifest", list[int]]:
        """The manifest after committing `new`, and the generations it supersedes."""
        gens, dropped = [], []
        for g in self.generations:
            g = Generation(**g.to_json())
            if g.run_dir == new.run_dir and not g.superseded:
                g.superseded = True
                dropped.append(g.gen)
            gens.append(g)
        gens.append(new)
        return Manifest(self.params, max(self.next_gen, new.gen + 1), gens), dropped


def check_params(stored: dict, wanted: dict, where: str) -> None:
    diff = [f"dedup.{k}: index has {stored.get(k)!r}, config asks for {v!r}"
            for k, v in wanted.items() if stored.get(k) != v]
    if diff:
        raise IndexMismatch(f"the dedup index at {where} was built with other parameters ("
                            + "; ".join(diff) + "): use another `dedup.index` name or delete that index")


# ---- stores -----------------------------------------------------------------------------------

def _seg(gen: int, part: int, what: str) -> str:
    return f"seg-{gen:06d}-{part:05d}.{what}"


def _band(gen: int, part: int, what: str) -> str:
    return f"seg-{gen:06d}-b{part:04d}.{what}"


class FileStore:
    """The index as a folder: `manifest.json`, arrays as `.npy` (memory-mapped), tables as parquet."""
    backend = "file"

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.location = str(self.folder)
        self._readers: dict[str, NpyRows] = {}

    def read_manifest(self) -> Manifest | None:
        path = self.folder / "manifest.json"
        return Manifest.from_json(read_json(path)) if path.exists() else None

    def raw_params(self) -> dict | None:
        path = self.folder / "manifest.json"
        return read_json(path)["params"] if path.exists() else None

    @contextlib.contextmanager
    def lock(self):
        import fcntl
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)      # one committer at a time; released if it dies
            yield

    def publish(self, manifest: Manifest, expected_next_gen: int) -> None:
        write_json_atomic(self.folder / "manifest.json", manifest.to_json())   # under the lock

    def put_array(self, name: str, arr: np.ndarray) -> None:
        save_npy(self.folder / name, arr)

    def array(self, name: str) -> np.ndarray:
        return np.load(self.folder / name, mmap_mode="r")

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows of an array read from disk (not mapped: what a plan reads at random stays small)."""
        reader = self._readers.get(name)
        if reader is None:
            if len(self._readers) > 256:
                self.close()
            reader = self._readers[name] = NpyRows(self.folder / name)
        return reader.rows(start, stop)

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def put_table(self, name: str, table: pa.Table) -> None:
        with atomic_path(self.folder / name) as tmp:
            pq.write_table(table, tmp, compression="zstd")

    def table(self, name: str) -> pa.Table:
        return pq.read_table(self.folder / name)

    def names(self) -> list[str]:
        return [p.name for p in self.folder.glob("seg-*")] if self.folder.exists() else []

    def delete(self, names: Iterable[str]) -> None:
        for n in names:
            (self.folder / n).unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("*") if p.is_file()) if self.folder.exists() else 0


class RedisStore:
    """The index in Redis: each array or table one value under `<prefix>:<index>:`, the manifest
    one key (the commit point: a SET under WATCH), commits serialised by a Redis lock."""
    backend = "redis"

    def __init__(self, redis_cfg: dict, name: str):
        import os

        import redis
        self.prefix = f"{redis_cfg.get('prefix', 'quipu-dedup')}:{name}"
        conn = {k: v for k, v in redis_cfg.items() if k in ("host", "port", "db")}
        if redis_cfg.get("password_env"):
            conn["password"] = os.environ.get(redis_cfg["password_env"])
        self.location = f"redis://{conn.get('host')}:{conn.get('port')}/{conn.get('db', 0)} {self.prefix}"
        self.r = redis.Redis(**conn)
        try:
            self.r.ping()
        except redis.RedisError as e:
            raise ConnectionError(f"dedup.redis: cannot reach Redis at {conn.get('host')}:{conn.get('port')}: {e}") from None
        self._cache: dict[str, np.ndarray] = {}

    def _k(self, what: str) -> str:
        return f"{self.prefix}:{what}"

    def read_manifest(self) -> Manifest | None:
        raw = self.r.get(self._k("manifest"))
        return Manifest.from_json(json.loads(raw)) if raw else None

    def raw_params(self) -> dict | None:
        raw = self.r.get(self._k("manifest"))
        return json.loads(raw)["params"] if raw else None

    @contextlib.contextmanager
    def lock(self):
        with commit_lock(self.r, self._k("commit-lock")):
            yield

    def publish(self, manifest: Manifest, expected_next_gen: int) -> None:
        import redis
        with self.r.pipeline() as pipe:   # the commit point: one SET, only if nobody else committed
            try:
                pipe.watch(self._k("manifest"))
                now = pipe.get(self._k("manifest"))
                now_next = Manifest.from_json(json.loads(now)).next_gen if now else 1
                if now_next != expected_next_gen:
                    raise ConcurrentCommit(f"the dedup index {self.location} changed during this commit: rerun")
                pipe.multi()
                pipe.set(self._k("manifest"), json.dumps(manifest.to_json()))
                pipe.execute()
            except redis.WatchError:
                raise ConcurrentCommit(f"the dedup index {self.location} changed during this commit: rerun") from None

    def put_array(self, name: str, arr: np.ndarray) -> None:
        buf = io.BytesIO()
        np.save(buf, arr)
        self._put(name, buf.getvalue())

    def _put(self, name: str, data: bytes) -> None:
        pipe = self.r.pipeline()
        pipe.sadd(self._k("names"), name)      # listed first, so a killed commit's values can be found
        pipe.set(self._k(f"blob:{name}"), data)
        pipe.execute()

    def array(self, name: str) -> np.ndarray:
        arr = self._cache.get(name)
        if arr is None:
            raw = self.r.get(self._k(f"blob:{name}"))
            if raw is None:
                raise FileNotFoundError(f"dedup index {self.location}: {name} is missing")
            arr = self._cache[name] = np.load(io.BytesIO(raw))
        return arr

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.array(name)[start:stop])

    def close(self) -> None:
        self._cache.clear()

    def put_table(self, name: str, table: pa.Table) -> None:
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd")
        self._put(name, buf.getvalue())

    def table(self, name: str) -> pa.Table:
        return pq.read_table(io.BytesIO(self.r.get(self._k(f"blob:{name}"))))

    def names(self) -> list[str]:
        return [n.decode() for n in self.r.smembers(self._k("names"))]

    def delete(self, names: Iterable[str]) -> None:
        names = list(names)
        if names:
            pipe = self.r.pipeline()
            for n in names:
                pipe.delete(self._k(f"blob:{n}"))
                pipe.srem(self._k("names"), n)
            pipe.execute()

    def disk_bytes(self) -> int:
        """Redis memory used by this index (what it would persist), via MEMORY USAGE on its keys."""
        return sum(int(self.r.memory_usage(k) or 0) for k in self.r.scan_iter(match=self.prefix + ":*", count=1000))


# ---- the index --------------------------------------------------------------------------------

class DedupIndex:
    """Documents kept by earlier runs, as the planner reads them: band and exact rows by hash
    range, signatures, shingles and ids by ref."""

    def __init__(self, store: FileStore | RedisStore, params: dict, run_dir: str):
        self.store, self.params, self.run_dir = store, params, run_dir
        self.backend, self.location = store.backend, store.location
        stored = store.raw_params()
        if stored is not None:
            check_params(stored, params, store.location)
        self.manifest = store.read_manifest() or Manifest(params)
        self.visible = self.manifest.visible(run_dir)
        self._gens = {g.gen: g for g in self.visible}

    def size(self) -> int:
        return sum(g.docs for g in self.visible)

    def band_rows_total(self) -> int:
        return sum(r[2] for g in self.visible for r in g.ranges)

    def generations_fingerprint(self) -> list:
        return [[g.gen, g.plan] for g in self.visible]

    # --- by hash range
    def _rows(self, kind: str, key_col: str, lo: int, hi: int) -> dict[str, np.ndarray]:
        out: list[dict[str, np.ndarray]] = []
        for g in self.visible:
            for i, (plo, phi, *_rest) in enumerate(g.ranges):
                if phi <= lo or plo >= hi:
                    continue
                cols = {c: self.store.array(_band(g.gen, i, f"{kind}.{c}.npy"))
                        for c in (BAND_COLUMNS if kind == "bands" else EXACT_COLUMNS)}
                s = key_range(cols[key_col], lo, hi)
                out.append({c: np.array(a[s]) for c, a in cols.items()})
        names = BAND_COLUMNS if kind == "bands" else EXACT_COLUMNS
        return {c: np.concatenate([o[c] for o in out]) if out else np.empty(0, np.uint64) for c in names}

    def band_rows(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        return self._rows("bands", "key", lo, hi)

    def exact_rows(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        return self._rows("exact", "hi", lo, hi)

    # --- by document
    def _locate(self, ref: int) -> tuple[int, int, int]:
        gen, n = ref >> GEN_SHIFT, ref & ((1 << GEN_SHIFT) - 1)
        counts = _cumulative(tuple(self._gens[gen].part_docs))
        part = int(np.searchsorted(counts, n, side="right")) - 1
        return gen, part, n - int(counts[part])

    def signature(self, ref: int) -> np.ndarray:
        gen, part, i = self._locate(ref)
        return self.store.rows(_seg(gen, part, "sig.npy"), i, i + 1)[0]

    def shingles(self, ref: int) -> np.ndarray:
        gen, part, i = self._locate(ref)
        a, b = self.store.rows(_seg(gen, part, "offsets.npy"), i, i + 2)
        return self.store.rows(_seg(gen, part, "shingles.npy"), a, b)

    def close(self) -> None:
        self.store.close()

    def doc_ids_of(self, refs: list[int]) -> dict[int, str]:
        """Ids of the given refs, reading each segment part once."""
        by_part: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for ref in refs:
            gen, part, i = self._locate(ref)
            by_part.setdefault((gen, part), []).append((ref, i))
        out = {}
        for (gen, part), items in by_part.items():
            ids = self.store.table(_seg(gen, part, "meta.parquet")).column("id")
            for ref, i in items:
                out[ref] = ids[i].as_py()
        return out

    def doc_ids(self) -> list[str]:
        """Ids of every visible document in key order (tests and reports)."""
        return [i for g in self.visible for p in range(len(g.part_docs))
                for i in self.store.table(_seg(g.gen, p, "meta.parquet")).column("id").to_pylist()]

    def disk_bytes(self) -> int:
        return self.store.disk_bytes()

    # --- writing
    def commit(self, gen: int, expected_next_gen: int, plan: str, segments: Iterable[SegmentPart],
               band_parts: Iterator[BandPart], crash_hook=None) -> None:
        with self.store.lock():
            current = self.store.read_manifest() or Manifest(self.params)
            if current.next_gen != expected_next_gen:
                raise ConcurrentCommit(f"the dedup index at {self.location} changed while this run was planning "
                                       f"(next generation {current.next_gen}, expected {expected_next_gen}): rerun")
            self._remove_unlisted(current)                 # what a killed commit left
            part_docs = []
            for p, seg in enumerate(segments):             # unlisted until the manifest names them
                self._write_segment(gen, p, seg)
                part_docs.append(len(seg.ids))
            ranges = []
            for i, bp in enumerate(band_parts):
                for c in BAND_COLUMNS:
                    self.store.put_array(_band(gen, i, f"bands.{c}.npy"), bp.bands[c])
                for c in EXACT_COLUMNS:
                    self.store.put_array(_band(gen, i, f"exact.{c}.npy"), bp.exact[c])
                ranges.append([bp.lo, bp.hi, len(bp.bands["key"]), len(bp.exact["hi"])])
            if crash_hook:
                crash_hook("commit")
            new, dropped = current.with_commit(Generation(gen=gen, plan=plan, run_dir=self.run_dir,
                                                          docs=sum(part_docs), part_docs=part_docs, ranges=ranges))
            self.store.publish(new, expected_next_gen)     # the commit point
            self.manifest = new
            self.store.delete(n for n in self.store.names() if _gen_of(n) in set(dropped))

    def _remove_unlisted(self, manifest: Manifest) -> None:
        live = {g.gen for g in manifest.generations if not g.superseded}
        self.store.delete(n for n in self.store.names() if _gen_of(n) not in live)

    def _write_segment(self, gen: int, p: int, part: SegmentPart) -> None:
        self.store.put_table(_seg(gen, p, "meta.parquet"), pa.table({
            "id": pa.array(part.ids, pa.string()), "exact": pa.array(part.exact, pa.binary(16))}))
        self.store.put_array(_seg(gen, p, "sig.npy"), part.sigs.astype(np.uint32, copy=False))
        if self.params["verify"] == "exact":
            self.store.put_array(_seg(gen, p, "shingles.npy"), part.shingles.astype(np.uint32, copy=False))
            self.store.put_array(_seg(gen, p, "offsets.npy"), part.offsets.astype(np.int64, copy=False))


BAND_COLUMNS = ["key", "digest", "ref"]
EXACT_COLUMNS = ["hi", "lo", "ref"]


def _gen_of(name: str) -> int | None:
    m = re.match(r"seg-(\d+)-", name)
    return int(m.group(1)) if m else None


@lru_cache(maxsize=256)
def _cumulative(part_docs: tuple[int, ...]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(part_docs)]).astype(np.int64)


@contextlib.contextmanager
def commit_lock(r, key: str, ttl: int = 30, wait_s: float = 600):
    """redis-py's Lock: taken with SET NX PX, released by an atomic compare-and-delete script, so a
    run never deletes a lock another run took after its own expired. The lock lives `ttl` seconds
    and a heartbeat renews it every ttl/3 while the commit runs: a killed holder's lock is gone
    within `ttl` seconds; a commit waits up to `wait_s` for it."""
    import threading

    import redis
    lock = r.lock(key, timeout=ttl, blocking_timeout=wait_s, thread_local=False)
    if not lock.acquire():
        raise ConcurrentCommit(f"the dedup index lock {key} is held by another run (waited {wait_s:g} s): rerun later")
    stop = threading.Event()

    def heartbeat():
        while not stop.wait(ttl / 3):
            try:
                lock.reacquire()
            except redis.exceptions.LockError:
                return

    beat = threading.Thread(target=heartbeat, name="dedup-commit-lock", daemon=True)
    beat.start()
    try:
        yield lock
    finally:
        stop.set()
        beat.join()
        try:
            lock.release()
        except redis.exceptions.LockNotOwnedError:
            pass   # it expired (the heartbeat could not reach Redis): the manifest check guards the commit
