"""`quipu curate` end to end through the CLI: kill and resume, determinism, loading the curated
shards with polars and HF datasets, and the acceptance run on the shared WARC + JSONL data."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, run_quipu, start_prefect_server

CONFIG = "configs/curate/demo.yaml"
TEXT_FILES = ("en_nltk_abc_news.jsonl", "es_activ_es_subtitles.jsonl", "pt_fakebr_news.jsonl",
              "nl_nltk_conll2002_news.jsonl", "en_nltk_webtext.jsonl", "es_nltk_conll2002_efe_news.jsonl")


def subset_inputs(shared: Path, dest: Path, per_file: int) -> Path:
    """The first `per_file` documents of several shared JSONL files, plus one real WARC."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in TEXT_FILES:
        with open(shared / "text" / name, encoding="utf-8") as fh:
            lines = [line for _, line in zip(range(per_file), fh)]
        (dest / name).write_text("".join(lines), encoding="utf-8")
    (dest / "example.warc.gz").write_bytes((shared / "web" / "pywb__example.warc.gz").read_bytes())
    return dest


def curated_files(out: Path) -> list[Path]:
    return sorted((out / "curated").glob("*.parquet"))


def check_run(out: Path) -> dict:
    """The invariants every finished run satisfies, read from what it wrote."""
    run = json.loads((out / "run.json").read_text())
    stages = run["stages"]
    names = [s["name"] for s in stages]
    assert names[0] == "extract" and names.index("urls") < names.index("langid") < names.index("lines") < names.index("heuristics")
    assert run["records_read"] == stages[0]["input_docs"] + run["quarantined"]
    for prev, s in zip(stages, stages[1:]):
        assert s["input_docs"] == prev["kept_docs"], s["name"]
    for s in stages:
        assert s["input_docs"] == s["kept_docs"] + s["removed_docs"], s["name"]
        assert sum(s["removed_by_reason"].values()) == s["removed_docs"], s["name"]
        report = json.loads((out / s["name"] / "report.json").read_text())
        assert report["input_docs"] == s["input_docs"] and report["kept_docs"] == s["kept_docs"]
        removed_dir = out / s["name"] / "removed"
        if removed_dir.exists() and s["removed_docs"]:
            removed = pq.read_table(removed_dir, columns=["reason"])
            assert removed.num_rows == s["removed_docs"] and all(removed.column("reason").to_pylist())
    rows = sum(pq.ParquetFile(p).metadata.num_rows for p in curated_files(out))
    assert rows == run["curated"]["rows"] == stages[-1]["kept_docs"]
    assert not list(out.rglob(".tmp-*"))
    return run


@pytest.fixture(scope="module")
def inputs(shared_data, tmp_path_factory) -> Path:
    return subset_inputs(shared_data, tmp_path_factory.mktemp("inputs"), per_file=40)


@pytest.fixture(scope="module")
def reference_run(inputs, tmp_path_factory, prefect_server) -> Path:
    # distinct run-directory names: the dedup stage's persistent index is named after it by default
    out = tmp_path_factory.mktemp("ref") / "curate-reference"
    p = run_quipu("curate", CONFIG, "--input", str(inputs / "*"), "--output", str(out), "--set", "extract.shard_mb=0.05")
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def test_curated_loads_with_polars_and_datasets(reference_run):
    import polars as pl
    run = check_run(reference_run)
    files = [str(p) for p in curated_files(reference_run)]
    df = pl.read_parquet(files)
    assert df.height == run["curated"]["rows"] > 50
    assert {"id", "text", "source", "url", "lang", "lang_score"} <= set(df.columns)
    assert set(df["lang"].unique()) <= {"en", "es", "pt"}
    assert df["id"].n_unique() == df.height
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=files, split="train",
                               cache_dir=str(reference_run.parent / "hf-cache"))
    assert ds.num_rows == df.height and ds[0]["id"] == df["id"][0]


@pytest.mark.slow
def test_kill_and_resume_gives_the_same_bytes(reference_run, inputs, tmp_path):
    """SIGKILL `quipu curate` once shard outputs exist, re-run into the same directory: the curated
    shards are byte-identical to an uninterrupted run (so also deterministic across processes), no
    partial file was ever visible under a final name, and no temporary is left."""
    out = tmp_path / "curate-killed"
    start_prefect_server()
    cmd = [sys.executable, "-m", "quipu.flows.cli", "curate", CONFIG, "--input", str(inputs / "*"), "--output", str(out),
           "--set", "extract.shard_mb=0.05"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    killed_at = None
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            done = list(out.glob("langid/_shards/*.json")) + list(out.glob("heuristics/_shards/*.json"))
            if done:
                os.killpg(proc.pid, signal.SIGKILL)       # the CLI and its extractor child, no clean-up
                killed_at = [p.relative_to(out).as_posix() for p in done]
                break
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert killed_at, "the run finished (or never got to langid) before it could be killed"
    assert not (out / "run.json").exists()
    for p in out.rglob("*.parquet"):                      # whatever has a final name is whole
        pq.read_metadata(p)

    p = run_quipu("curate", CONFIG, "--input", str(inputs / "*"), "--output", str(out), "--set", "extract.shard_mb=0.05")
    assert p.returncode == 0, p.stderr[-3000:]
    check_run(out)
    ref, got = curated_files(reference_run), curated_files(out)
    assert [f.name for f in got] == [f.name for f in ref]
    for a, b in zip(ref, got):
        assert a.read_bytes() == b.read_bytes(), f"{b.name} differs after kill + resume (killed after {killed_at})"
    extract = json.loads((out / "extract" / "report.json").read_text())
    assert any(s["skipped"] for s in extract["shards"]), "the rerun redid every extract shard"


@pytest.mark.slow
def test_acceptance_run_on_shared_web_and_text(shared_data, tmp_path, prefect_server):
    """The issue's acceptance run: every shared WARC plus the shared JSONL. The JSONL part is a
    deterministic subset (the first 250 documents of each file, 2,820 documents) so the suite stays
    within its time budget."""
    inputs = tmp_path / "text"
    inputs.mkdir()
    for f in sorted((shared_data / "text").glob("*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            (inputs / f.name).write_text("".join(line for _, line in zip(range(250), fh)), encoding="utf-8")
    out = tmp_path / "curate-acceptance"
    p = run_quipu("curate", CONFIG, "--input", str(shared_data / "web" / "*.warc*"), "--input", str(inputs / "*.jsonl"),
                  "--output", str(out), timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    run = check_run(out)
    assert run["records_read"] >= 2820 + 250   # JSONL documents + WARC records
    extract = json.loads((out / "extract" / "report.json").read_text())
    assert len(extract["files"]) == len(list((shared_data / "web").glob("*.warc*"))) + 13
    curated = pq.read_table(out / "curated", columns=["id", "lang", "source"])
    assert curated.num_rows > 800
    assert set(curated.column("lang").to_pylist()) <= {"en", "es", "pt"}
    assert any(s.endswith(".warc.gz") for s in curated.column("source").to_pylist())
    rep = run_quipu("report", str(out))
    assert rep.returncode == 0 and "extract" in rep.stdout and "heuristics" in rep.stdout
