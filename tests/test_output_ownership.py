"""Issue 13, outputs owned by one run: a lock for the run's life, resume-or-refuse by identity,
`--overwrite`, cleanup of quipu's own temporaries only, killed runs marked crashed."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quipu.catalog.files import TMP_PREFIX, atomic_path
from quipu.catalog.ownership import IDENTITY_NAME, OutputInUse, OutputMismatch, check_free, claim, identity, output_lock
from tests.conftest import ROOT, quipu_main, run_quipu, start_prefect_server
from tests.test_cli_basics import cli
from tests.textgen import make_docs, write_jsonl

CONFIG = "configs/curate/demo.yaml"
LIGHT = ["--set", "dedup.backend=none", "--set", "decontam.enabled=false"]


# ---- the mechanism ----------------------------------------------------------------------------

def test_second_lock_on_the_same_output_is_refused_naming_the_holder(tmp_path):
    with output_lock(tmp_path / "out"):
        with pytest.raises(OutputInUse, match=r"in use by another run \(pid \d+ on .* since "):
            with output_lock(tmp_path / "out"):
                pass
        with pytest.raises(OutputInUse):
            check_free(tmp_path / "out")
    check_free(tmp_path / "out")            # released: free again
    with output_lock(tmp_path / "out"):
        pass


def test_identity_decides_resume_refuse_or_overwrite(tmp_path):
    out = tmp_path / "out"
    owned = ["extract", "curated", "run.json"]
    a, b = identity(["a.jsonl"], {"x": 1, "workers": 2}, ("workers",)), identity(["b.jsonl"], {"x": 1}, ("workers",))
    assert identity(["a.jsonl"], {"x": 1, "workers": 8}, ("workers",)) == a     # workers do not change outputs
    claim(out, a, owned)
    (out / "curated").mkdir()
    (out / "curated" / "part-00000.parquet").write_bytes(b"A's shard")
    (out / "notes.txt").write_text("the user's own file")
    claim(out, a, owned)                    # same inputs + config: resume
    assert (out / "curated" / "part-00000.parquet").exists()
    with pytest.raises(OutputMismatch, match="other inputs.*--overwrite"):
        claim(out, b, owned)
    with pytest.raises(OutputMismatch, match="another config"):
        claim(out, identity(["a.jsonl"], {"x": 2}), owned)
    claim(out, b, owned, overwrite=True)
    assert not (out / "curated").exists() and (out / "notes.txt").read_text() == "the user's own file"
    assert json.loads((out / IDENTITY_NAME).read_text()) == b


def test_curates_identity_leaves_out_what_does_not_change_its_output():
    """ownership's docstring: worker count, task runner and artifact names are not part of a curate
    run's identity (the same output resumes however it is run); a setting of a stage is."""
    from quipu.flows.config import load_config
    from quipu.flows.curate import NOT_IDENTITY
    from quipu.flows.curate_config import CurateConfig

    def ident(*sets: str) -> dict:
        cfg = load_config(CurateConfig, ROOT / "configs" / "curate" / "demo.yaml", list(sets))
        return identity(["a.jsonl"], cfg.model_dump(mode="json"), NOT_IDENTITY)
    base = ident()
    assert ident("workers=7", "runner.kind=dask", "runner.dask_workers=3", "artifact_prefix=nightly") == base
    assert ident("heuristics.enabled=false") != base and ident("extract.min_chars=7") != base


def test_results_without_an_identity_are_not_taken_over(tmp_path):
    out = tmp_path / "out"
    (out / "curated").mkdir(parents=True)
    with pytest.raises(OutputMismatch, match="recorded no identity"):
        claim(out, identity([], {}), ["curated"])


def test_cleanup_removes_only_quipus_own_temporaries_in_owned_folders(tmp_path):
    out = tmp_path / "project"
    claim(out, identity([], {}), ["langid"])          # the run starts: nothing to clean
    (out / "langid" / "kept").mkdir(parents=True)
    (out / "notes").mkdir()
    ours = out / "langid" / "kept" / f"{TMP_PREFIX}x.parquet.abc"
    ours.write_bytes(b"left by a killed run")
    users = [out / ".tmp-notes.txt", out / "langid" / ".tmp-mine", out / "notes" / f"{TMP_PREFIX}other-run.parquet.1"]
    for p in users:
        p.write_text("not quipu's, or not in a folder this run owns")
    assert claim(out, identity([], {}), ["langid"]) == 1     # the rerun
    assert not ours.exists() and all(p.exists() for p in users)


def test_atomic_writes_use_quipus_prefix(tmp_path):
    seen = []
    with atomic_path(tmp_path / "f.json") as tmp:
        seen.append(tmp.name)
        tmp.write_text("{}")
    assert seen[0].startswith(TMP_PREFIX) and (tmp_path / "f.json").exists()


# ---- through the CLI --------------------------------------------------------------------------

def _inputs(tmp_path: Path, name: str, seed: int, n: int = 40) -> Path:
    return write_jsonl(tmp_path / "in" / f"{name}.jsonl", make_docs(n, seed=seed))


def _curate(*args: str, timeout: int = 400) -> subprocess.CompletedProcess:
    return run_quipu("curate", CONFIG, *LIGHT, *args, timeout=timeout)


@pytest.mark.slow
def test_concurrent_and_later_runs_into_one_output(tmp_path, prefect_server, capsys):
    """Two runs into one --output overlapping in time: the second is refused at once (exit 2, one
    line) and the first completes untouched. A later run with other inputs is refused; with
    --overwrite it replaces the folder and the old quarantine is gone from it and from the catalog."""
    a, b = _inputs(tmp_path, "a", 1), _inputs(tmp_path, "b", 2)
    bad = tmp_path / "in" / "bad.jsonl"
    bad.write_text('{"id": "x", "text": "cut\n')                   # one quarantined line in run A
    out = tmp_path / "one-output"    # a name of its own: the session catalog holds other tests' `out`
    start_prefect_server()
    first = subprocess.Popen([sys.executable, "-m", "quipu.flows.cli", "curate", CONFIG, *LIGHT, "--input", str(a),
                              "--input", str(bad), "--output", str(out)], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:     # wait until the first run holds the lock
        try:
            check_free(out)
        except OutputInUse:
            break
        assert first.poll() is None, first.communicate()[1][-2000:]
        time.sleep(0.2)
    second = _curate("--input", str(b), "--output", str(out))
    assert second.returncode == 2, second.stderr[-2000:]
    assert "is in use by another run" in second.stderr and "Traceback" not in second.stderr
    _, err = first.communicate(timeout=400)
    assert first.returncode == 0, err[-3000:]
    run_a = json.loads((out / "run.json").read_text())
    assert run_a["quarantined"] == 1 and {Path(p).name for p in run_a["inputs"]} == {"a.jsonl", "bad.jsonl"}
    from quipu.catalog import registry
    assert registry.get_dataset("one-output/quarantine", "quarantine")["run_id"] == run_a["run_id"]
    parts_a = {p.name: p.read_bytes() for p in (out / "curated").glob("part-*.parquet")}
    assert parts_a

    again = cli(capsys, "curate", CONFIG, *LIGHT, "--input", str(b), "--output", str(out))   # in process: only the outcome
    assert again.returncode == 2 and "other inputs" in again.stderr and "--overwrite" in again.stderr
    assert {p.name: p.read_bytes() for p in (out / "curated").glob("part-*.parquet")} == parts_a

    # the same run resumes; --overwrite replaces it (in process: only their outcome is checked here)
    assert quipu_main("curate", CONFIG, *LIGHT, "--input", str(a), "--input", str(bad), "--output", str(out)) == 0
    assert quipu_main("curate", CONFIG, *LIGHT, "--input", str(b), "--output", str(out), "--overwrite") == 0
    run_b = json.loads((out / "run.json").read_text())
    assert run_b["quarantined"] == 0 and not (out / "quarantine").exists()
    ids = set(pq.read_table(out / "curated", columns=["id"]).column("id").to_pylist())
    assert ids and all(i.startswith("doc-2-") for i in ids)
    # the catalog no longer lists the quarantine the overwritten run left (its files are gone)
    assert registry.get_dataset("one-output/quarantine", "quarantine") is None
    assert registry.get_dataset("one-output", "curated")["run_id"] == run_b["run_id"]


@pytest.mark.slow
def test_killed_run_is_marked_crashed_on_the_next_start(tmp_path, prefect_server):
    from quipu.catalog import registry
    out = (tmp_path / "out").resolve()
    a = _inputs(tmp_path, "a", 3)
    stale = registry.start_run("curate", {}, str(out))      # what a SIGKILLed run leaves in the catalog
    assert quipu_main("curate", CONFIG, *LIGHT, "--input", str(a), "--output", str(out)) == 0   # the flow is the subject
    assert registry.get_run(stale)["status"] == "crashed"


# ---- issue 32: --overwrite removes only what quipu wrote; no output inside the inputs -------------

def test_overwrite_removes_only_what_earlier_runs_wrote(tmp_path):
    """A README.md and a lines/notes.txt the user kept in the output folder were deleted by
    --overwrite (it removed the owned entries whole). Now it removes the files the manifest lists
    (a finished run) or the files that were not there before a killed run began."""
    from quipu.catalog.ownership import MANIFEST_NAME, record_written
    out = tmp_path / "out"
    owned = ["extract", "lines", "curated", "run.json", "README.md"]
    (out / "lines").mkdir(parents=True)
    (out / "README.md").write_text("my notes about this folder")
    (out / "lines" / "notes.txt").write_text("mine")
    ident_a, ident_b = identity(["a.jsonl"], {"x": 1}), identity(["b.jsonl"], {"x": 1})
    claim(out, ident_a, owned, overwrite=True)   # files but no identity: refused without --overwrite
    assert (out / "README.md").exists() and (out / "lines" / "notes.txt").exists()
    for rel in ("extract/part-0.parquet", "lines/part-0.parquet", "curated/part-0.parquet", "run.json"):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(b"quipu's")
    record_written(out, owned)
    (out / "curated" / "later.txt").write_text("the user's, added after the run")
    claim(out, ident_b, owned, overwrite=True)
    left = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and not p.name.startswith(".quipu"))
    assert left == ["README.md", "curated/later.txt", "lines/notes.txt"], left
    assert not (out / "extract").exists()            # emptied by the overwrite: removed
    # a killed run (no record_written): what it wrote goes, what was there before it stays
    (out / "extract").mkdir()
    (out / "extract" / "part-1.parquet").write_bytes(b"quipu's, killed")
    claim(out, identity(["c.jsonl"], {"x": 1}), owned, overwrite=True)
    assert not (out / "extract" / "part-1.parquet").exists()
    assert (out / "README.md").read_text() == "my notes about this folder" and (out / "lines" / "notes.txt").exists()
    assert json.loads((out / MANIFEST_NAME).read_text())["foreign"] == ["README.md", "curated/later.txt", "lines/notes.txt"]


def test_dataset_card_leaves_the_users_own_readme_alone(tmp_path, monkeypatch):
    """OUT/README.md is the run's dataset card, unless a README.md of the user's was in OUT before
    the run: that one stays as it was; a card quipu wrote itself is rewritten by the next run."""
    from quipu.flows import dataset_card
    from quipu.flows.curate import owned_entries
    monkeypatch.setattr(dataset_card, "dataset_card", lambda summary, name, license, version: f"card of {name}")
    mine, fresh = tmp_path / "mine", tmp_path / "fresh"
    mine.mkdir()
    (mine / "README.md").write_text("my notes about this folder")
    for out in (mine, fresh):
        claim(out, identity(["a.jsonl"], {"x": 1}), owned_entries(), overwrite=True)
        dataset_card.write_dataset_card({}, out, "run", None, "0")
    assert (mine / "README.md").read_text() == "my notes about this folder"
    assert (fresh / "README.md").read_text() == "card of run"
    claim(fresh, identity(["a.jsonl"], {"x": 1}), owned_entries(), overwrite=False)   # the same run, resumed
    assert dataset_card.write_dataset_card({}, fresh, "again", None, "0") == fresh / "README.md"
    assert (fresh / "README.md").read_text() == "card of again"


def test_output_inside_the_inputs_is_refused_whatever_the_flags(tmp_path):
    """An output folder inside the input folder made --overwrite ingest the run's own outputs (29
    spurious quarantine rows). Now refused in one line, with or without --overwrite."""
    from quipu.catalog.errors import UserError
    from quipu.catalog.ownership import refuse_output_among_inputs
    a = _inputs(tmp_path, "a", 5, n=3)
    folder = a.parent
    for patterns, files in (([str(folder)], [str(a)]), ([f"{folder}/**/*.jsonl"], [str(a)]),
                            ([str(a), str(folder / "out" / "x.jsonl")], [str(a), str(folder / "out" / "x.jsonl")])):
        with pytest.raises(UserError, match="output .* is inside the input"):
            refuse_output_among_inputs(folder / "out", patterns, files)
    refuse_output_among_inputs(tmp_path / "elsewhere", [str(folder)], [str(a)])   # beside the inputs: fine
    refuse_output_among_inputs(folder / "out", [f"{folder}/*.jsonl"], [str(a)])    # a flat glob cannot reach it


@pytest.mark.slow
def test_curate_refuses_an_output_inside_its_input_in_one_line(tmp_path):
    folder = _inputs(tmp_path, "a", 5, n=3).parent
    r = subprocess.run([sys.executable, "-m", "quipu.flows.cli", "curate", CONFIG, *LIGHT, "--input", str(folder),
                        "--output", str(folder / "out"), "--overwrite"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "inside the input" in r.stderr, r.stderr
