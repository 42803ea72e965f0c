"""The persistent near-duplicate index of one dataset, kept between curation runs.

What it holds: for every document kept by an earlier run, its MinHash signature in a datasketch
`MinHashLSH`, its doc id, its exact-text hash and (with exact verification) its shingle hashes.
Each committed run adds one *generation*; LSH keys are `g<gen>:<n>`, so a key says which run kept
the document and lets a reader ignore generations it must not see.

Two backends, one contract:
- `FileIndex` (embedded default): a folder with `manifest.json` and one set of segment files per
  generation (signatures, ids, exact hashes, shingles). On open, the LSH is rebuilt in memory
  from the stored signatures (datasketch's dict storage): nothing is recomputed from text.
- `RedisIndex`: the LSH lives in datasketch's Redis storage (`storage_config={"type": "redis"}`),
  ids, exact hashes and shingles in Redis hashes beside it, so several workers or machines share it.

Commits are atomic: a generation's data is written first, then one atomic write of the manifest
(a file rename, or one Redis SET under WATCH) makes it visible. Data of a generation the manifest
does not list (a killed commit) is invisible to queries and is deleted on the next open. A run
re-executed into the same output directory *replaces* its earlier generation (otherwise its
documents would be found as duplicates of themselves).
"""
from __future__ import annotations

import contextlib

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import LeanMinHash, MinHashLSH

from quipu.catalog.errors import UserError
from quipu.catalog.files import atomic_path, read_json, write_json_atomic

SCHEME = "affine32"                      # datasketch 2.x default permutation scheme
KEY_RE = re.compile(r"^g(\d+):(\d+)$")
MANIFEST_VERSION = 1


class IndexMismatch(UserError, ValueError):
    """The stored index was built with other parameters than the config asks for."""


class ConcurrentCommit(UserError, RuntimeError):
    """Another run committed to the same index while this run was planning."""
    exit_code = 1   # nothing to change: a rerun plans against the other run's documents


def make_key(gen: int, n: int) -> str:
    return f"g{gen}:{n}"


def key_gen(key: str) -> int:
    m = KEY_RE.match(key)
    if not m:
        raise ValueError(f"not a dedup index key: {key!r}")
    return int(m.group(1))


def key_order(key: str) -> tuple[int, int]:
    """(generation, position): earlier runs and earlier kept documents sort first."""
    m = KEY_RE.match(key)
    return int(m.group(1)), int(m.group(2))


def new_lsh(params: dict, storage_config: dict | None = None) -> MinHashLSH:
    return MinHashLSH(num_perm=params["num_perm"], params=(params["bands"], params["rows"]),
                      storage_config=storage_config)


def lean(sig: np.ndarray, seed: int) -> LeanMinHash:
    return LeanMinHash(seed=seed, hashvalues=sig, scheme=SCHEME)


@dataclass
class SegmentPart:
    """Kept documents of one input shard in one generation, in kept order."""
    ids: list[str]
    exact: list[bytes]
    sigs: np.ndarray                      # (n, num_perm) uint32
    shingles: np.ndarray | None           # flat uint32, or None without exact verification
    offsets: np.ndarray | None            # (n + 1,) int64 into `shingles`


@dataclass
class Generation:
    gen: int
    plan: str
    run_dir: str
    docs: int
    parts: int
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
                   generations=[Generation(**g) for g in d.get("generations", [])])

    def visible(self, run_dir: str) -> list[Generation]:
        """Generations a run into `run_dir` deduplicates against: not superseded, not its own."""
        return [g for g in self.generations if not g.superseded and g.run_dir != run_dir]

    def committed_plan(self, plan: str) -> Generation | None:
        return next((g for g in self.generations if g.plan == plan and not g.superseded), None)

    def with_commit(self, gen: int, plan: str, run_dir: str, docs: int, parts: int) -> tuple["Manifest", list[int]]:
        """The manifest after committing `gen`, and the generations it supersedes."""
        gens, dropped = [], []
        for g in self.generations:
            g = Generation(**g.to_json())
            if g.run_dir == run_dir and not g.superseded:
                g.superseded = True
                dropped.append(g.gen)
            gens.append(g)
        gens.append(Generation(gen=gen, plan=plan, run_dir=run_dir, docs=docs, parts=parts))
        return Manifest(self.params, max(self.next_gen, gen + 1), gens), dropped


def check_params(stored: dict, wanted: dict, where: str) -> None:
    diff = [f"dedup.{k}: index has {stored.get(k)!r}, config asks for {v!r}"
            for k, v in wanted.items() if stored.get(k) != v]
    if diff:
        raise IndexMismatch(f"the dedup index at {where} was built with other parameters ("
                            + "; ".join(diff) + "): use another `dedup.index` name or delete that index")


class DedupIndex:
    """What the planner asks of a committed index (documents kept by earlier runs)."""
    backend: str
    location: str

    def __init__(self, params: dict, run_dir: str):
        self.params = params
        self.run_dir = run_dir
        self.manifest = Manifest(params)
        self.visible_gens: set[int] = set()
        self._shingle_cache: dict[str, np.ndarray] = {}

    # --- reading ---
    def query(self, m: LeanMinHash) -> list[str]:
        raise NotImplementedError

    def exact_key(self, digest: bytes) -> str | None:
        raise NotImplementedError

    def doc_id(self, key: str) -> str:
        raise NotImplementedError

    def shingles(self, key: str) -> np.ndarray:
        raise NotImplementedError

    def signature(self, key: str) -> np.ndarray:
        raise NotImplementedError

    def doc_ids(self) -> list[str]:
        """Ids of every visible document (tests and reports)."""
        raise NotImplementedError

    def size(self) -> int:
        return sum(g.docs for g in self.manifest.generations if g.gen in self.visible_gens)

    def disk_bytes(self) -> int:
        raise NotImplementedError

    # --- writing ---
    def commit(self, gen: int, expected_next_gen: int, plan: str, parts: Iterable[SegmentPart]) -> None:
        raise NotImplementedError

    def _visible(self, key: str) -> bool:
        return key_gen(key) in self.visible_gens


# ---- file backend -----------------------------------------------------------------------------

class FileIndex(DedupIndex):
    backend = "file"

    def __init__(self, folder: str | Path, params: dict, run_dir: str):
        super().__init__(params, run_dir)
        self.folder = Path(folder)
        self.location = str(self.folder)
        self.lsh = new_lsh(params)
        self._exact: dict[bytes, str] = {}
        self._ids: dict[int, list[str]] = {}
        self._sigs: dict[int, list[np.ndarray]] = {}
        self._shingles: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._part_of: dict[int, np.ndarray] = {}      # gen -> cumulative doc counts of its parts
        self._load()

    @property
    def manifest_path(self) -> Path:
        return self.folder / "manifest.json"

    def _part_path(self, gen: int, part: int, what: str) -> Path:
        return self.folder / f"seg-{gen:06d}-{part:05d}.{what}"

    def _read_manifest(self) -> Manifest | None:
        if not self.manifest_path.exists():
            return None
        return Manifest.from_json(read_json(self.manifest_path))

    def _load(self) -> None:
        man = self._read_manifest()
        if man is not None:
            check_params(man.params, self.params, str(self.folder))
            self.manifest = man
        seed = self.params["seed"]
        for g in self.manifest.visible(self.run_dir):
            self.visible_gens.add(g.gen)
            ids, sigs, shingles, counts = [], [], [], [0]
            for p in range(g.parts):
                meta = pq.read_table(self._part_path(g.gen, p, "meta.parquet"))
                part_ids = meta.column("id").to_pylist()
                digests = meta.column("exact").to_pylist()
                sig = np.load(self._part_path(g.gen, p, "sig.npy"), mmap_mode="r")
                if self.params["verify"] == "exact":
                    shingles.append((np.load(self._part_path(g.gen, p, "shingles.npy"), mmap_mode="r"),
                                     np.load(self._part_path(g.gen, p, "offsets.npy"))))
                base = counts[-1]
                with self.lsh.insertion_session() as session:
                    for i in range(len(part_ids)):
                        session.insert(make_key(g.gen, base + i), lean(np.asarray(sig[i]), seed),
                                       check_duplication=False)
                for i, d in enumerate(digests):
                    self._exact.setdefault(d, make_key(g.gen, base + i))
                ids.extend(part_ids)
                sigs.append(sig)
                counts.append(base + len(part_ids))
            self._ids[g.gen] = ids
            self._sigs[g.gen] = sigs
            self._shingles[g.gen] = shingles
            self._part_of[g.gen] = np.asarray(counts, dtype=np.int64)

    def _remove_unlisted(self) -> None:
        """Delete segment files of generations the manifest does not list (killed commits) or
        that it marks superseded. Called under the commit lock."""
        if not self.folder.exists():
            return
        live = {g.gen for g in self.manifest.generations if not g.superseded}
        for p in self.folder.glob("seg-*"):
            m = re.match(r"seg-(\d+)-", p.name)
            if m and int(m.group(1)) not in live:
                p.unlink(missing_ok=True)

    def _locate(self, key: str) -> tuple[int, int, int]:
        gen, n = key_order(key)
        counts = self._part_of[gen]
        part = int(np.searchsorted(counts, n, side="right")) - 1
        return gen, part, n - int(counts[part])

    def query(self, m: LeanMinHash) -> list[str]:
        return [k for k in self.lsh.query(m) if self._visible(k)]

    def exact_key(self, digest: bytes) -> str | None:
        return self._exact.get(digest)

    def doc_id(self, key: str) -> str:
        gen, n = key_order(key)
        return self._ids[gen][n]

    def signature(self, key: str) -> np.ndarray:
        gen, part, i = self._locate(key)
        return np.asarray(self._sigs[gen][part][i])

    def shingles(self, key: str) -> np.ndarray:
        gen, part, i = self._locate(key)
        flat, offs = self._shingles[gen][part]
        return np.asarray(flat[offs[i]:offs[i + 1]])

    def doc_ids(self) -> list[str]:
        return [i for g in sorted(self._ids) for i in self._ids[g]]

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.folder.glob("*") if p.is_file()) if self.folder.exists() else 0

    def commit(self, gen: int, expected_next_gen: int, plan: str, parts: Iterable[SegmentPart],
               crash_hook=None) -> None:
        import fcntl
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)      # one committer at a time; released if it dies
            self._commit_locked(gen, expected_next_gen, plan, parts, crash_hook)

    def _commit_locked(self, gen, expected_next_gen, plan, parts, crash_hook) -> None:
        current = self._read_manifest() or Manifest(self.params)
        if current.next_gen != expected_next_gen:
            raise ConcurrentCommit(f"the dedup index at {self.folder} changed while this run was planning "
                                   f"(next generation {current.next_gen}, expected {expected_next_gen}): rerun")
        self.manifest = current
        self._remove_unlisted()                   # what a killed commit left
        docs = n_parts = 0
        for part in parts:   # unlisted files until the manifest names them
            self._write_part(gen, n_parts, part)
            docs += len(part.ids)
            n_parts += 1
        if crash_hook:
            crash_hook("commit")
        new, dropped = current.with_commit(gen, plan, self.run_dir, docs, n_parts)
        write_json_atomic(self.manifest_path, new.to_json())   # the commit point
        self.manifest = new
        for g in dropped:
            for p in self.folder.glob(f"seg-{g:06d}-*"):
                p.unlink(missing_ok=True)

    def _write_part(self, gen: int, n: int, part: SegmentPart) -> None:
        meta = pa.table({"id": pa.array(part.ids, pa.string()),
                         "exact": pa.array(part.exact, pa.binary(16))})
        with atomic_path(self._part_path(gen, n, "meta.parquet")) as tmp:
            pq.write_table(meta, tmp, compression="zstd")
        save_npy(self._part_path(gen, n, "sig.npy"), part.sigs.astype(np.uint32, copy=False))
        if self.params["verify"] == "exact":
            save_npy(self._part_path(gen, n, "shingles.npy"), part.shingles.astype(np.uint32, copy=False))
            save_npy(self._part_path(gen, n, "offsets.npy"), part.offsets.astype(np.int64, copy=False))


def save_npy(path: Path, arr: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.save(fh, arr)


# ---- redis backend ----------------------------------------------------------------------------

class RedisIndex(DedupIndex):
    backend = "redis"

    def __init__(self, redis_cfg: dict, name: str, params: dict, run_dir: str):
        import redis
        super().__init__(params, run_dir)
        self.prefix = f"{redis_cfg.get('prefix', 'quipu-dedup')}:{name}"
        conn = {k: v for k, v in redis_cfg.items() if k in ("host", "port", "db")}
        if redis_cfg.get("password_env"):
            conn["password"] = {"env": redis_cfg["password_env"]}
        self.location = f"redis://{conn.get('host')}:{conn.get('port')}/{conn.get('db', 0)} {self.prefix}"
        self.storage_config = {"type": "redis", "basename": (self.prefix + ":lsh").encode(), "redis": conn}
        params_conn = dict(conn)
        if "password" in params_conn:
            import os
            params_conn["password"] = os.environ.get(redis_cfg["password_env"])
        self.r = redis.Redis(**params_conn)
        try:
            self.r.ping()
        except redis.RedisError as e:
            raise ConnectionError(f"dedup.redis: cannot reach Redis at {conn.get('host')}:{conn.get('port')}: {e}") from None
        self.lsh = new_lsh(params, self.storage_config)
        self._load()

    def _k(self, what: str) -> str:
        return f"{self.prefix}:{what}"

    def _read_manifest(self) -> Manifest | None:
        raw = self.r.get(self._k("manifest"))
        return Manifest.from_json(json.loads(raw)) if raw else None

    def _load(self) -> None:
        man = self._read_manifest()
        if man is not None:
            check_params(man.params, self.params, self.location)
            self.manifest = man
        self.visible_gens = {g.gen for g in self.manifest.visible(self.run_dir)}

    def _drop_unlisted(self) -> None:
        """Remove generations with data in Redis that the manifest does not list as live
        (killed or superseded commits). Called under the commit lock."""
        live = {g.gen for g in self.manifest.generations if not g.superseded}
        for raw in self.r.smembers(self._k("gens")):
            if int(raw) not in live:
                self._drop_generation(int(raw))

    def _drop_generation(self, gen: int) -> None:
        """Remove what a killed or superseded commit left (keys listed before they were inserted)."""
        keys = [k.decode() for k in self.r.lrange(self._k(f"genkeys:{gen}"), 0, -1)]
        present = [k for k in keys if k in self.lsh]
        if present:
            with self.lsh.deletion_session() as session:
                for k in present:
                    session.remove(k)
        pipe = self.r.pipeline()
        for k in keys:
            pipe.hdel(self._k("ids"), k)
            pipe.hdel(self._k("sigs"), k)
            pipe.hdel(self._k("shingles"), k)
        for d in self.r.lrange(self._k(f"genexact:{gen}"), 0, -1):
            owner = self.r.hget(self._k("exact"), d)   # a later generation may own the digest now
            if owner is not None and key_gen(owner.decode()) == gen:
                pipe.hdel(self._k("exact"), d)
        pipe.delete(self._k(f"genkeys:{gen}"), self._k(f"genexact:{gen}"))
        pipe.srem(self._k("gens"), gen)
        pipe.execute()

    def query(self, m: LeanMinHash) -> list[str]:
        return [k for k in self.lsh.query(m) if self._visible(k)]

    def exact_key(self, digest: bytes) -> str | None:
        raw = self.r.hget(self._k("exact"), digest)
        if raw is None:
            return None
        key = raw.decode()
        return key if self._visible(key) else None

    def doc_id(self, key: str) -> str:
        return self.r.hget(self._k("ids"), key).decode()

    def signature(self, key: str) -> np.ndarray:
        return np.frombuffer(self.r.hget(self._k("sigs"), key), dtype=np.uint32)

    def shingles(self, key: str) -> np.ndarray:
        return np.frombuffer(self.r.hget(self._k("shingles"), key), dtype=np.uint32)

    def doc_ids(self) -> list[str]:
        out = []
        for raw_key, raw_id in self.r.hscan_iter(self._k("ids")):
            key = raw_key.decode()
            if self._visible(key):
                out.append((key_order(key), raw_id.decode()))
        return [i for _, i in sorted(out)]

    def disk_bytes(self) -> int:
        """Redis memory used by this index (what it would persist), via MEMORY USAGE on its keys."""
        total = 0
        for pattern in (self.prefix + ":*",):
            for k in self.r.scan_iter(match=pattern, count=1000):
                total += int(self.r.memory_usage(k) or 0)
        return total

    def commit(self, gen: int, expected_next_gen: int, plan: str, parts: Iterable[SegmentPart],
               crash_hook=None) -> None:
        with commit_lock(self.r, self._k("commit-lock")):
            self._commit_locked(gen, expected_next_gen, plan, parts, crash_hook)

    def _commit_locked(self, gen, expected_next_gen, plan, parts, crash_hook) -> None:
        import redis
        current = self._read_manifest() or Manifest(self.params)
        if current.next_gen != expected_next_gen:
            raise ConcurrentCommit(f"the dedup index {self.location} changed while this run was planning "
                                   f"(next generation {current.next_gen}, expected {expected_next_gen}): rerun")
        self.manifest = current
        self._drop_unlisted()                     # what a killed commit left
        self.r.sadd(self._k("gens"), gen)       # so a killed commit can be found and removed
        seed = self.params["seed"]
        docs = n_parts = 0
        for part in parts:
            keys = [make_key(gen, docs + i) for i in range(len(part.ids))]
            if keys:
                pipe = self.r.pipeline()
                pipe.rpush(self._k(f"genkeys:{gen}"), *keys)
                pipe.rpush(self._k(f"genexact:{gen}"), *part.exact)
                pipe.execute()
            with self.lsh.insertion_session() as session:
                for i, k in enumerate(keys):
                    session.insert(k, lean(part.sigs[i], seed), check_duplication=False)
            pipe = self.r.pipeline()
            for i, k in enumerate(keys):
                pipe.hset(self._k("ids"), k, part.ids[i])
                pipe.hset(self._k("sigs"), k, np.ascontiguousarray(part.sigs[i], dtype=np.uint32).tobytes())
                if part.shingles is not None:
                    pipe.hset(self._k("shingles"), k,
                              np.ascontiguousarray(part.shingles[part.offsets[i]:part.offsets[i + 1]], dtype=np.uint32).tobytes())
                pipe.hset(self._k("exact"), part.exact[i], k)
            pipe.execute()
            docs += len(keys)
            n_parts += 1
        if crash_hook:
            crash_hook("commit")
        new, dropped = current.with_commit(gen, plan, self.run_dir, docs, n_parts)
        with self.r.pipeline() as pipe:   # the commit point: one SET, only if nobody else committed
            try:
                pipe.watch(self._k("manifest"))
                now = pipe.get(self._k("manifest"))
                now_next = Manifest.from_json(json.loads(now)).next_gen if now else 1
                if now_next != expected_next_gen:
                    raise ConcurrentCommit(f"the dedup index {self.location} changed during this commit: rerun")
                pipe.multi()
                pipe.set(self._k("manifest"), json.dumps(new.to_json()))
                pipe.execute()
            except redis.WatchError:
                raise ConcurrentCommit(f"the dedup index {self.location} changed during this commit: rerun") from None
        self.manifest = new
        for g in dropped:
            self._drop_generation(g)


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


class LocalIndex:
    """Documents kept so far in this run (not yet committed): an in-memory datasketch LSH."""

    def __init__(self, params: dict):
        self.lsh = new_lsh(params)
        self.exact: dict[bytes, str] = {}

    def insert(self, key: str, m: LeanMinHash, digest: bytes, in_lsh: bool = True) -> None:
        if in_lsh:   # a document without shingles (no words) has nothing to match on
            self.lsh.insert(key, m, check_duplication=False)
        self.exact.setdefault(digest, key)

    def query(self, m: LeanMinHash) -> list[str]:
        return self.lsh.query(m)
