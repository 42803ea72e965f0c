import pyarrow as pa
import pytest

from quipu.catalog import registry
from quipu.catalog.files import atomic_path, remove_stale_temporaries, sha256_file, write_json_atomic


def test_atomic_path_leaves_nothing_on_error(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"partial")
            raise RuntimeError("killed")
    assert not target.exists() and list(tmp_path.iterdir()) == []
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"whole")
    assert target.read_bytes() == b"whole" and [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_stale_temporaries_are_removed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".tmp-quipu-x.parquet.123").write_bytes(b"junk")
    (tmp_path / "a" / ".tmp-notes.txt").write_text("a user's file: never ours to delete")
    write_json_atomic(tmp_path / "a" / "keep.json", {"k": 1})
    assert remove_stale_temporaries(tmp_path) == 1
    assert (tmp_path / "a" / ".tmp-notes.txt").exists()
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [".tmp-notes.txt", "keep.json"]


def test_runs_datasets_models_lineage_roundtrip(tmp_path):
    run_id = registry.start_run("curate", {"a": 1}, str(tmp_path))
    shard = tmp_path / "part-00000.parquet"
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": ["1"], "text": ["x"]}), shard)
    ds = registry.register_dataset("unit-ds", "curated", str(tmp_path), run_id,
                                   [{"path": str(shard), "rows": 1, "bytes": shard.stat().st_size, "sha256": sha256_file(shard)}])
    registry.save_report(run_id, "extract", {"input_docs": 1})
    registry.record_lineage(run_id, "input", [{"path": "in.jsonl"}])
    registry.record_lineage(run_id, "output", [{"path": str(tmp_path), "dataset_id": ds}])
    registry.finish_run(run_id, "completed", {"ok": True})
    run = registry.get_run(str(tmp_path))
    assert run["id"] == run_id and run["status"] == "completed"
    got = registry.get_dataset("unit-ds")
    assert got["rows"] == 1 and got["shards"][0]["sha256"] == sha256_file(shard)
    assert registry.get_reports(run_id) == {"extract": {"input_docs": 1}}
    assert {l["direction"] for l in registry.get_lineage(run_id)} == {"input", "output"}
    # re-registering the same path replaces the dataset instead of duplicating it
    registry.register_dataset("unit-ds", "curated", str(tmp_path), run_id, [])
    assert len([d for d in registry.list_datasets(name="unit-ds")]) == 1
    mid = registry.register_model("m1", "unit-kind", str(tmp_path / "m.bin"), metrics={"auc": 0.9})
    assert registry.get_model(None, "unit-kind")["id"] == mid


def test_stale_running_runs_are_marked_crashed(tmp_path):
    run_id = registry.start_run("unit-flow", {}, str(tmp_path))
    assert registry.mark_stale_runs_crashed("unit-flow") >= 1
    assert registry.get_run(run_id)["status"] == "crashed"


def test_kv_cache_roundtrip():
    registry.kv_put_many("unit", {"a": 1.5, "b": [1, 2]})
    assert registry.kv_get_many("unit", ["a", "b", "c"]) == {"a": 1.5, "b": [1, 2]}
