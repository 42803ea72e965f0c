"""Readers and extraction on bad input: every record read is kept, removed with a reason, or
quarantined with a reason, and the counts add up. Real bad files from ../shared/data/web/bad plus
bad inputs made here (truncated gzip/zstd/WARC, invalid UTF-8, binary junk, a 50 MB document,
malformed lines, a parquet file without `text`, an empty file, a whitespace-only document).
"""
from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from quipu.tasks.extract import ExtractConfig, extract_file
from quipu.tasks.reading import ReadStats, expand_inputs, read
from quipu.tasks.reading.records import RawRecord, stable_id

from tests.conftest import quipu_main

# What each file in ../shared/data/web/bad must give: its quarantine reasons (by head) and removal
# reasons; `docs` = documents that survive extraction (files whose damage spares them).
SHARED_BAD = {
    "PROVENANCE.md": {"quarantine": {"unsupported file type"}},
    "resiliparse__clipped.warc.gz": {"quarantine": {"record truncated"}},
    "resiliparse__warcfile.warc.lz4": {"quarantine": {"unsupported file type"}},
    "ukwa__truncated_datetime.warc": {"docs": 2},           # only the WARC-Date is odd: the pages are fine
    # damaged ranges are quarantined and reading resumes at the next record header after each
    "wac__IAH-20080430204825-00000-blackbook-truncated.arc": {"quarantine": {"the record at offset 0 ran into the next record"}, "docs": 3},
    "wac__cz-pagesinczech.arc.gz": {"quarantine": {"unreadable bytes 0-767"}, "docs": 2},
    "wac__link-extraction-test.warc": {"quarantine": {"the record at offset 2807 ran into the next record",
                                                      "unreadable bytes 10562-end: AttributeError"}, "docs": 5},
    "warcio__bad.arc": {"quarantine": {"HTTP response without a parseable status line and headers"},
                        "removed": {"extract:not_html:unknown"}},
    # one gzip stream over all records (`gzip file.warc`): read decompressed, nothing lost
    "warcio__example-bad-non-chunked.warc.gz": {"docs": 1, "skipped": {"warcinfo": 2, "request": 2, "revisit": 1}},
    "warcio__example-bad.warc.gz.bad": {"quarantine": {"unsupported file type"}},
    "warcio__example-digest.warc": {"skipped": {"request": 4}},  # request records only: no document in it
    "warcio__example-trunc.warc": {"quarantine": {"block digest mismatch (record corrupt or cut short)"}},
    "warcio__example-wrong-chunks.warc.gz": {"quarantine": {"record truncated"}},
}


def doc(i: int, text: str, **extra) -> bytes:
    return json.dumps({"id": f"doc-{i}", "text": text, **extra}).encode() + b"\n"


GOOD_TEXT = ("The river rose slowly through the night, and by morning the old bridge was under water. "
             "Families in the lower town carried what they could to the church on the hill. ")


def make_bad_inputs(root: Path, shared: Path | None = None, big_mb: int = 50) -> dict[str, dict]:
    """Write bad inputs under `root`; returns what each must give (quarantine/removed reasons)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    expect: dict[str, dict] = {}

    lines = b"".join(doc(i, GOOD_TEXT * 3) for i in range(400))
    (root / "truncated.jsonl.gz").write_bytes(gzip.compress(lines)[: len(gzip.compress(lines)) // 2])
    expect["truncated.jsonl.gz"] = {"quarantine": {"unreadable bytes: file truncated inside the gzip member"}, "min_docs": 1}

    (root / "mixed.jsonl").write_bytes(
        doc(1, GOOD_TEXT * 4)
        + b'{"id": "bad-utf8", "text": "caf\xe9 \xff\xfe broken"}\n'          # invalid UTF-8
        + b'{"id": "cut", "text": "no closing quote}\n'                        # malformed JSON
        + b'["a", "list"]\n'                                                   # not an object
        + doc(2, "   \n\t  ")                                                  # whitespace only
        + json.dumps({"id": "no-text", "body": "text under another key"}).encode() + b"\n"
        + json.dumps({"id": "num-text", "text": 42}).encode() + b"\n"
        + doc(3, "".join(chr(rng.randrange(0, 32)) for _ in range(2000)))     # binary junk as text
        + b"\n  \n"                                                            # blank lines: not records
        + doc(4, GOOD_TEXT * 4, url="https://example.org/a", extra_field={"k": 1}))
    expect["mixed.jsonl"] = {"quarantine": {"invalid UTF-8: bad byte at position 31 of the line", "malformed JSON",
                                            "JSON line is a list, expected an object", "missing field 'text'",
                                            "field 'text' is a int, expected a string"},
                             "removed": {"extract:empty", "extract:binary_junk"}, "docs": 2}

    (root / "junk.jsonl").write_bytes(bytes(rng.randrange(256) for _ in range(20_000)))
    expect["junk.jsonl"] = {"quarantine_any": True, "docs": 0}

    (root / "junk.jsonl.zst").write_bytes(b"\x00not zstd" * 500)
    expect["junk.jsonl.zst"] = {"quarantine": {"unreadable bytes: bytes that are not zstd data"}}

    (root / "junk.warc.gz").write_bytes(bytes(rng.randrange(256) for _ in range(5_000)))
    expect["junk.warc.gz"] = {"quarantine": {"not a readable WARC/ARC file"}}

    (root / "empty.jsonl").write_bytes(b"")
    expect["empty.jsonl"] = {"quarantine": {"empty file (0 bytes)"}}

    big = "word " * (big_mb * 200_000)           # one document of `big_mb` MB on a single line
    (root / "big.jsonl").write_bytes(doc(0, big) + doc(1, GOOD_TEXT * 4))
    expect["big.jsonl"] = {"removed": {"extract:too_large"}, "docs": 1}

    pq.write_table(pa.table({"id": ["p1", "p2"], "body": ["no text column", "here"]}), root / "no_text.parquet")
    expect["no_text.parquet"] = {"quarantine": {"parquet has no column 'text' (columns"}}

    (root / "junk.parquet").write_bytes(b"PAR1" + bytes(rng.randrange(256) for _ in range(3000)))
    expect["junk.parquet"] = {"quarantine": {"not a parquet file"}}   # the footer check reads 8 bytes, not pyarrow

    varied = b"".join(doc(i, GOOD_TEXT + " ".join(str(rng.random()) for _ in range(100))) for i in range(600))
    comp = zstandard.ZstdCompressor().compress(varied)
    (root / "truncated.jsonl.zst").write_bytes(comp[: len(comp) * 2 // 3])
    expect["truncated.jsonl.zst"] = {"quarantine_any": True, "min_docs": 1}

    if shared is not None:
        warc = (shared / "web" / "dolma__sample-0000.warc.gz").read_bytes()
        (root / "truncated.warc.gz").write_bytes(warc[: len(warc) // 2])
        expect["truncated.warc.gz"] = {"quarantine_any": True, "min_docs": 1}
    return expect


def _quarantine_heads(out: Path, key_prefix: str) -> set[str]:
    reasons: set[str] = set()
    for p in (out / "quarantine").glob(f"{key_prefix}*.parquet"):
        reasons |= set(pq.read_table(p).column("reason").to_pylist())
    return reasons


def _check_file(result: dict, expect: dict, out: Path) -> None:
    name = Path(result["source"]).name
    assert result["records_read"] == result["input_docs"] + result["quarantined"], name
    assert result["input_docs"] == result["kept_docs"] + result["removed_docs"], name
    qreasons = set(pq.read_table(result["quarantine"]["path"]).column("reason").to_pylist()) if result["quarantine"] else set()
    for want in expect.get("quarantine", ()):
        assert any(r.startswith(want) for r in qreasons), f"{name}: no quarantine reason {want!r} in {qreasons}"
    if expect.get("quarantine_any"):
        assert result["quarantined"] > 0, name
    for want in expect.get("removed", ()):
        assert want in result["removed_by_reason"], f"{name}: {want} not in {result['removed_by_reason']}"
    if "docs" in expect:
        assert result["kept_docs"] == expect["docs"], f"{name}: kept {result['kept_docs']}"
    if "min_docs" in expect:
        assert result["kept_docs"] >= expect["min_docs"], name
    if "skipped" in expect:
        assert result["skipped_records"] == expect["skipped"], name
    # every record that was not kept has a reason on disk
    removed = pq.read_table(result["removed"]["path"])
    assert removed.num_rows == result["removed_docs"]
    assert all(removed.column("reason").to_pylist())
    assert all(qreasons) if result["quarantine"] else True


def test_shared_bad_files_end_in_quarantine_or_removed(shared_data, tmp_path):
    files = expand_inputs([str(shared_data / "web" / "bad" / "*")])
    assert {Path(f).name for f in files} == set(SHARED_BAD), "../shared/data/web/bad changed: update SHARED_BAD"
    for f in files:
        result = extract_file(f, tmp_path, ExtractConfig()).model_dump()
        _check_file(result, SHARED_BAD[Path(f).name], tmp_path)


def test_generated_bad_inputs(tmp_path, shared_data):
    inputs = tmp_path / "in"
    expect = make_bad_inputs(inputs, shared_data, big_mb=8)
    for f in expand_inputs([str(inputs / "*")]):
        result = extract_file(f, tmp_path / "out", ExtractConfig()).model_dump()
        _check_file(result, expect[Path(f).name], tmp_path / "out")


def test_jsonl_fields_zstd_and_parquet_metadata(tmp_path):
    lines = doc(1, GOOD_TEXT, url="https://a.example/1", date="2024-01-02", tag="x") + \
        json.dumps({"text": GOOD_TEXT + " two"}).encode() + b"\n"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    pq.write_table(pa.table({"id": [10, 11], "url": ["https://p/1", None], "text": [GOOD_TEXT, GOOD_TEXT + "!"],
                             "score": [0.5, 0.7]}), tmp_path / "in" / "b.parquet")
    out = tmp_path / "out"
    r = extract_file(str(tmp_path / "in" / "a.jsonl.zst"), out, ExtractConfig()).model_dump()
    rows = pq.read_table(r["kept_shards"][0]["path"]).to_pylist()
    assert [x["id"] for x in rows][0] == "doc-1"
    assert rows[0]["url"] == "https://a.example/1" and rows[0]["date"] == "2024-01-02"
    assert json.loads(rows[0]["metadata"]) == {"tag": "x"}
    assert len(rows[1]["id"]) == 20  # derived stable id
    r2 = extract_file(str(tmp_path / "in" / "a.jsonl.zst"), tmp_path / "out2", ExtractConfig()).model_dump()
    assert pq.read_table(r2["kept_shards"][0]["path"]).column("id").to_pylist()[1] == rows[1]["id"]

    r = extract_file(str(tmp_path / "in" / "b.parquet"), out, ExtractConfig()).model_dump()
    rows = pq.read_table(r["kept_shards"][0]["path"]).to_pylist()
    assert [x["id"] for x in rows] == ["10", "11"]
    assert [x["url"] for x in rows] == ["https://p/1", None]
    assert json.loads(rows[1]["metadata"]) == {"score": 0.7}


def test_fsspec_urls(tmp_path):
    fs = fsspec.filesystem("memory")
    fs.pipe("/quipu-test/docs/a.jsonl", doc(1, GOOD_TEXT) + doc(2, GOOD_TEXT + " more"))
    fs.pipe("/quipu-test/docs/b.jsonl.gz", gzip.compress(doc(3, GOOD_TEXT)))
    files = expand_inputs(["memory://quipu-test/docs/*.jsonl*"])
    assert files == ["memory:///quipu-test/docs/a.jsonl", "memory:///quipu-test/docs/b.jsonl.gz"]
    ids = []
    for f in files:
        r = extract_file(f, tmp_path, ExtractConfig()).model_dump()
        ids += pq.read_table(r["kept_shards"][0]["path"]).column("id").to_pylist()
    assert ids == ["doc-1", "doc-2", "doc-3"]
    # a rerun recognises unchanged remote inputs
    assert extract_file(files[0], tmp_path, ExtractConfig()).model_dump()["skipped"]

    local = tmp_path / "local.jsonl"
    local.write_bytes(doc(9, GOOD_TEXT))
    assert expand_inputs([f"file://{local}"]) == [str(local)]
    with pytest.raises(FileNotFoundError, match="input not found: .*nothing-here"):
        expand_inputs([str(tmp_path / "nothing-here" / "*.jsonl")])


def test_warc_record_ids_and_skips(shared_data):
    stats = ReadStats()
    items = list(read(str(shared_data / "web" / "pywb__example.warc.gz"), stats))
    assert [type(i).__name__ for i in items] == ["RawRecord", "RawRecord"]
    assert all(len(i.id) == 36 for i in items)           # the WARC-Record-ID's UUID
    assert items[0].url.startswith("http") and items[0].date
    assert stats.skipped == {"warcinfo": 1, "request": 2, "revisit": 1}


@pytest.mark.parametrize("name", ["pywb__example.arc.gz", "ukwa__IAH-20080430204825-00000-blackbook-truncated.arc.gz",
                                  "warcio__example-space-in-url.arc"])
def test_arc_record_ids_are_the_same_on_every_read(shared_data, name):
    """ARC records carry no id (warcio makes up a random WARC-Record-ID for each): they are named by
    file and offset, so a rerun writes the same ids."""
    def ids():
        return [(i.id, i.offset if isinstance(i, RawRecord) else i.record)     # a quarantined record has an id too
                for i in read(str(shared_data / "web" / name), ReadStats())]
    first = ids()
    assert first and first == ids()
    assert all(rid == stable_id(name, offset) for rid, offset in first)


@pytest.mark.slow
def test_cli_run_on_bad_inputs(shared_data, tmp_path):
    """The whole flow on every bad input at once (incl. a 50 MB single-line document): exit 0,
    counts add up, and each bad thing is in quarantine or removed with its reason."""
    inputs = tmp_path / "in"
    expect = make_bad_inputs(inputs, shared_data, big_mb=50)
    out = tmp_path / "curate-bad-inputs"   # its own name: the dedup index is named after the run directory
    assert quipu_main("curate", "configs/curate/demo.yaml", "--input", str(inputs / "*"),
                      "--input", str(shared_data / "web" / "bad" / "*"), "--output", str(out)) == 0
    run = json.loads((out / "run.json").read_text())
    stages = run["stages"]
    assert [s["name"] for s in stages][:5] == ["extract", "urls", "langid", "lines", "heuristics"]
    assert run["records_read"] == stages[0]["input_docs"] + run["quarantined"]
    for prev, s in zip(stages, stages[1:]):
        assert s["input_docs"] == prev["kept_docs"], s["name"]
    for s in stages:
        assert s["input_docs"] == s["kept_docs"] + s["removed_docs"], s["name"]
        assert sum(s["removed_by_reason"].values()) == s["removed_docs"], s["name"]
    assert run["curated"]["rows"] == stages[-1]["kept_docs"]
    extract = json.loads((out / "extract" / "report.json").read_text())
    by_file = {Path(f["source"]).name: f for f in extract["files"]}
    assert set(by_file) == set(expect) | set(SHARED_BAD)
    q = pq.read_table(out / "quarantine").to_pylist() if (out / "quarantine").exists() else []
    assert len(q) == run["quarantined"]
    assert all(r["reason"] for r in q)
    assert {"extract:too_large", "extract:empty", "extract:binary_junk"} <= set(stages[0]["removed_by_reason"])
    removed = pq.read_table(out / "extract" / "removed", columns=["id", "reason"]).to_pylist()
    assert {"id": "doc-0", "reason": "extract:too_large"} in removed
