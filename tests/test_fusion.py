"""Fused per-document stages (quipu.tasks.driver segments) and work units sized by data.

The pipeline runs fused (consecutive per-document stages in one pass per shard, only the
segment's last kept rows written) and unfused (every stage its own pass, writing its kept rows) on
real shared text: the curated bytes, every stage's removed rows and every stage's report must be
the same. A run killed in the middle of a fused pass re-runs to the same bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.tasks import driver
from quipu.tasks.driver import InProcess, StageRef, run_pipeline
from quipu.tasks.extract import ExtractConfig, extract_unit, pack_inputs
from quipu.tasks.output import OutputConfig, write_curated
from quipu.tasks.pipeline import stage_class, stage_ref
from quipu.tasks.stage import RunContext

TEXT_FILES = ("en_nltk_abc_news.jsonl", "es_nltk_conll2002_efe_news.jsonl", "pt_fakebr_news.jsonl",
              "en_nltk_webtext.jsonl", "nl_nltk_conll2002_news.jsonl")
# every kind of stage: per-document (urls, langid, heuristics, terminal_punct, decontam, pii),
# global (lines, dedup), one that edits text (pii) and one that adds a score column (terminal_punct)
PIPELINE = {"urls": {"blocklist": False}, "langid": {"languages": ["en", "es", "pt"]}, "lines": {"backend": "none", "max_line_count": 3},
            "heuristics": {}, "terminal_punct": {"enabled": True, "threshold": 0.6},
            "dedup": {"backend": "none"}, "decontam": {"benchmarks": ["humaneval"]}, "pii": {}}


@pytest.fixture(scope="module")
def extracted(shared_data, tmp_path_factory) -> tuple[Path, list]:
    """~280 real documents (with exact copies, so dedup removes some) as several extract shards."""
    src = tmp_path_factory.mktemp("src")
    for name in TEXT_FILES:
        with open(shared_data / "text" / name, encoding="utf-8") as fh:
            lines = [line for _, line in zip(range(48), fh)]
        copies = [json.dumps({**json.loads(line), "id": json.loads(line)["id"] + "#copy"}) + "\n" for line in lines[:8]]
        (src / name).write_text("".join(lines + copies), encoding="utf-8")
    run = tmp_path_factory.mktemp("extract")
    result = extract_unit(sorted(str(p) for p in src.iterdir()), run, ExtractConfig(shard_mb=0.05))
    assert len(result.kept_shards) >= 3
    return run, result.kept_shards


def refs_for(run_dir: Path, **changes) -> list[StageRef]:
    ctx = RunContext(str(run_dir.resolve()))
    return [stage_ref(name, stage_class(name).Config(**{**cfg, **changes.get(name, {})}), ctx)
            for name, cfg in PIPELINE.items()]


def run(run_dir: Path, shards, fuse: bool, keep_intermediate: bool = False, **changes):
    reports, out = run_pipeline(refs_for(run_dir, **changes), shards, InProcess(), fuse, keep_intermediate)
    curated = write_curated(out, run_dir / "curated", OutputConfig(shard_mb=0.2, batch_rows=500))
    return reports, curated


def differences(a, b, where: str = "") -> list[str]:
    """Where two reports differ, leaving out what legitimately differs between runs: times, the
    per-shard listing, and the dedup index's location and name (named after the run folder)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b))
                if "seconds" not in k and k != "shards" and not (where.endswith(".index") and k in ("name", "location"))
                for d in differences(a.get(k), b.get(k), f"{where}.{k}")]
    return [] if a == b else [f"{where}: {str(a)[:120]} != {str(b)[:120]}"]


def test_segments_start_at_global_stages(tmp_path):
    segs = driver.segments(refs_for(tmp_path))
    assert [s.names for s in segs] == [["urls", "langid"], ["lines", "heuristics", "terminal_punct"],
                                       ["dedup", "decontam", "pii"]]
    # a score filter keeping a top fraction scans first: it starts a segment
    segs = driver.segments(refs_for(tmp_path, terminal_punct={"keep": "top_fraction"}))
    assert [s.names for s in segs][1:3] == [["lines", "heuristics"], ["terminal_punct"]]
    assert all(len(s.refs) == 1 and s.keep_intermediate for s in driver.segments(refs_for(tmp_path), fuse=False))


@pytest.fixture(scope="module")
def both(extracted, tmp_path_factory) -> dict:
    """The pipeline fused and unfused over the same shards."""
    _, shards = extracted
    root = tmp_path_factory.mktemp("runs")
    out = {}
    for name, fuse in (("fused", True), ("plain", False)):
        reports, curated = run(root / name, shards, fuse=fuse)
        out[name] = {"dir": root / name, "reports": reports, "curated": curated}
    return out


def test_fused_run_gives_the_unfused_bytes(extracted, both):
    _, shards = extracted
    fused, plain = both["fused"]["curated"], both["plain"]["curated"]
    fused_reports, plain_reports = both["fused"]["reports"], both["plain"]["reports"]
    assert sum(p.rows for p in fused) > 100 and len(fused) >= 2
    assert [Path(p.path).name for p in fused] == [Path(p.path).name for p in plain]
    for a, b in zip(fused, plain):
        assert Path(a.path).read_bytes() == Path(b.path).read_bytes(), a.path
    prev = sum(s.rows for s in shards)
    for name in PIPELINE:
        assert not differences(fused_reports[name], plain_reports[name], name)
        rep = fused_reports[name]
        assert rep["input_docs"] == prev == rep["kept_docs"] + rep["removed_docs"], name
        prev = rep["kept_docs"]
        removed = [pq.read_table(both[r]["dir"] / name / "removed").sort_by("id") for r in ("fused", "plain")]
        assert removed[0].equals(removed[1]), name
        assert removed[0].num_rows == rep["removed_docs"]
        assert json.loads((both["fused"]["dir"] / name / "report.json").read_text())["kept_docs"] == rep["kept_docs"]
    # the stages removed or edited something here, so the comparison means something
    assert all(fused_reports[n]["removed_docs"] > 0 for n in ("langid", "heuristics", "terminal_punct", "dedup")), \
        {n: r["removed_docs"] for n, r in fused_reports.items()}
    assert sum(fused_reports["lines"]["stats"]["edits"].values()) > 0
    # fused, only each segment's last stage wrote kept rows; unfused, every stage did
    assert sorted(p.parent.parent.name for p in both["fused"]["dir"].glob("*/kept/*.parquet")) == \
        sorted(n for n in ("langid", "terminal_punct", "pii") for _ in fused_reports[n]["shards"])
    assert len(list(both["plain"]["dir"].glob("*/kept/*.parquet"))) == sum(len(r["shards"]) for r in plain_reports.values())


@pytest.mark.slow
def test_keep_intermediate_writes_every_stage(extracted, both, tmp_path):
    _, shards = extracted
    run(tmp_path / "keep", shards, fuse=True, keep_intermediate=True)
    for name in PIPELINE:
        a = pq.read_table(tmp_path / "keep" / name / "kept")
        b = pq.read_table(both["plain"]["dir"] / name / "kept")
        assert a.equals(b), name


def test_killed_fused_pass_reruns_to_the_same_bytes(extracted, both, tmp_path, monkeypatch):
    """A fused pass dies inside a later stage of its segment on the second shard: nothing under a
    final name is partial, and the rerun reuses the finished shard and ends with the same bytes."""
    _, shards = extracted
    reference = both["fused"]["curated"]
    heuristics = stage_class("heuristics")
    original = heuristics.process
    seen = {"batches": 0}

    def dying(self, batch, shard_plan=None):
        seen["batches"] += 1
        if seen["batches"] > 1:
            raise KeyboardInterrupt("killed")
        return original(self, batch, shard_plan)

    monkeypatch.setattr(heuristics, "process", dying)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "killed", shards, fuse=True, lines={"batch_rows": 10_000})
    monkeypatch.setattr(heuristics, "process", original)
    out = tmp_path / "killed"
    assert not list(out.rglob(".tmp-*")) and not list(out.rglob("*quipu-tmp*"))
    assert len(list((out / "heuristics" / "_shards").glob("*.json"))) == 1
    reports, again = run(out, shards, fuse=True, lines={"batch_rows": 10_000})
    assert [s["skipped"] for s in reports["urls"]["shards"]] == [True] * len(shards)
    assert sum(s["skipped"] for s in reports["heuristics"]["shards"]) == 1
    for a, b in zip(reference, again):
        assert Path(a.path).read_bytes() == Path(b.path).read_bytes()
    # a finished rerun reuses everything
    reports, _ = run(out, shards, fuse=True, lines={"batch_rows": 10_000})
    assert all(s["skipped"] for name in PIPELINE for s in reports[name]["shards"])


def test_release_work_files_keeps_results(both, tmp_path):
    import shutil
    out = tmp_path / "run"
    shutil.copytree(both["fused"]["dir"], out)
    curated = list((out / "curated").glob("*.parquet"))
    assert list(out.glob("lines/_*/**/*.*")), "lines wrote no work files"
    removed_before = sorted(p.name for p in out.glob("*/removed/*.parquet"))
    freed = driver.release_work_files(RunContext(str(out)), list(PIPELINE))
    assert freed["files"] > 0 and freed["bytes"] > 0
    assert not list(out.glob("*/kept")) and not [p for p in out.glob("*/_*") if p.is_dir() and p.name != "_shards"]
    assert not [p for p in out.glob("*/_shards/*") if p.is_dir()]
    assert sorted(p.name for p in out.glob("*/removed/*.parquet")) == removed_before
    assert curated and all(p.exists() for p in curated)
    assert all((out / name / "report.json").exists() for name in PIPELINE)


def test_pack_inputs_by_size(tmp_path):
    sizes = [10, 10, 10, 100, 5, 50, 50]
    paths = []
    for i, n in enumerate(sizes):
        p = tmp_path / f"f{i}.jsonl"
        p.write_bytes(b"x" * n)
        paths.append(str(p))
    units = pack_inputs(paths, 60)
    assert units == [paths[0:3], [paths[3]], paths[4:6], [paths[6]]]
    assert sum(map(len, units)) == len(paths)
    assert pack_inputs(paths, 1) == [[p] for p in paths]


def test_packed_unit_accounts_for_every_file(shared_data, tmp_path):
    """Many small files in one unit: the same documents as one file, and each file's own account
    (records read = documents + quarantined) exact, bad lines included."""
    lines = (shared_data / "text" / "es_nltk_conll2002_efe_news.jsonl").read_text(encoding="utf-8").splitlines()[:120]
    small = tmp_path / "small"
    small.mkdir()
    for i in range(0, 120, 4):
        bad = "{not json\n" if i % 20 == 0 else ""
        (small / f"part-{i:04d}.jsonl").write_text("\n".join(lines[i:i + 4]) + "\n" + bad, encoding="utf-8")
    files = sorted(str(p) for p in small.iterdir())
    units = pack_inputs(files, int(64e6))
    assert len(units) == 1
    r = extract_unit(units[0], tmp_path / "run", ExtractConfig())
    assert len(r.files) == 30 and r.records_read == 126 and r.quarantined == 6 and r.input_docs == 120
    for f, path in zip(r.files, files):
        assert f.source == path
        assert f.records_read == f.documents + f.quarantined == 4 + (path.endswith(("0000.jsonl", "0020.jsonl", "0040.jsonl",
                                                                                   "0060.jsonl", "0080.jsonl", "0100.jsonl")))
    q = pq.read_table(r.quarantine.path)
    assert sorted(set(q.column("source").to_pylist())) == [p for p in files if p.endswith(("0000.jsonl", "0020.jsonl", "0040.jsonl", "0060.jsonl", "0080.jsonl", "0100.jsonl"))]
    one = tmp_path / "one.jsonl"
    one.write_text("\n".join(lines) + "\n", encoding="utf-8")
    whole = extract_unit([str(one)], tmp_path / "run1", ExtractConfig())
    ids = lambda res: pa.concat_tables([pq.read_table(s.path, columns=["id", "text"]) for s in res.kept_shards])
    assert ids(r).equals(ids(whole))
    assert len(r.kept_shards) == len(whole.kept_shards) == 1


@pytest.mark.slow
def test_many_small_files_cost_what_one_file_costs(shared_data, tmp_path, prefect_server):
    """The curate flow over the same documents as 150 small files and as one file: the same number
    of files written (work units packed by size), the same curated documents, every file's records
    accounted for; the finished run keeps no intermediate copy, and a rerun reuses it whole."""
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig, curate
    from tests.conftest import ROOT
    lines = []
    for name in TEXT_FILES[:3]:
        with open(shared_data / "text" / name, encoding="utf-8") as fh:
            lines += [line for _, line in zip(range(50), fh)]
    small, one = tmp_path / "small", tmp_path / "one"
    small.mkdir(), one.mkdir()
    for i in range(0, len(lines), 1):
        (small / f"part-{i:05d}.jsonl").write_text(lines[i], encoding="utf-8")
    (one / "all.jsonl").write_text("".join(lines), encoding="utf-8")

    def curate_into(src: Path, out: Path) -> dict:
        cfg = load_config(CurateConfig, ROOT / "configs/curate/demo.yaml",
                          [f"input=[{src}/*.jsonl]", f"output={out}", f"dedup.index_dir={tmp_path / out.name}-idx",
                           f"lines.index_dir={tmp_path / out.name}-lines"])
        return curate(cfg)

    runs = {name: curate_into(src, tmp_path / f"run-{name}") for name, src in (("small", small), ("one", one))}
    written = {name: sorted(str(p.relative_to(tmp_path / f"run-{name}").parent) for p in (tmp_path / f"run-{name}").rglob("*")
                            if p.is_file()) for name in runs}
    assert len(written["small"]) == len(written["one"]) and written["small"] == written["one"]
    assert not [w for w in written["one"] if w.endswith("/kept") or "/_sig" in w or "/_counts" in w]
    ids = {name: pq.read_table(tmp_path / f"run-{name}" / "curated", columns=["id", "text"]) for name in runs}
    assert ids["small"].num_rows > 30 and ids["small"].equals(ids["one"])
    extract = json.loads((tmp_path / "run-small" / "extract" / "report.json").read_text())
    assert len(extract["files"]) == len(lines) and {f["unit"] for f in extract["files"]} == {extract["shards"][0]["name"]}
    assert all(f["records_read"] == f["documents"] == 1 for f in extract["files"])
    disk = runs["small"]["disk"]
    assert disk["bytes"]["intermediate"] == 0 and disk["bytes"]["curated"] > 0 and disk["input_bytes"] > 0
    assert json.loads((tmp_path / "run-small" / "run.json").read_text())["disk"] == disk

    again = curate_into(small, tmp_path / "run-small")
    assert again["curated"] == runs["small"]["curated"]
    report = json.loads((tmp_path / "run-small" / "dedup" / "report.json").read_text())
    assert all(s["skipped"] for s in report["shards"])
