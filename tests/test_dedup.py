"""Dedup stage: datasketch-exact signatures, ground-truth recall/precision on real text,
incremental runs (file and Redis index), kill + rerun, and the stage inside the curate flow."""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.tasks.dedup import DedupConfig, index_name, open_index
from quipu.tasks.minhash import MinHasher, words
from quipu.tasks.pipeline import run_local
from quipu.tasks.dedup_index import IndexMismatch
from quipu.tasks.stage import RunContext, Shard, write_table
from tests.conftest import ROOT, quipu_main, require_binary

NGRAM = 5
SOURCES = ["en_nltk_abc_news.jsonl", "es_nltk_cess_esp_news.jsonl", "pt_fakebr_news.jsonl",
           "en_nltk_movie_reviews.jsonl", "en_ud_ewt_web.jsonl", "es_nltk_conll2002_efe_news.jsonl"]


# ---- helpers ----------------------------------------------------------------------------------

def load_docs(shared_data: Path, min_words: int = 40, per_file: int = 400) -> list[dict]:
    docs = []
    for name in SOURCES:
        with open(shared_data / "text" / name) as fh:
            n = 0
            for line in fh:
                d = json.loads(line)
                if len(d["text"].split()) >= min_words:
                    docs.append({"id": d["id"], "text": d["text"]})
                    n += 1
                    if n >= per_file:
                        break
    return docs


def perturb(text: str, frac: float, rng: random.Random, vocab: list[str]) -> str:
    """Replace or delete `frac` of the words (whitespace tokens) at random positions."""
    toks = text.split()
    n_edit = max(1, round(frac * len(toks)))
    for pos in sorted(rng.sample(range(len(toks)), n_edit), reverse=True):
        if rng.random() < 0.5:
            toks[pos] = rng.choice(vocab)
        else:
            del toks[pos]
    return " ".join(toks)


def reference_words(text: str) -> list[str]:
    """The dedup stage's definition of a word, written here in plain Python and independent of
    quipu.tasks.minhash (which uses pyarrow kernels): whitespace tokens, lower-cased, Unicode
    punctuation and symbols (categories P*, S*) stripped from both ends, empty ones dropped."""
    out = []
    for tok in text.lower().split():
        i, j = 0, len(tok)
        while i < j and unicodedata.category(tok[i])[0] in "PS":
            i += 1
        while j > i and unicodedata.category(tok[j - 1])[0] in "PS":
            j -= 1
        if i < j:
            out.append(tok[i:j])
    return out


def shingle_sets(texts: list[str]) -> list[frozenset]:
    """Word 5-gram sets (tuples of words) from the reference tokenizer: the truth the tests compare with."""
    return [shingle_set(t) for t in texts]


def shingle_set(text: str) -> frozenset:
    return _shingles(reference_words(text))


def _shingles(w: list[str]) -> frozenset:
    if 0 < len(w) < NGRAM:
        return frozenset([tuple(w)])
    return frozenset(tuple(w[i:i + NGRAM]) for i in range(len(w) - NGRAM + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def true_pairs(docs: list[dict], threshold: float) -> dict[tuple[str, str], float]:
    """Every pair with word-5-gram Jaccard >= threshold, exactly: intersection sizes of all pairs
    from a sparse document x shingle incidence matrix (M @ M.T)."""
    from scipy import sparse
    sets = shingle_sets([d["text"] for d in docs])
    vocab: dict[tuple, int] = {}
    rows, cols = [], []
    for i, s in enumerate(sets):
        for sh in s:
            rows.append(i)
            cols.append(vocab.setdefault(sh, len(vocab)))
    m = sparse.csr_matrix((np.ones(len(rows), np.int32), (rows, cols)), shape=(len(sets), len(vocab)))
    inter = sparse.triu(m @ m.T, k=1).tocoo()
    sizes = np.array([len(s) for s in sets])
    jac = inter.data / (sizes[inter.row] + sizes[inter.col] - inter.data)
    return {(docs[i]["id"], docs[j]["id"]): float(x) for i, j, x in zip(inter.row, inter.col, jac) if x >= threshold}


def write_shards(rows: list[dict], folder: Path, n: int, prefix: str = "s") -> list[Shard]:
    shards = []
    size = (len(rows) + n - 1) // n
    for i in range(n):
        part = rows[i * size:(i + 1) * size]
        t = pa.table({"id": pa.array([r["id"] for r in part], pa.string()),
                      "text": pa.array([r["text"] for r in part], pa.string()),
                      **({"quality_score": pa.array([r.get("q") for r in part], pa.float64())}
                         if any("q" in r for r in part) else {})})
        shards.append(write_table(folder / f"{prefix}{i:02d}.parquet", t))
    return shards


def dedup_local(shards, run_dir, cfg):
    """The dedup stage in process (no Prefect): its shard results and stage report."""
    return run_local("dedup", cfg, shards, run_dir)


def removed_rows(run_dir: Path) -> list[dict]:
    files = sorted((run_dir / "dedup" / "removed").glob("*.parquet"))
    return [r for f in files for r in pq.read_table(f, columns=["id", "reason", "dup_of", "cluster_id", "dup_jaccard"]).to_pylist()]


def kept_ids(run_dir: Path) -> list[str]:
    files = sorted((run_dir / "dedup" / "kept").glob("*.parquet"))
    return [i for f in files for i in pq.read_table(f, columns=["id"]).column("id").to_pylist()]


def cfg_for(tmp_path: Path, backend: str, index: str, redis_cfg: dict | None = None, **kw) -> DedupConfig:
    data = {"index": index, "backend": backend, "index_dir": str(tmp_path / "index" / index), **kw}
    if backend == "redis":
        data["redis"] = redis_cfg
    return DedupConfig.model_validate(data)


# ---- redis ------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    exe = require_binary("redis-server", install="apt-get install -y redis-server")
    port = _free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis
    r = redis.Redis(host="127.0.0.1", port=port)
    for _ in range(100):
        try:
            r.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("redis-server did not answer")
    yield {"host": "127.0.0.1", "port": port, "prefix": f"t{os.getpid()}"}
    proc.terminate()
    proc.wait(10)


# ---- unit: signatures and config --------------------------------------------------------------

def test_signatures_equal_datasketch_update_batch(shared_data):
    from datasketch import MinHash
    docs = load_docs(shared_data, min_words=3, per_file=30)
    texts = [d["text"] for d in docs] + ["", "two words", "¿Qué tal?  Olá, mundo!"]
    h = MinHasher(NGRAM, 128, seed=3, chunk=512)   # small chunks: long documents take the split path
    hashes, offsets = h.shingle_hashes(pa.array(texts))
    sigs = h.signatures(hashes, offsets)
    for i, text in enumerate(texts):
        mine = hashes[offsets[i]:offsets[i + 1]]
        # one hash per distinct word 5-gram (a 32-bit collision in one document would be a bug here)
        assert len(np.unique(mine)) == len(shingle_set(text)), text[:80]
        ref = MinHash(num_perm=128, seed=3, hashfunc=lambda x: x)
        ref.update_batch([int(x) for x in mine])
        assert np.array_equal(ref.hashvalues, sigs[i]), f"doc {i}"
    # the same 5-gram hashes the same in any document
    a, _ = h.shingle_hashes(pa.array(["alpha beta gamma delta epsilon"]))
    b, _ = h.shingle_hashes(pa.array(["zeta alpha Beta, gamma delta epsilon!"]))
    assert a[0] == b[1] and a[0] != b[0]
    # quipu's words are the reference definition's (plain Python, above) on real en/es/pt text
    for text in texts:
        assert words(text) == reference_words(text), text[:80]


def test_signatures_estimate_the_reference_jaccard(shared_data):
    """Against references quipu does not use: the true Jaccard of the reference tokenizer's 5-gram
    sets, and datasketch's own MinHash (its SHA-1 hashing of the shingle strings). On copies with
    edited words, upper case and punctuation, quipu's estimate is as close to the truth as datasketch's."""
    from datasketch import MinHash
    rng = random.Random(11)
    docs = load_docs(shared_data, min_words=60, per_file=15)
    vocab = [w for d in docs for w in d["text"].split()]
    pairs = []
    for i, d in enumerate(docs):
        copy = perturb(d["text"], rng.uniform(0.01, 0.25), rng, vocab)
        copy = [copy.upper(), copy.replace(" ", ", "), "¡" + copy + "!"][i % 3]
        pairs.append((d["text"], copy))
    h = MinHasher(NGRAM, 128, seed=1)
    sigs = h.signatures(*h.shingle_hashes(pa.array([t for p in pairs for t in p])))
    err_quipu, err_ds = [], []
    for k, (a, b) in enumerate(pairs):
        sa, sb = shingle_set(a), shingle_set(b)
        truth = jaccard(sa, sb)
        ma, mb = MinHash(num_perm=128, seed=1), MinHash(num_perm=128, seed=1)
        ma.update_batch(["\x1f".join(s).encode() for s in sa])
        mb.update_batch(["\x1f".join(s).encode() for s in sb])
        err_ds.append(abs(ma.jaccard(mb) - truth))
        err_quipu.append(abs(float(np.mean(sigs[2 * k] == sigs[2 * k + 1])) - truth))
    assert len(pairs) >= 60 and max(err_quipu) < 0.25
    assert np.mean(err_quipu) < 0.05 and np.mean(err_quipu) < np.mean(err_ds) + 0.02, (np.mean(err_quipu), np.mean(err_ds))


def test_config_presets_and_errors():
    from quipu.flows.config import ConfigError, load_config
    from quipu.flows.curate import CurateConfig
    c = DedupConfig(preset="fineweb")
    assert (c.num_perm, *c.lsh_params()) == (112, 14, 8)
    assert DedupConfig(bands=16).lsh_params() == (16, 8)
    assert DedupConfig().lsh_params() == (18, 7)          # datasketch's optimum for lsh_threshold 0.6
    with pytest.raises(ConfigError, match="dedup.bands x dedup.rows"):
        load_config(CurateConfig, data={"dedup": {"bands": 20, "rows": 8}})
    with pytest.raises(ConfigError, match="dedup.lsh_threshold"):
        load_config(CurateConfig, data={"dedup": {"lsh_threshold": 0.9}})
    with pytest.raises(ConfigError, match="dedup.polcy: unknown key"):
        load_config(CurateConfig, data={"dedup": {"polcy": "quality"}})
    with pytest.raises(ConfigError, match="dataset: .*not a safe name"):   # names become folder names (issue 13)
        load_config(CurateConfig, data={"dataset": "cc/2026"})
    cfg = load_config(CurateConfig, data={"dataset": "cc-2026"})
    assert index_name(cfg.dedup, cfg.context()) == "cc-2026"
    own_cfg = load_config(CurateConfig, data={"output": "runs/cc-a"})
    own = index_name(own_cfg.dedup, own_cfg.context())
    assert own.startswith("cc-a-") and own != index_name(DedupConfig(), RunContext(str(Path("elsewhere/cc-a").resolve())))
    assert index_name(load_config(CurateConfig, data={"dedup": {"index": "main"}}).dedup, None) == "main"


# ---- ground truth -----------------------------------------------------------------------------

@pytest.mark.slow
def test_recall_and_precision_against_true_jaccard(shared_data, tmp_path):
    rng = random.Random(42)
    docs = load_docs(shared_data)
    rng.shuffle(docs)
    vocab = [w for d in docs[:200] for w in d["text"].split()]
    originals, unrelated = docs[:300], docs[300:1000]
    rows = [dict(d) for d in originals + unrelated]
    for i, d in enumerate(originals):
        for c in range(2 if i % 5 == 0 else 1):
            rows.append({"id": f"{d['id']}#copy{c}", "text": perturb(d["text"], rng.uniform(0.005, 0.06), rng, vocab)})
    rng.shuffle(rows)
    shards = write_shards(rows, tmp_path / "in", 4)
    cfg = cfg_for(tmp_path, "none", "gt")
    results, report = dedup_local(shards, str(tmp_path / "run"), cfg)

    truth = true_pairs(rows, 0.7)
    pos = {p for p, j in truth.items() if j >= 0.8}
    # the copies spread the true Jaccard on both sides of 0.8 (so the test can fail both ways)
    assert sum(1 for j in truth.values() if j < 0.8) >= 50 and len(pos) >= 100

    removed = {r["id"]: r for r in removed_rows(tmp_path / "run")}
    caught = sum(1 for a, b in pos if a in removed or b in removed)
    recall = caught / len(pos)
    sets = dict(zip([r["id"] for r in rows], shingle_sets([r["text"] for r in rows])))
    good = sum(1 for r in removed.values() if jaccard(sets[r["id"]], sets[r["dup_of"]]) >= 0.8)
    precision = good / len(removed)
    print(f"true pairs >= 0.8: {len(pos)}, recall {recall:.4f}, removed {len(removed)}, precision {precision:.4f}")
    assert recall >= 0.95 and precision >= 0.95
    # every removed row names a kept twin and its cluster
    kept = set(kept_ids(tmp_path / "run"))
    assert all(r["dup_of"] in kept and r["cluster_id"] for r in removed.values())
    assert len(kept) + len(removed) == len(rows)
    rep = report["stats"]["dedup"]
    assert rep["near_dup"] + rep["exact_dup"] == len(removed) and len(rep["examples"]) == 3
    assert sum(n * (int(k) - 1) for k, n in rep["cluster_size_histogram"].items()) == len(removed)


# ---- incremental, backends, kill ---------------------------------------------------------------

@pytest.fixture(scope="module")
def ab_rows(shared_data):
    rng = random.Random(7)
    docs = load_docs(shared_data, per_file=100)
    rng.shuffle(docs)
    vocab = [w for d in docs[:100] for w in d["text"].split()]
    a = [dict(d) for d in docs[:200]]
    a += [{"id": f"a-copy/{d['id']}", "text": perturb(d["text"], rng.uniform(0.005, 0.03), rng, vocab)} for d in docs[:40]]
    new = docs[200:320]
    b = [{"id": f"b-same/{d['id']}", "text": d["text"]} for d in docs[60:120]]                  # A's documents again
    b += [{"id": f"b-copy/{d['id']}", "text": perturb(d["text"], rng.uniform(0.005, 0.03), rng, vocab)} for d in docs[120:170]]
    b += [dict(d) for d in new]
    b += [{"id": f"b-newcopy/{d['id']}", "text": perturb(d["text"], rng.uniform(0.005, 0.03), rng, vocab)} for d in new[:30]]
    rng.shuffle(a)
    rng.shuffle(b)
    return a, b


@pytest.fixture(scope="module")
def single_run(ab_rows, tmp_path_factory):
    """Shards of A and B, and what one run over A+B removes from B's documents."""
    tmp = tmp_path_factory.mktemp("single")
    a, b = ab_rows
    sa = write_shards(a, tmp / "in", 2, "a")
    sb = write_shards(b, tmp / "in", 2, "b")
    dedup_local(sa + sb, str(tmp / "ab"), cfg_for(tmp, "none", "single"))
    b_ids = {r["id"] for r in b}
    return {(r["id"], r["reason"], r["dup_of"]) for r in removed_rows(tmp / "ab") if r["id"] in b_ids}, sa, sb


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["file", "redis"])
def test_two_runs_equal_one_run(tmp_path, ab_rows, single_run, backend, request):
    redis_cfg = request.getfixturevalue("redis_server") if backend == "redis" else None
    a, b = ab_rows
    single, sa, sb = single_run
    cfg = cfg_for(tmp_path, backend, f"inc-{backend}", redis_cfg)
    dedup_local(sa, str(tmp_path / "run-a"), cfg)
    _, rep_b = dedup_local(sb, str(tmp_path / "run-b"), cfg)
    got = {(r["id"], r["reason"], r["dup_of"]) for r in removed_rows(tmp_path / "run-b")}
    a_ids = {r["id"] for r in a}
    assert sum(1 for _, _, d in got if d in a_ids) >= 80       # B's copies of A's documents were found
    assert got == single
    idx = open_index(cfg, RunContext(str(tmp_path / "observer")))
    assert sorted(idx.doc_ids()) == sorted(kept_ids(tmp_path / "run-a") + kept_ids(tmp_path / "run-b"))
    assert rep_b["stats"]["dedup"]["index"]["docs_before"] == len(kept_ids(tmp_path / "run-a"))
    # a rerun into the same output replaces its own generation instead of matching itself
    dedup_local(sb, str(tmp_path / "run-b"), cfg)
    assert {(r["id"], r["reason"], r["dup_of"]) for r in removed_rows(tmp_path / "run-b")} == single
    # B's output folder rerun on other input (one shard): its new generation replaces the old one
    res, _ = dedup_local(sb[:1], str(tmp_path / "run-b"), cfg)
    b1_kept = pq.read_table(res[0].kept.path, columns=["id"]).column("id").to_pylist()
    idx = open_index(cfg, RunContext(str(tmp_path / "observer")))
    assert sorted(idx.doc_ids()) == sorted(kept_ids(tmp_path / "run-a") + b1_kept)
    # another configuration cannot silently reuse the index
    with pytest.raises(IndexMismatch, match="dedup.num_perm"):
        open_index(cfg.model_copy(update={"num_perm": 64}), RunContext(str(tmp_path / "observer")))


CRASH_SCRIPT = """
import json, sys
from quipu.tasks.dedup import DedupConfig
from quipu.tasks.pipeline import run_local
from quipu.tasks.stage import Shard
cfg = DedupConfig.model_validate(json.loads(sys.argv[1]))
run_local("dedup", cfg, [Shard(**s) for s in json.loads(sys.argv[2])], sys.argv[3])
"""


@pytest.fixture(scope="module")
def kill_reference(ab_rows, tmp_path_factory):
    """Shards of smaller A and B, and what an uninterrupted A-then-B pair of runs outputs."""
    tmp = tmp_path_factory.mktemp("kill-ref")
    a, b = ab_rows[0][:150], ab_rows[1][:150]
    sa = write_shards(a, tmp / "in", 2, "a")
    sb = write_shards(b, tmp / "in", 2, "b")
    ref_cfg = cfg_for(tmp, "file", "reference")
    dedup_local(sa, str(tmp / "ref-a"), ref_cfg)
    dedup_local(sb, str(tmp / "ref-b"), ref_cfg)
    return sa, sb, kept_ids(tmp / "ref-b"), removed_rows(tmp / "ref-b")


@pytest.mark.slow
@pytest.mark.parametrize("backend,point", [("file", "split"), ("file", "commit"), ("redis", "commit")])
def test_kill_during_dedup_then_rerun(tmp_path, kill_reference, backend, point, request):
    redis_cfg = request.getfixturevalue("redis_server") if backend == "redis" else None
    sa, sb, ref_kept, ref_removed = kill_reference
    cfg = cfg_for(tmp_path, backend, f"kill-{backend}-{point}", redis_cfg)
    dedup_local(sa, str(tmp_path / "run-a"), cfg)
    a_kept = kept_ids(tmp_path / "run-a")
    proc = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, cfg.model_dump_json(),
                           json.dumps([s.model_dump() for s in sb]), str(tmp_path / "run-b")],
                          cwd=ROOT, env={**os.environ, "QUIPU_DEDUP_CRASH_AT": point}, capture_output=True, text=True)
    assert proc.returncode == 137, proc.stderr[-2000:]
    # killed before its commit: the index holds exactly what run A output
    assert sorted(open_index(cfg, RunContext(str(tmp_path / "observer"))).doc_ids()) == sorted(a_kept)

    dedup_local(sb, str(tmp_path / "run-b"), cfg)
    assert sorted(kept_ids(tmp_path / "run-b")) == sorted(ref_kept)
    assert removed_rows(tmp_path / "run-b") == ref_removed
    assert sorted(open_index(cfg, RunContext(str(tmp_path / "observer"))).doc_ids()) == sorted(a_kept + kept_ids(tmp_path / "run-b"))


def test_a_rerun_reuses_intact_signatures_and_verified_pairs(tmp_path, monkeypatch):
    """The driver keeps dedup's scans and plan partitions as done-markers: a rerun hashes nothing
    again, and one whose signature file was damaged hashes that shard alone again."""
    import quipu.tasks.dedup as dedup
    rows = [{"id": f"d{i}", "text": " ".join(f"w{(i * 7 + j * j) % 61}" for j in range(40))} for i in range(40)]
    rows.append({"id": "copy", "text": rows[3]["text"]})
    shards = write_shards(rows, tmp_path / "in", 2)
    cfg, run = cfg_for(tmp_path, "none", "reuse", partitions=3), tmp_path / "run"
    dedup_local(shards, str(run), cfg)
    first = removed_rows(run)
    assert ("copy", "exact_dup", "d3") in {(r["id"], r["reason"], r["dup_of"]) for r in first}
    markers = run / "dedup" / "_shards"
    assert len(list((markers / "scans").glob("*.json"))) == 2 and len(list((markers / "partitions").glob("*.json"))) == 3
    calls = []
    for name in ("compute_signatures", "verify_partition"):
        real = getattr(dedup, name)
        monkeypatch.setattr(dedup, name, lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a))
    dedup_local(shards, str(run), cfg)
    assert calls == []
    (run / "dedup" / "_sig" / f"{shards[0].name}.sig.npy").write_bytes(b"damaged")
    dedup_local(shards, str(run), cfg)
    assert calls == ["compute_signatures"] and removed_rows(run) == first


# ---- policy and determinism -------------------------------------------------------------------

def test_quality_policy_keeps_best_and_output_is_deterministic(shared_data, tmp_path):
    rng = random.Random(3)
    docs = load_docs(shared_data, per_file=20)[:60]
    vocab = [w for d in docs for w in d["text"].split()]
    rows = []
    for d in docs[:20]:
        rows.append({"id": d["id"], "text": d["text"], "q": 0.1})
        rows.append({"id": d["id"] + "#better", "text": perturb(d["text"], 0.01, rng, vocab), "q": 0.9})
    rows += [{"id": d["id"], "text": d["text"], "q": 0.5} for d in docs[20:]]
    shards = write_shards(rows, tmp_path / "in", 2)
    cfg = cfg_for(tmp_path, "none", "q", policy="quality")
    dedup_local(shards, str(tmp_path / "r1"), cfg)
    removed = {r["id"]: r for r in removed_rows(tmp_path / "r1")}
    assert {d["id"] for d in docs[:20]} <= set(removed)
    assert all(removed[d["id"]]["dup_of"] == d["id"] + "#better" for d in docs[:20])
    dedup_local(shards, str(tmp_path / "r2"), cfg)
    for sub in ("kept", "removed"):
        for f in sorted((tmp_path / "r1" / "dedup" / sub).glob("*.parquet")):
            assert f.read_bytes() == (tmp_path / "r2" / "dedup" / sub / f.name).read_bytes()


# ---- the partitioned plan --------------------------------------------------------------------

def test_partitions_and_cap_do_not_change_decisions_and_dup_count_sums(shared_data, tmp_path):
    """However the hash space is split, the same documents are removed for the same twins; every
    kept row carries the size of its cluster."""
    rng = random.Random(11)
    docs = load_docs(shared_data, per_file=30)
    vocab = [w for d in docs for w in d["text"].split()]
    rows = [dict(d) for d in docs]
    rows += [{"id": f"{d['id']}#n{c}", "text": perturb(d["text"], 0.01, rng, vocab)} for d in docs[:40] for c in range(3)]
    rows += [{"id": f"{d['id']}#x{c}", "text": d["text"]} for d in docs[40:50] for c in range(4)]
    rng.shuffle(rows)
    shards = write_shards(rows, tmp_path / "in", 3)
    outputs = []
    for i, kw in enumerate([{"partitions": 1}, {"partitions": 7}, {"partition_rows": 1000}]):
        _, report = dedup_local(shards, str(tmp_path / f"r{i}"), cfg_for(tmp_path, "none", f"p{i}", **kw))
        outputs.append([f.read_bytes() for sub in ("kept", "removed")
                        for f in sorted((tmp_path / f"r{i}" / "dedup" / sub).glob("*.parquet"))])
        parts = report["stats"]["dedup"]["plan_partitions"]
        assert parts == kw["partitions"] if "partitions" in kw else parts >= 5    # 18 bands x ~390 docs / 1000
    assert outputs[0] == outputs[1] == outputs[2]
    kept = pq.read_table(tmp_path / "r0" / "dedup" / "kept", columns=["id", "dup_count"]).to_pylist()
    removed = removed_rows(tmp_path / "r0")
    assert len(kept) + len(removed) == len(rows) and len(removed) >= 140
    assert sum(k["dup_count"] - 1 for k in kept) == len(removed)
    size = {k["id"]: k["dup_count"] for k in kept}
    for d in docs[40:50]:   # the original and its four exact copies: one kept, counting five
        group = [d["id"]] + [f"{d['id']}#x{c}" for c in range(4)]
        assert sorted(size.get(i, 0) for i in group) == [0, 0, 0, 0, 5]
    # a bucket cap of 1 (each document compared with the earliest other of a bucket only) still
    # finds nearly all of these copies, which all resemble their original, and nothing else
    _, report = dedup_local(shards, str(tmp_path / "cap"), cfg_for(tmp_path, "none", "cap", bucket_cap=1))
    assert report["stats"]["dedup"]["partition_stats"]["buckets_over_cap"] > 0
    capped, full = {r["id"] for r in removed_rows(tmp_path / "cap")}, {r["id"] for r in removed}
    assert capped <= full and len(capped) >= 0.95 * len(full)


def test_finds_every_pair_datasketch_lsh_finds(shared_data, tmp_path):
    """datasketch's MinHashLSH with the same bands is the reference for candidates: every pair it
    returns whose exact Jaccard reaches the threshold has a member removed as a duplicate."""
    from datasketch import LeanMinHash, MinHashLSH
    rng = random.Random(13)
    docs = load_docs(shared_data, per_file=60)
    vocab = [w for d in docs for w in d["text"].split()]
    rows = [dict(d) for d in docs]
    rows += [{"id": f"{d['id']}#n", "text": perturb(d["text"], rng.uniform(0.002, 0.04), rng, vocab)} for d in docs[:150]]
    rng.shuffle(rows)
    cfg = cfg_for(tmp_path, "none", "ds")
    dedup_local(write_shards(rows, tmp_path / "in", 2), str(tmp_path / "run"), cfg)
    h = MinHasher(cfg.ngram, cfg.num_perm, cfg.seed)
    sigs = h.signatures(*h.shingle_hashes(pa.array([r["text"] for r in rows])))
    lsh = MinHashLSH(num_perm=cfg.num_perm, params=cfg.lsh_params())
    for i, s in enumerate(sigs):
        lsh.insert(i, LeanMinHash(seed=cfg.seed, hashvalues=s, scheme="affine32"))
    sets = shingle_sets([r["text"] for r in rows])
    pairs = {(min(i, j), max(i, j)) for i, s in enumerate(sigs)
             for j in lsh.query(LeanMinHash(seed=cfg.seed, hashvalues=s, scheme="affine32")) if i != j}
    similar = [(i, j) for i, j in pairs if jaccard(sets[i], sets[j]) >= cfg.threshold]
    removed = {r["id"] for r in removed_rows(tmp_path / "run")}
    assert len(similar) >= 100
    assert all(rows[i]["id"] in removed or rows[j]["id"] in removed for i, j in similar)


# ---- inside the curate flow -------------------------------------------------------------------

@pytest.mark.slow
def test_curate_flow_runs_dedup_stage(shared_data, tmp_path, prefect_server):
    from quipu.tasks.pipeline import STAGES
    rng = random.Random(5)
    docs = load_docs(shared_data, per_file=40)
    vocab = [w for d in docs for w in d["text"].split()]
    rows = [{"id": d["id"], "text": d["text"]} for d in docs]
    rows += [{"id": d["id"] + "#c", "text": perturb(d["text"], 0.01, rng, vocab)} for d in docs[:50]]
    rows += [{"id": d["id"] + "#x", "text": d["text"]} for d in docs[50:60]]
    inp = tmp_path / "docs.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    off = [f"--set={s.name}.enabled=false" for s in STAGES if s.name != "dedup"]
    args = ["curate", str(ROOT / "configs" / "curate" / "demo.yaml"), "--input", str(inp),
            "--output", str(tmp_path / "out"), f"--set=dedup.index_dir={tmp_path / 'idx'}", *off]
    assert quipu_main(*args) == 0       # the flow, not the command line, is the subject: in process
    report = json.loads((tmp_path / "out" / "dedup" / "report.json").read_text())
    assert report["removed_by_reason"].get("near_dup", 0) >= 45 and report["removed_by_reason"].get("exact_dup", 0) >= 10
    d = report["stats"]["dedup"]
    assert d["index"]["disk_bytes"] > 0 and d["largest_partition_bytes"] > 0 and len(d["examples"]) == 3
    assert d["plan_partitions"] >= 2
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert [s["name"] for s in run["stages"]][-1] == "dedup"
    assert run["curated"]["rows"] == report["kept_docs"]
    assert quipu_main(*args) == 0       # the rerun finds everything done and the index unchanged
    report2 = json.loads((tmp_path / "out" / "dedup" / "report.json").read_text())
    assert all(s["skipped"] for s in report2["shards"]) and report2["kept_docs"] == report["kept_docs"]
