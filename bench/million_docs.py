r"""The million-document run: dedup and curate at 100k / 300k / 1M documents, against a plain
datasketch loop on the same documents in the same run.

The corpus (built once, deterministic, `--data DIR`): real paragraphs of ../shared/data/text
(consecutive sentences of one source document packed into chunks of 40-90 words) recombined, 2-6
chunks of one source file per document, written as JSONL files of 50,000 documents. Planted:
- 12% of the documents are copies of an earlier document (at most 20,000 positions back): exact
  copies (identical, upper-cased, re-spaced: the same normalised text), word edits aimed at a word
  5-gram Jaccard of 0.97 / 0.92 / 0.87 / 0.82 (duplicates) and 0.75 / 0.65 / 0.5 (not), one chunk
  dropped or one added; the true Jaccard of every planted pair is computed exactly (Python sets of
  word 5-grams, the stage's tokenizer), so recall counts the planted pairs at J >= 0.8 of which
  a member was removed, and precision the removed documents whose `dup_of` twin really is at
  J >= 0.8 (computed for every removed document, planted or not);
- every 100th document carries a benchmark item (a leak, for decontam): a HumanEval prompt and a
  GSM8K question in turn (the prose questions survive heuristics; code prompts in prose mostly do not).

Runs (each timed one in a child process under `flock /work/.locks/timing.lock` when that folder
exists; peak RSS is the child's VmHWM, reset after start-up, plus the peak sum over its process
tree; CPU seconds from getrusage):
1. plain datasketch on the first N documents for each N of `--plain-docs`: per document `MinHash.update_batch` of
   its word 5-grams and `MinHashLSH(threshold=0.8)` query, then insert when nothing was found;
2. the dedup stage alone (`pipeline.run_local`, 2 threads, file index) on the same documents, and on
   every size;
3. the curate flow (`quipu.flows.curate`, thread runner, 2 workers: extract + dedup, every other
   stage off) on every size;
4. the curate flow with the default stages (langid, lines, heuristics, dedup, decontam, pii) on the
   first `--sample` documents (heuristics runs at ~40 docs/s per core: a million would take days here).

    .venv/bin/python bench/million_docs.py --data /tmp/quipu-million [--sizes 100000,300000,1000000]
        [--plain-docs 100000,1000000] [--sample 5000] [--append bench/RESULTS.md]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = ROOT.parent / "shared" / "data" / "text"
BENCHMARKS = ROOT.parent / "shared" / "data" / "benchmarks"
HUMANEVAL, GSM8K = BENCHMARKS / "humaneval.jsonl", BENCHMARKS / "gsm8k_test.jsonl"
LOCK = Path("/work/.locks/timing.lock")
FILE_DOCS = 50_000
COPY_RATE, WINDOW, LEAK_EVERY = 0.12, 20_000, 100
COPY_KINDS = ["exact", "upper", "spaces", "w0.97", "w0.92", "w0.87", "w0.82", "w0.75", "w0.65", "w0.50", "drop", "add"]
COPY_P = [0.10, 0.08, 0.07, 0.08, 0.08, 0.08, 0.08, 0.08, 0.08, 0.08, 0.10, 0.09]
THRESHOLD = 0.8


# ---- the corpus -------------------------------------------------------------------------------

def paragraph_pool() -> list[list[str]]:
    """Per shared source file, its text as chunks of 40-90 words of consecutive sentences."""
    pools = []
    for f in sorted(TEXT.glob("*.jsonl")):
        chunks = []
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                sentences = [s for s in re.split(r"(?<=[.!?])\s+|\n+", json.loads(line)["text"]) if s.strip()]
                cur, n = [], 0
                for s in sentences:
                    cur.append(s.strip())
                    n += len(s.split())
                    if n >= 40:
                        if n <= 90:
                            chunks.append(" ".join(cur))
                        cur, n = [], 0
        if len(chunks) >= 200:
            pools.append(chunks)
    return pools


class Corpus:
    """Document i as a pure function of i (so any document can be rebuilt from its id)."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed = n, seed
        self.pools = paragraph_pool()
        self.weights = np.array([len(p) for p in self.pools], float)
        self.cum = np.cumsum(self.weights / self.weights.sum())
        self.vocab = sorted({w for p in self.pools for c in p[:300] for w in c.split()})
        # one generator per array: the layout of the first n documents is the same for any larger n
        rng = [np.random.default_rng([seed, k]) for k in range(3)]
        self.is_copy = (rng[0].random(n) < COPY_RATE) & (np.arange(n) >= 1000)
        pos = np.arange(n)
        self.orig = pos - 1 - (rng[1].random(n) * np.minimum(pos, WINDOW)).astype(np.int64)   # an earlier one
        for i in np.nonzero(self.is_copy)[0]:          # a copy of a copy is a copy of its original
            while self.is_copy[self.orig[i]]:
                self.orig[i] = self.orig[self.orig[i]]
        self.kind = rng[2].choice(len(COPY_KINDS), size=n, p=COPY_P)
        self.leak_items = [[json.loads(line)["text"] for line in open(f, encoding="utf-8")] for f in (HUMANEVAL, GSM8K)]

    @staticmethod
    def doc_id(i: int) -> str:
        return f"m{i:07d}"

    @staticmethod
    def index_of(doc_id: str) -> int:
        return int(doc_id[1:])

    def _chunks(self, i: int) -> list[str]:
        rng = random.Random(self.seed * 1_000_003 + i)
        pool = self.pools[int(np.searchsorted(self.cum, rng.random()))]
        return rng.sample(pool, rng.randint(2, 6))

    def base(self, i: int) -> str:
        chunks = self._chunks(i)
        if i % LEAK_EVERY == LEAK_EVERY - 1:
            k = i // LEAK_EVERY
            items = self.leak_items[self.leak_benchmark(i)]
            chunks.append(items[(k // 2) % len(items)])
        return "\n\n".join(chunks)

    @staticmethod
    def leak_benchmark(i: int) -> int:
        """0: HumanEval, 1: GSM8K (alternating leaks)."""
        return (i // LEAK_EVERY) % 2

    def is_leak(self, i: int) -> bool:
        return not self.is_copy[i] and i % LEAK_EVERY == LEAK_EVERY - 1

    def text(self, i: int) -> str:
        if not self.is_copy[i]:
            return self.base(i)
        o = int(self.orig[i])
        kind = COPY_KINDS[self.kind[i]]
        rng = random.Random(self.seed * 7_000_003 + i)
        if kind == "exact":
            return self.base(o)
        if kind == "upper":
            return self.base(o).upper()
        if kind == "spaces":
            return "  ".join(self.base(o).split(" ")) + "\n"
        chunks = self.base(o).split("\n\n")
        if kind == "drop":
            if len(chunks) > 2:
                chunks.pop(rng.randrange(len(chunks)))
            return "\n\n".join(chunks)
        if kind == "add":
            chunks.insert(rng.randrange(len(chunks) + 1), self._chunks(10**9 + i)[0])   # not a document
            return "\n\n".join(chunks)
        target = float(kind[1:])
        words = "\n\n".join(chunks).split(" ")
        shingles = max(1, len(words) - 4)
        m = max(1, round(shingles * (1 - target) / (5 * (1 + target))))
        for pos in rng.sample(range(len(words)), min(m, len(words))):
            words[pos] = rng.choice(self.vocab)
        return " ".join(words)

    def planted(self, n: int) -> list[tuple[int, int, str]]:
        return [(int(self.orig[i]), int(i), COPY_KINDS[self.kind[i]]) for i in np.nonzero(self.is_copy[:n])[0]]


def write_corpus(corpus: Corpus, data: Path) -> list[Path]:
    data.mkdir(parents=True, exist_ok=True)
    files = []
    for f0 in range(0, corpus.n, FILE_DOCS):
        path = data / f"part-{f0 // FILE_DOCS:04d}.jsonl"
        files.append(path)
        if path.exists():
            continue
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for i in range(f0, min(f0 + FILE_DOCS, corpus.n)):
                fh.write(json.dumps({"id": corpus.doc_id(i), "text": corpus.text(i)}, ensure_ascii=False) + "\n")
        tmp.rename(path)
        print(f"  wrote {path.name}", flush=True)
    return files


def check_corpus(corpus: Corpus, files: list[Path], per_file: int = 50) -> None:
    """Documents read back from the files equal the ones the ground truth rebuilds from their ids
    (files written by an earlier, different build would make every figure wrong)."""
    rng = random.Random(5)
    for path in files:
        lines = [x for x in path.read_text(encoding="utf-8").split("\n") if x]   # not splitlines: U+2028 is text
        for line in rng.sample(lines, min(per_file, len(lines))):
            doc = json.loads(line)
            if corpus.text(corpus.index_of(doc["id"])) != doc["text"]:
                raise SystemExit(f"{path}: {doc['id']} differs from this build: delete {path.parent} and rerun")


def parquet_shards(data: Path, n: int) -> list[dict]:
    """The first n documents as parquet shards of FILE_DOCS (the dedup-alone runs read these)."""
    import pyarrow as pa

    from quipu.tasks.stage import write_table
    out = []
    for k in range((n + FILE_DOCS - 1) // FILE_DOCS):
        path = data / "parquet" / f"part-{k:04d}.parquet"
        if not path.exists():
            rows = [json.loads(line) for line in open(data / f"part-{k:04d}.jsonl", encoding="utf-8")]
            write_table(path, pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]}))
        from quipu.catalog.files import sha256_file
        import pyarrow.parquet as pq
        out.append({"name": path.stem, "path": str(path), "sha256": sha256_file(path),
                    "rows": pq.ParquetFile(path).metadata.num_rows, "bytes": path.stat().st_size})
    return out


# ---- ground truth -----------------------------------------------------------------------------

class Truth:
    """Exact word 5-gram Jaccard (Python sets over the stage's tokenizer), cached per pair."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self.cache: dict[tuple[int, int], float] = {}

    def _sets(self, idx: list[int]) -> dict[int, frozenset]:
        import pyarrow as pa

        from quipu.tasks.minhash import tokenize
        out = {}
        for s in range(0, len(idx), 5000):
            part = idx[s:s + 5000]
            flat, lengths = tokenize(pa.array([self.corpus.text(i) for i in part], pa.string()))
            ws, start = flat.to_pylist(), 0
            for i, n in zip(part, lengths):
                w = ws[start:start + n]
                start += n
                out[i] = frozenset([tuple(w)]) if 0 < len(w) < 5 else frozenset(zip(*(w[k:] for k in range(5))))
        return out

    def jaccard(self, pairs: list[tuple[int, int]]) -> list[float]:
        todo = sorted({p for p in pairs if p not in self.cache})
        for s in range(0, len(todo), 20_000):
            chunk = todo[s:s + 20_000]
            sets = self._sets(sorted({i for p in chunk for i in p}))
            for a, b in chunk:
                x, y = sets[a], sets[b]
                self.cache[(a, b)] = len(x & y) / len(x | y) if (x or y) else 1.0
        return [self.cache[p] for p in pairs]

    def evaluate(self, n: int, removed: dict[int, int]) -> dict:
        """recall over planted pairs at J >= 0.8; precision over removed documents (J to dup_of)."""
        planted = self.corpus.planted(n)
        pj = self.jaccard([(o, c) for o, c, _ in planted])
        pos = [(o, c) for (o, c, _), j in zip(planted, pj) if j >= THRESHOLD]
        caught = sum(1 for o, c in pos if o in removed or c in removed)
        rj = self.jaccard([(min(x, t), max(x, t)) for x, t in removed.items()])
        good = sum(1 for j in rj if j >= THRESHOLD)
        by_level: dict[str, list[float]] = {}
        for (o, c, k), j in zip(planted, pj):
            by_level.setdefault(k, []).append(j)
        near = [(o, c) for (o, c, k), j in zip(planted, pj) if j >= THRESHOLD and k not in ("exact", "upper", "spaces")]
        near_caught = sum(1 for o, c in near if o in removed or c in removed)
        return {"planted_pairs": len(planted), "positive_pairs": len(pos), "recall": caught / len(pos) if pos else None,
                "near_pairs": len(near), "recall_near": near_caught / len(near) if near else None,
                "removed": len(removed), "precision": good / len(removed) if removed else None,
                "planted_jaccard_median": {k: round(float(np.median(v)), 3) for k, v in sorted(by_level.items())}}


# ---- measuring --------------------------------------------------------------------------------

def peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")   # VmHWM := current RSS (Linux >= 4.0)
    except OSError:
        pass


class TreeSampler:
    """Peak of the summed RSS of this process and its descendants (e.g. a Prefect server child), and
    the CPU its descendants used while it ran. getrusage(RUSAGE_CHILDREN) counts only children that
    were waited for; a worker that lives to the end of the run (the extract stage's HTML child) is
    missing from it, so the CPU of every descendant seen is sampled too (each one's own user +
    system time at its last sample, less what it had used when sampling began)."""

    def __init__(self, every: float = 0.5):
        import psutil
        self.proc, self.every, self.peak = psutil.Process(), every, 0
        self.samples: list[tuple[float, int]] = []      # (perf_counter, summed RSS): peaks per stage window
        self._cpu: dict[tuple[int, float], float] = {}  # (pid, create time) -> own CPU seconds at its last sample
        self._cpu0: dict[tuple[int, float], float] = {}  # the same when sampling began (descendants already there)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int:
        import psutil
        total = 0
        for p in self.proc.children(recursive=True):
            try:
                with p.oneshot():
                    total += p.memory_info().rss
                    t = p.cpu_times()
                    self._cpu[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                pass
        try:
            total += self.proc.memory_info().rss
        except psutil.Error:
            pass
        return total

    def _run(self):
        while not self._stop.wait(self.every):
            total = self._sample()
            self.peak = max(self.peak, total)
            self.samples.append((time.perf_counter(), total))

    @property
    def descendant_cpu(self) -> float:
        """CPU seconds the descendants used while sampling ran (each up to its last sample)."""
        return sum(c - self._cpu0.get(k, 0.0) for k, c in self._cpu.items())

    def __enter__(self):
        self._sample()
        self._cpu0 = dict(self._cpu)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._sample()


def self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def du(*paths: Path) -> int:
    total = 0
    for p in paths:
        if p.is_file():
            total += p.stat().st_size
        elif p.exists():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return total


# ---- the runs (each in a child process) -------------------------------------------------------

def child_plain(shards: list[dict]) -> dict:
    """Plain datasketch: MinHash.update_batch per document + MinHashLSH(threshold=0.8) query/insert."""
    import pyarrow.parquet as pq
    from datasketch import MinHash, MinHashLSH
    word_re = re.compile(r"\w+")
    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=128)
    removed: dict[str, str] = {}
    n = 0
    reset_peak()
    t0, c0 = time.perf_counter(), cpu_seconds()
    for s in shards:
        for rb in pq.ParquetFile(s["path"]).iter_batches(batch_size=2000, columns=["id", "text"]):
            for doc_id, text in zip(rb.column(0).to_pylist(), rb.column(1).to_pylist()):
                words = word_re.findall(text.lower())
                m = MinHash(num_perm=128, seed=1)
                m.update_batch([" ".join(words[i:i + 5]).encode() for i in range(max(1, len(words) - 4))] if words else [])
                found = lsh.query(m)
                if found:
                    removed[doc_id] = min(found)
                else:
                    lsh.insert(doc_id, m, check_duplication=False)
                n += 1
    return {"docs": n, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - c0,
            "peak_rss": peak_rss(), "removed": removed, "bands_rows": [lsh.b, lsh.r]}


def child_dedup(shards: list[dict], work: Path, threads: int) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.parquet as pq

    from quipu.tasks.dedup import DedupConfig
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.stage import Shard
    pool = ThreadPoolExecutor(threads)
    cfg = DedupConfig(index="million", index_dir=str(work / "index"))
    reset_peak()
    t0, c0 = time.perf_counter(), cpu_seconds()
    with TreeSampler() as tree:
        _, report = run_local("dedup", cfg, [Shard(**s) for s in shards], str(work / "run"),
                              map_fn=lambda fn, items: list(pool.map(fn, items)))
    seconds, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    removed = {}
    for f in sorted((work / "run" / "dedup" / "removed").glob("*.parquet")):
        t = pq.read_table(f, columns=["id", "dup_of"])
        removed.update(zip(t.column(0).to_pylist(), t.column(1).to_pylist()))
    d = report["stats"]["dedup"]
    return {"docs": report["input_docs"], "seconds": seconds, "cpu_seconds": cpu, "peak_rss": peak_rss(),
            "tree_peak_rss": tree.peak, "removed": removed, "disk_bytes": du(work / "run", work / "index"),
            "phases": {"signatures (CPU-s summed)": d["signature_seconds"], "plan partitions (summed)": d["partition_seconds"],
                       "combine": d["combine_seconds"], "commit": d["commit_seconds"]},
            "plan_partitions": d["plan_partitions"], "largest_partition_mib": d["largest_partition_bytes"] / 2**20,
            "candidates": d["candidates"], "exact_dup": d["exact_dup"], "near_dup": d["near_dup"]}


def child_curate(files: list[str], work: Path, full: bool, config_path: str | None = None,
                 overrides: tuple[str, ...] = ()) -> dict:
    from prefect import flow

    from quipu.flows.curate import CurateConfig, curate
    from quipu.tasks.pipeline import STAGES

    @flow(name="bench-warm-up")
    def warm_up() -> int:
        return 1

    warm_up()   # the Prefect API starts before the clock
    if config_path:   # a shipped config as it is (bench/crawl_cost.py): every stage it enables, intermediates kept
        from quipu.flows.config import load_config
        config = load_config(CurateConfig, config_path, [f"output={work / 'run'}", f"dataset=crawl-{len(files)}",
                                                         "keep_intermediate=true", f"dedup.index_dir={work / 'index'}",
                                                         *overrides])
        config = config.model_copy(update={"input": files})
    elif full:   # the demo's stages (quality and perplexity need trained models: off, as in the demo config)
        from quipu.flows.config import load_config
        gsm8k = work / "gsm8k.yaml"     # the shared GSM8K copy (the registry's entry expects data/benchmarks/gsm8k)
        work.mkdir(parents=True, exist_ok=True)
        gsm8k.write_text(f"name: gsm8k\npath: {GSM8K}\nfields: [text]\nid_field: id\nformat: jsonl\n")
        config = load_config(CurateConfig, str(ROOT / "configs" / "curate" / "demo.yaml"),
                             [f"output={work / 'run'}", "dataset=million-sample", "curated.shard_mb=64",
                              "extract.shard_mb=64", "extract.fix_unicode=false",
                              f"decontam.benchmarks=[humaneval, {gsm8k}]"])
        config = config.model_copy(update={"input": files})
    else:
        off = {s.name: {"enabled": False} for s in STAGES if s.name != "dedup"}
        config = CurateConfig.model_validate({"input": files, "output": str(work / "run"), "workers": 2,
                                              "dataset": f"million-{len(files)}", **off,
                                              "dedup": {"index_dir": str(work / "index")}})
    from quipu.flows.runners import make_task_runner
    runner = make_task_runner(config.runner, config.workers)   # as `quipu curate` runs it: `workers` threads
    from quipu.flows import curate as curate_module
    finished: list[tuple[str, float]] = []        # (stage, perf_counter) as each stage finishes
    finish = curate_module.CurateProgress.finish
    curate_module.CurateProgress.finish = lambda self, stage, report: (finished.append((stage, time.perf_counter())),
                                                                      finish(self, stage, report))[1]
    reset_peak()
    t0, c0, s0 = time.perf_counter(), cpu_seconds(), self_cpu_seconds()
    with TreeSampler() as tree:
        summary = curate.with_options(task_runner=runner)(config)
    # both are lower bounds: rusage misses live children, sampling misses a child's last half second
    seconds = time.perf_counter() - t0
    cpu_rusage, cpu_sampled = cpu_seconds() - c0, self_cpu_seconds() - s0 + tree.descendant_cpu
    cpu = max(cpu_rusage, cpu_sampled)
    windows, start = {}, t0           # a stage's window: from the previous stage's finish to its own
    for stage, t in finished:
        windows[stage] = max((rss for ts, rss in tree.samples if start <= ts <= t), default=0)
        start = t
    import pyarrow.parquet as pq
    removed, by_stage = {}, {}
    for f in sorted((work / "run" / "dedup" / "removed").glob("*.parquet")):
        t = pq.read_table(f, columns=["id", "dup_of"])
        removed.update(zip(t.column(0).to_pylist(), t.column(1).to_pylist()))
    removed_by_stage: dict[str, str] = {}       # document id -> the stage that removed it
    for f in sorted((work / "run").glob("*/removed/*.parquet")):
        for doc_id in pq.read_table(f, columns=["id"]).column(0).to_pylist():
            removed_by_stage[doc_id] = f.parent.parent.name
    for s in summary["stages"]:
        by_stage[s["name"]] = {"input_docs": s["input_docs"], "kept_docs": s["kept_docs"], "seconds": s["seconds"],
                               "tree_peak_rss": windows.get(s["name"]), "disk_bytes": du(work / "run" / s["name"])}
    return {"docs": summary["records_read"], "seconds": seconds, "cpu_seconds": cpu, "cpu_rusage": cpu_rusage,
            "cpu_sampled": cpu_sampled, "peak_rss": peak_rss(),
            "tree_peak_rss": tree.peak, "removed": removed, "stages": by_stage, "removed_by_stage": removed_by_stage,
            "disk_bytes": du(work / "run", work / "index"), "curated_rows": summary["curated"]["rows"]}


def run_child(kind: str, payload: dict, cores: int | None = None) -> dict:
    """One timed run in its own process, under the machine's timing lock; with `cores`, pinned to
    the first `cores` CPUs (taskset), so both sides of a comparison get the same cores."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(payload, fh)
    out = Path(fh.name + ".out")
    cmd = [sys.executable, __file__, "--child", kind, "--payload", fh.name, "--result", str(out)]
    if cores:
        cmd = ["taskset", "-c", f"0-{cores - 1}"] + cmd
    if LOCK.parent.is_dir():
        cmd = ["flock", str(LOCK)] + cmd
    load = os.getloadavg()[0]
    p = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"{kind} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")
    result = json.loads(out.read_text())
    result["load_before"] = load
    result["load_after"] = os.getloadavg()[0]
    return result


def child_main(kind: str, payload_path: str, result_path: str) -> None:
    payload = json.loads(Path(payload_path).read_text())
    work = Path(payload["work"])
    if kind == "plain":
        res = child_plain(payload["shards"])
    elif kind == "dedup":
        res = child_dedup(payload["shards"], work, payload.get("threads", 2))
    else:
        res = child_curate(payload["files"], work, kind == "curate-full", payload.get("config"), payload.get("set", ()))
    Path(result_path).write_text(json.dumps(res))


# ---- the report -------------------------------------------------------------------------------

def mib(b: float) -> str:
    return f"{b / 2**20:,.0f}"


def main() -> None:
    global FILE_DOCS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "quipu-million")
    ap.add_argument("--sizes", default="100000,300000,1000000")
    ap.add_argument("--plain-docs", default="100000", help="sizes of the plain datasketch runs (comma list)")
    ap.add_argument("--dedup-sizes", default="100000,1000000", help="sizes of the dedup-alone runs")
    ap.add_argument("--sample", type=int, default=5000, help="documents of the run with every default stage")
    ap.add_argument("--cores", default="", help="comma list, e.g. 1,2: instead of the plain and dedup runs above, for each "
                    "size of --plain-docs and each core count, the plain loop then the stage (threads = cores), both "
                    "pinned to that many cores (taskset)")
    ap.add_argument("--skip", default="", help="comma list of runs to skip: plain, dedup, curate, full")
    ap.add_argument("--file-docs", type=int, default=FILE_DOCS, help="documents per input file (sizes are multiples of it)")
    ap.add_argument("--append", type=Path)
    ap.add_argument("--reuse", type=Path, help="million-results.json of an earlier run: its rows of the skipped runs join this report (said so in it)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--payload", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child_main(args.child, args.payload, args.result)
    FILE_DOCS = args.file_docs
    args.data = args.data / f"files-of-{FILE_DOCS}"
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    sizes = [int(x) for x in args.sizes.split(",") if x]
    dedup_sizes = [int(x) for x in args.dedup_sizes.split(",") if x]
    skip = set(args.skip.split(","))
    plain_sizes = [int(x) for x in args.plain_docs.split(",") if x]
    n_max = max(sizes + dedup_sizes + plain_sizes + [args.sample])
    cmd = "python bench/million_docs.py " + " ".join(sys.argv[1:])
    print(f"corpus of {n_max:,} documents in {args.data} ...", flush=True)
    t0 = time.perf_counter()
    corpus = Corpus(n_max)
    files = write_corpus(corpus, args.data)
    text_bytes = sum(f.stat().st_size for f in files)
    check_corpus(corpus, files)
    print(f"  ready in {time.perf_counter() - t0:.0f} s, {text_bytes / 2**30:.2f} GiB of JSONL", flush=True)
    truth = Truth(corpus)
    work = Path(tempfile.mkdtemp(prefix="quipu-million-", dir=args.data))
    os.environ["QUIPU_HOME"] = str(work / "quipu-home")
    os.environ["PREFECT_HOME"] = str(work / "prefect-home")
    rows: list[dict] = []

    def record(what: str, n: int, res: dict, evaluate: bool = True) -> dict:
        removed = {corpus.index_of(k): corpus.index_of(v) for k, v in res.pop("removed", {}).items()} if "removed" in res else {}
        res["what"], res["n"] = what, n
        if evaluate:
            res["quality"] = truth.evaluate(n, removed)
        rows.append(res)
        res.pop("removed_by_stage", None)
        print(json.dumps(res, default=str), flush=True)
        return res

    cores = [int(x) for x in args.cores.split(",") if x]
    for n in plain_sizes if cores else []:      # same cores for both sides, alternating
        shards = parquet_shards(args.data, n)
        for c in cores:
            record(f"plain datasketch loop, {c} core(s)", n,
                   run_child("plain", {"work": str(work / f"plain-{n}-{c}"), "shards": shards}, cores=c))
            record(f"dedup stage alone, {c} core(s)", n,
                   run_child("dedup", {"work": str(work / f"dedup-{n}-{c}"), "shards": shards, "threads": c}, cores=c))
    if cores:
        skip |= {"plain", "dedup"}
    if "plain" not in skip:
        for n in plain_sizes:
            shards = parquet_shards(args.data, n)
            record("plain datasketch loop", n, run_child("plain", {"work": str(work / f"plain-{n}"), "shards": shards}))
    if "dedup" not in skip:
        for n in sorted(set(dedup_sizes + (plain_sizes if "plain" not in skip else []))):
            shards = parquet_shards(args.data, n)
            record("dedup stage alone", n, run_child("dedup", {"work": str(work / f"dedup-{n}"), "shards": shards}))
    if "curate" not in skip:
        for n in sizes:
            fs = [str(f) for f in files[:(n + FILE_DOCS - 1) // FILE_DOCS]]
            record("curate (extract + dedup)", n, run_child("curate", {"work": str(work / f"curate-{n}"), "files": fs}))
    if "full" not in skip:
        sample = args.data / f"sample-{args.sample}.jsonl"
        with open(files[0], encoding="utf-8") as src, open(sample, "w", encoding="utf-8") as dst:
            dst.writelines(line for _, line in zip(range(args.sample), src))
        res = run_child("curate-full", {"work": str(work / "full"), "files": [str(sample)]})
        leaks = [corpus.doc_id(i) for i in range(args.sample) if corpus.is_leak(i)]
        res["leaks_planted"] = len(leaks)
        where = res.pop("removed_by_stage")
        for name, b in (("HumanEval", 0), ("GSM8K", 1)):
            ids = [corpus.doc_id(i) for i in range(args.sample) if corpus.is_leak(i) and corpus.leak_benchmark(i) == b]
            res.setdefault("leaks_removed_by", {})[name] = {
                k: sum(1 for i in ids if where.get(i, "curated") == k) for k in sorted({where.get(i, "curated") for i in ids})}
        res.pop("removed")
        record("curate, default stages (sample)", args.sample, res, evaluate=False)   # earlier stages remove copies too
    if args.reuse:
        kinds = {"plain": "plain datasketch loop", "dedup": "dedup stage alone", "curate": "curate (extract + dedup)",
                 "full": "curate, default stages (sample)"}
        earlier = json.loads(args.reuse.read_text())
        reused = [dict(r, reused_from=earlier["command"]) for r in earlier["rows"] if any(
            r["what"] == kinds[k] for k in skip if k in kinds)]
        rows[:0] = reused
    out = {"command": cmd, "text_bytes": text_bytes, "rows": rows, "cores": os.cpu_count(),
           "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()}
    (args.data / "million-results.json").write_text(json.dumps(out, indent=1, default=str))
    md = format_md(out)
    print(md)
    if args.append:
        with open(args.append, "a") as fh:
            fh.write("\n" + md)


def leaks_reaching(row: dict) -> int:
    """Planted leaks that no stage before decontam removed (decontam removed them or they were curated)."""
    return sum(ends.get("decontam", 0) + ends.get("curated", 0) for ends in row["leaks_removed_by"].values())


def leaks_caught(row: dict) -> int:
    return sum(ends.get("decontam", 0) for ends in row["leaks_removed_by"].values())


def format_md(out: dict) -> str:
    rows = out["rows"]
    lines = [f"## The million-document run (`bench/million_docs.py`), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"Command: `{out['command']}`", "",
             f"Machine: {out['cores']} cores; `uptime` at the end (other work on the machine shows in it): `{out['uptime']}`. "
             f"Load average before/after each run in the table. Corpus: real paragraphs of ../shared/data/text "
             f"recombined, {out['text_bytes'] / 2**30:.2f} GiB of JSONL for the largest size; 12% planted copies "
             "(exact, case, spacing, word edits aimed at J 0.5-0.97, a chunk dropped or added), benchmark leaks "
             f"every {LEAK_EVERY}th document (HumanEval and GSM8K in turn).", "",
             "| run | docs | wall s | docs/s | docs per CPU-s | peak RSS MiB (process / tree) | disk written MiB | recall J>=0.8 | precision | load before/after |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        q = r.get("quality", {})
        tree = r.get("tree_peak_rss")
        lines.append(f"| {r['what']}{' (earlier run, see below)' if 'reused_from' in r else ''} | {r['n']:,} | {r['seconds']:,.1f} | {r['n'] / r['seconds']:,.0f} | "
                     f"{r['n'] / max(r['cpu_seconds'], 1e-9):,.0f} | {mib(r['peak_rss'])}"
                     f"{' / ' + mib(tree) if tree else ''} | {mib(r['disk_bytes']) if 'disk_bytes' in r else '—'} | "
                     f"{'—' if q.get('recall') is None else round(q['recall'], 4)} | "
                     f"{'—' if q.get('precision') is None else round(q['precision'], 4)} | "
                     f"{r['load_before']:.1f} / {r['load_after']:.1f} |")
    reused = sorted({r["reused_from"] for r in rows if "reused_from" in r})
    if reused:
        lines += ["", f"Rows marked 'earlier run' are from `{reused[0]}`, same corpus, same machine, an hour earlier (same dedup code)."]
    lines.append("")
    for plain in (r for r in rows if r["what"].startswith("plain")):
        stage_what = plain["what"].replace("plain datasketch loop", "dedup stage alone")
        same = next((r for r in rows if r["what"] == stage_what and r["n"] == plain["n"]), None)
        if same is None:
            continue
        lines.append(f"Dedup stage vs the plain datasketch loop on the same {plain['n']:,} documents in this run"
                     f"{plain['what'].replace('plain datasketch loop', '')}: "
                     f"**{plain['seconds'] / same['seconds']:.1f}x** wall time, "
                     f"{(same['n'] / same['cpu_seconds']) / (plain['n'] / plain['cpu_seconds']):.1f}x per CPU-second; "
                     f"recall {same['quality']['recall']:.4f} vs {plain['quality']['recall']:.4f} (near, non-exact pairs only: "
                     f"{same['quality']['recall_near']:.4f} vs {plain['quality']['recall_near']:.4f}), precision "
                     f"{same['quality']['precision']:.4f} vs {plain['quality']['precision']:.4f}.")
    for r in rows:
        if "phases" in r:
            lines.append(f"- dedup alone, {r['n']:,} docs: phases {json.dumps({k: round(v, 1) for k, v in r['phases'].items()})}; "
                         f"{r['plan_partitions']} plan partitions, largest {r['largest_partition_mib']:.0f} MiB of band rows; "
                         f"{r['candidates']:,} candidate pairs verified; {r['exact_dup']:,} exact + {r['near_dup']:,} near duplicates removed.")
        if "stages" in r:
            lines.append(f"- {r['what']}, {r['n']:,} docs: stage seconds "
                         + ", ".join(f"{k} {v['seconds']:.1f} s ({v['input_docs'] / max(v['seconds'], 1e-9):,.0f} docs/s)"
                                     for k, v in r["stages"].items())
                         + (f"; benchmark leaks planted {r['leaks_planted']}, where they ended: {r['leaks_removed_by']}"
                            f" (of the {leaks_reaching(r)} that reached decontam, it removed {leaks_caught(r)})"
                            if "leaks_planted" in r else ""))
    q = next((r["quality"] for r in rows if "quality" in r), None)
    if q:
        lines.append(f"- median true Jaccard of the planted pairs by kind: {q['planted_jaccard_median']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
