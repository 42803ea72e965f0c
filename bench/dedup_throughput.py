r"""Dedup throughput and memory, on real documents from ../shared/data/text.

1. MinHash signatures (128 permutations, word 5-grams), the same documents, one process, one thread
   (ours and datasketch alternate for 3 rounds and the best round of each counts; datatrove once):
   - ours: `quipu.tasks.minhash.MinHasher` (Arrow tokenizer, words hashed once per batch vocabulary,
     n-grams combined and permuted in numpy) over batches of 2,000 documents;
   - plain datasketch: one `MinHash.update_batch` per document (words by `re.findall(r"\w+")`,
     shingles joined and encoded, datasketch's default sha1_hash32);
   - datatrove 0.10.1: `MinhashDedupSignature.get_shingles` + `get_signature` per document.
2. LSH: datasketch `MinHashLSH` (the stage's default 18 bands x 7 rows) insert + query docs/s with
   LeanMinHash built from our signatures (the reference the stage's band join replaces).
3. Peak memory (max RSS) of the whole stage (signatures, partitioned plan, split, commit, one
   process) at 20k, 50k, 100k generated documents (real documents sampled and perturbed, 10% near
   copies), fitted linearly (bench/million_docs.py measures it at a million).

    .venv/bin/python bench/dedup_throughput.py [--docs 2000] [--sizes 20000,50000,100000] [--append bench/RESULTS.md]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TEXT = ROOT.parent / "shared" / "data" / "text"


def load_texts() -> list[str]:
    if not TEXT.is_dir():
        sys.exit(f"needs the shared real data at {TEXT}")
    texts = []
    for f in sorted(TEXT.glob("*.jsonl")):
        with open(f) as fh:
            texts.extend(json.loads(line)["text"] for line in fh)
    return texts


def bench_signatures(texts: list[str], rounds: int = 3, num_perm: int = 128, ngram: int = 5) -> dict:
    """docs/s of each method on the same texts; ours and datasketch alternate for `rounds` rounds
    (the best round of each counts: the machine is shared), datatrove runs once (it is slow)."""
    import pyarrow as pa
    from datasketch import MinHash

    from quipu.tasks.minhash import MinHasher

    hasher = MinHasher(ngram, num_perm, seed=1)
    hasher.signatures(*hasher.shingle_hashes(pa.array(texts[:50])))     # warm-up (punctuation table)
    word_re = re.compile(r"\w+")

    def ours() -> float:
        t0 = time.perf_counter()
        for i in range(0, len(texts), 2000):
            hasher.signatures(*hasher.shingle_hashes(pa.array(texts[i:i + 2000])))
        return len(texts) / (time.perf_counter() - t0)

    def plain() -> float:
        t0 = time.perf_counter()
        for text in texts:   # a cheap Python word split, so the figure is datasketch's; default sha1_hash32
            words = word_re.findall(text.lower())
            shingles = [" ".join(words[i:i + ngram]).encode() for i in range(max(1, len(words) - ngram + 1))] if words else []
            m = MinHash(num_perm=num_perm, seed=1)
            m.update_batch(shingles)
        return len(texts) / (time.perf_counter() - t0)

    rounds_out = [(ours(), plain()) for _ in range(rounds)]
    out = {"ours": max(r[0] for r in rounds_out), "datasketch_update_batch": max(r[1] for r in rounds_out),
           "rounds": [[round(a), round(b)] for a, b in rounds_out]}

    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
    with tempfile.TemporaryDirectory() as tmp:
        dt = MinhashDedupSignature(tmp, config=MinhashConfig(n_grams=ngram, num_buckets=num_perm // 8, hashes_per_bucket=8))
        dt.get_signature(dt.get_shingles(texts[0]))      # warm-up: loads the word tokenizer
        t0 = time.perf_counter()
        for text in texts:
            sh = dt.get_shingles(text)
            if len(sh):
                dt.get_signature(sh)
        out["datatrove_signature"] = len(texts) / (time.perf_counter() - t0)
    out["speedup_vs_datasketch"] = out["ours"] / out["datasketch_update_batch"]
    out["speedup_per_round"] = [round(a / b, 2) for a, b in rounds_out]
    out["speedup_vs_datatrove"] = out["ours"] / out["datatrove_signature"]
    return out


def bench_lsh(texts: list[str]) -> dict:
    import numpy as np
    import pyarrow as pa

    from datasketch import LeanMinHash, MinHashLSH

    from quipu.tasks.dedup import DedupConfig
    from quipu.tasks.minhash import MinHasher

    cfg = DedupConfig()
    hasher = MinHasher(cfg.ngram, cfg.num_perm, cfg.seed)
    sigs = np.concatenate([hasher.signatures(*hasher.shingle_hashes(pa.array(texts[i:i + 2000])))
                           for i in range(0, len(texts), 2000)])
    lsh = MinHashLSH(num_perm=cfg.num_perm, params=cfg.lsh_params())
    t0 = time.perf_counter()
    minhashes = [LeanMinHash(seed=cfg.seed, hashvalues=s, scheme="affine32") for s in sigs]
    t_lean = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, m in enumerate(minhashes):
        lsh.insert(str(i), m, check_duplication=False)
    t_ins = time.perf_counter() - t0
    t0 = time.perf_counter()
    hits = sum(len(lsh.query(m)) for m in minhashes)
    t_q = time.perf_counter() - t0
    return {"docs": len(sigs), "bands_rows": list(cfg.lsh_params()), "lean_per_s": len(sigs) / t_lean,
            "insert_per_s": len(sigs) / t_ins, "query_per_s": len(sigs) / t_q,
            "insert_plus_query_per_s": len(sigs) / (t_ins + t_q), "mean_candidates": hits / len(sigs)}


def generate(texts: list[str], n: int, seed: int = 0) -> list[dict]:
    """n documents: real documents with 10-20% of words swapped (so they are new), 10% light copies."""
    rng = random.Random(seed)
    vocab = [w for t in texts[:500] for w in t.split()]
    out = []
    for i in range(n):
        if i % 10 == 9 and out:
            base = out[rng.randrange(len(out))]["text"].split()
            frac = 0.01
        else:
            base = texts[rng.randrange(len(texts))].split()
            frac = rng.uniform(0.1, 0.2)
        for _ in range(max(1, int(frac * len(base)))):
            base[rng.randrange(len(base))] = rng.choice(vocab)
        out.append({"id": f"gen/{i}", "text": " ".join(base)})
    return out


SHARD_DOCS = 10_000


def write_generated(texts: list[str], n: int, folder: Path) -> list[Path]:
    import pyarrow as pa

    from quipu.tasks.stage import write_table
    docs = generate(texts, n)
    paths = []
    for i in range(0, n, SHARD_DOCS):
        part = docs[i:i + SHARD_DOCS]
        paths.append(Path(write_table(folder / f"s{i // SHARD_DOCS:04d}.parquet",
                                      pa.table({"id": [d["id"] for d in part], "text": [d["text"] for d in part]})).path))
    return paths


def peak_rss() -> int:
    """This process's peak resident set (VmHWM; getrusage's ru_maxrss would include the parent's
    peak, which Linux carries across fork and exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_child(folder: str, n: int) -> None:
    """One whole stage run over the first n generated documents, alone in this process; prints
    JSON with its peak RSS (the process only imports and reads shards besides)."""
    from quipu.catalog.files import sha256_file
    from quipu.tasks.dedup import DedupConfig
    from quipu.tasks.pipeline import run_local
    from quipu.tasks.stage import Shard

    paths = sorted(Path(folder).glob("s*.parquet"))[:n // SHARD_DOCS]
    shards = [Shard(name=p.stem, path=str(p), sha256=sha256_file(p), rows=SHARD_DOCS) for p in paths]
    rss_before = peak_rss()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = DedupConfig(index="bench", index_dir=str(Path(tmp) / "index"))
        t0 = time.perf_counter()
        res, report = run_local("dedup", cfg, shards, str(Path(tmp) / "run"))
        seconds = time.perf_counter() - t0
        rep = report["stats"]["dedup"]
        print(json.dumps({"docs": n, "peak_rss": peak_rss(),
                          "rss_before": rss_before, "seconds": seconds, "docs_per_s": n / seconds,
                          "signature_seconds": rep["signature_seconds"],
                          "plan_seconds": rep["partition_seconds"] + rep["combine_seconds"],
                          "near_dup": rep["near_dup"], "exact_dup": rep["exact_dup"],
                          "index_disk_bytes": rep["index"]["disk_bytes"], "index_memory_bytes": rep["largest_partition_bytes"]}))


def bench_memory(texts: list[str], sizes: list[int]) -> dict:
    import numpy as np
    rows = []
    with tempfile.TemporaryDirectory() as gen_dir:
        write_generated(texts, max(sizes), Path(gen_dir))
        for n in sizes:
            p = subprocess.run([sys.executable, __file__, "--memory-child", str(n), "--generated", gen_dir],
                               capture_output=True, text=True, cwd=ROOT)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-3000:])
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"  {n} docs: {rows[-1]}", flush=True)
    x = np.array([r["docs"] for r in rows], float)
    slope, icpt = np.polyfit(x, np.array([r["peak_rss"] for r in rows], float), 1)
    dslope, _ = np.polyfit(x, np.array([r["index_disk_bytes"] for r in rows], float), 1)
    mslope, _ = np.polyfit(x, np.array([r["index_memory_bytes"] for r in rows], float), 1)
    return {"runs": rows, "rss_bytes_per_doc": slope, "rss_fixed_bytes": icpt,
            "peak_rss_per_million_gib": (slope * 1e6 + icpt) / 2**30,
            "index_disk_per_million_gib": dslope * 1e6 / 2**30, "partition_memory_per_million_gib": mslope * 1e6 / 2**30}


def format_md(args, sig: dict, lsh: dict, mem: dict | None, cmd: str) -> str:
    lines = [f"## Dedup throughput ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", "",
             f"Command: `{cmd}`", "",
             f"Machine: {_machine()}. Real documents from ../shared/data/text (mean "
             f"{args.mean_words:.0f} words); 128 permutations, word 5-grams; one process, one thread.", "",
             "| signatures, same documents | docs/s |", "|---|---|",
             f"| ours (`MinHasher`, batches of 2,000) | {sig['ours']:,.0f} |",
             f"| plain datasketch `MinHash.update_batch` per document | {sig['datasketch_update_batch']:,.0f} |",
             f"| datatrove `MinhashDedupSignature` (get_shingles + get_signature) | {sig['datatrove_signature']:,.0f} |",
             "", f"Speed-up: **{sig['speedup_vs_datasketch']:.1f}x** plain datasketch (goal >= 5x; best of "
             f"{len(sig['rounds'])} alternating rounds each; per round {sig['speedup_per_round']}), "
             f"{sig['speedup_vs_datatrove']:.1f}x datatrove (one round).", "",
             f"LSH (datasketch MinHashLSH, {lsh['bands_rows'][0]} bands x {lsh['bands_rows'][1]} rows, {lsh['docs']:,} docs): "
             f"insert {lsh['insert_per_s']:,.0f}/s, query {lsh['query_per_s']:,.0f}/s, "
             f"insert+query {lsh['insert_plus_query_per_s']:,.0f} docs/s; LeanMinHash construction "
             f"{lsh['lean_per_s']:,.0f}/s; {lsh['mean_candidates']:.2f} candidates per query (itself included).", ""]
    if mem:
        lines += ["| generated docs | whole stage s | docs/s | signatures s | plan s (partitions summed + combine) | near dups | peak RSS MiB | index on disk MiB | largest plan partition MiB |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in mem["runs"]:
            lines.append(f"| {r['docs']:,} | {r['seconds']:.1f} | {r['docs_per_s']:,.0f} | {r['signature_seconds']:.1f} | "
                         f"{r['plan_seconds']:.1f} | {r['near_dup']:,} | {r['peak_rss'] / 2**20:,.0f} | "
                         f"{r['index_disk_bytes'] / 2**20:,.1f} | {r['index_memory_bytes'] / 2**20:,.1f} |")
        growth = (f"→ **{mem['peak_rss_per_million_gib']:.1f} GiB peak per million documents** (extrapolated)"
                  if mem["rss_bytes_per_doc"] > 0 else "→ **no growth with the number of documents** in this range")
        lines += ["", f"Linear fit of peak RSS: {mem['rss_bytes_per_doc']:,.0f} bytes/doc + {mem['rss_fixed_bytes'] / 2**20:,.0f} MiB "
                  f"{growth}; "
                  f"index {mem['index_disk_per_million_gib']:.2f} GiB on disk per million kept documents; the largest plan "
                  f"partition grows {mem['partition_memory_per_million_gib']:.2f} GiB per million until `partition_rows` caps it.", ""]
    return "\n".join(lines) + "\n"


def _machine() -> str:
    import os
    return f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=2000, help="real documents for the signature comparison")
    ap.add_argument("--lsh-docs", type=int, default=15000)
    ap.add_argument("--sizes", default="20000,50000,100000", help="generated documents for the memory runs ('' to skip)")
    ap.add_argument("--append", help="append the results (markdown) to this file")
    ap.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--generated", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.generated, args.memory_child)
        return
    cmd = " ".join(["python", "bench/dedup_throughput.py", *sys.argv[1:]])
    texts = load_texts()
    random.Random(1).shuffle(texts)
    sample = texts[:args.docs]
    args.mean_words = sum(len(t.split()) for t in sample) / len(sample)
    print(f"signatures on {len(sample)} real documents ...", flush=True)
    sig = bench_signatures(sample)
    print(json.dumps(sig, indent=1), flush=True)
    print(f"LSH on {args.lsh_docs} documents ...", flush=True)
    lsh = bench_lsh(texts[:args.lsh_docs])
    print(json.dumps(lsh, indent=1), flush=True)
    mem = None
    if args.sizes:
        print("memory runs ...", flush=True)
        mem = bench_memory(texts, [int(x) for x in args.sizes.split(",")])
        print(json.dumps({k: v for k, v in mem.items() if k != "runs"}, indent=1), flush=True)
    md = format_md(args, sig, lsh, mem, cmd)
    print(md)
    if args.append:
        with open(args.append, "a") as fh:
            fh.write("\n" + md)


if __name__ == "__main__":
    main()
