"""`quipu curate` end to end through the CLI: kill and resume, determinism, loading the curated
shards with polars and HF datasets, and the acceptance run on the shared WARC + JSONL data."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, quipu_main, start_prefect_server

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
    # in process: the flow is the subject here (test_kill_and_resume's run is a process of its own, so
    # the byte comparison is still across processes)
    assert quipu_main("curate", CONFIG, "--input", str(inputs / "*"), "--output", str(out), "--set", "extract.shard_mb=0.05") == 0
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
    import datasets   # a dev dependency: Hugging Face readers are the subject here
    ds = datasets.load_dataset("parquet", data_files=files, split="train",
                               cache_dir=str(reference_run.parent / "hf-cache"))
    assert ds.num_rows == df.height and ds[0]["id"] == df["id"][0]
    # the folder itself, as other tools are pointed at it: nothing but parquet shards inside
    curated = reference_run / "curated"
    assert pl.read_parquet(curated).height == df.height
    by_dir = datasets.load_dataset("parquet", data_dir=str(curated), split="train",
                                   cache_dir=str(reference_run.parent / "hf-cache-dir"))
    assert by_dir.num_rows == df.height
    # every stage's removed rows as one table: one schema across stages, `stage` and `reason` on each row
    removed = pl.scan_parquet(str(reference_run / "*" / "removed" / "*.parquet")).collect()
    per_stage = {s["name"]: s["removed_docs"] for s in run["stages"] if s["removed_docs"]}
    assert removed.height == sum(per_stage.values())
    assert dict(removed.group_by("stage").len().iter_rows()) == per_stage
    assert removed["reason"].null_count() == 0
    # nested signals are Arrow lists of structs, queryable without JSON parsing
    assert df.schema["decontam_hits"] == pl.List(pl.Struct({"benchmark": pl.String, "item": pl.String, "start": pl.Int32,
                                                            "end": pl.Int32, "words": pl.Int32}))


def test_outputs_follow_the_umask_and_report_survives_a_closed_pipe(reference_run):
    import stat
    from quipu.catalog.files import UMASK
    for p in [reference_run / "run.json", *curated_files(reference_run), *(reference_run / "dedup" / "kept").glob("*")]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o666 & ~UMASK, p
    head = subprocess.run(f"{sys.executable} -m quipu.flows.cli report {reference_run} | head -1", shell=True,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert head.stdout.startswith("run ") and "Traceback" not in head.stderr and "BrokenPipe" not in head.stderr
    # a reader that never reads (the write fails with EPIPE): still no traceback
    gone = subprocess.run(f"{sys.executable} -m quipu.flows.cli report {reference_run} | true", shell=True,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in gone.stderr and "Exception ignored" not in gone.stderr, gone.stderr


def test_html_report_renders_in_chromium(reference_run, tmp_path, capsys):
    """`quipu report RUN --html`: one self-contained page, opened in headless chromium as a person
    would: it renders, its charts load (and nothing is fetched from the network), and the funnel's
    numbers are run.json's."""
    from tests.conftest import require_binary
    require_binary("chromium", "chromium-browser", install="apt-get install chromium")
    from tests.ops_helpers import Chromium
    page_path = tmp_path / "report.html"
    assert quipu_main("report", str(reference_run), "--html", str(page_path)) == 0 and page_path.is_file()
    run = json.loads((reference_run / "run.json").read_text())
    capsys.readouterr()
    assert quipu_main("report", str(reference_run), "--json") == 0
    assert json.loads(capsys.readouterr().out)["run"]["curated"] == run["curated"]
    browser = Chromium(tmp_path)
    try:
        page = browser.open(page_path.as_uri())
        page.wait_for_text(["Funnel", *[s["name"] for s in run["stages"]]], timeout=60)
        charts = page.eval("Array.from(document.querySelectorAll('img.chart')).map(i => [i.alt, i.complete && i.naturalWidth])")
        titles = [t for t, _ in charts]
        assert all(w and w > 300 for _, w in charts), charts
        assert titles[:2] == ["Funnel", "Bytes in and out"]
        assert {f"{s['name']}: removal reasons" for s in run["stages"] if s["removed_docs"]} <= set(titles)
        fetched = page.eval("performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith('data:'))")
        assert fetched == [], fetched
        cells = page.eval("Array.from(document.querySelectorAll('table.funnel tr')).slice(1)"
                          ".map(r => Array.from(r.cells).slice(0, 4).map(c => c.innerText))")
        assert cells == [[s["name"], str(s["input_docs"]), str(s["kept_docs"]), str(s["removed_docs"])] for s in run["stages"]]
        shot = page.screenshot(tmp_path / "report.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    finally:
        browser.stop()


def test_dataset_card_describes_the_run(reference_run):
    import yaml
    card = (reference_run / "README.md").read_text()
    header = yaml.safe_load(card.split("---")[1])
    run = json.loads((reference_run / "run.json").read_text())
    assert header["configs"][0]["data_files"][0]["path"] == "curated/*.parquet"
    assert set(header["language"]) <= {"en", "es", "pt"} and header["license"] == "other"
    assert f"{run['curated']['rows']:,} documents" in card and "| `decontam_hits` |" in card
    for s in run["stages"]:
        assert f"| {s['name']} | {s['input_docs']:,} | {s['kept_docs']:,} |" in card


def test_every_stage_column_has_a_meaning_in_the_card():
    """A column with no written description (a classifier dropped into tasks/classifiers/) is still
    explained by the stage that writes it; every pipeline column has a meaning."""
    from quipu.flows.dataset_card import column_doc
    from quipu.tasks.pipeline import STAGES
    assert "`news`" in column_doc("news_score") and column_doc("quality_score").startswith("probability")
    assert column_doc("no_such_column") == ""
    assert [f.name for s in STAGES for f in s.columns if not column_doc(f.name)] == []


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

    assert quipu_main("curate", CONFIG, "--input", str(inputs / "*"), "--output", str(out), "--set", "extract.shard_mb=0.05") == 0
    check_run(out)
    ref, got = curated_files(reference_run), curated_files(out)
    assert [f.name for f in got] == [f.name for f in ref]
    for a, b in zip(ref, got):
        assert a.read_bytes() == b.read_bytes(), f"{b.name} differs after kill + resume (killed after {killed_at})"
    extract = json.loads((out / "extract" / "report.json").read_text())
    assert any(s["skipped"] for s in extract["shards"]), "the rerun redid every extract shard"


@pytest.mark.slow
def test_acceptance_run_on_shared_web_and_text(shared_data, tmp_path, prefect_server, capsys):
    """The issue's acceptance run: every shared WARC plus the shared JSONL. The JSONL part is a
    deterministic subset (the first 250 documents of each file, 2,820 documents) so the suite stays
    within its time budget."""
    inputs = tmp_path / "text"
    inputs.mkdir()
    for f in sorted((shared_data / "text").glob("*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            (inputs / f.name).write_text("".join(line for _, line in zip(range(250), fh)), encoding="utf-8")
    out = tmp_path / "curate-acceptance"
    assert quipu_main("curate", CONFIG, "--input", str(shared_data / "web" / "*.warc*"), "--input", str(inputs / "*.jsonl"),
                      "--output", str(out)) == 0
    run = check_run(out)
    assert run["records_read"] >= 2820 + 250   # JSONL documents + WARC records
    extract = json.loads((out / "extract" / "report.json").read_text())
    assert len(extract["files"]) == len(list((shared_data / "web").glob("*.warc*"))) + 13
    curated = pq.read_table(out / "curated", columns=["id", "lang", "source"])
    assert curated.num_rows > 800
    assert set(curated.column("lang").to_pylist()) <= {"en", "es", "pt"}
    assert any(s.endswith(".warc.gz") for s in curated.column("source").to_pylist())
    capsys.readouterr()
    assert quipu_main("report", str(out)) == 0
    rep = capsys.readouterr().out
    assert rep.startswith("run ") and "extract" in rep and "heuristics" in rep
    check_stage_decisions(out, inputs)


STAGES = ["extract", "urls", "langid", "lines", "heuristics", "dedup", "decontam", "pii"]


def check_stage_decisions(out: Path, inputs: Path) -> None:
    """What each stage must remove and keep, by id, against labels computed here from the input
    alone: the language of each file (its name's prefix), the word count and the exact text."""
    docs = {}
    for f in sorted(inputs.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            d = json.loads(line)
            docs[d["id"]] = (f.name.split("_")[0], d["text"])
    rows = {s: pq.read_table(out / s / "removed", columns=["id", "reason"]).to_pylist()
            if (out / s / "removed").exists() else [] for s in STAGES}
    removed = {s: {r["id"]: r["reason"] for r in rows[s]} for s in STAGES}
    curated = pq.read_table(out / "curated", columns=["id"]).column("id").to_pylist()
    fates = Counter([i for s in STAGES for i in removed[s]] + curated)   # (WARC record ids repeat across files)
    assert {i: fates[i] for i in docs if fates[i] != 1} == {}, "input documents with no decision or with two"
    curated, stage_of = set(curated), {i: s for s in STAGES for i in removed[s]}

    def reached(stage: str) -> set[str]:
        before = STAGES[:STAGES.index(stage)]
        return {i for i in docs if stage_of.get(i) not in before}

    # langid removes every document of a non-target language, keeps every long one of a target one
    dutch = {i for i in reached("langid") if docs[i][0] == "nl"}
    assert len(dutch) > 200 and {i for i in dutch if stage_of.get(i) != "langid"} == set()
    assert all(removed["langid"][i].startswith("lang") for i in dutch)
    long_target = {i for i in reached("langid") if docs[i][0] in ("en", "es", "pt") and len(docs[i][1].split()) >= 200}
    assert len(long_target) > 1000 and {i for i in long_target if stage_of.get(i) == "langid"} == set()
    # heuristics removes every document far below Gopher's 50 words
    short = {i for i in reached("heuristics") if len(docs[i][1].split()) < 45}
    assert len(short) > 20 and {i for i in short if stage_of.get(i) != "heuristics"} == set()
    # of identical texts at most one is curated; the others are removed
    copies: dict[str, list[str]] = {}
    for i, (_, text) in docs.items():
        copies.setdefault(text.strip(), []).append(i)
    groups = [g for g in copies.values() if len(g) > 1]
    assert groups and all(len(set(g) & curated) <= 1 for g in groups)
