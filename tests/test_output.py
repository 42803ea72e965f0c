"""tasks/output.py as its docstring states it: curriculum order (ascending sort column within each
source, sources in first-seen order), a sort column that is not there refused by name, a rerun that
reuses its parts (and rewrites one changed on disk), and parts of an earlier, different run removed."""
from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quipu.catalog.files import sha256_file
from quipu.tasks.output import OutputConfig, write_curated
from quipu.tasks.stage import Shard


def _shard(path, rows: dict) -> Shard:
    pq.write_table(pa.table(rows), path)
    return Shard(name=path.stem, path=str(path), sha256=sha256_file(path), rows=len(rows["id"]), bytes=path.stat().st_size)


def _ids(parts: list[Shard]) -> list[str]:
    return [i for p in parts for i in pq.read_table(p.path, columns=["id"]).column("id").to_pylist()]


def test_curriculum_order_is_ascending_within_each_source_sources_as_first_seen(tmp_path):
    # source "b" is seen first (in the first shard), "a" second; a tie (b2, b4) keeps pipeline order
    one = _shard(tmp_path / "one.parquet", {"id": ["b1", "a1", "b2"], "text": ["x"] * 3, "source": ["b", "a", "b"],
                                             "score": [9.0, 1.0, 3.0]})
    two = _shard(tmp_path / "two.parquet", {"id": ["a2", "b3", "b4"], "text": ["x"] * 3, "source": ["a", "b", "b"],
                                             "score": [0.5, 0.1, 3.0]})
    parts = write_curated([one, two], tmp_path / "curated", OutputConfig(sort_by="score"))
    assert _ids(parts) == ["b3", "b2", "b4", "b1", "a2", "a1"]
    # without a sort column: pipeline order
    assert _ids(write_curated([one, two], tmp_path / "plain", OutputConfig())) == ["b1", "a1", "b2", "a2", "b3", "b4"]


def test_a_sort_column_the_data_lacks_is_refused_by_name(tmp_path):
    one = _shard(tmp_path / "one.parquet", {"id": ["a"], "text": ["x"], "source": ["s"]})
    with pytest.raises(ValueError, match=r"output.sort_by: column 'ppl_wayra' is not in the curated data \(columns: id, text, source"):
        write_curated([one], tmp_path / "curated", OutputConfig(sort_by="ppl_wayra"))
    assert not list((tmp_path / "curated").glob("part-*.parquet"))


def test_a_rerun_reuses_its_parts_and_rewrites_one_changed_on_disk(tmp_path):
    one = _shard(tmp_path / "one.parquet", {"id": [f"d{i}" for i in range(40)], "text": ["y" * 100] * 40, "source": ["s"] * 40})
    cfg = OutputConfig(shard_mb=0.001, batch_rows=10)      # ~1 kB parts: 4 of them
    first = write_curated([one], tmp_path / "curated", cfg)
    assert len(first) == 4
    stamps = {p.path: os.stat(p.path).st_mtime_ns for p in first}
    again = write_curated([one], tmp_path / "curated", cfg)
    assert again == first and {p.path: os.stat(p.path).st_mtime_ns for p in again} == stamps   # not rewritten
    # a part changed after the run: the marker's hash no longer matches, the parts are written anew
    pq.write_table(pa.table({"id": ["other"], "text": ["z"], "source": ["s"]}), first[1].path)
    fixed = write_curated([one], tmp_path / "curated", cfg)
    assert _ids(fixed) == [f"d{i}" for i in range(40)] and [p.sha256 for p in fixed] == [p.sha256 for p in first]


def test_parts_of_an_earlier_different_run_are_removed(tmp_path):
    one = _shard(tmp_path / "one.parquet", {"id": [f"d{i}" for i in range(40)], "text": ["y" * 100] * 40, "source": ["s"] * 40})
    out = tmp_path / "curated"
    assert len(write_curated([one], out, OutputConfig(shard_mb=0.001, batch_rows=10))) == 4
    parts = write_curated([one], out, OutputConfig(shard_mb=1.0, batch_rows=10))      # one part now
    assert [os.path.basename(p.path) for p in parts] == ["part-00000.parquet"]
    assert sorted(p.name for p in out.glob("part-*.parquet")) == ["part-00000.parquet"]
    assert _ids(parts) == [f"d{i}" for i in range(40)]
