"""Large input files read in parts (quipu.tasks.reading.plan_slices / FileSlice): a plain JSONL
file is cut at line boundaries and a parquet file by row groups, and reading every part gives
exactly what reading the file whole gives: the same documents with the same ids, positions and
texts in the same order, the same quarantined records, each part's account adding up."""
from __future__ import annotations

import gzip
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.tasks import reading as readers
from quipu.tasks.extract import ExtractConfig, extract_unit, pack_inputs, unit_key


def jsonl_lines(n: int, seed: int = 7) -> list[bytes]:
    """Documents of varied length, some without an id (their id comes from their line number),
    a few blank lines, malformed JSON and invalid UTF-8 (quarantined by line number)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        text = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "épsilon", "ζήτα"]) for _ in range(rng.randint(5, 400)))
        doc = {"text": f"document {i}: {text}"} | ({"id": f"d{i}"} if i % 3 else {})
        if i % 97 == 5:
            out.append(b"")
        if i % 89 == 7:
            out.append(b'{"text": "broken')
        if i % 131 == 11:
            out.append(b'{"text": "bad \xff byte"}')
        out.append(json.dumps(doc, ensure_ascii=False).encode())
    return out


def rows_of(results) -> tuple[list[dict], list[dict]]:
    kept = [r for res in results for s in res.kept_shards
            for r in pq.read_table(s.path, columns=["id", "source", "text"]).to_pylist()]
    quarantined = [r for res in results if res.quarantine
                   for r in pq.read_table(res.quarantine.path, columns=["source", "record", "reason"]).to_pylist()]
    return kept, quarantined


def test_jsonl_parts_cut_at_lines_and_read_like_the_whole_file(tmp_path):
    path = tmp_path / "big.jsonl"
    data = b"\n".join(jsonl_lines(1500)) + b"\n"
    path.write_bytes(data)
    part = len(data) // 7
    slices = readers.plan_slices(str(path), part)
    assert slices and 5 <= len(slices) <= 8
    assert slices[0].start == 0 and slices[-1].end == len(data)
    for a, b in zip(slices, slices[1:]):
        assert a.end == b.start and data[b.start - 1:b.start] == b"\n"
    for s in slices:
        assert s.before == data[:s.start].count(b"\n")        # lines before the part
        assert s.end - s.start <= 1.5 * part + 20_000
    units = pack_inputs([str(path)], part)
    assert units == [[s] for s in slices]
    assert len({unit_key(u) for u in units}) == len(units)

    whole = extract_unit([str(path)], tmp_path / "whole", ExtractConfig())
    parts = [extract_unit(u, tmp_path / "parts", ExtractConfig()) for u in units]
    assert rows_of(parts) == rows_of([whole])
    kept, quarantined = rows_of([whole])
    assert len(kept) == 1500 and len(quarantined) == 17 + 12
    assert sum(r.records_read for r in parts) == whole.records_read
    for r, s in zip(parts, slices):
        (f,) = r.files
        assert f.part == s.describe() and f.records_read == f.documents + f.quarantined
    # a rerun reuses every part; a part's hash covers only its own bytes
    again = [extract_unit(u, tmp_path / "parts", ExtractConfig()) for u in units]
    assert [r.seconds for r in again] == [r.seconds for r in parts]
    assert len({r.input_sha256 for r in parts}) == len(parts)


def test_a_line_longer_than_a_part_stays_whole(tmp_path):
    path = tmp_path / "long-line.jsonl"
    lines = [json.dumps({"id": f"s{i}", "text": "short"}).encode() for i in range(1500)]
    lines.insert(20, json.dumps({"id": "long", "text": "x" * 300_000}).encode())
    path.write_bytes(b"\n".join(lines))            # no newline at the end of the file
    units = pack_inputs([str(path)], 40_000)
    assert len(units) == 2 and units[0][0].end > 300_000    # the first part runs to the end of the long line
    parts = [extract_unit(u, tmp_path / "parts", ExtractConfig()) for u in units]
    whole = extract_unit([str(path)], tmp_path / "whole", ExtractConfig())
    assert rows_of(parts) == rows_of([whole])
    assert [r["id"] for r in rows_of(parts)[0]].count("long") == 1


def test_parquet_parts_by_row_group(tmp_path):
    path = tmp_path / "big.parquet"
    rng = random.Random(3)
    texts = [" ".join(rng.choice(["uno", "dos", "tres", "quatro"]) for _ in range(rng.randint(20, 200))) for _ in range(3000)]
    texts[1234] = None                       # quarantined by row number
    ids = [f"p{i}" if i % 4 else None for i in range(3000)]
    pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=250, compression="none")
    size = path.stat().st_size
    slices = readers.plan_slices(str(path), size // 5)
    assert slices and len(slices) >= 3
    assert slices[0].start == 0 and slices[-1].end == 12
    assert all(a.end == b.start for a, b in zip(slices, slices[1:]))
    assert [s.before for s in slices] == [250 * s.start for s in slices]
    whole = extract_unit([str(path)], tmp_path / "whole", ExtractConfig())
    parts = [extract_unit(u, tmp_path / "parts", ExtractConfig()) for u in pack_inputs([str(path)], size // 5)]
    assert len(parts) == len(slices)
    assert rows_of(parts) == rows_of([whole])
    kept, quarantined = rows_of(parts)
    assert len(kept) == 2999 and [q["record"] for q in quarantined] == ["row 1234"]


@pytest.mark.parametrize("name", ["big.jsonl.gz", "small.jsonl"])
def test_compressed_and_small_files_are_read_whole(tmp_path, name):
    data = b"\n".join(jsonl_lines(400)) + b"\n"
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data[:5000])
    part = 1000 if name.endswith(".gz") else 3000    # a .gz of many parts' size; a file under twice a part
    assert readers.plan_slices(str(path), part) is None
    assert pack_inputs([str(path)], part) == [[str(path)]]


@pytest.mark.slow
def test_curate_reads_a_large_file_in_parts_to_the_same_result(shared_data, tmp_path, prefect_server):
    """The curate flow on one JSONL file read whole and read in parts (a tiny pack_mb): the same
    curated documents in the same order, and every part accounted for in the extract report."""
    from quipu.flows.config import load_config
    from quipu.flows.curate import CurateConfig, curate
    from tests.conftest import ROOT
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "all.jsonl", "w", encoding="utf-8") as out:
        for name in ("en_nltk_abc_news.jsonl", "es_nltk_conll2002_efe_news.jsonl", "pt_fakebr_news.jsonl"):
            with open(shared_data / "text" / name, encoding="utf-8") as fh:
                lines = [line for _, line in zip(range(60), fh)]
            out.writelines(lines + lines[:5])            # exact copies across parts: dedup must see them
    size = (src / "all.jsonl").stat().st_size

    def curate_into(out, pack_mb: float) -> dict:
        cfg = load_config(CurateConfig, ROOT / "configs/curate/demo.yaml",
                          [f"input=[{src}/all.jsonl]", f"output={out}", f"extract.pack_mb={pack_mb}",
                           f"dedup.index_dir={out}-idx", f"lines.index_dir={out}-lines"])
        return curate(cfg)

    whole = curate_into(tmp_path / "whole", 64)
    parts = curate_into(tmp_path / "parts", size / 6 / 1e6)
    report = json.loads((tmp_path / "parts" / "extract" / "report.json").read_text())
    assert 5 <= len(report["files"]) <= 7 and all(f["part"].startswith("bytes ") for f in report["files"])
    assert sum(f["records_read"] for f in report["files"]) == whole["records_read"] == parts["records_read"]
    curated = [pq.read_table(tmp_path / name / "curated", columns=["id", "text"]) for name in ("whole", "parts")]
    assert curated[0].num_rows > 50 and curated[0].equals(curated[1])
    removed = [sorted(pq.read_table(tmp_path / name / "dedup" / "removed", columns=["id"]).column(0).to_pylist())
               for name in ("whole", "parts")]
    assert removed[0] and removed[0] == removed[1]
