import json
import os

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


def test_stale_temporaries_only_in_root_when_asked_and_never_a_link(tmp_path):
    """`recursive=False` clears the folder itself, not its subfolders; a link named like a temporary
    (someone else's) is left, as is what it points to."""
    from quipu.catalog.files import TMP_PREFIX
    (tmp_path / "sub").mkdir()
    top, deep = tmp_path / f"{TMP_PREFIX}top.1", tmp_path / "sub" / f"{TMP_PREFIX}deep.1"
    top.write_bytes(b"x")
    deep.write_bytes(b"x")
    (tmp_path / "user.txt").write_text("u")
    link = tmp_path / f"{TMP_PREFIX}link"
    link.symlink_to(tmp_path / "user.txt")
    assert remove_stale_temporaries(tmp_path, recursive=False) == 1
    assert not top.exists() and deep.exists() and link.is_symlink()
    assert remove_stale_temporaries(tmp_path) == 1
    assert not deep.exists() and link.is_symlink() and (tmp_path / "user.txt").read_text() == "u"


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


def _curate_run(out, dataset: str, kept: int) -> str:
    """A finished curate run in the catalog as the flow leaves it: run.json, a curated version, lineage."""
    import pyarrow.parquet as pq
    summary = {"output": str(out), "records_read": 10, "quarantined": 1, "curated": {"rows": kept, "shards": []},
               "stages": [{"name": "extract", "input_docs": 9, "kept_docs": 9, "removed_docs": 0, "removed_by_reason": {}},
                          {"name": "langid", "input_docs": 9, "kept_docs": kept, "removed_docs": 9 - kept,
                           "removed_by_reason": {"langid:other": 9 - kept}}]}
    run_id = registry.start_run("curate", {"dataset": dataset, "langid": {"enabled": True}}, str(out))
    shard = out / "curated" / "part-00000.parquet"
    shard.parent.mkdir(parents=True)
    pq.write_table(pa.table({"id": [str(i) for i in range(kept)], "text": ["x"] * kept}), shard)
    registry.register_dataset(dataset, "curated", str(shard.parent), run_id,
                              [{"path": str(shard), "rows": kept, "bytes": shard.stat().st_size, "sha256": sha256_file(shard)}])
    registry.record_lineage(run_id, "input", [{"path": f"/in/batch-{kept}.jsonl"}])
    write_json_atomic(out / "run.json", {**summary, "run_id": run_id})
    registry.finish_run(run_id, "completed", summary)
    return run_id


def test_catalog_show_and_report_by_run_id_dataset_and_version(tmp_path, capsys):
    from quipu.flows.cli import main
    first = _curate_run(tmp_path / "a", "show-ds", 7)
    second = _curate_run(tmp_path / "b", "show-ds", 5)

    assert main(["catalog", "show", first]) == 0
    text = capsys.readouterr().out
    assert f"run {first}: curate, completed" in text and "10 records read, 1 quarantined, 7 documents curated" in text
    assert "langid" in text and "/in/batch-7.jsonl" in text and len(text.splitlines()) < 15
    assert main(["catalog", "show", "show-ds"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("dataset show-ds (curated): 2 version(s)") and f"run {second}" in text
    assert "v1" in text and "v2" in text and "/in/batch-5.jsonl" in text
    assert main(["catalog", "show", "show-ds@1", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [v["version"] for v in shown["versions"]] == [1] and shown["versions"][0]["run_id"] == first

    for ref, kept in ((first, 7), ("show-ds", 5), ("show-ds@1", 7), (str(tmp_path / "b"), 5)):
        assert main(["report", ref]) == 0, ref
        assert f"{kept}" in capsys.readouterr().out.split("langid")[1].split("\n")[0], ref
    assert main(["report", "show-ds@9"]) == 2
    assert "has no version 9 (it has 1, 2)" in capsys.readouterr().err
    assert main(["catalog", "show", "nothing-here"]) == 2


def test_a_process_record_names_one_process_even_after_its_pid_is_reused():
    """catalog/processes.py: host, pid and start time name one process; the same pid with another
    start time is a reused pid (not alive); a record from another host is unknown (None), not dead."""
    import socket
    import subprocess

    from quipu.catalog.processes import owner_alive, process_owner, process_start
    me = process_owner()
    host, pid, start = me.rsplit(":", 2)
    assert (host, int(pid)) == (socket.gethostname(), os.getpid()) and owner_alive(me) is True
    assert owner_alive(f"{host}:{pid}:{int(start) - 1}") is False        # this pid, an earlier process's start
    assert owner_alive(f"not-{host}:{pid}:{start}") is None              # another host: cannot tell
    assert owner_alive("no owner") is None
    gone = subprocess.Popen(["true"])
    gone_start = process_start(gone.pid)
    gone.wait()
    assert process_start(gone.pid) is None and owner_alive(f"{host}:{gone.pid}:{gone_start}") is False


def test_a_catalog_that_is_not_a_database_is_one_line_saying_what_to_do(tmp_path, monkeypatch):
    """catalog/db.py: a damaged catalog file, or a directory in its place, is CatalogUnreadable naming
    it and the fix; QUIPU_CATALOG_URL, when set, is used instead of $QUIPU_HOME/catalog.db."""
    from quipu.catalog import db
    home = tmp_path / "home"
    home.mkdir()
    (home / "catalog.db").write_bytes(b"SQLite format 3\x00" + b"\x07" * 4000)     # a header, then garbage
    monkeypatch.setenv("QUIPU_HOME", str(home))
    monkeypatch.delenv("QUIPU_CATALOG_URL", raising=False)
    with pytest.raises(db.CatalogUnreadable, match=r"catalog database .*home/catalog.db is unreadable \(.*\): move it away"):
        db.engine()
    other = tmp_path / "other"
    other.mkdir()
    (other / "catalog.db").mkdir()
    monkeypatch.setenv("QUIPU_HOME", str(other))
    with pytest.raises(db.CatalogUnreadable, match="it is a directory, not a database file"):
        db.engine()
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    monkeypatch.setenv("QUIPU_CATALOG_URL", url)
    assert db.catalog_url() == url and db.engine().url.database == str(tmp_path / "elsewhere.db")


def test_a_catalog_with_a_damaged_page_is_found_before_use(tmp_path, monkeypatch):
    """catalog/db.py: a catalog whose schema reads fine but one of whose table pages is damaged
    (a disk error, a copy cut and patched) is CatalogUnreadable naming SQLite's finding, at open,
    not as a failure in the middle of a run."""
    import sqlite3

    from quipu.catalog import db
    home = tmp_path / "home"
    monkeypatch.setenv("QUIPU_HOME", str(home))
    monkeypatch.delenv("QUIPU_CATALOG_URL", raising=False)
    path = home / "catalog.db"
    with sqlite3.connect(home.mkdir() or path) as conn:   # a catalog of a few dozen runs: many pages
        conn.execute("CREATE TABLE runs (id VARCHAR(64) PRIMARY KEY, flow VARCHAR(64) NOT NULL, config TEXT)")
        conn.executemany("INSERT INTO runs VALUES (?, 'curate', ?)", [(f"run-{i:04d}", "{}" + " " * 300) for i in range(400)])
        pages, size = conn.execute("PRAGMA page_count").fetchone()[0], conn.execute("PRAGMA page_size").fetchone()[0]
    assert pages > 10
    data = bytearray(path.read_bytes())
    page = pages // 2                        # a leaf of the runs table: its cells overwritten, its header kept
    data[page * size + 200:(page + 1) * size] = b"\xa5" * (size - 200)
    path.write_bytes(bytes(data))
    with sqlite3.connect(path) as conn:      # the label: SQLite opens it and reads its schema, but the page is bad
        assert conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] >= 1
        assert conn.execute("PRAGMA quick_check(1)").fetchone()[0] != "ok"
    with pytest.raises(db.CatalogUnreadable, match=r"catalog database .*catalog.db is unreadable \(On tree page \d+ .*\): move it away") as e:
        db.engine()
    assert "\n" not in str(e.value)


def test_caches_live_in_quipu_cache_else_in_the_home(tmp_path, monkeypatch):
    """catalog/db.py cache_home: QUIPU_CACHE when set (the suite shares one across its homes), else
    $QUIPU_HOME/cache; the decontam index folder follows it."""
    from quipu.catalog import db
    from quipu.tasks.decontam import DecontamConfig, cache_dir
    monkeypatch.setenv("QUIPU_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QUIPU_CACHE", str(tmp_path / "shared-cache"))
    assert db.cache_home() == tmp_path / "shared-cache"
    assert cache_dir(DecontamConfig()) == tmp_path / "shared-cache" / "decontam"
    monkeypatch.delenv("QUIPU_CACHE")
    assert db.cache_home() == tmp_path / "home" / "cache"


def test_a_catalog_from_before_a_column_was_added_gets_the_column(tmp_path):
    import sqlalchemy as sa

    from quipu.catalog import db
    table = next(t for t in db.metadata.sorted_tables if len(t.columns) > 2)
    first = next(iter(table.columns))
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with sa.create_engine(url).begin() as conn:     # the table as an older quipu made it: one column
        conn.execute(sa.text(f"CREATE TABLE {table.name} ({first.name} {first.type.compile(dialect=conn.dialect)})"))
    have = {c["name"] for c in sa.inspect(db._engine_for(url)).get_columns(table.name)}
    assert have == {c.name for c in table.columns}
